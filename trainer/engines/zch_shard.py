"""A rank's part of a zero-collision id table in training (docs/training.md#open-id-spaces-ids--zch).

Row-wise sharding by bucket: with ``W`` ranks, rank ``r`` owns buckets ``[r·B/W, (r+1)·B/W)`` of the
table's identity table (``kernels.zch.ZchTable(config, rank=r)``) *and* their embedding rows, followed
by a fallback row of its own: the embedding table has ``zch_size + W`` rows, ``zch_size / W + 1`` per
rank, the ``torch.chunk`` layout of ``sharded.py``. A raw id hashes to its bucket, so to its owner;
the input distribution sends it there, the owner looks it up (training: inserts and evicts) and from
then on the step addresses the row, never the raw id.

``ZchShard`` is that owner side: the owner of each raw id, the lookup with an undo record of the last
training call (a checkpoint taken while the next batch's lookup is already done, PEC's prefetch or the
engine's read-ahead routing, must hold the table as of the trained batches only), the new values of
reassigned rows and the per-rank state a DCP checkpoint holds.

A reassigned row starts from ``zch_rows.hashed_uniform`` keyed by (engine seed, table, the raw id it
now holds): owner and readers of the row compute the same bits, and an id starts from the same
vector whatever slot, table size, bucket layout or world size placed it (and again after an eviction),
so placement never changes what a model learns from an id it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freescale.kernels.zch import ZchTable
from freescale.kernels.zch_hash import bucket_and_home
from freescale.kernels.zch_rows import hashed_uniform
from freescale.kernels.zch_types import Overwritten, ZchConfig
from freescale.trainer.table_config import ZchOptions

FALLBACK_KEY = -1  # the key of the fallback rows' initial value (raw ids are >= 0: no id has it)
STATE = ("identities", "last_seen", "counts", "pending_ids", "pending_counts", "counters", "step")
SHARDED_STATE = ("identities", "last_seen", "counts")  # one entry per slot: pieces of one global tensor


def zch_config(options: ZchOptions, world_size: int) -> ZchConfig:
    """A table's ``ZchConfig`` from its ``zch_*`` options (``[model_extra]`` or ``[user_tables.<feature>]``)."""
    return ZchConfig(
        zch_size=options.zch_size,
        bucket_size=options.zch_bucket_size,
        max_probe=options.zch_max_probe or options.zch_bucket_size,  # 0: the whole bucket
        policy=options.zch_policy,
        ttl=options.zch_ttl if options.zch_policy == "ttl" else None,
        admission_threshold=options.zch_admission_threshold,
        lfu_halflife=options.zch_lfu_halflife,
        world_size=world_size,
    )


@dataclass
class ZchStep:
    """What one owner decided for one table of one batch (kept in the batch's ``DistContext``)."""

    table: int
    reassigned: torch.Tensor  # global rows given to a new id, ascending: reset before the batch trains
    reassigned_ids: torch.Tensor  # the raw id each of them now holds: the key of its reset values
    stats: torch.Tensor  # int64 [len(kernels.zch_types.COUNTERS)] of this call
    occupied: torch.Tensor  # int64 []: slots holding an id after the call (read with stats, by the metrics)
    slots: int


@dataclass
class Undo:
    """What the last training lookup wrote, as it was before it (``kernels.zch_types.Overwritten``), and the
    running counters and step."""

    overwritten: Overwritten
    counters: torch.Tensor
    step: torch.Tensor


