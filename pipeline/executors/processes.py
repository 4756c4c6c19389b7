"""Setup of the processes ``prepare`` spawns: what each must do before it imports polars or pyarrow.

This module imports neither, so a spawned worker runs ``init_worker`` before anything sets polars'
thread pool size (fixed when polars is imported).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import gc
import importlib
import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

POLARS_THREADS_PER_WORKER = "1"
# pyarrow's allocator (mimalloc) returns freed memory to the kernel after 10 ms; the next chunk of a
# read task then faults it back in, zeroed, and on a VM whose host reclaims idle guest memory that
# costs ~1 µs per page. Kept for 1 s instead, memory is reused across a task's chunks but still
# returned between phases, so the partition sizing's memory model holds. bench_prepare on large,
# two runs each: 17.4/16.2 s at 10 ms, 13.1/14.5 s at 1 s; peak RSS 1.57 -> 1.74 GB (2 GB limit).
# mimalloc reads it when pyarrow loads.
ALLOCATOR_SETTINGS = {"MIMALLOC_PURGE_DELAY": "1000"}


# What ``prepare``'s workers run: imported by the pool initializer, while the driver is still busy.
PREPARE_WORKER_MODULES = (
    "freescale.pipeline.steps.scan",
    "freescale.pipeline.steps.sequences",
    "freescale.pipeline.steps.writer",
)


def start_pool(workers: int, modules: tuple[str, ...] = ()) -> ProcessPoolExecutor:
    """A spawn pool whose ``workers`` processes start now and import ``modules`` right away.

    ``ProcessPoolExecutor`` starts a process per submission; without the warm-up submissions the
    workers would start (and spend ~0.7 s each on imports) only when the first real task arrives.
    """
    pool = ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=init_worker, initargs=(modules,)
    )
    for _ in range(workers):
        pool.submit(int)
    return pool


def init_worker(modules: tuple[str, ...] = ()) -> None:
    """Pool initializer of the scan/sample/bucket workers."""
    configure_task_process()
    exit_with_parent()
    skip_interpreter_teardown()
    with imports_without_gc():
        for name in modules:
            importlib.import_module(name)


def configure_task_process() -> None:
    """Settings of every process that runs ``prepare``'s tasks (the driver runs them too: ``run_calls``);
    effective when called before polars and pyarrow are imported.

    One polars thread per task process: the job runs one per core already, and polars' default pool
    (a thread per core in every process) oversubscribed the cores: on 2 cores the samples phase took
    4.5 s with it and 3.2 s without. A user's own ``POLARS_MAX_THREADS`` wins.
    """
    os.environ.setdefault("POLARS_MAX_THREADS", POLARS_THREADS_PER_WORKER)
    for name, value in ALLOCATOR_SETTINGS.items():
        os.environ.setdefault(name, value)
    keep_freed_memory()
    no_transparent_huge_pages()


def run_calls(
    pool: ProcessPoolExecutor | None,
    slots: int,
    calls: list[tuple[Callable[..., Any], tuple]],
    on_done: Callable[[], None],
) -> list[Any]:
    """``[fn(*args) for fn, args in calls]``, run by ``slots`` processes of ``pool`` and by this one at once.

    Each runner takes the next call when it frees up, so calls start in list order (``prepare``
    lists them longest first) and a runner never idles while calls are left. With this process as
    one of the runners, a job on ``w`` cores needs ``w - 1`` pool processes: one spawn and one
    polars/pyarrow import (~0.65 core-s) fewer, and one interpreter's memory less. The pool is fed
    one call per process at a time from a thread of this process (``_feed``), which waits on the
    pool while the main thread runs its own calls.

    Every call runs even when one fails (as a pool would run them all); then the error of the
    first failed call in list order is raised. ``on_done`` is called once per finished call.
    """
    queue = CallQueue(calls, on_done)
    slots = slots if pool is not None else 0
    feeders = [threading.Thread(target=_feed, args=(pool, queue), daemon=True) for _ in range(slots)]
    for feeder in feeders:
        feeder.start()
    try:
        while (call := queue.take()) is not None:
            index, (fn, args) = call
            try:
                queue.finish(index, run_released(fn, *args))
            except Exception as error:  # kept: raised in list order once every call ran
                queue.fail(index, error)
    except BaseException:
        queue.stop()  # an interrupt: start nothing more (the feeders end with their running call)
        raise
    for feeder in feeders:
        feeder.join()
    return queue.results()


def run_released(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, then return what its allocators kept (``release_freed_memory``) to the kernel.

    Within a task freed memory is reused from chunk to chunk (``keep_freed_memory``, the allocator
    settings); kept across tasks it only grows: the heap's free holes and mimalloc's delayed purges
    piled up task after task (256 MB limit, demo preset at 12M events: the one process's anonymous
    RSS climbed from 190 to 300 MB over the scan, then the samples step ran on top of it). Released
    after each task, a process holds its interpreter plus one task's working set, which is what the
    partition and chunk sizing count. Costs a few ms a task (a heap walk and re-faulting the pages)."""
    try:
        return fn(*args)
    finally:
        release_freed_memory()


