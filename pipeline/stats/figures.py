"""Figures of ``freescale stats`` computed from arrays: lengths, ``sparsity``, straggler predictions,
``batch_overlap_rate`` from per-batch counters, the Zipf fit and ``hash_collision_rate``.

Everything here is a pure function of numpy arrays, so the tests can check each figure against an
analytic value without going through readers. Names follow docs/design.md#definitions. Standard errors say how much
a figure would move on another draw of the same data: batch-to-batch (``sparsity``,
``batch_overlap_rate``), step-to-step (``straggler_pct``, a ratio estimator), bootstrap (length
percentiles, only when the figures come from a sample of users) and regression (Zipf exponent).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from freescale.pipeline.balance import (
    BalanceConfig,
    lower_bound,
    plan_bin_costs,
    plan_step_groups,
    predict_straggler_pct,
)
from freescale.pipeline.cost import CostModel

PERCENTILES = (50, 90, 99)
BOOTSTRAP_RESAMPLES = 100
ZIPF_FIT_POINTS = 50
STRATEGIES = ("random", "within_step", "planned")


def _stderr(values: np.ndarray) -> float | None:
    return float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else None


# ------------------------------------------------------------------------------------------ lengths
def length_summary(
    lengths: np.ndarray, thresholds: tuple[int, ...], estimated: bool = False, seed: int = 0
) -> dict[str, Any]:
    """count, mean, p50/p90/p99/max and the share of samples longer than each threshold.

    With ``estimated`` (figures from a sample of users) the percentiles get bootstrap standard
    errors and the mean its analytic one; exact figures report ``stderr: null``."""
    x = np.asarray(lengths, dtype=np.int64)
    out: dict[str, Any] = {"count": int(x.size), "events": int(x.sum())}
    if x.size == 0:
        out.update(
            {
                "mean": 0.0,
                "p50": 0.0,
                "p90": 0.0,
                "p99": 0.0,
                "max": 0,
                "min": 0,
                "share_above": {str(t): 0.0 for t in thresholds},
                "stderr": None,
            }
        )
        return out
    pct = np.percentile(x, PERCENTILES)
    out.update(
        {
            "mean": float(x.mean()),
            "min": int(x.min()),
            **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct)},
            "max": int(x.max()),
        }
    )
    out["share_above"] = {str(t): float((x > t).mean()) for t in thresholds}
    out["stderr"] = None
    if estimated and x.size > 1:
        rng = np.random.default_rng([seed, 11])
        boot = np.array(
            [np.percentile(x[rng.integers(0, x.size, x.size)], PERCENTILES) for _ in range(BOOTSTRAP_RESAMPLES)]
        )
        out["stderr"] = {
            "mean": float(x.std(ddof=1) / np.sqrt(x.size)),
            **{f"p{p}": float(s) for p, s in zip(PERCENTILES, boot.std(axis=0, ddof=1))},
            "method": f"bootstrap over samples ({BOOTSTRAP_RESAMPLES} resamples); mean: std/sqrt(n)",
        }
    return out


def log_bin_edges(max_length: int, bins: int) -> np.ndarray:
    """Integer, log-spaced histogram edges covering [1, max_length] (duplicates dropped)."""
    top = max(int(max_length), 1) + 1
    return np.unique(np.round(np.geomspace(1, top, bins + 1)).astype(np.int64))


def histogram(lengths: np.ndarray, edges: np.ndarray) -> list[int]:
    counts, _ = np.histogram(np.asarray(lengths), bins=edges)
    return [int(c) for c in counts]


# ------------------------------------------------------------------------------------------ sparsity
def sparsity(lengths: np.ndarray, offsets: np.ndarray, cost_model: CostModel) -> dict[str, Any]:
    """Paper Eq. 1 per batch (``1 - sum(L_i) / (B * max_i L_i)``) for batches ``[o[m], o[m+1])`` of
    ``lengths``, and what padding every sample to its batch's max costs under the cost model.

    ``sparsity`` is pooled over batches (padded items / all items of the padded batches, the share
    of a padded model's input that is padding); ``sparsity_mean`` is the mean of the per-batch values.
    ``wasted_compute_pct`` compares ``Σ_batches B·cost(max L)`` with the jagged ``Σ cost(L_i)``;
    ``attention_wasted_pct`` does the same for the L² (attention) term alone (docs/design.md#cost-model)."""
    x = np.asarray(lengths, dtype=np.float64)
    o = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(o)
    keep = sizes > 0
    if not keep.any():
        return {
            "batches": 0,
            "sparsity": None,
            "sparsity_mean": None,
            "stderr": None,
            "padded_cost": 0.0,
            "jagged_cost": 0.0,
            "wasted_compute_pct": None,
            "attention_wasted_pct": None,
        }
    starts, sizes = o[:-1][keep], sizes[keep]
    total = np.add.reduceat(x, starts)
    longest = np.maximum.reduceat(x, starts)
    squares = np.add.reduceat(x * x, starts)
    per_batch = 1.0 - total / (sizes * longest)
    padded = float((sizes * cost_model.cost(longest)).sum())
    jagged = float(cost_model.cost(x[o[0] : o[-1]]).sum())
    padded_attention = float((sizes * longest * longest).sum())
    return {
        "batches": int(sizes.size),
        "sparsity": float(1.0 - total.sum() / (sizes * longest).sum()),
        "sparsity_mean": float(per_batch.mean()),
        "stderr": _stderr(per_batch),
        "padded_cost": padded,
        "jagged_cost": jagged,
        "wasted_compute_pct": 100.0 * (1.0 - jagged / padded) if padded > 0 else 0.0,
        "attention_wasted_pct": 100.0 * (1.0 - squares.sum() / padded_attention) if padded_attention else 0.0,
    }


def equal_offsets(n: int, batch_size: int) -> np.ndarray:
    """Offsets of the full batches of ``batch_size`` consecutive samples (a partial tail is dropped)."""
    return np.arange(0, (n // batch_size) * batch_size + 1, batch_size, dtype=np.int64)


# ------------------------------------------------------------------------------------------ stragglers
def _ratio_stderr(idle: np.ndarray, wall: np.ndarray) -> float | None:
    """Standard error of Σidle/Σwall over steps (ratio estimator), in percentage points."""
    s = wall.size
    if s < 2 or wall.sum() <= 0:
        return None
    r = idle.sum() / wall.sum()
    resid = idle - r * wall
    return float(100.0 * np.sqrt((resid**2).sum() / (s * (s - 1))) / wall.mean())


def step_figures(
    bin_costs: np.ndarray, step_items: list[np.ndarray] | None = None, items_per_bin: int | None = None
) -> dict[str, Any]:
    """``straggler_pct`` (``predict_straggler_pct``), ``imbalance`` (max/mean per step) and, when the
    steps' samples are given, ``max_over_lower_bound`` with ``lower_bound`` of docs/definitions.md."""
    b = np.asarray(bin_costs, dtype=np.float64)
    wall, mean = b.max(axis=1), b.mean(axis=1)
    imbalance = np.where(mean > 0, wall / np.where(mean > 0, mean, 1.0), 1.0)
    out: dict[str, Any] = {
        "steps": int(b.shape[0]),
        "straggler_pct": round(predict_straggler_pct(b), 4),
        "stderr": _ratio_stderr(wall - mean, wall),
        "imbalance": {"mean": float(imbalance.mean()), "max": float(imbalance.max())},
    }
    if step_items is not None:
        ratios = []
        for row, items in zip(b, step_items):
            # the k-items form holds on equal-count steps (k each, or < W absorbed leftovers), not on
            # the planner's free-count outlier steps (many more samples, one micro-batch may hold 1)
            equal = items_per_bin and 0 <= items.size - items_per_bin * b.shape[1] < b.shape[1]
            k = items_per_bin if equal else None
            bound = lower_bound(items, b.shape[1], k)
            ratios.append(row.max() / bound if bound > 0 else 1.0)
        r = np.array(ratios)
        out["max_over_lower_bound"] = {"mean": float(r.mean()), "max": float(r.max())}
    return out


def predict_strategies(costs: np.ndarray, world_size: int, k: int, seed: int) -> dict[str, Any]:
    """Predicted figures at ``world_size`` ranks × ``k`` samples for random batching, within-step
    balancing and the planned step groups ``prepare --group-size W`` would write (the planner of
    ``freescale.pipeline.balance``, equal counts, its default knobs)."""
    c = np.asarray(costs, dtype=np.float64)
    if c.size < world_size * k:
        reason = f"{c.size} samples are fewer than one step of W·k = {world_size * k}"
        return {name: {"straggler_pct": None, "reason": reason} for name in STRATEGIES}
    out: dict[str, Any] = {}
    for name in STRATEGIES:
        config = BalanceConfig(
            group_size=world_size, micro_batch_size=k, strategy=name, seed=seed, compare_baselines=False
        )
        plan = plan_step_groups(c, config)
        bins = plan_bin_costs(plan, c, world_size)
        offsets = plan.micro_batch_offsets[::world_size]
        items = [c[plan.order[offsets[s] : offsets[s + 1]]] for s in range(bins.shape[0])]
        out[name] = step_figures(bins, items, k)
        if name == "planned":  # few steps per outlier budget: the planner may not reach its target
            out[name]["outlier_fraction"] = plan.report["outlier_fraction"]
            out[name]["target_reached"] = plan.report["target_reached"]
    return out


def plan_figures(micro_batch_costs: np.ndarray, group_size: int, world_size: int) -> dict[str, Any]:
    """Predicted figures of a prepared dataset's own plan read by ``world_size`` ranks: step s takes
    W consecutive micro-batches of a group (the reader's schedule)."""
    if world_size > group_size or group_size % world_size:
        return {
            "straggler_pct": None,
            "reason": f"W = {world_size} does not divide the dataset's group size G = {group_size}",
        }
    return step_figures(np.asarray(micro_batch_costs, dtype=np.float64).reshape(-1, world_size))


# ------------------------------------------------------------------------------------------ overlap
def overlap_rates(overlap: np.ndarray, unique: np.ndarray, full_batches: int) -> dict[str, Any]:
    """``batch_overlap_rate`` of one table from per-batch counters: ``unique[n]`` distinct ids in
    batch n, ``overlap[n]`` those also in batch n-1. Pairs (n, n+1) of full batches only."""
    pairs = max(int(full_batches) - 1, 0)
    if pairs == 0:
        return {
            "batch_overlap_rate": None,
            "pooled": None,
            "stderr": None,
            "pairs": 0,
            "mean_unique_ids": None,
            "reason": "fewer than 2 full global batches",
        }
    ov = np.asarray(overlap[1:full_batches], dtype=np.float64)
    un = np.asarray(unique[1:full_batches], dtype=np.float64)
    seen = un > 0  # a batch without ids of this table (e.g. no sampled row in a step group) has no rate
    if not seen.any():
        return {
            "batch_overlap_rate": None,
            "pooled": None,
            "stderr": None,
            "pairs": 0,
            "mean_unique_ids": 0.0,
            "reason": "no ids of this table in the batches",
        }
    rates = ov[seen] / un[seen]
    pairs = int(seen.sum())
    return {
        "batch_overlap_rate": float(rates.mean()),
        "pooled": float(ov.sum() / un.sum()) if un.sum() else 0.0,
        "stderr": _stderr(rates),
        "pairs": pairs,
        "mean_unique_ids": float(np.asarray(unique[:full_batches], dtype=np.float64).mean()),
    }


# ------------------------------------------------------------------------------------------ popularity
def rank_frequency(freq_of_freq: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frequencies in descending order as runs: ``values[j]`` occurs for ranks
    ``first_rank[j] … first_rank[j] + multiplicity[j] - 1`` (ranks from 1)."""
    if not freq_of_freq:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    values = np.array(sorted(freq_of_freq, reverse=True), dtype=np.int64)
    mult = np.array([freq_of_freq[v] for v in values], dtype=np.int64)
    first = np.concatenate([[1], 1 + np.cumsum(mult)[:-1]])
    return values, mult, first


def frequency_at(ranks: np.ndarray, values: np.ndarray, first: np.ndarray) -> np.ndarray:
    return values[np.searchsorted(first, ranks, side="right") - 1]


def zipf_fit(freq_of_freq: dict[int, int], min_count: int) -> dict[str, Any]:
    """Zipf exponent s of ``f(r) ∝ r^-s``: least squares of log f on log r over the head (ranks whose
    frequency is ≥ ``min_count``; the tail below is dominated by sampling noise), at ≤ 50 log-spaced
    ranks so every decade of rank weighs the same."""
    values, mult, first = rank_frequency(freq_of_freq)
    method = (
        f"least squares of log10(frequency) on log10(rank) at <= {ZIPF_FIT_POINTS} log-spaced ranks "
        f"of the head (frequency >= {min_count})"
    )
    head = values >= min_count
    if not head.any():
        return {
            "zipf_exponent": None,
            "stderr": None,
            "method": method,
            "fit_ranks": [1, 0],
            "reason": f"no id occurs {min_count} times",
        }
    r_max = int(first[head][-1] + mult[head][-1] - 1)
    ranks = np.unique(np.round(np.geomspace(1, r_max, ZIPF_FIT_POINTS)).astype(np.int64))
    if ranks.size < 3:
        return {
            "zipf_exponent": None,
            "stderr": None,
            "method": method,
            "fit_ranks": [1, r_max],
            "reason": "fewer than 3 head ranks",
        }
    x, y = np.log10(ranks), np.log10(frequency_at(ranks, values, first))
    (slope, intercept), cov = np.polyfit(x, y, 1, cov=True)
    return {
        "zipf_exponent": float(-slope),
        "stderr": float(np.sqrt(cov[0, 0])),
        "intercept": float(intercept),
        "method": method,
        "fit_ranks": [1, r_max],
    }


def popularity(freq_of_freq: dict[int, int], min_count: int) -> dict[str, Any]:
    """Rank–frequency summary of one table: Zipf fit, head shares, points for the plot."""
    values, mult, first = rank_frequency(freq_of_freq)
    distinct = int(mult.sum())
    total = int((values * mult).sum())
    out: dict[str, Any] = {"unique_ids": distinct, "occurrences": total, **zipf_fit(freq_of_freq, min_count)}
    shares = {}
    if distinct:
        cum_ids = np.cumsum(mult)
        cum_occ = np.cumsum(values * mult)
        for pct in (0.1, 1.0, 10.0):
            top = max(int(np.ceil(distinct * pct / 100)), 1)
            j = np.searchsorted(cum_ids, top)
            before = cum_occ[j - 1] if j else 0
            done = cum_ids[j - 1] if j else 0
            shares[f"top_{pct:g}pct"] = float((before + (top - done) * values[j]) / total)
    out["top_share"] = shares
    ranks = np.unique(np.round(np.geomspace(1, max(distinct, 1), 200)).astype(np.int64)) if distinct else []
    out["rank_frequency"] = {
        "rank": [int(r) for r in ranks],
        "frequency": [int(f) for f in frequency_at(np.asarray(ranks), values, first)] if distinct else [],
    }
    return out


# ------------------------------------------------------------------------------------------ hashing
def collision_counts(state: np.ndarray) -> tuple[int, int]:
    """Rows used and rows holding exactly one id, from a per-row state (0 empty, 1 one id, 2 more)."""
    return int((state > 0).sum()), int((state == 1).sum())


def hash_collision_rate(distinct_ids: int, rows_with_one_id: int) -> float:
    """``hash_collision_rate`` (docs/definitions.md): share of distinct ids that share their row with another id."""
    return (distinct_ids - rows_with_one_id) / distinct_ids if distinct_ids else 0.0


def expected_collision_rate(distinct_ids: int, table_size: int) -> float:
    """What uniformly random ids would give: ``1 - (1 - 1/T)^(n-1)`` (a reference for the measured)."""
    if distinct_ids <= 1:
        return 0.0
    return float(-np.expm1((distinct_ids - 1) * np.log1p(-1.0 / table_size))) if table_size > 1 else 1.0
