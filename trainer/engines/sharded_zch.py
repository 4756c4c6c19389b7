"""Zero-collision tables in the sharded tables (``sharded.py``'s docstring): the owner assigns rows to raw
ids and resets the rows given to new ids; the rows travel back with their key and, for a row reset in
this batch, the raw id it was reset for (``row_notes``), and a requester recomputes the reset rows it
prefetched (their values are keyed by that id: ``ZchShard.reset_values``).
"""

from __future__ import annotations

import torch

from freescale.kernels.zch_rows import reset_rows
from freescale.trainer.engines.input_dist import DistContext
from freescale.trainer.engines.sparse_optim import SparseOptimizer
from freescale.trainer.engines.zch_shard import ZchShard


class ZchRows:
    """``RowWiseShardedTables``' zero-collision methods (a mixin: the attributes are the tables')."""

    dim: int
    weights: list[torch.Tensor]
    optimizers: list[SparseOptimizer]
    bounds: list[tuple[int, int]]
    key_offsets: torch.Tensor
    zch: list[ZchShard | None]

    def assign_rows(self, ctx: DistContext, train: bool, clock: int | None = None) -> None:
        """(owner) Raw ids of zch tables → global rows, in place in ``ctx.recv_ids``; in training the
        tables insert and evict (every zch table is looked up, even without ids: its step advances)."""
        if not self.has_zch:
            return
        steps = []
        for t, shard in enumerate(self.zch):
            if shard is None:
                continue
            if len(self.zch) == 1:  # every id is this table's: no boolean mask (two host syncs on CUDA)
                rows, step = shard.lookup(ctx.recv_ids, clock, train)
                ctx.recv_ids.copy_(rows)
            else:
                mine = ctx.recv_table == t
                rows, step = shard.lookup(ctx.recv_ids[mine], clock, train)
                ctx.recv_ids[mine] = rows
            if step is not None:
                steps.append(step)
        ctx.zch = steps if train else None

    def apply_resets(self, ctx: DistContext) -> None:
        """(owner) Reset the rows this batch's lookups gave to new ids: embedding and optimizer state,
        before the batch reads them (idempotent). The identity tables are then no longer ahead."""
        if ctx.zch is None or ctx.resets_applied:
            return
        for step in ctx.zch:
            shard, weight = self.zch[step.table], self.weights[step.table]
            values = shard.reset_values(step.reassigned_ids, self.dim)
            local = step.reassigned - self.bounds[step.table][0]
            reset_rows(weight, local, self.optimizers[step.table].state, values=values)
            shard.trained()
        ctx.resets_applied = True

    def row_notes(self, ctx: DistContext, rows: torch.Tensor) -> torch.Tensor:
        """(owner) ``rows`` with each row's key and the raw id it was reset for in this batch (-1: none) as
        int64 bits, zch only."""
        if not self.has_zch:
            return rows
        keys, resets = self.row_keys(ctx), torch.full_like(ctx.recv_ids, -1)
        for step in ctx.zch or []:
            if step.reassigned.numel() == 0:  # a shape: known on the host
                continue
            at = torch.searchsorted(step.reassigned, ctx.recv_ids).clamp_(max=step.reassigned.numel() - 1)
            was_reset = (ctx.recv_table == step.table) & (step.reassigned.index_select(0, at) == ctx.recv_ids)
            # not resets[was_reset] =: a host sync on CUDA
            resets = torch.where(was_reset, step.reassigned_ids.index_select(0, at), resets)
        bits = torch.stack([keys, resets], dim=1).contiguous().view(torch.float32)
        return torch.cat([rows, bits], dim=1)

    def take_row_notes(self, ctx: DistContext, received: torch.Tensor) -> torch.Tensor:
        """(requester) Rows of a ``row_notes`` buffer, keeping the keys and reset ids in ``ctx``."""
        if not self.has_zch:
            return received
        notes = received[:, self.dim :].contiguous().view(torch.int64)
        ctx.send_keys, ctx.send_reset_ids = notes[:, 0].contiguous(), notes[:, 1].contiguous()
        return received[:, : self.dim]

    def fresh_rows(self, ctx: DistContext, rows: torch.Tensor) -> torch.Tensor:
        """(requester) ``rows`` in send order with every row reset in this batch replaced by its new
        value, computed here (PEC prefetched it before the owner's reset). Every row's value is computed
        from its reset id and kept where it was reset (in place): fixed shapes, no host sync."""
        if ctx.send_reset_ids is None:
            return rows
        _, _, tables = self.send_layout(ctx)
        reset, ids = ctx.send_reset_ids >= 0, ctx.send_reset_ids.clamp(min=0)
        for t, shard in enumerate(self.zch):
            if shard is None:
                continue
            fresh = shard.reset_values(ids, self.dim).to(rows.dtype)
            rows.copy_(torch.where((reset & (tables == t))[:, None], fresh, rows))
        return rows
