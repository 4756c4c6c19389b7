"""Planned sample lengths of raw sources through ``prepare``'s count-only path: no sample is built.

scan → k-core → per-user event counts → ``planned_samples``: the lengths ``prepare`` would write,
which ``simulate`` needs without a prepared dataset. The public entry to that path, so callers
outside the pipeline do not assemble a ``PrepareJob`` themselves.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from freescale.pipeline.config import PrepareConfig, SampleConfig
from freescale.pipeline.prepare import PrepareJob
from freescale.pipeline.steps.sequences import planned_samples


def planned_lengths(sources: str, samples: SampleConfig, workers: int = 1, progress: bool = False) -> np.ndarray:
    """The planned samples' lengths for the source config ``sources`` (scratch work in a temp dir)."""
    work = Path(tempfile.mkdtemp(prefix="freescale-simulate-"))
    try:
        job = PrepareJob(
            PrepareConfig(
                sources=sources,
                output=str(work / "unused-output"),
                samples=samples,
                workers=workers,
                work_dir=str(work / "prepare"),
                progress=progress,
            )
        )
        try:
            counts = job.count_samples()
        finally:
            job.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return planned_samples(counts.user_ids, counts.event_counts, job.config.samples)["length"]
