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

Modules: ``config`` (``BalanceConfig``), ``plan`` (``BalancePlan`` and its costs), ``measures``
(lower bound, predicted straggler %), ``planner`` (``plan_step_groups``), ``step_membership``
(which samples share a step), ``bin_assignment`` (micro-batch of each sample within its step), ``algos`` (LPT,
KK, swaps), ``report``, ``windows``.
"""

from .config import ALGORITHMS, FREE_OUTLIERS, MODES, STRATEGIES, BalanceConfig
from .measures import lower_bound, predict_straggler_pct
from .plan import BalancePlan, micro_batch_costs, plan_bin_costs
from .planner import plan_step_groups

__all__ = [
    "ALGORITHMS",
    "FREE_OUTLIERS",
    "MODES",
    "STRATEGIES",
    "BalanceConfig",
    "BalancePlan",
    "lower_bound",
    "micro_batch_costs",
    "plan_bin_costs",
    "plan_step_groups",
    "predict_straggler_pct",
]
