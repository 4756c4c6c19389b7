"""Where a ``prepare`` job's calls run: the ``--executor``'s executor, started once per job (on a pool
handed in, if any), and the steps' calls mapped on it; with an s3:// work directory each call syncs
its files with the prefix (``workdir``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from freescale.pipeline.config import PrepareConfig
from freescale.pipeline.executors import Executor, Progress, make_executor
from freescale.pipeline.workdir import RemoteWork, remote_step


class ExecutorCalls:
    """``PrepareJob``'s executor methods (a mixin: the attributes are the job's)."""

    config: PrepareConfig
    remote_work: RemoteWork | None
    _executor: Executor | None
    _pool: ProcessPoolExecutor | None

    def _start_executor(self, writer: bool) -> Executor:
        """The ``--executor``'s executor, started once per job (``executors``)."""
        if self._executor is None:
            progress = Progress(self.config.progress, self._log)
            self._executor = make_executor(
                self.config.executor,
                self.config.workers,
                progress,
                pool=self._pool,
                writer=writer,
                ray_address=self.config.ray_address,
                memory_limit=self.config.memory_limit,
            )
            self._pool = None  # the executor owns it now
        return self._executor

    def close(self) -> None:
        """Stop the executor's workers (and the local executor's writer process)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        if self._pool is not None:  # a pool handed in for a job that never started its executor
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def map(self, fn: Callable[..., Any], jobs: list[tuple], desc: str, unit: str) -> list[Any]:
        """Run ``fn(*job)`` for each job on the executor; results in job order."""
        return self.map_calls([(fn, job) for job in jobs], desc, unit)

    def map_calls(self, calls: list[tuple[Callable[..., Any], tuple]], desc: str, unit: str) -> list[Any]:
        """Run ``fn(*args)`` for each call on the executor (started in list order); results in order."""
        return self._run_calls(calls, desc, unit)

    def _run_calls(
        self, calls: list[tuple[Callable[..., Any], tuple]], desc: str, unit: str, write: bool = False
    ) -> list[Any]:
        """Run a step's calls on the executor (``write``: the write step's, ``Executor.write``); with an
        s3:// work directory each call syncs its files with the prefix (``workdir.RemoteStep``) and
        the driver then downloads the records the calls wrote, wherever they ran."""
        if self.remote_work is not None:
            calls = [(remote_step(self.remote_work, fn), args) for fn, args in calls]
        executor = self._start_executor(writer=False)
        results = executor.write(calls, desc) if write else executor.map(calls, desc, unit)
        if self.remote_work is not None:
            self.remote_work.pull_records()
        return results or []

    def _save_driver_records(self) -> None:
        """The driver's own records (partition count, k-core, plan) into the s3:// work directory."""
        if self.remote_work is not None:
            self.remote_work.push_records()
