"""Zero-collision identity tables (MPZCH) for open id spaces: vectorised torch, CPU and CUDA.

A ``ZchTable`` maps raw int64 ids to rows of an embedding table of ``zch_size`` rows (plus one shared
fallback row) without a vocabulary: an id hashes to a bucket of contiguous rows and a home slot in it,
probes up to ``max_probe`` slots from there (wrapping inside the bucket), and either finds itself
(hit), takes the first empty slot (insert), evicts the policy's victim among the probed slots, or,
when nothing may be evicted, uses the fallback row (collision). The rules, and the order in which a
batch's ids compete, are in docs/design.md#open-id-spaces-mpzch; ``zch_reference.ReferenceZchTable``
implements them as a plain per-id loop and is the parity oracle of this file.

In training each rank holds the table of its own buckets (``ZchTable(config, rank=r)``: a shard), the
engine routes every raw id to its bucket's owner and resets the returned ``reassigned`` rows with
``zch_rows.reset_rows`` (embedding and optimizer state): docs/design.md#open-id-spaces-mpzch. The
configuration and the result types are in ``zch_types``.
"""

from __future__ import annotations

import os

import torch

from .triton_support import triton_unavailable_reason
from .zch_hash import bucket_and_home, pending_slot
from .zch_rounds import INT64_MAX, Rounds, SortedCalls, masked_put, sort_calls, take
from .zch_triton import BucketState, group_by_bucket, look_up_in_kernel, place_in_rounds
from .zch_types import COUNTERS, Overwritten, ZchConfig, ZchLookup, check_ids


def env_flag(name: str) -> bool | None:
    """An on/off environment override: unset or empty None, "1" True, "0" False, anything else an error."""
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}: must be 0 or 1 (or unset), got {value!r}")
    return None if value == "" else value == "1"


# On CPU a host read costs nothing, so a data-dependent size is cheaper than masked work over fixed shapes:
# ``HOST_SHORTCUTS`` lets a CPU table take the shortcuts below (the tests turn it off to check the masked
# path a GPU runs: the same rows, counters and state; FREESCALE_ZCH_HOST_SHORTCUTS=0 for a whole run).
HOST_SHORTCUTS = env_flag("FREESCALE_ZCH_HOST_SHORTCUTS") is not False
COMPACT_MIN_ROWS = 4096  # CPU: rounds over at least this many ids compact to the live ones (ZchTable._place)
READ_CHUNK = 4096  # CPU: ids probing their windows at once when hits are read home first (ZchTable._find_from_home)
FIRST_ROUNDS = 2  # proposal rounds before the first host read: most calls settle in two (docs: ZchTable._place)
# A training call in the Triton kernel (``zch_triton``: the whole call without admission, else the proposal
# rounds) instead of the masked torch path: None picks it on CUDA, where the masked path's launches are the
# cost; True forces it (the tests, on CPU through TRITON_INTERPRET=1); FREESCALE_ZCH_KERNEL=0 / 1 for a run.
TRITON_KERNEL: bool | None = env_flag("FREESCALE_ZCH_KERNEL")


