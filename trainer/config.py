"""The trainer's run config: one TOML file, validated on load, errors that name the option.

Tables: ``[model]`` is ``freescale.model_config.ModelConfig`` unchanged, so the same file can be
passed to ``freescale prepare --model-config`` and the planner costs samples with the dimensions the
trainer runs. Options only the trainer needs live in ``[model_extra]`` (a separate dataclass, so
``ModelConfig.from_dict`` keeps reading ``[model]``). ``[data]``, ``[optimizer]``, ``[engine]``,
``[eval]``, ``[checkpoint]`` and ``[logging]`` follow. Unknown tables or keys are errors: a typo
must not silently fall back to a default in a benchmark.

Every dataclass validates itself in ``__post_init__`` and raises ``ValueError`` naming
``table.option``; ``RunConfig.from_toml`` adds the file name.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from freescale.model_config import ModelConfig
from freescale.overrides import apply_overrides
from freescale.trainer.config_toml import tables_to_toml
from freescale.trainer.table_config import (
    ID_MODES,
    UserTableConfig,
    ZchOptions,
    check_zch_options,
    check_zch_world,
)
from freescale.trainer.table_config import check as _check
from freescale.trainer.table_config import choice as _choice

ARCHITECTURES = ("hstu", "sasrec")
ENGINES = ("freescale", "torchrec")
DENSE_OPTIMIZERS = ("adam", "adamw", "sgd")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adam")
DEVICES = ("cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
TORCHREC_PIPELINES = ("auto", "sparse_dist", "base", "none")
OVERLAPS = ("auto", "pec", "none")
BALANCERS = ("none", "online", "auto")
TRANSPORTS = ("auto", "torch", "copy_engine")
ALL_TO_ALLS = ("flat", "hierarchical", "auto")
LOSSES = ("sampled_softmax", "full_softmax")
ATTENTIONS = ("auto", "triton", "torch")
PRECISIONS = ("fp32", "bf16")
EVAL_METRICS = ("ndcg", "hr")  # kernels.transport.TRANSPORTS, without importing torch here


def _type_name(kind: Any) -> str:
    """A field's annotation as text (``from __future__ import annotations`` modules give strings)."""
    return kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))


def _check_value(option: str, kind: str, value: Any) -> None:
    """One option against its annotation. Why: TOML reads ``inf``/``nan`` and ``1.5`` happily, and a
    comparison in ``__post_init__`` lets ``inf`` through (``inf > 0``) and ``1.5`` too (``1.5 >= 0``)."""
    if kind == "int":
        _check(isinstance(value, int) and not isinstance(value, bool), option, "must be an integer", value)
    elif kind == "float":
        _check(isinstance(value, int | float) and not isinstance(value, bool), option, "must be a number", value)
        _check(math.isfinite(value), option, "must be finite", value)
    elif kind == "bool":
        _check(isinstance(value, bool), option, "must be true or false", value)
    elif kind == "str":
        _check(isinstance(value, str), option, "must be a string", value)
    elif kind.startswith(("tuple[", "list[")):
        _check(isinstance(value, list | tuple), option, "must be a list", value)
        inner = kind[kind.index("[") + 1 : -1].split(",")[0].strip()
        for item in value:
            _check_value(option, inner, item)


def check_types(cls: type, values: dict[str, Any], table: str) -> None:
    """Every known option in ``values`` has its field's type; floats are finite (ValueError names it)."""
    kinds = {f.name: _type_name(f.type) for f in fields(cls)}
    for option, value in values.items():
        if option in kinds:
            _check_value(f"{table}.{option}", kinds[option], value)


