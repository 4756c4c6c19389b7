"""SM-free all-to-all between ranks of one node: CUDA IPC staging buffers + copy-engine memcpys.

Why: NCCL moves data with kernels that occupy SMs and slow the compute they overlap (docs/design.md#transport;
10–40% reported). A ``cudaMemcpyAsync`` between device buffers of one node (peer copies over NVLink,
or two processes sharing a GPU) is executed by the GPU's copy engines (DMA) and leaves the SMs to
compute. ``benchmarks/bench_sm_contention.py`` verifies with the profiler that these copies launch
no kernel instead of assuming it (same-device D2D copies are the case to check).

How:

* construction (collective): every rank allocates a receive staging buffer, shares it with
  ``torch.multiprocessing.reductions.reduce_tensor`` (a CUDA IPC memory handle) and two
  interprocess events (``sent``: my copies into peers are done; ``consumed``: my staging may be
  overwritten) through the group's ``all_gather_object``; peers open them once;
* ``start``: record ``consumed`` on the current stream, all-gather the counts matrix on a CPU (gloo)
  group (it doubles as the host barrier that orders event records before the waits on them), then
  on a dedicated side stream wait for each receiver's ``consumed`` and ``tensor.copy_`` this rank's
  rows straight into the receiver's staging at the offset the counts matrix gives; record ``sent``;
* ``wait``: a gloo barrier (every sender has issued its copies and recorded ``sent``), the current
  stream waits on the senders' ``sent`` events, and the rows are copied out of the staging (or
  returned as a view with ``copy_out=False``, valid until the next ``start``).

Staging grows collectively when a round needs more than ``capacity_bytes`` (every rank knows the
whole counts matrix, so all decide alike).

NCCL's own copy-engine collectives (NCCL >= 2.28 with ``NCCL_CTA_POLICY=ZERO`` over PyTorch symmetric
memory, ``torch.distributed._symmetric_memory``) are not used: they support only equal-size
AllGather/AlltoAll inside one NVLink domain on registered symmetric buffers, while the balancer's
all-to-all is variable-size (heavy-tailed sample lengths: padding every split to the largest would
multiply the bytes moved), and they need every payload allocated in or copied into symmetric memory.
They also cannot serve two processes sharing one GPU (the contention test setup). The IPC path here
has none of these limits on one node; beyond one node the ``torch`` transport (NCCL) is the fallback.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .transport_base import (
    Counts,
    Transport,
    TransportHandle,
    TransportUnavailableError,
    as_bytes,
    check_send,
    counts_list,
    row_bytes,
)

_ALIGN = 2 << 20  # staging sizes are rounded to 2 MiB (the caching allocator's large-block granularity)


@dataclass(frozen=True)
class CopyRound:
    """One rank's bookkeeping for one exchange, a pure function of the counts matrix (no CUDA).

    ``copies``: (peer, source byte offset in my send buffer, destination byte offset in the peer's
    staging, bytes) for every copy this rank issues; ``recv_counts``/``senders``: what lands in my
    staging and from whom; ``capacity``: the staging size every rank must have for this round (all
    ranks see the same matrix, so all grow alike).
    """

    copies: list[tuple[int, int, int, int]]
    recv_counts: list[int]
    senders: list[int]
    row_bytes: int
    capacity: int


def plan_round(matrix: list[list[int]], rank: int, capacity: int) -> CopyRound:
    """Plan rank ``rank``'s copies from ``matrix[s][r]`` (rows s sends r; last column: s's row bytes).

    Rows from sender s land in the receiver's staging after the rows of senders 0..s-1, so the
    staging reads back as rank 0's rows, then rank 1's, ... (the torch transport's receive layout).
    """
    world = len(matrix)
    sizes = {m[-1] for m in matrix if sum(m[:-1])}
    if len(sizes) > 1:
        raise ValueError(f"ranks send rows of different sizes {sorted(sizes)} bytes; trailing shape and "
                         "dtype must match")  # fmt: skip
    rb = matrix[rank][-1]
    need = max(sum(matrix[s][r] for s in range(world)) for r in range(world)) * rb
    if need > capacity:
        capacity = -(-max(need, 2 * capacity) // _ALIGN) * _ALIGN
    copies, start = [], 0
    for peer in range(world):
        n = matrix[rank][peer]
        if n and rb:
            copies.append((peer, start * rb, sum(matrix[s][peer] for s in range(rank)) * rb, n * rb))
        start += n
    recv_counts = [matrix[s][rank] for s in range(world)]
    return CopyRound(copies, recv_counts, [s for s in range(world) if recv_counts[s]], rb, capacity)


def _local_facts(device: torch.device | None) -> dict[str, Any]:
    """What this rank can offer: CUDA, its host, its device and which node GPUs it can reach.

    A rank training on ``cpu`` offers no CUDA even where a GPU is visible (a CPU run on a GPU host once
    picked the copy engines and failed at its first exchange); ``device=None`` means "this process's
    current CUDA device, if any"."""
    on_cuda = device.type == "cuda" if device is not None else True
    facts: dict[str, Any] = {"cuda": on_cuda and torch.cuda.is_available(), "host": socket.gethostname()}
    if facts["cuda"]:
        idx = device.index if device is not None and device.index is not None else torch.cuda.current_device()
        facts["device"] = idx
        gpus = range(torch.cuda.device_count())
        facts["peers"] = [j for j in gpus if j == idx or torch.cuda.can_device_access_peer(idx, j)]
    return facts


def copy_engine_unavailable_reason(group: dist.ProcessGroup | None = None,
                                   device: torch.device | None = None) -> str | None:  # fmt: skip
    """Why the copy-engine transport cannot run on this group (None when it can). Collective.

    Every rank gathers every rank's facts, so all ranks reach the same answer (``auto`` must not pick
    different transports on different ranks).
    """
    if not dist.is_available() or not dist.is_initialized():
        return "no initialized torch.distributed process group"
    facts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(facts, _local_facts(device), group=group)
    no_cuda = [r for r, f in enumerate(facts) if not f["cuda"]]
    if no_cuda:
        return f"no CUDA device on rank(s) {no_cuda} (torch.cuda.is_available() is False)"
    hosts = sorted({f["host"] for f in facts})
    if len(hosts) > 1:
        return f"ranks are not on one node (hosts {hosts}); copy engines only reach GPUs of one node"
    for r, f in enumerate(facts):
        unreachable = sorted({g["device"] for g in facts} - set(f["peers"]))
        if unreachable:
            return f"rank {r} (cuda:{f['device']}) has no peer access to cuda:{unreachable}"
    return None


def _cpu_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """A gloo group over the same ranks: control messages must not queue behind GPU work."""
    if "gloo" in str(dist.get_backend(group)).lower():
        return group
    ranks = list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)
    return dist.new_group(ranks=ranks, backend="gloo")


