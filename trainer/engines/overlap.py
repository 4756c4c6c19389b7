"""The pieces prioritized embedding communication (docs/design.md#pec) is built from.

* ``OverlapMasks``: for two consecutive steps n and n+1, which rows overlap (OL: in both global
  batches) — decided by the shard that owns the row, which sees every rank's request, and sent back
  to the requesters inside the step-(n+1) row exchange (``prefetch_exchange``: rows, optimizer state
  and marks in one all-to-all), so that both ends of every later all-to-all agree on which rows
  travel when.
* ``masked_all_to_all``: an all-to-all of just the rows a mask selects, with split sizes that both
  sides derive from their own copy of the mask (no extra exchange of counts).
* ``CommWorker``: one background thread per rank, with its own process group (and CUDA stream), that
  runs the prefetch chain of batch n+1 and the deferred gradient all-to-all while the main thread
  computes. Its collectives are never recorded as waits of the main thread; the main thread records
  only how long it blocked on the worker's futures, so ``bubbles.analyze`` still matches
  collectives across ranks by their order.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from freescale.trainer.engines.comm import SideSeconds, TimedTransport, build_transport
from freescale.trainer.engines.input_dist import DistContext, source_ranks
from freescale.trainer.engines.sharded import RowWiseShardedTables


def segment_counts(mask: torch.Tensor, splits: list[int]) -> list[int]:
    """How many set entries each consecutive segment (of the given sizes) of ``mask`` holds."""
    if not splits:
        return []
    if mask.numel() == 0:
        return [0] * len(splits)
    return [int(part.sum()) for part in torch.split(mask, splits)]


def masked_all_to_all(
    comm: TimedTransport,
    name: str,
    rows: torch.Tensor,
    send_mask: torch.Tensor,
    send_splits: list[int],
    recv_mask: torch.Tensor,
    recv_splits: list[int],
) -> torch.Tensor:
    """All-to-all of the rows of ``rows`` where ``send_mask`` is set (``rows`` already holds only those).

    ``send_splits``/``recv_splits`` segment the full (unmasked) buffers by peer; the masked counts per
    peer follow from the masks, which both ends hold consistently (``OverlapMasks``).
    """
    return comm.all_to_all(name, rows, segment_counts(send_mask, send_splits), segment_counts(recv_mask, recv_splits))


@dataclass
class OverlapMasks:
    """Which rows steps n and n+1 share, seen from both ends of the all-to-alls.

    Owner side (aligned with the owner's received ids): ``hot_recv`` marks step-n rows that step n+1
    reads again; ``ol_recv`` marks step-(n+1) rows that step n updates (OL). Requester side
    (aligned with this rank's send buffer of that step): ``hot_readers`` is, per step-n row, the
    bitmask of ranks that read it in step n+1 (0: a cold row whose gradient can wait); ``ol_send``
    marks this rank's OL rows of step n+1. ``hot_counts[c]`` is how many hot gradients rank ``c``
    will send this rank on the critical path (as owner or as a reader of the row).
    """

    hot_recv: torch.Tensor
    ol_recv: torch.Tensor
    hot_readers: torch.Tensor
    ol_send: torch.Tensor
    hot_counts: list[int]
    ol_unique: list[int]  # per table: distinct OL rows this rank owns
    next_unique: list[int]  # per table: distinct step-(n+1) rows this rank owns


def readers_of(keys_now: torch.Tensor, keys_next: torch.Tensor, next_src: torch.Tensor) -> torch.Tensor:
    """Per step-n key, the bitmask of ranks requesting it in step n+1. A rank may ask for a row under
    several ids (zch: every id without a slot shares the fallback row), so (key, rank) pairs count once."""
    if keys_next.numel():
        pairs = torch.unique(torch.stack([keys_next, next_src]), dim=1)
        keys_next, next_src = pairs[0], pairs[1]
    unique, inverse = torch.unique(keys_next, return_inverse=True)
    if unique.numel() == 0:
        return torch.zeros_like(keys_now)
    bits = torch.zeros_like(unique).scatter_add_(0, inverse, torch.ones_like(next_src) << next_src)
    position = torch.searchsorted(unique, keys_now).clamp(max=unique.numel() - 1)
    return torch.where(unique[position] == keys_now, bits[position], torch.zeros_like(keys_now))


def owner_marks(
    tables: RowWiseShardedTables, now: DistContext, nxt: DistContext
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The owner's OL/NOL decision for steps n and n+1: (readers per step-n row it was asked for,
    OL flag per step-(n+1) row, ``[contributor, destination]`` counts of the hot gradients)."""
    world, rank, device = tables.world_size, tables.rank, now.recv_ids.device
    keys_now, keys_next = tables.row_keys(now), tables.row_keys(nxt)
    readers = readers_of(keys_now, keys_next, source_ranks(nxt.recv_splits, device))
    ol_recv = torch.isin(keys_next, keys_now)
    # a hot gradient of contributor c goes to the row's owner (this rank) and to its next readers
    destinations = torch.where(readers != 0, readers | (1 << rank), readers)
    bits = (destinations[:, None] >> torch.arange(world, device=device)) & 1
    counts = torch.zeros(world, world, dtype=torch.int64, device=device)
    counts.index_add_(0, source_ranks(now.recv_splits, device), bits)  # [contributor, destination]
    return readers, ol_recv, counts


def as_floats(values: torch.Tensor) -> torch.Tensor:
    """int64 ``[n]`` as the float32 ``[2n]`` of its bits (exact: only bytes move)."""
    return values.to(torch.int64).contiguous().view(torch.float32)


def as_ints(values: torch.Tensor) -> torch.Tensor:
    """Inverse of ``as_floats`` (a copy, so the int64 view is aligned)."""
    return values.clone().view(torch.int64)


def prefetch_exchange(
    tables: RowWiseShardedTables, now: DistContext, nxt: DistContext, comm: TimedTransport
) -> tuple[OverlapMasks, torch.Tensor, torch.Tensor]:
    """(worker) Step n+1's rows, with the owners' marks and optimizer state, in one all-to-all.

    Each owner sends every requester, in one flat float32 segment: the rows of its step-(n+1) ids
    (with zch ids, each row's key and reset id: ``row_notes``), their packed optimizer state, their
    OL flags, the readers bitmask of each of its step-n ids (int64 bits) and the hot-gradient counts
    (int64 bits). Every size is known to both ends from the
    routing, so no count travels on its own. Why the state of every row and not only of the OL rows:
    which rows are OL is what the message tells the requester, so a part sized by it could not be
    received in the same exchange; the state is ``state_width`` floats a row (one for row-wise
    Adagrad). Returns (marks, rows in send order, packed state of this rank's OL rows).
    """
    world, device = tables.world_size, now.recv_ids.device
    readers, ol_recv, counts = owner_marks(tables, now, nxt)
    rows = tables.row_notes(nxt, tables.lookup(nxt))  # zch: each row with its key and reset id
    dim = rows.shape[1]
    state = tables.state_rows(nxt)
    width = state.shape[1]
    parts = zip(
        torch.split(rows, nxt.recv_splits), torch.split(state, nxt.recv_splits),
        torch.split(ol_recv.to(torch.float32), nxt.recv_splits), torch.split(readers, now.recv_splits),
    )  # fmt: skip
    send = [
        torch.cat([r.flatten(), s.flatten(), o, as_floats(h), as_floats(counts[:, q])])
        for q, (r, s, o, h) in enumerate(parts)
    ]
    sizes = [n * (dim + width + 1) + 2 * m + 2 * world for n, m in zip(nxt.send_splits, now.send_splits)]
    received = comm.all_to_all("embedding_comm.prefetch", torch.cat(send), [p.numel() for p in send], sizes)
    pieces = [
        torch.split(segment, [n * dim, n * width, n, 2 * m, 2 * world])
        for segment, n, m in zip(torch.split(received, sizes), nxt.send_splits, now.send_splits)
    ]
    empty = torch.zeros(0, dtype=torch.float32, device=device)
    got_rows = torch.cat([empty, *(p[0] for p in pieces)]).view(-1, dim)
    got_state = torch.cat([empty, *(p[1] for p in pieces)]).view(-1, width)
    ol_send = torch.cat([empty, *(p[2] for p in pieces)]) != 0
    hot_readers = as_ints(torch.cat([empty, *(p[3] for p in pieces)]))
    hot_counts = as_ints(torch.stack([p[4] for p in pieces])).view(world, world).sum(0).tolist()
    ol_unique, next_unique = _unique_counts(tables, nxt, ol_recv)
    masks = OverlapMasks(readers != 0, ol_recv, hot_readers, ol_send, hot_counts, ol_unique, next_unique)
    return masks, tables.take_row_notes(nxt, got_rows), got_state[ol_send]


def _unique_counts(tables: RowWiseShardedTables, nxt: DistContext, ol_recv: torch.Tensor) -> tuple[list, list]:
    """Distinct rows per table among this owner's step-(n+1) requests, and how many of them are OL:
    one ``unique`` of the row keys for all tables and one host read (not two masks a table)."""
    unique, inverse = torch.unique(tables.row_keys(nxt), return_inverse=True)
    ol = torch.zeros(unique.numel(), dtype=torch.int64, device=unique.device)
    ol.scatter_(0, inverse, ol_recv.to(torch.int64))  # OL is a property of the row: duplicates agree
    table = tables.key_table(unique)
    counts = torch.zeros(2, len(tables.specs), dtype=torch.int64, device=unique.device)
    counts[0].index_add_(0, table, ol)
    counts[1].index_add_(0, table, torch.ones_like(ol))
    ol_unique, next_unique = counts.tolist()
    return ol_unique, next_unique


def adopt(value: Any) -> Any:
    """Mark the CUDA tensors a worker task returned as used by the caller's stream (allocator safety).

    Without it the caching allocator could hand their memory back to the worker's stream while
    kernels the main thread queued on them are still pending. A no-op on CPU.
    """
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(torch.cuda.current_stream(value.device))
    elif isinstance(value, dict):
        for item in value.values():
            adopt(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            adopt(item)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            adopt(getattr(value, name))
    return value


class CommWorker:
    """A single background thread that runs communication tasks in submission order.

    Every rank submits the same tasks in the same order, so the worker's collectives on its own
    process group match across ranks while the main thread's collectives use the default group.
    On CUDA the tasks run on a dedicated stream; ``submit`` records an event on the caller's stream
    first so a task sees everything the main thread had queued (e.g. the deferred sparse update).
    """

    def __init__(
        self, device: torch.device, transport: str, timeout: timedelta | None = None, per_node: int = 0
    ) -> None:
        """Collective (a process group and a transport of the worker's own): every rank constructs it.
        ``per_node``: the transport is hierarchical over nodes of that many ranks (``comm.ranks_per_node``)."""
        self.device = device
        # new_group does not inherit the default group's timeout: torch's 30-minute default otherwise
        self.group = dist.new_group(backend=dist.get_backend(), timeout=timeout)
        self.seconds = SideSeconds(device)
        self.comm = build_transport(transport, self.seconds, device, self.group, per_node=per_node, timeout=timeout)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="freescale-pec")
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def submit(self, task: Callable[..., Any], *args: Any) -> Future:
        ready = None
        if self.stream is not None:
            ready = torch.cuda.Event()
            ready.record()
        return self._pool.submit(self._run, task, ready, *args)

    def _run(self, task: Callable[..., Any], ready: Any, *args: Any) -> Any:
        if self.stream is None:
            return task(*args)
        torch.cuda.set_device(self.device)
        self.stream.wait_event(ready)
        with torch.cuda.stream(self.stream):
            result = task(*args)
        self.stream.synchronize()
        return result

    def publish(self, future: Future, value: Any) -> None:
        """(worker) Resolve ``future`` with tensors this task made, once its stream has computed them.

        Why: the main thread uses a published value on its own stream at once, while the task goes
        on; ``_run`` synchronises the stream only when the whole task returns.
        """
        if self.stream is not None:
            self.stream.synchronize()
        future.set_result(value)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.comm.close()
