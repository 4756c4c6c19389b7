"""Sampling users while reading (``read_task(user_fraction=...)``, what ``stats --sample-fraction`` uses)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from source_cases import BAD_CSV, BAD_JSONL, one_source, read_all, reject_list

from freescale.datasets import jsonl
from freescale.datasets.ids import selected
from freescale.datasets.sources import EVENT_SCHEMA, REJECT_SCHEMA, plan_read_tasks, read_task
from freescale.datasets.textlines import split_lines


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_user_fraction_reads_the_sampled_users_events_and_accounts_for_every_row(tmp_path: Path, fmt: str):
    """``read_task(user_fraction=f)``: exactly the full read's events of ``selected`` users (rows,
    values, order); rows with a bad user id are still rejected; a sampled user's bad field is
    rejected, an unsampled user's row is counted as sampled out, whatever its other fields."""
    if fmt == "jsonl":
        (tmp_path / "a.jsonl").write_text("\n".join(BAD_JSONL) + "\n")
    elif fmt == "csv":
        (tmp_path / "a.csv").write_text(BAD_CSV)
    else:
        rng = np.random.default_rng(0)
        n = 500
        act = np.where(rng.random(n) < 0.02, "refund", np.where(rng.random(n) < 0.5, "click", "view"))
        uid = rng.integers(-3, 300, n)
        pq.write_table(
            pa.table({"uid": uid, "item": rng.integers(0, 50, n), "ts": 1_700_000_000 + np.arange(n), "act": act}),
            tmp_path / "a.parquet",
            row_group_size=128,
        )
    config = one_source(tmp_path, fmt, f"a.{fmt}")
    events, rejects, rows_read = read_all(config)
    for fraction in (0.3, 0.6):
        kept, dropped, got_rejects, total = [], [], [], 0
        for task in plan_read_tasks(config):
            for chunk in read_task(config, task, user_fraction=fraction):
                assert chunk.rows_read == chunk.events.num_rows + chunk.rejects.num_rows + len(chunk.sampled_users)
                assert not selected(chunk.sampled_users, fraction).any()
                kept.append(chunk.events)
                dropped.append(chunk.sampled_users)
                got_rejects.append(chunk.rejects)
                total += chunk.rows_read
        sampled = pa.concat_tables(kept)
        want = events.filter(pa.array(selected(events["user_id"].to_numpy(), fraction)))
        assert total == rows_read and sampled.equals(want)
        sampled_rejects = pa.concat_tables(got_rejects)
        assert set(reject_list(sampled_rejects)) <= set(reject_list(rejects))
        user_rejects = [r for r in reject_list(rejects) if r[2] == "user" or r[1] == "malformed_row"]
        assert set(user_rejects) <= set(reject_list(sampled_rejects))  # known before sampling: always counted
        assert 0 < len(np.concatenate(dropped)) <= rows_read - len(user_rejects)
        # every row of the full read is an event, a reject or sampled out, each exactly once
        unselected_events = events.num_rows - want.num_rows
        assert len(np.concatenate(dropped)) == unselected_events + rejects.num_rows - sampled_rejects.num_rows


# --- the JSON Lines reader parses the user field first (jsonl._user_first) ------------------------

