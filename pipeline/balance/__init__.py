"""Step-group planner: the offline load balancer of docs/design.md#balancing.

Ranks synchronise once per step, so only the costs *within* a step need to be equal. The planner
chooses which samples share a step (a *step group* of G micro-batches, G = the largest world size
planned for) and how a step's samples are split into its G micro-batches:

* ``random`` — random batching, no balancing: the baseline every report compares against.
* ``within_step`` — random step membership, then LPT/KK/swaps inside each step. It cannot absorb a
  sample whose cost exceeds a rank's share of the step.
* ``planned`` — steps are random except for outliers: the heaviest samples (the smallest share, at
  most ``max_outlier_fraction``, that reaches ``target_imbalance``; found by bisection) fill
  cost-sorted steps, so a 21k-long sample shares its step with samples of similar cost. The
  price is batch-composition bias in those steps, reported as ``composition_bias``. Outlier steps
  hold G·k samples first; when no share within the bound reaches the target that way (a sample
  outweighs a rank's share of a whole step: heavy tails, large G), ``free_outliers="auto"`` cuts
  them by cost instead — each at least G × its largest cost / target, counts free even in
  equal_count mode (``free_count_outliers`` in the report). When even that cannot reach the
  target, ``straggler_pct.floor`` says what no plan of these samples can beat.

Inside a step: equal-count (exactly k samples per micro-batch) runs greedy LPT with a cardinality
constraint and balanced Karmarkar–Karp, keeps the better per step, then swap refinement; free-count
(steps filled to ≈ G × budget, counts free) runs unconstrained LPT and KK the same way. Samples that
do not fill a whole last step still appear exactly once, in a shorter last group (``leftover`` in
the report). Same costs + config → the identical plan.

A run with W ranks (W divides G) takes W consecutive micro-batches of a group per step; bins are
stored heaviest first so each W-slice holds bins of similar cost (``plan_bin_costs``).

Public helpers ``lower_bound``, ``predict_straggler_pct`` and ``plan_bin_costs`` are shared with the
stats tool and the trainer; they use docs/design.md#definitions's definitions.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .report import build_report, lower_bound_over_mean, step_max_and_imbalance
from .steps import (
    Ranked,
    Steps,
    assign_bins,
    cut_heaviest,
    stable_group,
    steps_equal,
    steps_free,
    steps_free_outliers,
)

MODES = ("equal_count", "free_count")
FREE_OUTLIERS = ("auto", "off")
STRATEGIES = ("planned", "within_step", "random")
ALGORITHMS = ("lpt", "kk")


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass
class BalanceConfig:
    """Options of the step-group planner (docs/design.md#balancing); errors name the option to change.

    ``max_outlier_fraction`` is the knob that bounds batch-composition bias: at most that share of
    the samples (the heaviest, in whole steps of G·k) is placed into cost-sorted steps; the planner
    uses the smallest share whose plan reaches ``target_imbalance`` (max over full steps of max/mean
    micro-batch cost) and reports ``target_reached`` when it cannot. ``refine_swaps`` bounds the
    swap iterations per step (each moves one pair between the max and the min micro-batch).
    Free-count mode fills steps to about G × ``cost_budget`` (raised to the step's largest item) and
    lets counts per micro-batch vary; ``micro_batch_size`` then only sets the default budget.

    ``free_outliers="auto"``: when outlier steps of G·k samples cannot reach ``target_imbalance``
    within ``max_outlier_fraction`` (a sample costing more than a rank's share of a whole step:
    heavy tails, large G, few samples), the heaviest samples instead form *free-count* outlier
    steps cut by cost (each ≥ G × its largest cost / target), also in equal_count mode; the
    report's ``free_count_outliers`` says how many samples and steps that took. ``"off"`` keeps
    every outlier step at G·k samples (exactly k per micro-batch in equal_count mode).
    """

    group_size: int = 8  # G: the largest world size planned for
    micro_batch_size: int = 32  # k: samples per micro-batch (equal_count) or their mean (free_count)
    mode: str = "equal_count"
    strategy: str = "planned"
    max_outlier_fraction: float = 0.1  # largest share of samples that may go into cost-sorted steps
    target_imbalance: float = 1.01  # stop adding outlier steps once max over steps of max/mean ≤ this
    algorithms: tuple[str, ...] = ALGORITHMS  # per step the better one is kept
    refine_swaps: int = 512  # max swap-refinement iterations per step (0 = off)
    cost_budget: float | None = None  # free_count: per-micro-batch budget (None → k × mean cost)
    seed: int = 0
    compare_baselines: bool = True  # also plan random / within_step for the report
    free_outliers: str = "auto"  # auto: free-count outlier steps where G·k ones cannot balance; off

    def __post_init__(self) -> None:
        if not _is_int(self.group_size) or self.group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {self.group_size!r}")
        if not _is_int(self.micro_batch_size) or self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be an int >= 1, got {self.micro_batch_size!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        f = self.max_outlier_fraction
        if not _is_real(f) or not 0.0 <= f <= 1.0:
            raise ValueError(f"max_outlier_fraction must be a number in [0, 1], got {f!r}")
        t = self.target_imbalance
        if not _is_real(t) or not np.isfinite(t) or t < 1.0:
            raise ValueError(f"target_imbalance must be a finite number >= 1.0, got {t!r}")
        algos = (self.algorithms,) if isinstance(self.algorithms, str) else tuple(self.algorithms)
        if not algos or any(a not in ALGORITHMS for a in algos) or len(set(algos)) != len(algos):
            raise ValueError(
                f"algorithms must be a non-empty tuple of distinct names from {ALGORITHMS}, got {self.algorithms!r}"
            )
        self.algorithms = algos
        if not _is_int(self.refine_swaps) or self.refine_swaps < 0:
            raise ValueError(f"refine_swaps must be an int >= 0, got {self.refine_swaps!r}")
        b = self.cost_budget
        if b is not None and (not _is_real(b) or not np.isfinite(b) or b <= 0):
            raise ValueError(f"cost_budget must be None or a finite number > 0, got {b!r}")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if not isinstance(self.compare_baselines, bool):
            raise ValueError(f"compare_baselines must be a bool, got {self.compare_baselines!r}")
        if self.free_outliers not in FREE_OUTLIERS:
            raise ValueError(f"free_outliers must be one of {FREE_OUTLIERS}, got {self.free_outliers!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["algorithms"] = list(self.algorithms)
        return out


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


# ---------------------------------------------------------------------------------------------
# public helpers (docs/design.md#definitions)


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
    """``straggler_pct`` (docs/definitions.md) for steps ``bin_costs[n_steps, W]`` (rank r of step s costs
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


def micro_batch_costs(plan: BalancePlan, costs: np.ndarray) -> np.ndarray:
    """Cost of every micro-batch of ``plan`` (empty micro-batches cost 0)."""
    c = np.asarray(costs, dtype=np.float64)
    return np.bincount(plan.micro_batch_ids(), weights=c[plan.order], minlength=plan.n_micro_batches)


def plan_bin_costs(plan: BalancePlan, costs: np.ndarray, world_size: int) -> np.ndarray:
    """Per-step rank costs ``[n_steps, W]`` of a run with ``world_size`` ranks reading ``plan``:
    step s reads micro-batches ``s·W … s·W + W − 1`` (W consecutive micro-batches of a group; the
    DEVELOPERS.md formula ``(s // (G//W))·G + (s % (G//W))·W + rank`` is the same index)."""
    if not _is_int(world_size) or world_size < 1 or plan.group_size % world_size:
        raise ValueError(f"world_size must divide group_size={plan.group_size}, got {world_size!r}")
    return micro_batch_costs(plan, costs).reshape(-1, world_size)


# ---------------------------------------------------------------------------------------------
# planner


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
