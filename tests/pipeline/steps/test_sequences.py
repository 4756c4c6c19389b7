"""Sample construction: merge by time, truncation, sliding windows, min-length; accounting."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.pipeline.config import SampleConfig
from freescale.pipeline.steps.sequences import SORT_KEYS, build_samples, planned_samples, time_sort


def events(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    """(user, item, ts, source) rows → canonical sorted frame."""
    frame = pl.DataFrame(
        {
            "user_id": [r[0] for r in rows],
            "item_id": [r[1] for r in rows],
            "ts": [r[2] for r in rows],
            "action": [r[3] for r in rows],
            "source": [r[3] for r in rows],
            "file_index": [0] * len(rows),
            "row": list(range(len(rows))),
        },
        schema={
            "user_id": pl.Int64,
            "item_id": pl.Int64,
            "ts": pl.Int64,
            "action": pl.Int32,
            "source": pl.Int8,
            "file_index": pl.Int32,
            "row": pl.Int64,
        },
    )
    return frame.sort(SORT_KEYS)


def build(frame: pl.DataFrame, **options):
    return build_samples(frame, SampleConfig(**options), scan_dir="", partition=0, feature_names=[])


def test_sources_merge_in_time_order_and_accounting_balances() -> None:
    frame = events([(1, 10, 30, 0), (1, 11, 10, 1), (1, 12, 20, 0), (2, 13, 5, 1), (2, 14, 6, 1), (3, 15, 1, 0)])
    table, record = build(frame, max_uih_len=100, min_len=2)
    rows = table.to_pylist()
    assert [r["user_id"] for r in rows] == [1, 2]
    assert rows[0]["item_ids"] == [11, 12, 10] and rows[0]["sources"] == [1, 0, 0]
    assert rows[0]["timestamps"] == [10, 20, 30]
    assert record.filtered == {"kcore": 0, "min_len": 1, "truncated_max_uih_len": 0}
    assert record.events_used + sum(record.filtered.values()) == record.events_in == 6


def test_truncation_keeps_the_most_recent_events() -> None:
    frame = events([(7, item, item, 0) for item in range(10)])
    table, record = build(frame, max_uih_len=4, min_len=2)
    assert table.column("item_ids").to_pylist() == [[6, 7, 8, 9]]
    assert record.filtered["truncated_max_uih_len"] == 6 and record.events_used == 4


def test_sliding_windows_cover_history_and_count_each_event_once() -> None:
    frame = events([(7, item, item, 0) for item in range(10)])
    table, record = build(frame, max_uih_len=4, min_len=2, window_stride=3)
    windows = table.column("item_ids").to_pylist()
    assert windows == [[6, 7, 8, 9], [3, 4, 5, 6], [0, 1, 2, 3]]
    assert table.column("window").to_pylist() == [0, 1, 2]
    assert record.events_used == 10 and record.filtered["truncated_max_uih_len"] == 0
    assert all(len(w) >= 2 for w in windows)


@pytest.mark.parametrize("stride", [1, 2, 5])
def test_windows_end_every_stride_events(stride: int) -> None:
    n = 12
    frame = events([(1, item, item, 0) for item in range(n)])
    table, _ = build(frame, max_uih_len=5, min_len=2, window_stride=stride)
    ends = [w[-1] + 1 for w in table.column("item_ids").to_pylist()]
    assert ends == list(range(n, 1, -stride))
    assert table.column("length").to_pylist() == [min(5, e) for e in ends]


def test_empty_partition() -> None:
    table, record = build(events([]), max_uih_len=5)
    assert table.num_rows == 0 and record.events_in == 0


def test_many_users_vectorised_matches_python() -> None:
    rng = np.random.default_rng(0)
    rows = [
        (int(u), int(rng.integers(100)), int(rng.integers(1000)), int(rng.integers(2)))
        for u in rng.integers(0, 50, 2000)
    ]
    frame = events(rows)
    table, record = build(frame, max_uih_len=20, min_len=3)
    by_user: dict[int, list] = {}
    for user, item, ts, source in sorted(rows, key=lambda r: (r[0], r[2], r[3])):
        by_user.setdefault(user, []).append((ts, source, item))
    expected = {u: [e[2] for e in evs][-20:] for u, evs in by_user.items() if len(evs) >= 3}
    got = dict(zip(table.column("user_id").to_pylist(), table.column("item_ids").to_pylist()))
    assert got.keys() == expected.keys()
    assert got == expected  # ties in ts break by source, then by input row, in both
    assert record.events_used + sum(record.filtered.values()) == len(rows)


@pytest.mark.parametrize(("ts_high", "key_bits"), [(2**31, 64), (2**31, 40), (2**40, 64), (2**52, 64)])
def test_packed_time_order_is_the_canonical_sort(ts_high: int, key_bits: int) -> None:
    """Events in (source, file_index, row) order, stably sorted by (user, ts), are in SORT_KEYS order,
    whichever key holds them: unique keys (rank, offset, row) when they fit in ``key_bits``, stably
    sorted (rank, offset) keys otherwise; timestamps spanning 2^32 s or more take the general sort."""
    rng = np.random.default_rng(ts_high + key_bits)
    n = 5_000
    frame = pl.DataFrame(
        {
            "user_id": rng.choice([3, 2**62 + 5, 17, 2**40], n).astype(np.int64),
            "item_id": np.arange(n, dtype=np.int64),
            "ts": rng.integers(0, 40, n) + rng.choice([0, ts_high - 50], n),
            "action": rng.integers(0, 3, n).astype(np.int32),
            "source": rng.integers(0, 3, n).astype(np.int8),
            "file_index": rng.integers(0, 2, n).astype(np.int32),
            "row": rng.permutation(n).astype(np.int64),
        }
    ).sort(["source", "file_index", "row"])
    users, ts = frame["user_id"].to_numpy(), frame["ts"].to_numpy()
    computed = time_sort(users, ts, key_bits=key_bits)
    assert (computed is None) == (ts_high - 50 >= 2**32)
    if computed is not None:
        order = computed.order
        assert frame[order].equals(frame.sort(SORT_KEYS))
        known = np.array([1, 3, 17, 2**40, 2**62 + 5], np.int64)  # a sorted superset, as prepare passes
        result = time_sort(users, ts, known, key_bits)
        assert np.array_equal(result.order, order)
        with pytest.raises(ValueError, match="every user id"):
            time_sort(users, ts, known[known != 17], key_bits)
        assert (result.user_ids is not None) == (key_bits == 64)  # the unique-key sort yields them
        if result.user_ids is not None:
            assert np.array_equal(result.user_ids, users[order])
            assert np.array_equal(result.ts, frame["ts"].to_numpy()[order])


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=0, max_size=12),
    max_uih_len=st.integers(2, 16),
    min_len=st.integers(1, 6),
    stride=st.sampled_from([0, 1, 3, 7]),
    kcore=st.sampled_from([0, 2, 5]),
)
def test_planned_samples_match_the_built_ones(counts, max_uih_len, min_len, stride, kcore) -> None:
    """``prepare`` plans from per-user counts before building: both must give the same samples."""
    if min_len > max_uih_len:
        min_len = max_uih_len
    rows = [(user, user * 100 + i, i, 0) for user, count in enumerate(counts, start=3) for i in range(count)]
    cfg = {"max_uih_len": max_uih_len, "min_len": min_len, "window_stride": stride, "kcore": kcore}
    table, _ = build(events(rows), **cfg)
    users = np.arange(3, 3 + len(counts), dtype=np.int64)
    planned = planned_samples(users, np.array(counts, np.int64), SampleConfig(**cfg))
    assert planned["user_id"].tolist() == table.column("user_id").to_pylist()
    assert planned["window"].tolist() == table.column("window").to_pylist()
    assert planned["length"].tolist() == table.column("length").to_pylist()


def test_spill_timestamps_hold_every_valid_timestamp() -> None:
    """Spill files keep ``ts`` as uint32: every timestamp the readers accept must fit."""
    from freescale.datasets.convert import TS_MAX, TS_MIN
    from freescale.pipeline.steps.scan import SPILL_SCHEMA

    kind = SPILL_SCHEMA.field("ts").type
    assert kind == pa.uint32() and TS_MIN >= 0 and TS_MAX - 1 <= 2**32 - 1


@settings(max_examples=150, deadline=None)
@given(
    distinct=st.sets(st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 40)), min_size=1, max_size=300),
    picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=400),
    stranger=st.one_of(st.integers(-(2**63), 2**63 - 1), st.just(0)),
)
def test_user_rank_table_finds_every_users_rank(distinct, picks, stranger):
    """``user_rank``'s hash table gives each event its user's position in the sorted distinct ids
    (as a binary search would), and refuses a user that is not among them (0 included: empty slots
    hold key 0)."""
    from freescale.pipeline.steps.sequences import user_rank

    users = np.array(sorted(distinct), np.int64)
    events = users[np.array(picks) % len(users)]
    assert user_rank(events, users).tolist() == np.searchsorted(users, events).tolist()
    if stranger not in distinct:
        with pytest.raises(ValueError, match="every user id"):
            user_rank(np.append(events, stranger), users)
