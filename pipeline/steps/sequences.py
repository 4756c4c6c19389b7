"""Phase 2 of ``prepare``: per user partition, merge sources by time and cut training samples.

Events of one user from every source are sorted by ``(ts, source, file_index, row)`` — the source
and action stay as per-event features — and the most recent ``max_uih_len`` events form the sample
(HSTU style: every position supervised). With ``window_stride`` > 0 older history becomes extra
sliding-window samples. Optional filters: minimum length and an iterative k-core over users and
items. Every event that does not reach a sample is counted under a reason, so
``events_read = events_used + events_rejected + events_filtered`` holds.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from freescale.pipeline.config import SampleConfig
from freescale.pipeline.records import PartitionRecord
from freescale.pipeline.steps.scan import read_partition, read_user_partition, remove_partition
from freescale.pipeline.steps.vocabularies import save_partition_ids

SORT_KEYS = ["user_id", "ts", "source", "file_index", "row"]  # the canonical event order
MISSING_FEATURE = -1
SAMPLE_SCHEMA = pa.schema(
    [
        ("user_id", pa.int64()),
        ("window", pa.int32()),
        ("length", pa.int32()),
        ("item_ids", pa.list_(pa.int64())),
        ("timestamps", pa.list_(pa.int64())),
        ("actions", pa.list_(pa.int32())),
        ("sources", pa.list_(pa.int8())),
        ("user_features", pa.list_(pa.int32())),
    ]
)


@dataclass(frozen=True)
class TimeSort:
    """A stable ``(user_id, ts)`` order of events, with the sorted user ids and timestamps when the
    sort keys hold them (then those two columns need no gather)."""

    order: np.ndarray  # intp permutation
    user_ids: np.ndarray | None = None
    ts: np.ndarray | None = None


def time_sort(
    user_ids: np.ndarray, ts: np.ndarray, users: np.ndarray | None = None, key_bits: int = 64
) -> TimeSort | None:
    """Sort events by ``(user_id, ts)``, stably; ``None`` if ``ts`` spans 2^32 s or more.

    Users are replaced by their rank among the partition's users (``users``: sorted distinct ids, a
    superset of ``user_ids``, computed when not given; looked up in ``user_rank``'s hash table) and
    timestamps by their offset from the earliest. When rank, offset and row number fit in one ``key_bits`` key, sorting
    the keys themselves gives the order in their low bits and the sorted users and timestamps in the
    others: the keys are unique, so no stable sort is needed (a third of the stable argsort's time).
    Otherwise rank and offset pack into a key sorted stably. Either way ties (same user and second)
    keep the input order, which the scan phase makes ``(source, file_index, row)`` order.
    """
    n = len(ts)
    if n == 0:
        return TimeSort(np.zeros(0, np.intp))
    first = int(ts.min())
    span = int(ts.max()) - first
    if span >= 2**32:
        return None
    distinct = users if users is not None else np.sort(pl.Series(user_ids).unique().to_numpy())
    rank = user_rank(user_ids, distinct)
    offset = (ts - first).astype(np.uint64)
    rank_bits, ts_bits, row_bits = (max(value, 1).bit_length() for value in (len(distinct) - 1, span, n - 1))
    if rank_bits + ts_bits + row_bits <= key_bits:
        key = (rank << np.uint64(ts_bits + row_bits)) | (offset << np.uint64(row_bits))
        key |= np.arange(n, dtype=np.uint64)
        key.sort()
        order = (key & np.uint64((1 << row_bits) - 1)).astype(np.intp)
        key >>= np.uint64(row_bits)
        sorted_ts = (key & np.uint64((1 << ts_bits) - 1)).astype(np.int64) + first
        sorted_users = distinct[(key >> np.uint64(ts_bits)).astype(np.intp)]
        return TimeSort(order, sorted_users.astype(np.int64, copy=False), sorted_ts.astype(ts.dtype, copy=False))
    packed = pl.DataFrame({"key": (rank << np.uint64(32)) | offset})
    order = packed.select(pl.arg_sort_by("key", maintain_order=True)).to_series().to_numpy()
    return TimeSort(order.astype(np.intp))  # numpy gathers with a uint32 index through its slow general path


_SLOT_MULTIPLIER = np.uint64(0xFF51AFD7ED558CCD)  # murmur3's mixer, not partition_of's multiplier


def user_rank(user_ids: np.ndarray, distinct: np.ndarray) -> np.ndarray:
    """Each event's user as its position in ``distinct`` (sorted, unique), as uint64.

    A vectorised open-addressing hash table over ``distinct``, four times sparser than its keys: a
    partition's table (~5k users, ~100 KB) stays in cache and nearly every lookup is one probe: a
    handful of numpy passes over the events. The polars hash join it replaces faulted in ~5x more
    fresh memory; the samples phase of ``large`` (19 partitions, run serially) lost ~0.3 s of 2 s
    finding and sorting events.
    """
    bits = max(int(4 * len(distinct) - 1).bit_length(), 4)
    keys, ranks = _rank_table(distinct, bits)
    slot = _home_slot(user_ids, bits)
    rank = ranks[slot]
    todo = np.flatnonzero((keys[slot] != user_ids) | (rank < 0))  # an empty slot's key 0 is no user 0
    while len(todo):  # linear probing: the next slot until the key or an empty slot
        slot[todo] = (slot[todo] + 1) & (len(keys) - 1)
        probed = ranks[slot[todo]]
        if (probed < 0).any():
            raise ValueError("time_sort: 'users' must hold every user id of the events")
        hit = keys[slot[todo]] == user_ids[todo]
        rank[todo[hit]] = probed[hit]
        todo = todo[~hit]
    return rank.view(np.uint64)  # every rank found: none negative


def _home_slot(ids: np.ndarray, bits: int) -> np.ndarray:
    """Fibonacci hashing: the top ``bits`` of the id times an odd constant (two passes, no copies)."""
    slot = np.ascontiguousarray(ids, np.int64).view(np.uint64) * _SLOT_MULTIPLIER
    slot >>= np.uint64(64 - bits)
    return slot.view(np.intp)


def _rank_table(distinct: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Slots of ``2**bits`` holding each distinct id and its rank (rank -1: empty slot)."""
    keys = np.zeros(1 << bits, np.int64)
    ranks = np.full(1 << bits, -1, np.int64)
    pending = np.arange(len(distinct))
    slot = _home_slot(distinct, bits)
    while len(pending):
        free = ranks[slot] < 0
        # of the keys aiming at one free slot, the first takes it; the others probe on
        targets, first = np.unique(slot[free], return_index=True)
        placed = np.flatnonzero(free)[first]
        keys[targets], ranks[targets] = distinct[pending[placed]], pending[placed]
        left = np.ones(len(pending), bool)
        left[placed] = False
        pending, slot = pending[left], (slot[left] + 1) & ((1 << bits) - 1)
    return keys, ranks


def sorted_events(
    scan_dir: str, partition: int, removed_items: np.ndarray | None, users: np.ndarray | None = None
) -> tuple[pl.DataFrame, int]:
    """A partition's events minus k-core-removed items, in per-user time order, and the count before.

    Spill files hold events in ``(source, file_index, row)`` order (``scan.read_partition``), so a
    stable sort by ``(user_id, ts)`` is the canonical ``(user_id, ts, source, file_index, row)`` order.
    ``users``: the partition's sorted user ids if known (``time_sort``).
    """
    table = read_partition(scan_dir, partition)
    events_in = table.num_rows
    frame = pl.DataFrame({name: numpy_column(table, name) for name in table.column_names})
    if removed_items is not None and len(removed_items):
        frame = frame.filter(~pl.col("item_id").is_in(pl.Series(removed_items).implode()))
    result = time_sort(frame["user_id"].to_numpy(), frame["ts"].to_numpy(), users)
    if result is None:
        return frame.sort(["user_id", "ts"], maintain_order=True), events_in
    known = {"user_id": result.user_ids, "ts": result.ts}
    columns = {
        name: known[name] if known.get(name) is not None else frame[name].to_numpy()[result.order]
        for name in frame.columns
    }
    return pl.DataFrame(columns), events_in


def numpy_column(table: pa.Table, name: str) -> np.ndarray:
    """One contiguous numpy column out of many spill batches (a single copy)."""
    chunks = table.column(name).chunks
    if not chunks:
        return np.zeros(0, table.schema.field(name).type.to_pandas_dtype())
    return np.concatenate([chunk.to_numpy() for chunk in chunks])


def user_runs(user_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and lengths of consecutive equal user ids (input sorted by user)."""
    if len(user_ids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(user_ids)) + 1])
    lengths = np.diff(np.concatenate([starts, [len(user_ids)]]))
    return starts.astype(np.int64), lengths.astype(np.int64)


def kcore_item_counts(
    scan_dir: str, partition: int, removed_items: np.ndarray, k: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One k-core pass: item counts among users that keep ≥ k events once ``removed_items`` are gone,
    and every user's event count then (columns ``user_id``, ``count``: what the plan needs after
    the last pass)."""
    frame, _ = sorted_events(scan_dir, partition, removed_items)
    user_counts = frame.group_by("user_id").len().rename({"len": "count"})
    kept_users = user_counts.filter(pl.col("count") >= k).select("user_id")
    kept = frame.join(kept_users, on="user_id", how="semi")
    return kept.group_by("item_id").len().rename({"len": "count"}), user_counts


def dropped_users(counts: np.ndarray, cfg: SampleConfig) -> tuple[np.ndarray, np.ndarray]:
    """Users below the k-core size and, among the rest, users shorter than ``min_len`` (two masks)."""
    weak = counts < cfg.kcore if cfg.kcore else np.zeros(len(counts), bool)
    return weak, ~weak & (counts < cfg.min_len)


def planned_samples(users: np.ndarray, counts: np.ndarray, cfg: SampleConfig) -> dict[str, np.ndarray]:
    """User, window and length of every sample ``build_samples`` will cut, from per-user event counts
    alone (``users`` sorted): the plan is made from these before any sample is built. Same order as
    ``build_samples``' output, (user_id, window), and the same filters and window rules."""
    keep, bounds = planned_windows(counts, cfg)
    return {
        "user_id": users[keep][bounds["run"]],
        "window": bounds["window"].astype(np.int32),
        "length": (bounds["end"] - bounds["begin"]).astype(np.int64),
    }


def planned_windows(counts: np.ndarray, cfg: SampleConfig) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Which users ``build_samples`` keeps (a mask over ``counts``) and their windows' bounds counted
    from each user's first event (``_window_bounds``: ``run`` indexes the kept users)."""
    weak, short = dropped_users(counts, cfg)
    keep = ~(weak | short)
    kept = counts[keep]
    return keep, _window_bounds(np.zeros_like(kept), kept, cfg)


def _window_bounds(starts: np.ndarray, counts: np.ndarray, cfg: SampleConfig) -> dict[str, np.ndarray]:
    """Per-window [begin, end) event offsets, its user run and window number (0 = most recent)."""
    if cfg.window_stride:
        per_user = 1 + (counts - cfg.min_len) // cfg.window_stride
    else:
        per_user = np.ones_like(counts)
    run = np.repeat(np.arange(len(counts)), per_user)
    first_of_run = np.repeat(np.cumsum(per_user) - per_user, per_user)
    window = np.arange(len(run)) - first_of_run
    end = starts[run] + counts[run] - window * cfg.window_stride
    begin = np.maximum(starts[run], end - cfg.max_uih_len)
    return {"run": run, "window": window, "begin": begin, "end": end}


def _window_index(begin: np.ndarray, end: np.ndarray, gather: bool) -> tuple[pa.Array, np.ndarray | None]:
    """List offsets of the samples and (when ``gather``) the event index collecting every window's
    events, in order; without ``gather`` the windows tile the events exactly and need no index."""
    lengths = end - begin
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    if not gather:
        return pa.array(offsets), None
    index = np.repeat(begin - offsets[:-1], lengths) + np.arange(offsets[-1])
    return pa.array(offsets), index


def user_feature_lists(
    users: np.ndarray, scan_dir: str, partition: int, feature_names: list[str]
) -> tuple[pa.Array, int]:
    """Integer profile features per sample; users absent from the table get ``MISSING_FEATURE``."""
    width = len(feature_names)
    flat = np.full((len(users), width), MISSING_FEATURE, dtype=np.int32)
    missing = 0
    table = read_user_partition(scan_dir, partition) if width else None
    if table is not None and table.num_rows:
        profile = pl.from_arrow(table).unique("user_id", keep="first", maintain_order=True)
        joined = pl.DataFrame({"user_id": users}).join(profile, on="user_id", how="left", maintain_order="left")
        for column, name in enumerate(feature_names):
            flat[:, column] = joined[name].fill_null(MISSING_FEATURE).cast(pl.Int32).to_numpy()
        missing = int(joined[feature_names[0]].null_count())
    elif width:
        missing = len(users)
    offsets = np.arange(len(users) + 1, dtype=np.int32) * width
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.reshape(-1))), missing


