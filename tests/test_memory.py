"""memory.py's sizing of a Ray runtime started for a job: workers, object store and the tasks' data
within ``--memory-limit``, or one line that says why the limit cannot be kept."""

from __future__ import annotations

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
    """Ray's concurrent writers share the task budget; the local engine has one writer."""
    limit = 2 * 2**30
    ray = job_budget("ray", limit, 2, joined_cluster=False, writer_reserved=False)
    sizing = ray_sizing(limit, 2)
    assert (ray.tasks, ray.concurrent, ray.writer) == (sizing.task_budget, 2, sizing.task_budget // 2)
    local = job_budget("local", limit, 2, joined_cluster=False, writer_reserved=True)
    assert local.tasks == limit - memory.WRITER_PROCESS_BYTES and local.writer == memory.local_writer_budget(limit)
    joined = job_budget("ray", limit, 4, joined_cluster=True, writer_reserved=False)
    assert joined.tasks == limit and joined.writer == limit // 8
