"""What the model learns and how its parameters update: ``[model_extra]`` (the trainer-only model
options; ``[model]`` is ``freescale.model_config.ModelConfig``, shared with ``prepare``) and
``[optimizer]`` (the dense and the sparse optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass

from freescale.trainer.config_checks import check, choice
from freescale.trainer.table_config import ID_MODES, check_zch_options

ARCHITECTURES = ("hstu", "sasrec")
LOSSES = ("sampled_softmax", "full_softmax")
ATTENTIONS = ("auto", "triton", "torch")
EMBEDDING_INITS = ("rows", "dim", "floor")
PRECISIONS = ("fp32", "bf16")
DENSE_OPTIMIZERS = ("adam", "adamw", "sgd")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adam")


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
    zch_max_probe: int = 0  # slots an id probes from its home slot, inside its bucket (0: the whole bucket)
    zch_policy: str = "lru"  # which id gives its slot up: ttl (event time) | lru | lfu (with admission)
    zch_ttl: int = 0  # policy ttl: seconds of event time an id may go unseen before its slot may be taken
    zch_admission_threshold: int = 1  # policy lfu: occurrences before a new id takes a slot (1: at once)
    zch_lfu_halflife: int = 0  # policy lfu: training steps after which an unseen id's count halves (0: never)
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
    # Initial rows of every embedding table: uniform in ±max(sqrt(1/rows), gain·sqrt(1/d_model)) ("floor",
    # the default: TorchRec's range for small tables such as the actions, a table-size independent one
    # for large ones, so a zch or hashed table's spare capacity does not change the model),
    # ±gain·sqrt(1/rows) ("rows": TorchRec's, shrinking as a table grows) or ±gain·sqrt(1/d_model)
    # ("dim": the same for any table). gain 0: the mode's default (rows 1.0; dim and floor 0.25: rows
    # of norm 0.25/sqrt(3) = 0.14). Measured: docs/training.md, [model_extra]
    embedding_init: str = "floor"
    embedding_init_gain: float = 0.0

    @property
    def init_gain(self) -> float:
        """``embedding_init_gain``, or (0) the mode's default: 1.0 for rows, 0.25 for dim and floor."""
        return self.embedding_init_gain or (1.0 if self.embedding_init == "rows" else 0.25)

    def __post_init__(self) -> None:
        choice("model_extra.architecture", self.architecture, ARCHITECTURES)
        choice("model_extra.ids", self.ids, ID_MODES)
        choice("model_extra.attention", self.attention, ATTENTIONS)
        choice("model_extra.precision", self.precision, PRECISIONS)
        if self.attention == "triton" and self.architecture != "hstu":
            raise ValueError(
                "model_extra.attention 'triton' is the HSTU kernel; SASRec runs PyTorch's scaled_dot_product_attention "
                "(leave model_extra.attention = 'auto')"
            )
        choice("model_extra.loss", self.loss, LOSSES)
        choice("model_extra.embedding_init", self.embedding_init, EMBEDDING_INITS)
        check(
            self.embedding_init_gain >= 0,
            "model_extra.embedding_init_gain",
            "must be >= 0 (0: the mode's default)",
            self.embedding_init_gain,
        )
        for name in ("time_buckets", "ffn_multiplier"):
            check(getattr(self, name) >= 1, f"model_extra.{name}", "must be >= 1", getattr(self, name))
        for name in ("num_items", "num_actions"):
            value = getattr(self, name)
            check(value >= 0, f"model_extra.{name}", "must be >= 0 (0: the dataset's vocabulary size)", value)
        if self.ids == "hashed":
            check(self.num_items >= 1, "model_extra.num_items", "must be set with model_extra.ids 'hashed'", 0)
        self._check_zch()
        check(self.inbatch_negatives >= 0, "model_extra.inbatch_negatives", "must be >= 0", self.inbatch_negatives)
        check(self.temperature > 0, "model_extra.temperature", "must be > 0", self.temperature)
        check(0.0 <= self.dropout < 1.0, "model_extra.dropout", "must be in [0, 1)", self.dropout)
        check(
            self.length_group_ratio >= 1.0, "model_extra.length_group_ratio", "must be >= 1.0", self.length_group_ratio
        )

    def _check_zch(self) -> None:
        """The item identity table's shape and policy (``table_config.check_zch_options``)."""
        check_zch_options("model_extra", self)
        if self.ids == "zch":
            check(self.num_items == 0, "model_extra.num_items", "must be 0 with model_extra.ids 'zch' (zch_size "
                   "sizes the item table)", self.num_items)  # fmt: skip

    @property
    def zch_buckets(self) -> int:
        return self.zch_size // self.zch_bucket_size if self.zch_bucket_size else 0


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
        choice("optimizer.dense", self.dense, DENSE_OPTIMIZERS)
        choice("optimizer.sparse", self.sparse, SPARSE_OPTIMIZERS)
        for name in ("dense_lr", "sparse_lr", "eps"):
            check(getattr(self, name) > 0, f"optimizer.{name}", "must be > 0", getattr(self, name))
        check(self.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", self.weight_decay)
        self.betas = tuple(self.betas)  # TOML gives a list
        check(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "optimizer.betas",
            "must be two numbers in [0, 1)",
            self.betas,
        )
