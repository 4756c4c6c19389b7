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
``zch_rows.reset_rows`` (embedding and optimizer state): docs/design.md#open-id-spaces-mpzch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .zch_hash import HASH_VERSION, bucket_and_home, pending_slot

POLICIES = ("ttl", "lru", "lfu")
# Per-call statistics and the table's running totals, in this order. Lookups and hits, collisions and
# admission_waits count id occurrences; inserts and evictions count table slots; evicted_age_sum adds
# the evicted ids' ages in the policy's clock (event seconds for ttl, lookup calls for lru and lfu).
COUNTERS = ("lookups", "hits", "inserts", "evictions", "collisions", "admission_waits", "evicted_age_sum")
INT64_MAX = torch.iinfo(torch.int64).max


@dataclass(frozen=True)
class ZchConfig:
    """Shape and policy of one identity table; validated here so a bad value fails before any rank starts."""

    zch_size: int  # rows that can hold an id (the embedding table has zch_size + 1: the fallback row last)
    bucket_size: int = 64  # contiguous rows per bucket: the unit of row-wise sharding
    max_probe: int = 16  # slots probed from the home slot, wrapping inside the bucket
    policy: str = "lru"  # ttl (event time) | lru (lookup calls) | lfu (counts, with admission)
    ttl: int | None = None  # ttl only: an id unseen for more than this many event-time seconds may be replaced
    admission_threshold: int = 1  # lfu only: a new id takes a slot once seen this many times (1: at once)
    admission_slots: int = 0  # lfu with admission: size of the pending-count table (0: zch_size)
    world_size: int = 1  # ranks sharing the table row-wise: num_buckets must split evenly among them

    def __post_init__(self) -> None:
        def need(ok: bool, option: str, why: str) -> None:
            if not ok:
                raise ValueError(f"zch.{option}: {why}")

        for name in ("zch_size", "bucket_size", "world_size"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, name, f"must be a positive integer, got {value!r}")
        need(
            self.zch_size % self.bucket_size == 0,
            "zch_size",
            f"{self.zch_size} is not a multiple of bucket_size {self.bucket_size}",
        )
        need(
            self.num_buckets % self.world_size == 0,
            "zch_size",
            f"{self.num_buckets} buckets of {self.bucket_size} rows do not split among world_size {self.world_size}",
        )
        need(
            isinstance(self.max_probe, int) and 1 <= self.max_probe <= self.bucket_size,
            "max_probe",
            f"must be in [1, bucket_size {self.bucket_size}], got {self.max_probe!r}",
        )
        need(self.policy in POLICIES, "policy", f"unknown policy {self.policy!r} (one of {', '.join(POLICIES)})")
        if self.policy == "ttl":
            need(
                isinstance(self.ttl, int) and self.ttl > 0,
                "ttl",
                f"policy 'ttl' needs ttl > 0 event-time seconds, got {self.ttl!r}",
            )
        else:
            need(self.ttl is None, "ttl", f"applies to policy 'ttl' only (policy is {self.policy!r})")
        need(
            isinstance(self.admission_threshold, int) and self.admission_threshold >= 1,
            "admission_threshold",
            f"must be >= 1, got {self.admission_threshold!r}",
        )
        need(
            self.admission_threshold == 1 or self.policy == "lfu",
            "admission_threshold",
            f"applies to policy 'lfu' only (policy is {self.policy!r})",
        )
        need(
            isinstance(self.admission_slots, int) and self.admission_slots >= 0,
            "admission_slots",
            f"must be >= 0 (0: zch_size), got {self.admission_slots!r}",
        )

    @property
    def num_buckets(self) -> int:
        return self.zch_size // self.bucket_size

    @property
    def num_rows(self) -> int:
        """Rows of the embedding table this identity table indexes: every slot and the fallback row."""
        return self.zch_size + 1

    @property
    def fallback_row(self) -> int:
        return self.zch_size

    @property
    def pending_size(self) -> int:
        """Entries of the admission counters (0 when every id is admitted at once)."""
        if self.admission_threshold == 1:
            return 0
        return self.admission_slots or self.zch_size

    @property
    def layout(self) -> tuple[int, ...]:
        """What decides where an id lives: a checkpoint is only valid for a table with the same layout."""
        return (HASH_VERSION, self.zch_size, self.bucket_size, self.pending_size)


