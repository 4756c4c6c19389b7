"""What a prepared sample means to whoever reads it: ids -> table rows, held-out items, window stride.

A prepared sample holds raw ids (``item_ids``, ``actions``), ``timestamps``, its ``length`` and which
``window`` of its user it is. Reading it for next-item training means: map raw ids to table rows
(exactly, through the dataset's vocabularies; folded modulo the table size in ``hashed`` mode; or kept
raw for a trainer's zero-collision identity table, ``item_pool``),
hold out the user's evaluation items (``targets.held_out``: the validation and test items never become
training targets; window ``w`` of ``prepare --window-stride s`` ends ``w·s`` events before the last),
and keep the most recent ``max_len`` events. ``sequence_arrays`` does exactly that for a micro-batch,
for every reader: the public loader's KJT output (``kjt``) and the trainer's collation (``trainer.data``)
both start from it, so there is one mapping, whoever reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from freescale.pipeline.dataset.profiles import ProfileRead
from freescale.pipeline.dataset.targets import held_out
from freescale.pipeline.dataset.vocabulary import Vocabulary

if TYPE_CHECKING:
    from freescale.pipeline.dataset.reader import PreparedDataset

CollateFn = Callable[[list[dict[str, Any]], "CollateConfig", int, int], Any]
"""``(samples, cfg, step, rank) -> batch``: turns one step's micro-batch into what a model reads."""


@dataclass
class CollateConfig:
    """How samples are read: table sizes and vocabularies, sequence cap, holdout, window stride, and the
    negatives a trainer draws (kept small so tests can build one directly)."""

    num_items: int
    num_actions: int
    max_len: int
    num_negatives: int
    inbatch_negatives: int
    length_group_ratio: float = 1.25
    holdout_last: bool = True
    seed: int = 0
    holdout_events: int = 2  # a user's last events kept from training: 2 = validation + test items
    window_stride: int = 0  # prepare's --window-stride: where older windows end relative to the last event
    item_vocab: Vocabulary | None = None  # exact rows; None: raw id modulo num_items (hashed)
    action_vocab: Vocabulary | None = None
    # raw item ids kept as they are (a zero-collision identity table maps them); uniform negatives are
    # drawn from these raw ids (the dataset's item vocabulary)
    item_pool: np.ndarray | None = None
    full_softmax: bool = False  # negatives = every item row (model_extra.loss = "full_softmax")
    profiles: tuple[ProfileRead, ...] = ()  # user-profile tables, one row per sample each (profiles.py)

    def __post_init__(self) -> None:
        if self.max_len < 2:
            raise ValueError(f"model.max_uih_len must be >= 2 for next-item training, got {self.max_len}")
        if self.holdout_events not in (1, 2):
            raise ValueError(f"holdout_events must be 1 (test) or 2 (validation + test), got {self.holdout_events}")

    @classmethod
    def for_model(
        cls, model: Any, extra: Any, holdout_last: bool = True, seed: int = 0, **tables: Any
    ) -> CollateConfig:
        """From the run config's ``[model]`` (``ModelConfig``) and ``[model_extra]`` tables: the trainer
        and ``calibrate`` collate the same way. ``tables``: ``item_vocab``/``action_vocab``,
        ``holdout_events``, ``window_stride`` (``run_data.collate_config``)."""
        return cls(
            num_items=extra.num_items,
            num_actions=extra.num_actions,
            max_len=model.max_uih_len,
            num_negatives=model.num_negatives,
            inbatch_negatives=extra.inbatch_negatives,
            length_group_ratio=extra.length_group_ratio,
            holdout_last=holdout_last,
            seed=seed,
            full_softmax=getattr(extra, "loss", "sampled_softmax") == "full_softmax",
            **tables,
        )

    def item_rows(self, raw: np.ndarray, where: str = "") -> np.ndarray:
        """Rows of raw item ids as batches hold them: the vocabulary's rows (exact), ``raw % num_items``
        (hashed), or the raw ids themselves (zch: the identity table maps them)."""
        if self.item_pool is not None:
            return raw
        return self.item_vocab.rows(raw, where) if self.item_vocab is not None else raw % self.num_items

    def action_rows(self, raw: np.ndarray) -> np.ndarray:
        return self.action_vocab.rows(raw) if self.action_vocab is not None else raw % self.num_actions


