"""Fixtures of the engines' unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def gloo_world_of_one() -> Iterator[dist.ProcessGroup]:
    """The default process group: gloo, this process rank 0 of 1 (an in-memory store, no port)."""
    assert not dist.is_initialized(), "a process group was left initialized by an earlier test"
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
