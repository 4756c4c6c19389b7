"""The proposal rounds of a zero-collision table's training call as one Triton kernel (CUDA).

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
by the policy's keys, then by distance. The tests hold it to the masked rounds and to the per-id reference
(the Triton interpreter on CPU); its figures on a GPU are in benchmarks/README.md#bench_zch.

Kernels are jitted lazily and call only Triton builtins (``triton_support`` says why).
"""

from __future__ import annotations

import torch

from .triton_support import HAS_TRITON, jit_lazily, next_pow2, tl, triton_unavailable_reason

INT64_MAX = tl.constexpr(2**63 - 1) if HAS_TRITON else None
POLICY_CODES = {"ttl": 0, "lru": 1, "lfu": 2}
ROUNDS_WARPS = 4


def _rounds_kernel(
    OFFSETS, COUNTS, ORDER, HOME, CLOCK, PRIO, IDENTITIES, LAST_SEEN, SLOT_COUNTS, CLAIMED, OUT,
    bucket_size, max_probe, ttl, halflife,
    POLICY: tl.constexpr, K: tl.constexpr, B: tl.constexpr,
):  # fmt: skip
    """One bucket's rounds. ``ORDER[OFFSETS[b]:][:COUNTS[b]]``: the call positions of the bucket's admitted
    ids; ``HOME``/``CLOCK``/``PRIO``: per call position; ``OUT``: the slot each takes (left -1: none)."""
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
    claimed = tl.load(CLAIMED + base + lanes, mask=in_bucket, other=1) != 0
    empty = (held < 0) & in_bucket
    occupied = (held >= 0) & in_bucket

    distance = lanes[None, :].to(tl.int64) - home[:, None]
    distance = tl.where(distance < 0, distance + bucket_size, distance)
    window = (distance < max_probe) & in_bucket[None, :] & valid[:, None]
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

    live = valid
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


def place_in_rounds(
    *,
    bucket_local: torch.Tensor,
    home: torch.Tensor,
    clock: torch.Tensor,
    prio: torch.Tensor,
    admitted: torch.Tensor,
    claimed: torch.Tensor,
    identities: torch.Tensor,
    last_seen: torch.Tensor,
    counts: torch.Tensor,
    bucket_size: int,
    max_probe: int,
    policy: str,
    ttl: int | None,
    halflife: int,
) -> torch.Tensor:
    """Slot taken by each call position (-1: none), as ``ZchTable._place``: [n] per-position inputs
    (``bucket_local``: the position's bucket in the table or shard, ``home``: its home slot in the bucket),
    the table's state tensors and ``claimed`` ([slots], nonzero: held by a hit of the call). One host
    read (the largest bucket's admitted ids, which sizes the tile), a sort and one launch."""
    reason = triton_unavailable_reason(identities.device)
    if reason is not None:
        raise RuntimeError(f"zch rounds kernel: {reason}")
    n, buckets = admitted.numel(), identities.numel() // bucket_size
    out = torch.full((n,), -1, dtype=torch.int64, device=identities.device)
    if n == 0 or buckets == 0:
        return out
    group = torch.where(admitted, bucket_local, buckets)  # positions not admitted go past the last bucket
    order = torch.sort(group).indices
    per_bucket = torch.zeros(buckets + 1, dtype=torch.int64, device=group.device)
    per_bucket.scatter_add_(0, group, torch.ones_like(group))
    offsets = torch.cumsum(per_bucket, 0) - per_bucket
    most = int(per_bucket[:buckets].max())
    if most == 0:
        return out
    per_position = [t.reshape(-1).to(torch.int64).contiguous() for t in (home, clock, prio)]  # clock may be expanded
    kernel = jit_lazily(_rounds_kernel)
    kernel[(buckets,)](
        offsets, per_bucket, order, *per_position, identities, last_seen, counts, claimed, out,
        bucket_size, max_probe, ttl if ttl is not None else 0, halflife,
        POLICY=POLICY_CODES[policy], K=next_pow2(most), B=next_pow2(bucket_size), num_warps=ROUNDS_WARPS,
    )  # fmt: skip
    return out