@dataclass
class ModelExtraConfig:
    """Trainer-only model options (``[model_extra]``); ``[model]`` stays ``ModelConfig``."""

    architecture: str = "hstu"
    num_items: int = 0  # item table rows; 0: the dataset's vocabulary size (exact ids)
    num_actions: int = 0  # action table rows; 0: the dataset's vocabulary size
    ids: str = "exact"  # exact: a row per id of the dataset's vocabulary | hashed: raw id modulo num_items
    # | zch: item ids through a zero-collision identity table (docs/training.md#open-id-spaces-ids--zch)
    zch_size: int = 0  # ids = "zch": item rows that can hold an id (+ one fallback row per rank)
    zch_bucket_size: int = 64  # contiguous rows per bucket; buckets are split evenly among the ranks
    zch_max_probe: int = 16  # slots an id probes from its home slot, inside its bucket
    zch_policy: str = "lru"  # which id gives its slot up: ttl (event time) | lru | lfu (with admission)
    zch_ttl: int = 0  # policy ttl: seconds of event time an id may go unseen before its slot may be taken
    zch_admission_threshold: int = 1  # policy lfu: occurrences before a new id takes a slot (1: at once)
    loss: str = "sampled_softmax"  # sampled_softmax (random + in-batch negatives) | full_softmax (every item row)
    inbatch_negatives: int = 32  # targets of the same micro-batch used as extra negatives
    temperature: float = 0.05  # softmax temperature over l2-normalised embeddings (HSTU practice)
    dropout: float = 0.0
    time_buckets: int = 64  # log-spaced buckets of |Δt| for the HSTU relative time bias
    length_group_ratio: float = 1.25  # jagged attention pads only samples within this length ratio
    ffn_multiplier: int = 4  # SASRec feed-forward width
    # HSTU attention: triton = jagged Triton kernel (CUDA; CPU only under TRITON_INTERPRET=1), torch =
    # length-grouped padded PyTorch, auto = triton on CUDA, torch elsewhere (docs/kernels.md)
    attention: str = "auto"
    precision: str = "fp32"  # fp32 | bf16: the dense layers under bf16 autocast (GPUs; parameters stay fp32)

    def __post_init__(self) -> None:
        _choice("model_extra.architecture", self.architecture, ARCHITECTURES)
        _choice("model_extra.ids", self.ids, ID_MODES)
        _choice("model_extra.attention", self.attention, ATTENTIONS)
        _choice("model_extra.precision", self.precision, PRECISIONS)
        if self.attention == "triton" and self.architecture != "hstu":
            raise ValueError(
                "model_extra.attention 'triton' is the HSTU kernel; SASRec runs PyTorch's scaled_dot_product_attention "
                "(leave model_extra.attention = 'auto')"
            )
        _choice("model_extra.loss", self.loss, LOSSES)
        for name in ("time_buckets", "ffn_multiplier"):
            _check(getattr(self, name) >= 1, f"model_extra.{name}", "must be >= 1", getattr(self, name))
        for name in ("num_items", "num_actions"):
            value = getattr(self, name)
            _check(value >= 0, f"model_extra.{name}", "must be >= 0 (0: the dataset's vocabulary size)", value)
        if self.ids == "hashed":
            _check(self.num_items >= 1, "model_extra.num_items", "must be set with model_extra.ids 'hashed'", 0)
        self._check_zch()
        _check(self.inbatch_negatives >= 0, "model_extra.inbatch_negatives", "must be >= 0", self.inbatch_negatives)
        _check(self.temperature > 0, "model_extra.temperature", "must be > 0", self.temperature)
        _check(0.0 <= self.dropout < 1.0, "model_extra.dropout", "must be in [0, 1)", self.dropout)
        _check(
            self.length_group_ratio >= 1.0, "model_extra.length_group_ratio", "must be >= 1.0", self.length_group_ratio
        )

    def _check_zch(self) -> None:
        """The item identity table's shape and policy (``table_config.check_zch_options``)."""
        check_zch_options("model_extra", self)
        if self.ids == "zch":
            _check(self.num_items == 0, "model_extra.num_items", "must be 0 with model_extra.ids 'zch' (zch_size "
                   "sizes the item table)", self.num_items)  # fmt: skip

    @property
    def zch_buckets(self) -> int:
        return self.zch_size // self.zch_bucket_size if self.zch_bucket_size else 0


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
        _check(bool(self.path), "data.path", "is required (a prepared dataset directory or s3:// prefix)", self.path)
        _check(self.epochs > 0, "data.epochs", "must be > 0", self.epochs)
        _check(self.max_steps >= 0, "data.max_steps", "must be >= 0", self.max_steps)
        _check(self.max_seconds >= 0, "data.max_seconds", "must be >= 0", self.max_seconds)
        _check(self.workers >= 0, "data.workers", "must be >= 0", self.workers)
        _check(self.prefetch >= 1, "data.prefetch", "must be >= 1", self.prefetch)
        _check(isinstance(self.verify, bool), "data.verify", "must be true or false", self.verify)
        _check(self.seed >= 0, "data.seed", "must be >= 0", self.seed)


