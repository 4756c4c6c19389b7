"""The transport interface every implementation shares: ``Transport``, its handle and row helpers.

``transport.TorchDistTransport`` and ``transport_copy_engine.CopyEngineTransport`` both build on this
module, and ``transport.make_transport`` picks one; the interface is described in ``transport``'s
docstring.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

Counts = Sequence[int] | Tensor


class TransportUnavailableError(RuntimeError):
    """The requested transport cannot run here (no CUDA, ranks on several nodes, no peer access...)."""


def counts_list(counts: Counts, world_size: int, what: str) -> list[int]:
    """Validate per-rank row counts (length ``world_size``, non-negative) and return them as ints."""
    values = counts.tolist() if isinstance(counts, Tensor) else [int(c) for c in counts]
    if len(values) != world_size:
        raise ValueError(f"{what} needs one entry per rank ({world_size}), got {len(values)}")
    if any(c < 0 for c in values):
        raise ValueError(f"{what} must be non-negative, got {values}")
    return values


def row_bytes(t: Tensor) -> int:
    """Bytes per leading-dimension row (a 1-D tensor has one element per row)."""
    return math.prod(t.shape[1:]) * t.element_size()


def as_bytes(t: Tensor) -> Tensor:
    """``[rows, row_bytes]`` uint8 view of a contiguous tensor: every dtype moves as raw bytes."""
    return t.reshape(-1).view(torch.uint8).view(t.shape[0], row_bytes(t))


def check_send(send: Tensor, send_counts: list[int]) -> Tensor:
    if send.dim() < 1:
        raise ValueError("send_buffer needs a leading row dimension")
    if sum(send_counts) != send.shape[0]:
        raise ValueError(f"send_counts sum to {sum(send_counts)} but send_buffer has {send.shape[0]} rows")
    return send.contiguous()


class TransportHandle(ABC):
    """An in-flight exchange; ``wait()`` makes the receive buffer safe to use on the current stream."""

    recv_counts: list[int]

    @abstractmethod
    def wait(self) -> Tensor:
        """Block (host for gloo, stream for CUDA) until the receive buffer is complete; return it."""


class Transport(ABC):
    """Variable-size all-to-all over a process group (see the module docstring)."""

    rank: int
    world_size: int
    concurrent: bool = False  # several exchanges may be in flight at once (started in the same order everywhere)

    @abstractmethod
    def start(self, send_buffer: Tensor, send_counts: Counts, recv_counts: Counts | None = None) -> TransportHandle:
        """Start moving ``send_counts[r]`` rows to rank ``r``; rows from rank ``s`` arrive in order."""

    @abstractmethod
    def exchange_counts(self, send_counts: Counts) -> list[int]:
        """How many rows every rank will send to this one (a blocking all-to-all of the counts)."""

    def _exchange_plan(
        self, send_buffer: Tensor, send_counts: Counts, recv_counts: Counts | None
    ) -> tuple[Tensor, list[int], list[int]]:
        """What a ``start`` checks first: the send buffer (contiguous, rows matching ``send_counts``),
        the send counts, and the receive counts (exchanged when not given)."""
        self._check_open()
        sc = counts_list(send_counts, self.world_size, "send_counts")
        send = check_send(send_buffer, sc)
        if recv_counts is None:
            return send, sc, self.exchange_counts(sc)
        return send, sc, counts_list(recv_counts, self.world_size, "recv_counts")

    def all_to_all(self, send_buffer: Tensor, send_counts: Counts, recv_counts: Counts | None = None) -> Tensor:
        """Synchronous convenience: ``start(...).wait()``."""
        return self.start(send_buffer, send_counts, recv_counts).wait()

    closed: bool = False

    def close(self) -> None:
        """Release transport resources (collective for transports that own shared buffers); every
        later exchange raises, whatever the transport (a torch one has nothing to release, but a run
        that only works on it would break on the copy engines)."""
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