def build_samples(
    frame: pl.DataFrame, cfg: SampleConfig, scan_dir: str, partition: int, feature_names: list[str]
) -> tuple[pa.Table, PartitionRecord]:
    """Cut samples from sorted events; returns the sample table and its event accounting."""
    users_all = frame["user_id"].to_numpy()
    starts, counts = user_runs(users_all)
    users_in = len(starts)
    weak, short = dropped_users(counts, cfg)
    kcore_dropped, min_len_dropped = int(counts[weak].sum()), int(counts[short].sum())
    starts, counts = starts[~(weak | short)], counts[~(weak | short)]
    bounds = _window_bounds(starts, counts, cfg)
    oldest_begin = np.full(len(counts), np.iinfo(np.int64).max)
    np.minimum.at(oldest_begin, bounds["run"], bounds["begin"])
    used = int((starts + counts - oldest_begin).sum()) if len(counts) else 0
    identity = not cfg.window_stride and used == len(users_all)  # every event once, in order
    offsets, index = _window_index(bounds["begin"], bounds["end"], gather=not identity)
    columns: dict[str, pa.Array] = {}
    for name, source_column, dtype in (
        ("item_ids", "item_id", pa.int64()),
        ("timestamps", "ts", pa.int64()),
        ("actions", "action", pa.int32()),
        ("sources", "source", pa.int8()),
    ):
        values = frame[source_column].to_numpy()
        values = values if index is None else values[index]
        columns[name] = pa.ListArray.from_arrays(offsets, pa.array(values, type=dtype))
    sample_users = users_all[starts[bounds["run"]]] if len(counts) else np.zeros(0, np.int64)
    features, missing_profiles = user_feature_lists(sample_users, scan_dir, partition, feature_names)
    table = pa.table(
        {
            "user_id": pa.array(sample_users, pa.int64()),
            "window": pa.array(bounds["window"], pa.int32()),
            "length": pa.array(bounds["end"] - bounds["begin"], pa.int32()),
            **columns,
            "user_features": features,
        },
        schema=SAMPLE_SCHEMA,
    )
    record = PartitionRecord(
        events_in=len(users_all),
        events_used=int(used),
        filtered={
            "kcore": int(kcore_dropped),
            "min_len": int(min_len_dropped),
            "truncated_max_uih_len": int(len(users_all) - kcore_dropped - min_len_dropped - used),
        },
        users_in=int(users_in),
        users_kept=len(counts),
        samples=table.num_rows,
        samples_without_profile=int(missing_profiles) if feature_names else 0,
    )
    return table, record


