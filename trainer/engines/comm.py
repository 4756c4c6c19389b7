"""The trainer's one communication seam: every all-to-all it makes goes through a ``Transport``.

``kernels/transport.py`` moves the bytes (``torch``: gloo/NCCL collectives; ``copy_engine``: CUDA
copy engines, SM-free, docs/design.md#transport). This module adds what the trainer needs around any transport:
a name per collective and its timing. ``TimedTransport.start`` stamps the launch, ``handle.wait()``
the wait's start and end, and hands the three to a ``CommClock`` — the step timer on the main thread
(so ``bubbles.analyze`` splits the wait into idle and exposed communication) or ``SideSeconds`` on
the PEC communication thread (whose collectives are overlapped, so only their total is kept).

No trainer module calls ``dist.all_to_all_single`` itself; the dense all-reduce stays a
``torch.distributed`` collective (copy engines would not reduce) but is timed here too.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from freescale.kernels.transport import (
    TRANSPORTS,
    Counts,
    Transport,
    TransportConfig,
    TransportHandle,
    TransportUnavailableError,
    WorkHandle,
    make_transport,
)
from freescale.trainer.engine_config import EngineConfig

__all__ = [
    "TRANSPORTS",
    "CommClock",
    "SideSeconds",
    "TimedHandle",
    "TimedTransport",
    "TransportUnavailableError",
    "build_transport",
]


class CommClock(Protocol):
    """Where a collective's timing goes: a clock consistent with the device's finished work, and a sink."""

    def now(self) -> float: ...

    def record_comm(self, name: str, launch: float, wait_start: float, wait_end: float) -> None: ...


class SideSeconds:
    """``CommClock`` of the PEC communication thread: adds up the seconds its collectives took.

    Thread-safe (the main thread takes the total once per step). On CUDA the clock synchronizes the
    thread's current stream, so a collective's seconds include its device work.
    """

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._seconds = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        if self._cuda:
            torch.cuda.current_stream().synchronize()
        return time.perf_counter()

    def record_comm(self, name: str, launch: float, wait_start: float, wait_end: float) -> None:
        with self._lock:
            self._seconds += wait_end - launch

    def take_seconds(self) -> float:
        """Seconds spent in collectives since the last call."""
        with self._lock:
            seconds, self._seconds = self._seconds, 0.0
        return seconds


class TimedHandle:
    """An in-flight all-to-all whose ``wait()`` records (launch, wait start, wait end) under its name."""

    def __init__(self, handle: TransportHandle, clock: CommClock, name: str, launch: float) -> None:
        self._handle, self._clock, self._name, self._launch = handle, clock, name, launch

    def wait(self) -> torch.Tensor:
        start = self._clock.now()
        received = self._handle.wait()
        self._clock.record_comm(self._name, self._launch, start, self._clock.now())
        return received


class TimedTransport:
    """A transport whose every collective is named and timed (the trainer's only way to communicate)."""

    def __init__(self, transport: Transport, clock: CommClock, group: dist.ProcessGroup | None = None) -> None:
        self.transport, self.clock, self.group = transport, clock, group

    @property
    def concurrent(self) -> bool:
        """Whether several exchanges may be in flight at once (torch: yes; copy engines: one at a time)."""
        return self.transport.concurrent

    @property
    def kind(self) -> str:
        """``torch`` or ``copy_engine``: what actually moves the bytes (``auto`` resolved)."""
        return transport_kind(self.transport)

    def start(self, name: str, send: torch.Tensor, send_counts: Counts, recv_counts: Counts) -> TimedHandle:
        """Start sending ``send_counts[r]`` rows of ``send`` to rank ``r``; ``recv_counts[s]`` arrive from ``s``."""
        launch = self.clock.now()
        return TimedHandle(self.transport.start(send, send_counts, recv_counts), self.clock, name, launch)

    def all_to_all(self, name: str, send: torch.Tensor, send_counts: Counts, recv_counts: Counts) -> torch.Tensor:
        """Synchronous all-to-all; returns the received rows (rank 0's first)."""
        return self.start(name, send, send_counts, recv_counts).wait()

    def all_reduce(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group in place (a torch.distributed collective: copy engines do not add)."""
        return self.start_all_reduce(name, tensor).wait()

    def start_all_reduce(self, name: str, tensor: torch.Tensor) -> TimedHandle:
        """``all_reduce`` started, not waited: ``wait()`` returns ``tensor`` summed in place.

        Why: the synchronous engine keeps its embedding-gradient all-to-all and the dense all-reduce
        in flight together and waits the all-to-all first, so the wait for gradient bytes still on
        the wire is booked as embedding communication, not as the all-reduce's.
        """
        launch = self.clock.now()
        work = dist.all_reduce(tensor, group=self.group, async_op=True)
        return TimedHandle(WorkHandle([work], tensor, []), self.clock, name, launch)

    def close(self) -> None:
        self.transport.close()


def transport_kind(transport: Transport) -> str:
    from freescale.kernels.transport import TorchDistTransport
    from freescale.kernels.transport_hierarchical import HierarchicalTransport

    if isinstance(transport, HierarchicalTransport):
        return f"hierarchical({transport_kind(transport.node)} within nodes, {transport_kind(transport.cross)} across)"
    return "torch" if isinstance(transport, TorchDistTransport) else "copy_engine"


def ranks_per_node(engine: EngineConfig, world_size: int) -> int:
    """``EngineConfig.nodes_of`` for this rank's launcher: torchrun's ``LOCAL_WORLD_SIZE``."""
    return engine.nodes_of(world_size, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))


def build_transport(
    choice: str,
    clock: CommClock,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    *,
    per_node: int = 0,
    timeout: timedelta | None = None,
) -> TimedTransport:
    """The transport ``engine.transport`` names, timed by ``clock``; collective over ``group``.
    ``per_node`` (``ranks_per_node``): route every exchange through nodes of that many ranks first
    (its groups get ``timeout``).

    A ``copy_engine`` request that cannot run here is a one-line ``ValueError`` naming the option and
    the reason (no CUDA, ranks on several nodes, no peer access), raised alike on every rank.
    """
    config = TransportConfig(transport=choice, ranks_per_node=per_node)
    try:
        transport = make_transport(config, group=group, device=device, timeout=timeout)
    except TransportUnavailableError as error:
        raise ValueError(f"engine.transport = {choice!r}: {error}") from None
    return TimedTransport(transport, clock, group)
