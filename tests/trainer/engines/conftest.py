"""Fixtures of the engines' unit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from pec_check import RankPool


@pytest.fixture(scope="module")
def gloo_world_of_one() -> Iterator[dist.ProcessGroup]:
    """The default process group: gloo, this process rank 0 of 1 (an in-memory store, no port)."""
    assert not dist.is_initialized(), "a process group was left initialized by an earlier test"
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


# One RankPool per world size for every module here (test_pec, test_online, test_zch_shard,
# test_collective_counts): a pool's start-up is 2 or 4 interpreters importing torch and joining a gloo
# group (15 s for 2 ranks on a loaded 2-core host) and each module used to start its own. Each task
# names its train function, so modules that train differently share the processes; a pool whose
# process has exited (a failed task) is replaced by a fresh one on the next run. They are closed once
# the last test of this folder has run.
_POOLS: dict[int, RankPool] = {}


def _pool(world_size: int) -> RankPool:
    pool = _POOLS.get(world_size)
    if pool is None or not pool.alive():
        if pool is not None:
            pool.close()
        pool = _POOLS[world_size] = RankPool(world_size)
    return pool


@dataclass(frozen=True)
class SharedPool:
    """A module's view of the shared ``world_size`` pool: ``run`` trains with the module's ``train``."""

    world_size: int
    train: Callable[..., dict]

    def run(self, case: Any, overlaps: tuple[str, ...] = ("none", "pec"), timeout: float = 300) -> list[dict]:
        return _pool(self.world_size).run(case, overlaps, timeout, train=self.train)


@pytest.fixture(scope="session")
def rank_pool() -> Callable[..., SharedPool]:
    """``rank_pool(world_size, train)``: the shared pool of that size, training with ``train``."""
    return SharedPool


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    here = Path(__file__).parent
    if _POOLS and (nextitem is None or here not in nextitem.path.parents):
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()
