"""Reading heterogeneous event sources into the canonical event schema, in parallelisable tasks.

``plan_read_tasks`` cuts every file of every source into tasks; ``read_task`` turns one task into
bounded ``EventChunk``s whose events follow the canonical schema (DEVELOPERS.md) and whose rejects say
which row failed, why and on which field. Row accounting is exact per chunk
(``rows_read == len(events) + len(rejects)``), so ``prepare`` can prove it lost nothing.

Config classes live in ``config``; formats in ``formats``; planning in ``tasks``; parsing in
``rawread``; value conversion in ``convert``. This module re-exports what callers need.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from freescale import storage

from .config import SourceError, SourcesConfig, SourceSpec, UserTableSpec
from .convert import (
    DUPLICATE_USER,
    MALFORMED,
    REASONS,
    convert_action,
    convert_feature,
    convert_id,
    convert_ts,
    first_failure,
)
from .formats import Layout, layout_for, user_layout
from .rawread import iter_raw
from .tasks import ReadTask, plan_file
from .textlines import RawPiece
from .usersample import UserSample

__all__ = [
    "EVENT_SCHEMA",
    "REJECT_SCHEMA",
    "EventChunk",
    "ReadTask",
    "SourceError",
    "SourceSpec",
    "SourcesConfig",
    "UserTableSpec",
    "iter_events",
    "plan_read_tasks",
    "read_task",
    "read_user_table",
    "source_files",
]

EVENT_SCHEMA = pa.schema(
    [
        ("user_id", pa.int64()),
        ("item_id", pa.int64()),
        ("ts", pa.int64()),
        ("action", pa.int32()),
        ("source", pa.int8()),
        ("file_index", pa.int32()),
        ("row", pa.int64()),
    ]
)
REJECT_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("file", pa.string()),
        ("row", pa.int64()),
        ("reason", pa.string()),
        ("field", pa.string()),
        ("raw", pa.string()),
    ]
)
EVENT_FIELDS = ("user", "item", "timestamp", "action")
DEFAULT_CHUNK_ROWS = 262_144
DEFAULT_CHUNK_BYTES = 16 << 20


@dataclass
class EventChunk:
    """A bounded piece of one task: canonical events, rejected rows and how many rows were read.

    With ``read_task(user_fraction=f)`` rows whose user id is valid but outside the sample
    (``ids.selected``) are left out before their other fields are converted (``usersample``):
    ``sampled_users`` holds their user ids (one per row), so per-user counts can still cover
    every user."""

    events: pa.Table
    rejects: pa.Table
    rows_read: int
    sampled_users: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        if self.rows_read != self.events.num_rows + self.rejects.num_rows + len(self.sampled_users):
            raise AssertionError("row accounting broken: rows_read != events + rejects + sampled out")


def source_files(config: SourcesConfig, index: int) -> list[str]:
    """The files of one source, sorted (the position is the canonical ``file_index``)."""
    spec = config.sources[index]
    pattern = config.resolve(spec.path)
    try:
        files = storage.expand(pattern)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(
            f"source '{spec.name}': cannot list {pattern}: {exc}", source=spec.name, file=pattern
        ) from exc
    if not files:
        raise SourceError(f"source '{spec.name}': no file matches {pattern}", source=spec.name, file=pattern)
    return files


def plan_read_tasks(config: SourcesConfig, target_rows: int = 1_000_000, *, count_lines: bool = True) -> list[ReadTask]:
    """Every file of every source cut into tasks of about ``target_rows`` rows, in (source, file) order.

    With ``count_lines`` (default) text tasks get their first row number from one streaming pass over
    each text file now; without it each worker counts the lines before its own range when it starts.
    """
    if target_rows < 1:
        raise ValueError(f"option 'target_rows' must be >= 1; got {target_rows}")
    tasks: list[ReadTask] = []
    for index, spec in enumerate(config.sources):
        for file_index, path in enumerate(source_files(config, index)):
            layout = layout_for(spec, path.rsplit("/", 1)[-1])
            tasks.extend(plan_file(index, file_index, path, layout, target_rows, spec.name, count_lines))
    return tasks


def _rejects_table(
    label: str, path: str, rows: np.ndarray, reasons: list[str], fields: list[str], raws: list[str]
) -> pa.Table:
    n = len(rows)
    return pa.table(
        {
            "source": pa.array([label] * n, pa.string()),
            "file": pa.array([path] * n, pa.string()),
            "row": pa.array(rows, pa.int64()),
            "reason": pa.array(reasons, pa.string()),
            "field": pa.array(fields, pa.string()),
            "raw": pa.array(raws, pa.string()),
        },
        schema=REJECT_SCHEMA,
    )


def _check_piece(piece: RawPiece, layout: Layout, spec: SourceSpec) -> tuple[list[np.ndarray], list]:
    """Canonical values (user, item, ts, action) and per-field codes for a piece's rows."""
    n = len(piece.rows)
    cols = piece.columns
    user, user_code = convert_id(cols["user"], layout.id_types.get("user", "auto"))
    item, item_code = convert_id(cols["item"], layout.id_types.get("item", "auto"))
    ts, ts_code = convert_ts(cols["timestamp"], layout.timestamp_unit, layout.typed_time_ok)
    action, action_code = convert_action(
        cols.get("action"), n, layout.action_mode, spec.action_map, spec.default_action, spec.rating_scale
    )
    codes = [user_code, item_code, ts_code, action_code]
    for position, key in enumerate(EVENT_FIELDS):
        forced = piece.forced.get(key)
        if forced is not None:
            codes[position] = np.where(forced != 0, forced, codes[position]).astype(np.uint8)
    return [user, item, ts, action], codes


