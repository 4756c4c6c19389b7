"""Transport interface on CPU: TorchDistTransport over gloo with 3 processes.

The processes are this file run as a script (``python test_transport.py RANK WORLD INIT_FILE``), which
works with pytest's importlib import mode (a spawned function would need an importable module).
Covers uneven splits including zero rows, ranks that send or receive nothing, bf16/int/float payloads
with several trailing dims, known and unknown receive counts, the isend/irecv fallback, transport
selection, and the balancer's full round trip: dispatch -> all-to-all -> all-to-all back -> combine.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.kernels import JaggedRows, combine_jagged, dispatch_jagged
from freescale.kernels.transport import (
    TorchDistTransport,
    TransportConfig,
    TransportUnavailableError,
    as_bytes,
    make_transport,
    row_bytes,
)
from freescale.kernels.transport_copy_engine import plan_round

WORLD = 3
SHAPES = ((), (4,), (2, 3))
DTYPES = (torch.float32, torch.bfloat16, torch.int64)


def _counts(sender: int, world: int, case: int) -> list[int]:
    """Deterministic uneven split sizes: zeros, a rank that sends nothing, a rank that gets nothing."""
    if case == 0:
        return [(sender * 2 + r + 1) % 4 for r in range(world)]
    if case == 1:  # rank 1 sends nothing; nobody sends to rank 2
        return [0] * world if sender == 1 else [3 + sender, 1, 0][:world]
    if case == 2:  # rank 2 neither sends nor receives while the others exchange: it must still take part
        return [0] * world if sender == 2 else [2 + sender, 1, 0][:world]
    return [0] * world  # nothing moves at all


def _rows(sender: int, dest: int, n: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Rows whose values encode (sender, dest, index) so a receiver can check exactly what arrived."""
    base = torch.arange(n, dtype=torch.float64) + 100 * sender + 10 * dest
    out = base.reshape(n, *([1] * len(shape))).expand(n, *shape).to(dtype)
    return out.contiguous()


def _check_exchange(transport: TorchDistTransport, rank: int, world: int) -> None:
    for case in range(4):
        for shape in SHAPES:
            for dtype in DTYPES:
                sc = _counts(rank, world, case)
                send = torch.cat([_rows(rank, d, sc[d], shape, dtype) for d in range(world)])
                expect_counts = [_counts(s, world, case)[rank] for s in range(world)]
                expect = torch.cat([_rows(s, rank, expect_counts[s], shape, dtype) for s in range(world)])
                for known in (None, expect_counts):
                    handle = transport.start(send, sc, known)
                    out = handle.wait()
                    assert handle.recv_counts == expect_counts
                    assert out.dtype == dtype and out.shape == expect.shape, (out.shape, expect.shape)
                    assert torch.equal(out, expect), (case, shape, dtype)


def _check_overlapped(transport: TorchDistTransport, rank: int, world: int) -> None:
    """Two exchanges in flight at once (async start, later wait)."""
    sc = _counts(rank, world, 0)
    a = torch.cat([_rows(rank, d, sc[d], (4,), torch.float32) for d in range(world)])
    h1 = transport.start(a, sc)
    h2 = transport.start(a.to(torch.bfloat16), torch.tensor(sc))
    assert torch.equal(h2.wait(), h1.wait().to(torch.bfloat16))


