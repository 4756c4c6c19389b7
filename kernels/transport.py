"""Transport: the trainer's variable-size all-to-all behind one asynchronous interface.

Why an interface: the balancer's dispatch (docs/design.md#online-balancer) and the embedding communication must overlap
compute, and how bytes move decides whether they slow that compute (§6). ``TorchDistTransport`` uses
``torch.distributed`` (gloo on CPU, NCCL on GPU: SM-based kernels); ``CopyEngineTransport``
(``transport_copy_engine``) moves bytes with CUDA copy engines between ranks of one node. Both expose:

    handle = transport.start(send_buffer, send_counts, recv_counts=None)
    ... overlapped work ...
    recv_buffer = handle.wait()

``send_buffer`` rows ``[sum(send_counts[:r]), sum(send_counts[:r+1]))`` go to rank ``r`` (the layout
``dispatch`` produces); the receive buffer holds the rows from rank 0, then rank 1, ... When
``recv_counts`` is unknown the counts are exchanged first (one small blocking all-to-all), because the
receive buffer must be allocated before the payload moves. Payloads are sent as raw bytes, so every
dtype (bf16 included) and any trailing shape works on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
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
    counts_list,
    row_bytes,
)
from .transport_hierarchical import HierarchicalTransport, NodeLayout, node_layout

TRANSPORTS = ("torch", "copy_engine", "auto")


@dataclass(frozen=True)
class TransportConfig:
    """Which transport to build and how.

    ``transport``: ``"torch"`` (torch.distributed collectives), ``"copy_engine"`` (CUDA IPC +
    ``cudaMemcpyAsync`` on a side stream; one node only) or ``"auto"`` (copy_engine when every rank
    can use it, else torch). ``p2p``: torch transport uses isend/irecv pairs instead of
    ``all_to_all_single`` (for backends without uneven all-to-all). ``capacity_bytes``: initial
    receive staging per rank for the copy-engine transport (it grows collectively when exceeded).
    ``copy_out``: copy-engine ``wait()`` returns a fresh tensor instead of a view of the staging
    buffer (a view is only valid until the next ``start``). ``ranks_per_node``: 0 for one flat
    all-to-all; else the group's ranks form nodes of this many consecutive ranks and every exchange
    goes through the node first (``transport_hierarchical``: ``transport`` within a node, torch
    across nodes when ``transport`` is ``copy_engine``).
    """

    transport: str = "auto"
    p2p: bool = False
    capacity_bytes: int = 64 << 20
    copy_out: bool = True
    ranks_per_node: int = 0

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"TransportConfig.transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if not isinstance(self.capacity_bytes, int) or self.capacity_bytes <= 0:
            raise ValueError(f"TransportConfig.capacity_bytes must be a positive int, got {self.capacity_bytes!r}")
        if not isinstance(self.ranks_per_node, int) or self.ranks_per_node < 0:
            raise ValueError(f"TransportConfig.ranks_per_node must be an int >= 0, got {self.ranks_per_node!r}")
        for name in ("p2p", "copy_out"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TransportConfig.{name} must be a bool, got {getattr(self, name)!r}")


# --------------------------------------------------------------------------------------------------
# torch.distributed
# --------------------------------------------------------------------------------------------------


class WorkHandle(TransportHandle):
    """torch.distributed work in flight; ``wait()`` waits for all of it and returns ``recv``."""

    def __init__(self, works: list[Any], recv: Tensor, recv_counts: list[int]) -> None:
        self._works, self._recv, self.recv_counts = works, recv, recv_counts

    def wait(self) -> Tensor:
        for w in self._works:
            w.wait()
        self._works = []
        return self._recv


class TorchDistTransport(Transport):
    """All-to-all through ``torch.distributed``: gloo on CPU, NCCL on GPU (SM-based kernels).

    gloo implements uneven ``all_to_all_single`` (verified by tests/kernels/test_transport.py for bf16,
    multi-dim rows and zero-row splits), so the default is one collective; ``p2p=True`` uses
    isend/irecv pairs instead, for backends that lack it.
    """

    concurrent = True  # torch.distributed orders collectives by issue order; gloo/NCCL run them concurrently

    def __init__(self, group: dist.ProcessGroup | None = None, *, p2p: bool = False) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise TransportUnavailableError("torch transport needs an initialized torch.distributed process group")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.p2p = p2p
        backend = str(dist.get_backend(group)).lower()
        self.count_device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend \
            else torch.device("cpu")  # fmt: skip

    def exchange_counts(self, send_counts: Counts) -> list[int]:
        self._check_open()
        sent = torch.tensor(counts_list(send_counts, self.world_size, "send_counts"), dtype=torch.int64,
                            device=self.count_device)  # fmt: skip
        recv = torch.empty_like(sent)
        dist.all_to_all_single(recv, sent, group=self.group)
        return recv.tolist()

    def start(self, send_buffer: Tensor, send_counts: Counts, recv_counts: Counts | None = None) -> TransportHandle:
        send, sc, rc = self._exchange_plan(send_buffer, send_counts, recv_counts)
        recv = send.new_empty((sum(rc), *send.shape[1:]))
        if row_bytes(send) == 0:  # the same on every rank: rows of one collective share shape and dtype
            return WorkHandle([], recv, rc)
        sb, rb = as_bytes(send), as_bytes(recv)
        if self.p2p:
            works = self._start_p2p(sb, rb, sc, rc)
        else:
            works = [dist.all_to_all_single(rb, sb, output_split_sizes=rc, input_split_sizes=sc,
                                            group=self.group, async_op=True)]  # fmt: skip
        return WorkHandle(works, recv, rc)

    def _start_p2p(self, sb: Tensor, rb: Tensor, sc: list[int], rc: list[int]) -> list[Any]:
        """isend/irecv with every peer that has rows to exchange; the self chunk is a local copy."""
        s_off, r_off = _offsets(sc), _offsets(rc)
        ops: list[dist.P2POp] = []
        for peer in range(self.world_size):
            send_chunk = sb[s_off[peer] : s_off[peer + 1]]
            recv_chunk = rb[r_off[peer] : r_off[peer + 1]]
            if peer == self.rank:
                recv_chunk.copy_(send_chunk)
                continue
            gpeer = dist.get_global_rank(self.group, peer) if self.group is not None else peer
            if sc[peer]:
                ops.append(dist.P2POp(dist.isend, send_chunk, gpeer, self.group))
            if rc[peer]:
                ops.append(dist.P2POp(dist.irecv, recv_chunk, gpeer, self.group))
        return dist.batch_isend_irecv(ops) if ops else []


def _offsets(counts: list[int]) -> list[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


# --------------------------------------------------------------------------------------------------
# selection
# --------------------------------------------------------------------------------------------------


def make_transport(config: TransportConfig | None = None, group: dist.ProcessGroup | None = None,
                   device: torch.device | None = None, timeout: timedelta | None = None) -> Transport:  # fmt: skip
    """Build the configured transport; collective over ``group`` (every rank must call it).

    ``"copy_engine"`` raises ``TransportUnavailableError`` naming the reason (no CUDA, ranks on
    several nodes, no peer access between their GPUs); ``"auto"`` falls back to torch on the same
    condition, decided identically on every rank. With ``ranks_per_node`` the transport is
    hierarchical; its node and cross process groups get ``timeout`` (torch's default otherwise).
    """
    cfg = config if config is not None else TransportConfig()
    if cfg.ranks_per_node:
        return _make_hierarchical(cfg, group, device, timeout)
    if cfg.transport == "torch":
        return TorchDistTransport(group, p2p=cfg.p2p)
    from .transport_copy_engine import CopyEngineTransport, copy_engine_unavailable_reason

    reason = copy_engine_unavailable_reason(group, device)
    if reason is None:
        return CopyEngineTransport(group, device=device, capacity_bytes=cfg.capacity_bytes,
                                   copy_out=cfg.copy_out)  # fmt: skip
    if cfg.transport == "copy_engine":
        raise TransportUnavailableError(f"copy_engine is unavailable: {reason}; use 'torch' or 'auto'")
    return TorchDistTransport(group, p2p=cfg.p2p)


def _make_hierarchical(
    config: TransportConfig,
    group: dist.ProcessGroup | None,
    device: torch.device | None,
    timeout: timedelta | None,
) -> HierarchicalTransport:
    """Collective over ``group``: every rank creates every node group and every cross group, in the
    same order (``dist.new_group``'s rule), then the two levels' flat transports. Within a node:
    ``config.transport``; across nodes the copy engines cannot reach, so ``copy_engine`` becomes
    ``torch`` there (``auto`` finds that out by itself)."""
    layout = node_layout(dist.get_world_size(group), config.ranks_per_node, dist.get_rank(group))
    node_group, cross_group = _level_groups(layout, group, timeout)
    within = replace(config, ranks_per_node=0)
    across = replace(within, transport="torch" if config.transport == "copy_engine" else config.transport)
    return HierarchicalTransport(
        layout, make_transport(within, node_group, device), make_transport(across, cross_group, device)
    )


def _level_groups(layout: NodeLayout, group: dist.ProcessGroup | None,
                  timeout: timedelta | None) -> tuple[Any, Any]:  # fmt: skip
    """This rank's node group and cross group (global ranks of ``group``'s members)."""

    def new_group(members: list[int]) -> Any:
        ranks = [dist.get_global_rank(group, r) if group is not None else r for r in members]
        return dist.new_group(ranks, timeout=timeout, backend=dist.get_backend(group))

    node_groups = [new_group(layout.node_ranks(n)) for n in range(layout.nodes)]
    cross_groups = [new_group(layout.peer_ranks(local)) for local in range(layout.ranks_per_node)]
    return node_groups[layout.node], cross_groups[layout.local]
