"""A step-group plan (``BalancePlan``): which samples form each micro-batch, and what each costs.

``plan_bin_costs`` is shared with the stats tool, simulate and the trainer (docs/design.md#definitions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import is_int


@dataclass
class BalancePlan:
    """A plan: ``order[o[m]:o[m+1]]`` are the samples of micro-batch m, which belongs to step group
    ``m // group_size``. ``report`` is JSON-serialisable (docs/design.md#definitions names)."""

    order: np.ndarray
    micro_batch_offsets: np.ndarray
    group_size: int
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def n_micro_batches(self) -> int:
        return int(self.micro_batch_offsets.size - 1)

    @property
    def n_step_groups(self) -> int:
        return self.n_micro_batches // self.group_size

    def micro_batch(self, m: int) -> np.ndarray:
        return self.order[self.micro_batch_offsets[m] : self.micro_batch_offsets[m + 1]]

    def micro_batch_ids(self) -> np.ndarray:
        """Micro-batch of every position of ``order``."""
        return np.repeat(np.arange(self.n_micro_batches), np.diff(self.micro_batch_offsets))


def micro_batch_costs(plan: BalancePlan, costs: np.ndarray) -> np.ndarray:
    """Cost of every micro-batch of ``plan`` (empty micro-batches cost 0)."""
    c = np.asarray(costs, dtype=np.float64)
    return np.bincount(plan.micro_batch_ids(), weights=c[plan.order], minlength=plan.n_micro_batches)


def plan_bin_costs(plan: BalancePlan, costs: np.ndarray, world_size: int) -> np.ndarray:
    """Per-step rank costs ``[n_steps, W]`` of a run with ``world_size`` ranks reading ``plan``:
    step s reads micro-batches ``s·W … s·W + W − 1`` (W consecutive micro-batches of a group; the
    DEVELOPERS.md formula ``(s // (G//W))·G + (s % (G//W))·W + rank`` is the same index)."""
    if not is_int(world_size) or world_size < 1 or plan.group_size % world_size:
        raise ValueError(f"world_size must divide group_size={plan.group_size}, got {world_size!r}")
    return micro_batch_costs(plan, costs).reshape(-1, world_size)
