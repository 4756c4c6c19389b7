"""The Ray executor (``--executor ray``): a step's calls as Ray tasks.

Imported only when the engine is chosen, so the local executor never pays for ``import ray``.

- ``--ray-address auto|HOST:PORT`` joins a running cluster; without it a Ray runtime is started for
  the job on this host and stopped when the job ends, so the same command works on a laptop: no
  dashboard, its own temp dir, and as many of ``workers`` CPUs (concurrent task workers) and an
  object store as ``--memory-limit`` holds beside the runtime's own processes (``memory.ray_sizing``;
  when not even one worker fits, one line at start says so). A joined cluster's memory is its own:
  one line says the limit then bounds only the job's partitions and buckets.
- A runtime started for the job starts with the first step (the scan), while a thread of the driver
  runs that step's first calls; once it is up the driver runs no step, and at the end its
  autoscaler monitor is killed rather than waited for (``_stop_autoscaler_monitor``).
- Tasks run with the local workers' settings (one polars thread, the allocator's purge delay) and
  the driver's object-storage settings (``AWS_*``, ``S3_ENDPOINT_URL``), in the driver's working
  directory, so relative paths mean the same thing. Each task applies them before it unpickles its
  call (``_run_call``): a Ray worker has imported pyarrow but not polars, and mimalloc reads its
  options at its first allocation, so the cluster's idle workers run the job as they are. A job
  ``runtime_env`` made Ray start a new set of workers for every job instead (the idle ones lack it):
  ~1 CPU-s each (a process, ray, pyarrow) that every job paid. The work directory must be reachable
  from every node at the same path (node-local disk on one host, a shared mount on several), or be
  an ``s3://`` prefix (``workdir``).
- A task whose worker process died is retried by Ray (``TASK_RETRIES``); a step's calls are
  idempotent (temporary files, then a rename; the completion marker last), so the retry writes the
  same bytes. An exception raised by a step is not retried: it is re-raised here as itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from freescale.endpoints import host_port
from freescale.pipeline.executors.processes import (
    CallQueue,
    configure_task_process,
    release_freed_memory,
)
from freescale.pipeline.executors.seam import Call, Progress
from freescale.pipeline.memory import RaySizing, ray_sizing

AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
TASK_RETRIES = 3  # attempts after a worker died (node lost, OOM-killed, SIGKILL)
FORWARDED_ENV_PREFIXES = ("AWS_", "S3_ENDPOINT_URL", "FREESCALE_")
# Fault injection for the retry tests (tests/pipeline/test_prepare_ray.py): "<step function>:<marker path>".
# The first task of that step to create the marker SIGKILLs its own worker process; Ray retries it.
KILL_ONCE_ENV = "FREESCALE_KILL_TASK_ONCE"
# Profiling: a file to which the driver appends one JSON line per finished task (step, node, seconds,
# first_in_process) and one for the runtime's start: what benchmarks/bench_prepare.py turns into the
# tasks' per-node throughput and the split of the wall time.
TASK_TIMES_ENV = "FREESCALE_TASK_TIMES"
RUNTIME_START = "ray runtime start"  # the log's line for ray.init's seconds in the driver
CONNECT_TIMEOUT_S = 5.0  # --ray-address: how long a cluster's GCS port may take to accept a connection


def _forwarded_env() -> dict[str, str]:
    """The driver's settings that every task applies (``_run_call``)."""
    return {key: value for key, value in os.environ.items() if key.startswith(FORWARDED_ENV_PREFIXES)}


def _kill_once_if_asked(fn: Callable[..., Any]) -> None:
    step, _, marker = os.environ.get(KILL_ONCE_ENV, "").partition(":")
    if step != fn.__name__ or not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


_STEPS_RUN: list[str] = []  # the steps this worker process has run, in order: a step's first call pays its imports


def _run_call(cwd: str, env: dict[str, str], call: bytes) -> tuple[Any, dict[str, Any]]:
    """One step call (``call``: the pickled function and arguments) in a Ray worker, set up like a
    local worker process before the call's modules are imported; returns its result and its timing:
    node, seconds, and whether it was this process's first call of the step.

    A worker keeps the memory its calls freed (``keep_freed_memory``: reused by the step's next
    call); its first call of another step returns it to the system first, as the local executor
    stops its pool before the write. Without that, each write task's peak came on top of the
    samples step's high-water mark (~450 MB a worker on large) and the job passed a 2 GB limit."""
    started = time.perf_counter()
    os.environ.update(env)
    configure_task_process()
    with contextlib.suppress(OSError):
        os.chdir(cwd)
    fn, args = pickle.loads(call)
    _kill_once_if_asked(fn)
    first = fn.__name__ not in _STEPS_RUN
    if _STEPS_RUN and _STEPS_RUN[-1] != fn.__name__:
        release_freed_memory()
    _STEPS_RUN.append(fn.__name__)
    result = fn(*args)
    import ray

    node = ray.get_runtime_context().get_node_id()
    return result, {"node": node, "seconds": round(time.perf_counter() - started, 4), "first_in_process": first}


