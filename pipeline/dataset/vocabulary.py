"""Exact id tables: a dense, deterministic vocabulary per table (items, actions, user-profile features)
of a prepared dataset.

Why: folding raw ids modulo a table size collides silently (MPZCH's lesson: collisions cost quality),
and a guessed size either folds ids or adds never-trained rows that full ranking and the negatives then
see. ``prepare`` knows every id that reaches a sample, so it publishes each table's vocabulary:
``vocab/<table>.npy`` (``vocab/user_feature_<i>.npy`` for table ``user.<feature i>``: feature
names come from the source config and need not be file names), the table's distinct raw ids in
ascending order, so that row ``r`` holds raw id ``vocab[r]``. The order is a pure function of the
set of ids (same inputs, same bytes, whichever worker or partition saw an id first), and the
manifest records each table's size beside the file's hash (``tables``, ``files``).

The shards keep the raw ids: a prediction maps back to a catalogue id without the table, and a dataset
reads the same whatever id mode a run picks. Readers map raw id -> row with ``Vocabulary.rows`` (a binary
search, ~1 ms per micro-batch); the trainer does it while collating.

``prepare`` builds the vocabularies (``steps.vocabularies``); this module is what they mean to a reader.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from freescale.pipeline.dataset.manifest import ManifestError

__all__ = [
    "TABLE_COLUMNS",
    "UnknownIdError",
    "Vocabulary",
    "hash_collision_rate",
    "table_names",
    "vocabulary_file",
]

# table name -> the sample column holding its ids (``sequences.SAMPLE_SCHEMA``)
TABLE_COLUMNS = {"item": "item_ids", "action": "actions"}


class UnknownIdError(ManifestError):
    """A raw id that is not in the table's vocabulary (a dataset and vocabulary that do not match): a
    dataset that cannot be read, like any damaged one, so readers and the trainer report it in one line."""


def table_names(feature_names: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The dataset's tables: items, actions and one per user-profile feature (``user.<name>``)."""
    return [*TABLE_COLUMNS, *(f"user.{name}" for name in feature_names)]


def vocabulary_file(table: str, feature_names: list[str] | tuple[str, ...] = ()) -> str:
    """Path of a table's vocabulary inside a prepared dataset."""
    if table.startswith("user."):
        return f"vocab/user_feature_{list(feature_names).index(table[5:])}.npy"
    return f"vocab/{table}.npy"


@dataclass(frozen=True)
class Vocabulary:
    """One table's rows: ``raw_ids[r]`` is the raw id of row ``r`` (ascending, distinct)."""

    table: str
    raw_ids: np.ndarray

    def __post_init__(self) -> None:
        ids = self.raw_ids
        if ids.dtype != np.int64 or ids.ndim != 1:
            shape = f"{ids.dtype}{ids.shape}"
            raise ValueError(f"vocabulary {self.table!r}: raw ids must be a 1-D int64 array, got {shape}")
        if len(ids) > 1 and not bool((np.diff(ids) > 0).all()):
            raise ValueError(f"vocabulary {self.table!r}: raw ids must be distinct and ascending")

    @property
    def size(self) -> int:
        return len(self.raw_ids)

    def rows(self, raw: np.ndarray, where: str = "") -> np.ndarray:
        """Rows of ``raw`` ids; an id outside the vocabulary is an ``UnknownIdError`` naming it."""
        raw = np.asarray(raw, dtype=np.int64)
        rows = np.searchsorted(self.raw_ids, raw)
        if len(raw):
            found = rows < self.size
            found[found] = self.raw_ids[rows[found]] == raw[found]
            if not bool(found.all()):
                missing = int(raw[np.flatnonzero(~found)[0]])
                place = f"{where}: " if where else ""
                raise UnknownIdError(
                    f"{place}{self.table} id {missing} is not in the dataset's {self.table} vocabulary "
                    f"({self.size} ids): the data and the vocabulary do not belong together (a damaged shard "
                    "read without verification, or another dataset's files: `freescale inspect --verify` hashes them)"
                )
        return rows.astype(np.int64)

    def raw(self, rows: np.ndarray) -> np.ndarray:
        """Raw ids of ``rows`` (the inverse of ``rows``)."""
        return self.raw_ids[np.asarray(rows, dtype=np.int64)]

    def to_bytes(self) -> bytes:
        """The ``vocab/<table>.npy`` bytes (``np.save`` of the raw ids: deterministic)."""
        buffer = io.BytesIO()
        np.save(buffer, self.raw_ids, allow_pickle=False)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, table: str, data: bytes, where: str) -> Vocabulary:
        try:
            ids = np.load(io.BytesIO(data), allow_pickle=False)
            return cls(table, ids)
        except ValueError as error:
            raise ValueError(f"{where}: not a valid vocabulary file ({error})") from error


def hash_collision_rate(raw_ids: np.ndarray, table_size: int) -> float:
    """``hash_collision_rate`` (docs/definitions.md) of distinct ``raw_ids`` folded into ``table_size``
    rows by ``id % T``: the share of ids that share their row with another id."""
    if len(raw_ids) == 0:
        return 0.0
    _, counts = np.unique(np.asarray(raw_ids, np.int64) % table_size, return_counts=True)
    return float(counts[counts > 1].sum()) / len(raw_ids)
