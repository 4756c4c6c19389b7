"""User-profile features as table rows: which value of a sample a profile table reads and how it becomes
a row (the trainer's ``[user_tables.<feature>]``, docs/training.md#user-profile-tables).

A prepared sample of a dataset with a users table holds ``user_features`` (one int per feature of
``layout.user_features``; ``-1`` for a user the table does not list: a value of its own) and every
sample holds ``user_id``. A profile table reads one of them per sample: exactly through the dataset's
vocabulary of the feature, folded modulo the table's rows (``hashed``), or raw for a zero-collision
identity table (``zch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from freescale.pipeline.dataset.vocabulary import Vocabulary

USER_ID = "user_id"  # the profile "feature" that is the sample's own user id
RAW_MASK = 2**63 - 1  # raw values for an identity table: int64 >= 0 (-1, "missing", becomes 2**63 - 1)


@dataclass(frozen=True)
class ProfileRead:
    """One profile table: its name (``user.<feature>``), the column of ``user_features`` it reads (None:
    the sample's ``user_id``), and raw value -> row (``vocab``: exact; ``raw``: kept for zch; else modulo
    ``rows``)."""

    table: str
    column: int | None
    rows: int
    vocab: Vocabulary | None = None
    raw: bool = False

    def values(self, samples: list[dict[str, Any]], kept: list[int]) -> np.ndarray:
        """Raw values of the ``kept`` samples (int64)."""
        if self.column is None:
            return np.array([int(samples[i][USER_ID]) for i in kept], dtype=np.int64)
        return np.array([int(samples[i]["user_features"][self.column]) for i in kept], dtype=np.int64)

    def table_rows(self, raw: np.ndarray) -> np.ndarray:
        if self.raw:  # a zero-collision table keys rows by ids >= 0: a negative value keeps an id of its own
            return raw & RAW_MASK
        if self.vocab is not None:
            return self.vocab.rows(raw, where=f"table {self.table}")
        return raw % self.rows


def profile_rows(reads: tuple[ProfileRead, ...], samples: list[dict[str, Any]], kept: list[int]) -> np.ndarray:
    """``[len(reads), len(kept)]`` rows of each profile table for the kept samples."""
    if not reads:
        return np.zeros((0, len(kept)), dtype=np.int64)
    return np.stack([read.table_rows(read.values(samples, kept)) for read in reads])
