"""``freescale stats --zch-size``: a zero-collision table's hit, insert, collision and eviction rates
and occupancy, predicted by replaying the dataset's item ids (``--zch-ids user``: each event's user
id) in event-time order through ``kernels.zch.ZchTable`` (docs/stats.md#zch-replay; the table's
rules: docs/design.md#open-id-spaces-mpzch).

1. spill — the events are read once and their ``(ts, id)`` pairs appended to one Arrow file per
   day of event time (read order inside a day): raw sources' valid events task by task
   (``source_pairs``), or a prepared dataset's samples in plan order when no event is in two of them
   (``prepared_pairs``: ``--window-stride 0``);
2. replay — day by day, each file is sorted by time (stably: equal times keep read order) and its
   ids are looked up ``lookup_events`` at a time in training mode (with their times, for ttl); the
   stream is cut into lookups regardless of day boundaries, so the figures do not depend on them.

Memory: one read chunk, then the largest day's pairs (16 bytes an event) and the table's state.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import torch

from freescale.datasets.sources import SourcesConfig, plan_read_tasks, read_task
from freescale.kernels.zch import ZchTable
from freescale.kernels.zch_types import ZchConfig

DAY_S = 86_400
PAIR_SCHEMA = pa.schema([("ts", pa.int64()), ("id", pa.int64())])
ID_KINDS = ("item", "user")  # which ids a replay feeds the table (``--zch-ids``)
TARGET_ROWS_PER_TASK = 4_000_000


@dataclass(frozen=True)
class ZchReplayConfig:
    """What to replay: the table (``ZchConfig``), how many events one lookup call holds and whose ids
    (``ids``: the events' items, or their users: a ``[user_tables.user_id]`` table)."""

    table: ZchConfig
    lookup_events: int = 65_536  # one training step's ids: ids of a call compete by first occurrence
    ids: str = "item"

    def __post_init__(self) -> None:
        if self.ids not in ID_KINDS:
            raise ValueError(f"--zch-ids must be one of {list(ID_KINDS)}, got {self.ids!r}")
        if isinstance(self.lookup_events, bool) or not isinstance(self.lookup_events, int) or self.lookup_events < 1:
            raise ValueError(f"--zch-lookup-events must be an integer >= 1, got {self.lookup_events!r}")


# the kernel's option names (``zch.<name>`` in its errors) as ``freescale stats`` spells them
CLI_OPTIONS = {
    "zch_size": "--zch-size",
    "bucket_size": "--zch-bucket-size",
    "max_probe": "--zch-max-probe",
    "policy": "--zch-policy",
    "ttl": "--zch-ttl",
    "admission_threshold": "--zch-admission",
    "lfu_halflife": "--zch-lfu-halflife",
}


def replay_config(lookup_events: int = 65_536, ids: str = "item", **table: Any) -> ZchReplayConfig:
    """``ZchReplayConfig`` from ``stats``' options; a bad value is one line naming its ``--zch-*`` option."""
    try:
        return ZchReplayConfig(ZchConfig(**table), lookup_events, ids)
    except ValueError as error:
        text = str(error)
        for name, option in CLI_OPTIONS.items():
            text = text.replace(f"zch.{name}:", f"{option}:")
        raise ValueError(text) from None


def source_pairs(sources: SourcesConfig, ids: str = "item") -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(ts, id)`` of every valid event of the sources (``ids``: its item or its user), chunk by chunk
    in read order."""
    for task in plan_read_tasks(sources, TARGET_ROWS_PER_TASK):
        for chunk in read_task(sources, task):
            yield chunk.events.column("ts").to_numpy(), chunk.events.column(f"{ids}_id").to_numpy()


def prepared_pairs(dataset: Any, chunk_rows: int = 4_096, ids: str = "item") -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(timestamps, id)`` of every event of a ``PreparedDataset``'s samples (``ids``: its item or its
    sample's user), ``chunk_rows`` samples at a time.

    Only for datasets prepared with ``--window-stride 0``: each event is then in one sample at most."""
    n_rows = int(dataset.offsets[-1])
    for start in range(0, n_rows, chunk_rows):
        rows = [dataset.row(i) for i in range(start, min(start + chunk_rows, n_rows))]
        times = [np.asarray(r["timestamps"], np.int64) for r in rows]
        if ids == "user":
            values = [np.full(len(t), int(r["user_id"]), np.int64) for r, t in zip(rows, times)]
        else:
            values = [np.asarray(r["item_ids"], np.int64) for r in rows]
        yield np.concatenate(times), np.concatenate(values)


def spill_by_day(pairs: Iterable[tuple[np.ndarray, np.ndarray]], spill_dir: Path) -> list[Path]:
    """Every ``(ts, item)`` pair into ``day-<n>.arrow`` files; the files in time order."""
    spill_dir.mkdir(parents=True, exist_ok=True)
    writers: dict[int, ipc.RecordBatchFileWriter] = {}
    try:
        for ts, items in pairs:
            _append_by_day(ts, items, writers, spill_dir)
    finally:
        for writer in writers.values():
            writer.close()
    return [_day_path(spill_dir, day) for day in sorted(writers)]


def _day_path(spill_dir: Path, day: int) -> Path:
    return spill_dir / f"day-{day:08d}.arrow"


def _append_by_day(
    ts: np.ndarray, items: np.ndarray, writers: dict[int, ipc.RecordBatchFileWriter], spill_dir: Path
) -> None:
    days = ts // DAY_S
    order = np.argsort(days, kind="stable")
    days, ts, items = days[order], ts[order], items[order]
    starts = np.flatnonzero(np.r_[True, days[1:] != days[:-1]]) if days.size else np.zeros(0, np.int64)
    for start, end in zip(starts, np.r_[starts[1:], days.size], strict=True):
        day = int(days[start])
        if day not in writers:
            writers[day] = ipc.new_file(str(_day_path(spill_dir, day)), PAIR_SCHEMA)
        writers[day].write_table(pa.table([ts[start:end], items[start:end]], schema=PAIR_SCHEMA))


def time_ordered(files: list[Path]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each day's ``(ts, item)`` sorted by time, equal times in read order; the file is then deleted."""
    for path in files:
        table = ipc.open_file(pa.memory_map(str(path))).read_all()
        ts, items = table.column("ts").to_numpy(), table.column("id").to_numpy()
        order = np.argsort(ts, kind="stable")
        yield ts[order], items[order]
        del table
        os.remove(path)


def replay(stream: Iterator[tuple[np.ndarray, np.ndarray]], config: ZchReplayConfig) -> dict[str, Any]:
    """Feed the time-ordered stream to a ``ZchTable`` in calls of ``lookup_events``; the report, with
    per-day figures (the day a call's first event falls in). A day's events join the previous day's
    remainder once, so the stream is copied once however many calls a day holds."""
    table = ZchTable(config.table)
    days: dict[int, dict[str, int]] = {}
    n = config.lookup_events
    rest_ts, rest_items = np.zeros(0, np.int64), np.zeros(0, np.int64)
    for ts, items in stream:
        ts, items = np.concatenate([rest_ts, ts]), np.concatenate([rest_items, items])
        full = ts.size - ts.size % n
        for start in range(0, full, n):
            _lookup(table, ts[start : start + n], items[start : start + n], days)
        rest_ts, rest_items = ts[full:], items[full:]
    if rest_ts.size:
        _lookup(table, rest_ts, rest_items, days)
    return _report(table, config, days)


def _lookup(table: ZchTable, ts: np.ndarray, items: np.ndarray, days: dict[int, dict[str, int]]) -> None:
    result = table.lookup(torch.from_numpy(np.ascontiguousarray(items)), torch.from_numpy(np.ascontiguousarray(ts)))
    day = days.setdefault(int(ts[0] // DAY_S), {})
    for name, value in result.stats_dict().items():
        day[name] = day.get(name, 0) + value
    day["occupied_rows"] = int((table.identities >= 0).sum())


def _rates(counts: dict[str, int]) -> dict[str, float | None]:
    n = counts["lookups"]
    evictions = counts["evictions"]
    return {
        "hit_rate": counts["hits"] / n if n else None,
        "insert_rate": counts["inserts"] / n if n else None,
        "collision_rate": counts["collisions"] / n if n else None,
        "eviction_rate": evictions / n if n else None,
        "mean_evicted_age": counts["evicted_age_sum"] / evictions if evictions else None,
    }


def _report(table: ZchTable, config: ZchReplayConfig, days: dict[int, dict[str, int]]) -> dict[str, Any]:
    counters = table.counters_dict()
    size = table.config.zch_size
    by_day = [
        {"day_start": day * DAY_S, **counts, **_rates(counts), "occupancy": counts["occupied_rows"] / size}
        for day, counts in sorted(days.items())
    ]
    return {
        "ids": config.ids,
        "table": asdict(config.table),
        "lookup_events": config.lookup_events,
        "counters": counters,
        **_rates(counters),
        "occupancy": table.occupancy(),
        "by_day": by_day,
    }


def replay_pairs(pairs: Iterable[tuple[np.ndarray, np.ndarray]], spill_dir: Path, config: ZchReplayConfig) -> dict:
    """``spill_by_day`` then ``replay``: the ``zch`` section of ``stats.json``."""
    return replay(time_ordered(spill_by_day(pairs, spill_dir)), config)


def replay_sources(sources: SourcesConfig, spill_dir: Path, config: ZchReplayConfig) -> dict[str, Any]:
    """The replay of raw sources' valid events."""
    return replay_pairs(source_pairs(sources, config.ids), spill_dir, config)


__all__ = [
    "ZchReplayConfig",
    "prepared_pairs",
    "replay",
    "replay_config",
    "replay_pairs",
    "replay_sources",
    "source_pairs",
    "spill_by_day",
    "time_ordered",
]