class ZchShard:
    """This rank's buckets of one zero-collision table: identity table, undo record, reset values."""

    def __init__(self, config: ZchConfig, rank: int, device: torch.device, table: int, seed: int, bound: float) -> None:
        self.config, self.rank, self.index, self.seed = config, rank, table, seed
        self.table = ZchTable(config, device, rank)
        self.rows_per_rank = self.table.slots + 1
        self.first_row = rank * self.rows_per_rank  # global row of this shard's first slot
        self.bound = bound  # the table's initial range (TableSpec.bound): reset rows start there
        self.layout = torch.tensor(config.layout, dtype=torch.int64, device=device)
        self.ahead = False  # the last training lookup was for a batch that has not trained yet
        self._undo: Undo | None = None
        self._view: ZchTable | None = None  # the trained state, for evaluation while a lookup is ahead

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        """The rank owning each raw id's bucket."""
        cfg = self.config
        bucket, _ = bucket_and_home(ids, cfg.num_buckets, cfg.bucket_size)
        return torch.div(bucket, cfg.num_buckets // cfg.world_size, rounding_mode="floor")

    def lookup(self, ids: torch.Tensor, clock: int | None, train: bool) -> tuple[torch.Tensor, ZchStep | None]:
        """Global rows of ``ids`` (all of this rank's buckets); in training also what changed.

        ``clock``: the step's event time (policy ttl), every id of the step seen at it.
        """
        if not train:
            result = self.trained_table().lookup(ids, train=False)
            return result.rows + self.first_row, None
        times = torch.full_like(ids, clock) if self.config.policy == "ttl" and clock is not None else None
        counters, table_step = self.table.counters.clone(), self.table.step.clone()
        result = self.table.lookup(ids, times, train=True)
        assert result.step is not None and result.overwritten is not None
        self._undo, self._view, self.ahead = Undo(result.overwritten, counters, table_step), None, True
        occupied = self.table.occupied()
        holders = self.table.identities.index_select(0, result.reassigned)
        step = ZchStep(
            self.index, result.reassigned + self.first_row, holders, result.stats, occupied, self.table.slots
        )
        return result.rows + self.first_row, step

    def item_rows(self) -> torch.Tensor:
        """bool per row of this shard: whether it stands for an item (a slot holding an id in the trained
        state; empty slots and the fallback row stand for none)."""
        held = self.trained_table().identities >= 0
        return torch.cat([held, held.new_zeros(1)])

    def is_fallback(self, rows: torch.Tensor) -> torch.Tensor:
        """bool per global row of the table (any rank's): whether it is a rank's fallback row, the row of
        every id a read-only lookup does not find."""
        return rows % self.rows_per_rank == self.rows_per_rank - 1

    def trained(self) -> None:
        """The batch looked up ahead starts training: its lookup is part of the trained state now."""
        self.ahead, self._view = False, None

    def trained_table(self) -> ZchTable:
        """The table evaluation reads: as of the trained batches, like a checkpoint (PEC's prefetch and
        the end of training look the next batch up early; evaluation must not see its ids)."""
        if not self.ahead:
            return self.table
        if self._view is None:
            self._view = ZchTable(self.config, self.table.device, self.rank)
            for name, tensor in self.trained_state().items():
                getattr(self._view, name).copy_(tensor)
        return self._view

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The identity table as of the batches trained so far (the live tensors when none is ahead)."""
        live = {name: getattr(self.table, name) for name in STATE}
        if not self.ahead or self._undo is None:
            return live
        undo, state = self._undo, {name: tensor.clone() for name, tensor in live.items()}
        before = undo.overwritten
        for name in SHARDED_STATE:
            state[name][before.slots] = getattr(before, name)
        state["pending_ids"][before.pending] = before.pending_ids
        state["pending_counts"][before.pending] = before.pending_counts
        state["counters"], state["step"] = undo.counters.clone(), undo.step.clone()
        return state

    def reset_values(self, ids: torch.Tensor, dim: int) -> torch.Tensor:
        """New embeddings of rows reassigned to raw ``ids``: the same bits wherever computed (the owner's
        shard, a PEC reader's prefetched copy) and wherever the id was placed."""
        return hashed_uniform(ids, dim, bound=self.bound, seed=self.seed, table=self.index)

    def fallback_values(self, dim: int) -> torch.Tensor:
        """[dim] initial value of this rank's fallback row: keyed like a reset row, by ``FALLBACK_KEY``, so
        every rank's fallback row, in any table size or world size, starts from the same vector."""
        key = torch.full((1,), FALLBACK_KEY, dtype=torch.int64, device=self.table.device)
        return self.reset_values(key, dim)[0]

    def check_layout(self) -> None:
        """After a checkpoint load: the saved table was hashed and bucketed like this one."""
        if not torch.equal(self.layout.cpu(), torch.tensor(self.config.layout)):
            raise ValueError(
                f"zch: checkpoint layout (hash version, zch_size, bucket_size, admission slots) "
                f"{tuple(self.layout.tolist())} differs from this run's {self.config.layout} (model_extra.zch_*)"
            )