def _record_task_times(step: str, times: list[dict[str, Any]]) -> None:
    path = os.environ.get(TASK_TIMES_ENV)
    if not path or not times:
        return
    with open(path, "a") as out:
        for timing in times:
            out.write(json.dumps({"step": step, **timing}) + "\n")


class RayExecutor:
    """``Executor`` on Ray tasks (see the module docstring)."""

    name = "ray"

    def __init__(self, address: str | None, workers: int, progress: Progress, memory_limit: int) -> None:
        self.progress = progress
        self._temp_dir: str | None = None
        self._started = False
        self._sizing: RaySizing | None = None
        # Ray's notice that token authentication is on (its default since 2.5x) would be a second line
        # beside the CLI's one-line errors; the job's own runtime needs no notice
        logging.getLogger(AUTH_LOGGER).setLevel(logging.ERROR)
        self._remote: Any = None  # the Ray task function, made once ray is imported
        if not _ray_initialized() and address:
            # joined at once: overlapping the join (~0.75 s) with the driver running the scan's first
            # calls gained nothing on 2 cores (bench_prepare's attached arm, 9.0 vs 9.2 s), and left
            # fewer of the scan's calls to the cluster
            resolved = cluster_address(address)
            try:
                self._timed_init(address=resolved)
            except ConnectionError as error:  # something answered, but not a Ray cluster's GCS
                raise ValueError(f"--ray-address {address}: {error}") from None
            self.progress.warn(
                "ray executor: joined a running cluster; --memory-limit bounds this job's partitions and "
                "buckets, not the cluster's processes"
            )
        elif not _ray_initialized():  # started with the first step, while this process runs its first calls
            self._sizing = ray_sizing(memory_limit, workers)
            if self._sizing.warning:
                self.progress.warn(self._sizing.warning)

    def _timed_init(self, **options: Any) -> None:
        started = time.perf_counter()
        import ray  # here, not at the top: ~0.5 s that a started runtime's first step overlaps

        ray.init(log_to_driver=False, logging_level="ERROR", **options)
        self._started = True
        _record_task_times(RUNTIME_START, [{"node": "driver", "seconds": round(time.perf_counter() - started, 4)}])

    def _start_runtime(self) -> None:
        """A Ray runtime on this host for the job: no dashboard, a short private temp dir (Ray's
        sockets live under it, 108-byte limit; a shared /tmp/ray would mix this runtime's session
        with other users' clusters), CPUs and object store from ``memory.ray_sizing``."""
        assert self._sizing is not None
        self._temp_dir = tempfile.mkdtemp(prefix="fsray-", dir="/tmp")
        self._timed_init(
            num_cpus=self._sizing.cpus,
            object_store_memory=self._sizing.object_store_bytes,
            include_dashboard=False,
            _temp_dir=self._temp_dir,
        )
        self._sizing = None

    def map(self, calls: list[Call], desc: str, unit: str) -> list[Any]:
        started = time.perf_counter()
        bar = self.progress.bar(len(calls), desc, unit)
        queue = CallQueue(calls, bar.update)
        times: list[dict[str, Any]] = []
        try:
            if self._sizing is not None:
                times += self._start_runtime_while_running(queue)
            times += self._run_tasks(queue)
        finally:
            bar.close()
            self.progress.done(len(calls), desc, unit, started)
            _record_task_times(desc, times)
        return queue.results()

    def _start_runtime_while_running(self, queue: CallQueue) -> list[dict[str, Any]]:
        """Start the runtime (``ray.init`` must run on the main thread) while a thread of this
        process runs the step's first calls: the ~2.5 s the runtime takes to start are otherwise idle
        CPU for the user. The thread stops taking calls once the runtime is up and finishes its
        current one beside the first tasks; what it held is then returned to the system."""
        times: list[dict[str, Any]] = []
        runtime_up = threading.Event()
        helper = threading.Thread(target=_run_until, args=(queue, runtime_up, times), daemon=True)
        helper.start()
        try:
            self._start_runtime()
        finally:
            runtime_up.set()
        tasks = self._run_tasks(queue)
        helper.join()
        release_freed_memory()
        return times + tasks

    def _run_tasks(self, queue: CallQueue) -> list[dict[str, Any]]:
        """Every call left in ``queue`` as a Ray task; returns the tasks' timings."""
        import ray
        from ray.exceptions import RayTaskError

        if self._remote is None:
            self._remote = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False)(_run_call)
        cwd, env = os.getcwd(), _forwarded_env()
        refs = {
            self._remote.remote(cwd, env, pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)): index
            for index, (fn, args) in queue.take_all()
        }
        pending = list(refs)
        times: list[dict[str, Any]] = []
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        result, timing = ray.get(ref)
                        queue.finish(refs[ref], result)
                        times.append(timing)
                    except RayTaskError as error:  # the step's own exception, as the local executor raises it
                        queue.fail(refs[ref], error.cause if error.cause is not None else error)
                    except ray.exceptions.RayError as error:  # retries exhausted, node lost
                        queue.fail(refs[ref], error)
        except BaseException:
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            raise
        return times

    def write(self, calls: list[Call], desc: str) -> None:
        """Parts in parallel tasks, one shard writer each (``dataframe_to_mds``' pattern)."""
        self.map(calls, desc, "part")

    def release(self) -> None:
        """Nothing: the driver runs no task once the runtime is up, and idle Ray workers are the
        cluster's to manage."""

    def close(self) -> None:
        if self._started:
            import ray

            _stop_autoscaler_monitor()
            ray.shutdown()
            self._started = False
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None


