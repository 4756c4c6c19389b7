"""Report of the step-group planner: docs/design.md#definitions metrics, vectorised over steps.

Everything here reads a plan as a sequence of steps of G micro-batches (``bin_costs[S, G]``):
``imbalance`` = max/mean, ``max_over_lower_bound`` = max / lower_bound (with the k-items form in
equal-count mode), predicted ``straggler_pct`` for the plan and the two baselines on the same
costs, and ``composition_bias``: the Kolmogorov–Smirnov distance between each step's cost
distribution and the dataset's, averaged over steps (random steps sit near 0.87/√(samples per
step); cost-sorted outlier steps near 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .bin_assignment import desc_positions
from .measures import predict_straggler_pct

if TYPE_CHECKING:
    from .config import BalanceConfig
    from .plan import BalancePlan
    from .step_membership import Ranked, Steps


def _bin_costs(costs: np.ndarray, steps: Steps, bins: np.ndarray, g: int) -> np.ndarray:
    step = np.repeat(np.arange(steps.n_steps), np.diff(steps.offsets))
    out = np.bincount(step * g + bins, weights=costs[steps.items], minlength=steps.n_steps * g)
    return out.reshape(steps.n_steps, g)


def _imbalance(bin_costs: np.ndarray) -> np.ndarray:
    mx, mean = bin_costs.max(axis=1), bin_costs.mean(axis=1)
    return np.where(mean > 0, mx / np.where(mean > 0, mean, 1.0), 1.0)


def step_max_and_imbalance(costs, steps: Steps, bins: np.ndarray, g: int, n_first: int) -> float:
    """Max imbalance over the first ``n_first`` steps (the full ones); 1.0 when there are none."""
    if n_first <= 0:
        return 1.0
    return float(_imbalance(_bin_costs(costs, steps, bins, g)[:n_first]).max())


def lower_bound_over_mean(costs, steps: Steps, g: int, n_first: int, items_per_bin: int | None) -> float:
    """Max over the first ``n_first`` steps of lower_bound / (total / G), a floor on the imbalance
    any partition of those steps can reach. ``items_per_bin`` (equal-count k) adds the form
    largest + sum of the k − 1 smallest, except on free-count steps (``steps.is_free``). O(n):
    partitions, no sorting."""
    if n_first <= 0:
        return 1.0
    off = steps.offsets[: n_first + 1]
    c = costs[steps.items[: off[-1]]]
    largest = np.maximum.reduceat(c, off[:-1])
    mean = np.add.reduceat(c, off[:-1]) / g
    bound = np.maximum(largest, mean)
    if items_per_bin is not None and items_per_bin > 1:
        sizes = np.diff(off)
        equal = ~steps.free_mask()[:n_first]
        j = items_per_bin - 2  # the k − 1 smallest are the first k − 1 after partitioning at k − 2
        for size in np.unique(sizes):
            rows = np.flatnonzero((sizes == size) & equal)
            if size <= j:
                continue
            block = c[off[rows][:, None] + np.arange(size)]
            small = np.partition(block, j, axis=1)[:, : j + 1].sum(axis=1)
            bound[rows] = np.maximum(bound[rows], largest[rows] + small)
    return float(np.where(mean > 0, bound / np.where(mean > 0, mean, 1.0), 1.0).max())


def _ascending_within_steps(ranked: Ranked, steps: Steps) -> np.ndarray:
    """Sample ids of ``steps`` grouped by step, ascending cost within each step (no sort per step:
    the descending grouping read backwards segment by segment)."""
    n = steps.items.size
    sorted_pos = desc_positions(ranked, steps)
    step = np.repeat(np.arange(steps.n_steps), np.diff(steps.offsets))
    back = steps.offsets[step] + steps.offsets[step + 1] - 1 - np.arange(n)
    return steps.items[sorted_pos[back]]


def _step_lower_bounds(c_asc: np.ndarray, steps: Steps, counts: np.ndarray, g: int, equal: bool) -> np.ndarray:
    """``lower_bound`` (docs/definitions.md) per step from its costs in ascending order; equal-count adds largest +
    sum of the (q−1) smallest, q = the smallest micro-batch count of the step."""
    start, end = steps.offsets[:-1], steps.offsets[1:]
    total = np.add.reduceat(c_asc, start)
    largest = c_asc[end - 1]
    bound = np.maximum(total / g, largest)
    if equal:
        csum = np.concatenate([[0.0], np.cumsum(c_asc)])
        take = np.minimum(np.maximum(counts.min(axis=1) - 1, 0), end - start - 1)
        bound = np.maximum(bound, largest + csum[start + take] - csum[start])
    return bound


def _global_ranks(ranked: Ranked) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: how many costs are < and ≤ its own (ties resolved once, in O(n))."""
    v = ranked.costs[ranked.asc]
    pos = np.arange(v.size)
    new_run = np.ones(v.size, dtype=bool)
    new_run[1:] = v[1:] != v[:-1]
    first = np.maximum.accumulate(np.where(new_run, pos, 0))
    last_mark = np.append(new_run[1:], True)
    last = np.minimum.accumulate(np.where(last_mark, pos, v.size)[::-1])[::-1]
    lt, le = np.empty(v.size, dtype=np.int64), np.empty(v.size, dtype=np.int64)
    lt[ranked.asc], le[ranked.asc] = first, last + 1
    return lt, le


