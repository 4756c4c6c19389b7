"""``freescale stats``: how much of the cluster a dataset will waste, and why — before any GPU hour.

Point it at raw sources (the source config ``prepare`` reads) or at a prepared dataset. It reports,
with docs/design.md#definitions's names:

* UIH length distribution per source and merged (count, mean, p50/p90/p99/max, share above
  thresholds, a log-binned histogram);
* ``sparsity`` (paper Eq. 1) at a per-rank batch size and the compute a padded model wastes
  against a jagged one under the cost model;
* predicted ``straggler_pct`` and ``imbalance`` at W ranks × k samples for random batching,
  within-step balancing, the planned step groups ``prepare`` would write, and a prepared
  dataset's own plan;
* ``batch_overlap_rate`` per table at a global batch size and its curve over global batch sizes,
  item popularity with a fitted Zipf exponent;
* ``hash_collision_rate`` under modulo hashing for table sizes T, unique ids and id ranges;
* with ``--zch-size``, a zero-collision table's hit, insert, collision and eviction rates and
  occupancy, replaying the item ids in event-time order (``zch_replay``).

``run_stats`` writes ``stats.json`` (``SCHEMA_VERSION``; the top-level keys are ``TOP_LEVEL_KEYS``),
PNG plots and returns the report; ``compute_stats`` returns it without writing anything.
"""

from __future__ import annotations

from freescale.pipeline.stats.build import SCHEMA_VERSION, TOP_LEVEL_KEYS
from freescale.pipeline.stats.config import StatsConfig, StatsError, input_kind
from freescale.pipeline.stats.run import STATS_NAME, compute_stats, run_stats

__all__ = [
    "SCHEMA_VERSION",
    "STATS_NAME",
    "TOP_LEVEL_KEYS",
    "StatsConfig",
    "StatsError",
    "compute_stats",
    "input_kind",
    "run_stats",
]
