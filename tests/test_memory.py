"""memory.py's sizing of a Ray runtime started for a job: workers and object store within
``--memory-limit``, or one line that says why the limit cannot be kept."""

from __future__ import annotations

from freescale.pipeline import memory
from freescale.pipeline.memory import MIB, ray_sizing


def fixed_bytes(limit: int) -> int:
    return memory.RAY_SYSTEM_BYTES + memory.RAY_DRIVER_BYTES + memory.ray_object_store_bytes(limit)


def test_a_roomy_limit_keeps_every_worker() -> None:
    limit = 16 * 2**30
    sizing = ray_sizing(limit, 2)
    assert sizing.cpus == 2 and sizing.warning is None
    assert fixed_bytes(limit) + sizing.cpus * memory.RAY_WORKER_BYTES <= limit


def test_a_tighter_limit_runs_fewer_workers_within_it() -> None:
    limit = 4 * 2**30
    sizing = ray_sizing(limit, 4)
    assert 1 <= sizing.cpus < 4 and sizing.warning is None
    assert fixed_bytes(limit) + sizing.cpus * memory.RAY_WORKER_BYTES <= limit
    assert fixed_bytes(limit) + (sizing.cpus + 1) * memory.RAY_WORKER_BYTES > limit


def test_a_limit_below_one_worker_says_so_in_one_line() -> None:
    sizing = ray_sizing(2 * 2**30, 2)
    assert sizing.cpus == 2  # fewer would not keep the limit either
    assert sizing.warning is not None and "\n" not in sizing.warning
    assert "2,048 MB cannot hold" in sizing.warning
    peak = fixed_bytes(2 * 2**30) + 2 * memory.RAY_WORKER_BYTES
    assert f"{peak / MIB:,.0f} MB" in sizing.warning
