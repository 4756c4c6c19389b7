"""Sampling users while reading: ``read_task(user_fraction=f)``, what ``stats --sample-fraction`` uses.

A row leaves the read, counted as sampled out (``RawPiece.sampled_users``), when its user id is
valid and ``ids.selected`` says its user is outside the sample; only its user column is converted.
Rows whose user id is missing or bad stay, so they are rejected exactly as in a full read. Readers
that can parse the user column alone first (JSON Lines: ``jsonl``) call ``outside`` on it and parse
the other fields of the kept rows only; the rest parse everything and call ``apply`` on the piece.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .convert import OK, convert_id
from .ids import selected
from .textlines import RawPiece

__all__ = ["UserSample", "sample_piece"]


@dataclass(frozen=True)
class UserSample:
    """Which users a read keeps: ``fraction`` of them (``ids.selected``), ids read as ``id_type``."""

    fraction: float
    id_type: str = "auto"  # the user column's id type (``Layout.id_types``)

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction < 1.0:
            raise ValueError(f"option 'user_fraction' must be in (0, 1) to sample users; got {self.fraction!r}")

    def outside(
        self, users: pa.Array | pa.ChunkedArray, forced: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per row: whether it leaves the read (valid user id outside the sample), and the user ids.
        ``forced``: the parser's codes for the column (a JSON boolean is ``bad_type``: it stays)."""
        ids, code = convert_id(users, self.id_type)
        if forced is not None:
            code = np.where(forced != 0, forced, code)
        return (code == OK) & ~selected(ids, self.fraction), ids

    def apply(self, piece: RawPiece) -> RawPiece:
        """``piece`` without its rows outside the sample, their user ids in ``sampled_users``."""
        if not len(piece.rows):
            return piece
        out, ids = self.outside(piece.columns["user"], piece.forced.get("user"))
        if not out.any():
            return piece
        kept = np.flatnonzero(~out)
        take = pa.array(kept, pa.int64())
        return RawPiece(
            columns={key: column.take(take) for key, column in piece.columns.items()},
            rows=piece.rows[kept],
            raw_text=lambda positions: piece.raw_text(kept[positions]),
            bad_rows=piece.bad_rows,
            bad_raw=piece.bad_raw,
            forced={key: codes[kept] for key, codes in piece.forced.items()},
            sampled_users=_appended(piece.sampled_users, ids[out].astype(np.int64, copy=False)),
        )


def _appended(before: np.ndarray, more: np.ndarray) -> np.ndarray:
    """``before`` then ``more``; no copy of ``more`` (most of a piece's rows) when ``before`` is empty."""
    return np.concatenate([before, more]) if len(before) else more


def sample_piece(piece: RawPiece, sample: UserSample | None) -> RawPiece:
    """``sample.apply(piece)``, or the piece as it is when the read keeps every user."""
    return piece if sample is None else sample.apply(piece)
