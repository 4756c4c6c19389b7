"""The transport seam (trainer/engines/comm.py): ``SideSeconds``, ``TimedHandle``, ``TimedTransport`` and
``build_transport`` on a gloo world of one, and no trainer module around the seam."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from freescale.trainer.engines.comm import SideSeconds, TimedHandle, TimedTransport, build_transport


def test_every_trainer_all_to_all_goes_through_the_transport() -> None:
    """The seam: no trainer module calls ``dist.all_to_all_single`` itself (TorchRec's engine only
    wraps the function TorchRec calls, to time it)."""
    import freescale.trainer

    root = Path(freescale.trainer.__file__).parent
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "all_to_all_single(" in p.read_text())
    assert callers == [], callers


class RecordingClock:
    """A ``CommClock`` that keeps every record (real time)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, float, float, float]] = []

    def now(self) -> float:
        return time.perf_counter()

    def record_comm(self, name: str, launch: float, wait_start: float, wait_end: float) -> None:
        self.records.append((name, launch, wait_start, wait_end))


def test_side_seconds_adds_up_collective_seconds_and_resets_when_taken() -> None:
    seconds = SideSeconds(torch.device("cpu"))
    seconds.record_comm("embedding_comm.prefetch", 1.0, 2.0, 4.0)  # launch to wait end: 3 s
    seconds.record_comm("gradient_comm.nol", 10.0, 10.0, 11.5)
    assert seconds.take_seconds() == pytest.approx(4.5)
    assert seconds.take_seconds() == 0.0
    first = seconds.now()
    assert seconds.now() >= first

    def record_many() -> None:
        for _ in range(2000):
            seconds.record_comm("x", 0.0, 0.0, 1.0)

    threads = [threading.Thread(target=record_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seconds.take_seconds() == 8000.0


def test_timed_handle_times_the_wait_around_the_transports_wait() -> None:
    events: list[str] = []
    received = torch.arange(3)

    class Clock:
        ticks = iter([10.0, 11.0])

        def now(self) -> float:
            events.append("now")
            return next(self.ticks)

        def record_comm(self, name: str, launch: float, wait_start: float, wait_end: float) -> None:
            events.append(f"record {name} {launch} {wait_start} {wait_end}")

    class Handle:
        def wait(self) -> torch.Tensor:
            events.append("wait")
            return received

    assert TimedHandle(Handle(), Clock(), "embedding_comm", launch=3.0).wait() is received
    assert events == ["now", "wait", "now", "record embedding_comm 3.0 10.0 11.0"]


def test_timed_transport_moves_rows_and_names_every_collective(gloo_world_of_one) -> None:
    clock = RecordingClock()
    comm = build_transport("torch", clock, torch.device("cpu"))
    try:
        assert (comm.kind, comm.concurrent) == ("torch", True)
        send = torch.arange(8, dtype=torch.float32).view(4, 2)
        assert torch.equal(comm.all_to_all("embedding_comm", send, [4], [4]), send)
        assert comm.all_to_all("input_dist", torch.zeros(0, 2), [0], [0]).shape == (0, 2)
        dense = torch.ones(3)
        assert comm.all_reduce("dense", dense) is dense and torch.equal(dense, torch.ones(3))  # one rank's sum
        started = comm.start_all_reduce("dense.started", torch.full((2,), 2.0))
        assert isinstance(started, TimedHandle) and torch.equal(started.wait(), torch.full((2,), 2.0))
    finally:
        comm.close()
    assert [name for name, *_ in clock.records] == ["embedding_comm", "input_dist", "dense", "dense.started"]
    assert all(launch <= start <= end for _, launch, start, end in clock.records)


def test_build_transport_names_the_option_when_copy_engines_cannot_run(gloo_world_of_one) -> None:
    with pytest.raises(ValueError, match=r"^engine\.transport = 'copy_engine': copy_engine is unavailable: "):
        build_transport("copy_engine", RecordingClock(), torch.device("cpu"))
    auto = build_transport("auto", RecordingClock(), torch.device("cpu"))  # falls back to torch
    assert isinstance(auto, TimedTransport) and auto.kind == "torch"
    auto.close()
