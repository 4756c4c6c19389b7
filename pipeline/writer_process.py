"""The process that writes MDS shards, started with the job so importing mosaicml-streaming overlaps
the scan.

``import streaming`` pulls in torch and transformers: ~7 s of CPU and ~900 MB resident. Done when the
write phase starts, it ran on one core while the other idled. A separate process (not a thread of the
driver: a low-priority thread holding the GIL stalls the driver's own serial work) imports it at a
lower CPU priority than the workers, so it mostly runs on time they leave idle (phase tails, the
single-process plan), and then writes the parts the driver hands it, one at a time.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

WRITER_PROCESS_BYTES = 1000 * 2**20  # streaming (~900 MB, measured with torch 2.14) + the interpreter
WRITER_NICE = 5  # below the workers, so the import yields to them, yet done by the write phase


def exit_with_parent() -> None:
    """Pool initializer step: end this process when the driver dies (``kill -9`` included).

    An idle pool process waits on a queue whose write end it holds itself, so it would never see
    the driver go and would keep its memory forever; a daemon thread watches the parent instead.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="freescale-exit-with-parent", daemon=True).start()


def _import_streaming() -> None:
    """Pool initializer: lower this process's priority and import streaming (errors resurface on use).

    The cyclic garbage collector is off during the import (it would traverse the growing heap of
    module objects again and again: ~1 s) and the imported objects are frozen out of its reach.
    """
    exit_with_parent()
    with contextlib.suppress(OSError, AttributeError):
        os.nice(WRITER_NICE)
    gc.disable()
    try:
        import streaming  # noqa: F401
    except Exception:  # the writer's own import raises the same error, with its traceback
        pass
    finally:
        gc.enable()
        gc.freeze()


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
