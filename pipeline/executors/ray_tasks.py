"""The Ray engine (``--engine ray``): a step's calls as Ray tasks.

Imported only when the engine is chosen, so the local engine never pays for ``import ray``.

- ``--ray-address auto|HOST:PORT`` joins a running cluster; without it a Ray runtime is started for
  the job on this host and stopped when the job ends, so the same command works on a laptop: no
  dashboard, its own temp dir, and as many of ``workers`` CPUs (concurrent task workers) and an
  object store as ``--memory-limit`` holds beside the runtime's own processes (``memory.ray_sizing``;
  when not even one worker fits, one line at start says so). A joined cluster's memory is its own:
  one line says the limit then bounds only the job's partitions and buckets.
- Tasks run with the local workers' settings (one polars thread, the allocator's purge delay) and
  the driver's object-storage settings (``AWS_*``, ``S3_ENDPOINT_URL``), in the driver's working
  directory, so relative paths mean the same thing. The work directory must be reachable from every
  node at the same path (node-local disk on one host, a shared mount on several).
- A task whose worker process died is retried by Ray (``TASK_RETRIES``); a step's calls are
  idempotent (temporary files, then a rename; the completion marker last), so the retry writes the
  same bytes. An exception raised by a step is not retried: it is re-raised here as itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayTaskError

from freescale.pipeline.executors import Call, Progress
from freescale.pipeline.executors.processes import ALLOCATOR_SETTINGS, POLARS_THREADS_PER_WORKER, configure_task_process
from freescale.pipeline.memory import ray_sizing

AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
TASK_RETRIES = 3  # attempts after a worker died (node lost, OOM-killed, SIGKILL)
FORWARDED_ENV_PREFIXES = ("AWS_", "S3_ENDPOINT_URL", "FREESCALE_")
# Fault injection for the retry tests (tests/test_prepare_ray.py): "<step function>:<marker path>".
# The first task of that step to create the marker SIGKILLs its own worker process; Ray retries it.
KILL_ONCE_ENV = "FREESCALE_KILL_TASK_ONCE"
# Profiling: a file to which the driver appends one JSON line per finished task (step, node, seconds,
# first_in_process) and one for the runtime's start: what benchmarks/bench_prepare.py turns into the
# tasks' per-node throughput and the split of the wall time.
TASK_TIMES_ENV = "FREESCALE_TASK_TIMES"
RUNTIME_START = "ray runtime start"  # the log's line for ray.init's seconds in the driver


def _worker_env() -> dict[str, str]:
    env = {"POLARS_MAX_THREADS": POLARS_THREADS_PER_WORKER, **ALLOCATOR_SETTINGS}
    env.update({key: value for key, value in os.environ.items() if key.startswith(FORWARDED_ENV_PREFIXES)})
    return env


def _kill_once_if_asked(fn: Callable[..., Any]) -> None:
    step, _, marker = os.environ.get(KILL_ONCE_ENV, "").partition(":")
    if step != fn.__name__ or not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


_STEPS_RUN: set[str] = set()  # the steps this worker process has run: a step's first call pays its imports


def _run_call(cwd: str, fn: Callable[..., Any], args: tuple) -> tuple[Any, dict[str, Any]]:
    """One step call in a Ray worker, set up like a local worker process; returns its result and
    its timing: node, seconds, and whether it was this process's first call of the step."""
    started = time.perf_counter()
    configure_task_process()
    with contextlib.suppress(OSError):
        os.chdir(cwd)
    _kill_once_if_asked(fn)
    result = fn(*args)
    first = fn.__name__ not in _STEPS_RUN
    _STEPS_RUN.add(fn.__name__)
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
        if not ray.is_initialized():
            self._init(address, workers, memory_limit)
        self._remote = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False)(_run_call)

    def _init(self, address: str | None, workers: int, memory_limit: int) -> None:
        # Ray's notice that token authentication is on (its default since 2.5x) would be a second line
        # beside the CLI's one-line errors; the job's own runtime needs no notice
        logging.getLogger(AUTH_LOGGER).setLevel(logging.ERROR)
        common = {"log_to_driver": False, "logging_level": "ERROR"}
        started = time.perf_counter()
        if address:
            self.progress.warn(
                "ray engine: joined a running cluster; --memory-limit bounds this job's partitions and "
                "buckets, not the cluster's processes"
            )
            ray.init(address=address, runtime_env={"env_vars": _worker_env()}, **common)
        else:
            # the runtime's processes inherit this environment: a job-level runtime_env would make
            # Ray start a second set of workers for it (the prestarted ones lack it), ~1.6 s here
            os.environ.update(_worker_env())
            # a short private path: Ray's sockets live under it (108-byte limit), and a shared
            # /tmp/ray would mix this runtime's session with other users' clusters
            self._temp_dir = tempfile.mkdtemp(prefix="fsray-", dir="/tmp")
            sizing = ray_sizing(memory_limit, workers)
            if sizing.warning:
                self.progress.warn(sizing.warning)
            ray.init(
                num_cpus=sizing.cpus,
                object_store_memory=sizing.object_store_bytes,
                include_dashboard=False,
                _temp_dir=self._temp_dir,
                **common,
            )
        self._started = True
        _record_task_times(RUNTIME_START, [{"node": "driver", "seconds": round(time.perf_counter() - started, 4)}])

    def map(self, calls: list[Call], desc: str, unit: str) -> list[Any]:
        started = time.perf_counter()
        bar = self.progress.bar(len(calls), desc, unit)
        cwd = os.getcwd()
        refs = [self._remote.remote(cwd, fn, args) for fn, args in calls]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(calls)
        errors: dict[int, BaseException] = {}
        pending = list(refs)
        times: list[dict[str, Any]] = []
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        results[index[ref]], timing = ray.get(ref)
                        times.append(timing)
                    except RayTaskError as error:  # the step's own exception, as the local engine raises it
                        errors[index[ref]] = error.cause if error.cause is not None else error
                    except ray.exceptions.RayError as error:  # retries exhausted, node lost
                        errors[index[ref]] = error
                    bar.update()
        except BaseException:
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            raise
        finally:
            bar.close()
            self.progress.done(len(calls), desc, unit, started)
            _record_task_times(desc, times)
        if errors:
            raise errors[min(errors)]
        return results

    def write(self, calls: list[Call], desc: str) -> None:
        """Parts in parallel tasks, one ``MDSWriter`` each (``dataframe_to_mds``' pattern)."""
        self.map(calls, desc, "part")

    def release(self) -> None:
        """Nothing: the driver runs no step, and idle Ray workers are the cluster's to manage."""

    def close(self) -> None:
        if self._started:
            ray.shutdown()
            self._started = False
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