def write_sample_file(samples_dir: str, table: pa.Table, partition: int) -> None:
    """The default sink of ``run_partition``: ``samples_dir/pNNNNN.arrow`` (``read_samples``)."""
    out = Path(samples_dir) / f"p{partition:05d}.arrow"
    with ipc.new_file(f"{out}.tmp", SAMPLE_SCHEMA) as writer:
        writer.write_table(table)
    os.replace(f"{out}.tmp", out)


def run_partition(
    scan_dir: str,
    samples_dir: str,
    partition: int,
    cfg: SampleConfig,
    removed_items_path: str | None,
    feature_names: list[str],
    sink: Callable[[pa.Table, int], None] | None = None,
    users: np.ndarray | None = None,
    keep_input: bool = False,
) -> PartitionRecord:
    """Build one partition's samples and hand them to ``sink(table, partition)`` (default: the sample
    file, ``write_sample_file``; ``prepare`` encodes them into plan-order buckets instead, ``stats``
    counts their ids). ``users``: the partition's sorted user ids when known (saves finding them).
    The record JSON in ``samples_dir``, written last, is the completion marker; before it, the
    partition's distinct ids per table (``vocabularies.save_partition_ids``). The partition's spill
    files are then deleted unless ``keep_input`` (``stats --work-dir``: a later run rebuilds from
    them with other options instead of scanning again)."""
    removed = np.load(removed_items_path) if removed_items_path else None
    frame, events_in = sorted_events(scan_dir, partition, removed, users)
    removed_events = events_in - frame.height
    table, record = build_samples(frame, cfg, scan_dir, partition, feature_names)
    record.events_in += removed_events
    record.filtered["kcore"] += removed_events
    (sink or functools.partial(write_sample_file, samples_dir))(table, partition)
    save_partition_ids(samples_dir, partition, table, feature_names)
    record.save(Path(samples_dir) / f"p{partition:05d}.json")
    if not keep_input:
        remove_partition(scan_dir, partition)  # consumed: its pages go to the next files written
    return record


def load_partition_record(samples_dir: str, partition: int) -> PartitionRecord | None:
    return PartitionRecord.load_if_done(Path(samples_dir) / f"p{partition:05d}.json")


def read_samples(samples_dir: str, partition: int, columns: list[str] | None = None) -> pa.Table:
    table = ipc.open_file(pa.memory_map(str(Path(samples_dir) / f"p{partition:05d}.arrow"))).read_all()
    return table.select(columns) if columns else table
