"""Which events ever become a training target: the holdout rule, and what a windowing leaves out.

Training is next-item at every position of a sample (all but its first event are targets), after the
trainer (``trainer.data``) removes the user's held-out evaluation items (``held_out``) and keeps the
most recent ``model.max_uih_len`` events of what is left. So an event older than a sample's model
window is never a target in that sample, and if no other window covers it, never at all: a dataset
prepared at 21,000 events for a model of 200 without ``--window-stride`` trains only on each user's
most recent ~200 events. ``target_coverage`` counts those events from per-user event counts alone
(no sample built), so ``prepare`` reports them in the manifest's ``targets`` section.

This module holds the holdout rule itself (``held_out``, used by the trainer's collation, and its
vectorised twin): one definition for what is trained on and what is reported. It imports neither
torch (the ``prepare`` driver uses it) nor polars (every trainer rank and loader worker imports it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from freescale.pipeline.config import SampleConfig

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


def target_coverage(
    counts: np.ndarray, cfg: SampleConfig, model_max_uih_len: int, holdout_events: int = HOLDOUT_EVENTS
) -> TargetCoverage:
    """``TargetCoverage`` of users with ``counts`` events each (after k-core item removal, before the
    filters ``cfg`` applies), trained with the trainer's collation: holdout, then the most recent
    ``model_max_uih_len`` events of each window, samples under two events skipped.

    Within a user, windows (0 = most recent) have non-increasing target ranges ``[lo, hi)``, so the
    events window ``w`` adds to those of the more recent ones are ``[lo_w, min(hi_w, lo'))`` with
    ``lo'`` the smallest ``lo`` of the user's earlier kept windows: no per-event array is needed."""
    from freescale.pipeline.steps.sequences import planned_windows  # polars: not in the trainer's imports

    keep, bounds = planned_windows(np.asarray(counts, np.int64), cfg)
    kept = np.asarray(counts, np.int64)[keep]
    run, window, begin, end = bounds["run"], bounds["window"], bounds["begin"], bounds["end"]
    stop = end - held_out_counts(end - begin, window, holdout_events, cfg.window_stride)
    start = np.maximum(begin, stop - model_max_uih_len)
    trained = stop - start >= 2  # the collation skips samples of fewer than two events
    # the smallest lo of each user's earlier trained windows: a cumulative minimum that restarts per
    # user, made global by shifting each user's values below every earlier user's
    top = int(kept.max(initial=0)) + 2
    shift = run.astype(np.int64) * top
    lo = np.where(trained, start + 1, top) - shift
    earlier = np.minimum.accumulate(lo)
    previous = np.concatenate([[top], earlier[:-1]]) + shift
    previous[window == 0] = top
    added = np.where(trained, np.maximum(0, np.minimum(stop, previous) - (start + 1)), 0)
    targets = int(added.sum())
    held = int(np.where(kept >= holdout_events + 1, holdout_events, 0).sum())
    events = int(kept.sum())
    return TargetCoverage(
        model_max_uih_len=int(model_max_uih_len),
        max_uih_len=cfg.max_uih_len,
        window_stride=cfg.window_stride,
        holdout_events=holdout_events,
        events=events,
        targets=targets,
        first_events=len(kept),
        held_out=held,
        never_target=events - targets - len(kept) - held,
    )
