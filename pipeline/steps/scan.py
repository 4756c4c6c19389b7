"""Phase 1 of ``prepare``: read every source once and spill validated events by user partition.

Each read task (a row-group or byte range of one file, planned by ``freescale.datasets``) runs in a
worker process, normalizes rows to the canonical event schema, and appends them to one Arrow IPC
file per user partition. A user's events from all sources land in the same partition, so phase 2
can build sequences one partition at a time within the memory limit. Each finished task writes a
JSON record (its row accounting and quarantine examples) that doubles as its completion marker, so
a killed job skips finished tasks when it resumes.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from freescale.datasets.sources import EVENT_SCHEMA, SourcesConfig, plan_read_tasks, read_task, read_user_table
from freescale.pipeline.memory import read_chunk_sizes

# What a spill file keeps of an event: the tie-break columns (file_index, row) are implied by the
# order of the rows (see ``read_partition``), so they are not written; timestamps are validated to
# [1970, 2100) seconds, so they fit uint32 (4 bytes less per event to write and read back).
SPILL_SCHEMA = pa.schema(
    [
        EVENT_SCHEMA.field("user_id"),
        EVENT_SCHEMA.field("item_id"),
        pa.field("ts", pa.uint32()),
        EVENT_SCHEMA.field("action"),
        EVENT_SCHEMA.field("source"),
    ]
)


def partition_of(user_ids: np.ndarray, n_partitions: int) -> np.ndarray:
    """Deterministic user → partition map (Fibonacci hashing; independent of the input order)."""
    mixed = user_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(29)) % np.uint64(n_partitions)).astype(np.int64)


@dataclass
class ScanSummary:
    """Row accounting and quarantine examples gathered over all read tasks."""

    rows_read: int = 0
    events_kept: int = 0
    sampled_out: int = 0  # valid events of users outside ``user_fraction`` (not spilled)
    outside_time_range: int = 0  # valid events outside ``PrepareConfig.time_range`` (not spilled)
    rejected: Counter = field(default_factory=Counter)
    rows_read_by_source: Counter = field(default_factory=Counter)
    examples: dict[str, list[dict]] = field(default_factory=dict)

    def add(self, record: dict[str, Any], examples_per_reason: int) -> None:
        self.rows_read += record["rows_read"]
        self.events_kept += record["events_kept"]
        self.sampled_out += record.get("sampled_out", 0)
        self.outside_time_range += record.get("outside_time_range", 0)
        self.rejected.update(record["rejected"])
        self.rows_read_by_source.update(record["rows_read_by_source"])
        for reason, rows in record["examples"].items():
            kept = self.examples.setdefault(reason, [])
            kept.extend(rows[: max(examples_per_reason - len(kept), 0)])

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


def _spill(
    table: pa.Table, partitions: np.ndarray, writers: dict[int, ipc.RecordBatchFileWriter], out_prefix: Path
) -> None:
    """Append each partition's rows (in their input order) to that partition's spill file."""
    small = partitions.astype(np.uint16) if int(partitions.max()) < 2**16 else partitions
    order = np.argsort(small, kind="stable")  # a radix sort for 16-bit keys: linear time
    counts = np.bincount(partitions)
    grouped = table.take(pa.array(order))
    start = 0
    for part in np.flatnonzero(counts):
        part, count = int(part), int(counts[part])
        if part not in writers:
            writers[part] = ipc.new_file(f"{out_prefix}.p{part:05d}.arrow.tmp", SPILL_SCHEMA)
        writers[part].write_table(grouped.slice(start, count))
        start += count


def _reject_examples(rejects: pa.Table, examples: dict[str, list[dict]], limit: int) -> None:
    for row in rejects.to_pylist():
        kept = examples.setdefault(row["reason"], [])
        if len(kept) < limit:
            kept.append(row)


def run_scan_task(
    sources: SourcesConfig,
    task: Any,
    task_id: int,
    n_partitions: int,
    scan_dir: str,
    examples_per_reason: int,
    user_fraction: float = 1.0,
    read_budget: int | None = None,
    time_range: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Read one task, spill its events by partition, write its record (the completion marker).

    ``read_budget``: what this task's data may hold (``memory.read_chunk_sizes`` turns it into the
    rows and text bytes of a chunk); None reads chunks of the default size.

    ``user_fraction`` < 1 (``stats --sample-fraction`` without k-core) reads only the events of
    ``selected`` users (``read_task``: the other rows' fields past the user id are never converted);
    the per-user counts still cover every user (the plan's sample totals), and the record counts the
    rows left out as ``sampled_out``.

    ``time_range`` ``(start, end)`` (``prepare --time-range``/``--time-window``): only valid events with
    ``start <= ts < end`` are spilled and counted per user; the record counts the others as
    ``outside_time_range``."""
    prefix = Path(scan_dir) / f"t{task_id:05d}"
    writers: dict[int, ipc.RecordBatchFileWriter] = {}
    record: dict[str, Any] = {
        "task": task_id,
        "rows_read": 0,
        "events_kept": 0,
        "sampled_out": 0,
        "outside_time_range": 0,
        "rejected": Counter(),
        "rows_read_by_source": Counter(),
        "examples": {},
    }
    task_users: list[tuple[np.ndarray, np.ndarray]] = []  # per chunk: (user ids, events), not every row's id
    sizes = {} if read_budget is None else dict(zip(("chunk_rows", "chunk_bytes"), read_chunk_sizes(read_budget)))
    for chunk in read_task(sources, task, user_fraction=user_fraction, **sizes):
        events = chunk.events if time_range is None else in_time_range(chunk.events, time_range)
        record["outside_time_range"] += chunk.events.num_rows - events.num_rows
        events = events.select(SPILL_SCHEMA.names).cast(SPILL_SCHEMA)
        record["rows_read"] += chunk.rows_read
        record["rows_read_by_source"][sources.sources[task.source].name] += chunk.rows_read
        record["events_kept"] += events.num_rows
        record["sampled_out"] += len(chunk.sampled_users)
        if len(chunk.sampled_users):
            task_users.append(count_values(chunk.sampled_users))
        if chunk.rejects.num_rows:
            record["rejected"].update(chunk.rejects.column("reason").to_pylist())
            _reject_examples(chunk.rejects, record["examples"], examples_per_reason)
        if events.num_rows:
            users = events.column("user_id").to_numpy()
            _spill(events, partition_of(users, n_partitions), writers, prefix)
            task_users.append(count_values(users))  # last: it may sort ``users`` in place
            del users
        del chunk, events  # before the next chunk is read, not while it is
    for part, writer in writers.items():
        writer.close()
        os.replace(f"{prefix}.p{part:05d}.arrow.tmp", f"{prefix}.p{part:05d}.arrow")
    _save_user_counts(prefix, *_sum_counts(task_users))
    record["partitions"] = sorted(writers)
    save_json(Path(f"{prefix}.json"), record)
    return record


