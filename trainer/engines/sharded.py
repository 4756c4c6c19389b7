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
reset step back (``row_notes``: two int64 as four more float32 columns), so requesters know which
row each raw id got: PEC addresses gradients by row and recomputes reset rows it prefetched,
evaluation ranks by row. With ttl, the step's event time rides as the last element of the routing
note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from freescale.kernels.zch import ZchConfig
from freescale.kernels.zch_rows import reset_rows
from freescale.trainer.config import OptimizerConfig
from freescale.trainer.engines.comm import TimedHandle, TimedTransport
from freescale.trainer.engines.sparse_optim import SparseOptimizer, make_sparse_optimizer, sum_by_row
from freescale.trainer.engines.zch_shard import ZchShard, ZchStep

INIT_CHUNK_ROWS = 4096


@dataclass
class TableSpec:
    """One embedding table and the features that read it."""

    name: str
    rows: int
    dim: int
    features: tuple[str, ...]
    zch: ZchConfig | None = None  # a zero-collision table: rows = zch_size + world_size (zch_shard.py)


@dataclass
class JaggedIds:
    """Keyed jagged ids (the subset of ``KeyedJaggedTensor`` this module needs).

    ``value_tensor`` holds every key's ids back to back and ``length_list`` counts them per *key*,
    not per sample: a table lookup needs no sample structure, and a TorchRec ``KeyedJaggedTensor``
    can stand in for it unchanged. Per-sample jagged data has its own containers:
    ``jagged.JaggedLayout`` (the attention layout, no values) and ``kernels.dispatch.JaggedRows``
    (per-sample rows moved between ranks).
    """

    key_list: list[str]
    value_tensor: torch.Tensor
    length_list: list[int]  # ids per key

    def keys(self) -> list[str]:
        return self.key_list

    def values(self) -> torch.Tensor:
        return self.value_tensor

    def length_per_key(self) -> list[int]:
        return self.length_list


def split_features(features: Any) -> dict[str, torch.Tensor]:
    """Per-key id tensors of a ``JaggedIds`` or a TorchRec ``KeyedJaggedTensor``."""
    chunks = torch.split(features.values(), list(features.length_per_key()))
    return dict(zip(features.keys(), chunks))


