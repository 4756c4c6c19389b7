"""Id statistics of ``freescale stats`` with bounded memory: ``batch_overlap_rate`` per table and
global batch size, item popularity, unique ids, id ranges and ``hash_collision_rate``.

Every sample carries ids of several *tables* (``item`` and ``action`` per event, ``user`` and each
user feature per sample) and a *fine batch*: the finest common refinement of every batch layout the
report asks for (e.g. global batches of 256, 1024, … consecutive samples of the random order, or a
prepared dataset's step groups). Each layout's batch is a non-decreasing function of the fine
batch, so one set of records serves all of them.

1. ``spill_chunk`` (per partition or chunk of rows, in worker processes): per table, the
   ``(id, fine)`` records, packed into one int64 key when the ids are small enough (and counted
   into distinct keys when their range is narrow), and spilled into ``n_buckets`` files by a hash
   of the id.
2. ``IdReducer.count`` (one table of one bucket, in worker processes; ``IdReducer.merge`` adds the
   results up in the driver): records sorted by key give per id its occurrence
   count (popularity), per layout the distinct ids of every batch and how many of them were also
   in the previous batch (an id in batches n-1 and n is two adjacent records), and per table
   size T which rows of a modulo-hashed table are taken.

A bucket holds every record of its ids, so all counters are exact; a worker holds one table's share
of a bucket, the driver the per-batch counters and one byte per row of each hashed table size.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from freescale.pipeline.stats import figures
from freescale.pipeline.steps.scan import count_values

BASE_TABLES = ("item", "action", "user")


def table_names(features: list[str]) -> list[str]:
    """``item``, ``action`` (per event), ``user`` and ``user.<feature>`` (per sample)."""
    return [*BASE_TABLES, *(f"user.{name}" for name in features)]


def fine_bits(n_fine: int) -> int:
    return max(int(n_fine - 1).bit_length(), 1)


def _bucket_of(ids: np.ndarray, n_buckets: int) -> np.ndarray:
    """Each id's bucket, as uint16 when it fits: numpy's stable argsort of 16-bit keys is a radix sort
    (``spill_table`` groups records by bucket with it: int64 keys took 60% of its time). The bucket
    is the high 32 bits of a multiplicative hash scaled to ``[0, n_buckets)`` by a multiply and a
    shift (Lemire's range reduction), not a modulo: a 64-bit division per record cost 3x as much."""
    dtype = np.uint16 if n_buckets <= 2**16 else np.int64
    if n_buckets == 1:
        return np.zeros(ids.size, dtype)
    if n_buckets >= 2**32:
        raise ValueError(f"n_buckets must be < 2**32, got {n_buckets}")
    with np.errstate(over="ignore"):
        mixed = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    mixed >>= np.uint64(32)
    mixed *= np.uint64(n_buckets)
    mixed >>= np.uint64(32)
    return mixed.astype(dtype)


SPILL_SUFFIX = ".spill"


def _write(path: Path, **arrays: np.ndarray) -> None:
    """A spill file: the array names, then each array, as consecutive ``.npy`` records. Why not
    ``np.savez``: its zip framing (a CRC of every byte) cost ~2x the write and ~5x the read."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, np.array(list(arrays)), allow_pickle=False)
        for values in arrays.values():
            np.save(handle, values, allow_pickle=False)
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, np.ndarray]:
    """The arrays ``_write`` wrote, by name."""
    with open(path, "rb") as handle:
        names = np.load(handle, allow_pickle=False)
        return {str(name): np.load(handle, allow_pickle=False) for name in names}


def spill_table(
    spill_dir: str, table: int, chunk: int, n_buckets: int, bits: int, ids: np.ndarray, fine: np.ndarray
) -> int:
    """Spill one table's ``(id, fine)`` records of one chunk into id-hash buckets; returns the count.

    Ids that fit beside the fine batch in 62 bits are packed into one int64 key, or uint32 when they
    fit in 32 bits: half the bytes to write, read back and sort (numpy sorts 32-bit keys ~2x faster),
    for the largest table (items) of every dataset with fewer than ~4M item ids. Keys in a narrow
    range (actions, profile buckets: a few values per fine batch) are deduplicated here by counting
    (one pass, ``_dedup_small``); others are written as they are and sorted once, at reduce time: a
    sort here as well (``np.unique``) cost more than it saved there (item ids: 1.3M records of a
    partition deduplicate to ~0.9M). Ids that do not fit (63-bit hashed ids) are written raw."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        return 0
    fine = np.asarray(fine, dtype=np.int64)
    if ids.min() >= 0 and int(ids.max()) < (1 << (62 - bits)):
        keys = (ids << bits) | fine
        arrays = _dedup_small(keys)
        bucket = _bucket_of(arrays["key"] >> bits, n_buckets)
        if bits < 32 and int(ids.max()) < (1 << (32 - bits)):  # item ids up to 2^20 beside 4,096 fine batches
            arrays["key"] = arrays["key"].astype(np.uint32)
    else:
        arrays, bucket = {"id": ids, "fine": fine}, _bucket_of(ids, n_buckets)
    order = np.argsort(bucket, kind="stable") if n_buckets > 1 else None
    bounds = np.concatenate([[0], np.cumsum(np.bincount(bucket, minlength=n_buckets))])
    for b in range(n_buckets):
        if bounds[b] == bounds[b + 1]:
            continue
        rows = order[bounds[b] : bounds[b + 1]] if order is not None else slice(None)
        _write(
            Path(spill_dir) / f"t{table:03d}.b{b:05d}.c{chunk:05d}{SPILL_SUFFIX}",
            **{name: values[rows] for name, values in arrays.items()},
        )
    return int(next(iter(arrays.values())).size)


def _dedup_small(keys: np.ndarray) -> dict[str, np.ndarray]:
    """``{"key", "count"}`` of distinct keys when their range is narrow enough to count them in one
    pass, else ``{"key"}`` (every record counts once)."""
    low, high = int(keys.min()), int(keys.max())
    if high - low >= 4 * keys.size + 1024:
        return {"key": keys}
    counts = np.bincount(keys - low)
    distinct = np.flatnonzero(counts)
    return {"key": distinct + low, "count": counts[distinct].astype(np.int64)}


def spill_chunk(
    spill_dir: str,
    chunk: int,
    n_buckets: int,
    bits: int,
    event_fine: np.ndarray,
    items: np.ndarray,
    actions: np.ndarray,
    fine: np.ndarray,
    users: np.ndarray,
    features: np.ndarray | None,
) -> int:
    """Spill the id records of one chunk of samples; returns how many were written.

    ``items``/``actions`` and their ``event_fine`` are per event (in any order), ``fine``/``users``/
    ``features`` per sample. Files ``t<table>.b<bucket>.c<chunk>.spill`` appear atomically."""
    fine = np.asarray(fine, dtype=np.int64)
    parts = [(items, event_fine), (actions, event_fine), (users, fine)]
    if features is not None:
        parts += [(features[:, j], fine) for j in range(features.shape[1])]
    return sum(spill_table(spill_dir, j, chunk, n_buckets, bits, ids, f) for j, (ids, f) in enumerate(parts))


def _sorted_records(files: list[Path], bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sorted distinct keys ``rank_or_id << bits | fine`` with summed counts; ``uid`` maps ranks to ids
    when raw (unpackable) records were present, else None (the key holds the id itself)."""
    loaded = [_read(path) for path in files]
    uid = None
    if all("key" in data for data in loaded):
        keys = np.concatenate([data["key"] for data in loaded])
        counts = _counts(loaded, [data["key"].size for data in loaded])
    else:
        ids, fine, cnt = [], [], []
        for data in loaded:
            if "key" in data:
                ids.append(data["key"] >> bits)
                fine.append(data["key"] & ((1 << bits) - 1))
                cnt.append(data["count"] if "count" in data else np.ones(data["key"].size, np.int64))
            else:
                ids.append(data["id"])
                fine.append(data["fine"])
                cnt.append(np.ones(data["id"].size, np.int64))
        raw_ids = np.concatenate(ids)
        rank = pl.Series(raw_ids).rank("dense").to_numpy().astype(np.int64) - 1
        uid = np.empty(int(rank.max()) + 1, np.int64)
        uid[rank] = raw_ids
        keys, counts = (rank << bits) | np.concatenate(fine), np.concatenate(cnt)
    if counts is None:  # every record counts once: sorting the keys alone is enough (numpy: ~2x polars)
        distinct, counts = count_values(keys)  # uint32 when every chunk's keys were (``spill_table``)
        return distinct, counts, uid
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    first = np.ones(keys.size, dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(first)
    return keys[starts].astype(np.int64), np.add.reduceat(counts, starts), uid


def _counts(loaded: list[Any], sizes: list[int]) -> np.ndarray | None:
    """Each record's count, or ``None`` when every record counts once."""
    if not any("count" in data for data in loaded):
        return None
    return np.concatenate(
        [data["count"] if "count" in data else np.ones(size, np.int64) for data, size in zip(loaded, sizes)]
    )


@dataclass
class Layout:
    """One way of cutting the sample order into global batches: ``batch_of_fine[f]`` is the batch
    of fine batch f (non-decreasing); batches ``< full_batches`` are complete."""

    name: str
    global_batch_size: int | None  # None: variable (a prepared dataset's step groups)
    batch_of_fine: np.ndarray
    n_batches: int
    full_batches: int


@dataclass
class BucketCounts:
    """One table's counters over one bucket (``IdReducer.count``), what a worker hands back to
    ``IdReducer.merge``: ids never span buckets, so distinct counts add up exactly."""

    table: int
    distinct: int
    occurrences: int
    min_id: int
    max_id: int
    freq_of_freq: dict[int, int]
    rows: dict[int, tuple[np.ndarray, np.ndarray]]  # table size T -> (rows used, ids in each)
    unique: list[np.ndarray]  # per layout: distinct ids per batch
    overlap: list[np.ndarray]  # per layout: ids also in the previous batch


def count_bucket(reducer: IdReducer, spill_dir: str, bucket: int, j: int) -> BucketCounts | None:
    """``reducer.count``, as a step call for the executors (a module-level function)."""
    return reducer.count(spill_dir, bucket, j)


@dataclass
class IdReducer:
    """Exact per-table counters, merged bucket after bucket."""

    tables: list[str]
    table_sizes: tuple[int, ...]
    layouts: list[Layout]
    bits: int  # fine_bits(number of fine batches)
    distinct: np.ndarray = field(init=False)
    occurrences: np.ndarray = field(init=False)
    min_id: list[int | None] = field(init=False)
    max_id: list[int | None] = field(init=False)
    freq_of_freq: list[Counter] = field(init=False)
    unique: list[np.ndarray] = field(init=False)
    overlap: list[np.ndarray] = field(init=False)
    rows: dict[tuple[int, int], np.ndarray] = field(init=False)
    _order: list[int] = field(init=False)
    _identity: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.tables)
        self.distinct = np.zeros(n, np.int64)
        self.occurrences = np.zeros(n, np.int64)
        self.min_id, self.max_id = [None] * n, [None] * n
        self.freq_of_freq = [Counter() for _ in range(n)]
        self.unique = [np.zeros((n, layout.n_batches), np.int64) for layout in self.layouts]
        self.overlap = [np.zeros((n, layout.n_batches), np.int64) for layout in self.layouts]
        self.rows = {}
        sizes = [layout.global_batch_size or 0 for layout in self.layouts]
        self._identity = [
            np.array_equal(layout.batch_of_fine, np.arange(layout.batch_of_fine.size)) for layout in self.layouts
        ]
        self._order = sorted(range(len(self.layouts)), key=lambda i: (self.layouts[i].name != "step_group", sizes[i]))

    def count(self, spill_dir: str, bucket: int, j: int) -> BucketCounts | None:
        """Table ``j``'s counters over one bucket (``None``: no records), without changing this
        reducer: (table, bucket) pairs are independent, so workers count them and ``merge`` adds
        them up. Deletes the bucket's files of the table."""
        files = sorted(Path(spill_dir).glob(f"t{j:03d}.b{bucket:05d}.c*{SPILL_SUFFIX}"))
        if not files:
            return None
        keys, counts, uid = _sorted_records(files, self.bits)
        for path in files:
            path.unlink()
        id_part, fine = keys >> self.bits, keys & ((1 << self.bits) - 1)
        new_id = np.ones(keys.size, dtype=bool)
        new_id[1:] = id_part[1:] != id_part[:-1]
        starts = np.flatnonzero(new_id)
        ids = id_part[starts] if uid is None else uid[id_part[starts]]
        freq = np.add.reduceat(counts, starts)
        values, mult = np.unique(freq, return_counts=True)
        unique, overlap = self._layout_counts(fine, new_id)
        return BucketCounts(
            table=j,
            distinct=int(ids.size),
            occurrences=int(freq.sum()),
            min_id=int(ids.min()),
            max_id=int(ids.max()),
            freq_of_freq=dict(zip(values.tolist(), mult.tolist())),
            rows={size: np.unique(ids % size, return_counts=True) for size in self.table_sizes},
            unique=unique,
            overlap=overlap,
        )

    def merge(self, part: BucketCounts | None) -> None:
        """Add one (table, bucket)'s counters: sums, extremes, and per hashed row min(ids, 2)."""
        if part is None:
            return
        j = part.table
        self.distinct[j] += part.distinct
        self.occurrences[j] += part.occurrences
        self.min_id[j] = part.min_id if self.min_id[j] is None else min(self.min_id[j], part.min_id)
        self.max_id[j] = part.max_id if self.max_id[j] is None else max(self.max_id[j], part.max_id)
        self.freq_of_freq[j].update(part.freq_of_freq)
        for size, (used, hits) in part.rows.items():
            state = self.rows.get((j, size))
            if state is None:
                state = self.rows[(j, size)] = np.zeros(size, np.uint8)
            state[used] = np.minimum(state[used].astype(np.int64) + hits, 2).astype(np.uint8)
        for index in range(len(self.layouts)):
            self.unique[index][j] += part.unique[index]
            self.overlap[index][j] += part.overlap[index]

    def _layout_counts(self, fine: np.ndarray, new_id: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Distinct ids per batch and those also in the previous batch, for every layout: after
        mapping fine batches to a layout's batches, an id in batches n-1 and n is two adjacent
        records. Layouts whose size is a multiple of the previous one start from its (smaller)
        deduplicated records."""
        unique: list[np.ndarray] = [np.zeros(0, np.int64)] * len(self.layouts)
        overlap: list[np.ndarray] = [np.zeros(0, np.int64)] * len(self.layouts)
        previous: tuple[int, np.ndarray, np.ndarray] | None = None  # (size, batch, first-of-id)
        for index in self._order:
            layout = self.layouts[index]
            size = layout.global_batch_size
            if self._identity[index]:  # batch = fine batch: records are distinct (id, batch) already
                batch, first = fine, new_id
            else:
                if previous is not None and size is not None and size % previous[0] == 0:
                    batch, first = previous[1] // (size // previous[0]), previous[2]
                else:
                    batch, first = layout.batch_of_fine[fine], new_id
                keep = first.copy()
                keep[1:] |= batch[1:] != batch[:-1]
                batch, first = batch[keep], first[keep]
            nb = layout.n_batches
            unique[index] = np.bincount(batch, minlength=nb)
            again = ~first[1:] & (batch[1:] == batch[:-1] + 1)
            overlap[index] = np.bincount(batch[1:][again], minlength=nb)
            if size is not None and layout.name != "step_group":
                previous = (size, batch, first)
        return unique, overlap

    # ---------------------------------------------------------------------------------- results
    def ids_report(self) -> dict[str, Any]:
        """Unique ids, id range and ``hash_collision_rate`` per table and table size."""
        out: dict[str, Any] = {}
        for j, name in enumerate(self.tables):
            n = int(self.distinct[j])
            entry: dict[str, Any] = {
                "unique_ids": n,
                "occurrences": int(self.occurrences[j]),
                "min_id": self.min_id[j],
                "max_id": self.max_id[j],
                "hash_collision_rate": {},
                "colliding_ids": {},
                "rows_used": {},
                "expected_if_random": {},
            }
            for size in self.table_sizes:
                state = self.rows.get((j, size))
                used, single = figures.collision_counts(state) if state is not None else (0, 0)
                entry["hash_collision_rate"][str(size)] = figures.hash_collision_rate(n, single)
                entry["colliding_ids"][str(size)] = n - single
                entry["rows_used"][str(size)] = used
                entry["expected_if_random"][str(size)] = figures.expected_collision_rate(n, size)
            out[name] = entry
        return out

    def overlap_report(self, index: int) -> dict[str, Any]:
        layout = self.layouts[index]
        return {
            name: figures.overlap_rates(self.overlap[index][j], self.unique[index][j], layout.full_batches)
            for j, name in enumerate(self.tables)
        }


def fine_batches_equal(n: int, sizes: list[int]) -> tuple[int, list[Layout]]:
    """Fine batches of ``gcd(sizes)`` consecutive positions and one layout per global batch size."""
    g0 = int(np.gcd.reduce(np.asarray(sizes, dtype=np.int64)))
    n_fine = max(-(-n // g0), 1)
    starts = np.arange(n_fine, dtype=np.int64) * g0
    layouts = [Layout(f"global_batch_{b}", b, starts // b, max(-(-n // b), 1), n // b) for b in sizes]
    return g0, layouts


@dataclass
class FineTracker:
    """Fine batches for rows read in order whose layouts are known only while reading (a prepared
    dataset's step groups next to batches of consecutive rows): a new fine batch starts whenever
    the step group or the ``gcd(sizes)`` cell of the position changes."""

    sizes: list[int]
    g0: int = field(init=False)
    groups: list[np.ndarray] = field(default_factory=list)
    starts: list[np.ndarray] = field(default_factory=list)
    last: tuple[int, int] | None = None
    count: int = 0

    def __post_init__(self) -> None:
        self.g0 = int(np.gcd.reduce(np.asarray(self.sizes, dtype=np.int64)))

    def assign(self, positions: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Fine batch of each row (positions ascending, continuing the previous call)."""
        if positions.size == 0:
            return np.zeros(0, np.int64)
        cell = positions // self.g0
        change = np.ones(positions.size, dtype=bool)
        change[1:] = (cell[1:] != cell[:-1]) | (groups[1:] != groups[:-1])
        if self.last is not None and (int(cell[0]), int(groups[0])) == self.last:
            change[0] = False
        fine = self.count - (0 if change[0] else 1) + np.cumsum(change) - (1 if change[0] else 0)
        self.groups.append(groups[change])
        self.starts.append(positions[change])
        self.count = int(fine[-1]) + 1
        self.last = (int(cell[-1]), int(groups[-1]))
        return fine.astype(np.int64)

    def layouts(self, n: int, n_groups: int, group_batch: int | None) -> list[Layout]:
        groups = np.concatenate(self.groups) if self.groups else np.zeros(1, np.int64)
        starts = np.concatenate(self.starts) if self.starts else np.zeros(1, np.int64)
        out = [Layout("step_group", group_batch, groups, max(n_groups, 1), n_groups)]
        out += [Layout(f"global_batch_{b}", b, starts // b, max(-(-n // b), 1), n // b) for b in self.sizes]
        return out
