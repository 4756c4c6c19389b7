"""The ``local`` executor: this host's process pool plus a writer process for the shards."""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tqdm import tqdm

from freescale.pipeline.executors.processes import PREPARE_WORKER_MODULES, release_freed_memory, run_calls, start_pool
from freescale.pipeline.executors.seam import Call, Progress
from freescale.pipeline.executors.writer_process import WriterProcess
from freescale.pipeline.memory import local_sizing


class LocalExecutor:
    """This host's process pool: ``processes - 1`` spawned processes and this one (``run_calls``), as
    many of ``workers`` as ``memory_limit`` holds (``memory.local_sizing``: every process counts)."""

    name = "local"

    def __init__(
        self,
        workers: int,
        progress: Progress,
        pool: ProcessPoolExecutor | None = None,
        writer: bool = False,
        memory_limit: int = 2 * 2**30,
    ) -> None:
        """``pool``: workers started earlier (``processes.start_pool``, as many as ``local_sizing``
        gives); ``writer``: start the writer process now (its start overlaps the scan)."""
        sizing = local_sizing(memory_limit, workers, writer)
        if sizing.note:
            progress.warn(sizing.note)
        self.slots = sizing.processes - 1
        self.progress = progress
        self._pool = pool
        self._writer = WriterProcess() if writer else None

    def _executor(self) -> ProcessPoolExecutor | None:
        """One spawn pool for the whole job: workers start (and import polars/pyarrow) once."""
        if self.slots == 0:
            return None
        if self._pool is None:
            self._pool = start_pool(self.slots, PREPARE_WORKER_MODULES)
        return self._pool

    def map(self, calls: list[Call], desc: str, unit: str) -> list[Any]:
        started = time.perf_counter()
        bar = self.progress.bar(len(calls), desc, unit)
        try:
            return run_calls(self._executor(), self.slots, calls, bar.update)
        finally:
            bar.close()
            self.progress.done(len(calls), desc, unit, started)

    def write(self, calls: list[Call], desc: str) -> None:
        """One part at a time (a part's memory is bounded by its buckets), in the writer process
        when one was started, else in this one."""
        for fn, args in tqdm(calls, desc=desc, unit="part", disable=not self.progress.enabled, leave=False):
            if self._writer is not None:
                self._writer.submit(fn, *args).result()
            else:
                fn(*args)

    def release(self) -> None:
        """Stop the workers (idle workers keep their peak memory) and trim this process's heap."""
        self._stop_pool()
        release_freed_memory()

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        self._stop_pool()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