class _CopyHandle(TransportHandle):
    def __init__(self, owner: CopyEngineTransport, recv_counts: list[int], senders: list[int],
                 shape: tuple[int, ...], dtype: torch.dtype) -> None:  # fmt: skip
        self._owner, self.recv_counts, self._senders = owner, recv_counts, senders
        self._shape, self._dtype = shape, dtype
        self._result: Tensor | None = None

    def wait(self) -> Tensor:
        if self._result is None:
            self._result = self._owner._finish(self._senders, self._shape, self._dtype)
        return self._result


class CopyEngineTransport(Transport):
    """Variable-size all-to-all with ``cudaMemcpyAsync`` into peers' IPC-shared staging buffers.

    Collective to construct and to ``close``; one exchange in flight at a time. See the module
    docstring for the protocol and for why NCCL's copy-engine collectives are not used.
    """

    concurrent = False  # one staging buffer per rank: one exchange in flight at a time

    def __init__(self, group: dist.ProcessGroup | None = None, *, device: torch.device | None = None,
                 capacity_bytes: int = 64 << 20, copy_out: bool = True) -> None:  # fmt: skip
        reason = copy_engine_unavailable_reason(group, device)
        if reason is not None:
            raise TransportUnavailableError(f"copy_engine transport: {reason}")
        self.group, self.cpu_group = group, _cpu_group(group)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.device = torch.device("cuda", device.index if device is not None and device.index is not None
                                   else torch.cuda.current_device())  # fmt: skip
        self.copy_out = copy_out
        self.stream = torch.cuda.Stream(self.device)
        with torch.cuda.device(self.device):
            self._sent = torch.cuda.Event(interprocess=True)
            self._consumed = torch.cuda.Event(interprocess=True)
            self._sent.record()
            self._consumed.record()
        self._peer_sent, self._peer_consumed = self._share_events()
        self.capacity = 0
        self._staging: Tensor | None = None
        self._peer_buf: list[Tensor] = []
        self._register(capacity_bytes)
        self._in_flight = False

    # ---------------------------------------------------------------- shared resources

    def _share_events(self) -> tuple[list[torch.cuda.Event], list[torch.cuda.Event]]:
        mine = (self._sent.ipc_handle(), self._consumed.ipc_handle())
        handles: list[Any] = [None] * self.world_size
        dist.all_gather_object(handles, mine, group=self.cpu_group)
        sent, consumed = [], []
        for r, (s, c) in enumerate(handles):
            local = r == self.rank
            sent.append(self._sent if local else torch.cuda.Event.from_ipc_handle(self.device, s))
            consumed.append(self._consumed if local else torch.cuda.Event.from_ipc_handle(self.device, c))
        return sent, consumed

    def _register(self, capacity: int) -> None:
        """Allocate this rank's staging and open every peer's (a CUDA IPC handle each). Collective."""
        from torch.multiprocessing.reductions import reduce_tensor

        capacity = -(-capacity // _ALIGN) * _ALIGN
        self._staging = torch.empty(capacity, dtype=torch.uint8, device=self.device)
        torch.cuda.synchronize(self.device)  # the allocation must exist before peers map it
        shared: list[Any] = [None] * self.world_size
        dist.all_gather_object(shared, reduce_tensor(self._staging), group=self.cpu_group)
        self._peer_buf = [self._staging if r == self.rank else fn(*args) for r, (fn, args) in enumerate(shared)]
        self.capacity = capacity

    def _release(self) -> None:
        """Unmap peers' staging, then free ours once nobody maps it. Collective."""
        torch.cuda.synchronize(self.device)
        dist.barrier(group=self.cpu_group)
        self._peer_buf = []
        dist.barrier(group=self.cpu_group)
        self._staging = None

    def close(self) -> None:
        if self._staging is not None:
            self._release()
        super().close()

    # ---------------------------------------------------------------- exchange

    def _counts_matrix(self, send_counts: list[int], rbytes: int) -> list[list[int]]:
        """``m[s][r]`` rows from rank s to rank r, plus every rank's row size as the last column."""
        mine = torch.tensor([*send_counts, rbytes], dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(rows, mine, group=self.cpu_group)
        return [r.tolist() for r in rows]

    def exchange_counts(self, send_counts: Counts) -> list[int]:
        sc = counts_list(send_counts, self.world_size, "send_counts")
        matrix = self._counts_matrix(sc, 0)
        return [matrix[s][self.rank] for s in range(self.world_size)]

    def start(self, send_buffer: Tensor, send_counts: Counts, recv_counts: Counts | None = None) -> TransportHandle:
        if self._staging is None:
            raise RuntimeError("CopyEngineTransport is closed")
        if self._in_flight:
            raise RuntimeError("CopyEngineTransport: wait() on the previous exchange before starting another")
        sc = counts_list(send_counts, self.world_size, "send_counts")
        send = check_send(send_buffer, sc)
        if send.device != self.device:
            raise ValueError(f"send_buffer is on {send.device}, the transport on {self.device}")
        cur = torch.cuda.current_stream(self.device)
        self._consumed.record(cur)  # the previous receive buffer's users are ordered before this point
        matrix = self._counts_matrix(sc, row_bytes(send))  # also the host barrier for the event protocol
        plan = plan_round(matrix, self.rank, self.capacity)
        if recv_counts is not None and counts_list(recv_counts, self.world_size, "recv_counts") != plan.recv_counts:
            raise ValueError(f"recv_counts {list(recv_counts)} disagree with what peers send {plan.recv_counts}")
        if plan.capacity > self.capacity:
            self._release()
            self._register(plan.capacity)
        self._issue_copies(send, plan, cur)
        self._in_flight = True
        shape = (sum(plan.recv_counts), *send.shape[1:])
        return _CopyHandle(self, plan.recv_counts, plan.senders, shape, send.dtype)

    def _issue_copies(self, send: Tensor, plan: CopyRound, cur: torch.cuda.Stream) -> None:
        """On the side stream: copy each receiver's rows into its staging at this rank's offset."""
        self.stream.wait_stream(cur)  # the send buffer is produced on the current stream
        sb = as_bytes(send).reshape(-1) if plan.row_bytes else None
        with torch.cuda.stream(self.stream):
            for peer, src, dst, nbytes in plan.copies:
                self.stream.wait_event(self._peer_consumed[peer])
                self._peer_buf[peer][dst : dst + nbytes].copy_(sb[src : src + nbytes], non_blocking=True)
            self._sent.record(self.stream)
        send.record_stream(self.stream)  # keep the caching allocator from reusing it mid-copy

    def _finish(self, senders: list[int], shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """Wait for every sender's copies on the current stream; hand out the rows."""
        dist.barrier(group=self.cpu_group)  # every sender has issued its copies and recorded `sent`
        cur = torch.cuda.current_stream(self.device)
        for s in senders:
            cur.wait_event(self._peer_sent[s])
        self._in_flight = False
        nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        view = self._staging[:nbytes].view(dtype).view(shape)
        return view.clone() if self.copy_out else view