@dataclass
class OptimizerConfig:
    """Dense (data-parallel) and sparse (row-wise sharded) optimizers."""

    dense: str = "adam"
    dense_lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    sparse: str = "rowwise_adagrad"
    sparse_lr: float = 0.05
    eps: float = 1e-8

    def __post_init__(self) -> None:
        _choice("optimizer.dense", self.dense, DENSE_OPTIMIZERS)
        _choice("optimizer.sparse", self.sparse, SPARSE_OPTIMIZERS)
        for name in ("dense_lr", "sparse_lr", "eps"):
            _check(getattr(self, name) > 0, f"optimizer.{name}", "must be > 0", getattr(self, name))
        _check(self.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", self.weight_decay)
        self.betas = tuple(self.betas)  # TOML gives a list
        _check(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "optimizer.betas",
            "must be two numbers in [0, 1)",
            self.betas,
        )


@dataclass
class EngineConfig:
    """Which engine runs the step and on what."""

    name: str = "freescale"
    device: str = "cpu"
    backend: str = "auto"  # auto: gloo on CPU, nccl on CUDA
    threads: int = 1  # torch.set_num_threads per rank (benchmarks: 1)
    seed: int = 0  # model and table initialisation
    instrument: bool = True  # per-stage timers (CUDA: synchronises at stage boundaries)
    torchrec_pipeline: str = "auto"  # auto: TrainPipelineSparseDist (runs on CPU too), see torchrec_engine
    pin_cpus: bool = False  # CPU runs: each local rank on its own slice of the host's cores
    overlap: str = "auto"  # freescale engine: pec (prioritized embedding communication, exact) | none | auto
    max_nonfinite_skips: int = 0  # steps with a NaN/inf loss or gradient skipped (no update) before the run stops
    collective_timeout_s: float = 300.0  # a collective waiting this long for a rank ends the job (torch: 30 min)
    transport: str = "auto"  # freescale engine's all-to-alls: auto | torch | copy_engine (SM-free, one CUDA node)
    # flat: one all-to-all over every rank | hierarchical: within the node first, then one exchange per
    # pair of nodes (engine.transport inside a node; kernels/transport_hierarchical.py)
    all_to_all: str = "flat"
    ranks_per_node: int = 0  # hierarchical all-to-all: ranks per node; 0 = the launcher's LOCAL_WORLD_SIZE
    balancer: str = "none"  # freescale engine: online = move samples between ranks per step | none | auto (predicted)
    auto_profile: str = "h100_nvlink_ib400"  # overlap/balancer "auto": hardware profile the prediction uses
    balancer_cost_model: str = ""  # online balancer: calibrated cost file (prepare's --cost-model); "" = analytic
    balancer_min_gain: float = 0.02  # online balancer: move samples only if the step's max rank cost drops > 2%
    # CUDA: let ranks of a node share GPUs (local rank r on cuda:(r % GPUs)). NCCL refuses two ranks on one
    # GPU, so collectives run on gloo (auto backend) and the all-to-alls on copy engines through CUDA IPC
    # (engine.transport auto). For checks on a one-GPU machine, not for speed.
    share_gpus: bool = False
    deterministic: bool = False  # torch.use_deterministic_algorithms: bitwise-repeatable CUDA runs, slower

    def __post_init__(self) -> None:
        _choice("engine.name", self.name, ENGINES)
        _choice("engine.device", self.device, DEVICES)
        _choice("engine.backend", self.backend, BACKENDS)
        _choice("engine.torchrec_pipeline", self.torchrec_pipeline, TORCHREC_PIPELINES)
        _choice("engine.overlap", self.overlap, OVERLAPS)
        _choice("engine.transport", self.transport, TRANSPORTS)
        _choice("engine.all_to_all", self.all_to_all, ALL_TO_ALLS)
        _check(self.ranks_per_node >= 0, "engine.ranks_per_node", "must be >= 0 (0: the launcher's ranks per node)",
               self.ranks_per_node)  # fmt: skip
        if self.ranks_per_node and self.all_to_all == "flat":
            raise ValueError(
                "engine.ranks_per_node is used only with engine.all_to_all 'hierarchical' or 'auto', got 'flat'"
            )
        _choice("engine.balancer", self.balancer, BALANCERS)
        _check(self.threads >= 1, "engine.threads", "must be >= 1", self.threads)
        _check(self.seed >= 0, "engine.seed", "must be >= 0", self.seed)
        _check(self.max_nonfinite_skips >= 0, "engine.max_nonfinite_skips", "must be >= 0", self.max_nonfinite_skips)
        _check(self.collective_timeout_s > 0, "engine.collective_timeout_s", "must be > 0", self.collective_timeout_s)
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("engine.backend 'nccl' needs engine.device 'cuda' (use gloo on CPU)")
        if self.share_gpus and self.device != "cuda":
            raise ValueError("engine.share_gpus needs engine.device 'cuda' (it places several CUDA ranks on one GPU)")
        if self.share_gpus and self.backend == "nccl":
            raise ValueError(
                "engine.share_gpus cannot run on engine.backend 'nccl' (NCCL refuses two ranks on one GPU); "
                "leave engine.backend = 'auto' (gloo when GPUs are shared) or set 'gloo'"
            )
        if self.transport == "copy_engine" and self.device != "cuda":
            raise ValueError(
                "engine.transport 'copy_engine' needs engine.device 'cuda' (copy engines are GPU DMA engines); "
                "use 'auto' or 'torch'"
            )
        _check(0.0 <= self.balancer_min_gain < 1.0, "engine.balancer_min_gain", "must be in [0, 1)",
               self.balancer_min_gain)  # fmt: skip
        if self.balancer_cost_model and self.balancer == "none":
            raise ValueError(
                "engine.balancer_cost_model is used only with engine.balancer 'online' or 'auto', "
                f"got {self.balancer!r}"
            )
        _check(isinstance(self.auto_profile, str) and bool(self.auto_profile.strip()), "engine.auto_profile",
               "must name a shipped hardware profile or a profile TOML", self.auto_profile)  # fmt: skip
        if self.balancer != "none" and self.name == "torchrec":
            raise ValueError(
                f"engine.balancer {self.balancer!r} applies to the freescale engine; "
                "engine.name 'torchrec' has no online balancer (leave engine.balancer = 'none')"
            )
        if self.transport != "auto" and self.name == "torchrec":
            raise ValueError(
                f"engine.transport {self.transport!r} applies to the freescale engine; "
                "engine.name 'torchrec' runs TorchRec's own all-to-alls (leave engine.transport = 'auto')"
            )
        if self.all_to_all != "flat" and self.name == "torchrec":
            raise ValueError(
                f"engine.all_to_all {self.all_to_all!r} applies to the freescale engine; "
                "engine.name 'torchrec' runs TorchRec's own all-to-alls (leave engine.all_to_all = 'flat')"
            )

    def resolved_backend(self) -> str:
        """gloo on CPU and for ranks sharing GPUs (``share_gpus``), else nccl on CUDA."""
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.device == "cuda" and not self.share_gpus else "gloo"

    def nodes_of(self, world_size: int, local_world_size: int) -> int:
        """Ranks per node of the ``all_to_all = "hierarchical"`` exchange (0 for ``"flat"``):
        ``ranks_per_node``, or when 0 the launcher's ranks per node (``local_world_size``). A world
        that does not split into whole nodes is one line naming where the node size came from;
        for ``"auto"`` it is 0 (auto then stays flat)."""
        if self.all_to_all == "flat":
            return 0
        per_node = self.ranks_per_node or local_world_size
        if per_node < 1 or world_size % per_node:
            if self.all_to_all == "auto":
                return 0
            source = "engine.ranks_per_node" if self.ranks_per_node else "the launcher's ranks per node, --nproc"
            raise ValueError(
                f"engine.all_to_all 'hierarchical': {world_size} ranks do not split into nodes of {per_node} ({source})"
            )
        return per_node

    def all_to_all_candidates(self, world_size: int, local_world_size: int) -> tuple[str, ...]:
        """What ``engine.all_to_all`` may resolve to for this world: as given, or for ``"auto"`` flat
        and hierarchical where the ranks form two or more whole nodes (else flat)."""
        if self.all_to_all != "auto":
            return (self.all_to_all,)
        per_node = self.nodes_of(world_size, local_world_size)
        return ("flat", "hierarchical") if per_node and world_size // per_node > 1 else ("flat",)

    def resolved(self, balancer: str, all_to_all: str) -> EngineConfig:
        """This config with the balancer and all-to-all its ``auto`` resolved to (``ranks_per_node``
        dropped for flat); the overlap is passed to the engine on its own (``runner.make_engine``)."""
        per_node = self.ranks_per_node if all_to_all == "hierarchical" else 0
        return replace(self, balancer=balancer, all_to_all=all_to_all, ranks_per_node=per_node)


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

    def __post_init__(self) -> None:
        for name in ("every", "num_candidates", "patience"):
            _check(getattr(self, name) >= 0, f"eval.{name}", "must be >= 0", getattr(self, name))
        _check(self.max_users >= -1, "eval.max_users", "must be -1 (every user), 0 (off) or a count", self.max_users)
        _check(self.k >= 1, "eval.k", "must be >= 1", self.k)
        _choice("eval.metric", self.metric, EVAL_METRICS)
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
        _check(self.every >= 0, "checkpoint.every", "must be >= 0", self.every)
        _check(all(int(s) >= 1 for s in self.steps), "checkpoint.steps", "must hold steps >= 1", self.steps)
        self.steps = sorted({int(s) for s in self.steps})
        wants = self.every or self.steps or self.resume
        _check(
            bool(self.dir) or not wants,
            "checkpoint.dir",
            "is required when checkpoint.every, checkpoint.steps or checkpoint.resume is set",
            self.dir,
        )
        _check(
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
        _check(bool(self.out_dir), "logging.out_dir", "is required", self.out_dir)
        _check(self.log_every >= 1, "logging.log_every", "must be >= 1", self.log_every)
        for name in ("trace_steps", "timeline_steps", "skip_steps"):
            _check(getattr(self, name) >= 0, f"logging.{name}", "must be >= 0", getattr(self, name))


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "model_extra": ModelExtraConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "engine": EngineConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
}


def _section(cls: type, values: Any, name: str) -> Any:
    if not isinstance(values, dict):
        raise ValueError(f"[{name}] must be a table, got {values!r}")
    check_types(cls, values, name)
    if cls is ModelConfig:
        return ModelConfig.from_dict(values, where=name)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} in [{name}]; known: {sorted(known)}")
    try:
        return cls(**values)
    except TypeError as error:  # a wrong type that the comparison in __post_init__ trips over
        raise ValueError(f"[{name}]: {error}") from error


