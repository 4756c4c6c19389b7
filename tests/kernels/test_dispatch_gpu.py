"""Compiled Triton dispatch/combine on a GPU against the PyTorch reference, at real sizes.

The CPU suite runs the kernels in Triton's interpreter, which executes every program in numpy: no
int32 address arithmetic, no real masks or vector widths, no launch on a device. Here the compiled
kernels meet the paper's shapes (W up to 512, d = 256 bf16 item embeddings, heavy-tailed lognormal
lengths, dense features and labels) and byte offsets past 2**31; a dispatch is a permutation, so every
output must be byte-identical to the reference's. Shapes repeat the benchmark's (bench_dispatch) so the
two share Triton's compiled-kernel cache. Skipped without a CUDA device.
"""

from __future__ import annotations

import math

import pytest
import torch

from freescale.kernels import (
    JaggedRows,
    combine,
    combine_jagged,
    default_kernel,
    dispatch,
    dispatch_jagged,
)
from freescale.kernels import dispatch_triton as tri

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False (compiled Triton kernels run on a GPU only)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
DEV = torch.device("cuda")
PLAN_FIELDS = ("counts", "offsets", "perm", "inverse", "value_counts", "value_offsets", "home_lengths",
               "home_value_offsets", "send_lengths", "send_value_offsets")  # fmt: skip


def assert_bytes_equal(a: torch.Tensor | None, b: torch.Tensor | None, what: str) -> None:
    """Bitwise equality: same dtype, shape and bytes (``torch.equal`` would call NaN != NaN)."""
    assert (a is None) == (b is None), what
    if a is None or b is None:
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    if a.numel():
        assert torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)), what


def assert_rows_equal(a: JaggedRows, b: JaggedRows, what: str) -> None:
    for f in ("values", "lengths", "dense", "labels"):
        assert_bytes_equal(getattr(a, f), getattr(b, f), f"{what}.{f}")


def lognormal_batch(n: int, world: int, seed: int, dim: int = 256) -> tuple[JaggedRows, torch.Tensor]:
    """The design brief's lengths (median 300, sigma 1.2, capped at 21,000), bf16 embeddings."""
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=gen, dtype=torch.float64)
    lengths = torch.exp(math.log(300.0) + 1.2 * normal).round().clamp(1, 21_000).long()
    lengths[torch.rand(n, generator=gen) < 0.05] = 0  # a few empty samples
    values = torch.randn(int(lengths.sum()), dim, generator=gen).to(torch.bfloat16)
    dense = torch.randn(n, 128, generator=gen).to(torch.bfloat16)
    labels = torch.rand(n, generator=gen)
    dest = torch.randint(0, world, (n,), generator=gen)
    return JaggedRows(values.to(DEV), lengths.to(DEV), dense.to(DEV), labels.to(DEV)), dest.to(DEV)


def test_triton_is_the_cuda_default() -> None:
    assert default_kernel(DEV) == "triton"


@pytest.mark.parametrize("world", [8, 64, 512])
def test_jagged_dispatch_and_combine_match_the_reference(world: int) -> None:
    """256 samples (4 plan blocks) to W ranks: plan, send buffer and round trip byte-identical."""
    batch, dest = lognormal_batch(256, world, seed=world)
    ref = dispatch_jagged(batch, dest, world, kernel="pytorch")
    got = dispatch_jagged(batch, dest, world, kernel="triton")
    for f in PLAN_FIELDS:
        assert_bytes_equal(getattr(got.plan, f), getattr(ref.plan, f), f"plan.{f}")
    assert_rows_equal(got.buffer, ref.buffer, "dispatch")
    back = combine_jagged(got.buffer, got.plan, kernel="triton")
    assert_rows_equal(back, batch, "combine(dispatch(x))")
    assert_rows_equal(back, combine_jagged(ref.buffer, ref.plan, kernel="pytorch"), "combine vs reference")
    if world <= 64:  # the naive loop agrees too (at 512 it only costs time)
        assert_rows_equal(dispatch_jagged(batch, dest, world, kernel="naive").buffer, ref.buffer, "naive")


