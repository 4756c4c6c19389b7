"""``prepare --time-window``: one prepared dataset per window of event time (docs/data.md#time-windows).

A streaming run trains day after day on the day's events; each window here is a normal prepared
dataset (``<output>/window=0000``, ``window=0001``, ...) whose samples are the events inside the
window: a user's history in window ``t`` is that user's events in ``[start_t, end_t)`` only.

1. census — one pass over the sources (the scan's read tasks, on the job's workers when there are
   some) counts valid events per window, so the windows are known before any is prepared: from the
   first event's window to the last event's, aligned to multiples of the window since the epoch
   (UTC midnights for ``1d``), or cut from ``--time-range`` START when one is given. Windows without
   events are listed, not written.
2. windows — ``PrepareJob`` once per window with ``PrepareConfig.time_range`` set: each job is locked,
   resumable and hash-verified as any prepare, and its manifest counts the events outside its window
   as ``events_filtered.outside_time_range``. A window whose events the filters all drop (``--min-len``,
   ``--kcore``: ``NoSamplesError``) is listed without a dataset, its events counted by filter reason;
   the run fails only when no window has a sample.
3. index — ``windows.json`` (``WindowsIndex``), written last: each window's range, event count,
   fingerprint and manifest hash, and the row accounting over the whole stream: valid events =
   events in some window + events outside every window (outside ``--time-range``).

Each window's job reads every source again (the filter is applied in its scan), so W windows read
the sources W + 1 times; the windows' own spill, plan and write work is that of their events only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
from tqdm import tqdm

from freescale import storage
from freescale.datasets.sources import SourcesConfig, plan_read_tasks, read_task
from freescale.pipeline import output as places
from freescale.pipeline.config import PrepareConfig
from freescale.pipeline.dataset.manifest import MANIFEST_NAME
from freescale.pipeline.output import NoSamplesError, OutputLock, PrepareError
from freescale.pipeline.prepare import TARGET_ROWS_PER_TASK, PrepareJob

WINDOWS_NAME = "windows.json"
WINDOWS_SCHEMA = 2  # 2: a window without a dataset says why (``skipped``) and counts its events (``filtered``)
READABLE_SCHEMAS = (1, WINDOWS_SCHEMA)  # 1 lacks both fields: its only windows without a dataset had no events
WINDOW_PREFIX = "window="
DURATION_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}


def parse_duration(text: str, option: str = "--time-window") -> int:
    """``1d``, ``6h``, ``30m``, ``90s``, ``2w`` or plain seconds → seconds (> 0)."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhdw]?)\s*", str(text))
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{option}: expected a duration such as 1d, 6h, 30m or 3600 (seconds), got {text!r}")
    return int(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]


