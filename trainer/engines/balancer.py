"""Placement of a step's samples on ranks for the online balancer (docs/design.md#online-balancer).

Every rank calls ``place_samples`` on the *same* global vectors (per-sample costs and home ranks,
rank-major, home order within a rank; ``online.py`` exchanges them) and gets the same answer, so no
placement is ever communicated. The function is pure numpy over that input and uses the planner's
own LPT (``pipeline.balance.algos.lpt_free``: free sample counts per rank, so one giant sample can
sit alone) — no second balancing algorithm lives in the trainer.

Why the extra steps around LPT:

* LPT numbers its bins 0..W-1 in an order that has nothing to do with where samples already are.
  Bins are interchangeable, so they are relabelled onto ranks greedily by the cost each bin would
  keep at home (largest first, ties by bin then rank): moving fewer bytes without touching the bound.
* If LPT's maximum load is not below the home placement's (by more than ``min_gain`` of it), the
  step keeps its home placement: an already balanced step (or one whose straggler is a single
  sample nobody can split) moves nothing, and the result is never worse than not balancing.

Bound (Graham's list scheduling, which LPT is): ``max load ≤ total / W + max cost``; with the
home fallback also ``max load ≤ home max load``. tests/trainer/engines/test_balancer.py checks both with hypothesis.
Ties in the LPT order are broken by the global sample index, so the input order fully fixes the
result (determinism across ranks without any tolerance).
"""

from __future__ import annotations

import numpy as np

from freescale.pipeline.balance.algos import lpt_free


def rank_loads(costs: np.ndarray, ranks: np.ndarray, world_size: int) -> np.ndarray:
    """Total cost per rank of samples placed by ``ranks``."""
    return np.bincount(ranks, weights=costs, minlength=world_size).astype(np.float64)


def imbalance(loads: np.ndarray) -> float:
    """``imbalance`` (docs/definitions.md): max rank cost / mean rank cost (1.0 when perfect or when nothing runs)."""
    mean = float(loads.mean()) if loads.size else 0.0
    return float(loads.max()) / mean if mean > 0 else 1.0


def lpt_bins(costs: np.ndarray, world_size: int) -> np.ndarray:
    """The planner's ``lpt_free`` on one step: bin 0..W-1 of every sample (input order)."""
    n = costs.size
    order = np.lexsort((np.arange(n), -costs))  # descending cost, ties by global index
    sorted_bins = lpt_free(costs[order][None, :].astype(np.float64), world_size)[0]
    bins = np.empty(n, dtype=np.int64)
    bins[order] = sorted_bins
    return bins


def label_bins(bins: np.ndarray, homes: np.ndarray, costs: np.ndarray, world_size: int) -> np.ndarray:
    """Rank of each bin: greedily pair (bin, rank) by the cost that would stay home (max first)."""
    kept = np.bincount(bins * world_size + homes, weights=costs, minlength=world_size * world_size)
    pairs = np.lexsort((np.arange(kept.size), -kept))  # largest kept cost first, ties by (bin, rank)
    label = np.full(world_size, -1, dtype=np.int64)
    taken = np.zeros(world_size, dtype=bool)
    for pair in pairs:
        b, r = divmod(int(pair), world_size)
        if label[b] < 0 and not taken[r]:
            label[b], taken[r] = r, True
    return label


def place_samples(costs: np.ndarray, homes: np.ndarray, world_size: int, min_gain: float = 0.0) -> np.ndarray:
    """Destination rank of every sample of the step (same input on every rank → same output).

    ``costs``: float per sample, ``homes``: int home rank per sample, both in global order.
    ``min_gain``: move samples only when LPT lowers the step's maximum rank cost by more than this
    share of it (``engine.balancer_min_gain``): a step that is already nearly balanced — planned
    data — is not worth a dispatch and a combine.
    """
    costs = np.asarray(costs, dtype=np.float64)
    homes = np.asarray(homes, dtype=np.int64)
    if costs.shape != homes.shape or costs.ndim != 1:
        raise ValueError(f"costs {costs.shape} and homes {homes.shape} must be equal-length vectors")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if costs.size == 0 or world_size == 1:
        return homes.copy()
    bins = lpt_bins(costs, world_size)
    home_max = rank_loads(costs, homes, world_size).max()
    if rank_loads(costs, bins, world_size).max() >= home_max * (1.0 - min_gain):
        return homes.copy()
    return label_bins(bins, homes, costs, world_size)[bins]