@pytest.mark.parametrize("world", [64, 512])
def test_fixed_rows_match_the_reference(world: int) -> None:
    """4,096 rows of d = 256 bf16 with int64 ids and int32 destinations (several dtypes, one plan)."""
    gen = torch.Generator().manual_seed(world)
    x = torch.randn(4096, 256, generator=gen).to(torch.bfloat16).to(DEV)
    ids = torch.randint(-(2**62), 2**62, (4096,), generator=gen).to(DEV)
    dest = torch.randint(0, world, (4096,), generator=gen, dtype=torch.int32).to(DEV)
    dest[:700] = world - 1  # a crowded destination spanning many plan blocks
    ref = dispatch((x, ids), dest, world, kernel="pytorch")
    got = dispatch((x, ids), dest, world, kernel="triton")
    for f in ("counts", "offsets", "perm", "inverse"):
        assert_bytes_equal(getattr(got.plan, f), getattr(ref.plan, f), f"plan.{f}")
    for a, b, what in zip(got.buffer, ref.buffer, ("x", "ids")):
        assert_bytes_equal(a, b, what)
    back = combine(got.buffer, got.plan, kernel="triton")
    assert_bytes_equal(back[0], x, "combine x")
    assert_bytes_equal(back[1], ids, "combine ids")


def test_plan_of_a_million_samples() -> None:
    """15,625 plan blocks at W = 512: ~2,000 dependent tiles in the one-program scan."""
    gen = torch.Generator().manual_seed(7)
    n, world = 1_000_000, 512
    lengths = torch.randint(0, 4, (n,), generator=gen).to(DEV)
    dest = torch.randint(0, world, (n,), generator=gen).to(DEV)
    dest[: n // 4] = 3  # one destination over a quarter of the blocks
    batch = JaggedRows(torch.randn(int(lengths.sum()), 256, device=DEV).to(torch.bfloat16), lengths)
    ref = dispatch_jagged(batch, dest, world, kernel="pytorch")
    got = dispatch_jagged(batch, dest, world, kernel="triton")
    for f in PLAN_FIELDS:
        assert_bytes_equal(getattr(got.plan, f), getattr(ref.plan, f), f"plan.{f}")
    assert_bytes_equal(got.buffer.values, ref.buffer.values, "values")


def test_byte_offsets_past_int32() -> None:
    """Rows of 1,001 bytes (odd: copied as bytes, one word per byte) over 2.2 GB: element offsets pass
    2**31, where int32 address arithmetic would wrap. Row gather and jagged gather against PyTorch."""
    free, _ = torch.cuda.mem_get_info()
    rows, width = 2_200_000, 1001
    if free < 4 * rows * width:
        pytest.skip(f"needs ~{4 * rows * width / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    src = torch.randint(0, 256, (rows, width), dtype=torch.uint8, device=DEV)
    assert src.numel() > 2**31
    gen = torch.Generator(device=DEV).manual_seed(0)
    perm = torch.randperm(rows, device=DEV, generator=gen)
    out = tri.triton_gather_rows(src, perm)
    assert_bytes_equal(out, src.index_select(0, perm), "gather rows")
    del out
    lengths = torch.full((64,), rows // 64, dtype=torch.int64, device=DEV)
    lengths[-1] += rows - int(lengths.sum())
    dest = 7 - torch.arange(64, device=DEV) // 8  # the last samples (offsets past 2**31) are sent first
    got = dispatch_jagged(JaggedRows(src, lengths), dest, 8, kernel="triton")
    sent = got.plan.perm.tolist()
    starts = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).tolist()
    at = 0
    for i in sent:  # segment by segment, no second 2.2 GB buffer for a reference
        n = int(lengths[i])
        assert_bytes_equal(got.buffer.values[at : at + n], src[starts[i] : starts[i] + n], f"segment {i}")
        at += n


def test_gradients_flow_through_the_triton_kernels() -> None:
    """Dispatch's gradient is combine: bit-identical to the reference's gradient."""
    batch, dest = lognormal_batch(256, 64, seed=1)
    weight = torch.randn(256, device=DEV).to(torch.bfloat16)
    grads = {}
    for kernel in ("pytorch", "triton"):
        values = batch.values.clone().requires_grad_(True)
        out = dispatch_jagged(JaggedRows(values, batch.lengths, batch.dense, batch.labels), dest, 64, kernel=kernel)
        (out.buffer.values.float() @ weight.float()).square().sum().backward()
        grads[kernel] = values.grad
    assert_bytes_equal(grads["triton"], grads["pytorch"], "values.grad")


@pytest.mark.multi_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (the launch-device check)")
def test_kernels_launch_on_the_tensors_device() -> None:
    """Tensors on cuda:1 while cuda:0 is current: the launchers make cuda:1 current for the launch."""
    dev1 = torch.device("cuda", 1)
    x = torch.randn(1000, 256, device=dev1).to(torch.bfloat16)
    dest = torch.randint(0, 64, (1000,), device=dev1)
    with torch.cuda.device(0):
        got = dispatch(x, dest, 64, kernel="triton")
    assert_bytes_equal(got.buffer, dispatch(x, dest, 64, kernel="pytorch").buffer, "cuda:1 dispatch")
