"""The process that writes MDS shards, started with the job so importing mosaicml-streaming overlaps
the scan.

Importing streaming's ``MDSWriter`` pulls in torch: ~2 s of CPU and ~400 MB resident (the whole
package, with transformers, took 7.8 s and ~900 MB: ``streaming_modules`` skips that). Done when the
write phase starts, it ran on one core while the other idled. A separate process (not a thread of the
driver: a low-priority thread holding the GIL stalls the driver's own serial work) imports it at a
lower CPU priority than the workers, so it mostly runs on time they leave idle (phase tails, the
single-process plan), and then writes the parts the driver hands it, one at a time.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from freescale.pipeline.executors.processes import exit_with_parent, imports_without_gc, skip_interpreter_teardown
from freescale.pipeline.streaming_modules import mds_writer_class

WRITER_NICE = 5  # below the workers, so the import yields to them, yet done by the write phase


def _import_streaming() -> None:
    """Pool initializer: lower this process's priority and import the writer (errors resurface on use)."""
    exit_with_parent()
    skip_interpreter_teardown()
    with contextlib.suppress(OSError, AttributeError):
        os.nice(WRITER_NICE)
    with imports_without_gc(), contextlib.suppress(Exception):  # the writer's own import raises it again
        mds_writer_class()


class WriterProcess:
    """One spawned process that imports streaming now and runs write jobs later, in order."""

    def __init__(self) -> None:
        self._pool = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=_import_streaming
        )
        self._pool.submit(int)  # start the process (and the import) now, not at the first write

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
