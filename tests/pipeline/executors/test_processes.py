"""``processes.run_calls``: the driver runs ``prepare``'s tasks beside its worker pool."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from freescale.pipeline.executors.processes import run_calls, start_pool
from freescale.pipeline.executors.writer_process import WriterProcess


def record_call(index: int, folder: str, seconds: float) -> tuple[int, int]:
    """A task: leaves a file named after its index, takes ``seconds``, returns (index, process id)."""
    Path(folder, f"{index:03d}").touch()
    time.sleep(seconds)
    return index, os.getpid()


def fail_on(index: int, folder: str, failing: tuple[int, ...]) -> int:
    Path(folder, f"{index:03d}").touch()
    if index in failing:
        raise ValueError(f"call {index} failed")
    return index


@pytest.fixture(scope="module")
def pool():
    workers = start_pool(1)
    workers.submit(int).result()  # started: the timings below do not include a spawn
    yield workers
    workers.shutdown()


def test_driver_and_pool_share_the_calls_and_results_keep_call_order(pool, tmp_path) -> None:
    done = []
    calls = [(record_call, (i, str(tmp_path), 0.05)) for i in range(12)]
    results = run_calls(pool, 1, calls, lambda: done.append(1))
    assert [index for index, _ in results] == list(range(12))
    runners = {pid for _, pid in results}
    assert os.getpid() in runners and len(runners) == 2  # this process took calls, and so did the worker
    assert len(done) == 12


def test_calls_start_in_list_order(pool, tmp_path) -> None:
    """Longest-first lists stay longest first: a runner takes the next call only when it is free."""
    calls = [(record_call, (i, str(tmp_path), 1.0 if i < 2 else 0.01)) for i in range(6)]
    started = []
    watcher = threading.Thread(target=lambda: started.extend(sorted(p.name for p in tmp_path.iterdir())))
    timer = threading.Timer(0.5, watcher.start)
    timer.start()
    run_calls(pool, 1, calls, lambda: None)
    timer.join()
    watcher.join()
    assert started == ["000", "001"]  # both long calls running, nothing after them started yet


def test_every_call_runs_and_the_first_failure_in_list_order_is_raised(pool, tmp_path) -> None:
    calls = [(fail_on, (i, str(tmp_path), (5, 2))) for i in range(8)]
    with pytest.raises(ValueError, match="call 2 failed"):
        run_calls(pool, 1, calls, lambda: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{i:03d}" for i in range(8)]


def test_without_a_pool_every_call_runs_here(tmp_path) -> None:
    results = run_calls(None, 3, [(record_call, (i, str(tmp_path), 0.0)) for i in range(4)], lambda: None)
    assert results == [(i, os.getpid()) for i in range(4)]


def huge_pages_allowed() -> str:
    """This process's ``THP_enabled`` (1: the kernel may back its memory with 2 MB pages)."""
    lines = [line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("THP_enabled")]
    return lines[0].split()[1] if lines else "unknown"


@pytest.mark.skipif(huge_pages_allowed() == "unknown", reason="the kernel does not report THP_enabled")
def test_task_and_writer_processes_run_without_transparent_huge_pages(pool) -> None:
    """With huge pages a task touching a few KB of a region counted 2 MB resident: the demo preset at
    --memory-limit 256MB peaked 40-85 MB higher (262-272 MB on CI) than with 4 KB pages."""
    assert pool.submit(huge_pages_allowed).result() == "0"
    writer = WriterProcess()
    try:
        assert writer.submit(huge_pages_allowed).result() == "0"
    finally:
        writer.close()
