"""Stage 1 of the sharded tables (``sharded.py``), the input distribution: unique ids per table bucketed by
owner, then an all-to-all of counts and one of ids (with each rank's int64 note appended), resumable
in three parts (``PendingInputDist``) so a step can run it for the next batch; ``DistContext`` is what
the later stages route by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from freescale.trainer.engines.comm import TimedHandle, TimedTransport
from freescale.trainer.engines.jagged_ids import split_features
from freescale.trainer.engines.table_layout import TableSpec
from freescale.trainer.engines.zch_shard import ZchShard, ZchStep


def host_ints(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 ``values`` (host numbers) on ``device`` without draining its stream: ``torch.tensor(values,
    device=cuda)`` copies blocking (the stream synchronizes first); a non-blocking copy from pageable
    memory is staged at once and queued."""
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def source_ranks(splits: list[int], device: torch.device) -> torch.Tensor:
    """The peer of every entry of a buffer segmented by peer (``splits``: entries per rank); the output
    size is given, so CUDA needs no host read."""
    peers = torch.arange(len(splits), device=device)
    return torch.repeat_interleave(peers, host_ints(splits, device), output_size=sum(splits))


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
    send_reset_ids: torch.Tensor | None = None  # requester, zch: raw id a send position's row was reset for (-1: none)


class PendingInputDist:
    """An input distribution in flight (``RowWiseShardedTables.start_input_dist``)."""

    def __init__(
        self,
        tables: InputDistribution,
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
            send_splits, recv_splits = self._splits
            counts = self._recv_counts.flatten().to(tables.device)
            recv_table = torch.repeat_interleave(table_ids, counts, output_size=sum(recv_splits))
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
    ends = host_ints([sum(splits[: r + 1]) + r * n for r in range(w)], device)
    out[(ends[:, None] + torch.arange(n, device=device)).flatten()] = note.repeat(w)
    return out


def split_notes(received: torch.Tensor, id_counts: list[int], note_counts: list[int]) -> tuple[torch.Tensor, list]:
    """(received ids, per source its note) of a buffer laid out by ``append_notes``."""
    if not any(note_counts):
        return received, [received.new_zeros(0) for _ in id_counts]
    pieces = torch.split(received, [c for pair in zip(id_counts, note_counts) for c in pair])
    return torch.cat(pieces[0::2]), list(pieces[1::2])


class InputDistribution:
    """``RowWiseShardedTables``' input distribution (a mixin: the attributes are the tables')."""

    specs: list[TableSpec]
    world_size: int
    device: torch.device
    comm: TimedTransport
    rows_per_rank: list[int]
    table_of: dict[str, int]
    zch: list[ZchShard | None]

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
            note = torch.cat([note.to(torch.int64), torch.full((1,), clock, dtype=torch.int64, device=self.device)])
        per_feature = split_features(features)
        unknown = sorted(set(per_feature) - set(self.table_of))
        if unknown:
            raise ValueError(f"features {unknown} have no table; known: {sorted(self.table_of)}")
        unique, owners, feature_index = self._unique_per_table(per_feature)
        send_ids, send_position, counts = self._bucket_by_owner(unique, owners)
        splits = [len(self.specs) + 1] * self.world_size
        header = torch.cat([counts, counts.new_full((self.world_size, 1), note.numel())], dim=1)
        counts_handle = comm.start("input_dist.counts", header.flatten(), splits, splits)
        send_ids = append_notes(send_ids, counts.sum(1).tolist(), note.to(torch.int64))
        return PendingInputDist(
            self, comm, feature_index, unique, send_position, send_ids, counts, note, counts_handle, train
        )

    def _unique_per_table(
        self, per_feature: dict[str, torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], dict]:
        """Per table its unique ids ordered by owner and their owners; per feature (table, index into them)."""
        grouped: list[list[str]] = [[] for _ in self.specs]
        for feature in per_feature:
            grouped[self.table_of[feature]].append(feature)
        unique, owners, feature_index = [], [], {}
        for t, names in enumerate(grouped):
            ids = [per_feature[name].to(self.device, torch.int64) for name in names]
            ids_all = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64, device=self.device)
            high = self.specs[t].rows if self.zch[t] is None else None
            if ids_all.numel():
                lowest, highest = torch.stack([ids_all.min(), ids_all.max()]).tolist()  # one host read
                if lowest < 0 or (high is not None and highest >= high):
                    raise ValueError(f"table {self.specs[t].name}: ids must be in [0, {high or 'inf'})")
            table_unique, inverse = torch.unique(ids_all, sorted=True, return_inverse=True)
            table_unique, inverse, owner = self._by_owner(t, table_unique, inverse)
            unique.append(table_unique)
            owners.append(owner)
            for name, part in zip(names, torch.split(inverse, [i.numel() for i in ids])):
                feature_index[name] = (t, part)
        return unique, owners, feature_index

    def owner_of(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """The rank holding each id of table ``t``: its row's shard, or (zch) its bucket's."""
        if self.world_size == 1:
            return torch.zeros_like(ids)
        shard = self.zch[t]
        if shard is not None:
            return shard.owner(ids)
        return torch.div(ids, self.rows_per_rank[t], rounding_mode="floor")

    def _by_owner(
        self, t: int, unique: torch.Tensor, inverse: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, inverse, owner of each id): sorted unique ids of a zch table reordered owner by owner
        (ascending within each owner), so each owner's ids are a slice as for exact ids (whose owners
        ascend with the ids)."""
        owner = self.owner_of(t, unique)
        if self.zch[t] is None or unique.numel() == 0 or self.world_size == 1:  # already by owner (exact ids; one rank)
            return unique, inverse, owner
        owner, order = torch.sort(owner, stable=True)
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel(), device=order.device)
        return unique[order], position[inverse], owner

    def _bucket_by_owner(
        self, unique: list[torch.Tensor], owners: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Send buffer ordered (owner, table); unique ids ordered by owner make each (owner, table) a slice."""
        counts = torch.zeros(self.world_size, len(self.specs), dtype=torch.int64, device=self.device)
        for t, owner in enumerate(owners):
            counts[:, t] = torch.bincount(owner, minlength=self.world_size)
        starts = torch.cumsum(counts.flatten(), 0) - counts.flatten()
        send_position = []
        for t, (ids, owner) in enumerate(zip(unique, owners, strict=True)):
            first_of_owner = torch.cumsum(counts[:, t], 0) - counts[:, t]
            rank_in_owner = torch.arange(ids.numel(), device=self.device) - first_of_owner[owner]
            send_position.append(starts.view(self.world_size, -1)[owner, t] + rank_in_owner)
        send_ids = torch.empty(int(counts.sum()), dtype=torch.int64, device=self.device)
        for ids, position in zip(unique, send_position):
            send_ids[position] = ids
        return send_ids, send_position, counts
