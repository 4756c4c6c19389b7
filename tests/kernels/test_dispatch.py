"""Dispatch/combine: naive, PyTorch and Triton (interpreted on CPU) agree exactly.

Triton runs on CPU through its interpreter: the module fixture sets ``TRITON_INTERPRET=1`` for these
tests only (kernels are jitted at first use, so the mode is picked up after import). Sizes stay small
because the interpreter executes every program instance in numpy.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freescale.kernels import (
    KERNELS,
    DispatchConfig,
    JaggedRows,
    combine,
    combine_jagged,
    default_kernel,
    dispatch,
    dispatch_jagged,
    plan_dispatch,
    resolve_kernel,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PLAN_FIELDS = ("counts", "offsets", "perm", "inverse", "value_counts", "value_offsets", "home_lengths",
               "home_value_offsets", "send_lengths", "send_value_offsets")  # fmt: skip
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.float64)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def _triton_interpreter():
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE.type == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        yield


def _payload(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    return torch.randint(-1000, 1000, shape, generator=gen).to(dtype).to(DEVICE)


def _dest(gen: torch.Generator, n: int, world: int, mode: str) -> torch.Tensor:
    if mode == "one":  # every row to one rank (the last one: empty destinations before it)
        return torch.full((n,), world - 1, dtype=torch.int64, device=DEVICE)
    if mode == "few":  # most destinations empty
        ranks = torch.randint(0, world, (3,), generator=gen)
        return ranks[torch.randint(0, 3, (n,), generator=gen)].to(DEVICE)
    return torch.randint(0, world, (n,), generator=gen).to(DEVICE)


def _assert_plans_equal(a, b) -> None:
    for f in PLAN_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert torch.equal(x, y), f


def _assert_layout(x: torch.Tensor, dest: torch.Tensor, world: int, res) -> None:
    """Invariants that define the layout, independent of any implementation."""
    plan = res.plan
    assert torch.equal(plan.counts, torch.bincount(dest, minlength=world))
    assert int(plan.offsets[0]) == 0 and int(plan.offsets[-1]) == dest.shape[0]
    assert torch.equal(plan.offsets[1:] - plan.offsets[:-1], plan.counts)
    sorted_dest = dest[plan.perm]
    assert bool((sorted_dest[1:] >= sorted_dest[:-1]).all())  # grouped by destination
    same = sorted_dest[1:] == sorted_dest[:-1]
    assert bool((plan.perm[1:][same] > plan.perm[:-1][same]).all())  # stable: home order kept
    assert torch.equal(plan.inverse[plan.perm], torch.arange(dest.shape[0], device=DEVICE))
    assert torch.equal(res.buffer, x[plan.perm])


@SETTINGS
@given(
    world=st.integers(1, 512),
    n=st.integers(0, 300),
    trailing=st.sampled_from([(), (1,), (3,), (2, 5), (16,)]),
    dtype=st.sampled_from(DTYPES),
    mode=st.sampled_from(["uniform", "one", "few"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_fixed_rows_agree(world, n, trailing, dtype, mode, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = _payload(gen, (n, *trailing), dtype)
    dest = _dest(gen, n, world, mode)
    results = {k: dispatch(x, dest, world, kernel=k) for k in KERNELS}
    ref = results["pytorch"]
    _assert_layout(x, dest, world, ref)
    for k, res in results.items():
        assert res.buffer.dtype == x.dtype and res.buffer.shape == x.shape
        assert torch.equal(res.buffer, ref.buffer), k
        _assert_plans_equal(res.plan, ref.plan)
        assert torch.equal(combine(res.buffer, res.plan, kernel=k), x), k


def _jagged(gen: torch.Generator, n: int, max_len: int, item: tuple[int, ...], dtype: torch.dtype) -> JaggedRows:
    lengths = torch.randint(0, max_len + 1, (n,), generator=gen)
    lengths[torch.rand(n, generator=gen) < 0.3] = 0  # plenty of empty samples
    values = _payload(gen, (int(lengths.sum()), *item), dtype)
    dense = _payload(gen, (n, 3), torch.float32)
    labels = _payload(gen, (n,), torch.int64)
    return JaggedRows(values, lengths.to(DEVICE), dense, labels)


@SETTINGS
@given(
    world=st.integers(1, 512),
    n=st.integers(0, 200),
    max_len=st.integers(0, 12),
    item=st.sampled_from([(), (4,), (2, 3)]),
    dtype=st.sampled_from(DTYPES),
    mode=st.sampled_from(["uniform", "one", "few"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_jagged_agree(world, n, max_len, item, dtype, mode, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = _jagged(gen, n, max_len, item, dtype)
    dest = _dest(gen, n, world, mode)
    results = {k: dispatch_jagged(batch, dest, world, kernel=k) for k in KERNELS}
    ref = results["pytorch"]
    value_counts = torch.zeros(world, dtype=torch.int64, device=DEVICE).index_add_(0, dest, batch.lengths)
    assert torch.equal(ref.plan.value_counts, value_counts)  # send-side lengths per destination
    assert torch.equal(ref.buffer.lengths, batch.lengths[ref.plan.perm])
    segments = torch.split(batch.values, batch.lengths.tolist())
    expect = torch.cat([segments[i] for i in ref.plan.perm.tolist()]) if n else batch.values
    assert torch.equal(ref.buffer.values, expect)
    for k, res in results.items():
        for f in ("values", "lengths", "dense", "labels"):
            assert torch.equal(getattr(res.buffer, f), getattr(ref.buffer, f)), (k, f)
        _assert_plans_equal(res.plan, ref.plan)
        back = combine_jagged(res.buffer, res.plan, kernel=k)
        for f in ("values", "lengths", "dense", "labels"):
            assert torch.equal(getattr(back, f), getattr(batch, f)), (k, f)


@pytest.mark.parametrize("kernel", KERNELS)
def test_edge_cases(kernel: str) -> None:
    empty = torch.empty(0, 4, device=DEVICE)
    res = dispatch(empty, torch.empty(0, dtype=torch.int64, device=DEVICE), 7, kernel=kernel)
    assert res.buffer.shape == (0, 4) and res.plan.counts.tolist() == [0] * 7
    assert res.plan.offsets.tolist() == [0] * 8
    x = torch.arange(10, device=DEVICE)
    res = dispatch(x, torch.zeros(10, dtype=torch.int64, device=DEVICE), 1, kernel=kernel)
    assert torch.equal(res.buffer, x) and res.plan.counts.tolist() == [10]
    dest = torch.full((260,), 511, dtype=torch.int32, device=DEVICE)  # int32 dest, 3 plan blocks
    y = torch.randn(260, 2, device=DEVICE).to(torch.bfloat16)
    res = dispatch((y, x.repeat(26)), dest, 512, kernel=kernel)
    assert torch.equal(res.buffer[0], y) and int(res.plan.counts[511]) == 260
    assert torch.equal(combine(res.buffer, res.plan, kernel=kernel)[1], x.repeat(26))
    batch = JaggedRows(torch.empty(0, 8, device=DEVICE), torch.zeros(5, dtype=torch.int64, device=DEVICE))
    out = dispatch_jagged(batch, torch.tensor([4, 0, 4, 2, 0], device=DEVICE), 5, kernel=kernel)
    assert out.buffer.values.shape == (0, 8) and out.plan.value_counts.tolist() == [0] * 5
    assert out.plan.counts.tolist() == [2, 0, 1, 0, 2] and out.plan.perm.tolist() == [1, 4, 3, 0, 2]


def test_jagged_heavy_tail_multiblock() -> None:
    """One long sample among short ones, several plan blocks: all implementations agree."""
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 4, (300,), generator=gen)
    lengths[17] = 700
    batch = JaggedRows(torch.randn(int(lengths.sum()), 8, generator=gen).to(DEVICE), lengths.to(DEVICE),
                       torch.randn(300, 2, generator=gen).to(DEVICE))  # fmt: skip
    dest = torch.randint(0, 9, (300,), generator=gen).to(DEVICE)
    results = {k: dispatch_jagged(batch, dest, 9, kernel=k) for k in KERNELS}
    for k in KERNELS:
        assert torch.equal(results[k].buffer.values, results["naive"].buffer.values), k
        assert torch.equal(combine_jagged(results[k].buffer, results[k].plan, kernel=k).values, batch.values)


@pytest.mark.parametrize("world", [500, 2048])
def test_many_plan_blocks(world: int) -> None:
    """Enough rows for several scan tiles of the Triton plan (tiles of 4096 // next_pow2(W) blocks)."""
    gen = torch.Generator().manual_seed(world)
    n = 1500
    lengths = torch.randint(0, 3, (n,), generator=gen).to(DEVICE)
    batch = JaggedRows(torch.randn(int(lengths.sum()), 2, generator=gen).to(DEVICE), lengths)
    dest = torch.randint(0, world, (n,), generator=gen).to(DEVICE)
    dest[:200] = 7  # a crowded destination spanning several blocks
    results = {k: dispatch_jagged(batch, dest, world, kernel=k) for k in ("pytorch", "triton")}
    _assert_plans_equal(results["triton"].plan, results["pytorch"].plan)
    assert torch.equal(results["triton"].buffer.values, results["pytorch"].buffer.values)


def test_validation_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"dest\[2\] = 9"):
        dispatch(x, torch.tensor([0, 1, 9, 0]), 4, kernel="pytorch")
    with pytest.raises(ValueError, match="outside"):
        dispatch(x, torch.tensor([0, -1, 1, 0]), 4)
    with pytest.raises(ValueError, match="integer"):
        dispatch(x, torch.zeros(4), 4)
    with pytest.raises(ValueError, match="3 entries"):
        dispatch(x, torch.zeros(3, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="world_size"):
        dispatch(x, torch.zeros(4, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match=r"DispatchConfig\.kernel"):
        DispatchConfig(kernel="cuda")
    with pytest.raises(ValueError, match="kernel must be one of"):
        dispatch(x, torch.zeros(4, dtype=torch.int64), 4, kernel="fast")
    with pytest.raises(ValueError, match="lengths"):
        dispatch_jagged(JaggedRows(torch.zeros(3, 2), torch.tensor([1, 1])), torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError, match=r"JaggedRows\.dense"):
        JaggedRows(torch.zeros(3, 2), torch.tensor([1, 2]), dense=torch.zeros(3, 1))
    plan = plan_dispatch(torch.tensor([1, 0]), 2)
    with pytest.raises(ValueError, match="dispatch_jagged"):
        combine_jagged(JaggedRows(torch.zeros(1), torch.tensor([1, 0])), plan)
    cfg = DispatchConfig(kernel="naive", validate=False)
    jag = dispatch_jagged(JaggedRows(torch.zeros(3, 2), torch.tensor([1, 2])), torch.tensor([1, 0]), 2)
    with pytest.raises(ValueError, match="sent 3 values, got 2"):
        combine_jagged(JaggedRows(torch.zeros(2, 2), jag.buffer.lengths), jag.plan)
    unchecked = dispatch(x, torch.tensor([0, 1, 3, 0]), 4, config=cfg)
    assert unchecked.plan.counts.tolist() == [2, 1, 0, 1]


def test_kernel_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_kernel(torch.device("cpu")) == "pytorch"
    assert resolve_kernel(None, torch.device("cpu"), DispatchConfig(kernel="naive")) == "naive"
    assert resolve_kernel("pytorch", torch.device("cpu"), DispatchConfig(kernel="naive")) == "pytorch"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        dispatch(torch.zeros(2, 1), torch.tensor([0, 1]), 2, kernel="triton")


def test_tensors_on_another_device_than_the_plan_are_refused() -> None:
    """Combine's rows must sit with the plan, and the Triton launchers refuse mixed devices: on a GPU a
    kernel given a host index reads host addresses (the interpreter, all numpy, would not notice)."""
    from freescale.kernels import dispatch_triton as tri

    x = torch.arange(8.0, device=DEVICE).view(4, 2)
    res = dispatch(x, torch.tensor([1, 0, 1, 0], device=DEVICE), 2, kernel="pytorch")
    with pytest.raises(ValueError, match=f"rows are on meta but the plan is on {DEVICE.type}"):
        combine(x.to("meta"), res.plan)
    batch = JaggedRows(torch.zeros(3, 2, device=DEVICE), torch.tensor([1, 2], device=DEVICE))
    jag = dispatch_jagged(batch, torch.tensor([1, 0], device=DEVICE), 2)
    with pytest.raises(ValueError, match="plan is on"):
        combine_jagged(JaggedRows(torch.zeros(3, 2, device="meta"), jag.buffer.lengths), jag.plan)
    meta = "got one on meta"
    with pytest.raises(ValueError, match=meta):
        tri.triton_gather_rows(x, torch.arange(4, device="meta"))
    offsets = torch.tensor([0, 1, 3], device=DEVICE)
    with pytest.raises(ValueError, match=meta):
        tri.triton_jagged_gather(batch.values, offsets, offsets, torch.arange(2, device="meta"))
    with pytest.raises(ValueError, match=meta):
        tri.triton_plan(torch.tensor([0, 1], device=DEVICE), 2, torch.tensor([1, 2], device="meta"))


def test_plan_scratch_offsets_are_host_ints() -> None:
    """The plan kernels take the scratch's half offsets from the host: an in-kernel ``n_blocks * W_POW2``
    is an int32 product that wraps past 2**31 (a 2**25-block batch at W = 64, far beyond a CPU test)."""
    from freescale.kernels.dispatch_triton import _scratch_bases

    vbase, hbase = _scratch_bases(1 << 25, 64)
    assert vbase == 1 << 31 and hbase == 1 << 32  # Python ints: Triton passes them as int64
