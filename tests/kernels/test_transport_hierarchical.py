"""The hierarchical all-to-all (through the node, then across nodes) against the flat one.

The ranks are this file run as a script over gloo (as in test_transport.py); nodes are emulated by
``ranks_per_node``. Every exchange must equal the flat transport's bit for bit: uneven counts with
zeros, ranks that send or receive nothing, several dtypes and row shapes, known and unknown receive
counts, two exchanges in flight, and layouts of one rank per node and of one node.
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

from freescale.kernels.transport import TransportConfig, make_transport
from freescale.kernels.transport_hierarchical import HierarchicalTransport, node_layout, regroup

WORLD = 4


@given(counts=st.lists(st.lists(st.integers(0, 3), min_size=3, max_size=3), min_size=1, max_size=4))
@settings(max_examples=40, deadline=None)
def test_regroup_lays_blocks_out_the_other_way(counts: list[list[int]]) -> None:
    blocks = {(a, b): torch.full((n, 2), 10 * a + b) for a, row in enumerate(counts) for b, n in enumerate(row)}
    rows = torch.cat([blocks[a, b] for a in range(len(counts)) for b in range(3)])
    want = torch.cat([blocks[a, b] for b in range(3) for a in range(len(counts))])
    assert torch.equal(regroup(rows, counts), want)


def test_a_world_that_does_not_split_into_nodes_is_one_line() -> None:
    with pytest.raises(ValueError, match="6 ranks do not split into nodes of 4"):
        node_layout(6, 4, 0)
    with pytest.raises(ValueError, match="ranks_per_node must be an int >= 0"):
        TransportConfig(ranks_per_node=-1)


def _counts(sender: int, world: int, case: int) -> list[int]:
    if case == 0:
        return [(sender * 3 + r * 2 + 1) % 5 for r in range(world)]
    if case == 1:  # rank 1 sends nothing; nobody sends to rank 2
        return [0] * world if sender == 1 else [(sender + r) % 3 + 1 if r != 2 else 0 for r in range(world)]
    return [0] * world


def _rows(sender: int, dest: int, n: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    base = torch.arange(n, dtype=torch.float64) + 100 * sender + 10 * dest
    return base.reshape(n, *([1] * len(shape))).expand(n, *shape).to(dtype).contiguous()


def _check_against_flat(hier: HierarchicalTransport, flat, rank: int, world: int) -> None:
    for case in range(3):
        for shape, dtype in (((), torch.int64), ((3,), torch.float32), ((2, 2), torch.bfloat16)):
            sc = _counts(rank, world, case)
            send = torch.cat([_rows(rank, d, sc[d], shape, dtype) for d in range(world)])
            assert hier.exchange_counts(sc) == flat.exchange_counts(sc)
            want = flat.start(send, sc).wait()
            for known in (None, flat.exchange_counts(sc)):
                handle = hier.start(send, sc, known)
                got = handle.wait()
                assert handle.recv_counts == flat.exchange_counts(sc)
                assert got.dtype == want.dtype and torch.equal(got, want), (case, shape, dtype, known)
    sc = _counts(rank, world, 0)
    send = torch.cat([_rows(rank, d, sc[d], (4,), torch.float32) for d in range(world)])
    first, second = hier.start(send, sc), hier.start(send * 2, sc)  # two in flight
    want = flat.start(send, sc).wait()
    assert torch.equal(second.wait(), want * 2) and torch.equal(first.wait(), want)


def _starts_per_exchange(hier: HierarchicalTransport, send: torch.Tensor, sc: list[int], known) -> dict[str, int]:
    """How many exchanges one hierarchical all-to-all starts on its node and cross transports."""
    calls = {"node": 0, "cross": 0}
    originals = {name: getattr(hier, name).start for name in calls}

    def counting(name: str):
        def start(*args, **kwargs):
            calls[name] += 1
            return originals[name](*args, **kwargs)

        return start

    for name in calls:
        getattr(hier, name).start = counting(name)
    try:
        hier.start(send, sc, known).wait()
    finally:
        for name, original in originals.items():
            getattr(hier, name).start = original
    return calls


def _check_collective_counts(hier: HierarchicalTransport, flat, rank: int, world: int) -> None:
    """Unknown receive counts: the node swap of the counts doubles as the count exchange's first step,
    so two small exchanges precede the data's two (three before); known: the swap alone."""
    sc = _counts(rank, world, 0)
    send = torch.cat([_rows(rank, d, sc[d], (2,), torch.float32) for d in range(world)])
    assert _starts_per_exchange(hier, send, sc, None) == {"node": 2, "cross": 2}
    assert _starts_per_exchange(hier, send, sc, flat.exchange_counts(sc)) == {"node": 2, "cross": 1}


def worker(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    try:
        flat = make_transport(TransportConfig(transport="torch"))
        for per_node in (2, 1, 4):
            timeout = timedelta(seconds=60)
            hier = make_transport(TransportConfig(transport="torch", ranks_per_node=per_node), timeout=timeout)
            assert isinstance(hier, HierarchicalTransport) and hier.layout.ranks_per_node == per_node
            _check_against_flat(hier, flat, rank, world)
            _check_collective_counts(hier, flat, rank, world)
            hier.close()
        side = dist.new_group(backend="gloo")  # a group other than the default one (PEC's worker has one)
        hier = make_transport(TransportConfig(transport="torch", ranks_per_node=2), group=side)
        _check_against_flat(hier, flat, rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_hierarchical_equals_flat_on_four_gloo_ranks(tmp_path: Path) -> None:
    from rank_workers import run_workers  # the pytest side only: ranks run this file as a script

    run_workers(__file__, WORLD, tmp_path)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    import gc

    gc.freeze()  # exit without finalization's collections over torch's objects (trainer/lifetime.exit_process)