def _feed(pool: ProcessPoolExecutor, queue: CallQueue) -> None:
    while (call := queue.take()) is not None:
        index, (fn, args) = call
        try:
            queue.finish(index, pool.submit(run_released, fn, *args).result())
        except BaseException as error:  # a broken pool included: raised by run_calls
            queue.fail(index, error)


class CallQueue:
    """The calls left, the results and errors so far, shared by ``run_calls``' runners."""

    def __init__(self, calls: list[tuple[Callable[..., Any], tuple]], on_done: Callable[[], None]) -> None:
        self._pending = collections.deque(enumerate(calls))
        self._results: list[Any] = [None] * len(calls)
        self._errors: dict[int, BaseException] = {}
        self._on_done = on_done
        self._lock = threading.Lock()

    def take(self) -> tuple[int, tuple[Callable[..., Any], tuple]] | None:
        with self._lock:
            return self._pending.popleft() if self._pending else None

    def stop(self) -> None:
        with self._lock:
            self._pending.clear()

    def take_all(self) -> list[tuple[int, tuple[Callable[..., Any], tuple]]]:
        """Every call not taken yet (another engine runs them)."""
        with self._lock:
            taken = list(self._pending)
            self._pending.clear()
            return taken

    def finish(self, index: int, result: Any) -> None:
        with self._lock:
            self._results[index] = result
            self._on_done()

    def fail(self, index: int, error: BaseException) -> None:
        with self._lock:
            self._errors[index] = error
            self._on_done()

    def results(self) -> list[Any]:
        if self._errors:
            raise self._errors[min(self._errors)]
        return self._results


@contextlib.contextmanager
def imports_without_gc() -> Iterator[None]:
    """Run a burst of imports with the cyclic garbage collector off, then freeze what they created.

    Imports allocate thousands of module-level objects; each allocation threshold crossed makes the
    collector traverse the whole growing heap again (a fifth of polars' and pyarrow's import time in a
    worker: 0.85 -> 0.65 core-s; ~1 s of torch's in the writer process). Frozen objects are never
    traversed again, which also spares every later collection in the process.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.freeze()


def skip_interpreter_teardown() -> None:
    """Pool initializer step: once this process exits normally, end it without the interpreter's
    module teardown.

    A pool process has nothing left to do when the pool stops it (its tasks closed their files and
    sent their results), but tearing down pyarrow and polars (workers) or torch (the writer process)
    took 0.2-0.3 s, and ``prepare`` waits for both: for the workers before the write phase (their
    memory goes first) and for the writer at the end. Registered first, the hook runs after every
    other ``atexit`` hook (they run last-in, first-out).
    """
    atexit.register(_exit_now)


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


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


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def keep_freed_memory() -> None:
    """Let glibc reuse freed blocks instead of returning them to the kernel.

    Every chunk allocates columns of a few MB; by default glibc serves those with fresh ``mmap``s and
    gives them back when freed, so each chunk paid page faults on zeroed pages again (a third of the
    scan's CPU time went to the kernel). Blocks up to 32 MB now come from the heap and the heap is not
    trimmed: a worker keeps its high-water mark, which the partition sizing already assumes.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
        libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


PR_SET_THP_DISABLE = 41  # prctl option (Linux 3.15+)


def no_transparent_huge_pages() -> None:
    """Back this process's memory, and that of every process it starts later (the flag is inherited
    through fork and kept across exec), with 4 KB pages only.

    With transparent huge pages the kernel maps 2 MB at a time wherever an allocator asks for it
    (``madvise``: polars' and pyarrow's allocators do) or everywhere (``always``, many distributions'
    default): a region of which a task touched a few KB counts 2 MB resident. The demo preset at
    ``--memory-limit 256MB`` (one process) peaked at 214-228 MB with ``madvise`` (45 MB of it in
    huge pages), 233-244 MB with ``always`` and 262-272 MB on another machine; with the flag set,
    175-188 MB under either setting, in the same time. No effect where the kernel lacks the option.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)


def release_freed_memory() -> None:
    """Return what ``keep_freed_memory`` kept to the kernel: the driver's share of the tasks' memory,
    before the write phase's peak."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    pyarrow = sys.modules.get("pyarrow")  # its allocator keeps freed memory for a second
    if pyarrow is not None:
        pyarrow.default_memory_pool().release_unused()