def cluster_address(address: str) -> str:
    """``address`` once something answers there, else a ``ValueError`` naming ``--ray-address``.

    Why: given a cluster that is down or a mistyped host, ``ray.init`` retries for minutes, printing
    its C++ client's warnings; given ``auto`` with no cluster, it raises a traceback. A TCP connect
    with a short timeout tells the first case apart (a port that answers but is not Ray's is left to
    Ray); ``auto`` is resolved first by Ray's own lookup (``RAY_ADDRESS``, then this host's latest
    cluster), so a stale record of a stopped cluster is caught too."""
    resolved = _resolve_auto() if address == "auto" else address
    if resolved == "auto":  # Ray's lookup moved (private API): ray.init resolves it
        return resolved
    host, port = split_address(resolved)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        shown = address if resolved == address else f"{address} ({resolved})"
        reason = error.strerror or type(error).__name__
        raise ValueError(f"--ray-address {shown}: no Ray cluster answers there ({reason})") from None
    return resolved


def _resolve_auto() -> str:
    """The cluster ``auto`` names, by the lookup ``ray.init`` runs; ``"auto"`` if that API moved."""
    try:
        from ray._private.services import get_ray_address_from_environment
    except ImportError:
        return "auto"
    try:
        return get_ray_address_from_environment("auto", None)
    except ConnectionError:
        raise ValueError("--ray-address auto: no running Ray cluster found (start one, or give HOST:PORT)") from None


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT`` (Ray Client), else a ``ValueError``."""
    parsed = host_port(address.removeprefix("ray://"))
    if parsed is None:
        raise ValueError(f"--ray-address must be auto, HOST:PORT or ray://HOST:PORT, got {address!r}")
    return parsed


def _ray_initialized() -> bool:
    """Whether this process is connected to Ray, without importing it (``import ray``: ~0.5 s)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _run_until(queue: CallQueue, stop: threading.Event, times: list[dict[str, Any]]) -> None:
    """Run calls from ``queue`` in this process until ``stop`` is set (``RayExecutor``'s start)."""
    while not stop.is_set() and (call := queue.take()) is not None:
        index, (fn, args) = call
        started = time.perf_counter()
        try:
            queue.finish(index, fn(*args))
        except Exception as error:  # kept: raised in call order once every call ran
            queue.fail(index, error)
        seconds = round(time.perf_counter() - started, 4)
        times.append({"node": "driver", "seconds": seconds, "first_in_process": not times})


def _stop_autoscaler_monitor() -> None:
    """SIGKILL the started runtime's autoscaler monitor before ``ray.shutdown``.

    ``ray.shutdown`` stops the runtime's processes one by one with SIGTERM and waits up to 1 s for
    each; the monitor (nothing to autoscale on a runtime started for one job) never exits within it,
    so every job waited a full second at its end. Private API: if it moves, the plain shutdown runs."""
    import ray

    with contextlib.suppress(Exception):
        node = ray._private.worker._global_node
        for info in node.all_processes.get(ray._private.ray_constants.PROCESS_TYPE_MONITOR, []):
            info.process.kill()
            info.process.wait(timeout=5)
