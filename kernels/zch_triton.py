"""A zero-collision table's training call (its proposal rounds, and without admission all of it) as one
Triton kernel (CUDA).

``ZchTable._place`` places a call's admitted missing ids in proposal rounds (docs/design.md#open-id-spaces-mpzch):
each round every unplaced id proposes its best open slot (the nearest empty one, else the policy's victim), a
slot proposed by several goes to the id that occurred first, the others try again without it. The masked
torch rounds (``zch_rounds.Rounds``) do this over [ids, max_probe] tensors in about 45 small launches a round
plus a host read per run of rounds; on a GPU the launches, not the work, are the cost
(docs/kernels.md#zero-collision-rounds-in-triton).

Probing never leaves a bucket, so ids of different buckets never compete: one program per bucket plays
every round of its bucket's ids in registers, as a [K ids, B lanes] tile (K: the most admitted ids any
bucket got, rounded up to a power of two; B: the bucket size, likewise), and stops when none is left to
propose. The rules are those of ``Rounds.play``, lane by lane: a lane's probe distance for an id is
``(lane - home) mod bucket_size``, an id may take a lane within ``max_probe`` of its home that is empty or
evictable and not claimed (held by a hit of the call or taken in an earlier round), and victims are ranked
by the policy's keys, then by distance. Without admission (``look_up_in_kernel``, ``FUSED``) the tile
holds every distinct id of the bucket and the program also finds the hits and writes what
``ZchTable._apply`` writes, so the whole training call is one launch. The tests hold it to the masked
path and to the per-id reference (the Triton interpreter on CPU); its figures on a GPU will be in
benchmarks/README.md#bench_zch.

Kernels are jitted lazily and call only Triton builtins (``triton_support`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .triton_support import HAS_TRITON, jit_lazily, next_pow2, tl, triton_unavailable_reason

INT64_MAX = tl.constexpr(2**63 - 1) if HAS_TRITON else None
POLICY_CODES = {"ttl": 0, "lru": 1, "lfu": 2}
TILE_PER_WARP = 1024  # [K, B] tile entries per warp: 4 warps up to 64 ids x 64 lanes, then 8


def _bucket_kernel(
    OFFSETS, COUNTS, ORDER, HOME, CLOCK, PRIO, IDS, OCCURRENCES, IDENTITIES, LAST_SEEN, SLOT_COUNTS, CLAIMED,
    OUT, n, bucket_size, max_probe, ttl, halflife, fallback_row,
    POLICY: tl.constexpr, FUSED: tl.constexpr, K: tl.constexpr, B: tl.constexpr,
):  # fmt: skip
    """One bucket's rounds. ``ORDER[OFFSETS[b]:][:COUNTS[b]]``: the call positions of the bucket's ids
    (admitted missing ids; ``FUSED``: every distinct id, its hits read here); ``HOME``/``CLOCK``/``PRIO``/
    ``IDS``/``OCCURRENCES``: per call position. ``OUT`` row 0: the slot each takes (-1: none); ``FUSED``
    also writes the table's metadata and ``OUT``'s other rows (``FUSED_ROWS``)."""
    bucket = tl.program_id(0).to(tl.int64)
    count = tl.load(COUNTS + bucket)
    ks = tl.arange(0, K)
    lanes = tl.arange(0, B)
    valid = ks < count
    pos = tl.load(ORDER + tl.load(OFFSETS + bucket) + ks, mask=valid, other=0)
    home = tl.load(HOME + pos, mask=valid, other=0)
    clock = tl.load(CLOCK + pos, mask=valid, other=0)
    prio = tl.load(PRIO + pos, mask=valid, other=0)
    base = bucket * bucket_size
    in_bucket = lanes < bucket_size
    held = tl.load(IDENTITIES + base + lanes, mask=in_bucket, other=-1)
    seen = tl.load(LAST_SEEN + base + lanes, mask=in_bucket, other=0)
    empty = (held < 0) & in_bucket
    occupied = (held >= 0) & in_bucket

    distance = lanes[None, :].to(tl.int64) - home[:, None]
    distance = tl.where(distance < 0, distance + bucket_size, distance)
    window = (distance < max_probe) & in_bucket[None, :] & valid[:, None]
    if FUSED:  # hits: an id held in its window; the lanes they hold are claimed
        ids = tl.load(IDS + pos, mask=valid, other=-1)
        match = window & (held[None, :] == ids[:, None])
        hit = (tl.reduce(match.to(tl.int32), 1, tl.standard._elementwise_max) > 0) & valid
        hit_lane = tl.reduce(tl.where(match, lanes[None, :], 0), 1, tl.standard._sum_combine).to(tl.int64)
        claimed = tl.reduce(match.to(tl.int32), 0, tl.standard._elementwise_max) > 0
        live = valid & ~hit
    else:
        claimed = tl.load(CLAIMED + base + lanes, mask=in_bucket, other=1) != 0
        live = valid
    unseen = clock[:, None] - seen[None, :]  # [K, B]: each proposing id's clock against each lane's last_seen
    if POLICY == 0:  # ttl: only ids unseen for more than ttl may go
        evictable = occupied[None, :] & (unseen > ttl)
    else:
        evictable = occupied[None, :] & valid[:, None]
    usable = window & (empty[None, :] | evictable)
    key0 = seen[None, :] + unseen * 0  # lru / ttl: the oldest last_seen goes first
    if POLICY == 2:  # lfu: the lowest count (decayed as of the proposer's clock), then the oldest
        counts = tl.load(SLOT_COUNTS + base + lanes, mask=in_bucket, other=0)
        key0 = counts[None, :] + unseen * 0
        if halflife > 0:
            shift = tl.minimum(tl.maximum(unseen // halflife, 0), 63)
            key0 = key0 >> shift

    placed = tl.full([K], -1, tl.int64)
    remaining = tl.reduce(live.to(tl.int32), 0, tl.standard._sum_combine)
    played = 0
    while (remaining > 0) & (played <= max_probe):
        open_ = usable & live[:, None] & ~claimed[None, :]
        live = live & (tl.reduce(open_.to(tl.int32), 1, tl.standard._elementwise_max) > 0)
        free = open_ & empty[None, :]
        has_free = tl.reduce(free.to(tl.int32), 1, tl.standard._elementwise_max) > 0
        victims = open_ & ~empty[None, :]
        lowest = tl.reduce(tl.where(victims, key0, INT64_MAX), 1, tl.standard._elementwise_min)
        victims = victims & (key0 == lowest[:, None])
        if POLICY == 2:
            key1 = seen[None, :] + unseen * 0
            oldest = tl.reduce(tl.where(victims, key1, INT64_MAX), 1, tl.standard._elementwise_min)
            victims = victims & (key1 == oldest[:, None])
        candidates = tl.where(has_free[:, None], free, victims)
        nearest = tl.reduce(tl.where(candidates, distance, INT64_MAX), 1, tl.standard._elementwise_min)
        choice = candidates & (distance == nearest[:, None]) & live[:, None]  # one lane per live id
        winner = tl.reduce(tl.where(choice, prio[:, None], INT64_MAX), 0, tl.standard._elementwise_min)
        won_lane = choice & (winner[None, :] == prio[:, None])
        won = (tl.reduce(won_lane.to(tl.int32), 1, tl.standard._elementwise_max) > 0) & live
        lane = tl.reduce(tl.where(choice, lanes[None, :], 0), 1, tl.standard._sum_combine)
        placed = tl.where(won, base + lane, placed)
        claimed = claimed | (tl.reduce(won_lane.to(tl.int32), 0, tl.standard._elementwise_max) > 0)
        live = live & ~won
        remaining = tl.reduce(live.to(tl.int32), 0, tl.standard._sum_combine)
        played += 1
    tl.store(OUT + pos, placed, mask=valid)
    if FUSED:  # ZchTable._apply: the hits' and the placed ids' metadata, and what the call overwrote
        is_placed = placed >= 0
        slot = base + tl.where(is_placed, placed - base, hit_lane)  # a written slot, or the hit's (else base)
        held_then = tl.load(IDENTITIES + slot, mask=valid, other=-1)
        seen_then = tl.load(LAST_SEEN + slot, mask=valid, other=0)
        counts_then = tl.load(SLOT_COUNTS + slot, mask=valid, other=0)
        occurrences = tl.load(OCCURRENCES + pos, mask=valid, other=0)
        evicted = is_placed & (held_then >= 0)
        new_seen = clock
        if POLICY == 0:
            new_seen = tl.where(is_placed, clock, tl.maximum(seen_then, clock))
        kept = counts_then
        if halflife > 0:
            kept = kept >> tl.minimum(tl.maximum((clock - seen_then) // halflife, 0), 63)
        new_counts = tl.where(is_placed, occurrences, kept + occurrences)
        written = (hit | is_placed) & valid
        row = tl.where(hit, base + hit_lane, tl.where(is_placed, placed, fallback_row))
        tl.store(OUT + n + pos, row, mask=valid)
        tl.store(OUT + 2 * n + pos, tl.where(hit, occurrences, 0), mask=valid)
        tl.store(OUT + 3 * n + pos, evicted.to(tl.int64), mask=valid)
        tl.store(OUT + 4 * n + pos, tl.where(evicted, clock - seen_then, 0), mask=valid)
        tl.store(OUT + 5 * n + pos, slot, mask=valid)
        tl.store(OUT + 6 * n + pos, held_then, mask=valid)
        tl.store(OUT + 7 * n + pos, seen_then, mask=valid)
        tl.store(OUT + 8 * n + pos, counts_then, mask=valid)
        tl.store(IDENTITIES + slot, ids, mask=written)
        tl.store(LAST_SEEN + slot, new_seen, mask=written)
        tl.store(SLOT_COUNTS + slot, new_counts, mask=written)


@dataclass(frozen=True)
class BucketState:
    """What the kernel reads and writes of a table (or a rank's shard): its state tensors and layout."""

    identities: torch.Tensor
    last_seen: torch.Tensor
    counts: torch.Tensor
    bucket_size: int
    max_probe: int
    policy: str
    ttl: int | None
    halflife: int
    fallback_row: int

    @property
    def buckets(self) -> int:
        return self.identities.numel() // self.bucket_size


FUSED_ROWS = ("placed", "row", "hit_occurrences", "evicted", "age", "slots", "identities", "last_seen", "counts")


@dataclass(frozen=True)
class BucketGroups:
    """A call's positions grouped by bucket, without a host read: ``order`` (the member positions bucket
    after bucket, then the others), ``per_bucket`` (members per bucket, then the others) and ``offsets``
    (where each bucket's positions start in ``order``); ``largest`` (device scalar) sizes the tile."""

    order: torch.Tensor
    per_bucket: torch.Tensor
    offsets: torch.Tensor

    @property
    def largest(self) -> torch.Tensor:
        return self.per_bucket[:-1].max()


def group_by_bucket(members: torch.Tensor, bucket_local: torch.Tensor, buckets: int) -> BucketGroups:
    """``BucketGroups`` of the ``members`` positions; ``bucket_local`` outside [0, buckets) (another rank's
    id: the caller refuses the call) is grouped with the non-members."""
    inside = members & (bucket_local >= 0) & (bucket_local < buckets)
    group = torch.where(inside, bucket_local, buckets)
    per_bucket = torch.zeros(buckets + 1, dtype=torch.int64, device=group.device)
    per_bucket.scatter_add_(0, group, torch.ones_like(group))
    return BucketGroups(torch.sort(group).indices, per_bucket, torch.cumsum(per_bucket, 0) - per_bucket)


def place_in_rounds(
    table: BucketState,
    *,
    bucket_local: torch.Tensor,
    home: torch.Tensor,
    clock: torch.Tensor,
    prio: torch.Tensor,
    admitted: torch.Tensor,
    claimed: torch.Tensor,
) -> torch.Tensor:
    """Slot taken by each call position (-1: none), as ``ZchTable._place``: [n] per-position inputs
    (``bucket_local``: the position's bucket in the table or shard, ``home``: its home slot in the bucket,
    ``admitted``: the positions that take part) and ``claimed`` ([slots], nonzero: held by a hit of the
    call). One host read (the largest bucket's admitted ids, which sizes the tile), a sort and one launch."""
    groups = group_by_bucket(admitted, bucket_local, table.buckets)
    largest = int(groups.largest) if admitted.numel() else 0
    return _launch(table, groups, largest, home, clock, prio, claimed=claimed)[0]


def look_up_in_kernel(
    table: BucketState,
    groups: BucketGroups,
    largest: int,
    *,
    ids: torch.Tensor,
    occurrences: torch.Tensor,
    home: torch.Tensor,
    clock: torch.Tensor,
    prio: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """A training call without admission in the kernel, hits and metadata writes included: ``groups``
    holds the lead positions of a sorted call (its distinct ids) by bucket and ``largest`` is
    ``groups.largest`` read by the caller (with its other checks: no host read here). For those
    positions ``FUSED_ROWS`` [n] each (the slot placed, -1: none; the row; the occurrences of a hit;
    evicted; the evicted id's age; the slot written, or one the call left alone, with its identity,
    last_seen and count before the call). Other positions' values are 0, and -1 for ``placed``."""
    out = _launch(table, groups, largest, home, clock, prio, ids=ids, occurrences=occurrences)
    return dict(zip(FUSED_ROWS, out, strict=True))


def _launch(
    table: BucketState,
    groups: BucketGroups,
    largest: int,
    home: torch.Tensor,
    clock: torch.Tensor,
    prio: torch.Tensor,
    *,
    claimed: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    occurrences: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel over ``groups`` (tiles of ``largest`` ids, rounded up); its output rows ([1 or 9, n])."""
    reason = triton_unavailable_reason(table.identities.device)
    if reason is not None:
        raise RuntimeError(f"zch kernel: {reason}")
    fused = ids is not None
    n, device = groups.order.numel(), table.identities.device
    out = torch.zeros((len(FUSED_ROWS) if fused else 1, n), dtype=torch.int64, device=device)
    out[0].fill_(-1)
    if n == 0 or table.buckets == 0 or largest == 0:
        return out
    per_position = [flat(t) for t in (home, clock, prio)]  # clock may be an expanded scalar
    if fused:  # the kernel reads no CLAIMED: any tensor stands in
        ids_arg, occurrences_arg, claimed_arg = flat(ids), flat(occurrences), out
    else:  # nor IDS and OCCURRENCES
        assert claimed is not None
        ids_arg, occurrences_arg, claimed_arg = out, out, claimed
    kernel = jit_lazily(_bucket_kernel)
    kernel[(table.buckets,)](
        groups.offsets, groups.per_bucket, groups.order, *per_position, ids_arg, occurrences_arg, table.identities,
        table.last_seen, table.counts, claimed_arg, out, n, table.bucket_size, table.max_probe, table.ttl or 0,
        table.halflife, table.fallback_row, POLICY=POLICY_CODES[table.policy], FUSED=fused, K=next_pow2(largest),
        B=next_pow2(table.bucket_size), num_warps=warps(next_pow2(largest) * next_pow2(table.bucket_size)),
    )  # fmt: skip
    return out


def warps(tile: int) -> int:
    """Warps for a [K, B] tile of ``tile`` entries: 4, or 8 past ``4 * TILE_PER_WARP`` (a bucket crowded by
    a large call keeps several int64 [K, B] temporaries live)."""
    return 4 if tile <= 4 * TILE_PER_WARP else 8


def flat(t: torch.Tensor | None) -> torch.Tensor:
    assert t is not None
    return t.reshape(-1).to(torch.int64).contiguous()