@dataclass
class ZchLookup:
    """One ``lookup``: the row of every id, the rows given to a new id in this call, and the call's counts."""

    rows: torch.Tensor  # int64, the ids' shape: a slot of the table (shard), or its fallback_row
    reassigned: torch.Tensor  # int64, ascending: rows whose embedding and optimizer state must be reset
    stats: torch.Tensor  # int64 [len(COUNTERS)]

    def stats_dict(self) -> dict[str, int]:
        return dict(zip(COUNTERS, self.stats.tolist(), strict=True))


def check_ids(ids: torch.Tensor, times: torch.Tensor | None) -> None:
    """Raw ids are int64 >= 0 (-1 marks an empty slot); times, when given, one int64 per id."""
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids: expected int64 raw ids, got {ids.dtype}")
    if ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"ids: raw ids must be >= 0 (got {int(ids.min())}); -1 marks an empty slot")
    if times is not None and times.shape != ids.shape:
        raise ValueError(f"times: shape {tuple(times.shape)} differs from the ids' {tuple(ids.shape)}")


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

    @property
    def device(self) -> torch.device:
        return self.identities.device

    def occupancy(self) -> float:
        return float((self.identities >= 0).sum()) / self.slots

    def counters_dict(self) -> dict[str, int]:
        return dict(zip(COUNTERS, self.counters.tolist(), strict=True))

    def window(self, ids: torch.Tensor) -> torch.Tensor:
        """[n, max_probe] shard slots each id probes, nearest first: its home slot, then onwards, wrapping
        in the bucket. An id of another rank's buckets is an error."""
        return self._probe_window(*self._locate(ids))

    def _locate(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(shard slot of each id's bucket start, home slot inside the bucket); another rank's id is an error."""
        cfg = self.config
        bucket, home = bucket_and_home(ids, cfg.num_buckets, cfg.bucket_size)
        if self.rank is not None:
            owner = bucket // (cfg.num_buckets // cfg.world_size)
            if bool((owner != self.rank).any()):
                raise ValueError(
                    f"zch: ids of rank {int(owner[owner != self.rank][0])}'s buckets looked up on rank {self.rank}"
                )
        return bucket * cfg.bucket_size - self.first_slot, home

    def _probe_window(self, base: torch.Tensor, home: torch.Tensor) -> torch.Tensor:
        """``base + (home + probe) mod bucket_size`` for every probe; home < bucket_size and max_probe <=
        bucket_size, so one conditional subtraction wraps (cheaper than ``%`` on int64)."""
        cfg = self.config
        within = home[:, None] + torch.arange(cfg.max_probe, dtype=torch.int64, device=home.device)
        within = torch.where(within >= cfg.bucket_size, within - cfg.bucket_size, within)
        return base[:, None] + within

    def _read(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, hit) of every id, reading only: each id's home slot first (where most ids live), the rest
        of its window only for the ids not found there; an id absent from its window gets the fallback row."""
        base, home = self._locate(ids)
        rows = base + home
        hit = self.identities.index_select(0, rows) == ids
        rest = torch.nonzero(~hit).squeeze(1)
        if rest.numel():
            window = self._probe_window(base[rest], home[rest])
            match = take(self.identities, window) == ids[rest, None]
            found = match.any(dim=1)
            slot = (window * match).sum(dim=1)  # an id holds one slot at most: the sum is that slot
            rows[rest] = torch.where(found, slot, self.fallback_row)
            hit[rest] = found
        return rows, hit

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor, times: torch.Tensor | None = None, *, train: bool = True) -> ZchLookup:
        """Rows of ``ids`` (any shape); in training also insert, evict and update metadata and counters.

        ``times``: event time (int64 seconds) per id; required in training under ttl, unused otherwise.
        ``train=False`` reads only: unknown ids get the fallback row and nothing in the table changes.
        """
        check_ids(ids, times)
        cfg, device = self.config, self.device
        flat = ids.reshape(-1).to(device=device, dtype=torch.int64)
        n = flat.numel()
        if not train:  # per id, no deduplication: nothing to insert, count or update
            rows, hit = self._read(flat)
            stats = torch.zeros(len(COUNTERS), dtype=torch.int64, device=device)
            stats[0], stats[1] = n, hit.sum()
            stats[4] = n - stats[1]
            return ZchLookup(rows.reshape(ids.shape), empty_rows(device), stats)
        unique, inverse = torch.unique(flat, return_inverse=True)
        occurrences = torch.bincount(inverse, minlength=unique.numel())
        window = self.window(unique)
        match = take(self.identities, window) == unique[:, None]
        hit = match.any(dim=1)
        hit_slot = window.gather(1, first_true(match)[:, None]).squeeze(1)
        rows = torch.where(hit, hit_slot, self.fallback_row)
        stats = torch.zeros(len(COUNTERS), dtype=torch.int64, device=device)
        stats[0], stats[1] = n, occurrences[hit].sum()
        if cfg.policy == "ttl" and times is None:
            raise ValueError("times: policy 'ttl' needs the event time of every id in training")

        self.step += 1
        if cfg.policy == "ttl":
            assert times is not None
            flat_times = times.reshape(-1).to(device=device, dtype=torch.int64)
            clock = torch.full_like(unique, torch.iinfo(torch.int64).min)
            clock = clock.scatter_reduce(0, inverse, flat_times, "amax")
        else:
            clock = self.step.expand(unique.numel())
        first = torch.full_like(unique, n).scatter_reduce(0, inverse, torch.arange(n, device=device), "amin")
        miss = ~hit
        counts_at_insert = occurrences
        admitted = miss
        if cfg.pending_size:
            counts_at_insert, admitted = self._admission(unique, occurrences, first, miss)

        placed_slot = self._place(window, admitted, first, clock, hit_slot[hit])
        placed = placed_slot >= 0
        slots = placed_slot[placed]
        evicted = self.identities[slots] >= 0
        ages = clock[placed][evicted] - self.last_seen[slots[evicted]]

        hits = hit_slot[hit]
        if cfg.policy == "ttl":
            self.last_seen[hits] = torch.maximum(self.last_seen[hits], clock[hit])
        else:
            self.last_seen[hits] = clock[hit]
        self.counts[hits] += occurrences[hit]
        self.identities[slots] = unique[placed]
        self.last_seen[slots] = clock[placed]
        self.counts[slots] = counts_at_insert[placed]
        if cfg.pending_size:
            self._admitted(unique[placed])

        rows[placed] = slots
        stats[2], stats[3] = placed.sum(), evicted.sum()
        stats[4] = n - stats[1] - occurrences[placed].sum()
        stats[5] = occurrences[miss & ~admitted].sum()
        stats[6] = ages.sum()
        self.counters += stats
        return ZchLookup(rows[inverse].reshape(ids.shape), torch.sort(slots).values, stats)

    def _admission(
        self, unique: torch.Tensor, occurrences: torch.Tensor, first: torch.Tensor, miss: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Count the missing ids in the pending table; (count so far per id, admitted mask).

        Each pending entry holds one id and its count. Ids of the call meet their entry in first-occurrence
        order: an id finding its own entry adds to it, any other replaces it, so only the first id of
        the call at an entry can find its own count there, and the entry ends holding the last one's.
        """
        index = torch.nonzero(miss).squeeze(1)
        ids, prio = unique[index], first[index]
        slot = pending_slot(ids, self.config.pending_size)
        big = torch.full((self.config.pending_size,), INT64_MAX, dtype=torch.int64, device=ids.device)
        is_first = prio == big.scatter_reduce(0, slot, prio, "amin")[slot]
        is_last = prio == torch.full_like(big, -1).scatter_reduce(0, slot, prio, "amax")[slot]
        own = is_first & (self.pending_ids[slot] == ids)
        seen = occurrences[index] + torch.where(own, self.pending_counts[slot], 0)
        self.pending_ids[slot[is_last]] = ids[is_last]
        self.pending_counts[slot[is_last]] = seen[is_last]
        counts = occurrences.clone()
        counts[index] = seen
        admitted = torch.zeros_like(miss)
        admitted[index] = seen >= self.config.admission_threshold
        return counts, admitted

    def _admitted(self, ids: torch.Tensor) -> None:
        """Free the pending entries of ids that took a slot (an entry another id took over stays)."""
        slot = pending_slot(ids, self.config.pending_size)
        mine = slot[self.pending_ids[slot] == ids]
        self.pending_ids[mine] = -1
        self.pending_counts[mine] = 0

    def _place(
        self,
        window: torch.Tensor,
        admitted: torch.Tensor,
        first: torch.Tensor,
        clock: torch.Tensor,
        hit_slots: torch.Tensor,
    ) -> torch.Tensor:
        """Slot taken by each admitted missing id (-1: none, the fallback row), in proposal rounds.

        Each round every id still unplaced proposes its best available slot (the first empty one by
        probe distance, else the policy's victim); a slot proposed by several goes to the id that
        occurred first; the others try again next round without the slots taken. Every loss removes a
        slot from the loser's window, so ``max_probe + 1`` rounds settle every id.
        """
        cfg = self.config
        device = window.device
        placed = torch.full_like(first, -1)
        candidates = torch.nonzero(admitted).squeeze(1)
        if candidates.numel() == 0:
            return placed
        win = window.index_select(0, candidates)
        held = take(self.identities, win)
        empty = held < 0
        usable = empty | self._evictable(win, held, clock[candidates])
        keys = self._victim_keys(win)
        claimed = torch.zeros(self.slots, dtype=torch.bool, device=device)
        claimed[hit_slots] = True
        prio = first[candidates]
        live = torch.arange(candidates.numel(), device=device)  # ids still unplaced, by position in candidates
        for _ in range(cfg.max_probe + 1):
            rows_live = win.index_select(0, live)
            open_ = usable.index_select(0, live) & ~take(claimed, rows_live)
            proposing = open_.any(dim=1)
            live, open_, rows_live = (
                live[proposing],
                open_[proposing],
                rows_live[proposing],
            )  # an id with nothing open keeps the fallback row
            if live.numel() == 0:
                break
            choice = best_slot(open_, empty.index_select(0, live), [key.index_select(0, live) for key in keys])
            slot = rows_live.gather(1, choice[:, None]).squeeze(1)
            winner = torch.full((self.slots,), INT64_MAX, dtype=torch.int64, device=device)
            won = winner.scatter_reduce(0, slot, prio[live], "amin")[slot] == prio[live]
            placed[candidates[live[won]]] = slot[won]
            claimed[slot[won]] = True
            live = live[~won]
        return placed

    def _evictable(self, win: torch.Tensor, held: torch.Tensor, clock: torch.Tensor) -> torch.Tensor:
        """Occupied slots the policy lets a new id take: under ttl only ids unseen for more than ttl."""
        occupied = held >= 0
        if self.config.policy == "ttl":
            assert self.config.ttl is not None
            return occupied & (clock[:, None] - take(self.last_seen, win) > self.config.ttl)
        return occupied

    def _victim_keys(self, win: torch.Tensor) -> list[torch.Tensor]:
        """Sort keys of the victim, most significant first (ties then go to the nearest probed slot)."""
        if self.config.policy == "lfu":
            return [take(self.counts, win), take(self.last_seen, win)]
        return [take(self.last_seen, win)]

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


def take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` for a 1-d ``values``: ``index_select`` is much faster than advanced indexing on CPU."""
    return values.index_select(0, index.reshape(-1)).view(index.shape)


def first_true(mask: torch.Tensor) -> torch.Tensor:
    """Column of the first True per row (0 where none), without relying on argmax's tie order."""
    columns = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, columns, mask.shape[1]).min(dim=1).values.clamp(max=mask.shape[1] - 1)


def best_slot(open_: torch.Tensor, empty: torch.Tensor, keys: list[torch.Tensor]) -> torch.Tensor:
    """Column each row proposes: its nearest open empty slot, else the open slot with the smallest keys."""
    free = open_ & empty
    victims = open_ & ~empty
    for key in keys:
        masked = torch.where(victims, key, INT64_MAX)
        victims &= masked == masked.min(dim=1, keepdim=True).values
    return torch.where(free.any(dim=1), first_true(free), first_true(victims))


def empty_rows(device: torch.device) -> torch.Tensor:
    return torch.zeros(0, dtype=torch.int64, device=device)