def _check_round_trip(transport: TorchDistTransport, rank: int, world: int) -> None:
    """The balancer's protocol: samples go to their balanced rank and their gradients come home."""
    gen = torch.Generator().manual_seed(rank)
    n = 9 + rank
    lengths = torch.randint(0, 6, (n,), generator=gen)
    lengths[0] = 0
    batch = JaggedRows(torch.randn(int(lengths.sum()), 5, generator=gen).to(torch.bfloat16), lengths,
                       torch.randn(n, 3, generator=gen), torch.arange(n) + 1000 * rank)  # fmt: skip
    dest = torch.randint(0, world, (n,), generator=gen)
    # kernel="naive" is plain PyTorch: the custom ops' first call imports torch._dynamo (~7 s per
    # process on this host); all kernels produce the same layout (tests/kernels/test_dispatch.py)
    res = dispatch_jagged(batch, dest, world, kernel="naive")
    plan, buf = res.plan, res.buffer
    got_vals = transport.start(buf.values, plan.value_counts)
    got_rows = [transport.start(t, plan.counts) for t in (buf.lengths, buf.dense, buf.labels)]
    values, lens, dense, labels = got_vals.wait(), *(h.wait() for h in got_rows)
    assert int(lens.sum()) == values.shape[0]
    assert bool((labels // 1000 >= 0).all())
    # "backward": send everything back with the counts we received, then combine at home
    back_vals = transport.start(values, got_vals.recv_counts, plan.value_counts).wait()
    back_dense = transport.start(dense, got_rows[1].recv_counts, plan.counts).wait()
    back_lens = transport.start(lens, got_rows[0].recv_counts, plan.counts).wait()
    home = combine_jagged(JaggedRows(back_vals, back_lens, back_dense), plan, kernel="naive")
    assert torch.equal(home.values, batch.values) and torch.equal(home.dense, batch.dense)
    assert torch.equal(home.lengths, batch.lengths)


def _check_copy_engine_plan(transport: TorchDistTransport, rank: int, world: int) -> None:
    """The copy-engine transport's bookkeeping (counts matrix, offsets, staging growth, receive
    layout) against the torch transport: every rank plans its copies with ``plan_round`` and the
    device copies are substituted by byte copies into a simulated staging buffer."""
    capacity = 1
    for case in range(4):
        for shape in SHAPES:
            for dtype in DTYPES:
                sc = _counts(rank, world, case)
                send = torch.cat([_rows(rank, d, sc[d], shape, dtype) for d in range(world)])
                mine = torch.tensor([*sc, row_bytes(send)], dtype=torch.int64)
                gathered = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(gathered, mine)
                matrix = [g.tolist() for g in gathered]
                payloads: list = [None] * world
                dist.all_gather_object(payloads, as_bytes(send).reshape(-1).clone())
                plans = [plan_round(matrix, s, capacity) for s in range(world)]
                assert len({p.capacity for p in plans}) == 1, "every rank must grow its staging alike"
                capacity = plans[rank].capacity
                staging = torch.zeros(capacity, dtype=torch.uint8)
                for sender, plan in enumerate(plans):
                    for peer, src, dst, nbytes in plan.copies:
                        if peer == rank:  # the device copy, substituted
                            staging[dst : dst + nbytes] = payloads[sender][src : src + nbytes]
                mine_plan = plans[rank]
                rows = sum(mine_plan.recv_counts)
                got = staging[: rows * row_bytes(send)].view(dtype).view(rows, *shape)
                expect = transport.start(send, sc).wait()
                assert mine_plan.recv_counts == transport.exchange_counts(sc)
                assert torch.equal(got, expect), (case, shape, dtype)
    assert capacity % (2 << 20) == 0 and capacity >= 1


def _check_selection_and_errors(rank: int, world: int) -> None:
    assert isinstance(make_transport(TransportConfig(transport="auto")), TorchDistTransport)
    assert isinstance(make_transport(TransportConfig(transport="torch", p2p=True)), TorchDistTransport)
    if not torch.cuda.is_available():
        try:
            make_transport(TransportConfig(transport="copy_engine"))
        except TransportUnavailableError as e:
            assert "no CUDA device" in str(e), e
        else:
            raise AssertionError("copy_engine must be unavailable without CUDA")
    t = TorchDistTransport()
    for bad, match in (([1] * (world + 1), "one entry per rank"), ([-1] + [0] * (world - 1), "non-negative"),
                       ([1] * world, "sum to")):  # fmt: skip
        try:
            t.start(torch.zeros(2), bad)
        except ValueError as e:
            assert match in str(e), (match, e)
        else:
            raise AssertionError(match)


def worker(rank: int, world: int, init_file: str) -> None:
    # a rank that skips a collective desynchronizes the others: fail in a minute, not torch's 30
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    try:
        for p2p in (False, True):
            transport = TorchDistTransport(p2p=p2p)
            _check_exchange(transport, rank, world)
            _check_overlapped(transport, rank, world)
            _check_round_trip(transport, rank, world)
        _check_copy_engine_plan(TorchDistTransport(), rank, world)
        _check_selection_and_errors(rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_torch_transport_gloo(tmp_path: Path) -> None:
    from rank_workers import run_workers  # the pytest side only: ranks run this file as a script

    run_workers(__file__, WORLD, tmp_path)


@given(
    matrix=st.integers(1, 5).flatmap(
        lambda w: st.lists(st.lists(st.integers(0, 4), min_size=w, max_size=w), min_size=w, max_size=w)
    ),
    row_bytes_=st.integers(1, 16),
    capacity=st.integers(1, 8 << 20),
)
@settings(max_examples=60, deadline=None)
def test_copy_plan_matches_all_to_all_layout(matrix: list[list[int]], row_bytes_: int, capacity: int) -> None:
    """Without a process group: simulate every rank's planned copies and read each staging back."""
    world = len(matrix)
    full = [[*m, row_bytes_] for m in matrix]
    sends = [
        torch.cat([torch.full((n * row_bytes_,), 16 * s + d, dtype=torch.uint8) for d, n in enumerate(m)])
        for s, m in enumerate(matrix)
    ]
    plans = [plan_round(full, s, capacity) for s in range(world)]
    assert len({p.capacity for p in plans}) == 1
    grown = plans[0].capacity
    need = max(sum(matrix[s][r] for s in range(world)) for r in range(world)) * row_bytes_
    assert grown >= need and (grown == capacity or grown % (2 << 20) == 0)
    staging = [torch.zeros(grown, dtype=torch.uint8) for _ in range(world)]
    for s, plan in enumerate(plans):
        for peer, src, dst, nbytes in plan.copies:
            assert dst + nbytes <= grown
            staging[peer][dst : dst + nbytes] = sends[s][src : src + nbytes]
    for r in range(world):
        expect = torch.cat([torch.full((matrix[s][r] * row_bytes_,), 16 * s + r, dtype=torch.uint8)
                            for s in range(world)])  # fmt: skip
        assert plans[r].recv_counts == [matrix[s][r] for s in range(world)]
        assert plans[r].senders == [s for s in range(world) if matrix[s][r]]
        assert torch.equal(staging[r][: expect.numel()], expect)


def test_copy_plan_refuses_mixed_row_sizes() -> None:
    with pytest.raises(ValueError, match="different sizes"):
        plan_round([[1, 1, 4], [1, 1, 8]], 0, 1 << 20)


def test_transport_config_validation() -> None:
    with pytest.raises(ValueError, match=r"TransportConfig\.transport"):
        TransportConfig(transport="nccl")
    with pytest.raises(ValueError, match=r"TransportConfig\.capacity_bytes"):
        TransportConfig(capacity_bytes=0)
    with pytest.raises(ValueError, match=r"TransportConfig\.p2p"):
        TransportConfig(p2p="yes")  # type: ignore[arg-type]


def test_transport_needs_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this test process")
    with pytest.raises(TransportUnavailableError, match="process group"):
        make_transport(TransportConfig(transport="torch"))
    with pytest.raises(TransportUnavailableError, match="process group"):
        make_transport(TransportConfig(transport="copy_engine"))


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    import gc

    gc.freeze()  # exit without finalization's collections over torch's objects (trainer/lifetime.exit_process)