def in_time_range(events: pa.Table, time_range: tuple[int, int]) -> pa.Table:
    """The events with ``start <= ts < end`` (event-time seconds), in their order."""
    ts = events.column("ts").to_numpy()
    return events.filter(pa.array((ts >= time_range[0]) & (ts < time_range[1])))


def _sum_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-chunk ``(ids, counts)`` summed per id: (sorted ids, counts). A task keeps its chunks'
    counts rather than every row's user id (8 bytes an event: 21 MB for a 2.7M-row Parquet file,
    then a sorted copy of it, at the task's end, on top of its last chunk)."""
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(parts) == 1:
        return parts[0]
    ids = np.concatenate([part[0] for part in parts])
    counts = np.concatenate([part[1] for part in parts])
    order = np.argsort(ids, kind="stable")
    ids, counts = ids[order], counts[order]
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    return ids[starts], np.add.reduceat(counts, starts).astype(np.int64)


def _save_user_counts(prefix: Path, ids: np.ndarray, counts: np.ndarray) -> None:
    """Events per user in this task (``t*.users.npy``: row 0 user ids, row 1 counts), so ``prepare``
    can plan every sample's length before building any (``user_event_counts``)."""
    with open(f"{prefix}.users.npy.tmp", "wb") as out:
        np.save(out, np.stack([ids, counts]))
    os.replace(f"{prefix}.users.npy.tmp", f"{prefix}.users.npy")


def count_values(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)`` as int64, for a scan task's user ids (every row's)
    and the stats' spilled id keys (``stats.ids``).

    Consumes ``values`` (sorted in place, in its own integer width: numpy sorts 32-bit keys ~2x
    faster). Values in a range no wider than their number (integer user ids) are counted in one pass
    (``np.bincount``), without a sort; others (63-bit hashes of string ids) are sorted in place.
    ``np.unique`` first copies its input (``flatten``), and on the scan's ~200 MB of ids per core
    that copy cost more than its sort: a fifth of a sampled Parquet task."""
    values = np.asarray(values)
    if values.dtype.kind not in "iu":
        values = values.astype(np.int64)
    if values.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    low, high = int(values.min()), int(values.max())
    if high - low < values.size:
        counts = np.bincount(values - low if low else values)
        present = np.flatnonzero(counts)
        return present.astype(np.int64) + low, counts[present].astype(np.int64)
    if not values.flags.writeable:  # a zero-copy view of Arrow memory
        values = values.copy()
    values.sort()
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[starts].astype(np.int64, copy=False), np.diff(np.append(starts, values.size)).astype(np.int64)


def user_event_counts(scan_dir: str, n_tasks: int) -> tuple[np.ndarray, np.ndarray]:
    """Every user's number of valid events over all read tasks: (sorted user ids, counts)."""
    parts = [np.load(Path(scan_dir) / f"t{task:05d}.users.npy") for task in range(n_tasks)]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    stacked = np.concatenate(parts, axis=1)
    totals = pl.DataFrame({"user_id": stacked[0], "count": stacked[1]}).group_by("user_id").sum().sort("user_id")
    return totals["user_id"].to_numpy(), totals["count"].to_numpy()


