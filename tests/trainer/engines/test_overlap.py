"""PEC's pieces (trainer/engines/overlap.py) on one process: ``segment_counts``, ``readers_of``,
``masked_all_to_all``, ``prefetch_exchange``, ``adopt`` and ``CommWorker`` (a gloo world of one)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from pec_check import OverlapCase, global_id_sets, overlap_batches

from freescale.trainer.engines.comm import build_transport
from freescale.trainer.engines.overlap import (
    CommWorker,
    adopt,
    masked_all_to_all,
    prefetch_exchange,
    readers_of,
    segment_counts,
)
from freescale.trainer.runner import make_engine


class RecordingClock:
    def __init__(self) -> None:
        self.names: list[str] = []

    def now(self) -> float:
        return 0.0

    def record_comm(self, name: str, launch: float, wait_start: float, wait_end: float) -> None:
        self.names.append(name)


def test_segment_counts_counts_the_set_entries_of_each_peers_segment() -> None:
    mask = torch.tensor([1, 0, 1, 1, 0, 1]).bool()
    assert segment_counts(mask, [2, 0, 3, 1]) == [1, 0, 2, 1]
    assert segment_counts(mask, [6]) == [4]
    assert segment_counts(torch.zeros(0, dtype=torch.bool), [0, 0, 0]) == [0, 0, 0]
    assert segment_counts(mask, []) == []


def test_readers_of_sets_one_bit_per_rank_that_reads_the_row_next_step() -> None:
    keys_now = torch.tensor([5, 6, 9, 7, 1, 100])
    keys_next = torch.tensor([9, 5, 7, 5, 9, 2])
    next_src = torch.tensor([0, 0, 1, 2, 3, 3])  # the rank that requests each next-step key
    assert readers_of(keys_now, keys_next, next_src).tolist() == [0b101, 0, 0b1001, 0b10, 0, 0]
    nobody = readers_of(keys_now, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    assert nobody.tolist() == [0] * 6 and nobody.dtype == torch.int64


def test_masked_all_to_all_sends_just_the_rows_the_masks_select(gloo_world_of_one) -> None:
    clock = RecordingClock()
    comm = build_transport("torch", clock, torch.device("cpu"))
    rows = torch.arange(12, dtype=torch.float32).view(6, 2)
    mask = torch.tensor([1, 0, 0, 1, 1, 0]).bool()
    try:
        received = masked_all_to_all(comm, "gradient_comm.nol", rows[mask], mask, [6], mask, [6])
        nothing = masked_all_to_all(comm, "empty", rows[:0], mask & False, [6], mask & False, [6])
    finally:
        comm.close()
    assert torch.equal(received, rows[mask]) and nothing.shape == (0, 2)
    assert clock.names == ["gradient_comm.nol", "empty"]


@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_prefetch_exchange_marks_the_rows_two_consecutive_steps_share(gloo_world_of_one, overlap: float) -> None:
    """One rank owns and requests every row: the owner's marks and the requester's agree, the OL
    counts are the planted overlap (item and action ids are equal, so both tables have it), and the
    same exchange brings the rows and the OL rows' optimizer state."""
    case = OverlapCase(world_size=1, steps=2, overlap=overlap, ids_per_rank=16, duplicates=4)
    engine = make_engine(case.run_config("none"), 0, 1, torch.device("cpu"), "none")
    try:
        first, second = overlap_batches(case, 0)
        now, nxt = engine.start_routing(first).finish(), engine.start_routing(second).finish()
        engine.tables.optimizers[0].state["momentum"].uniform_()  # state values the exchange must carry
        masks, rows, ol_state = prefetch_exchange(engine.tables, now, nxt, engine.comm)
        keys_now, keys_next = engine.tables.row_keys(now), engine.tables.row_keys(nxt)
        want_rows = engine.tables.lookup(nxt)
        want_state = engine.tables.state_rows(nxt, masks.ol_recv)
    finally:
        engine.close()
    sets = global_id_sets(case)
    planted = len(set(sets[0]) & set(sets[1]))
    assert planted == round(overlap * 16)
    assert torch.equal(masks.ol_recv, torch.isin(keys_next, keys_now))
    assert torch.equal(masks.hot_recv, torch.isin(keys_now, keys_next))
    assert torch.equal(masks.hot_readers, masks.hot_recv.to(torch.int64))  # rank 0's bit
    assert torch.equal(masks.ol_send, masks.ol_recv)
    assert masks.hot_counts == [int(masks.hot_recv.sum())] == [2 * planted]
    assert masks.ol_unique == [planted, planted] and masks.next_unique == [16, 16]
    assert torch.equal(rows, want_rows) and torch.equal(ol_state, want_state)


def test_adopt_marks_every_nested_cuda_tensor_for_the_callers_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[tuple[int, object]] = []

    class OnDevice(torch.Tensor):  # stands in for a CUDA tensor on a CPU-only host
        @property
        def is_cuda(self) -> bool:
            return True

        def record_stream(self, stream: object) -> None:
            recorded.append((id(self), stream))

    @dataclass
    class Pair:
        left: torch.Tensor
        right: list

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "caller's stream")
    tensors = [torch.Tensor._make_subclass(OnDevice, torch.zeros(2)) for _ in range(4)]
    value = (tensors[0], {"a": tensors[1], "b": [tensors[2], 7]}, Pair(tensors[3], [torch.ones(1)]))
    assert adopt(value) is value
    assert sorted(recorded) == sorted((id(t), "caller's stream") for t in tensors)
    cpu = torch.ones(3)
    assert adopt(cpu) is cpu and adopt(None) is None


def test_comm_worker_runs_tasks_in_order_on_one_thread_with_its_own_group(gloo_world_of_one) -> None:
    worker = CommWorker(torch.device("cpu"), "torch", timedelta(seconds=60))
    try:
        assert worker.group is not dist.group.WORLD and dist.get_world_size(worker.group) == 1
        assert worker.comm.group is worker.group and worker.stream is None
        order: list[int] = []

        def task(i: int) -> str:
            order.append(i)
            return threading.current_thread().name

        names = [future.result(timeout=30) for future in [worker.submit(task, i) for i in range(5)]]
        assert order == list(range(5))
        assert len(set(names)) == 1 and names[0].startswith("freescale-pec")
        assert names[0] != threading.current_thread().name
        rows = torch.arange(6, dtype=torch.float32).view(3, 2)
        sent = worker.submit(worker.comm.all_to_all, "embedding_comm.prefetch", rows, [3], [3])
        assert torch.equal(sent.result(timeout=30), rows)
        assert worker.seconds.take_seconds() > 0  # the worker's collectives go to its own clock
        published: Future = Future()
        finished = threading.Event()

        def publish_then_wait() -> None:
            worker.publish(published, "routed")
            finished.wait(30)

        running = worker.submit(publish_then_wait)
        assert published.result(timeout=30) == "routed" and not running.done()  # before the task returns
        finished.set()
        running.result(timeout=30)
        failing = worker.submit(lambda: 1 / 0)
        assert isinstance(failing.exception(timeout=30), ZeroDivisionError)
    finally:
        worker.close()
    with pytest.raises(RuntimeError):
        worker.submit(task, 5)