def ks_per_step(
    ranked: Ranked, steps: Steps, ids_asc: np.ndarray | None = None, ranks: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """Two-sample KS distance between each step's costs and all costs (exact with ties)."""
    n = ranked.costs.size
    sizes = np.diff(steps.offsets)
    if n == 0 or sizes.size == 0:
        return np.zeros(sizes.size)
    ids = _ascending_within_steps(ranked, steps) if ids_asc is None else ids_asc
    g_lt, g_le = _global_ranks(ranked) if ranks is None else ranks
    c = ranked.costs[ids]
    step = np.repeat(np.arange(sizes.size), sizes)
    m = sizes[step].astype(np.float64)
    pos = np.arange(c.size)
    new_run = np.ones(c.size, dtype=bool)
    new_run[1:] = (step[1:] != step[:-1]) | (c[1:] != c[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, pos, 0))
    end_mark = np.append(new_run[1:], True)
    run_end = np.minimum.accumulate(np.where(end_mark, pos, c.size)[::-1])[::-1]
    base = steps.offsets[:-1][step]
    f_lt = (run_start - base) / m  # step share strictly below v
    f_le = (run_end + 1 - base) / m  # step share at or below v
    d = np.maximum(np.abs(f_lt - g_lt[ids] / n), np.abs(f_le - g_le[ids] / n))
    return np.maximum.reduceat(d, steps.offsets[:-1])


def _stats(a: np.ndarray) -> dict[str, float]:
    if a.size == 0:
        return {"max": 1.0, "mean": 1.0}
    return {"max": float(a.max()), "mean": float(a.mean())}


def straggler_floor_pct(costs: np.ndarray, g: int) -> float:
    """The least predicted straggler_pct of *any* plan of these samples on G ranks, counts free:
    every step's wall is ≥ its mean rank cost and one step's wall is ≥ the costliest sample c₁, so
    Σ wall ≥ max(total / G, c₁) and straggler_pct ≥ 1 − (total / G) / max(total / G, c₁). Above 0
    when a single sample outweighs a rank's share of the whole dataset: no plan reaches a lower
    figure, only more samples (or shorter ones) can."""
    if costs.size == 0:
        return 0.0
    share, top = float(costs.sum()) / g, float(costs.max())
    return 0.0 if top <= share or top <= 0 else 100.0 * (1.0 - share / top)


def _free_count_outliers(steps: Steps, counts: np.ndarray, n: int, equal: bool) -> dict[str, Any]:
    """Free-count outlier steps of an equal-count plan (``free_outliers="auto"``): how many steps
    and samples lost the exactly-k guarantee, and their counts per micro-batch."""
    free = steps.free_mask() if equal else np.zeros(steps.n_steps, dtype=bool)
    samples = int(np.diff(steps.offsets)[free].sum()) if free.any() else 0
    c = counts[free] if free.any() else np.zeros(0, dtype=np.int64)
    return {
        "steps": int(free.sum()),
        "samples": samples,
        "sample_share": samples / n if n else 0.0,
        "step_groups": [int(i) for i in np.flatnonzero(free)],
        "min_count": int(c.min()) if c.size else None,
        "max_count": int(c.max()) if c.size else None,
    }


def _by_world_size(mb_costs: np.ndarray, g: int) -> dict[str, float]:
    return {str(w): round(predict_straggler_pct(mb_costs.reshape(-1, w)), 4) for w in range(1, g + 1) if g % w == 0}


def build_report(
    ranked: Ranked,
    config: BalanceConfig,
    plan: BalancePlan,
    steps: Steps,
    bins: np.ndarray,
    stats: dict[str, int],
    baselines: dict[str, tuple[Steps, np.ndarray]],
    search: dict[str, Any],
) -> dict[str, Any]:
    costs = ranked.costs
    g = config.group_size
    equal = config.mode == "equal_count"
    n_groups = steps.n_steps
    mb = np.bincount(plan.micro_batch_ids(), weights=costs[plan.order], minlength=plan.n_micro_batches)
    bin_costs = mb.reshape(n_groups, g) if n_groups else np.zeros((0, g))
    counts = np.diff(plan.micro_batch_offsets).reshape(n_groups, g) if n_groups else np.zeros((0, g), int)
    imb = _imbalance(bin_costs) if n_groups else np.zeros(0)
    ids_asc = _ascending_within_steps(ranked, steps) if n_groups else np.zeros(0, np.int64)
    lb = _step_lower_bounds(costs[ids_asc], steps, counts, g, equal) if n_groups else np.zeros(0)
    mx = bin_costs.max(axis=1) if n_groups else np.zeros(0)
    ratio = np.where(lb > 0, mx / np.where(lb > 0, lb, 1.0), 1.0)

    straggler = {"plan": round(predict_straggler_pct(bin_costs), 4), "floor": round(straggler_floor_pct(costs, g), 4)}
    if config.compare_baselines and not baselines:  # no samples: nothing to compare
        straggler.update(random=0.0, within_step=0.0)
    for name, (b_steps, b_bins) in baselines.items():
        straggler[name] = round(predict_straggler_pct(_bin_costs(costs, b_steps, b_bins, g)), 4)

    ranks = _global_ranks(ranked)
    ks = ks_per_step(ranked, steps, ids_asc, ranks) if n_groups else np.zeros(0)
    bias: dict[str, Any] = {
        "metric": "mean_ks_distance_step_vs_dataset",
        "plan": float(ks.mean()) if ks.size else 0.0,
    }
    if ks.size:
        bias["plan_max"] = float(ks.max())
        if steps.is_outlier.any():
            bias["plan_outlier_steps"] = float(ks[steps.is_outlier].mean())
        if (~steps.is_outlier).any():
            bias["plan_other_steps"] = float(ks[~steps.is_outlier].mean())
    if "random" in baselines:
        r_steps = baselines["random"][0]
        r_ks = ks_per_step(ranked, r_steps, ranks=ranks)
        bias["random"] = float(r_ks.mean()) if r_ks.size else 0.0

    n_full = n_groups - (1 if steps.partial and not steps.absorbed else 0)
    outlier_samples = int(np.diff(steps.offsets)[steps.is_outlier].sum()) if n_groups else 0
    last = n_groups - 1
    leftover = {
        "samples": steps.leftover,
        "partial_step_group": bool(steps.partial),
        "step_group": last if steps.partial else None,
        "absorbed_into_last_full_group": bool(steps.absorbed),
        "min_count": int(counts[last].min()) if steps.partial else None,
        "max_count": int(counts[last].max()) if steps.partial else None,
        "imbalance": float(imb[last]) if steps.partial else None,
    }
    counts_flat = counts.ravel()
    return {
        "strategy": config.strategy,
        "mode": config.mode,
        "group_size": g,
        "micro_batch_size": config.micro_batch_size,
        "n_samples": int(costs.size),
        "n_micro_batches": plan.n_micro_batches,
        "n_step_groups": n_groups,
        "imbalance": _stats(imb),
        "max_over_lower_bound": _stats(ratio),
        "straggler_pct": straggler,
        "straggler_pct_by_world_size": _by_world_size(mb, g) if n_groups else {},
        "outlier_fraction": outlier_samples / costs.size if costs.size else 0.0,
        "max_outlier_fraction": config.max_outlier_fraction,
        "outlier_steps": int(steps.is_outlier.sum()),
        "outlier_step_groups": [int(i) for i in np.flatnonzero(steps.is_outlier)],
        "target_imbalance": config.target_imbalance,
        "target_reached": bool(imb[:n_full].max() <= config.target_imbalance) if n_full else True,
        "outlier_search": search,
        "free_count_outliers": _free_count_outliers(steps, counts, int(costs.size), equal),
        "composition_bias": bias,
        "algorithm_wins": {"lpt": stats["lpt"], "kk": stats["kk"]},
        "swaps": stats["swaps"],
        "micro_batch_counts": {
            "min": int(counts_flat.min()) if counts_flat.size else 0,
            "mean": float(counts_flat.mean()) if counts_flat.size else 0.0,
            "max": int(counts_flat.max()) if counts_flat.size else 0,
        },
        "empty_micro_batches": int((counts_flat == 0).sum()),
        "leftover": leftover,
        "config": config.to_dict(),
    }
