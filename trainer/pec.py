"""Prioritized embedding communication (DESIGN §5): the FreeScale engine with ``engine.overlap = "pec"``.

While batch n computes, a background ``CommWorker`` runs batch n+1's input distribution, lets each
row's owner split batch n+1's rows into OL (batch n reads them too, so batch n's update changes them)
and NOL (batch n leaves them alone), and looks up and sends the NOL rows. After batch n's sparse
update only the OL rows are looked up and sent, on the critical path. Gradients mirror it: rows that
batch n+1 reads ("hot") are sent and applied at once; the others are sent by the worker and applied
at the start of the next step, before the worker's next NOL lookup could read them.

Why the result is the synchronous training, bit for bit: every row a lookup reads has received
exactly the updates the synchronous schedule would have applied by then (NOL rows: none pending,
since batch n does not touch them and batch n-1's deferred rows were applied before the lookup;
OL rows: read after batch n's update), all gradient contributions of one row travel in the same
part and are summed in the same order, and the optimizers update rows independently. Only the time
at which each row is written changes. ``settle()`` (called before evaluation and checkpoints)
applies deferred gradients early, which changes nothing either: they are rows batch n+1 does not read.

Instrumentation (``StepRecord.extra``): distinct OL and batch-(n+1) rows per table as the owners saw
them (summed over ranks: the global ``batch_overlap_rate``), and the seconds the worker spent in
collectives; waits of the main thread on the worker appear as comm records ``*.nol_wait`` and
``input_dist.prefetch_wait``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from freescale.trainer.config import RunConfig
from freescale.trainer.data import Batch
from freescale.trainer.engine import FreeScaleEngine, batch_features
from freescale.trainer.overlap import CommWorker, OverlapMasks, adopt, exchange_masks, masked_all_to_all
from freescale.trainer.sharded import DistContext


@dataclass
class Ahead:
    """Batch n+1 in flight: the worker resolves ``routed`` (context + masks) and then ``nol_rows``."""

    batch: Batch
    routed: Future
    nol_rows: Future
    submitted: float
    ol_rows: torch.Tensor | None = None


@dataclass
class Deferred:
    """Step n's gradients of rows batch n+1 does not read, travelling on the worker."""

    ctx: DistContext
    mask: torch.Tensor  # owner side: received ids whose gradients are in ``grads``
    grads: Future
    submitted: float


