"""Fixtures shared by the trainer's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A gloo process group of this process alone (evaluation and the skip vote are collectives);
    one already initialized is used as it is and left to its owner."""
    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> str:
    """The ``tiny`` preset prepared for 2-rank runs through ``freescale train`` (the fault tests')."""
    from train_cli import prepare_tiny

    return prepare_tiny(tmp_path_factory.mktemp("faults-data"))
