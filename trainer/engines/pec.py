"""Prioritized embedding communication (docs/design.md#pec): the FreeScale engine with ``engine.overlap = "pec"``.

While batch n computes, a background ``CommWorker`` routes batch n+1, lets each row's owner split
batch n+1's rows into OL (batch n reads them too, so batch n's update changes them) and NOL (batch n
leaves them alone), and sends every requested row ahead of time — NOL rows final, OL rows as they
are before batch n's update, together with their optimizer state. What is left on the critical path
is one all-to-all after batch n's backward: each gradient of a row batch n+1 reads ("hot") goes to
the row's owner *and* to the ranks that will read it. The owner applies it to its shard; each reader
applies the same optimizer arithmetic (``SparseOptimizer.updated``) to its prefetched copy. That is
docs/design.md#pec's "OL rows first" with one network hop instead of two (gradients to the owner, then rows
back), which matters where latency, not bandwidth, dominates small OL messages. The remaining
("cold") gradients go to the worker, which sends and applies them before its next task — batch
n+2's prefetch — looks up any row.

Why the result is the synchronous training, bit for bit: every row a lookup reads has received
exactly the updates the synchronous schedule would have applied by then (the worker reads batch
n+1's rows after batch n-1's cold update, its previous task, and before batch n's hot update, which
waits for the routing the worker publishes after that read); every contribution to a row's gradient
travels in the same part and is summed in the same (source rank) order wherever it is summed; and
the update is one function of (row, state, summed gradient) applied row by row, so owner and readers
compute the same bits. Cold rows are never hot rows, so the worker and the main thread never write
the same row. ``settle()`` (before evaluation and checkpoints) waits for the cold update.

Collectives per step (steady state): the worker's routing of batch n+1 (counts, then ids), its one
prefetch exchange (rows, optimizer state and the owners' marks together:
``overlap.prefetch_exchange``), the main thread's hot-gradient all-to-all and dense all-reduce, the
worker's cold-gradient all-to-all: six, one more than the synchronous schedule's five (counts, ids,
rows, gradients, all-reduce); tests/trainer/engines/test_collective_counts.py pins them. The cold
gradients of step n could still ride batch n+2's ids exchange (same pairs of ranks, needed before
that batch's lookup), which would make five; that needs a per-destination payload in the routing.

A non-finite step (``FreeScaleEngine``: every rank learns it from the dense all-reduce) applies no
hot, OL or cold update: batch n+1's prefetched rows were read before batch n's update, and with no
update they are already final, so they are used as they came.

Zero-collision tables (``model_extra.ids = "zch"``): the worker's routing of batch n+1 is the owner's
lookup, so rows batch n+1 gives to new ids are known during batch n, but they are reset when batch
n+1 starts, as in the synchronous engine (batch n's update of such a row happens and is then
overwritten; a checkpoint after batch n holds it un-reset). The owner resets its shard then; a reader
replaces its prefetched copy (read before the reset) by the reset value it computes itself from the
raw id the row was reset for, which came with the prefetched rows (``sharded.row_notes``). Its OL
refresh of such a row is overwritten the same way.

Instrumentation (``StepRecord.extra``): distinct OL and batch-(n+1) rows per table as the owners saw
them (summed over ranks: the global ``batch_overlap_rate``) and the seconds the worker spent in
collectives; waits of the main thread on the worker are comm records named ``*.prefetch_wait`` /
``*.nol_wait`` (the NOL part of exposed embedding communication), ``gradient_comm.ol`` the OL part.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import Batch
from freescale.trainer.engines.comm import ranks_per_node
from freescale.trainer.engines.engine import FreeScaleEngine, has_nonfinite
from freescale.trainer.engines.input_dist import DistContext
from freescale.trainer.engines.overlap import CommWorker, OverlapMasks, adopt, masked_all_to_all, prefetch_exchange
from freescale.trainer.engines.sparse_optim import sum_by_row

MAX_RANKS = 63  # readers of a row travel as an int64 bitmask


@dataclass
class Ahead:
    """Batch n+1 in flight: the worker resolves ``routed`` (context + masks), then ``prefetched``."""

    batch: Batch
    routed: Future  # (DistContext, OverlapMasks)
    prefetched: Future  # (rows in send order, OL rows pre-update; packed optimizer state of OL rows)
    submitted: float
    rows: torch.Tensor | None = None  # final rows in send order (OL rows updated), set after batch n's update


@dataclass
class Deferred:
    """Step n's cold gradients (rows batch n+1 does not read): sent and applied by the worker."""

    done: Future
    submitted: float


