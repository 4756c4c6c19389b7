"""Balance measures of docs/design.md#definitions on any costs: the best achievable max bin, predicted straggler %.

Shared with the stats tool, simulate and the trainer; the planner's report uses them too.
"""

from __future__ import annotations

import numpy as np


def lower_bound(costs: np.ndarray, bins: int, items_per_bin: int | None = None) -> float:
    """Best achievable max bin cost when ``costs`` are split into ``bins`` bins:
    ``max(total / bins, largest)``; with (at least) ``items_per_bin`` items in every bin also
    ``largest + sum of the items_per_bin − 1 smallest``."""
    c = np.asarray(costs, dtype=np.float64).ravel()
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if c.size == 0:
        return 0.0
    bound = max(float(c.sum()) / bins, float(c.max()))
    if items_per_bin is not None and items_per_bin > 1:
        if items_per_bin * bins > c.size:
            raise ValueError(f"items_per_bin={items_per_bin} × bins={bins} exceeds {c.size} items")
        smallest = np.partition(c, items_per_bin - 2)[: items_per_bin - 1] if c.size > 1 else c[:0]
        bound = max(bound, float(c.max()) + float(smallest.sum()))
    return bound


def predict_straggler_pct(bin_costs: np.ndarray) -> float:
    """``straggler_pct`` (docs/design.md#definitions) for steps ``bin_costs[n_steps, W]`` (rank r of step s costs
    ``bin_costs[s, r]``): per step, idle = mean over ranks of (max − c_r), wall = max; returns
    Σ idle / Σ wall over steps, in %."""
    b = np.asarray(bin_costs, dtype=np.float64)
    if b.ndim != 2:
        raise ValueError(f"bin_costs must be 2-D [n_steps, ranks], got shape {b.shape}")
    if b.size == 0:
        return 0.0
    wall = b.max(axis=1)
    total = float(wall.sum())
    return 0.0 if total <= 0 else 100.0 * float((wall - b.mean(axis=1)).sum()) / total