def init_rows(seed: int, table_index: int, total_rows: int, lo: int, hi: int, dim: int) -> torch.Tensor:
    """Rows ``[lo, hi)`` of a table's initial weights, identical for every sharding of the table.

    Uniform(±sqrt(1/R)) like TorchRec's default, drawn per 4096-row chunk from a generator seeded by
    (seed, table, chunk): any rank can produce its shard, and a single process the whole table.
    """
    bound = (1.0 / total_rows) ** 0.5
    out = torch.empty(max(0, hi - lo), dim, dtype=torch.float32)
    for chunk in range(lo // INIT_CHUNK_ROWS, -(-hi // INIT_CHUNK_ROWS)):
        start = chunk * INIT_CHUNK_ROWS
        rows = min(INIT_CHUNK_ROWS, total_rows - start)
        generator = torch.Generator().manual_seed(seed * 1_000_003 + table_index * 7_919 + chunk)
        block = torch.rand(rows, dim, generator=generator) * (2 * bound) - bound
        a, b = max(lo, start), min(hi, start + rows)
        out[a - lo : b - lo] = block[a - start : b - start]
    return out


def shard_bounds(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """``torch.chunk`` row range of ``rank`` (the last shards may be short or empty)."""
    per_rank = -(-rows // world_size)
    return min(rows, rank * per_rank), min(rows, (rank + 1) * per_rank)


def source_ranks(splits: list[int], device: torch.device) -> torch.Tensor:
    """The peer of every entry of a buffer segmented by peer (``splits``: entries per rank)."""
    return torch.repeat_interleave(torch.arange(len(splits), device=device), torch.tensor(splits, device=device))


@dataclass
class DistContext:
    """What a step's later stages need to route rows and gradients back and forth."""

    feature_index: dict[str, tuple[int, torch.Tensor]]  # feature → (table, rows of the table's unique ids)
    unique: list[torch.Tensor]  # per table, sorted unique ids this rank asked for
    send_position: list[torch.Tensor]  # per table: where each unique id sits in the send buffer
    send_splits: list[int]  # ids sent to each rank
    recv_splits: list[int]  # ids received from each rank
    recv_ids: torch.Tensor  # ids this rank owns and was asked for, src-major then table
    recv_table: torch.Tensor  # their table
    notes: list[torch.Tensor] | None = None  # per source rank, the int64 note it sent along (see start_input_dist)
    zch: list[ZchStep] | None = None  # owner, training: what each zero-collision table decided
    resets_applied: bool = False
    send_keys: torch.Tensor | None = None  # requester, zch: row key of each send position (from the rows' note)
    send_resets: torch.Tensor | None = None  # requester, zch: reset step of each send position's row, -1: none


class PendingInputDist:
    """An input distribution in flight (``RowWiseShardedTables.start_input_dist``)."""

    def __init__(
        self,
        tables: RowWiseShardedTables,
        comm: TimedTransport,
        feature_index: dict[str, tuple[int, torch.Tensor]],
        unique: list[torch.Tensor],
        send_position: list[torch.Tensor],
        send_ids: torch.Tensor,
        counts: torch.Tensor,
        note: torch.Tensor,
        counts_handle: TimedHandle,
        train: bool = False,
    ) -> None:
        self.tables, self.comm = tables, comm
        self.feature_index, self.unique, self.send_position = feature_index, unique, send_position
        self.send_ids, self.counts, self.note = send_ids, counts, note  # send_ids carry the note per destination
        self._counts_handle: TimedHandle | None = counts_handle
        self._ids_handle: TimedHandle | None = None
        self._recv_counts: torch.Tensor | None = None
        self._note_lengths: torch.Tensor | None = None
        self._splits: tuple[list[int], list[int]] = ([], [])
        self._ctx: DistContext | None = None
        self.train = train

    def route(self) -> PendingInputDist:
        """Wait for the counts, start the ids all-to-all (no-op when already routed)."""
        if self._counts_handle is not None:
            tables = self.tables
            received = self._counts_handle.wait().view(tables.world_size, len(tables.specs) + 1)
            self._counts_handle = None
            self._recv_counts, self._note_lengths = received[:, :-1], received[:, -1]
            send_splits, recv_splits = self.counts.sum(1).tolist(), self._recv_counts.sum(1).tolist()
            note = self.note.numel()
            with_notes = [n + note for n in send_splits], (received.sum(1)).tolist()
            self._ids_handle = self.comm.start("input_dist.ids", self.send_ids, *with_notes)
            self._splits = (send_splits, recv_splits)
        return self

    def finish(self) -> DistContext:
        """Wait for the ids; the step's routing context (idempotent)."""
        self.route()
        if self._ctx is None:
            assert self._ids_handle is not None and self._recv_counts is not None
            tables = self.tables
            recv_ids, notes = split_notes(self._ids_handle.wait(), self._splits[1], self._note_lengths.tolist())
            table_ids = torch.arange(len(tables.specs), device=tables.device).repeat(tables.world_size)
            recv_table = torch.repeat_interleave(table_ids, self._recv_counts.flatten().to(tables.device))
            send_splits, recv_splits = self._splits
            clock = None
            if tables.zch_clock(self.train):
                clock, notes = max(int(n[-1]) for n in notes), [n[:-1] for n in notes]
            has_notes = any(n.numel() for n in notes)
            self._ctx = DistContext(
                self.feature_index, self.unique, self.send_position, send_splits, recv_splits, recv_ids, recv_table,
                notes if has_notes else None,
            )  # fmt: skip
            tables.assign_rows(self._ctx, self.train, clock)
        return self._ctx


def append_notes(send_ids: torch.Tensor, splits: list[int], note: torch.Tensor) -> torch.Tensor:
    """The ids send buffer with ``note`` after each destination's ids (one copy, no per-rank loop)."""
    if not note.numel():
        return send_ids
    w, n = len(splits), note.numel()
    device = send_ids.device
    owner = source_ranks(splits, device)
    out = torch.empty(send_ids.numel() + w * n, dtype=torch.int64, device=device)
    out[torch.arange(send_ids.numel(), device=device) + owner * n] = send_ids
    ends = torch.cumsum(torch.tensor(splits, device=device), 0) + torch.arange(w, device=device) * n
    out[(ends[:, None] + torch.arange(n, device=device)).flatten()] = note.repeat(w)
    return out


def split_notes(received: torch.Tensor, id_counts: list[int], note_counts: list[int]) -> tuple[torch.Tensor, list]:
    """(received ids, per source its note) of a buffer laid out by ``append_notes``."""
    if not any(note_counts):
        return received, [received.new_zeros(0) for _ in id_counts]
    pieces = torch.split(received, [c for pair in zip(id_counts, note_counts) for c in pair])
    return torch.cat(pieces[0::2]), list(pieces[1::2])


class RowWiseShardedTables:
    """This rank's shards of several equal-width tables and their sparse optimizers."""

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
        self.weights = [
            init_rows(seed, t, spec.rows, lo, hi, self.dim).to(device)
            for t, (spec, (lo, hi)) in enumerate(zip(specs, self.bounds))
        ]
        self.optimizers: list[SparseOptimizer] = [
            make_sparse_optimizer(optimizer, hi - lo, self.dim, device) for lo, hi in self.bounds
        ]
        self.table_of = {feature: t for t, spec in enumerate(specs) for feature in spec.features}
        self.key_offsets = torch.tensor([0] + [spec.rows for spec in specs[:-1]], device=device).cumsum(0)
        self.zch = [
            None if spec.zch is None else ZchShard(spec.zch, rank, device, t, seed) for t, spec in enumerate(specs)
        ]
        for spec, shard in zip(specs, self.zch):
            if shard is not None and spec.rows != shard.rows_per_rank * world_size:
                raise ValueError(f"table {spec.name}: a zch table has zch_size + world_size rows, got {spec.rows}")

    # 1. input distribution -------------------------------------------------------------------
    @property
    def has_zch(self) -> bool:
        return any(shard is not None for shard in self.zch)

    def zch_clock(self, train: bool) -> bool:
        """Whether a training routing carries the step's event time (a ttl table needs it)."""
        return train and any(shard is not None and shard.config.policy == "ttl" for shard in self.zch)

    def input_dist(
        self, features: Any, comm: TimedTransport | None = None, note: torch.Tensor | None = None
    ) -> DistContext:
        """De-duplicate ids per table, send each owner the ids it holds (two all-to-alls).

        ``comm`` (default: the engine's transport) lets the PEC engine run this stage for the next
        batch on its communication thread's own process group; ``note``: see ``start_input_dist``.
        A read-only routing (evaluation): zero-collision tables insert nothing.
        """
        return self.start_input_dist(features, comm, note).route().finish()

    def start_input_dist(
        self,
        features: Any,
        comm: TimedTransport | None = None,
        note: torch.Tensor | None = None,
        train: bool = False,
        clock: int = 0,
    ) -> PendingInputDist:
        """The input distribution in three resumable parts, so a step can run it for the next batch
        while it computes the current one (TorchRec's pipeline schedule): this call buckets the ids
        and *starts* the counts all-to-all; ``route()`` waits for the counts and starts the ids
        all-to-all; ``finish()`` waits for the ids. Every rank must make the three calls in the same
        order relative to its other collectives on ``comm``.

        ``note``: a small int64 vector every rank receives from this one with its routing (in
        ``DistContext.notes``, per source): the online balancer's sample lengths travel this way
        instead of in collectives of their own. Its length rides as one more column of the counts.

        ``train``: zero-collision tables insert and evict (the training step's routing); ``clock``:
        this micro-batch's latest event time (ttl tables: the step's clock is the max over ranks).
        """
        comm = comm or self.comm
        note = torch.zeros(0, dtype=torch.int64, device=self.device) if note is None else note.to(self.device)
        if self.zch_clock(train):
            note = torch.cat([note.to(torch.int64), torch.tensor([clock], dtype=torch.int64, device=self.device)])
        per_feature = split_features(features)
        unknown = sorted(set(per_feature) - set(self.table_of))
        if unknown:
            raise ValueError(f"features {unknown} have no table; known: {sorted(self.table_of)}")
        unique, feature_index = self._unique_per_table(per_feature)
        send_ids, send_position, counts = self._bucket_by_owner(unique)
        splits = [len(self.specs) + 1] * self.world_size
        header = torch.cat([counts, counts.new_full((self.world_size, 1), note.numel())], dim=1)
        counts_handle = comm.start("input_dist.counts", header.flatten(), splits, splits)
        send_ids = append_notes(send_ids, counts.sum(1).tolist(), note.to(torch.int64))
        return PendingInputDist(
            self, comm, feature_index, unique, send_position, send_ids, counts, note, counts_handle, train
        )

    def _unique_per_table(self, per_feature: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], dict]:
        grouped: list[list[str]] = [[] for _ in self.specs]
        for feature in per_feature:
            grouped[self.table_of[feature]].append(feature)
        unique, feature_index = [], {}
        for t, names in enumerate(grouped):
            ids = [per_feature[name].to(self.device, torch.int64) for name in names]
            ids_all = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64, device=self.device)
            high = self.specs[t].rows if self.zch[t] is None else None
            if ids_all.numel() and (int(ids_all.min()) < 0 or (high is not None and int(ids_all.max()) >= high)):
                raise ValueError(f"table {self.specs[t].name}: ids must be in [0, {high or 'inf'})")
            table_unique, inverse = torch.unique(ids_all, sorted=True, return_inverse=True)
            table_unique, inverse = self._by_owner(t, table_unique, inverse)
            unique.append(table_unique)
            for name, part in zip(names, torch.split(inverse, [i.numel() for i in ids])):
                feature_index[name] = (t, part)
        return unique, feature_index

    def owner_of(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """The rank holding each id of table ``t``: its row's shard, or (zch) its bucket's."""
        shard = self.zch[t]
        if shard is not None:
            return shard.owner(ids)
        return torch.div(ids, self.rows_per_rank[t], rounding_mode="floor")

    def _by_owner(self, t: int, unique: torch.Tensor, inverse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sorted unique ids of a zch table reordered owner by owner (ascending within each owner), so each
        owner's ids are a slice as for exact ids (whose owners ascend with the ids)."""
        if self.zch[t] is None or unique.numel() == 0:
            return unique, inverse
        order = torch.sort(self.owner_of(t, unique), stable=True).indices
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel(), device=order.device)
        return unique[order], position[inverse]

    def _bucket_by_owner(self, unique: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Send buffer ordered (owner, table); unique ids ordered by owner make each (owner, table) a slice."""
        counts = torch.zeros(self.world_size, len(self.specs), dtype=torch.int64, device=self.device)
        owners = []
        for t, ids in enumerate(unique):
            owner = self.owner_of(t, ids)
            owners.append(owner)
            counts[:, t] = torch.bincount(owner, minlength=self.world_size)
        starts = torch.cumsum(counts.flatten(), 0) - counts.flatten()
        send_position = []
        for t, (ids, owner) in enumerate(zip(unique, owners)):
            first_of_owner = torch.cumsum(counts[:, t], 0) - counts[:, t]
            rank_in_owner = torch.arange(ids.numel(), device=self.device) - first_of_owner[owner]
            send_position.append(starts.view(self.world_size, -1)[owner, t] + rank_in_owner)
        send_ids = torch.empty(int(counts.sum()), dtype=torch.int64, device=self.device)
        for ids, position in zip(unique, send_position):
            send_ids[position] = ids
        return send_ids, send_position, counts

    # zero-collision tables: the owner's lookup and resets -------------------------------------
    def assign_rows(self, ctx: DistContext, train: bool, clock: int | None = None) -> None:
        """(owner) Raw ids of zch tables → global rows, in place in ``ctx.recv_ids``; in training the
        tables insert and evict (every zch table is looked up, even without ids: its step advances)."""
        if not self.has_zch:
            return
        steps = []
        for t, shard in enumerate(self.zch):
            if shard is None:
                continue
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
            values = shard.reset_values(step.reassigned, step.step, self.dim)
            local = step.reassigned - self.bounds[step.table][0]
            reset_rows(weight, local, self.optimizers[step.table].state, values=values)
            shard.trained()
        ctx.resets_applied = True

    def row_notes(self, ctx: DistContext, rows: torch.Tensor) -> torch.Tensor:
        """(owner) ``rows`` with each row's key and reset step (-1: none) as int64 bits, zch only."""
        if not self.has_zch:
            return rows
        keys, resets = self.row_keys(ctx), torch.full_like(ctx.recv_ids, -1)
        for step in ctx.zch or []:
            was_reset = (ctx.recv_table == step.table) & torch.isin(ctx.recv_ids, step.reassigned)
            resets[was_reset] = step.step
        bits = torch.stack([keys, resets], dim=1).contiguous().view(torch.float32)
        return torch.cat([rows, bits], dim=1)

    def take_row_notes(self, ctx: DistContext, received: torch.Tensor) -> torch.Tensor:
        """(requester) Rows of a ``row_notes`` buffer, keeping the keys and reset steps in ``ctx``."""
        if not self.has_zch:
            return received
        notes = received[:, self.dim :].contiguous().view(torch.int64)
        ctx.send_keys, ctx.send_resets = notes[:, 0].contiguous(), notes[:, 1].contiguous()
        return received[:, : self.dim]

    def fresh_rows(self, ctx: DistContext, rows: torch.Tensor) -> torch.Tensor:
        """(requester) ``rows`` in send order with every row reset in this batch replaced by its new
        value, computed here (PEC prefetched it before the owner's reset)."""
        if ctx.send_resets is None or not bool((ctx.send_resets >= 0).any()):
            return rows
        keys, _, tables = self.send_layout(ctx)
        for t, shard in enumerate(self.zch):
            if shard is None:
                continue
            for step in torch.unique(ctx.send_resets[(tables == t) & (ctx.send_resets >= 0)]).tolist():
                where = (tables == t) & (ctx.send_resets == step)
                rows[where] = shard.reset_values(keys[where] - self.key_offsets[t], step, self.dim)
        return rows

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

    def owned_by_me(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask of the keys whose row lives on this rank, their table)."""
        table = torch.searchsorted(self.key_offsets, keys, right=True) - 1
        local = keys - self.key_offsets[table]
        lo = torch.tensor([b[0] for b in self.bounds], device=self.device)[table]
        hi = torch.tensor([b[1] for b in self.bounds], device=self.device)[table]
        return (local >= lo) & (local < hi), table

    # 2. lookup ------------------------------------------------------------------------------------
    def lookup(self, ctx: DistContext, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Rows of the received ids (those where ``mask``, if given) from the local shards, in receive order."""
        ids, tables = ctx.recv_ids, ctx.recv_table
        if mask is not None:
            ids, tables = ids[mask], tables[mask]
        rows = torch.empty(ids.numel(), self.dim, dtype=torch.float32, device=self.device)
        for t, weight in enumerate(self.weights):
            in_table = tables == t
            rows[in_table] = weight[ids[in_table] - self.bounds[t][0]]
        return rows

    # 3. output distribution ----------------------------------------------------------------------
    def output_dist(self, ctx: DistContext, rows: torch.Tensor) -> list[torch.Tensor]:
        """Send rows back; returns per table the rows of this rank's unique ids (plain tensors)."""
        payload = self.row_notes(ctx, rows)
        received = self.comm.all_to_all("embedding_comm.rows", payload, ctx.recv_splits, ctx.send_splits)
        received = self.take_row_notes(ctx, received)
        return [received[position] for position in ctx.send_position]

    @staticmethod
    def feature_rows(ctx: DistContext, unique_rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per feature, one row per id (differentiable w.r.t. ``unique_rows``)."""
        return {name: unique_rows[t][index] for name, (t, index) in ctx.feature_index.items()}

    # 5. gradient distribution --------------------------------------------------------------------
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

    # 6. sparse update ----------------------------------------------------------------------------
    def sparse_update(self, ctx: DistContext, grads: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Sum duplicate rows' gradients (several requesters) and step each table's optimizer.

        With ``mask``, only the received ids where it is set are updated and ``grads`` holds just
        theirs (in receive order). Every requester's gradient of one row is in the same part, summed
        in the same order, so updating a row in a later part gives bitwise the same row.
        """
        ids, tables = ctx.recv_ids, ctx.recv_table
        if mask is not None:
            ids, tables = ids[mask], tables[mask]
        for t, (weight, optimizer) in enumerate(zip(self.weights, self.optimizers)):
            in_table = tables == t
            rows, summed = sum_by_row(ids[in_table] - self.bounds[t][0], grads[in_table])
            optimizer.step(weight, rows, summed)

    def sparse_update_keys(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """``sparse_update`` for gradients addressed by row key (all rows owned by this rank)."""
        _, table = self.owned_by_me(keys)
        for t, (weight, optimizer) in enumerate(zip(self.weights, self.optimizers)):
            in_table = table == t
            local = keys[in_table] - self.key_offsets[t] - self.bounds[t][0]
            rows, summed = sum_by_row(local, grads[in_table])
            optimizer.step(weight, rows, summed)

    def state_rows(self, ctx: DistContext, mask: torch.Tensor) -> torch.Tensor:
        """Optimizer state of the received ids where ``mask`` is set, packed one row per id."""
        ids, tables = ctx.recv_ids[mask], ctx.recv_table[mask]
        width = self.optimizers[0].state_width(self.dim)
        packed = torch.empty(ids.numel(), width, dtype=torch.float32, device=self.device)
        for t, optimizer in enumerate(self.optimizers):
            in_table = tables == t
            packed[in_table] = optimizer.pack(optimizer.state_rows(ids[in_table] - self.bounds[t][0]))
        return packed

    # checkpointing ---------------------------------------------------------------------------
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