_CLEAN = [
    b'{"uid": "u%d", "item": %d, "ts": 1700000000, "act": "click"}',
    b'{"uid": "u%d", "item": %d, "ts": 1700000005, "act": "view"}',
    b'{"act": "view", "ts": 1700000007, "uid": "u%d", "item": %d}',
]
_INT_USER = b'{"uid": %d, "item": %d, "ts": 1700000000, "act": "click"}'
_HOSTILE = [
    b'{"uid": "u%d", "item": %d, "ts": 17000',  # truncated
    b"not json %d %d",
    b"[%d, %d]",
    b'{"uid": "u%d", "item": %d, "ts": 1700000000, "act": "click"}{"uid": 1}',
    b'{"uid": null, "item": %d%d, "ts": 1700000003, "act": "click"}',
    b'{"item": %d%d, "ts": 1700000003, "act": "click"}',
    b'{"uid": true, "item": %d%d, "ts": 1700000003, "act": "click"}',
    b'{"uid": 1.5, "item": %d%d, "ts": 1700000003, "act": "click"}',
    b'{"uid": -%d, "item": %d, "ts": 1700000003, "act": "click"}',
    b'{"uid": ["u%d"], "item": %d, "ts": 1700000003, "act": "click"}',
    b'{"uid": "u%d", "item": %d.5, "ts": 1700000005, "act": "click"}',
    b'{"uid": "u%d", "item": "%d", "ts": 1700000005, "act": "click"}',
    b'{"uid": "u%d", "item": %d, "ts": "yesterday", "act": "click"}',
    b'{"uid": "u%d", "item": %d, "ts": 1700000009, "act": "refund"}',
    b'{"uid": "u%d", "item": %d, "ts": 1700000009, "act": "click", "x": "\xff\xfe"}',  # bad UTF-8
    b'{"uid": "u%d", "item": %d, "ts": 1700000009, "act": "click", "x": 1, "x": 2}',
    # pyarrow's full parse fails (duplicate key), json.loads fails (UTF-8): a malformed row, whose
    # user field alone pyarrow would read
    b'{"uid": "u%d", "item": %d, "ts": 1700000009, "act": "click", "x": "\xff", "x": 2}',
    b'{"uid": "u%d", "uid": "u%d", "ts": 1700000009, "act": "click"}',
    b'{"uid": "u%d", "item": %d, "ts": 1700000009, "act": "click", "x": NaN}',
    b'{"uid": "u%d", "item": %d, "ts": 1700000009, "act": "click", "x": "\xc3\xbc"}',  # valid UTF-8
    b'{"uid": "2020-01-0%d", "item": %d, "ts": 1700000009, "act": "click"}',
    b'{"uid": "u%d", "item": %d, "ts": "2023-11-14T22:13:20", "act": "click"}\r',
    b'  {"uid": "u%d", "item": %d, "ts": 1700000000, "act": "click"}  ',
    b"",
    b"   ",
]


def _read_sampled(config, fraction: float, chunk_bytes: int) -> tuple[pa.Table, pa.Table, np.ndarray, int]:
    events, rejects, dropped, total = [], [], [], 0
    for task in plan_read_tasks(config):
        for chunk in read_task(config, task, user_fraction=fraction, chunk_bytes=chunk_bytes):
            events.append(chunk.events)
            rejects.append(chunk.rejects)
            dropped.append(chunk.sampled_users)
            total += chunk.rows_read
    by_row = pa.concat_tables([REJECT_SCHEMA.empty_table(), *rejects]).sort_by("row")
    events_by_row = pa.concat_tables([EVENT_SCHEMA.empty_table(), *events]).sort_by("row")
    return events_by_row, by_row, np.sort(np.concatenate([np.zeros(0, np.int64), *dropped])), total


def _same_as_parse_all_then_sample(tmp_path: Path, lines: list[bytes], chunk_bytes: int, monkeypatch) -> int:
    """Reads ``lines`` with ``user_fraction=0.5`` with and without the user-first path (without it,
    every field of every line is parsed and ``UserSample.apply`` drops rows afterwards, as for the
    other formats) and checks both give the same events, rejects and sampled-out users. Returns how
    many stretches the user-first path took."""
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    config = one_source(tmp_path, "jsonl", "a.jsonl")
    monkeypatch.setattr(jsonl, "JSON_CLEAN_LINES", 16)
    monkeypatch.setattr(jsonl, "JSON_PIECE_LINES", 8)
    monkeypatch.setattr(jsonl, "MIN_FAST_LINES", 2)
    taken = []
    user_first = jsonl._user_first

    def spy(*args):
        pieces = user_first(*args)
        taken.append(pieces is not None)
        return pieces

    monkeypatch.setattr(jsonl, "_user_first", spy)
    fast = _read_sampled(config, 0.5, chunk_bytes)
    monkeypatch.setattr(jsonl, "_user_first", lambda *args: None)
    slow = _read_sampled(config, 0.5, chunk_bytes)
    assert fast[0].equals(slow[0])
    assert fast[1].equals(slow[1])
    assert np.array_equal(fast[2], slow[2]) and fast[3] == slow[3]
    assert fast[3] == fast[0].num_rows + fast[1].num_rows + len(fast[2])
    return sum(taken)