def _piece_rejects(
    piece: RawPiece, reason: np.ndarray, field: np.ndarray, names: tuple, label: str, path: str
) -> pa.Table:
    bad = np.flatnonzero(reason)
    rows = np.concatenate([piece.bad_rows, piece.rows[bad]])
    reasons = [REASONS[MALFORMED]] * len(piece.bad_rows) + [REASONS[r] for r in reason[bad]]
    fields = [""] * len(piece.bad_rows) + [names[f - 1] for f in field[bad]]
    raws = list(piece.bad_raw) + (piece.raw_text(bad) if len(bad) else [])
    order = np.argsort(rows, kind="stable")
    pick = order.tolist()
    return _rejects_table(
        label, path, rows[order], [reasons[i] for i in pick], [fields[i] for i in pick], [raws[i] for i in pick]
    )


def _piece_events(piece: RawPiece, layout: Layout, spec: SourceSpec, task: ReadTask) -> EventChunk:
    values, codes = _check_piece(piece, layout, spec)
    reason, field = first_failure(codes, len(piece.rows))
    good = reason == 0
    kept = int(good.sum())
    pick = slice(None) if kept == len(good) else good  # a clean piece (the usual case) is not copied
    events = pa.table(
        {
            "user_id": pa.array(values[0][pick], pa.int64()),
            "item_id": pa.array(values[1][pick], pa.int64()),
            "ts": pa.array(values[2][pick], pa.int64()),
            "action": pa.array(values[3][pick].astype(np.int32), pa.int32()),
            "source": pa.array(np.full(kept, task.source, dtype=np.int8), pa.int8()),
            "file_index": pa.array(np.full(kept, task.file_index, dtype=np.int32), pa.int32()),
            "row": pa.array(piece.rows[pick], pa.int64()),
        },
        schema=EVENT_SCHEMA,
    )
    rejects = _piece_rejects(piece, reason, field, EVENT_FIELDS, spec.name, task.path)
    return EventChunk(events, rejects, piece.rows_read, piece.sampled_users)


def _merge(chunks: list[EventChunk]) -> EventChunk:
    if len(chunks) == 1:
        return chunks[0]
    if not chunks:
        return EventChunk(EVENT_SCHEMA.empty_table(), REJECT_SCHEMA.empty_table(), 0)
    events = pa.concat_tables([c.events for c in chunks]).combine_chunks()
    rejects = pa.concat_tables([c.rejects for c in chunks]).combine_chunks()
    rows_read = sum(c.rows_read for c in chunks)
    sampled_users = np.concatenate([c.sampled_users for c in chunks])
    return EventChunk(_by_row(events), _by_row(rejects), rows_read, sampled_users)


def _by_row(table: pa.Table) -> pa.Table:
    """Rows in file order (pieces parsed on different paths come back interleaved)."""
    rows = table.column("row").to_numpy()
    if len(rows) < 2 or bool((np.diff(rows) > 0).all()):
        return table
    return table.take(pa.array(np.argsort(rows, kind="stable")))


