"""Options of the step-group planner (``BalanceConfig``) and the names they take."""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

MODES = ("equal_count", "free_count")
FREE_OUTLIERS = ("auto", "off")
STRATEGIES = ("planned", "within_step", "random")
ALGORITHMS = ("lpt", "kk")


def is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
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
        if not is_int(self.group_size) or self.group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {self.group_size!r}")
        if not is_int(self.micro_batch_size) or self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be an int >= 1, got {self.micro_batch_size!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        f = self.max_outlier_fraction
        if not is_real(f) or not 0.0 <= f <= 1.0:
            raise ValueError(f"max_outlier_fraction must be a number in [0, 1], got {f!r}")
        t = self.target_imbalance
        if not is_real(t) or not np.isfinite(t) or t < 1.0:
            raise ValueError(f"target_imbalance must be a finite number >= 1.0, got {t!r}")
        algos = (self.algorithms,) if isinstance(self.algorithms, str) else tuple(self.algorithms)
        if not algos or any(a not in ALGORITHMS for a in algos) or len(set(algos)) != len(algos):
            raise ValueError(
                f"algorithms must be a non-empty tuple of distinct names from {ALGORITHMS}, got {self.algorithms!r}"
            )
        self.algorithms = algos
        if not is_int(self.refine_swaps) or self.refine_swaps < 0:
            raise ValueError(f"refine_swaps must be an int >= 0, got {self.refine_swaps!r}")
        b = self.cost_budget
        if b is not None and (not is_real(b) or not np.isfinite(b) or b <= 0):
            raise ValueError(f"cost_budget must be None or a finite number > 0, got {b!r}")
        if not is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if not isinstance(self.compare_baselines, bool):
            raise ValueError(f"compare_baselines must be a bool, got {self.compare_baselines!r}")
        if self.free_outliers not in FREE_OUTLIERS:
            raise ValueError(f"free_outliers must be one of {FREE_OUTLIERS}, got {self.free_outliers!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["algorithms"] = list(self.algorithms)
        return out
