"""The run loop's tables: what it reads and for how long (``[data]``), when and how it evaluates
(``[eval]``), checkpoints (``[checkpoint]``) and where it writes its logs (``[logging]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from freescale.trainer.config_checks import check, choice

EVAL_METRICS = ("ndcg", "hr")
CATALOGUES = ("items", "rows")  # eval.catalogue (trainer/eval/catalogue.py)


@dataclass
class DataConfig:
    """Which prepared dataset to stream and how much of it."""

    path: str = ""  # prepared dataset: local directory or s3:// prefix
    cache_dir: str = ""  # local cache for s3:// (default: a private per-user temp directory keyed by the URI)
    verify: bool = True  # check each shard's hash against the manifest when first read (false: sizes/headers only)
    epochs: float = 1.0  # used when max_steps is 0
    max_steps: int = 0  # > 0: stop after this many steps (wrapping around epochs)
    max_seconds: float = 0.0  # > 0: also stop at the first log flush after this much training time
    holdout_last: bool = True  # never train on a user's evaluation items (validation and test; eval.validation)
    workers: int = 1  # loader worker processes reading ahead (0: read in the training process)
    # micro-batches each loader worker keeps ready. Deep on purpose: where the worker shares its rank's
    # core (engine.pin_cpus) it reads at nice 19 in the rank's waits, and banks batches during long
    # steps for the short ones after them (bench_bubbles planned data: data 2.4% of step time at 2,
    # 1.6-1.7% at 32); the cost is memory, 32 collated micro-batches per rank.
    prefetch: int = 32
    seed: int = 0  # negatives and dropout draw from (seed, step, rank)

    def __post_init__(self) -> None:
        check(bool(self.path), "data.path", "is required (a prepared dataset directory or s3:// prefix)", self.path)
        check(self.epochs > 0, "data.epochs", "must be > 0", self.epochs)
        check(self.max_steps >= 0, "data.max_steps", "must be >= 0", self.max_steps)
        check(self.max_seconds >= 0, "data.max_seconds", "must be >= 0", self.max_seconds)
        check(self.workers >= 0, "data.workers", "must be >= 0", self.workers)
        check(self.prefetch >= 1, "data.prefetch", "must be >= 1", self.prefetch)
        check(isinstance(self.verify, bool), "data.verify", "must be true or false", self.verify)
        check(self.seed >= 0, "data.seed", "must be >= 0", self.seed)


@dataclass
class EvalConfig:
    """Leave-one-out by time: each user's last event is the test item, the one before the validation
    item; HR@k and NDCG@k by full ranking. Periodic evaluations score validation; the run's final
    figures are validation and test of the best-validation model (``trainer/eval/protocol.py``)."""

    every: int = 0  # steps between evaluations; 0: only at the end
    at_end: bool = True
    max_users: int = -1  # -1: every user; 0: no evaluation; N: about N users, split over ranks
    num_candidates: int = 0  # 0: full ranking over the catalogue; > 0: that many sampled negatives
    k: int = 10
    validation: bool = True  # hold out the second-to-last event as the validation item
    metric: str = "ndcg"  # ndcg | hr (at eval.k): what picks the best checkpoint and early stopping
    patience: int = 0  # > 0: stop after this many evaluations without a better validation metric
    exclude_history: bool = False  # full ranking leaves out items already in the user's history
    # "": evaluate this run's data.path users; a prepared dataset: evaluate its users instead (the next time
    # window's, docs/training.md#streaming-windows)
    data_path: str = ""
    # every evaluation also writes each user's rank of the held-out item to
    # <logging.out_dir>/eval_ranks/<split>_step<N>.csv (user_id,rank): for segment analyses
    write_ranks: bool = False
    # rank "items" (every item of the evaluated dataset's vocabulary, scored by the row it reads: hashed
    # items sharing the target's row tie against it; sampled: drawn among them) or "rows" (each table row
    # once), eval/catalogue.py
    catalogue: str = "items"

    def __post_init__(self) -> None:
        for name in ("every", "num_candidates", "patience"):
            check(getattr(self, name) >= 0, f"eval.{name}", "must be >= 0", getattr(self, name))
        check(self.max_users >= -1, "eval.max_users", "must be -1 (every user), 0 (off) or a count", self.max_users)
        check(self.k >= 1, "eval.k", "must be >= 1", self.k)
        choice("eval.metric", self.metric, EVAL_METRICS)
        choice("eval.catalogue", self.catalogue, CATALOGUES)
        if self.patience and not self.every:
            raise ValueError("eval.patience needs eval.every > 0 (evaluations to compare), got eval.every = 0")
        if self.patience and not self.validation:
            raise ValueError(
                "eval.patience needs eval.validation = true: stopping on the test item chooses on the test set"
            )
        if self.exclude_history and self.num_candidates:
            raise ValueError("eval.exclude_history applies to full ranking (eval.num_candidates = 0)")


@dataclass
class CheckpointConfig:
    """torch.distributed.checkpoint of tables, dense params, both optimizers and the loader step."""

    dir: str = ""  # empty: no checkpoints
    every: int = 0  # steps between checkpoints (0: off)
    steps: list[int] = field(default_factory=list)  # extra steps to checkpoint after
    at_end: bool = True
    resume: str = ""  # "" | "latest" | a step directory (checkpoint.dir/step_00000012)
    # load (resume, evaluate) a checkpoint trained on another dataset: fine-tuning on other data, deliberately
    allow_other_data: bool = False
    # resume onto another dataset (the next time window): tables, identity tables and optimizers carry over,
    # the step counter goes on, the new data is read from its first step (docs/training.md#streaming-windows)
    continue_on_new_data: bool = False

    def __post_init__(self) -> None:
        check(self.every >= 0, "checkpoint.every", "must be >= 0", self.every)
        check(all(int(s) >= 1 for s in self.steps), "checkpoint.steps", "must hold steps >= 1", self.steps)
        self.steps = sorted({int(s) for s in self.steps})
        wants = self.every or self.steps or self.resume
        check(
            bool(self.dir) or not wants,
            "checkpoint.dir",
            "is required when checkpoint.every, checkpoint.steps or checkpoint.resume is set",
            self.dir,
        )
        check(
            bool(self.resume) or not self.continue_on_new_data,
            "checkpoint.continue_on_new_data",
            "needs checkpoint.resume (the checkpoint to continue from)",
            self.continue_on_new_data,
        )


@dataclass
class LoggingConfig:
    """Where a run writes: metrics.jsonl, bubbles.json, trace.json, timeline.png, summary.txt."""

    out_dir: str = "runs/default"
    log_every: int = 10  # steps per flush (bubble metrics need a gather across ranks)
    progress: bool = True  # rank 0 draws a progress bar, on a terminal only (set false for logs)
    trace_steps: int = 20  # steps in the Chrome/Perfetto trace
    timeline_steps: int = 4  # steps drawn in timeline.png
    skip_steps: int = 2  # warm-up steps left out of the run summary

    def __post_init__(self) -> None:
        check(bool(self.out_dir), "logging.out_dir", "is required", self.out_dir)
        check(self.log_every >= 1, "logging.log_every", "must be >= 1", self.log_every)
        for name in ("trace_steps", "timeline_steps", "skip_steps"):
            check(getattr(self, name) >= 0, f"logging.{name}", "must be >= 0", getattr(self, name))
