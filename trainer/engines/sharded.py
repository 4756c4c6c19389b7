"""Embedding tables sharded row-wise across ranks, with every communication step explicit.

Rank ``r`` of ``W`` owns rows ``[r·⌈R/W⌉, (r+1)·⌈R/W⌉)`` of each table (``torch.chunk`` layout, so a
shard is exactly a ``DTensor`` ``Shard(0)`` piece and torch.distributed.checkpoint can save, load
and reshard it). A step uses the tables in separate stages that the engine times one by one and that
the next issues (prioritized embedding communication, SM-free transport) will reorder or replace:

1. ``input_dist``: unique ids per table, bucketed by owner; all-to-all of counts, then of ids;
2. ``lookup``: owners gather the requested rows (local, no communication);
3. ``output_dist``: all-to-all of the rows back to the requesters;
4. (dense forward/backward on leaf tensors of the unique rows, outside this module);
5. ``grad_dist``: all-to-all of the unique rows' gradients back to their owners;
6. ``sparse_update``: owners sum duplicate gradients and apply the row-wise optimizer.

Several features can share a table (the item table serves the history, the targets and the
negatives); ids of all features of a table are de-duplicated together, so each row crosses the
network once per step. Payloads of all tables travel in one all-to-all per stage.

Features arrive as anything with ``keys()``, ``values()`` and ``length_per_key()``: our ``JaggedIds``
or TorchRec's ``KeyedJaggedTensor`` (the interop boundary; TorchRec itself is never imported here).

Zero-collision tables (``TableSpec.zch``, ``model_extra.ids = "zch"``): requesters send *raw* ids to
the owner of their bucket (``zch_shard.py``) in the same two all-to-alls; ``finish`` has the owner
look them up (training: insert, evict) and replace them by global rows, so every later stage works on
rows as for exact ids. Rows given to a new id are reset (embedding and optimizer state) by
``apply_resets`` when that batch starts training. The rows all-to-all carries each row's key and
reset id back (``row_notes``: two int64 as four more float32 columns), so requesters know which
row each raw id got: PEC addresses gradients by row and recomputes reset rows it prefetched,
evaluation ranks by row. With ttl, the step's event time rides as the last element of the routing
note.

Storage: all of this rank's shards are one fused tensor with one sparse optimizer over it
(``fused_tables.py``), so ``lookup``, ``sparse_update`` and ``state_rows`` are one gather or one update
over fused rows, with no per-table boolean mask (a host sync on CUDA each); ``weights[t]`` and
``optimizers[t]`` are views of one table in it (checkpoint keys per table, as before).

By role: the keyed jagged ids (``jagged_ids.py``), a table's spec, shard bounds and initial rows
(``table_layout.py``), the fused storage (``fused_tables.py``), the input distribution
(``input_dist.py``), the zero-collision tables' row assignment and resets (``sharded_zch.py``); this
module holds the shards and the later stages.
"""

from __future__ import annotations

import torch

from freescale.trainer.engines.comm import TimedHandle, TimedTransport
from freescale.trainer.engines.fused_tables import FusedTables
from freescale.trainer.engines.input_dist import DistContext, InputDistribution, source_ranks
from freescale.trainer.engines.sharded_zch import ZchRows
from freescale.trainer.engines.sparse_optim import SparseOptimizer
from freescale.trainer.engines.table_layout import TableSpec, init_rows, shard_bounds
from freescale.trainer.engines.zch_shard import ZchShard
from freescale.trainer.learning_config import OptimizerConfig