def save_json(path: Path, data: Any) -> None:
    """Write a work-dir record atomically (a ``.tmp`` file, then a rename): a record doubles as a
    completion marker, so it is either whole or absent, never half written by a killed job."""
    Path(f"{path}.tmp").write_text(json.dumps(data, indent=1, sort_keys=True, default=_json_default))
    os.replace(f"{path}.tmp", path)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(f"not JSON serializable: {type(value)}")


def load_task_record(scan_dir: str, task_id: int) -> dict[str, Any] | None:
    marker = Path(scan_dir) / f"t{task_id:05d}.json"
    return json.loads(marker.read_text()) if marker.exists() else None


def partition_files(scan_dir: str, partition: int) -> list[Path]:
    """Spill files of one partition in task order (deterministic concatenation order)."""
    files = Path(scan_dir).glob(f"t*.p{partition:05d}.arrow")
    return sorted(files, key=lambda path: int(path.name[1:].split(".", 1)[0]))  # numeric: t100000 > t99999


def remove_partition(scan_dir: str, partition: int) -> None:
    """Delete a partition's spill files once its samples are built (their marker is written).

    Besides disk, this frees their page cache at once, and the next files written reuse those pages:
    on a VM whose host reclaims guest memory that stays free, writing to never-used pages cost ~3 s
    per GB (10× a warm page), which made intermediate files the largest kernel cost of ``prepare``.
    """
    for path in [*partition_files(scan_dir, partition), Path(scan_dir) / f"users.p{partition:05d}.arrow"]:
        path.unlink(missing_ok=True)


def read_partition(scan_dir: str, partition: int) -> pa.Table:
    """One partition's events in ``(source, file_index, row)`` order (``SPILL_SCHEMA``).

    Tasks are planned in (source, file, row range) order, each task reads its rows in file order and
    spills them stably, so concatenating the spill files in task order keeps that order: the sequence
    builder only needs a stable sort by ``(user_id, ts)``. Files are memory-mapped (no read copy).
    """
    tables = [ipc.open_file(pa.memory_map(str(path))).read_all() for path in partition_files(scan_dir, partition)]
    return pa.concat_tables(tables) if tables else SPILL_SCHEMA.empty_table()


def spill_user_table(
    sources: SourcesConfig, n_partitions: int, scan_dir: str, examples_per_reason: int
) -> dict[str, Any]:
    """Partition the optional user table like the events; returns its accounting record."""
    record: dict[str, Any] = {"rows_read": 0, "rejected": Counter(), "examples": {}, "features": []}
    if sources.users is None:
        return record
    table, rejects = read_user_table(sources)
    record["rows_read"] = table.num_rows + rejects.num_rows
    record["rejected"].update(rejects.column("reason").to_pylist() if rejects.num_rows else [])
    _reject_examples(rejects, record["examples"], examples_per_reason)
    record["features"] = [name for name in table.column_names if name != "user_id"]
    parts = partition_of(table.column("user_id").to_numpy(), n_partitions)
    for part in range(n_partitions):
        rows = table.filter(pa.array(parts == part))
        with ipc.new_file(Path(scan_dir) / f"users.p{part:05d}.arrow", rows.schema) as writer:
            writer.write_table(rows)
    return record


USERS_RECORD = "users.json"


def run_user_table_task(
    sources: SourcesConfig, n_partitions: int, scan_dir: str, examples_per_reason: int
) -> dict[str, Any]:
    """``spill_user_table`` as a scan task: its record (``users.json``) is its completion marker."""
    record = spill_user_table(sources, n_partitions, scan_dir, examples_per_reason)
    save_json(Path(scan_dir) / USERS_RECORD, record)
    return record


def load_user_table_record(scan_dir: str) -> dict[str, Any] | None:
    marker = Path(scan_dir) / USERS_RECORD
    return json.loads(marker.read_text()) if marker.exists() else None


def read_user_partition(scan_dir: str, partition: int) -> pa.Table | None:
    path = Path(scan_dir) / f"users.p{partition:05d}.arrow"
    return ipc.open_file(path).read_all() if path.exists() else None


__all__ = [
    "EVENT_SCHEMA",
    "SPILL_SCHEMA",
    "ScanSummary",
    "count_values",
    "in_time_range",
    "load_task_record",
    "load_user_table_record",
    "partition_of",
    "plan_read_tasks",
    "read_partition",
    "read_user_partition",
    "remove_partition",
    "run_scan_task",
    "run_user_table_task",
    "save_json",
    "spill_user_table",
    "user_event_counts",
]
