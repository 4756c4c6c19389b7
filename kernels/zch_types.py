"""The types of a zero-collision identity table (``zch.ZchTable``): its configuration, validated before any rank
starts (``ZchConfig``), what one lookup returns (``ZchLookup``, with the undo record ``Overwritten``), the
statistics it counts (``COUNTERS``) and the contract of the ids it takes (``check_ids``). The rules are in
docs/design.md#open-id-spaces-mpzch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .zch_hash import HASH_VERSION

POLICIES = ("ttl", "lru", "lfu")
# Per-call statistics and the table's running totals, in this order. Lookups and hits, collisions and
# admission_waits count id occurrences; inserts and evictions count table slots; evicted_age_sum adds
# the evicted ids' ages in the policy's clock (event seconds for ttl, lookup calls for lru and lfu).
COUNTERS = ("lookups", "hits", "inserts", "evictions", "collisions", "admission_waits", "evicted_age_sum")


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
    lfu_halflife: int = 0  # lfu only: lookup calls after which an unseen id's count halves (0: never decays)
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
        for option, off in (("admission_threshold", 1), ("lfu_halflife", 0)):  # lfu's options, and their off value
            value = getattr(self, option)
            need(isinstance(value, int) and value >= off, option, f"must be >= {off} ({off}: off), got {value!r}")
            need(
                value == off or self.policy == "lfu",
                option,
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
class Overwritten:
    """The entries a training call may have written, with their values before it: restoring them undoes the
    call (with ``counters`` and ``step``). Entries repeat, always with the same value, so restoring in any
    order is deterministic."""

    slots: torch.Tensor  # int64 shard slots
    identities: torch.Tensor
    last_seen: torch.Tensor
    counts: torch.Tensor
    pending: torch.Tensor  # int64 entries of the admission counters (empty without admission)
    pending_ids: torch.Tensor
    pending_counts: torch.Tensor


@dataclass
class ZchLookup:
    """One ``lookup``: the row of every id, the rows given to a new id in this call, and the call's counts."""

    rows: torch.Tensor  # int64, the ids' shape: a slot of the table (shard), or its fallback_row
    reassigned: torch.Tensor  # int64, ascending: rows whose embedding and optimizer state must be reset
    stats: torch.Tensor  # int64 [len(COUNTERS)]
    step: int | None = None  # training: the table's step after the call, read with the call's other host values
    overwritten: Overwritten | None = None  # training: what the call wrote, as it was before

    def stats_dict(self) -> dict[str, int]:
        return dict(zip(COUNTERS, self.stats.tolist(), strict=True))


def check_ids(ids: torch.Tensor, times: torch.Tensor | None, *, values: bool = True) -> None:
    """Raw ids are int64 >= 0 (-1 marks an empty slot); times, when given, one int64 per id. ``values=False``
    checks dtype and shapes only (no host sync): ``ZchTable`` reads the values' check with its own."""
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids: expected int64 raw ids, got {ids.dtype}")
    if values and ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"ids: raw ids must be >= 0 (got {int(ids.min())}); -1 marks an empty slot")
    if times is not None and times.shape != ids.shape:
        raise ValueError(f"times: shape {tuple(times.shape)} differs from the ids' {tuple(ids.shape)}")