class RowWiseShardedTables(InputDistribution, ZchRows):
    """This rank's shards of several equal-width tables (one fused tensor, one sparse optimizer) and the stages."""

    def __init__(
        self,
        specs: list[TableSpec],
        rank: int,
        world_size: int,
        device: torch.device,
        seed: int,
        optimizer: OptimizerConfig,
        comm: TimedTransport,
    ) -> None:
        dims = {spec.dim for spec in specs}
        if len(dims) != 1:
            raise ValueError(f"all tables must share one embedding dim, got {sorted(dims)}")
        self.specs, self.rank, self.world_size, self.device, self.comm = specs, rank, world_size, device, comm
        self.dim = dims.pop()
        self.bounds = [shard_bounds(spec.rows, world_size, rank) for spec in specs]
        self.rows_per_rank = [-(-spec.rows // world_size) for spec in specs]
        shards = [init_rows(seed, t, spec, lo, hi) for t, (spec, (lo, hi)) in enumerate(zip(specs, self.bounds))]
        self.fused = FusedTables(shards, self.bounds, optimizer, device)
        self.weights: list[torch.Tensor] = self.fused.weights  # views into the fused storage, per table
        self.optimizers: list[SparseOptimizer] = self.fused.optimizers
        self.table_of = {feature: t for t, spec in enumerate(specs) for feature in spec.features}
        self.key_offsets = torch.tensor([0] + [spec.rows for spec in specs[:-1]], device=device).cumsum(0)
        # each table's [lo, hi) rows on this rank, made once: a tensor built from host values per call is a
        # blocking host-to-device copy, which on CUDA waits for everything queued before it
        self.bound_rows = torch.tensor(self.bounds, dtype=torch.int64, device=device).reshape(-1, 2)
        self.zch = [
            None if spec.zch is None else ZchShard(spec.zch, rank, device, t, seed, spec.bound)
            for t, spec in enumerate(specs)
        ]
        for spec, shard, weight in zip(specs, self.zch, self.weights):
            if shard is None:
                continue
            if spec.rows != shard.rows_per_rank * world_size:
                raise ValueError(f"table {spec.name}: a zch table has zch_size + world_size rows, got {spec.rows}")
            with torch.no_grad():
                weight[-1] = shard.fallback_values(self.dim).to(weight.dtype)  # this rank's fallback row

    def feature_keys(self, ctx: DistContext) -> dict[str, torch.Tensor]:
        """(requester) Per feature, the row key of every id (zch: the rows' note; else the ids' keys)."""
        keys, _, _ = self.send_layout(ctx)
        unique_keys = [keys[position] for position in ctx.send_position]
        return {name: unique_keys[t][index] for name, (t, index) in ctx.feature_index.items()}

    def row_keys(self, ctx: DistContext) -> torch.Tensor:
        """One int64 per received id naming (table, row) across all tables: the owner's row identity."""
        return ctx.recv_ids + self.key_offsets[ctx.recv_table]

    def send_layout(self, ctx: DistContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per entry of this rank's send buffer: its row key, owner rank and table (zch: keys from the
        rows' note, so known once the rows arrived)."""
        size = sum(ctx.send_splits)
        keys = torch.empty(size, dtype=torch.int64, device=self.device)
        tables = torch.empty(size, dtype=torch.int64, device=self.device)
        for t, (ids, position) in enumerate(zip(ctx.unique, ctx.send_position)):
            keys[position] = ids + self.key_offsets[t]
            tables[position] = t
        if self.has_zch:
            if ctx.send_keys is None:
                raise RuntimeError("zch: row keys are known once the rows arrived (take_row_notes)")
            keys = ctx.send_keys
        return keys, source_ranks(ctx.send_splits, self.device), tables

    def key_table(self, keys: torch.Tensor) -> torch.Tensor:
        """The table of each row key."""
        return torch.searchsorted(self.key_offsets, keys, right=True) - 1

    def owned_by_me(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask of the keys whose row lives on this rank, their table)."""
        table = self.key_table(keys)
        local = keys - self.key_offsets[table]
        lo, hi = self.bound_rows[table].unbind(1)
        return (local >= lo) & (local < hi), table

    def fused_rows(self, ctx: DistContext, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Fused storage row of every received id (those where ``mask``, if given: then one host sync)."""
        index = self.fused.index(ctx.recv_ids, ctx.recv_table)
        return index if mask is None else index[mask]

    def lookup(self, ctx: DistContext, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Rows of the received ids (those where ``mask``, if given) from the local shards, in receive order."""
        return self.fused.gather(self.fused_rows(ctx, mask))

    def output_dist(self, ctx: DistContext, rows: torch.Tensor, keys: bool = True) -> list[torch.Tensor]:
        """Send rows back; returns per table the rows of this rank's unique ids (plain tensors).

        ``keys``: zch rows travel with their row key and reset id (``row_notes``), which the requester's
        ``feature_keys`` and ``send_layout`` read (evaluation, PEC); the synchronous training step reads
        neither and sends the rows alone."""
        payload = self.row_notes(ctx, rows) if keys else rows
        received = self.comm.all_to_all("embedding_comm.rows", payload, ctx.recv_splits, ctx.send_splits)
        received = self.take_row_notes(ctx, received) if keys else received
        return [received[position] for position in ctx.send_position]

    @staticmethod
    def feature_rows(ctx: DistContext, unique_rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per feature, one row per id (differentiable w.r.t. ``unique_rows``)."""
        return {name: unique_rows[t][index] for name, (t, index) in ctx.feature_index.items()}

    def grad_dist(self, ctx: DistContext, unique_grads: list[torch.Tensor | None]) -> torch.Tensor:
        """Send each unique row's gradient to its owner; returns grads aligned with ``ctx.recv_ids``."""
        return self.start_grad_dist(ctx, unique_grads).wait()

    def start_grad_dist(self, ctx: DistContext, unique_grads: list[torch.Tensor | None]) -> TimedHandle:
        """``grad_dist`` started, not waited: the engine runs the dense all-reduce while it is in flight."""
        send = self.grad_send_buffer(ctx, unique_grads)
        return self.comm.start("gradient_comm.embeddings", send, ctx.send_splits, ctx.recv_splits)

    def grad_send_buffer(self, ctx: DistContext, unique_grads: list[torch.Tensor | None]) -> torch.Tensor:
        """The unique rows' gradients in send order (owner-major); rows without a gradient are zero."""
        send = torch.zeros(sum(ctx.send_splits), self.dim, dtype=torch.float32, device=self.device)
        for position, grad in zip(ctx.send_position, unique_grads):
            if grad is not None:
                send[position] = grad
        return send

    def sparse_update(self, ctx: DistContext, grads: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Sum duplicate rows' gradients (several requesters) and step each table's optimizer.

        With ``mask``, only the received ids where it is set are updated and ``grads`` holds just
        theirs (in receive order). Every requester's gradient of one row is in the same part, summed
        in the same order, so updating a row in a later part gives bitwise the same row.
        """
        self.fused.update(self.fused_rows(ctx, mask), grads)

    def sparse_update_keys(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """``sparse_update`` for gradients addressed by row key (all rows owned by this rank)."""
        table = self.key_table(keys)
        self.fused.update(self.fused.index(keys - self.key_offsets[table], table), grads)

    def state_rows(self, ctx: DistContext, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Optimizer state of the received ids (those where ``mask``, if given), packed one row per id."""
        return self.fused.state_rows(self.fused_rows(ctx, mask))

    def local_state(self) -> dict[str, torch.Tensor]:
        """This rank's shard of every table and optimizer state tensor, by checkpoint key; zch tables add
        their identity table as of the trained batches (``ZchShard.trained_state``), every tensor a
        dim-0 piece of a global one (per-rank metadata as one row per rank)."""
        state = {}
        for spec, weight, optimizer, shard in zip(self.specs, self.weights, self.optimizers, self.zch):
            state[f"tables.{spec.name}.weight"] = weight
            for key, tensor in optimizer.state.items():
                state[f"tables.{spec.name}.{key}"] = tensor
            if shard is not None:
                for key, tensor in {**shard.trained_state(), "layout": shard.layout}.items():
                    state[f"zch.{spec.name}.{key}"] = tensor if tensor.dim() else tensor.view(1)
        return state

    def global_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full (unsharded) shape of every ``local_state`` tensor."""
        shapes = {}
        for spec, optimizer in zip(self.specs, self.optimizers):
            shapes[f"tables.{spec.name}.weight"] = (spec.rows, self.dim)
            for key, tensor in optimizer.state.items():
                shapes[f"tables.{spec.name}.{key}"] = (spec.rows, *tensor.shape[1:])
        for key, tensor in self.local_state().items():
            if key.startswith("zch."):
                shapes[key] = (tensor.shape[0] * self.world_size, *tensor.shape[1:])
        return shapes
