"""The simulator's compute model: seconds per sample on the target hardware, from a calibrated cost
model (``freescale calibrate``) or the analytic FLOPs of docs/design.md#cost-model at a profile's
throughput, plus the fixed costs FLOPs do not see (per micro-batch, per layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from freescale.model_config import ModelConfig
from freescale.pipeline.cost import CostModel
from freescale.trainer.simulate.sim_config import ComputeConfig, WorkloadConfig


@dataclass
class SampleCost:
    """Seconds per sample on the target hardware: ``model.cost(L) × factor`` + ``per_micro_batch_s``
    once per rank and step."""

    model: CostModel
    factor: float
    per_micro_batch_s: float
    origin: str

    def seconds(self, lengths: np.ndarray) -> np.ndarray:
        return self.model.cost(lengths) * self.factor

    def to_dict(self) -> dict[str, Any]:
        m = self.model
        return {
            "origin": self.origin,
            "a": m.a,
            "b": m.b,
            "c": m.c,
            "units": m.units,
            "seconds_per_unit": self.factor,
            "per_micro_batch_s": self.per_micro_batch_s,
        }


def sample_cost(compute: ComputeConfig, workload: WorkloadConfig) -> SampleCost:
    """A calibrated cost model (seconds; FLOPs need ``peak_tflops``) with its measured fixed cost per
    micro-batch, or the analytic FLOPs of docs/design.md#cost-model at ``peak_tflops × mfu`` plus the
    profile's fixed costs (``per_micro_batch_s + per_layer_s × num_layers``); times ``compute.scale``."""
    throughput = None if compute.peak_tflops is None else compute.peak_tflops * 1e12 * compute.mfu
    if compute.cost_model is not None:
        model = CostModel.from_file(compute.cost_model)
        per_mb = float(model.details.get("per_micro_batch_s", 0.0)) if isinstance(model.details, dict) else 0.0
        origin = f"cost model {compute.cost_model}"
    else:
        d = workload.embedding_dim
        model = CostModel.from_model(
            ModelConfig(d_model=d, num_layers=workload.num_layers, num_heads=1, num_negatives=workload.negatives)
        )
        per_mb = (compute.per_micro_batch_s or 0.0) + compute.per_layer_s * workload.num_layers
        origin = f"analytic FLOPs at {compute.peak_tflops} TFLOPS x mfu {compute.mfu}"
    if model.units == "seconds":
        factor = compute.scale
    elif throughput is None:
        raise ValueError(f"{compute.cost_model}: the cost model is in FLOPs; give compute.peak_tflops to convert")
    else:
        factor = compute.scale / throughput
    return SampleCost(model, factor, per_mb * compute.scale, origin)
