"""A steady engine step on CUDA synchronizes no more often than it reads the host.

test_host_reads.py bounds a steady step's host reads on CPU (``STEP_SYNCS``), counted at the aten
seam. On CUDA a step can also synchronize where the CPU counter sees nothing: ``torch.tensor(values,
device="cuda")`` is a blocking copy (the stream drains first). CUDA's sync debug mode sees both, so
the same case trained on CUDA must stay within the CPU's bound; the failure names where each sync
came from. The first two steps are left out (kernels compile, buffers grow).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist
from pec_check import OverlapCase
from step_syncs import CASES, STEP_SYNCS, cuda_step_sync_sites

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]


@pytest.fixture
def nccl_world_of_one():
    """The default process group: NCCL on this process's GPU, rank 0 of 1 (an in-memory store)."""
    assert not dist.is_initialized(), "a process group was left initialized by an earlier test"
    dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=torch.device("cuda", 0))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_steady_cuda_step_syncs_no_more_than_its_host_reads(nccl_world_of_one, case: str) -> None:
    sites = cuda_step_sync_sites(OverlapCase(world_size=1, steps=6, **CASES[case]))
    steady = sites[2:-1]  # the last step prefetches nothing
    worst = max(steady, key=len)
    where = Counter(worst).most_common()
    assert len(worst) <= STEP_SYNCS[case, "none"], f"{[len(s) for s in steady]} syncs a step; the worst: {where}"