def _user_tables(values: Any) -> dict[str, UserTableConfig]:
    """``[user_tables]`` (``{feature: {option: value}}``) → one ``UserTableConfig`` per feature
    (``_section`` each, the feature being the table's name)."""
    if not isinstance(values, dict):
        raise ValueError(f"[user_tables] must hold tables ([user_tables.<feature>]), got {values!r}")
    tables = {}
    for feature, options in values.items():
        if not isinstance(options, dict):
            raise ValueError(f"user_tables.{feature} must be a table ([user_tables.{feature}]), got {options!r}")
        named = options.get("feature", feature)
        _check(named == feature, f"user_tables.{feature}.feature", f"must be {feature!r} (the table's name)", named)
        tables[feature] = _section(UserTableConfig, {**options, "feature": feature}, f"user_tables.{feature}")
    return tables


@dataclass
class RunConfig:
    """A whole training run; ``RunConfig.from_toml(path)`` or ``from_dict``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    model_extra: ModelExtraConfig = field(default_factory=ModelExtraConfig)
    data: DataConfig = field(default_factory=lambda: DataConfig(path="data/prepared"))
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    user_tables: dict[str, UserTableConfig] = field(default_factory=dict)  # by profile feature

    def __post_init__(self) -> None:
        for name, kind in SECTIONS.items():  # also configs built in code, not read from TOML
            check_types(kind, asdict(getattr(self, name)), name)
        for feature, table in self.user_tables.items():
            _check(table.feature == feature, f"user_tables.{feature}.feature", f"must be {feature!r}", table.feature)
            check_types(UserTableConfig, asdict(table), table.where)
        if self.engine.name == "torchrec" and self.engine.max_nonfinite_skips:
            raise ValueError(
                "engine.max_nonfinite_skips must be 0 with engine.name 'torchrec': its pipeline applies the "
                "update inside the step, so a non-finite step cannot be skipped, only stop the run"
            )
        if self.engine.name == "torchrec" and self.checkpoint.dir:
            raise ValueError(
                "checkpoint.dir must be empty with engine.name 'torchrec': checkpoint/resume is "
                "implemented for the FreeScale engine; the TorchRec baseline runs without checkpoints"
            )
        for where, _ in self.zch_tables():
            self._check_zch_run(where)
        if self.model.num_negatives + self.model_extra.inbatch_negatives < 1:
            raise ValueError(
                "model.num_negatives + model_extra.inbatch_negatives must be >= 1 "
                "(the sampled softmax needs at least one negative)"
            )

    def id_tables(self) -> list[tuple[str, ZchOptions]]:
        """Every table's id options with the TOML table they are in: the item table's ``model_extra``
        and each ``user_tables.<feature>``."""
        return [("model_extra", self.model_extra), *((t.where, t) for t in self.user_tables.values())]

    def zch_tables(self) -> list[tuple[str, ZchOptions]]:
        """``id_tables`` with ``ids = "zch"``."""
        return [(where, options) for where, options in self.id_tables() if options.ids == "zch"]

    def check_world(self, world_size: int) -> None:
        """Every zch table splits into whole buckets per rank (the launcher, before any rank starts)."""
        for where, options in self.zch_tables():
            check_zch_world(where, options, world_size)

    def _check_zch_run(self, where: str) -> None:
        """What ``ids = "zch"`` does not run with yet (one line naming the option)."""
        if self.engine.name != "freescale":
            raise ValueError(f"{where}.ids 'zch' runs on engine.name 'freescale' (the TorchRec baseline has no "
                             f"identity table), got {self.engine.name!r}")  # fmt: skip
        if where != "model_extra":
            return
        if self.model_extra.loss != "sampled_softmax":
            raise ValueError("model_extra.loss must be 'sampled_softmax' with model_extra.ids 'zch' (the catalogue "
                             f"is open: no full softmax over it), got {self.model_extra.loss!r}")  # fmt: skip
        if self.eval.num_candidates:
            raise ValueError("eval.num_candidates must be 0 with model_extra.ids 'zch' (full ranking over the "
                             f"table's rows), got {self.eval.num_candidates}")  # fmt: skip
        if self.eval.exclude_history:
            raise ValueError("eval.exclude_history is not supported with model_extra.ids 'zch' (history items "
                             "are raw ids, ranked rows are slots)")  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        unknown = sorted(set(data) - set(SECTIONS) - {"user_tables"})
        if unknown:
            raise ValueError(f"unknown table(s) {unknown}; known: {sorted([*SECTIONS, 'user_tables'])}")
        if "data" not in data:
            raise ValueError("[data] is required (data.path: the prepared dataset)")
        sections = {name: _section(kind, data.get(name, {}), name) for name, kind in SECTIONS.items()}
        return cls(**sections, user_tables=_user_tables(data.get("user_tables", {})))

    @classmethod
    def from_toml(cls, path: str, overrides: list[str] | None = None) -> RunConfig:
        """Read and validate ``path``; ``overrides`` are ``table.option=value`` strings (TOML values)."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: not valid TOML ({error})") from error
        apply_overrides(data, overrides or [])
        try:
            return cls.from_dict(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from error

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_toml(self) -> str:
        """The resolved config as TOML (written next to the run's logs)."""
        return tables_to_toml(self.to_dict())
