"""Which events ever become a training target: the holdout rule, and the manifest's ``targets`` section.

Training is next-item at every position of a sample (all but its first event are targets), after
collation (``dataset.samples.sequence_arrays``) removes the user's held-out evaluation items
(``held_out``) and keeps the most recent ``model.max_uih_len`` events of what is left. So an event
older than a sample's model window is never a target in that sample, and if no other window covers it,
never at all. ``prepare`` counts those events (``steps.coverage.target_coverage``) and records them as
the manifest's ``targets`` section (``TargetCoverage``).

This module holds the holdout rule itself (``held_out``, and its vectorised twin used by the count):
one definition for what is trained on and what is reported. It imports neither torch (the ``prepare``
driver uses it) nor polars (every trainer rank and loader worker imports it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

HOLDOUT_EVENTS = 2  # the trainer's and the loader's default: a user's validation and test items


def held_out(sample: dict[str, Any], holdout_events: int, window_stride: int) -> int:
    """Trailing events of ``sample`` that are its user's evaluation items (never training targets).

    The user's last ``holdout_events`` events are held out (test = last, validation = the one before)
    when the user has at least one event before them, as in the common leave-one-out protocol: users
    too short to evaluate train on everything. Window ``w`` of ``prepare --window-stride s`` ends
    ``w·s`` events before the last one, so it holds ``holdout_events - w·s`` of them (if positive).
    The user's event count is ``length + w·s`` unless the window was cut at ``max_uih_len``, and then
    it exceeds ``holdout_events`` anyway.
    """
    length, window = int(sample["length"]), int(sample.get("window", 0))
    if length + window * window_stride < holdout_events + 1:
        return 0
    return max(0, holdout_events - window * window_stride)


def held_out_counts(lengths: np.ndarray, windows: np.ndarray, holdout_events: int, window_stride: int) -> np.ndarray:
    """``held_out`` of many samples at once (same rule)."""
    lengths, windows = np.asarray(lengths, np.int64), np.asarray(windows, np.int64)
    held = np.maximum(0, holdout_events - windows * window_stride)
    return np.where(lengths + windows * window_stride < holdout_events + 1, 0, held)


@dataclass(frozen=True)
class TargetCoverage:
    """How the events of the kept users split under a model window (the manifest's ``targets``).

    ``events = targets + first_events + held_out + never_target``: every user's first event has
    nothing before it, the held-out items are the evaluation's, and ``never_target`` is what the
    windowing loses (events no sample trains on as a target, ``--max-uih-len`` cuts included)."""

    model_max_uih_len: int
    max_uih_len: int
    window_stride: int
    holdout_events: int
    events: int
    targets: int
    first_events: int
    held_out: int
    never_target: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)