def read_task(
    config: SourcesConfig,
    task: ReadTask,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    user_fraction: float = 1.0,
) -> Iterator[EventChunk]:
    """Canonical events of one task in chunks of at most ``chunk_rows`` rows / ``chunk_bytes`` of text;
    ``user_fraction`` < 1: only the events of ``ids.selected`` users (see ``EventChunk``)."""
    spec = config.sources[task.source]
    layout = layout_for(spec, task.path.rsplit("/", 1)[-1])
    if not 0.0 < user_fraction <= 1.0:
        raise ValueError(f"option 'user_fraction' must be in (0, 1]; got {user_fraction!r}")
    sample = UserSample(user_fraction, layout.id_types.get("user", "auto")) if user_fraction < 1.0 else None
    for pieces in iter_raw(task, layout, spec.name, chunk_rows, chunk_bytes, sample):
        chunk = _merge([_piece_events(p, layout, spec, task) for p in pieces])
        if chunk.rows_read:
            yield chunk


def iter_events(config: SourcesConfig, target_rows: int = 1_000_000, **kwargs) -> Iterator[EventChunk]:
    """Every chunk of every source in plan order: the single-process way to read a whole config."""
    for task in plan_read_tasks(config, target_rows):
        yield from read_task(config, task, **kwargs)


def _repeated(ids: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which ``ids`` an earlier row holds (``seen``: the sorted ids of earlier chunks), and ``seen``
    with this chunk's ids added."""
    distinct, first = np.unique(ids, return_index=True)
    repeated = np.isin(ids, seen)
    later = np.ones(len(ids), dtype=bool)
    later[first] = False
    return repeated | later, np.union1d(seen, distinct)


def _user_chunk(
    piece: RawPiece, spec: UserTableSpec, path: str, seen: np.ndarray
) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """A piece's valid profile rows, its rejects and ``seen`` (``_repeated``) updated: a user's first
    valid row is its profile, any later one is rejected as ``duplicate_user``."""
    user, user_code = convert_id(piece.columns["user"], spec.id_type)
    values, codes = [user], [user_code]
    for name in spec.features:
        value, code = convert_feature(piece.columns[name])
        values.append(value)
        codes.append(code)
    reason, field = first_failure(codes, len(piece.rows))
    valid = np.flatnonzero(reason == 0)
    repeated, seen = _repeated(user[valid], seen)
    reason[valid[repeated]], field[valid[repeated]] = DUPLICATE_USER, 1
    good = reason == 0
    names = ("user", *spec.features)
    table = pa.table(
        {"user_id": pa.array(values[0][good], pa.int64())}
        | {name: pa.array(v[good], pa.int64()) for name, v in zip(spec.features, values[1:])}
    )
    return table, _piece_rejects(piece, reason, field, names, "users", path), seen


def read_user_table(config: SourcesConfig) -> tuple[pa.Table, pa.Table]:
    """The user table (``user_id`` + integer features, int64, one row per user: a user's first valid row,
    later ones are ``duplicate_user`` rejects) and its rejects; empty if none configured.

    User tables are small next to event logs, so they are read whole, in one process.
    """
    spec = config.users
    if spec is None:
        return pa.table({"user_id": pa.array([], pa.int64())}), REJECT_SCHEMA.empty_table()
    layout = user_layout(spec)
    pattern = config.resolve(spec.path)
    files = storage.expand(pattern)
    if not files:
        raise SourceError(f"source 'users': no file matches {pattern}", source="users", file=pattern)
    tables, rejects, seen = [], [], np.zeros(0, np.int64)
    for file_index, path in enumerate(files):
        for task in plan_file(-1, file_index, path, layout, 1 << 62, "users"):
            for pieces in iter_raw(task, layout, "users", DEFAULT_CHUNK_ROWS, DEFAULT_CHUNK_BYTES):
                for piece in pieces:
                    table, bad, seen = _user_chunk(piece, spec, path, seen)
                    tables.append(table)
                    rejects.append(bad)
    schema = pa.schema([("user_id", pa.int64())] + [(f, pa.int64()) for f in spec.features])
    users = pa.concat_tables(tables) if tables else schema.empty_table()
    return users, pa.concat_tables(rejects) if rejects else REJECT_SCHEMA.empty_table()