def _line(template: bytes, i: int) -> bytes:
    return template % ((i % 37, i) if template.count(b"%d") == 2 else ()) if b"%d" in template else template


@pytest.mark.parametrize("bad", range(len(_HOSTILE)))
def test_user_first_json_read_equals_parsing_everything_then_sampling(tmp_path: Path, bad: int, monkeypatch):
    """Clean stretches around one hostile line of each kind: the same events, rejects (rows,
    reasons, raw text) and sampled-out users as parsing every field and sampling afterwards; the
    clean stretches take the user-first path."""
    lines = [_line(_CLEAN[i % 3], i) for i in range(120)]
    lines[50] = _line(_HOSTILE[bad], 50)
    # blocks of ~2 KB: the stretches of the blocks without the hostile line take the user-first path
    assert _same_as_parse_all_then_sample(tmp_path, lines, 2048, monkeypatch) >= 5


def test_user_first_json_read_of_integer_user_ids(tmp_path: Path, monkeypatch):
    lines = [_INT_USER % (i % 41, i) for i in range(100)]
    assert _same_as_parse_all_then_sample(tmp_path, lines, 1 << 20, monkeypatch) >= 5


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(st.integers(0, len(_HOSTILE) + 8), min_size=1, max_size=80),
    chunk_bytes=st.sampled_from([64, 700, 1 << 20]),
)
def test_user_first_json_read_on_random_mixtures(tmp_path: Path, kinds: list[int], chunk_bytes: int, monkeypatch):
    """Random mixtures of clean and hostile lines, in blocks of several sizes."""
    templates = [*_HOSTILE, *_CLEAN, *_CLEAN, _INT_USER, _INT_USER, _CLEAN[0]]
    lines = [_line(_CLEAN[0], 0)] + [_line(templates[k], i) for i, k in enumerate(kinds, start=1)]
    _same_as_parse_all_then_sample(tmp_path, lines, chunk_bytes, monkeypatch)


def test_selected_in_blocks_equals_splitmix64_on_the_whole_array():
    """``selected`` runs in blocks of ``ids._BLOCK`` rows; the blocks must not change the answer."""
    users = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, 3 * (1 << 16) + 5, dtype=np.int64)
    with np.errstate(over="ignore"):
        x = users.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    for fraction in (0.01, 0.1, 0.5, 0.99):
        want = (x >> np.uint64(11)) < np.uint64(np.ceil(fraction * 2.0**53))
        assert np.array_equal(selected(users, fraction), want)
        assert abs(want.mean() - fraction) < 0.01


@given(st.lists(st.binary(max_size=6).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=30), st.data())
def test_lines_joined_is_the_chosen_lines_one_per_row(raw: list[bytes], data):
    lines = split_lines(b"\n".join(raw) + b"\n")
    chosen = np.array(sorted(data.draw(st.sets(st.integers(0, len(raw) - 1)))), dtype=np.int64)
    expected = b"\n".join(raw[i] for i in chosen)
    assert lines.joined(chosen) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60),
    st.lists(st.integers(-50, 50), max_size=200),
    st.booleans(),
)
def test_count_values_equals_numpy_unique(wide: list[int], narrow: list[int], read_only: bool):
    """The scan's per-user counts (``scan.count_values``): a bincount for ids in a narrow range, an
    in-place sort otherwise (63-bit hashed ids, negative ids), the same result as ``np.unique``."""
    from freescale.pipeline.steps.scan import count_values

    for values in (np.array(wide, np.int64), np.array(narrow, np.int64), np.array(wide + narrow, np.int64)):
        want_ids, want_counts = np.unique(values, return_counts=True)
        given_values = values.copy()
        given_values.flags.writeable = not read_only
        ids, counts = count_values(given_values)
        assert ids.dtype == counts.dtype == np.int64
        assert np.array_equal(ids, want_ids) and np.array_equal(counts, want_counts)
