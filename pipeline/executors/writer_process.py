"""The local executor's process that writes MDS shards, started with the job.

It was started early so that importing mosaicml-streaming's ``MDSWriter`` (torch: ~2 s of CPU,
~500 MB) overlapped the scan; shards are now framed by ``steps.mds_shards.ShardWriter`` without
streaming or torch, so the process imports only the write step's modules (pyarrow, numpy). It keeps
the write out of the driver's heap, at a lower CPU priority than the workers, and writes the parts
the driver hands it, one at a time.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from freescale.pipeline.executors.processes import (
    exit_with_parent,
    imports_without_gc,
    no_transparent_huge_pages,
    skip_interpreter_teardown,
)

WRITER_NICE = 5  # below the workers, so its start yields to them, yet done by the write phase
WRITER_MODULE = "freescale.pipeline.steps.writer"


def _import_writer() -> None:
    """Pool initializer: lower this process's priority and import the writer (errors resurface on use)."""
    exit_with_parent()
    skip_interpreter_teardown()
    no_transparent_huge_pages()
    with contextlib.suppress(OSError, AttributeError):
        os.nice(WRITER_NICE)
    with imports_without_gc(), contextlib.suppress(Exception):  # the writer's own import raises it again
        importlib.import_module(WRITER_MODULE)


class WriterProcess:
    """One spawned process that imports the writer now and runs write jobs later, in order."""

    def __init__(self) -> None:
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_import_writer)
        self._pool.submit(int)  # start the process (and the import) now, not at the first write

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
