"""Where ``prepare``'s and ``stats``' steps run: the executor seam.

A step is a module-level function whose calls are independent (each reads and writes its own files
in the work directory and writes a completion marker last); the job lists the calls that have no
marker yet and hands them to an executor. Two engines implement ``Executor``:

- ``local`` (default): this process plus ``workers - 1`` spawned processes (``processes.run_calls``),
  fewer where ``--memory-limit`` cannot hold them (``memory.local_sizing``); shards are written one
  part at a time by a writer process started with the job (``WriterProcess``).
- ``ray``: Ray tasks on a cluster (``--ray-address``) or on a Ray runtime started for the job. Ray
  retries a task whose worker died, and a step's calls are idempotent, so a retried call rewrites the
  same bytes. Parts are written by parallel tasks, one shard writer each, then the part indexes are
  merged (mosaicml-streaming's ``dataframe_to_mds`` pattern). The driver runs no step once the
  runtime is up (a runtime started for the job: it runs the first calls while that starts).

The output depends only on the calls, never on where or in which order they ran: both engines write
byte-identical datasets (``tests/test_prepare_ray.py``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol

from tqdm import tqdm

from freescale.pipeline.executors.processes import PREPARE_WORKER_MODULES, release_freed_memory, run_calls, start_pool
from freescale.pipeline.executors.writer_process import WriterProcess
from freescale.pipeline.memory import local_sizing

ENGINES = ("local", "ray")
Call = tuple[Callable[..., Any], tuple]


class Executor(Protocol):
    """Runs a step's calls; results come back in call order, and the first failed call's error (in
    call order) is raised once every call has run."""

    name: str

    def map(self, calls: list[Call], desc: str, unit: str) -> list[Any]:
        """``[fn(*args) for fn, args in calls]``, in parallel."""
        ...

    def write(self, calls: list[Call], desc: str) -> None:
        """The write step's calls (one per part): each holds a part's buckets and an ``MDSWriter``."""
        ...

    def release(self) -> None:
        """Free what idle task processes hold before the write step's peak."""
        ...

    def close(self) -> None: ...


class Progress:
    """A progress bar and a log line per step, shared by the executors."""

    def __init__(self, enabled: bool, log: Callable[[str], None]) -> None:
        self.enabled = enabled
        self.log = log

    def bar(self, total: int, desc: str, unit: str) -> tqdm:
        return tqdm(total=total, desc=desc, unit=unit, disable=not self.enabled, leave=False)

    def warn(self, message: str) -> None:
        """One line on stderr, shown even with ``--quiet``: what the job cannot do as asked."""
        tqdm.write(message, file=sys.stderr)

    def done(self, n: int, desc: str, unit: str, started: float) -> None:
        if n:
            self.log(f"{desc}: {n} {unit}s in {time.perf_counter() - started:.1f}s")


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


def make_executor(
    engine: str,
    workers: int,
    progress: Progress,
    *,
    pool: ProcessPoolExecutor | None = None,
    writer: bool = False,
    ray_address: str | None = None,
    memory_limit: int = 2 * 2**30,
) -> Executor:
    """The executor ``--engine`` names; ``pool``/``writer`` are the local engine's, ``ray_address``
    and ``memory_limit`` (which bounds a started Ray runtime's object store) the Ray engine's."""
    if engine == "local":
        return LocalExecutor(workers, progress, pool, writer, memory_limit)
    if engine == "ray":
        from freescale.pipeline.executors.ray_tasks import RayExecutor

        return RayExecutor(ray_address, workers, progress, memory_limit)
    raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
