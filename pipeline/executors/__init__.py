"""Where ``prepare``'s and ``stats``' steps run: the executor seam.

A step is a module-level function whose calls are independent (each reads and writes its own files
in the work directory and writes a completion marker last); the job lists the calls that have no
marker yet and hands them to an executor. Two executors implement ``Executor``:

- ``local`` (default): this process plus ``workers - 1`` spawned processes (``processes.run_calls``),
  fewer where ``--memory-limit`` cannot hold them (``memory.local_sizing``); shards are written one
  part at a time by a writer process started with the job (``WriterProcess``).
- ``ray``: Ray tasks on a cluster (``--ray-address``) or on a Ray runtime started for the job. Ray
  retries a task whose worker died, and a step's calls are idempotent, so a retried call rewrites the
  same bytes. Parts are written by parallel tasks, one shard writer each, then the part indexes are
  merged (mosaicml-streaming's ``dataframe_to_mds`` pattern). The driver runs no step once the
  runtime is up (a runtime started for the job: it runs the first calls while that starts).

The output depends only on the calls, never on where or in which order they ran: both executors write
byte-identical datasets (``tests/pipeline/test_prepare_ray.py``).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

from freescale.pipeline.config import EXECUTORS
from freescale.pipeline.executors.local import LocalExecutor
from freescale.pipeline.executors.seam import Call, Executor, Progress

__all__ = ["EXECUTORS", "Call", "Executor", "LocalExecutor", "Progress", "make_executor"]


def make_executor(
    executor: str,
    workers: int,
    progress: Progress,
    *,
    pool: ProcessPoolExecutor | None = None,
    writer: bool = False,
    ray_address: str | None = None,
    memory_limit: int = 2 * 2**30,
) -> Executor:
    """The executor ``--executor`` names; ``pool``/``writer`` are the local executor's, ``ray_address``
    and ``memory_limit`` (which bounds a started Ray runtime's object store) the Ray executor's."""
    if executor == "local":
        return LocalExecutor(workers, progress, pool, writer, memory_limit)
    if executor == "ray":
        from freescale.pipeline.executors.ray_tasks import RayExecutor

        return RayExecutor(ray_address, workers, progress, memory_limit)
    raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
