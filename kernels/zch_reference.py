"""The zero-collision table as a plain per-id Python loop: the parity oracle of ``zch.ZchTable``.

Written from the rules in docs/design.md#open-id-spaces-mpzch, not from the vectorised code: Python
integers and lists, its own hash (``mix64_int``), one id at a time. It keeps the same state tensors
(converted to lists for a call and back after), so the tests compare ``state_dict`` as well as rows.
"""

from __future__ import annotations

import torch

from .zch_hash import mix64_int
from .zch_types import COUNTERS, ZchConfig, ZchLookup, check_ids


class ReferenceZchTable:
    def __init__(self, config: ZchConfig) -> None:
        self.config = config
        self.identities = [-1] * config.zch_size
        self.last_seen = [0] * config.zch_size
        self.counts = [0] * config.zch_size
        self.pending_ids = [-1] * config.pending_size
        self.pending_counts = [0] * config.pending_size
        self.counters = [0] * len(COUNTERS)
        self.step = 0

    def window(self, raw_id: int) -> list[int]:
        cfg = self.config
        h = mix64_int(raw_id) >> 1
        bucket, home = h % cfg.num_buckets, (h // cfg.num_buckets) % cfg.bucket_size
        return [bucket * cfg.bucket_size + (home + k) % cfg.bucket_size for k in range(cfg.max_probe)]

    def find(self, raw_id: int) -> int | None:
        for slot in self.window(raw_id):
            if self.identities[slot] == raw_id:
                return slot
        return None

    def lookup(self, ids: torch.Tensor, times: torch.Tensor | None = None, *, train: bool = True) -> ZchLookup:
        check_ids(ids, times)
        cfg = self.config
        flat = ids.reshape(-1).tolist()
        flat_times = times.reshape(-1).tolist() if times is not None else None
        order: list[int] = []  # unique ids, first occurrence first
        occurrences: dict[int, int] = {}
        latest: dict[int, int] = {}  # ttl clock per id: its latest event time in the call
        for i, raw_id in enumerate(flat):
            if raw_id not in occurrences:
                order.append(raw_id)
                occurrences[raw_id] = 0
            occurrences[raw_id] += 1
            if flat_times is not None:
                latest[raw_id] = max(latest.get(raw_id, flat_times[i]), flat_times[i])
        stats = dict.fromkeys(COUNTERS, 0)
        stats["lookups"] = len(flat)
        hit_slot: dict[int, int] = {}
        for raw_id in order:
            slot = self.find(raw_id)
            if slot is not None:
                hit_slot[raw_id] = slot
                stats["hits"] += occurrences[raw_id]
        if not train:
            stats["collisions"] = len(flat) - stats["hits"]
            rows = [hit_slot.get(raw_id, cfg.fallback_row) for raw_id in flat]
            return self._result(ids, rows, [], stats)
        if cfg.policy == "ttl" and times is None:
            raise ValueError("times: policy 'ttl' needs the event time of every id in training")

        self.step += 1
        clock = {raw_id: latest[raw_id] if cfg.policy == "ttl" else self.step for raw_id in order}
        misses = [raw_id for raw_id in order if raw_id not in hit_slot]
        seen = {raw_id: occurrences[raw_id] for raw_id in order}
        admitted = list(misses)
        if cfg.pending_size:
            admitted = []
            for raw_id in misses:  # first-occurrence order
                p = self.pending_slot(raw_id)
                if self.pending_ids[p] == raw_id:
                    seen[raw_id] += self.pending_counts[p]
                self.pending_ids[p], self.pending_counts[p] = raw_id, seen[raw_id]
                if seen[raw_id] >= cfg.admission_threshold:
                    admitted.append(raw_id)
                else:
                    stats["admission_waits"] += occurrences[raw_id]

        # Proposal rounds against the table as it was when the call began (claimed slots are off limits).
        start = (list(self.identities), list(self.last_seen), list(self.counts))
        claimed = set(hit_slot.values())
        placed: dict[int, int] = {}
        unplaced = admitted
        while unplaced:
            taken: dict[int, int] = {}
            losers = []
            for raw_id in unplaced:
                slot = self.best_slot(raw_id, claimed, clock[raw_id], start)
                if slot is None:
                    continue  # nothing open in its window: fallback row
                if slot in taken:
                    losers.append(raw_id)
                else:
                    taken[slot] = raw_id
            for slot, raw_id in taken.items():
                placed[raw_id] = slot
                claimed.add(slot)
            unplaced = losers

        for raw_id, slot in hit_slot.items():
            self.counts[slot] = self.count_now(slot, clock[raw_id], self.counts, self.last_seen) + occurrences[raw_id]
            if cfg.policy == "ttl":
                self.last_seen[slot] = max(self.last_seen[slot], clock[raw_id])
            else:
                self.last_seen[slot] = clock[raw_id]
        for raw_id, slot in placed.items():
            if self.identities[slot] >= 0:
                stats["evictions"] += 1
                stats["evicted_age_sum"] += clock[raw_id] - self.last_seen[slot]
            stats["inserts"] += 1
            self.identities[slot], self.last_seen[slot], self.counts[slot] = raw_id, clock[raw_id], seen[raw_id]
            if cfg.pending_size:
                p = self.pending_slot(raw_id)
                if self.pending_ids[p] == raw_id:
                    self.pending_ids[p], self.pending_counts[p] = -1, 0
        row = {**hit_slot, **placed}
        stats["collisions"] = sum(occurrences[raw_id] for raw_id in order if raw_id not in row)
        for i, name in enumerate(COUNTERS):
            self.counters[i] += stats[name]
        rows = [row.get(raw_id, cfg.fallback_row) for raw_id in flat]
        return self._result(ids, rows, sorted(placed.values()), stats)

    def best_slot(
        self, raw_id: int, claimed: set[int], now: int, start: tuple[list[int], list[int], list[int]]
    ) -> int | None:
        """The nearest unclaimed empty slot, else the policy's victim among the unclaimed ones, else None."""
        identities, last_seen, counts = start
        window = self.window(raw_id)
        for slot in window:
            if slot not in claimed and identities[slot] < 0:
                return slot
        victims = []
        for distance, slot in enumerate(window):
            if slot in claimed:
                continue
            if self.config.policy == "ttl":
                assert self.config.ttl is not None
                if now - last_seen[slot] > self.config.ttl:
                    victims.append((last_seen[slot], distance, slot))
            elif self.config.policy == "lru":
                victims.append((last_seen[slot], distance, slot))
            else:
                victims.append((self.count_now(slot, now, counts, last_seen), last_seen[slot], distance, slot))
        return min(victims)[-1] if victims else None

    def count_now(self, slot: int, now: int, counts: list[int], last_seen: list[int]) -> int:
        """lfu: the slot's count halved once for every ``lfu_halflife`` calls its id went unseen."""
        halflife = self.config.lfu_halflife
        if not halflife:
            return counts[slot]
        return counts[slot] >> min((now - last_seen[slot]) // halflife, 63)

    def pending_slot(self, raw_id: int) -> int:
        return (mix64_int(signed(mix64_int(raw_id))) >> 1) % self.config.pending_size

    def _result(self, ids: torch.Tensor, rows: list[int], reassigned: list[int], stats: dict[str, int]) -> ZchLookup:
        return ZchLookup(
            torch.tensor(rows, dtype=torch.int64).reshape(ids.shape),
            torch.tensor(reassigned, dtype=torch.int64),
            torch.tensor([stats[name] for name in COUNTERS], dtype=torch.int64),
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        return {
            "identities": tensor(self.identities),
            "last_seen": tensor(self.last_seen),
            "counts": tensor(self.counts),
            "pending_ids": tensor(self.pending_ids),
            "pending_counts": tensor(self.pending_counts),
            "counters": tensor(self.counters),
            "step": torch.tensor(self.step, dtype=torch.int64),
            "layout": torch.tensor(self.config.layout, dtype=torch.int64),
        }


def signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value