def default_collate(dataset: PreparedDataset, user_features: bool = False) -> CollateConfig:
    """Exact id rows from the dataset's vocabularies, no negatives, the prepared sequence length, the
    leave-one-out holdout (validation + test items never become targets) and prepare's window stride;
    ``user_features``: every profile feature too, exact rows (``profiles.ProfileRead``)."""
    spec = dataset.info.samples
    item, action = dataset.vocabulary("item"), dataset.vocabulary("action")
    if item is None or action is None:
        raise ValueError(f"{dataset.uri}: no id vocabularies (prepared by an older FreeScale); pass Config.collate")
    profiles = exact_profiles(dataset) if user_features else ()
    return CollateConfig(
        num_items=item.size,
        num_actions=action.size,
        max_len=spec.max_uih_len or 2**31 - 1,
        num_negatives=0,
        inbatch_negatives=0,
        window_stride=dataset.info.window_stride,
        item_vocab=item,
        action_vocab=action,
        profiles=profiles,
    )


def exact_profiles(dataset: PreparedDataset) -> tuple[ProfileRead, ...]:
    """Every user-profile feature of ``dataset`` read through its vocabulary (one line when it has none)."""
    features = dataset.info.layout.user_features
    if not features:
        raise ValueError(f"loader option 'user_features': {dataset.uri} was prepared without a users table")
    reads = []
    for column, name in enumerate(features):
        vocab = dataset.vocabulary(f"user.{name}")
        if vocab is None:
            raise ValueError(f"loader option 'user_features': {dataset.uri} has no vocabulary of user.{name} "
                             "(prepared by an older FreeScale)")  # fmt: skip
        reads.append(ProfileRead(vocab.table, column, vocab.size, vocab))
    return tuple(reads)


@dataclass
class SequenceArrays:
    """A micro-batch's events after holdout and truncation, samples of at least two events only."""

    items: np.ndarray  # [T] item rows, sample after sample
    actions: np.ndarray  # [T] action rows
    times: np.ndarray  # [T] seconds
    lengths: np.ndarray  # [B] int64 events per kept sample
    kept: list[int]  # which of the given samples these are
    truncated: int  # events of the kept samples cut off at max_len
    last_items: np.ndarray  # [B] raw item id of each kept sample's last event (what evaluation ranks)

    def input_rows(self) -> np.ndarray:
        """Rows of every input event (all but each sample's last); the target of row r is r + 1."""
        last = np.cumsum(self.lengths) - 1
        inputs = np.ones(len(self.items), dtype=bool)
        inputs[last] = False
        return np.flatnonzero(inputs).astype(np.int64)


def sequence_arrays(samples: list[dict[str, Any]], cfg: CollateConfig, holdout: bool) -> SequenceArrays:
    """Each sample's events after holdout and truncation, ids mapped to rows, samples under two events
    dropped. Ids are mapped once per table for the whole micro-batch (every sample's, kept or not, so
    an unknown id fails the same way): per-sample mapping was most of collation's cost in the
    loader's worker, which shares the rank's core."""
    columns: list[list[np.ndarray]] = [[], [], []]
    sizes, cuts = [], []
    for sample in samples:
        arrays = [np.asarray(sample[name], dtype=np.int64) for name in ("item_ids", "actions", "timestamps")]
        end = max(0, len(arrays[0]) - (held_out(sample, cfg.holdout_events, cfg.window_stride) if holdout else 0))
        start = max(0, end - cfg.max_len)
        for column, array in zip(columns, arrays):
            column.append(array[start:end])
        sizes.append(end - start)
        cuts.append(start)
    raw = [np.concatenate(column) if column else np.zeros(0, np.int64) for column in columns]
    kept = [i for i, n in enumerate(sizes) if n >= 2]
    rows = np.repeat(np.array([n >= 2 for n in sizes], dtype=bool), sizes)
    return SequenceArrays(
        items=cfg.item_rows(raw[0])[rows],
        actions=cfg.action_rows(raw[1])[rows],
        times=raw[2][rows],
        lengths=np.array([sizes[i] for i in kept], dtype=np.int64),
        kept=kept,
        truncated=sum(cuts[i] for i in kept),
        last_items=raw[0][np.cumsum(sizes, dtype=np.int64)[kept] - 1] if kept else np.zeros(0, np.int64),
    )
