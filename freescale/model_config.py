"""The model's dimensions (the ``[model]`` table): what the model is built from and what it costs.

Both the trainer's model (``trainer.model``) and ``prepare``'s cost model (``pipeline.cost``) read it,
and ``prepare``, ``stats``, ``simulate`` and the run config all parse it. It lives at the top of the
package, depending on nothing but ``freescale.storage``, so every one of them can import it without
an edge between ``pipeline`` and ``trainer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freescale import storage


@dataclass
class ModelConfig:
    """HSTU model dimensions; the ``[model]`` table of a run config or a model TOML."""

    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_negatives: int = 128
    max_uih_len: int = 21000

    def __post_init__(self) -> None:
        for name in ("d_model", "num_layers", "num_heads", "max_uih_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_negatives < 0:
            raise ValueError(f"model.num_negatives must be >= 0, got {self.num_negatives}")
        if self.d_model % self.num_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.num_heads ({self.num_heads})")

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "model") -> ModelConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} in [{where}]; known: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str) -> ModelConfig:
        """Read ``[model]`` from a TOML file (a model file or a whole run config)."""
        data = storage.read_toml(path, "model config")
        return cls.from_dict(data.get("model", data), where=f"model in {path}")
