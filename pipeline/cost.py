"""Per-sample cost model (docs/design.md#cost-model): ``cost(L) = a·L² + b·L + c``.

The balancer only needs *relative* costs that track what a rank spends on a sample. For an HSTU
layer with model dim ``d`` a sample of length ``L`` costs, forward, about ``10·d²·L`` FLOPs of
projections and ``2·d·L²`` of causal attention; backward is ≈2× forward for GEMMs and ≈2.5× for
attention. The sampled-softmax loss adds ``2·d·(negatives + 1)`` per position forward (×3 with
backward). A calibration run can replace the analytic coefficients with fitted seconds measured on
the target hardware (``CostModel.from_file``): the balancer then plans in seconds.

The model's dimensions come from ``freescale.model_config.ModelConfig`` (``[model]`` in TOML).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from freescale import storage
from freescale.model_config import ModelConfig

ATTENTION_BACKWARD_FACTOR = 2.5
GEMM_BACKWARD_FACTOR = 2.0


@dataclass
class CostModel:
    """``cost(L) = a·L² + b·L + c`` in ``units`` (``flops`` or ``seconds``)."""

    a: float
    b: float
    c: float = 0.0
    units: str = "flops"
    origin: str = "analytic"
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.units not in ("flops", "seconds"):
            raise ValueError(f"cost_model.units must be 'flops' or 'seconds', got {self.units!r}")
        if min(self.a, self.b, self.c) < 0 or (self.a == 0 and self.b == 0):
            raise ValueError(
                f"cost_model coefficients must be >= 0 and a or b positive, got a={self.a} b={self.b} c={self.c}"
            )

    @classmethod
    def from_model(cls, model: ModelConfig) -> CostModel:
        """Analytic FLOPs of one training step (forward + backward) per docs/design.md#cost-model."""
        d, layers = model.d_model, model.num_layers
        attention_fwd = 2.0 * d  # per L², per layer: QK^T and AV, half masked
        projection_fwd = 10.0 * d * d  # per L, per layer: fused uvqk + output projection
        loss_fwd = 2.0 * d * (model.num_negatives + 1)  # per L: sampled softmax logits
        a = attention_fwd * (1 + ATTENTION_BACKWARD_FACTOR) * layers
        b = projection_fwd * (1 + GEMM_BACKWARD_FACTOR) * layers + loss_fwd * (1 + GEMM_BACKWARD_FACTOR)
        return cls(a=a, b=b, c=0.0, units="flops", origin="analytic", details=asdict(model))

    @classmethod
    def from_file(cls, path: str) -> CostModel:
        """Fitted coefficients from a JSON or TOML file with keys a, b, c (optional), units, origin,
        details, at the top or under ``cost_model``; any other shape is one line naming the field."""
        from freescale.pipeline.jsonfields import Fields

        where = f"--cost-model {path}"
        raw = storage.read_text(path, "--cost-model")
        try:
            data = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
            raise ValueError(f"{where}: cannot parse ({error}); truncated or edited?") from error
        root = Fields(where, data)
        fields = root.child("cost_model") if isinstance(data, dict) and "cost_model" in data else root
        missing = [key for key in ("a", "b") if key not in fields.data]
        if missing:
            raise ValueError(f"{where}: missing coefficient(s) {missing}")
        known = {"a", "b", "c", "units", "origin", "details"}
        unknown = sorted(set(fields.data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
        values = {name: float(fields.value(name, "number")) for name in ("a", "b")}
        values["c"] = float(fields.value("c", "number", default=0.0))
        values["units"] = fields.value("units", "string", default="seconds")
        values["origin"] = fields.value("origin", "string", default=f"file:{Path(path).name}")
        values["details"] = fields.value("details", "object", default={})
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from error

    def cost(self, lengths: np.ndarray) -> np.ndarray:
        lengths = np.asarray(lengths, dtype=np.float64)
        return self.a * lengths * lengths + self.b * lengths + self.c

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
