"""Rejected source rows and their accounting: reject reasons, JSON paths, rows read, missing columns."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from source_cases import BAD_CSV, BAD_JSONL, GENERIC_COLUMNS, one_source, read_all, reject_list

from freescale.datasets.config import SourceError
from freescale.datasets.ids import stable_id_one
from freescale.datasets.sources import plan_read_tasks, read_task

# --- rejects -----------------------------------------------------------------------------------


def test_each_reject_reason_from_a_bad_csv(tmp_path: Path):
    (tmp_path / "a.csv").write_text(BAD_CSV)
    config = one_source(tmp_path, "csv", "a.csv")
    events, rejects, rows_read = read_all(config)
    assert rows_read == 12  # the blank line is not a row, but it keeps its row number
    assert events["row"].to_pylist() == [0, 1, 2]
    assert events["user_id"].to_pylist()[:2] == [1, 2]
    assert events["user_id"][2].as_py() == stable_id_one("u3")
    assert events["action"].to_pylist() == [1, 0, 1]
    assert reject_list(rejects) == [
        (4, "missing_id", "user"),
        (5, "negative_id", "item"),
        (6, "bad_type", "item"),
        (7, "bad_timestamp", "timestamp"),
        (8, "unknown_action", "action"),
        (9, "malformed_row", ""),
        (10, "bad_timestamp", "timestamp"),
        (11, "unknown_action", "action"),
        (12, "negative_id", "user"),
    ]
    raw = dict(zip(rejects["row"].to_pylist(), rejects["raw"].to_pylist()))
    assert raw[9] == "9,90"
    assert set(rejects["source"].to_pylist()) == {"s"}
    assert rejects["file"][0].as_py() == str(tmp_path / "a.csv")


def test_each_reject_reason_from_a_bad_jsonl(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text("\n".join(BAD_JSONL) + "\n")
    config = one_source(tmp_path, "jsonl", "a.jsonl")
    events, rejects, rows_read = read_all(config)
    assert rows_read == len(BAD_JSONL) - 1
    assert events["row"].to_pylist() == [0, 1, 14]
    assert events["user_id"].to_pylist() == [1, stable_id_one("u2"), 11]
    assert reject_list(rejects) == [
        (2, "malformed_row", ""),
        (3, "malformed_row", ""),
        (4, "missing_id", "user"),
        (5, "missing_id", "user"),
        (6, "negative_id", "item"),
        (7, "bad_type", "item"),
        (8, "bad_type", "item"),
        (9, "bad_timestamp", "timestamp"),
        (10, "unknown_action", "action"),
        (11, "malformed_row", ""),
        (12, "malformed_row", ""),
    ]
    raw = dict(zip(rejects["row"].to_pylist(), rejects["raw"].to_pylist()))
    assert raw[3] == "not json at all"


def test_json_fast_and_per_line_paths_agree(tmp_path: Path):
    """The same values read through pyarrow (clean file) and json.loads (file with one bad line)."""
    good = [f'{{"uid": "u{i % 7}", "item": {i * 3}, "ts": {1_700_000_000 + i}, "act": "view"}}' for i in range(50)]
    (tmp_path / "clean.jsonl").write_text("\n".join(good) + "\n")
    (tmp_path / "dirty.jsonl").write_text("\n".join([*good, "{oops"]) + "\n")
    clean, _, _ = read_all(one_source(tmp_path, "jsonl", "clean.jsonl"))
    dirty, rejects, _ = read_all(one_source(tmp_path, "jsonl", "dirty.jsonl"))
    cols = ["user_id", "item_id", "ts", "action", "row"]
    assert clean.select(cols).equals(dirty.select(cols))
    assert reject_list(rejects) == [(50, "malformed_row", "")]


def test_rows_read_accounting_over_many_chunks(tmp_path: Path):
    lines = ["uid,item,ts,act"] + [f"{i},{i % 13},{1_700_000_000 + i},click" for i in range(500)]
    lines[100] = "x,y"
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    config = one_source(tmp_path, "csv", "a.csv")
    chunks = [c for t in plan_read_tasks(config, 64) for c in read_task(config, t, chunk_bytes=256)]
    assert len(chunks) > 10
    assert sum(c.rows_read for c in chunks) == 500
    assert sum(c.events.num_rows for c in chunks) == 499
    assert sum(c.rejects.num_rows for c in chunks) == 1


_GOOD_JSON = b'{"uid": "u%d", "item": %d, "ts": 1700000000, "act": "click", "note": "ok"}'
_NOT_UTF8_JSON = [
    b'{"uid": "u\xff", "item": 1, "ts": 1700000000, "act": "click"}',  # in a mapped field
    b'{"uid": "u1", "item": 1, "ts": 1700000000, "act": "click", "note": "\xe9t\xe9"}',  # Latin-1, unmapped
]


@pytest.mark.parametrize("bad", _NOT_UTF8_JSON)
@pytest.mark.parametrize("dirty", [False, True])
def test_json_line_not_utf8_is_malformed_in_every_path(tmp_path: Path, bad: bytes, dirty: bool):
    """A JSON line that is not UTF-8 is one malformed row, whether its stretch is otherwise clean (one
    pyarrow call) or dirty (the careful path): pyarrow reads invalid bytes into string columns, which
    failed the whole job in a compute kernel ("Invalid UTF8 sequence in input", no file named)."""
    lines = [_GOOD_JSON % (i % 5, i) for i in range(40)]
    lines[7] = bad
    if dirty:
        lines[20] = b"{oops"
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    events, rejects, rows_read = read_all(one_source(tmp_path, "jsonl", "a.jsonl"))
    expected = [(7, "malformed_row", "")] + ([(20, "malformed_row", "")] if dirty else [])
    assert reject_list(rejects) == expected
    assert rows_read == 40 and events.num_rows == 40 - len(expected)


@pytest.mark.parametrize(
    "fmt, body",
    [
        ("movielens", b"1::1::3::978300001\n1::\xff::3\n1::2::3::978300002\n1::\xe9::3::978300003\n"),
        ("csv", b"uid,item,ts,act\n1,1,1700000000,click\n1,\xff\n1,2,1700000001,click\n1,3,1700000002,\xe9\n"),
    ],
)
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_delimited_line_not_utf8_is_malformed_without_a_traceback(tmp_path: Path, fmt: str, body: bytes):
    """Lines that are not UTF-8 are malformed rows, with the wrong field count or not: pyarrow's
    invalid-row handler cannot decode such a line and printed "Exception ignored ... Traceback" per block."""
    name = "ratings.dat" if fmt == "movielens" else "a.csv"
    (tmp_path / name).write_bytes(body)
    config = one_source(tmp_path, fmt, name, columns="" if fmt == "movielens" else GENERIC_COLUMNS)
    events, rejects, rows_read = read_all(config)
    assert reject_list(rejects) == [(1, "malformed_row", ""), (3, "malformed_row", "")]
    assert rows_read == 4 and events["row"].to_pylist() == [0, 2]


# --- source errors -----------------------------------------------------------------------------


def test_missing_column_names_source_file_and_column(tmp_path: Path):
    (tmp_path / "a.csv").write_text("uid,item,time,act\n1,2,3,click\n")
    config = one_source(tmp_path, "csv", "a.csv")
    with pytest.raises(SourceError) as info:
        plan_read_tasks(config)
    err = info.value
    assert (err.source, err.column) == ("s", "ts")
    assert err.file.endswith("a.csv")
    assert "'s'" in str(err) and "a.csv" in str(err) and "'ts'" in str(err)


def test_missing_column_in_parquet_and_jsonl(tmp_path: Path):
    pq.write_table(pa.table({"uid": [1], "item": [2], "act": ["click"]}), tmp_path / "a.parquet")
    with pytest.raises(SourceError, match=r"a\.parquet.*'ts'"):
        plan_read_tasks(one_source(tmp_path, "parquet", "a.parquet"))
    (tmp_path / "a.jsonl").write_text('{"uid": 1, "item": 2, "act": "click"}\n')
    with pytest.raises(SourceError, match=r"a\.jsonl.*'ts'"):
        plan_read_tasks(one_source(tmp_path, "jsonl", "a.jsonl"))


@pytest.mark.parametrize(
    ("fmt", "name", "content", "needle"),
    [
        ("amazon", "reviews.json.gz", gzip.compress(b'{"reviewerID": "A1", "asin": "B1"}\n' * 50), "gzip-compressed"),
        ("movielens", "ratings.dat", gzip.compress(b"1::2::3::978300760\n" * 50)[:40], "gzip-compressed"),  # truncated
        ("csv", "a.csv.zst", b"\x28\xb5\x2f\xfd" + bytes(60), "zstd-compressed"),
        ("csv", "ml-latest.zip", b"PK\x03\x04" + bytes(60), "a zip archive"),
        ("jsonl", "a.jsonl.bz2", b"BZh91AY&SY" + bytes(60), "bzip2-compressed"),
        ("csv", "a.csv", b"PAR1" + bytes(60), 'a Parquet file, not text: set format = "parquet"'),
    ],
)
def test_a_compressed_or_binary_file_for_a_text_source_is_refused_naming_it(
    tmp_path: Path, fmt: str, name: str, content: bytes, needle: str
):
    """Read line by line, a compressed file was nothing but malformed rows (the job then failed on
    --max-reject-fraction, or lost the file quietly among larger ones): it is refused before any
    work, naming the source, the file and what to do."""
    (tmp_path / name).write_bytes(content)
    columns = "" if fmt in ("amazon", "movielens") else GENERIC_COLUMNS
    with pytest.raises(SourceError, match=needle) as info:
        plan_read_tasks(one_source(tmp_path, fmt, name, columns=columns))
    assert info.value.file == str(tmp_path / name) and "'s'" in str(info.value)