class ZchTable:
    """The identity table of one embedding table (or of one rank's buckets of it), with its metadata.

    ``rank``: this table holds only rank ``rank``'s ``num_buckets / world_size`` consecutive buckets (its
    shard of the rows; default None: the whole table). Ids hash exactly as in the whole table; rows are
    shard-local: ``slots`` slots, then the shard's own fallback row ``fallback_row``.

    State (all tensors, ``state_dict`` order): ``identities`` (raw id per slot, -1 empty), ``last_seen``
    (event time for ttl, lookup-call number for lru and lfu), ``counts`` (occurrences since the id took
    the slot, with its admission count), ``pending_ids``/``pending_counts`` (lfu admission), running
    ``counters`` (``COUNTERS``), ``step`` (training lookup calls) and ``layout``.
    """

    def __init__(self, config: ZchConfig, device: torch.device | str | None = None, rank: int | None = None) -> None:
        if rank is not None and not 0 <= rank < config.world_size:
            raise ValueError(f"zch: rank {rank} outside world_size {config.world_size}")
        self.config, self.rank = config, rank
        shards = 1 if rank is None else config.world_size
        self.slots = config.zch_size // shards  # rows holding ids in this table (shard)
        self.fallback_row = self.slots  # the shard's fallback row: its last (config.fallback_row unsharded)
        self.first_slot = (rank or 0) * self.slots  # global slot of this shard's first row
        device = torch.device(device or "cpu")
        i64 = {"dtype": torch.int64, "device": device}
        self.identities = torch.full((self.slots,), -1, **i64)
        self.last_seen = torch.zeros(self.slots, **i64)
        self.counts = torch.zeros(self.slots, **i64)
        self.pending_ids = torch.full((config.pending_size,), -1, **i64)
        self.pending_counts = torch.zeros(config.pending_size, **i64)
        self.counters = torch.zeros(len(COUNTERS), **i64)
        self.step = torch.zeros((), **i64)
        self._scratch: tuple[torch.Tensor, torch.Tensor] | None = None  # _host_scratch

    @property
    def device(self) -> torch.device:
        return self.identities.device

    @property
    def host_shortcuts(self) -> bool:
        """Whether data-dependent sizes are cheap here (CPU: ``HOST_SHORTCUTS``)."""
        return HOST_SHORTCUTS and self.device.type == "cpu"

    @property
    def triton_kernel(self) -> bool:
        """Whether training calls run in the Triton kernel instead of the masked torch path (``TRITON_KERNEL``)."""
        if TRITON_KERNEL is None:
            return self.device.type == "cuda" and triton_unavailable_reason(self.device) is None
        return TRITON_KERNEL

    def occupied(self) -> torch.Tensor:
        """int64 []: slots holding an id, from the running counters (slots never empty again: every insert
        fills one, every eviction re-fills one), without reading the identities."""
        return self.counters[COUNTERS.index("inserts")] - self.counters[COUNTERS.index("evictions")]

    def occupancy(self) -> float:
        return float(self.occupied()) / self.slots

    def counters_dict(self) -> dict[str, int]:
        return dict(zip(COUNTERS, self.counters.tolist(), strict=True))

    def window(self, ids: torch.Tensor) -> torch.Tensor:
        """[n, max_probe] shard slots each id probes, nearest first: its home slot, then onwards, wrapping
        in the bucket. An id of another rank's buckets is an error."""
        return self._probe_window(*self._locate(ids))

    def _locate(self, ids: torch.Tensor, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(shard slot of each id's bucket start, home slot inside the bucket); a negative id or another
        rank's id is an error, both read in one host sync (``check=False``: the caller checks later,
        ``_check_values``)."""
        cfg = self.config
        bucket, home = bucket_and_home(ids, cfg.num_buckets, cfg.bucket_size)
        if check and ids.numel():
            self._check_values(ids, bucket)
        return bucket * cfg.bucket_size - self.first_slot, home

    def _check_values(self, ids: torch.Tensor, bucket: torch.Tensor, also: torch.Tensor | None = None) -> int:
        """Raw ids are >= 0 and (a shard) of this rank's buckets: one host read for both, and for ``also``
        (an int64 device scalar the caller needs on the host: its value is returned, else 0)."""
        flags = [ids.min() < 0]
        if self.rank is not None:
            owner = bucket // (self.config.num_buckets // self.config.world_size)
            flags.append((owner != self.rank).any())
        read = torch.stack([flag.to(torch.int64) for flag in flags] + ([] if also is None else [also])).tolist()
        if read[0]:
            raise ValueError(f"ids: raw ids must be >= 0 (got {int(ids.min())}); -1 marks an empty slot")
        if self.rank is not None and read[1]:
            owner = bucket // (self.config.num_buckets // self.config.world_size)
            raise ValueError(
                f"zch: ids of rank {int(owner[owner != self.rank][0])}'s buckets looked up on rank {self.rank}"
            )
        return read[-1] if also is not None else 0

    def _probe_window(self, base: torch.Tensor, home: torch.Tensor) -> torch.Tensor:
        """``base + (home + probe) mod bucket_size`` for every probe; home < bucket_size and max_probe <=
        bucket_size, so a mask (a power-of-two bucket) or one conditional subtraction wraps (cheaper than
        ``%`` on int64)."""
        size = self.config.bucket_size
        within = home[:, None] + torch.arange(self.config.max_probe, dtype=torch.int64, device=home.device)
        if size & (size - 1) == 0:
            within &= size - 1
        else:
            within = torch.where(within >= size, within - size, within)
        return base[:, None] + within

    def _find(self, window: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hit, slot) of each id in its window: the slot holding it (an id is held at most once), or, not
        found, shard slot 0 (a valid index for the caller's masked reads)."""
        slot = torch.where(take(self.identities, window) == ids[:, None], window, -1).amax(dim=1)
        hit = slot >= 0
        return hit, slot.clamp(min=0)

    def _read(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, hit) of every id, reading only, every id's whole window at once (fixed shapes: no host sync
        but the id check); an id absent from its window gets the fallback row. A large call on CPU reads
        home slots first (``_find_from_home``): the same rows."""
        base, home = self._locate(ids)
        if self.host_shortcuts and ids.numel() >= COMPACT_MIN_ROWS:
            hit, slot = self._find_from_home(ids, base, home)
        else:
            hit, slot = self._find(self._probe_window(base, home), ids)
        return torch.where(hit, slot, self.fallback_row), hit

    def _find_from_home(self, ids: torch.Tensor, base: torch.Tensor, home: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(hit, slot) of each id, with data-dependent sizes (CPU); a miss's slot is some slot of the shard. An id is
        never held past an empty slot of its window (it took the nearest empty one, and slots never empty
        again), so a home slot holding the id is a hit and an empty one a miss. Only the other ids probe
        their windows, ``READ_CHUNK`` at a time: [chunk, max_probe] temporaries that stay in cache instead
        of [n, max_probe] ones."""
        slot = base + home
        held = take(self.identities, slot)
        hit = held == ids
        away = (~hit & (held >= 0)).nonzero().squeeze(1)
        for chunk in away.split(READ_CHUNK):
            window = self._probe_window(base.index_select(0, chunk), home.index_select(0, chunk))
            far_hit, far_slot = self._find(window, ids.index_select(0, chunk))
            hit.index_copy_(0, chunk, far_hit)
            slot.index_copy_(0, chunk, far_slot)
        return hit, slot

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor, times: torch.Tensor | None = None, *, train: bool = True) -> ZchLookup:
        """Rows of ``ids`` (any shape); in training also insert, evict and update metadata and counters.

        ``times``: event time (int64 seconds) per id; required in training under ttl, unused otherwise.
        ``train=False`` reads only: unknown ids get the fallback row and nothing in the table changes.
        Host syncs: one to check the ids, and in training one more per ``settle`` read (usually one).
        """
        check_ids(ids, times, values=False)
        flat = ids.reshape(-1).to(device=self.device, dtype=torch.int64)
        if not train:  # per id, no deduplication: nothing to insert, count or update
            rows, hit = self._read(flat)
            return ZchLookup(rows.reshape(ids.shape), empty_rows(self.device), read_stats(hit))
        if self.config.policy == "ttl" and times is None:
            raise ValueError("times: policy 'ttl' needs the event time of every id in training")
        in_kernel = self.triton_kernel and not self.host_shortcuts and not self.config.pending_size
        base, home = self._locate(flat, check=not in_kernel)  # the kernel path checks with its own host read
        step = self.step + 1
        calls = sort_calls(
            flat, times if self.config.policy == "ttl" else None, step, self.device, host_read=self.host_shortcuts
        )
        if not calls.in_call_order:
            base, home = base.index_select(0, calls.order), home.index_select(0, calls.order)
        if in_kernel:
            return self._look_up_in_kernel(ids.shape, calls, base, home)
        self.step.copy_(step)
        window = None  # every id's: the masked path's; with host shortcuts only the admitted ids' (_place)
        if self.host_shortcuts:
            hit, hit_slot = self._find_from_home(calls.ids, base, home)
        else:
            window = self._probe_window(base, home)
            hit, hit_slot = self._find(window, calls.ids)
        miss = calls.lead & ~hit
        counts_at_insert, admitted = calls.occurrences, miss
        pending = (empty_rows(self.device),) * 3  # admission entries the call may write, and their values
        if self.config.pending_size:
            counts_at_insert, admitted, pending = self._admission(calls, miss)
        placed, (count, step) = self._place((base, home, window), admitted, calls, hit, hit_slot)
        stats, rows, written = self._apply(calls, hit, hit_slot, placed, counts_at_insert, miss & ~admitted)
        if self.config.pending_size:
            self._admitted(calls.ids, pending[0], placed >= 0)
        reassigned = taken_slots(placed, count)
        if not calls.in_call_order:
            rows = torch.empty_like(rows).index_put_((calls.order,), rows)
        return ZchLookup(rows.reshape(ids.shape), reassigned, stats, step, Overwritten(*written, *pending))

    def _apply(
        self,
        calls: SortedCalls,
        hit: torch.Tensor,
        hit_slot: torch.Tensor,
        placed: torch.Tensor,
        counts_at_insert: torch.Tensor,
        waiting: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Write the hits' and the placed ids' metadata (one masked write per state tensor); (the call's
        stats, row of every sorted position, the slots written with their values before: ``Overwritten``)."""
        is_placed = placed >= 0
        target = torch.where(is_placed, placed, hit_slot)  # in the shard for every position
        held, seen, counts = take(self.identities, target), take(self.last_seen, target), take(self.counts, target)
        evicted = is_placed & (held >= 0)
        ages = torch.where(evicted, calls.clock - seen, 0)
        new_seen = calls.clock
        if self.config.policy == "ttl":
            new_seen = torch.where(is_placed, calls.clock, torch.maximum(seen, calls.clock))
        kept = self._decayed(counts, calls.clock - seen) + calls.occurrences  # a hit's count as of now, plus this call
        new_counts = torch.where(is_placed, counts_at_insert, kept)
        masked_put(
            (self.identities, self.last_seen, self.counts),
            target,
            (calls.ids, new_seen, new_counts),
            calls.lead & (hit | is_placed),
            compact=self.host_shortcuts,
        )
        row = torch.where(hit, hit_slot, torch.where(is_placed, placed, self.fallback_row))
        rows = row.index_select(0, calls.start)  # every position: its id's (lead's) row
        stats = call_stats(
            rows,
            hits=hit.sum(),
            inserts=is_placed.sum(),
            evictions=evicted.sum(),
            collisions=(rows == self.fallback_row).sum(),
            admission_waits=torch.where(waiting, calls.occurrences, 0).sum(),
            evicted_age_sum=ages.sum(),
        )
        self.counters += stats
        return stats, rows, (target, held, seen, counts)

    def _admission(
        self, calls: SortedCalls, miss: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Count the missing ids in the pending table; (count so far per id, admitted mask, the entries the
        call may write with their values before: ``Overwritten``'s pending part, ``_admitted``'s too).

        Each pending entry holds one id and its count. Ids of the call meet their entry in first-occurrence
        order: an id finding its own entry adds to it, any other replaces it, so only the first id of
        the call at an entry can find its own count there, and the entry ends holding the last one's.
        Masked, full-size: every position computes, only the missing ids' leads count.
        """
        size, device = self.config.pending_size, calls.ids.device
        ids, prio = calls.ids, calls.order
        slot = pending_slot(ids, size)
        lowest = torch.full((size,), INT64_MAX, dtype=torch.int64, device=device)
        lowest = lowest.scatter_reduce(0, slot, torch.where(miss, prio, INT64_MAX), "amin")
        highest = torch.full((size,), -1, dtype=torch.int64, device=device)
        highest = highest.scatter_reduce(0, slot, torch.where(miss, prio, -1), "amax")
        is_first = miss & (take(lowest, slot) == prio)
        is_last = miss & (take(highest, slot) == prio)
        pending_ids, pending_counts = take(self.pending_ids, slot), take(self.pending_counts, slot)
        own = is_first & (pending_ids == ids)
        seen = calls.occurrences + torch.where(own, pending_counts, 0)
        masked_put((self.pending_ids, self.pending_counts), slot, (ids, seen), is_last, compact=self.host_shortcuts)
        counts = torch.where(miss, seen, calls.occurrences)
        return counts, miss & (seen >= self.config.admission_threshold), (slot, pending_ids, pending_counts)

    def _admitted(self, ids: torch.Tensor, slot: torch.Tensor, placed: torch.Tensor) -> None:
        """Free the pending entries (``slot``: each id's) of ids that took a slot (an entry another id took
        over stays)."""
        mine = placed & (take(self.pending_ids, slot) == ids)
        cleared = (torch.full_like(ids, -1), torch.zeros_like(ids))
        masked_put((self.pending_ids, self.pending_counts), slot, cleared, mine, compact=self.host_shortcuts)

    def _place(
        self,
        probe: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        admitted: torch.Tensor,
        calls: SortedCalls,
        hit: torch.Tensor,
        hit_slot: torch.Tensor,
    ) -> tuple[torch.Tensor, list[int]]:
        """(slot taken by each admitted missing id, -1: none, the fallback row; [slots taken, table step])
        in proposal rounds. ``probe``: every sorted position's (bucket start, home slot, probe window); with
        the host shortcuts the window is None and only the admitted ids' windows are built (``_place_on_host``).

        Each round every id still unplaced proposes its best available slot (the first empty one by
        probe distance, else the policy's victim); a slot proposed by several goes to the id that
        occurred first; the others try again next round without the slots taken (by a hit of the call
        or in a round: ``claimed``). Every loss removes a slot from the loser's window, so ``max_probe + 1``
        rounds settle every id. The rounds run masked over fixed shapes, ``FIRST_ROUNDS`` then twice as
        many each time, with one host read after each run: whether an id may still propose, the slots
        taken, the table's step.
        """
        if self.host_shortcuts:
            return self._place_on_host(probe[:2], admitted, calls, hit, hit_slot)
        claimed = torch.zeros(self.slots, dtype=torch.int64, device=admitted.device)
        claimed = claimed.scatter_reduce(0, hit_slot, hit.to(torch.int64), "amax")
        if self.triton_kernel:
            return self._place_with_kernel(probe[:2], admitted, calls, claimed)
        window = probe[2]
        assert window is not None  # the masked path's caller built every id's
        rounds = self._rounds(window, admitted, calls.clock, calls.order, claimed)
        limit, done, run = self.config.max_probe + 1, 0, FIRST_ROUNDS
        while True:
            for _ in range(min(run, limit - done)):
                rounds.play(self.slots)
            done, run = done + min(run, limit - done), run * 2
            placed = rounds.result()
            more, count, step = torch.stack(
                [rounds.proposing().any().to(torch.int64), (placed >= 0).sum(), self.step]
            ).tolist()
            if not more or done == limit:
                return placed, [count, step]

    def _place_with_kernel(
        self,
        probe: tuple[torch.Tensor, torch.Tensor],
        admitted: torch.Tensor,
        calls: SortedCalls,
        claimed: torch.Tensor,
    ) -> tuple[torch.Tensor, list[int]]:
        """``_place`` by the Triton rounds kernel (``zch_triton``): the same slots in one launch, with
        one host read before it (the tile size) and one after (the slots taken, the table's step)."""
        base, home = probe
        placed = place_in_rounds(
            self._bucket_state(),
            bucket_local=torch.div(base, self.config.bucket_size, rounding_mode="floor"),
            home=home,
            clock=calls.clock,
            prio=calls.order,
            admitted=admitted,
            claimed=claimed,
        )
        count, step = torch.stack([(placed >= 0).sum(), self.step]).tolist()
        return placed, [count, step]

    def _look_up_in_kernel(
        self, shape: torch.Size, calls: SortedCalls, base: torch.Tensor, home: torch.Tensor
    ) -> ZchLookup:
        """A training call without admission with hits, rounds and metadata writes in the Triton kernel
        (``zch_triton.look_up_in_kernel``): the rows, counters and state of ``_find``, ``_place`` and
        ``_apply``, in one launch. Two host reads, as the masked path's: the id checks with the tile size
        before it, the slots taken and the table's step after it."""
        size = self.config.bucket_size
        bucket_local = torch.div(base, size, rounding_mode="floor")
        groups = group_by_bucket(calls.lead, bucket_local, self.slots // size)
        largest = 0
        if calls.ids.numel():
            largest = self._check_values(calls.ids, bucket_local + self.first_slot // size, groups.largest)
        self.step += 1
        out = look_up_in_kernel(
            self._bucket_state(),
            groups,
            largest,
            ids=calls.ids,
            occurrences=calls.occurrences,
            home=home,
            clock=calls.clock,
            prio=calls.order,
        )
        placed = out["placed"]
        taken = (placed >= 0).sum()
        rows = out["row"].index_select(0, calls.start)  # every position: its id's (lead's) row
        stats = call_stats(
            rows,
            hits=out["hit_occurrences"].sum(),
            inserts=taken,
            evictions=out["evicted"].sum(),
            collisions=(rows == self.fallback_row).sum(),
            evicted_age_sum=out["age"].sum(),
        )
        self.counters += stats
        count, step = torch.stack([taken, self.step]).tolist()
        reassigned = taken_slots(placed, count)
        if not calls.in_call_order:
            rows = torch.empty_like(rows).index_put_((calls.order,), rows)
        written = [out[name].index_select(0, calls.start) for name in ("slots", "identities", "last_seen", "counts")]
        pending = (empty_rows(self.device),) * 3
        return ZchLookup(rows.reshape(shape), reassigned, stats, step, Overwritten(*written, *pending))

    def _bucket_state(self) -> BucketState:
        cfg = self.config
        return BucketState(
            self.identities,
            self.last_seen,
            self.counts,
            bucket_size=cfg.bucket_size,
            max_probe=cfg.max_probe,
            policy=cfg.policy,
            ttl=cfg.ttl,
            halflife=cfg.lfu_halflife,
            fallback_row=self.fallback_row,
        )

    def _place_on_host(
        self,
        probe: tuple[torch.Tensor, torch.Tensor],
        admitted: torch.Tensor,
        calls: SortedCalls,
        hit: torch.Tensor,
        hit_slot: torch.Tensor,
    ) -> tuple[torch.Tensor, list[int]]:
        """``_place`` where a host read costs nothing (CPU), the same slots: only the admitted ids (a few per
        cent of a steady call's) take part, the rounds go on while an id is unplaced (a last round in which
        nobody can propose places nothing), and their table-sized buffers are the table's own scratch
        (``_host_scratch``), cleaned where the call wrote: a call costs the same in a table of any size."""
        (base, home), n = probe, admitted.numel()
        index = admitted.nonzero().squeeze(1)
        if index.numel() == 0:
            return torch.full_like(calls.order, -1), [0, int(self.step)]
        base, home, clock, prio = (t.index_select(0, index) for t in (base, home, calls.clock, calls.order))
        window = self._probe_window(base, home)
        claimed, winner = self._host_scratch()
        out = torch.full((n,), -1, dtype=torch.int64, device=window.device)
        try:
            claimed.scatter_reduce_(0, hit_slot, hit.to(torch.int64), "amax")
            rounds = self._rounds(window, admitted.index_select(0, index), clock, prio, claimed, index, out, winner)
            for _ in range(self.config.max_probe + 1):
                rounds.play(self.slots)
                if rounds.prio.numel() >= COMPACT_MIN_ROWS:  # a large call: shrink to the ids still live
                    rounds.compact()
                if not bool(rounds.live.any()):
                    break
            placed = rounds.result()
        finally:  # every slot a round can claim or bid for is in the windows
            touched = torch.cat([hit_slot, window.reshape(-1)])
            claimed.index_fill_(0, touched, 0)
            winner.index_fill_(0, touched, INT64_MAX)
        return placed, [int((placed >= 0).sum()), int(self.step)]

    def _host_scratch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposal rounds' table-sized buffers on the host, kept between calls (all 0 and all INT64_MAX
        between calls): ``claimed`` and ``winner`` of ``Rounds``. Not state: never in a checkpoint."""
        if self._scratch is None:
            i64 = {"dtype": torch.int64, "device": self.device}
            self._scratch = torch.zeros(self.slots, **i64), torch.full((self.slots,), INT64_MAX, **i64)
        return self._scratch

    def _rounds(
        self,
        window: torch.Tensor,
        admitted: torch.Tensor,
        clock: torch.Tensor,
        prio: torch.Tensor,
        claimed: torch.Tensor,
        index: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        winner: torch.Tensor | None = None,
    ) -> Rounds:
        """The proposal rounds of the ids probing ``window`` (``Rounds``' fields)."""
        held, seen = take(self.identities, window), take(self.last_seen, window)
        return Rounds(
            window=window,
            empty=held < 0,
            usable=((held < 0) | self._evictable(held, seen, clock)) & admitted[:, None],
            keys=self._victim_keys(window, seen, clock),
            prio=prio,
            claimed=claimed,
            placed=torch.full_like(prio, -1),
            live=admitted,
            index=index,
            out=out,
            winner=winner,
        )

    def _evictable(self, held: torch.Tensor, seen: torch.Tensor, clock: torch.Tensor) -> torch.Tensor:
        """Occupied slots the policy lets a new id take (``held``, ``seen``: the slots' ids and last_seen):
        under ttl only ids unseen for more than ttl."""
        occupied = held >= 0
        if self.config.policy == "ttl":
            assert self.config.ttl is not None
            return occupied & (clock[:, None] - seen > self.config.ttl)
        return occupied

    def _victim_keys(self, win: torch.Tensor, seen: torch.Tensor, clock: torch.Tensor) -> list[torch.Tensor]:
        """Sort keys of the victim, most significant first (ties then go to the nearest probed slot); lfu's
        counts as of the proposing id's clock (``_decayed``). ``seen``: the probed slots' last_seen."""
        if self.config.policy == "lfu":
            return [self._decayed(take(self.counts, win), clock[:, None] - seen), seen]
        return [seen]

    def _decayed(self, counts: torch.Tensor, unseen: torch.Tensor) -> torch.Tensor:
        """lfu with ``lfu_halflife`` H: a count halved once for every H lookup calls its id went unseen
        (``counts >> (unseen // H)``), so ids that stopped appearing give their slots up in time."""
        halflife = self.config.lfu_halflife
        if not halflife:
            return counts
        return counts >> torch.div(unseen, halflife, rounding_mode="floor").clamp(0, 63)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only (a DCP checkpoint can hold them); ``layout`` guards against loading into another shape."""
        return {
            "identities": self.identities,
            "last_seen": self.last_seen,
            "counts": self.counts,
            "pending_ids": self.pending_ids,
            "pending_counts": self.pending_counts,
            "counters": self.counters,
            "step": self.step,
            "layout": torch.tensor(self.config.layout, dtype=torch.int64),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        layout = tuple(state["layout"].tolist())
        if layout != self.config.layout:
            raise ValueError(
                f"zch: checkpoint layout (hash version, zch_size, bucket_size, admission slots) {layout} "
                f"differs from this table's {self.config.layout}"
            )
        for name, mine in self.state_dict().items():
            if name != "layout":
                mine.copy_(state[name])


def empty_rows(device: torch.device) -> torch.Tensor:
    return torch.zeros(0, dtype=torch.int64, device=device)


def call_stats(rows: torch.Tensor, **counts: torch.Tensor) -> torch.Tensor:
    """A call's ``COUNTERS`` as one int64 tensor: ``lookups`` is ``rows``' size, the others the device
    scalars given by name (0 where not given)."""
    unknown = sorted(set(counts) - set(COUNTERS))
    if unknown:
        raise ValueError(f"call_stats: no counters {unknown}; known: {COUNTERS}")
    zero = torch.zeros((), dtype=torch.int64, device=rows.device)
    lookups = torch.full((), rows.numel(), dtype=torch.int64, device=rows.device)
    return torch.stack([lookups if name == "lookups" else counts.get(name, zero) for name in COUNTERS])


def read_stats(hit: torch.Tensor) -> torch.Tensor:
    """``COUNTERS`` of a read-only call: lookups, hits, and every miss a collision."""
    hits = hit.sum()
    return call_stats(hit, hits=hits, collisions=hit.numel() - hits)


def taken_slots(placed: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` slots a call gave to new ids (``placed``: each position's slot, -1: none), ascending."""
    return torch.sort(torch.where(placed >= 0, placed, INT64_MAX)).values[:count]
