"""What a model window trains on, counted by ``prepare`` for the manifest's ``targets`` section.

An event older than every sample's model window is never a training target: a dataset prepared at
21,000 events for a model of 200 without ``--window-stride`` trains only on each user's most recent
~200 events. ``target_coverage`` counts those events from per-user event counts alone (no sample
built), with the readers' holdout rule (``dataset.targets.held_out_counts``).
"""

from __future__ import annotations

import numpy as np

from freescale.pipeline.config import SampleConfig
from freescale.pipeline.dataset.targets import HOLDOUT_EVENTS, TargetCoverage, held_out_counts
from freescale.pipeline.steps.sequences import planned_windows


def target_coverage(
    counts: np.ndarray, cfg: SampleConfig, model_max_uih_len: int, holdout_events: int = HOLDOUT_EVENTS
) -> TargetCoverage:
    """``TargetCoverage`` of users with ``counts`` events each (after k-core item removal, before the
    filters ``cfg`` applies), trained with the trainer's collation: holdout, then the most recent
    ``model_max_uih_len`` events of each window, samples under two events skipped.

    Within a user, windows (0 = most recent) have non-increasing target ranges ``[lo, hi)``, so the
    events window ``w`` adds to those of the more recent ones are ``[lo_w, min(hi_w, lo'))`` with
    ``lo'`` the smallest ``lo`` of the user's earlier kept windows: no per-event array is needed."""
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
