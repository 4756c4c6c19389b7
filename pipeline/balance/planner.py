"""The step-group planner's search: which samples share a step, and how each step is split.

``plan_step_groups`` is the entry point; the strategies, modes and the outlier search are described
in the package docstring (``freescale.pipeline.balance``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .bin_assignment import assign_bins
from .config import BalanceConfig
from .measures import predict_straggler_pct
from .plan import BalancePlan
from .report import build_report, lower_bound_over_mean, step_max_and_imbalance
from .step_membership import (
    Ranked,
    Steps,
    cut_heaviest,
    stable_group,
    steps_equal,
    steps_free,
    steps_free_outliers,
)


def _check_costs(costs: np.ndarray) -> np.ndarray:
    c = np.asarray(costs)
    if c.ndim != 1:
        raise ValueError(f"costs must be a 1-D array, got shape {c.shape}")
    if c.size and not np.issubdtype(c.dtype, np.number):
        raise ValueError(f"costs must be numeric, got dtype {c.dtype}")
    c = c.astype(np.float64, copy=False)
    if c.size and (not np.isfinite(c).all() or (c < 0).any()):
        raise ValueError("costs must be finite and >= 0")
    return c


def _budget(costs: np.ndarray, config: BalanceConfig) -> float:
    if config.cost_budget is not None:
        return float(config.cost_budget)
    return config.micro_batch_size * float(costs.mean()) if costs.size else 0.0


def _steps(ranked: Ranked, config: BalanceConfig, n_out: int, planned: bool) -> Steps:
    """Steps whose ``n_out`` heaviest samples (a multiple of G·k) fill cost-sorted (outlier) steps
    of G·k samples each; the rest random."""
    g, k = config.group_size, config.micro_batch_size
    units = n_out // (g * k)
    if config.mode == "equal_count":
        return steps_equal(ranked, g, k, units, config.seed, cheap_leftover=planned)
    budget = _budget(ranked.costs, config)
    return steps_free(ranked, g, k, budget, units, config.seed, config.target_imbalance)


def _partition(
    ranked: Ranked, steps: Steps, config: BalanceConfig, balance: bool, algorithms=None, above=1.0, probe=False
):
    """Micro-batch of every position of ``steps.items``; free-count outlier steps of an
    equal-count plan are partitioned with the free-count kernels, the other steps with equal counts."""
    algos = config.algorithms if algorithms is None else algorithms
    args = (config.refine_swaps, above, probe)
    equal = config.mode == "equal_count"
    free = steps.free_mask()
    if not equal or not free.any():
        return assign_bins(ranked, steps, config.group_size, equal, balance, algos, *args)
    bins = np.empty(steps.items.size, dtype=np.int64)
    stats = {"lpt": 0, "kk": 0, "swaps": 0}
    for mask, eq in ((free, False), (~free, True)):
        if mask.any():
            sub, pos = steps.subset(mask)
            sub_bins, sub_stats = assign_bins(ranked, sub, config.group_size, eq, balance, algos, *args)
            bins[pos] = sub_bins
            for key in stats:
                stats[key] += sub_stats[key]
    return bins, stats


def _outlier_candidates(costs: np.ndarray, config: BalanceConfig) -> np.ndarray:
    """Outlier sample counts the search may choose from, ascending.

    Whole steps (multiples of G·k), never above ``max_outlier_fraction``. Free-count starts with
    enough steps to hold every sample costlier than a micro-batch budget: in a random step such a
    sample would raise the step's budget and inflate its sample count."""
    g, k = config.group_size, config.micro_batch_size
    unit = g * k
    limit = int(np.floor(config.max_outlier_fraction * costs.size + 1e-9)) // unit
    start = 0
    if config.mode == "free_count":
        start = min(-(-int((costs > _budget(costs, config)).sum()) // unit), limit)
    return np.arange(start, limit + 1, dtype=np.int64) * unit


def _full_steps(steps: Steps) -> int:
    return steps.n_steps - (1 if steps.partial and not steps.absorbed else 0)


def _search(ranked: Ranked, config: BalanceConfig, cand: np.ndarray, build) -> tuple[int | None, dict]:
    """Index of the smallest outlier count in ``cand`` whose steps (``build(n)``) reach
    ``target_imbalance`` (max over full steps of max/mean), in two bisections; None if none does.

    1. Cheap: the floor lower_bound / mean of every step (no partition beats it) — O(n) per probe.
    2. Full, only if needed: LPT + swap refinement from the smallest count that passes the floor.
       Greedy plus swaps nearly always lands on the floor, so this is usually one probe. (KK rarely
       changes the worst step, which its largest item bounds; the final plan keeps the better of
       LPT and KK per step, then refines.)
    """
    g, costs, target = config.group_size, ranked.costs, config.target_imbalance
    k = config.micro_batch_size if config.mode == "equal_count" else None
    floors: dict[int, float] = {}
    fulls: dict[int, float] = {}

    def floor(i: int) -> float:
        if i not in floors:
            steps = build(int(cand[i]))
            floors[i] = lower_bound_over_mean(costs, steps, g, _full_steps(steps), k)
        return floors[i]

    def worst(i: int) -> float:
        if i not in fulls:
            steps = build(int(cand[i]))
            bins, _ = _partition(ranked, steps, config, True, algorithms=("lpt",), above=target, probe=True)
            fulls[i] = step_max_and_imbalance(costs, steps, bins, g, _full_steps(steps))
        return fulls[i]

    def smallest_passing(lo: int, test, gallop: bool) -> int | None:
        """Smallest i in [lo, last] with test(i) ≤ target, assuming monotone; None if none.
        ``gallop``: probe lo+1, lo+2, lo+4, … first (the answer is usually close to lo)."""
        last = cand.size - 1
        if test(lo) <= target:
            return lo
        hi = last
        if gallop:
            step = 1
            while lo + step < last and test(lo + step) > target:
                lo, step = lo + step, step * 2
            hi = min(lo + step, last)
        if lo == hi or test(hi) > target:
            return None
        while hi - lo > 1:  # test(lo) > target >= test(hi)
            mid = (lo + hi) // 2
            if test(mid) <= target:
                hi = mid
            else:
                lo = mid
        return hi

    start = smallest_passing(0, floor, gallop=False)
    found = None if start is None else smallest_passing(start, worst, gallop=True)
    info = {
        "probes": len(floors) + len(fulls),
        "full_probes": len(fulls),
        "max_outlier_samples": int(cand[-1]),
        "min_outlier_samples": int(cand[0]),
    }
    return found, info


def _free_candidates(ranked: Ranked, config: BalanceConfig) -> tuple[np.ndarray, list[int]]:
    """Outlier counts for free-count outlier steps: 0, every end of a step cut from the heaviest
    samples (``cut_heaviest``) within ``max_outlier_fraction``, and that bound itself (an unfilled
    last step: the most the bound allows when no whole step fits)."""
    g = config.group_size
    limit = int(np.floor(config.max_outlier_fraction * ranked.costs.size + 1e-9))
    if limit < g:
        return np.zeros(1, dtype=np.int64), []
    desc = ranked.costs[ranked.desc[:limit]]
    budget = _budget(ranked.costs, config) or 1.0
    ends = cut_heaviest(desc, g, budget, config.target_imbalance, limit)
    cand = [0, *ends]
    if limit - cand[-1] >= g:
        cand.append(limit)
    return np.array(cand, dtype=np.int64), ends


def _free_builder(ranked: Ranked, config: BalanceConfig, ends: list[int]):
    budget = _budget(ranked.costs, config)
    equal = config.mode == "equal_count"
    g, k, seed, target = config.group_size, config.micro_batch_size, config.seed, config.target_imbalance
    return lambda n: steps_free_outliers(ranked, g, k, ends, n, equal, budget, seed, target)


def _probe_straggler(ranked: Ranked, config: BalanceConfig, steps: Steps) -> float:
    bins, _ = _partition(ranked, steps, config, True, algorithms=("lpt",), probe=True)
    g = config.group_size
    step = np.repeat(np.arange(steps.n_steps), np.diff(steps.offsets))
    loads = np.bincount(step * g + bins, weights=ranked.costs[steps.items], minlength=steps.n_steps * g)
    return predict_straggler_pct(loads.reshape(-1, g))


def _plan_outliers(ranked: Ranked, config: BalanceConfig) -> tuple[Steps, dict[str, Any]]:
    """Steps of the planned strategy and the search's account.

    First outlier steps of G·k samples (equal counts in equal_count mode): the smallest share that
    reaches the target. If none does and ``free_outliers="auto"``, free-count outlier steps cut by
    cost from the heaviest samples, again the smallest share that reaches it. If neither does
    (a sample costs more than the bound lets any step hold), the lowest predicted straggler_pct
    among the largest options of both."""
    cand = _outlier_candidates(ranked.costs, config)
    build_equal = lambda n: _steps(ranked, config, n, planned=True)  # noqa: E731
    found, info = _search(ranked, config, cand, build_equal)
    search: dict[str, Any] = {**info, "free_outliers_used": False, "target_reached": found is not None}
    if found is not None or config.free_outliers == "off":
        return build_equal(int(cand[found if found is not None else -1])), search
    free_cand, ends = _free_candidates(ranked, config)
    build_free = _free_builder(ranked, config, ends)
    found_free, free_info = _search(ranked, config, free_cand, build_free)
    search["free_outlier_search"] = free_info
    if found_free is not None:
        search.update(free_outliers_used=True, target_reached=True)
        return build_free(int(free_cand[found_free])), search
    options = [(build_equal(int(cand[-1])), False)]
    options += [(build_free(int(n)), True) for n in free_cand[-2:] if n > 0]
    pct = [_probe_straggler(ranked, config, steps) for steps, _ in options]
    best = int(np.argmin(pct))
    search["free_outliers_used"] = options[best][1]
    search["options_straggler_pct"] = [round(p, 4) for p in pct]
    return options[best][0], search


def _emit(steps: Steps, bins: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    step = np.repeat(np.arange(steps.n_steps), np.diff(steps.offsets))
    key = step * group_size + bins
    order = steps.items[stable_group(key)]
    counts = np.bincount(key, minlength=steps.n_steps * group_size)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return order.astype(np.int64), offsets


def plan_step_groups(costs: np.ndarray, config: BalanceConfig) -> BalancePlan:
    """Plan step groups for per-sample ``costs`` (float64, ≥ 0). Same costs + config → same plan."""
    t0 = time.perf_counter()
    c = _check_costs(costs)
    g = config.group_size
    balance = config.strategy != "random"
    planned = config.strategy == "planned"
    ranked = Ranked.of(c, config.seed)
    search: dict[str, Any] = {}
    if planned and c.size:
        steps, search = _plan_outliers(ranked, config)
    else:
        steps = _steps(ranked, config, 0, planned)
    bins, stats = _partition(ranked, steps, config, balance)
    order, offsets = _emit(steps, bins, g)
    plan = BalancePlan(order, offsets, g)
    baselines: dict[str, tuple[Steps, np.ndarray]] = {}
    if config.compare_baselines and c.size:
        # random and within_step share their step membership (same seed), so they compare like
        # with like; the plan's own steps stand in for its strategy
        base_steps = steps if not planned else _steps(ranked, config, 0, planned=False)
        for name, bal in (("random", False), ("within_step", True)):
            if name == config.strategy:
                baselines[name] = (steps, bins)
            else:
                baselines[name] = (base_steps, _partition(ranked, base_steps, config, bal)[0])
    plan.report = build_report(ranked, config, plan, steps, bins, stats, baselines, search)
    plan.report["runtime_s"] = round(time.perf_counter() - t0, 4)
    return plan
