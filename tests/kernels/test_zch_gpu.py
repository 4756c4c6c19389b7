"""Zero-collision tables on a GPU: the same hash bits, and the rows and state of the per-id reference,
with the proposal rounds in the Triton kernel a CUDA table picks (and equal to the masked torch rounds
at a training step's size)."""

from __future__ import annotations

import pytest
import torch
from cuda_syncs import cuda_syncs
from zch_streams import kernel_equals_masked_rounds, run_both, steady_calls, step_size_config

from freescale.kernels.zch import ZchTable
from freescale.kernels.zch_hash import mix64
from freescale.kernels.zch_rows import hashed_uniform, reset_rows
from freescale.kernels.zch_types import ZchConfig

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False (the zch rounds kernel runs on GPUs)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]


@pytest.mark.parametrize("policy", ["ttl", "lru", "lfu"])
def test_cuda_table_equals_reference(policy: str) -> None:
    """Same hash bits, same rows and state as the CPU reference, the rounds in the kernel."""
    generator = torch.Generator().manual_seed(11)
    config = ZchConfig(
        zch_size=64,
        bucket_size=8,
        max_probe=4,
        policy=policy,
        ttl=5 if policy == "ttl" else None,
        admission_threshold=2 if policy == "lfu" else 1,
        lfu_halflife=2 if policy == "lfu" else 0,
    )
    assert ZchTable(config, "cuda").triton_kernel
    pool = torch.randint(0, 2**62, (200,), generator=generator)
    calls = []
    for step in range(20):
        picks = (torch.rand(40, generator=generator) ** 2 * pool.numel()).long()
        calls.append((pool[picks].tolist(), [step * 2] * 40, step % 5 != 4))
    run_both(config, calls, device="cuda", shortcuts=False)
    ids = torch.tensor([0, 1, 2**63 - 1], dtype=torch.int64)
    assert mix64(ids.cuda()).tolist() == mix64(ids).tolist()


@pytest.mark.parametrize(
    ("policy", "halflife", "world_size", "admission", "rows"),
    [
        ("ttl", 0, 1, False, 12_288),
        ("lru", 0, 2, False, 12_288),
        ("lfu", 3, 1, False, 12_288),
        ("lfu", 0, 2, True, 4_096),
    ],
)
def test_kernel_rounds_equal_the_masked_rounds_on_cuda(
    policy: str, halflife: int, world_size: int, admission: bool, rows: int
) -> None:
    """12,288 rows in buckets of 64 (the benchmark's steady step), 4,000 ids a call: tiles of about 32 ids;
    the whole call in the kernel, and (admission, fewer rows so that ids seen twice fill them) only the
    rounds."""
    config = step_size_config(policy, halflife, world_size, zch_size=rows, admission=admission)
    kernel_equals_masked_rounds(config, device="cuda", calls=12, size=4_000)


def test_a_steady_kernel_lookup_syncs_twice_and_a_row_reset_never() -> None:
    """The kernel path's two host reads (the id checks with the tile size, the slots taken) and nothing
    else; fresh rows for reset rows (one step or a step per row) and the reset itself: none."""
    config = step_size_config("lru", zch_size=12_288, admission=False)
    table = ZchTable(config, "cuda")
    calls = [ids.cuda() for ids in steady_calls(config, 8, 1_500, seed=5)]
    for ids in calls[:3]:  # compiles the kernel's tile sizes
        table.lookup(ids)
    assert [cuda_syncs(lambda ids=ids: table.lookup(ids)) for ids in calls[3:]] == [2] * 5
    rows = torch.arange(0, 4_000, 7, device="cuda")
    weight, state = torch.zeros(12_289, 64, device="cuda"), {"momentum": torch.ones(12_289, device="cuda")}
    steps = torch.arange(rows.numel(), device="cuda")
    assert cuda_syncs(lambda: hashed_uniform(rows, 64, bound=0.1, seed=3, table=1, step=9)) == 0
    assert cuda_syncs(lambda: hashed_uniform(rows, 64, bound=0.1, seed=3, table=1, step=steps)) == 0
    assert cuda_syncs(lambda: reset_rows(weight, rows, state, seed=3, table=1, step=9)) == 0
