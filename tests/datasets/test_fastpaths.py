"""The readers' fast paths give exactly what the general paths give: number syntax without regexes,
dictionary-encoded Parquet actions, long clean JSON stretches, the in-process id cache."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st
from source_cases import one_source, read_all, reject_list

from freescale.datasets import ids
from freescale.datasets.convert import parse_numbers
from freescale.datasets.ids import stable_id, stable_id_one

INT_RE = re.compile(r"[+-]?[0-9]+")
FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def expected_number(text: str | None) -> tuple[bool, bool, bool, int]:
    """(empty, is_int, is_number, int value) by the documented rules, one value at a time."""
    if text is None or text == "":
        return True, False, False, 0
    if INT_RE.fullmatch(text):
        value = int(text)
        if -(2**63) <= value < 2**63:
            return False, True, True, value
    if FLOAT_RE.fullmatch(text):
        value = float(text)
        if not math.isfinite(value):
            return False, False, False, 0
        integral = value == math.floor(value) and abs(value) < 9.2e18
        return False, integral, True, int(value) if integral else 0
    return False, False, False, 0


EDGE_CASES = [
    "",
    " ",
    "12",
    "+12",
    "-12",
    "007",
    " 42 ",
    "1.5",
    ".5",
    "5.",
    "1e3",
    "+1e-3",
    "-.5e+2",
    "u0012",
    "abc",
    "\u0661\u0662",
    "\u00b2",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "+9223372036854775807",
    "1234567890123456789",
    "00000000000000000000001",
    "12345678901234567890",
    "1e400",
    "nan",
    "inf",
    "-",
    "+",
    ".",
    "e5",
    "0x1F",
    "1_000",
    "3.0",
    "-0",
    "1,5",
    None,
]


def check_numbers(values: list[str | None]) -> None:
    parsed = parse_numbers(pa.array(values, pa.string()))
    trimmed = pc.utf8_trim_whitespace(pa.array(values, pa.string())).to_pylist()
    for i, text in enumerate(trimmed):
        empty, is_int, is_number, value = expected_number(text)
        got = (bool(parsed.empty[i]), bool(parsed.is_int[i]), bool(parsed.is_number[i]))
        assert got == (empty, is_int, is_number), (values[i], got)
        if is_int:
            assert int(parsed.ints[i]) == value, values[i]


def test_number_syntax_edge_cases_in_one_column():
    check_numbers(EDGE_CASES)


def test_all_digit_columns_skip_the_regexes_and_stay_exact():
    check_numbers([str(v) for v in [0, 7, 10**17, 2**62, 2**63 - 1]])
    check_numbers(["9223372036854775808", "1"])  # a 19-digit overflow no longer fails the whole column


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(alphabet="+-.e0123456789 u\u0663", max_size=22)), min_size=1))
def test_number_syntax_matches_the_regex_rules(values):
    check_numbers(values)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(alphabet="0123456789", min_size=1, max_size=21)), min_size=1))
def test_digit_columns_cast_at_once_follow_the_regex_rules(values):
    """All-digit columns take one cast (``_all_digits``); 20+ digit values send them the long way."""
    check_numbers(values)


@settings(max_examples=80, deadline=None)
@given(
    distinct=st.lists(st.one_of(st.none(), st.text(alphabet="u07 .-x", max_size=5)), min_size=1, max_size=6),
    picks=st.lists(st.integers(0, 5), min_size=2, max_size=40),
    id_type=st.sampled_from(["auto", "int", "string"]),
)
def test_repeated_string_ids_are_converted_once_per_value(distinct, picks, id_type):
    """``convert_id`` on a column that repeats its values (the per-distinct-value path) equals the
    row-by-row conversion."""
    from freescale.datasets.convert import _convert_id_values, convert_id

    column = pa.array([distinct[i % len(distinct)] for i in picks], pa.string())
    values, codes = convert_id(column, id_type)
    expected_values, expected_codes = _convert_id_values(column, id_type)
    assert codes.tolist() == expected_codes.tolist()
    ok = codes == 0
    assert values[ok].tolist() == expected_values[ok].tolist()


INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=30),
    type_index=st.integers(0, len(INT_TYPES) - 1),
    id_type=st.sampled_from(["auto", "int", "string"]),
    unit=st.sampled_from(["s", "ms", "us", "ns"]),
)
def test_clean_typed_integers_skip_the_number_checks(values, type_index, id_type, unit):
    """Null-free signed-integer columns (``_clean_signed_ints``) convert exactly as ``parse_numbers``
    would: ids with ``negative_id`` codes, epochs floored to seconds with ``bad_timestamp`` outside 1970-2100."""
    from unittest import mock

    from freescale.datasets import convert

    kind = INT_TYPES[type_index]
    bound = 2 ** (kind.bit_width - 1)
    column = pa.array([min(max(v, -bound), bound - 1) for v in values], kind)
    fast = convert.convert_id(column, id_type), convert.convert_ts(column, unit)
    with mock.patch.object(convert, "_clean_signed_ints", return_value=None):
        general = convert.convert_id(column, id_type), convert.convert_ts(column, unit)
    for (fast_values, fast_codes), (values_expected, codes_expected) in zip(fast, general, strict=True):
        assert fast_codes.dtype == np.uint8 and fast_codes.tolist() == codes_expected.tolist()
        assert fast_values.tolist() == values_expected.tolist()


def test_nineteen_digit_overflow_rejects_one_row(tmp_path: Path):
    lines = ["uid,item,ts,act", "9223372036854775807,1,1700000000,click", "9223372036854775808,2,1700000001,click"]
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    events, rejects, rows_read = read_all(one_source(tmp_path, "csv", "a.csv"))
    assert rows_read == 2
    assert events["user_id"].to_pylist() == [2**63 - 1]
    assert reject_list(rejects) == [(1, "bad_type", "user")]


def test_parquet_dictionary_actions_across_row_groups(tmp_path: Path):
    acts = ["view", "click", None, "refund", "click", "view"]
    table = pa.table(
        {
            "uid": pa.array(range(6), pa.int64()),
            "item": pa.array(range(10, 16), pa.int64()),
            "ts": pa.array(range(1_700_000_000, 1_700_000_006), pa.int64()),
            "act": pa.array(acts, pa.string()),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)  # a different dictionary per group
    events, rejects, _ = read_all(one_source(tmp_path, "parquet", "a.parquet"), chunk_rows=3)
    assert events["action"].to_pylist() == [0, 1, 1, 0]
    assert events["row"].to_pylist() == [0, 1, 4, 5]
    assert reject_list(rejects) == [(2, "unknown_action", "action"), (3, "unknown_action", "action")]


def _jsonl(item: object, i: int) -> str:
    return f'{{"uid": "u{i % 11}", "item": {item}, "ts": {1_700_000_000 + i}, "act": "view"}}'


def test_long_clean_json_stretch_matches_the_careful_path(tmp_path: Path):
    good = [_jsonl(i * 3, i) for i in range(70_000)]
    (tmp_path / "clean.jsonl").write_text("\n".join(good) + "\n")
    (tmp_path / "dirty.jsonl").write_text("\n".join(["{oops", *good]) + "\n")
    clean, _, _ = read_all(one_source(tmp_path, "jsonl", "clean.jsonl"))
    dirty, rejects, _ = read_all(one_source(tmp_path, "jsonl", "dirty.jsonl"))
    cols = ["user_id", "item_id", "ts", "action"]
    assert clean.select(cols).equals(dirty.select(cols))
    assert dirty["row"].to_pylist() == [r + 1 for r in clean["row"].to_pylist()]
    assert reject_list(rejects) == [(0, "malformed_row", "")]


def test_json_ids_beyond_2_53_stay_exact_beside_a_fraction(tmp_path: Path):
    """A fraction promotes the column to double in a long stretch; large ids must not round with it."""
    lines = [_jsonl(i, i) for i in range(20_000)]
    lines[0] = _jsonl("1.5", 0)
    lines[15_000] = _jsonl(2**60 + 1, 15_000)
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    events, rejects, _ = read_all(one_source(tmp_path, "jsonl", "a.jsonl"))
    items = dict(zip(events["row"].to_pylist(), events["item_id"].to_pylist()))
    assert items[15_000] == 2**60 + 1
    assert reject_list(rejects) == [(0, "bad_type", "item")]


def test_id_cache_gives_the_same_ids_when_it_fills_up(monkeypatch):
    monkeypatch.setattr(ids, "KNOWN_LIMIT", 5)
    monkeypatch.setattr(ids, "_KNOWN", {})
    for start in (0, 3, 10):
        values = [f"u{i}" for i in range(start, start + 4)] + [None]
        assert stable_id(pa.array(values)).tolist() == [stable_id_one(v) for v in values[:-1]] + [-1]
    many = [f"x{i}" for i in range(12)]  # more distinct values than the cache holds
    assert np.array_equal(stable_id(pa.array(many)), [stable_id_one(v) for v in many])
