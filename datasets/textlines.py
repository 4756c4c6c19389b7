"""Rows of a text block and the raw pieces every reader hands to the converters.

Text blocks are split into lines once with numpy (newline positions), so every later step can name a
line by index: row numbers are block offset + line index, rejects quote the original line, and parsers
may drop or reorder lines without losing track of which row is which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

__all__ = ["RAW_LIMIT", "Lines", "RawPiece", "split_lines", "valid_utf8"]

RAW_LIMIT = 500
_WHITESPACE = np.array([9, 10, 11, 12, 13, 32], dtype=np.uint8)


@dataclass
class RawPiece:
    """Rows of one piece: raw columns keyed by canonical key, their row numbers and parser rejects.

    ``forced`` holds per-key codes decided while parsing (a JSON boolean where an id belongs is
    ``bad_type`` before any conversion); ``raw_text(positions)`` renders table rows for quarantine.
    ``sampled_users``: with a user sample (``usersample``), the ids of the rows left out because
    their user id is valid and outside the sample, one per row (they count as read).
    """

    columns: dict[str, pa.Array]
    rows: np.ndarray
    raw_text: Callable[[np.ndarray], list[str]]
    bad_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bad_raw: list[str] = field(default_factory=list)
    forced: dict[str, np.ndarray] = field(default_factory=dict)
    sampled_users: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def rows_read(self) -> int:
        return len(self.rows) + len(self.bad_rows) + len(self.sampled_users)


def valid_utf8(buf: bytes) -> bool:
    """Whether ``buf`` is UTF-8 (pyarrow's JSON reader and CSV invalid-row handler do not check it)."""
    if buf.isascii():
        return True
    try:
        buf.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class Lines:
    """Line boundaries of a text block and which lines carry data (blank lines are skipped)."""

    block: bytes
    starts: np.ndarray
    ends: np.ndarray
    keep: np.ndarray  # indices of non-blank lines

    def text(self, line: int) -> str:
        raw = self.block[self.starts[line] : self.ends[line]]
        return raw.decode("utf-8", "replace").rstrip("\r")[:RAW_LIMIT]

    def utf8(self, lines: np.ndarray) -> np.ndarray:
        """Per line of ``lines``, whether it is valid UTF-8 (one check of the joined lines when all are)."""
        if valid_utf8(self.joined(lines)):
            return np.ones(len(lines), dtype=bool)
        return np.array([valid_utf8(self.block[self.starts[i] : self.ends[i]]) for i in lines], dtype=bool)

    def joined(self, lines: np.ndarray) -> bytes:
        """The given lines (increasing indices) as one buffer, one line per row: a plain slice when
        they are contiguous in the block, else one slice per run of consecutive lines, so a sparse
        subset (the sampled users' lines) costs its own bytes, not a pass over the block."""
        if not len(lines):
            return b""
        breaks = np.flatnonzero(np.diff(lines) != 1) + 1
        firsts = self.starts[lines[np.concatenate(([0], breaks))]].tolist()
        lasts = self.ends[lines[np.concatenate((breaks - 1, [len(lines) - 1]))]].tolist()
        block = self.block
        if len(firsts) == 1:
            return block[firsts[0] : lasts[0]]
        return b"\n".join([block[start:end] for start, end in zip(firsts, lasts)])


def split_lines(block: bytes) -> Lines:
    data = np.frombuffer(block, dtype=np.uint8)
    newlines = np.flatnonzero(data == 10)
    starts = np.concatenate(([0], newlines + 1)).astype(np.int64)
    ends = np.concatenate((newlines, [len(block)])).astype(np.int64)
    if starts[-1] >= len(block):  # the block ends with a newline: no line after it
        starts, ends = starts[:-1], ends[:-1]
    first = data[np.minimum(starts, max(len(block) - 1, 0))] if len(block) else np.zeros(0, np.uint8)
    maybe_blank = (ends == starts) | np.isin(first, _WHITESPACE)
    blank = np.zeros(len(starts), dtype=bool)
    for i in np.flatnonzero(maybe_blank):
        blank[i] = not block[starts[i] : ends[i]].strip()
    return Lines(block, starts, ends, np.flatnonzero(~blank))
