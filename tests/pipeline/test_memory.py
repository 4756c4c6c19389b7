"""memory.py's sizing of a Ray runtime started for a job: workers, object store and the tasks' data
within ``--memory-limit``, or one line that says why the limit cannot be kept."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import psutil

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline import memory
from freescale.pipeline.memory import MIB, job_budget, ray_sizing

PER_WORKER = memory.RAY_WORKER_BYTES + memory.RAY_MIN_TASK_BYTES


def fixed_bytes(limit: int) -> int:
    return memory.RAY_SYSTEM_BYTES + memory.RAY_DRIVER_BYTES + memory.ray_object_store_bytes(limit)


def test_a_roomy_limit_keeps_every_worker_and_gives_the_rest_to_tasks() -> None:
    limit = 16 * 2**30
    sizing = ray_sizing(limit, 2)
    assert sizing.cpus == 2 and sizing.warning is None
    assert fixed_bytes(limit) + sizing.cpus * memory.RAY_WORKER_BYTES + sizing.task_budget == limit
    assert sizing.task_budget >= sizing.cpus * memory.RAY_MIN_TASK_BYTES


def test_two_workers_fit_the_default_2gb_limit() -> None:
    """Without torch in the write tasks a worker is ~100 MB before its data: 2 GB holds two."""
    sizing = ray_sizing(2 * 2**30, 2)
    assert sizing.cpus == 2 and sizing.warning is None


def test_a_tighter_limit_runs_fewer_workers_within_it() -> None:
    limit = 1536 * MIB
    sizing = ray_sizing(limit, 4)
    assert 1 <= sizing.cpus < 4 and sizing.warning is None
    assert fixed_bytes(limit) + sizing.cpus * PER_WORKER <= limit
    assert fixed_bytes(limit) + (sizing.cpus + 1) * PER_WORKER > limit


def test_a_limit_below_one_worker_says_so_in_one_line() -> None:
    limit = 1024 * MIB
    sizing = ray_sizing(limit, 2)
    assert sizing.cpus == 2  # fewer would not keep the limit either
    assert sizing.warning is not None and "\n" not in sizing.warning
    assert "1,024 MB cannot hold" in sizing.warning
    assert f"{(fixed_bytes(limit) + 2 * PER_WORKER) / MIB:,.0f} MB" in sizing.warning


def test_job_budgets_follow_the_engine() -> None:
    """Ray's concurrent writers share the task budget; the local executor has one writer, and its task
    processes' interpreters come out of its task budget as Ray's workers do."""
    limit = 2 * 2**30
    ray = job_budget("ray", limit, 2, joined_cluster=False, writer_reserved=False)
    sizing = ray_sizing(limit, 2)
    assert (ray.tasks, ray.concurrent, ray.writer) == (sizing.task_budget, 2, sizing.task_budget // 2)
    local = job_budget("local", limit, 2, joined_cluster=False, writer_reserved=True)
    processes = 2 * memory.LOCAL_PROCESS_BYTES + memory.LOCAL_TRACKER_BYTES
    assert local.tasks == limit - memory.WRITER_PROCESS_BYTES - processes
    assert local.concurrent == 2 and local.writer == memory.local_writer_budget(limit)
    joined = job_budget("ray", limit, 4, joined_cluster=True, writer_reserved=False)
    assert joined.tasks == limit and joined.writer == limit // 8


# --------------------------------------------------------------------------- local executor
def test_local_task_processes_count_against_the_limit() -> None:
    """Each task process is an interpreter with polars and pyarrow before any data: at 256 MB, eight
    of them cannot fit, so fewer run (one line says how many) and their data gets what is left."""
    limit = 256 * MIB
    sizing = memory.local_sizing(limit, 8, writer_reserved=False)
    assert 1 <= sizing.processes < 8
    fixed = sizing.processes * memory.LOCAL_PROCESS_BYTES + (memory.LOCAL_TRACKER_BYTES if sizing.processes > 1 else 0)
    assert fixed + sizing.processes * 2 * memory.MIN_TASK_BUDGET <= limit
    assert fixed + sizing.task_budget <= limit
    assert sizing.note is not None and "\n" not in sizing.note
    assert f"holds {sizing.processes} of the 8 --workers" in sizing.note
    budget = job_budget("local", limit, 8, joined_cluster=False, writer_reserved=False)
    assert (budget.tasks, budget.concurrent) == (sizing.task_budget, sizing.processes)


def test_the_default_limit_holds_two_local_processes_beside_the_writer() -> None:
    limit = 2 * 2**30
    sizing = memory.local_sizing(limit, 2, writer_reserved=memory.preload_writer(limit))
    assert sizing.processes == 2 and sizing.note is None
    fixed = 2 * memory.LOCAL_PROCESS_BYTES + memory.LOCAL_TRACKER_BYTES
    assert memory.WRITER_PROCESS_BYTES + fixed + sizing.task_budget == limit


def test_the_smallest_limit_holds_one_local_process() -> None:
    """``--memory-limit`` is at least 256 MB (the configs refuse less), which holds one process and its
    least task data: a job never has to be refused for its processes alone."""
    sizing = memory.local_sizing(256 * MIB, 1, writer_reserved=False)
    assert sizing.processes == 1 and sizing.note is None
    assert memory.LOCAL_PROCESS_BYTES + 2 * memory.MIN_TASK_BUDGET <= 256 * MIB


def prepare_peak(tmp_path: Path, memory_limit: str) -> tuple[int, str]:
    """Process-tree RSS peak (psutil, every 20 ms, as the limit's users measure it) of ``prepare`` on
    ``tmp_path/src`` with ``--workers 8``, and its stderr."""
    command = [str(Path(sys.executable).parent / "freescale"), "prepare"]
    command += [
        "--sources",
        str(tmp_path / "src" / "sources.toml"),
        "--output",
        str(tmp_path / "ds"),
        "--memory-limit",
        memory_limit,
        "--workers",
        "8",
        "--quiet",
        "--overwrite",
    ]
    command += ["--group-size", "4", "--micro-batch-size", "4", "--max-uih-len", "2048"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        total = 0
        with contextlib.suppress(psutil.Error):
            for process in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += process.memory_info().rss
        peak = max(peak, total)
        time.sleep(0.02)
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    return peak, err


def test_prepare_with_more_workers_than_the_limit_holds_stays_under_it(tmp_path) -> None:
    """The reported command: ``--memory-limit 256MB --workers 8`` peaked at 1,187 MB of process-tree RSS
    (eight interpreters). On small sources the tree now stays under the limit, and says why it runs
    fewer workers than asked."""
    generate(preset("tiny", seed=3), str(tmp_path / "src"))
    peak, err = prepare_peak(tmp_path, "256MB")
    assert peak <= 256 * MIB, f"process tree peaked at {peak / MIB:,.0f} MB"
    notes = [line for line in err.splitlines() if "--workers" in line]
    assert len(notes) == 1 and "of the 8 --workers" in notes[0], err


def test_prepare_of_millions_of_events_stays_under_a_small_limit(tmp_path) -> None:
    """Realistic sizes (the demo preset's Parquet, JSON Lines and CSV sources, ~2.5M events): the scan's
    chunks, the allocators' retention across tasks and the writer's mapped bucket pages made a 256 MB
    job peak at 300+ MB (12M events: 370-444 MB); a 512 MB one ran two processes and must hold too."""
    generate(preset("demo", seed=5, n_users=10_000), str(tmp_path / "src"))
    for limit in ("256MB", "512MB"):
        peak, _ = prepare_peak(tmp_path, limit)
        assert peak <= memory.parse_size(limit, "limit"), f"{limit}: process tree peaked at {peak / MIB:,.0f} MB"