class PECEngine(FreeScaleEngine):
    """Row-wise sharded tables with NOL rows prefetched one step ahead and OL rows sent first."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int, device: torch.device) -> None:
        super().__init__(cfg, rank, world_size, device)
        self.worker = CommWorker(device)
        self._ahead: Ahead | None = None
        self._deferred: Deferred | None = None

    def describe(self) -> str:
        return "row-wise sharded tables, prioritized embedding communication (NOL prefetch, OL first)"

    # the step ----------------------------------------------------------------------------------
    def step(self, batches: Iterator[Batch]) -> None:
        stage = self.timer.stage
        with stage("data", "data"):
            current = self._ahead.batch if self._ahead is not None else next(batches).to(self.device)
            following = next(batches, None)
            following = following.to(self.device) if following is not None else None
        with stage("sparse_update", "compute"):
            self._apply_deferred()
        ctx, unique_rows = self._rows_of_current(current)
        ahead = self._submit(following, ctx) if following is not None else None
        loss, unique_grads = self.forward_backward(current, ctx, unique_rows)
        with stage("gradient_comm", "comm"):
            masks = self._wait_routed(ahead)[1] if ahead is not None else None
            owner_grads, hot = self._send_grads(ctx, unique_grads, masks)
            self._all_reduce_dense_grads()
        with stage("sparse_update", "compute"):
            self.tables.sparse_update(ctx, owner_grads, hot)
        if ahead is not None:
            with stage("embedding_comm", "comm"):
                self._send_overlapping(ahead)
        with stage("dense_update", "compute"):
            self.dense_update()
        self._ahead = ahead
        self.finish_record(current, loss)
        self._record_extra(masks)

    def _rows_of_current(self, batch: Batch) -> tuple[DistContext, list[torch.Tensor]]:
        """The current batch's routing and unique rows: from the prefetch, or fetched now (first step)."""
        stage = self.timer.stage
        if self._ahead is None:
            with stage("input_dist", "comm"):
                ctx = self.tables.input_dist(batch_features(batch))
            with stage("embedding_lookup", "compute"):
                owned = self.tables.lookup(ctx)
            with stage("embedding_comm", "comm"):
                return ctx, self.tables.output_dist(ctx, owned)
        with stage("embedding_comm", "comm"):
            ahead = self._ahead
            ctx, masks = self._wait_routed(ahead)
            nol = self._wait(ahead.nol_rows, "embedding_comm.nol_wait", ahead.submitted)
            received = nol.new_empty(sum(ctx.send_splits), self.tables.dim)
            received[~masks.ol_send] = nol
            received[masks.ol_send] = ahead.ol_rows
            return ctx, [received[position] for position in ctx.send_position]

    # the worker's side -------------------------------------------------------------------------
    def _submit(self, batch: Batch, now: DistContext) -> Ahead:
        routed: Future = Future()
        nol_rows = self.worker.submit(self._prefetch, batch, now, routed)
        return Ahead(batch, routed, nol_rows, time.perf_counter())

    def _prefetch(self, batch: Batch, now: DistContext, routed: Future) -> torch.Tensor:
        """(worker) Route batch n+1, agree on OL/NOL with the owners, look up and send the NOL rows."""
        comm = self.worker.comm
        try:
            ctx = self.tables.input_dist(batch_features(batch), comm=comm)
            masks = exchange_masks(self.tables, now, ctx, comm)
        except BaseException as error:
            routed.set_exception(error)
            raise
        routed.set_result((ctx, masks))
        nol = ~masks.ol_recv
        rows = self.tables.lookup(ctx, nol)
        return masked_all_to_all(
            comm, "embedding_comm.nol", rows, nol, ctx.recv_splits, ~masks.ol_send, ctx.send_splits
        )

    # gradients -----------------------------------------------------------------------------------
    def _send_grads(
        self, ctx: DistContext, unique_grads: list[torch.Tensor | None], masks: OverlapMasks | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hot gradients now (returned with their owner-side mask); the rest deferred on the worker."""
        if masks is None:  # last step of the data: nothing reads rows later, apply everything now
            return self.tables.grad_dist(ctx, unique_grads), None
        send = self.tables.grad_send_buffer(ctx, unique_grads)
        hot_send, hot_recv = masks.hot_send, masks.hot_recv
        hot = masked_all_to_all(
            self.comm, "gradient_comm.ol", send[hot_send], hot_send, ctx.send_splits, hot_recv, ctx.recv_splits
        )
        cold_send, cold_recv = ~hot_send, ~hot_recv
        grads = self.worker.submit(
            masked_all_to_all,
            self.worker.comm,
            "gradient_comm.nol",
            send[cold_send],
            cold_send,
            ctx.send_splits,
            cold_recv,
            ctx.recv_splits,
        )
        self._deferred = Deferred(ctx, cold_recv, grads, time.perf_counter())
        return hot, hot_recv

    def _apply_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            grads = self._wait(deferred.grads, "gradient_comm.nol_wait", deferred.submitted)
            self.tables.sparse_update(deferred.ctx, grads, deferred.mask)

    # OL rows -----------------------------------------------------------------------------------
    def _send_overlapping(self, ahead: Ahead) -> None:
        """After this step's update: look up batch n+1's OL rows and send them (critical path)."""
        ctx, masks = self._wait_routed(ahead)
        rows = self.tables.lookup(ctx, masks.ol_recv)
        ahead.ol_rows = masked_all_to_all(
            self.comm, "embedding_comm.ol", rows, masks.ol_recv, ctx.recv_splits, masks.ol_send, ctx.send_splits
        )

    # waiting on the worker -----------------------------------------------------------------------
    def _wait_routed(self, ahead: Ahead) -> tuple[DistContext, OverlapMasks]:
        return self._wait(ahead.routed, "input_dist.prefetch_wait", ahead.submitted)

    def _wait(self, future: Future, name: str, submitted: float) -> Any:
        """Block on the worker; recorded like a collective launched when the work was submitted."""
        start = self.timer.now()
        result = future.result()
        self.timer.record_comm(name, submitted, start, self.timer.now())
        return adopt(result)

    # instrumentation -------------------------------------------------------------------------------
    def _record_extra(self, masks: OverlapMasks | None) -> None:
        record = self.timer.current
        prefetch_seconds = self.worker.comm.take_seconds()
        if record is None:
            return
        record.extra["prefetch_comm_s"] = prefetch_seconds
        if masks is not None:
            for spec, ol, total in zip(self.tables.specs, masks.ol_unique, masks.next_unique):
                record.extra[f"ol_unique.{spec.name}"] = float(ol)
                record.extra[f"next_unique.{spec.name}"] = float(total)

    # outside the step ----------------------------------------------------------------------------
    def settle(self) -> None:
        """Apply deferred gradients now (before evaluation or a checkpoint reads the tables)."""
        self._apply_deferred()

    def close(self) -> None:
        self.settle()
        self.worker.close()