class PECEngine(FreeScaleEngine):
    """Row-wise sharded tables; rows prefetched one step ahead, OL rows refreshed from one gradient hop."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int, device: torch.device) -> None:
        if world_size > MAX_RANKS:
            raise ValueError(f"engine.overlap 'pec' supports up to {MAX_RANKS} ranks; use 'none' for {world_size}")
        super().__init__(cfg, rank, world_size, device)
        timeout = timedelta(seconds=cfg.engine.collective_timeout_s)
        per_node = ranks_per_node(cfg.engine, world_size)
        self.worker = CommWorker(device, cfg.engine.transport, timeout, per_node)
        self._worker_closed = False
        self._ahead: Ahead | None = None
        self._deferred: Deferred | None = None

    def describe(self) -> str:
        return "row-wise sharded tables, prioritized embedding communication (rows prefetched, OL via one hop)"

    # the step ----------------------------------------------------------------------------------
    def step(self, batches: Iterator[Batch]) -> None:
        stage = self.timer.stage
        with stage("data", "data"):
            current = self._ahead.batch if self._ahead is not None else next(batches).to(self.device)
            following = next(batches, None)
            following = following.to(self.device) if following is not None else None
        ctx, unique_rows = self._rows_of_current(current)
        ahead = self._submit(following, ctx) if following is not None else None  # after the resets: it reads rows
        loss, unique_grads = self.forward_backward(current, ctx, unique_rows)
        local_bad = has_nonfinite(loss, unique_grads)
        if ahead is None:  # last batch of the data: nothing reads rows later, apply everything now
            with stage("gradient_comm", "comm"):
                owner_grads = self.tables.grad_dist(ctx, unique_grads)
                self._all_reduce_dense_grads(local_bad)
            if not self.nonfinite:
                with stage("sparse_update", "compute"):
                    self.tables.sparse_update(ctx, owner_grads)
            masks = None
        else:
            masks = self._hot_and_cold_updates(ctx, unique_grads, ahead, local_bad)
        if self.nonfinite:
            self.dense_optimizer.zero_grad(set_to_none=True)
        else:
            with stage("dense_update", "compute"):
                self.dense_update()
        self._ahead = ahead
        self.finish_record(current, loss, ctx)
        self._record_extra(masks)

    def _rows_of_current(self, batch: Batch) -> tuple[DistContext, list[torch.Tensor]]:
        """The current batch's routing and unique rows: from the prefetch, or fetched now (first step)."""
        stage = self.timer.stage
        if self._ahead is None:
            with stage("input_dist", "comm"):
                ctx = self.start_routing(batch).finish()
            with stage("embedding_lookup", "compute"):
                self.tables.apply_resets(ctx)
                owned = self.tables.lookup(ctx)
            with stage("embedding_comm", "comm"):
                return ctx, self.tables.output_dist(ctx, owned)
        ctx = self._ahead.routed.result()[0]
        with stage("embedding_lookup", "compute"):
            self.tables.apply_resets(ctx)
            rows = self.tables.fresh_rows(ctx, self._ahead.rows)
        return ctx, [rows[position] for position in ctx.send_position]

    def _hot_and_cold_updates(
        self, ctx: DistContext, unique_grads: list[torch.Tensor | None], ahead: Ahead, local_bad: bool = False
    ) -> OverlapMasks:
        """Hot gradients in one hop (owners update shards, readers their copies); cold ones deferred."""
        stage = self.timer.stage
        with stage("gradient_comm", "comm"):
            masks = self._wait(ahead.routed, "input_dist.prefetch_wait", ahead.submitted)[1]
            send = self.tables.grad_send_buffer(ctx, unique_grads)
            keys, grads = self._send_hot_grads(ctx, send, masks)
            self._all_reduce_dense_grads(local_bad)
        if self.nonfinite:  # no update anywhere: the prefetched rows are final as read
            with stage("embedding_comm", "comm"):
                ahead.rows = self._wait(ahead.prefetched, "embedding_comm.prefetch_wait", ahead.submitted)[0]
            return masks
        with stage("sparse_update", "compute"):
            owned, _ = self.tables.owned_by_me(keys)
            self.tables.sparse_update_keys(keys[owned], grads[owned])
        with stage("embedding_comm", "comm"):
            rows, state = self._wait(ahead.prefetched, "embedding_comm.prefetch_wait", ahead.submitted)
        with stage("sparse_update", "compute"):
            ahead.rows = self._refresh_overlapping(ahead, rows, state, keys, grads)
        self._defer_cold_grads(ctx, send, masks)
        return masks

    # the worker's side -------------------------------------------------------------------------
    def _submit(self, batch: Batch, now: DistContext) -> Ahead:
        routed: Future = Future()
        prefetched = self.worker.submit(self._prefetch, batch, now, routed)
        return Ahead(batch, routed, prefetched, time.perf_counter())

    def _prefetch(self, batch: Batch, now: DistContext, routed: Future) -> tuple[torch.Tensor, torch.Tensor]:
        """(worker) Route batch n+1, then one exchange: its rows, their optimizer state and the
        owners' OL/NOL marks (``overlap.prefetch_exchange``).

        Rows and state are read *before* ``routed`` resolves: the main thread's hot update of batch n
        waits for it, so OL rows are read as they were before that update.
        """
        comm = self.worker.comm
        try:
            ctx = self.start_routing(batch, comm).finish()
            masks, received, ol_state = prefetch_exchange(self.tables, now, ctx, comm)
        except BaseException as error:
            routed.set_exception(error)
            raise
        self.worker.publish(routed, (ctx, masks))
        return received, ol_state

    # hot gradients: one hop to owners and next readers --------------------------------------------
    def _send_hot_grads(
        self, ctx: DistContext, send: torch.Tensor, masks: OverlapMasks
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """All-to-all of (row key, gradient) for every hot row to its owner and next readers.

        Returns the received keys and gradients, source-major (each source sends a row once).
        """
        keys, owners, _ = self.tables.send_layout(ctx)
        hot = masks.hot_readers != 0
        destinations = torch.where(hot, masks.hot_readers | (1 << owners), masks.hot_readers)
        payload = torch.cat([send, keys.view(torch.float32).view(-1, 2)], dim=1)  # key bits ride along
        parts = [payload[((destinations >> r) & 1).bool()] for r in range(self.world_size)]
        received = self.comm.all_to_all("gradient_comm.ol", torch.cat(parts), [len(p) for p in parts], masks.hot_counts)
        dim = self.tables.dim
        return received[:, dim:].contiguous().view(torch.int64).view(-1), received[:, :dim]

    def _refresh_overlapping(
        self, ahead: Ahead, rows: torch.Tensor, state: torch.Tensor, keys: torch.Tensor, grads: torch.Tensor
    ) -> torch.Tensor:
        """Batch n+1's rows with its OL rows brought up to date by the owner's own update arithmetic."""
        ctx, masks = ahead.routed.result()
        next_keys = self.tables.send_layout(ctx)[0]
        ol_keys = next_keys[masks.ol_send]
        if ol_keys.numel() == 0:
            return rows
        mine = torch.isin(keys, ol_keys)
        unique, summed = sum_by_row(keys[mine], grads[mine])
        position = torch.searchsorted(unique, ol_keys)
        optimizer = self.tables.fused.optimizer  # every table's: one update of all OL rows
        rows[masks.ol_send] = optimizer.updated(rows[masks.ol_send], optimizer.unpack(state), summed[position])[0]
        return rows

    # cold gradients: deferred on the worker --------------------------------------------------------
    def _defer_cold_grads(self, ctx: DistContext, send: torch.Tensor, masks: OverlapMasks) -> None:
        cold_send, cold_recv = masks.hot_readers == 0, ~masks.hot_recv
        done = self.worker.submit(self._apply_cold_grads, ctx, send[cold_send], cold_send, cold_recv)
        self._deferred = Deferred(done, time.perf_counter())

    def _apply_cold_grads(
        self, ctx: DistContext, rows: torch.Tensor, cold_send: torch.Tensor, cold_recv: torch.Tensor
    ) -> None:
        """(worker) All-to-all of the deferred gradients, then their sparse update at the owners."""
        grads = masked_all_to_all(
            self.worker.comm, "gradient_comm.nol", rows, cold_send, ctx.send_splits, cold_recv, ctx.recv_splits
        )
        self.tables.sparse_update(ctx, grads, cold_recv)

    # waiting on the worker -----------------------------------------------------------------------
    def _wait(self, future: Future, name: str, submitted: float) -> Any:
        """Block on the worker; recorded like a collective launched when the work was submitted."""
        start = self.timer.now()
        result = future.result()
        self.timer.record_comm(name, submitted, start, self.timer.now())
        return adopt(result)

    # instrumentation -------------------------------------------------------------------------------
    def _record_extra(self, masks: OverlapMasks | None) -> None:
        record = self.timer.current
        prefetch_seconds = self.worker.seconds.take_seconds()
        if record is None:
            return
        record.extra["prefetch_comm_s"] = prefetch_seconds
        if masks is not None:
            for spec, ol, total in zip(self.tables.specs, masks.ol_unique, masks.next_unique):
                record.extra[f"ol_unique.{spec.name}"] = float(ol)
                record.extra[f"next_unique.{spec.name}"] = float(total)

    # outside the step ----------------------------------------------------------------------------
    def settle(self) -> None:
        """Wait until the cold gradients are applied (before evaluation or a checkpoint reads the tables)."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._wait(deferred.done, "gradient_comm.nol_wait", deferred.submitted)

    def finish_training(self) -> None:
        """Apply the deferred updates and stop the communication thread (its own transport with it);
        evaluation runs on the main thread's transport."""
        self.settle()
        if not self._worker_closed:
            self.worker.close()
            self._worker_closed = True
        super().finish_training()
