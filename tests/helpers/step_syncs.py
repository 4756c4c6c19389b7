"""Host syncs of whole engine steps on one gloo rank (``sync_count``), the PEC worker's tasks included.

Each step is counted with ``engine.settle()`` inside the count, so a step's total holds its main-thread
ops, the worker's prefetch of the next batch and its cold update of this one (whatever the threads'
interleaving). Used by tests/trainer/engines/test_host_reads.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from pec_check import OverlapCase, overlap_batches
from sync_count import OpCounts, counting_in_this_thread, counting_ops

# the engine cases whose steady steps test_host_reads bounds (and the GPU test on CUDA): 2 tables; 4 (2 zch)
CASES = {"item_action": {}, "profiles": {"profiles": True, "sparse": "adam"}}
# (case, overlap) -> host syncs of a steady step at most, as counted on CPU (history: test_host_reads.py)
STEP_SYNCS = {
    ("item_action", "none"): 29,
    ("item_action", "pec"): 49,
    ("profiles", "none"): 41,
    ("profiles", "pec"): 61,
}


def _count_worker_tasks(engine: Any, counts: list[OpCounts]) -> None:
    """Wrap the PEC worker's tasks so their aten ops land in ``counts[-1]`` (the step being counted)."""
    submit = engine.worker.submit

    def counted(task: Any, *args: Any) -> Any:
        def run(*inner: Any) -> Any:
            with counting_in_this_thread(counts[-1]):
                return task(*inner)

        return submit(run, *args)

    engine.worker.submit = counted


def step_syncs(case: OverlapCase, overlap: str) -> list[OpCounts]:
    """Per step of ``case`` trained on rank 0 of a gloo world of one: the ops it ran, worker included."""
    from freescale.trainer.runner import make_engine, step_seed

    cfg = case.run_config(overlap)
    engine = make_engine(cfg, 0, 1, torch.device("cpu"), cfg.engine.overlap)
    batches = iter(overlap_batches(case, 0))
    counts: list[OpCounts] = []
    if overlap == "pec":
        _count_worker_tasks(engine, counts)
    try:
        for step in range(case.steps):
            torch.manual_seed(step_seed(cfg.engine.seed, step, 0))
            engine.timer.begin_step(step)
            with counting_ops() as step_counts:
                counts.append(step_counts)
                engine.step(batches)
                engine.settle()
            engine.timer.end_step()
        return counts
    finally:
        engine.close()


def cuda_step_sync_sites(case: OverlapCase, device: str = "cuda") -> list[list[str]]:
    """Per step of ``case`` trained synchronously on ``device`` (rank 0 of the caller's world of one):
    where each synchronizing CUDA operation came from (``cuda_syncs.cuda_sync_sites``; none on CPU)."""
    from cuda_syncs import cuda_sync_sites

    from freescale.trainer.runner import make_engine, step_seed

    cfg = case.run_config("none")
    cfg = replace(cfg, engine=replace(cfg.engine, device=device))
    engine = make_engine(cfg, 0, 1, torch.device(device), "none")
    batches = iter(overlap_batches(case, 0))
    sites: list[list[str]] = []

    def step() -> None:
        engine.step(batches)
        engine.settle()

    try:
        for number in range(case.steps):
            torch.manual_seed(step_seed(cfg.engine.seed, number, 0))
            engine.timer.begin_step(number)
            sites.append(cuda_sync_sites(step))
            engine.timer.end_step()
        return sites
    finally:
        engine.close()