def parse_time(text: str, option: str = "--time-range") -> int:
    """Event-time seconds from an integer or an ISO 8601 date/time (UTC unless it names a zone)."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{option}: {text!r} is neither seconds since the epoch nor an ISO 8601 date") from None
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


def parse_time_range(text: str | None) -> tuple[int, int] | None:
    """``START:END`` (each seconds or an ISO date; ``..`` may separate ISO times that hold colons)."""
    if text is None:
        return None
    start, sep, end = text.partition("..") if ".." in text else text.partition(":")
    if not sep:
        raise ValueError(f"--time-range: expected START:END (or START..END), got {text!r}")
    return parse_time(start), parse_time(end)


@dataclass(frozen=True)
class Census:
    """Valid events of one read task: how many, per window (absolute index), and outside ``time_range``."""

    valid: int
    per_window: dict[int, int]
    outside: int


def census_task(
    sources: SourcesConfig, task: Any, anchor: int, window_s: int, time_range: tuple[int, int] | None
) -> Census:
    """Count a task's valid events per window ``(ts - anchor) // window_s`` (a worker's call)."""
    per_window: Counter = Counter()
    valid = outside = 0
    for chunk in read_task(sources, task):
        ts = chunk.events.column("ts").to_numpy()
        valid += ts.size
        if time_range is not None:
            inside = (ts >= time_range[0]) & (ts < time_range[1])
            outside += int(ts.size - inside.sum())
            ts = ts[inside]
        index, counts = np.unique((ts - anchor) // window_s, return_counts=True)
        per_window.update(dict(zip(index.tolist(), counts.tolist(), strict=True)))
    return Census(valid=valid, per_window=dict(per_window), outside=outside)


NO_EVENTS = "no events"


@dataclass(frozen=True)
class WindowEntry:
    """One window of ``windows.json``. ``path`` is None for a window without a dataset; ``skipped``
    says why (``NO_EVENTS``, or why the filters left no sample) and ``filtered`` counts its events by
    filter reason (``kcore``, ``min_len``: they sum to ``events``). ``fingerprint`` is its job's, for a
    window without samples too (a run with the same one skips the window again without reading)."""

    name: str
    start: int
    end: int
    events: int
    path: str | None = None
    fingerprint: str | None = None
    manifest_sha256: str | None = None
    samples: int = 0
    skipped: str | None = None
    filtered: dict[str, int] = field(default_factory=dict)

    @property
    def filtered_out(self) -> bool:
        """Events, but no sample left after the filters: no dataset."""
        return self.path is None and self.events > 0


@dataclass(frozen=True)
class WindowsIndex:
    """``windows.json``: the windows of a ``prepare --time-window`` output and its row accounting.

    ``events_valid`` = ``events_in_windows`` + ``events_outside_windows``, ``events_read`` =
    ``events_valid`` + ``events_rejected`` (``balanced``; the rejects are the bad rows every window's
    scan rejected alike), and ``events_in_windows`` is the sum of the windows' events: a window's
    manifest accounts for its events, a window without a dataset for its own in ``filtered``."""

    window_s: int
    time_range: tuple[int, int] | None
    windows: tuple[WindowEntry, ...]
    events_read: int
    events_rejected: int
    events_valid: int
    events_in_windows: int
    events_outside_windows: int

    def __post_init__(self) -> None:
        if self.window_s < 1:
            raise ValueError(f"{WINDOWS_NAME}: window_s must be >= 1, got {self.window_s}")
        if self.events_valid != self.events_in_windows + self.events_outside_windows:
            raise ValueError(f"{WINDOWS_NAME}: valid events do not equal events in windows + outside them")
        if self.events_in_windows != sum(entry.events for entry in self.windows):
            raise ValueError(f"{WINDOWS_NAME}: events_in_windows is not the sum of the windows' events")
        for entry in self.windows:
            if entry.path is None and entry.events != sum(entry.filtered.values()):
                raise ValueError(
                    f"{WINDOWS_NAME}: {entry.name} has {entry.events} events and no dataset, but "
                    f"{sum(entry.filtered.values())} of them counted filtered"
                )

    @property
    def balanced(self) -> bool:
        return self.events_read == self.events_valid + self.events_rejected

    def to_json(self) -> str:
        data = {"schema_version": WINDOWS_SCHEMA, "created_by": "freescale prepare --time-window", **asdict(self)}
        data["balanced"] = self.balanced
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> WindowsIndex:
        try:
            data = json.loads(text)
            if data.pop("schema_version") not in READABLE_SCHEMAS:
                raise ValueError("unknown schema_version")
            data.pop("created_by"), data.pop("balanced")
            data["windows"] = tuple(WindowEntry(**entry) for entry in data["windows"])
            data["time_range"] = None if data["time_range"] is None else tuple(data["time_range"])
            return cls(**data)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{where}: not a windows index of this version ({error})") from error

    def datasets(self, root: str) -> list[str]:
        """The prepared datasets of the windows that have samples, in time order."""
        return [storage.join(root, entry.path) for entry in self.windows if entry.path is not None]

    def filtered_out(self) -> list[WindowEntry]:
        """The windows with events but no dataset: the filters left no sample (``WindowEntry.skipped``)."""
        return [entry for entry in self.windows if entry.filtered_out]


def load_windows(root: str) -> WindowsIndex:
    """The ``windows.json`` of a ``prepare --time-window`` output (local or ``s3://``)."""
    where = storage.join(root, WINDOWS_NAME)
    if not storage.exists(where):
        raise ValueError(f"{where} is missing: not a finished prepare --time-window output")
    return WindowsIndex.from_json(storage.read_bytes(where).decode(), where)


class WindowedPrepare:
    """One ``prepare --time-window`` run over ``config`` (its ``time_range``: the whole stream's bounds)."""

    def __init__(self, config: PrepareConfig, window_s: int, pool: ProcessPoolExecutor | None = None) -> None:
        if window_s < 1:
            raise ValueError(f"--time-window must be at least one second, got {window_s}")
        self.config = config
        self.window_s = window_s
        self.root = config.output
        self.sources = SourcesConfig.from_toml(config.sources)
        self._pool = pool
        self._previous: dict[str, WindowEntry] = {}  # the last index's windows without samples, by name

    def run(self) -> WindowsIndex:
        lock = OutputLock(places.lock_path(self.root, places.private_work_root()), self.root)
        created = not storage.is_remote(self.root) and not Path(self.root).exists()
        try:
            lock.acquire()
            self._check_root()
            self._previous = self._previously_filtered_out()
            census = self._census()
            windows = self._windows(census)
            self._remove_other_windows({entry.name for entry in windows if entry.events})
            entries = [self._prepare(entry) if entry.events else entry for entry in windows]
            index = self._index(census, tuple(entries))
            storage.write_bytes(storage.join(self.root, WINDOWS_NAME), index.to_json().encode())
            return index
        finally:
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
            if created:
                with contextlib.suppress(OSError):
                    Path(self.root).rmdir()  # a failed run's folder, left empty (the windows' locks were in it)
            lock.release()

    def _log(self, message: str) -> None:
        if self.config.progress:
            tqdm.write(f"prepare --time-window: {message}")

    def _check_root(self) -> None:
        if storage.exists(storage.join(self.root, MANIFEST_NAME)):
            raise PrepareError(
                f"{self.root} holds a prepared dataset; a --time-window output is a folder of them: "
                "choose another --output"
            )

    def _census(self) -> Census:
        """Valid events per window over every source (the read tasks on the pool's workers when given)."""
        tasks = plan_read_tasks(self.sources, TARGET_ROWS_PER_TASK)
        anchor = self.config.time_range[0] if self.config.time_range else 0
        args = [(self.sources, task, anchor, self.window_s, self.config.time_range) for task in tasks]
        if self._pool is not None:
            results = list(self._pool.map(census_task, *zip(*args, strict=True)))
        else:
            results = [census_task(*call) for call in args]
        per_window: Counter = Counter()
        for result in results:
            per_window.update(result.per_window)
        total = Census(sum(r.valid for r in results), dict(per_window), sum(r.outside for r in results))
        self._log(f"census: {total.valid:,} valid events in {len(per_window)} windows, {total.outside:,} outside")
        return total

    def _windows(self, census: Census) -> list[WindowEntry]:
        """Every window from the first with events to the last (all of ``--time-range``'s when given)."""
        time_range = self.config.time_range
        if time_range is not None:
            anchor, first = time_range[0], 0
            last = -(-(time_range[1] - time_range[0]) // self.window_s) - 1
        elif census.per_window:
            anchor, first, last = 0, min(census.per_window), max(census.per_window)
        else:
            raise PrepareError(f"{self.config.sources}: no valid events: nothing to cut into windows")
        entries = []
        for n, k in enumerate(range(first, last + 1)):
            start = anchor + k * self.window_s
            end = start + self.window_s if time_range is None else min(start + self.window_s, time_range[1])
            events = census.per_window.get(k, 0)
            skipped = None if events else NO_EVENTS
            entries.append(WindowEntry(f"{WINDOW_PREFIX}{n:04d}", start, end, events, skipped=skipped))
        return entries

    def _previously_filtered_out(self) -> dict[str, WindowEntry]:
        """The windows an earlier run's index lists as filtered out (none when it is missing or unreadable:
        then every window's job runs)."""
        try:
            previous = load_windows(self.root)
        except ValueError:
            return {}
        return {entry.name: entry for entry in previous.filtered_out()}

    def _remove_other_windows(self, names: set[str]) -> None:
        """Window folders this run does not write (an earlier run's other bounds, or a window that has
        no events now): removed with ``--overwrite``, refused without."""
        fs, path = storage.filesystem(self.root)
        listed = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        stale = sorted({e.base_name for e in listed if e.base_name.startswith(WINDOW_PREFIX)} - names)
        if stale and not self.config.overwrite:
            raise PrepareError(
                f"{self.root} holds {', '.join(stale[:3])} that this run does not write (other windows); "
                "pass --overwrite to replace them"
            )
        for name in stale:
            self._remove_window(name, "not a window of this run")

    def _remove_window(self, name: str, why: str) -> None:
        """Remove a window's folder, and first the index that may list it (written again at the end)."""
        index = storage.join(self.root, WINDOWS_NAME)
        if storage.exists(index):
            fs, path = storage.filesystem(index)
            fs.delete_file(path)
        where = storage.join(self.root, name)
        if storage.is_remote(where):
            storage.filesystem(where)[0].delete_dir(storage.filesystem(where)[1])
        else:
            shutil.rmtree(where)
        self._log(f"removed {name}: {why}")

    def _prepare(self, entry: WindowEntry) -> WindowEntry:
        """The window's dataset (``PrepareJob``: resumed or up to date when run before)."""
        output = storage.join(self.root, entry.name)
        config = replace(self.config, output=output, time_range=(entry.start, entry.end))
        self._log(f"{entry.name} [{_utc(entry.start)}, {_utc(entry.end)}): {entry.events:,} events")
        unchanged = self._unchanged_filtered_out(entry, config)
        if unchanged is not None:
            self._log(f"{entry.name}: no dataset, as before (same config and sources): {unchanged.skipped}")
            return unchanged
        pool, self._pool = self._pool, None  # the first job takes the early workers (and stops them)
        try:
            job = PrepareJob(config, pool)
            manifest = job.run()
        except NoSamplesError as error:
            return self._filtered_out(entry, job.fingerprint, error)
        except PrepareError as error:
            raise PrepareError(f"{entry.name} [{entry.start}, {entry.end}): {error}") from error
        self._check_census(entry, manifest["rows"])
        manifest_bytes = storage.read_bytes(storage.join(output, MANIFEST_NAME))
        return replace(
            entry,
            path=entry.name,
            fingerprint=manifest["fingerprint"],
            manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(),
            samples=manifest["rows"]["samples"],
        )

    def _check_census(self, entry: WindowEntry, rows: dict[str, Any]) -> None:
        used = rows["events_read"] - rows["events_rejected"]["total"]
        in_window = used - rows["events_filtered"]["by_reason"].get("outside_time_range", 0)
        if in_window != entry.events:
            raise PrepareError(f"{entry.name}: the census counted {entry.events} events, its scan {in_window}")

    def _filtered_out(self, entry: WindowEntry, fingerprint: str, error: NoSamplesError) -> WindowEntry:
        """A window whose events the filters all dropped: listed without a dataset, its events counted
        by reason; a dataset an earlier run wrote there (``--overwrite``: the job accepted to replace
        it) is removed."""
        self._check_census(entry, error.rows)
        by_reason = error.rows["events_filtered"]["by_reason"]
        filtered = {reason: n for reason, n in by_reason.items() if n and reason != "outside_time_range"}
        if storage.exists(storage.join(self.root, entry.name)):
            self._remove_window(entry.name, "its window has no sample now")
        self._log(f"{entry.name}: no dataset: {error}")
        return replace(entry, fingerprint=fingerprint, skipped=str(error), filtered=filtered)

    def _unchanged_filtered_out(self, entry: WindowEntry, config: PrepareConfig) -> WindowEntry | None:
        """The earlier run's entry for a window it found without samples, when this window's job is the
        same (fingerprint: options and source files) and nothing was written there since."""
        previous = self._previous.get(entry.name)
        if previous is None or self.config.overwrite or previous.events != entry.events:
            return None
        if (previous.start, previous.end) != (entry.start, entry.end):
            return None
        if storage.exists(storage.join(self.root, entry.name)):
            return None  # a dataset there now: its job decides (up to date, or refused)
        return previous if PrepareJob(config).fingerprint == previous.fingerprint else None

    def _index(self, census: Census, entries: tuple[WindowEntry, ...]) -> WindowsIndex:
        written = [e for e in entries if e.path is not None]
        filtered_out = [e for e in entries if e.filtered_out]
        if not written and filtered_out:
            first, n = filtered_out[0], len(filtered_out)
            raise PrepareError(
                f"{self.config.sources}: no window has a sample: the filters dropped every event of the "
                f"{n} window{'s' if n > 1 else ''} with events ({first.name}: {first.skipped})"
            )
        if not written:
            raise PrepareError(f"{self.config.sources}: no valid events inside --time-range {self.config.time_range}")
        first = json.loads(storage.read_bytes(storage.join(self.root, written[0].path, MANIFEST_NAME)))
        rows = first["rows"]
        in_windows = sum(e.events for e in entries)
        if census.valid != rows["events_read"] - rows["events_rejected"]["total"]:
            scanned = rows["events_read"] - rows["events_rejected"]["total"]
            raise PrepareError(f"the census counted {census.valid} valid events, {written[0].name}'s scan {scanned}")
        return WindowsIndex(
            window_s=self.window_s,
            time_range=self.config.time_range,
            windows=entries,
            events_read=rows["events_read"],
            events_rejected=rows["events_rejected"]["total"],
            events_valid=census.valid,
            events_in_windows=in_windows,
            events_outside_windows=census.valid - in_windows,
        )


def _utc(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def prepare_windows(config: PrepareConfig, window_s: int, pool: ProcessPoolExecutor | None = None) -> WindowsIndex:
    """Run ``freescale prepare --time-window``: one dataset per window under ``config.output``."""
    return WindowedPrepare(config, window_s, pool).run()


__all__ = [
    "WINDOWS_NAME",
    "WindowEntry",
    "WindowsIndex",
    "load_windows",
    "parse_duration",
    "parse_time_range",
    "prepare_windows",
]
