"""Source config, readers and reject accounting (freescale.datasets.sources and friends)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from source_cases import BAD_CSV, BAD_JSONL, GENERIC_COLUMNS, one_source, read_all, reject_list, write_toml

from freescale import storage
from freescale.datasets.config import SourceError, SourcesConfig, SourceSpec
from freescale.datasets.ids import stable_id, stable_id_one
from freescale.datasets.sources import (
    iter_events,
    plan_read_tasks,
    read_task,
    read_user_table,
)

# --- ids ---------------------------------------------------------------------------------------


def test_stable_id_is_deterministic_non_negative_and_hashes_unique_values():
    values = ["u1", "u2", "u1", None, "A2SUAM1J3GNN3B"]
    ids = stable_id(values)
    assert ids.dtype == np.int64
    assert ids[0] == ids[2] == stable_id_one("u1")
    assert ids[3] == -1
    assert (ids[[0, 1, 2, 4]] >= 0).all()
    assert (stable_id(pa.array(values).dictionary_encode()) == ids).all()
    assert all(0 <= stable_id_one(f"x{k}") < 2**63 for k in range(100))
    assert len(stable_id([])) == 0


# --- config ------------------------------------------------------------------------------------


def test_toml_round_trip(tmp_path: Path):
    config = one_source(tmp_path, "csv", "a.csv", 'timestamp_unit = "ms"\nid_types = { user = "string" }')
    again = SourcesConfig.from_toml(str(tmp_path / "sources.toml"))
    assert again.to_dict() == config.to_dict()
    (tmp_path / "copy.toml").write_text(config.to_toml())
    copy = SourcesConfig.from_toml(str(tmp_path / "copy.toml"))
    assert copy.to_dict() == config.to_dict()
    assert copy.sources[0].timestamp_unit == "ms"
    assert copy.sources[0].id_types == {"user": "string"}
    assert copy.resolve("a.csv") == str(tmp_path / "a.csv")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ('colour = "red"', "colour"),
        ('timestamp_unit = "minutes"', "timestamp_unit"),
        ('variant = "dat"', "variant"),
        ("default_action = -1", "default_action"),
        ("header = 3", "header"),
    ],
)
def test_bad_options_name_the_option_and_the_file(tmp_path: Path, extra: str, needle: str):
    with pytest.raises(ValueError, match=needle) as info:
        one_source(tmp_path, "csv", "a.csv", extra)
    assert "sources.toml" in str(info.value)


def test_unknown_format_and_missing_columns_are_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="format"):
        one_source(tmp_path, "xlsx", "a.xlsx")
    with pytest.raises(ValueError, match=r"columns.*timestamp"):
        one_source(tmp_path, "csv", "a.csv", columns='[sources.columns]\nuser = "u"\nitem = "i"\n')
    with pytest.raises(ValueError, match="unique"):
        SourcesConfig(name="x", sources=[SourceSpec("a", "movielens", p) for p in ("x", "y")])


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


def test_missing_files_and_empty_globs_are_source_errors(tmp_path: Path):
    with pytest.raises(SourceError, match=r"'s'.*no file matches.*nothing"):
        plan_read_tasks(one_source(tmp_path, "csv", "nothing/*.csv"))
    with pytest.raises(SourceError, match=r"missing\.csv"):
        plan_read_tasks(one_source(tmp_path, "csv", "missing.csv"))
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(SourceError, match=r"broken\.parquet"):
        plan_read_tasks(one_source(tmp_path, "parquet", "broken.parquet"))


# --- formats -----------------------------------------------------------------------------------

ML_ROWS = [(1, 1193, 5, 978300760), (1, 661, 3, 978302109), (2, 3408, 4, 978300275)]


def _ml_expected(events: pa.Table) -> list[tuple]:
    return list(zip(*(events[c].to_pylist() for c in ("user_id", "item_id", "action", "ts"))))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("ratings.dat", "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in ML_ROWS)),
        ("u.data", "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ML_ROWS)),
        (
            "ratings.csv",
            "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},{r}.0,{t}\n" for u, i, r, t in ML_ROWS),
        ),
    ],
)
def test_movielens_variants(tmp_path: Path, name: str, text: str):
    (tmp_path / name).write_text(text)
    events, rejects, _ = read_all(one_source(tmp_path, "movielens", name, columns=""))
    assert rejects.num_rows == 0
    assert _ml_expected(events) == ML_ROWS
    assert events["row"].to_pylist() == [0, 1, 2]


def test_movielens_half_stars_need_rating_scale(tmp_path: Path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,2,3.5,978300760\n")
    _, rejects, _ = read_all(one_source(tmp_path, "movielens", "ratings.csv", columns=""))
    assert reject_list(rejects) == [(0, "bad_type", "action")]
    events, _, _ = read_all(one_source(tmp_path, "movielens", "ratings.csv", "rating_scale = 2", columns=""))
    assert events["action"].to_pylist() == [7]


def test_recbole_inter(tmp_path: Path):
    text = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    text += "196\t242\t3.0\t881250949.0\nA1B\t0000013714\t5\t881250950\n"
    (tmp_path / "ml.inter").write_text(text)
    events, rejects, _ = read_all(one_source(tmp_path, "recbole", "ml.inter", columns=""))
    assert rejects.num_rows == 0
    assert events["user_id"].to_pylist() == [196, stable_id_one("A1B")]
    assert events["item_id"].to_pylist() == [242, 13714]  # auto: all-digit strings are integers
    assert events["action"].to_pylist() == [3, 5]
    assert events["ts"].to_pylist() == [881250949, 881250950]


def test_recbole_without_rating_uses_default_action(tmp_path: Path):
    (tmp_path / "x.inter").write_text("user_id:token\titem_id:token\ttimestamp:float\n1\t2\t881250949\n")
    events, _, _ = read_all(one_source(tmp_path, "recbole", "x.inter", "default_action = 9", columns=""))
    assert events["action"].to_pylist() == [9]


def test_amazon_reviews(tmp_path: Path):
    rows = [
        {
            "reviewerID": "A2SUAM1J3GNN3B",
            "asin": "0000013714",
            "overall": 5.0,
            "unixReviewTime": 1382659200,
            "reviewText": "great",
            "style": {"Format:": " Hardcover"},
        },
        {
            "reviewerID": "A14VAT5EAX3D9S",
            "asin": "0000013714",
            "overall": 4.0,
            "unixReviewTime": 1367193600,
            "vote": "3",
        },
    ]
    (tmp_path / "Books.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events, rejects, _ = read_all(one_source(tmp_path, "amazon", "Books.json", columns=""))
    assert rejects.num_rows == 0
    assert events["user_id"].to_pylist() == [stable_id_one("A2SUAM1J3GNN3B"), stable_id_one("A14VAT5EAX3D9S")]
    assert events["item_id"].to_pylist() == [stable_id_one("0000013714")] * 2  # amazon ids are strings
    assert events["action"].to_pylist() == [5, 4]
    assert events["ts"].to_pylist() == [1382659200, 1367193600]


def test_parquet_row_groups_units_and_row_numbers(tmp_path: Path):
    n = 1000
    table = pa.table(
        {
            "uid": pa.array(np.arange(n) % 17, pa.int32()),
            "item": pa.array([f"i{k}" for k in range(n)]),
            "ts": pa.array(1_700_000_000_000 + np.arange(n) * 1500, pa.int64()),
            "act": pa.array(["click", "view"] * (n // 2)).dictionary_encode(),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=100)
    config = one_source(tmp_path, "parquet", "a.parquet", 'timestamp_unit = "ms"')
    tasks = plan_read_tasks(config, target_rows=250)
    expected = [(0, 3, 0), (3, 6, 300), (6, 9, 600), (9, 10, 900)]
    assert [(t.start, t.stop, t.first_row) for t in tasks] == expected
    events, rejects, _ = read_all(config, target_rows=250, chunk_rows=64)
    assert rejects.num_rows == 0
    assert events["row"].to_pylist() == list(range(n))
    assert events["ts"].to_pylist() == [(1_700_000_000_000 + k * 1500) // 1000 for k in range(n)]
    assert events["item_id"].to_pylist() == stable_id([f"i{k}" for k in range(n)]).tolist()


def test_arrow_ipc_batches_and_typed_timestamps(tmp_path: Path):
    schema = pa.schema([("uid", pa.int64()), ("item", pa.int64()), ("ts", pa.timestamp("ms")), ("act", pa.string())])
    with pa.ipc.new_file(str(tmp_path / "a.arrow"), schema) as writer:
        for b in range(4):
            writer.write_table(
                pa.table(
                    {
                        "uid": [b, b],
                        "item": [1, 2],
                        "ts": pa.array([1_700_000_000_000, 1_700_000_001_999], pa.timestamp("ms")),
                        "act": ["click", "nope"],
                    },
                    schema=schema,
                )
            )
    config = one_source(tmp_path, "arrow", "a.arrow")
    tasks = plan_read_tasks(config, target_rows=4)
    assert [(t.start, t.stop, t.first_row) for t in tasks] == [(0, 2, 0), (2, 4, 4)]
    events, rejects, _ = read_all(config, target_rows=4)
    assert events["ts"].to_pylist() == [1_700_000_000] * 4
    assert reject_list(rejects) == [(r, "unknown_action", "action") for r in (1, 3, 5, 7)]
    assert json.loads(rejects["raw"][0].as_py())["act"] == "nope"


def test_iso8601_and_tsv(tmp_path: Path):
    text = "uid\titem\tts\tact\n1\t2\t2020-01-02T03:04:05Z\tclick\n1\t3\t2020-01-02 03:04:06\tview\n"
    text += "1\t4\t2020-01-02T05:04:05+02:00\tclick\n1\t5\t2020-13-40\tclick\n"
    (tmp_path / "a.tsv").write_text(text)
    events, rejects, _ = read_all(one_source(tmp_path, "tsv", "a.tsv", 'timestamp_unit = "iso8601"'))
    assert events["ts"].to_pylist() == [1577934245, 1577934246, 1577934245]
    assert reject_list(rejects) == [(3, "bad_timestamp", "timestamp")]


def test_id_types_int_rejects_strings(tmp_path: Path):
    (tmp_path / "a.csv").write_text("uid,item,ts,act\nu1,2,1700000000,click\n7,2,1700000000,click\n")
    _, rejects, _ = read_all(one_source(tmp_path, "csv", "a.csv", 'id_types = { user = "int" }'))
    assert reject_list(rejects) == [(0, "bad_type", "user")]


def test_user_table(tmp_path: Path):
    (tmp_path / "users.csv").write_text("user_id,age_bucket,country_id\nu1,3,7\n2,4,x\n3,,1\n4,5,6\n")
    (tmp_path / "a.csv").write_text("uid,item,ts,act\n")
    config = write_toml(
        tmp_path,
        (
            '[[sources]]\nname = "s"\nformat = "csv"\npath = "a.csv"\n'
            + GENERIC_COLUMNS
            + '[users]\npath = "users.csv"\nformat = "csv"\n[users.columns]\nuser = "user_id"\n'
            + 'features = ["age_bucket", "country_id"]\n'
        ),
    )
    users, rejects = read_user_table(config)
    expected = {"user_id": [stable_id_one("u1"), 4], "age_bucket": [3, 5], "country_id": [7, 6]}
    assert users.to_pydict() == expected
    assert reject_list(rejects) == [(1, "bad_type", "country_id"), (2, "bad_type", "age_bucket")]
    events, _, rows_read = read_all(config)  # a header-only file has no rows and no error
    assert events.num_rows == 0 and rows_read == 0


# --- splitting ---------------------------------------------------------------------------------

SPLIT_CSV = ["uid,item,ts,act"] + [
    f"{i % 11},{i * 7},{1_700_000_000 + i},{'click' if i % 3 else 'view'}" for i in range(120)
]
SPLIT_CSV[17] = "bad,row"
SPLIT_CSV[40] = ""
SPLIT_CSV[41] = "   "
SPLIT_CSV[77] = "5,6,notatime,click\r"
SPLIT_JSONL = [json.dumps({"uid": f"u{i % 9}", "item": i, "ts": 1_700_000_000 + i, "act": "click"}) for i in range(120)]
SPLIT_JSONL[10] = '{"uid": "u1", "item": 3'
SPLIT_JSONL[50] = ""
SPLIT_JSONL[90] = '{"uid": "u1", "item": true, "ts": 1700000000, "act": "click"}'


def _rows(table: pa.Table, columns: list[str]) -> list[tuple]:
    return sorted(zip(*(table[c].to_pylist() for c in columns)))


@pytest.fixture(scope="module")
def split_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("split")
    (folder / "a.csv").write_bytes(("\r\n".join(SPLIT_CSV) + "\r\n").encode())
    (folder / "a.jsonl").write_text("\n".join(SPLIT_JSONL))  # no trailing newline
    return folder


@pytest.mark.parametrize(("fmt", "name"), [("csv", "a.csv"), ("jsonl", "a.jsonl")])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target_rows=st.integers(1, 80), chunk_bytes=st.integers(48, 3000), count_lines=st.booleans())
def test_byte_range_splitting_matches_whole_read(split_files, fmt, name, target_rows, chunk_bytes, count_lines):
    config = one_source(split_files, fmt, name)
    whole_events, whole_rejects, whole_read = read_all(config, target_rows=10**9)
    tasks = plan_read_tasks(config, target_rows, count_lines=count_lines)
    assert all(a.stop == b.start for a, b in itertools.pairwise(tasks))
    events, rejects, rows_read = read_all(
        config, target_rows=target_rows, count_lines=count_lines, chunk_bytes=chunk_bytes
    )
    columns = ["user_id", "item_id", "ts", "action", "row"]
    assert _rows(events, columns) == _rows(whole_events, columns)
    reject_columns = ["row", "reason", "field", "raw"]
    assert _rows(rejects, reject_columns) == _rows(whole_rejects, reject_columns)
    assert rows_read == whole_read == len(events) + len(rejects)
    assert len(set(events["row"].to_pylist())) == events.num_rows


def test_split_files_expected_rows(split_files):
    events, rejects, _ = read_all(one_source(split_files, "csv", "a.csv"))
    assert events.num_rows == 116
    assert reject_list(rejects) == [(16, "malformed_row", ""), (76, "bad_timestamp", "timestamp")]
    events, rejects, _ = read_all(one_source(split_files, "jsonl", "a.jsonl"))
    assert events.num_rows == 117
    assert reject_list(rejects) == [(10, "malformed_row", ""), (90, "bad_type", "item")]


def test_many_files_get_file_indices(tmp_path: Path):
    for k in range(3):
        (tmp_path / f"p{k}.csv").write_text(f"uid,item,ts,act\n{k},1,1700000000,click\n")
    events, _, _ = read_all(one_source(tmp_path, "csv", "p*.csv"))
    assert events["file_index"].to_pylist() == [0, 1, 2]
    assert events["user_id"].to_pylist() == [0, 1, 2]
    assert next(iter(iter_events(one_source(tmp_path, "csv", "p*.csv")))).events.num_rows == 1


# --- object storage ----------------------------------------------------------------------------


@pytest.fixture
def s3_server(monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {
        "S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    yield endpoint
    server.stop()


def test_read_csv_and_toml_from_s3(s3_server):
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    client.create_bucket(Bucket="data")
    csv_text = "\n".join(SPLIT_CSV[:60]) + "\n"
    client.put_object(Bucket="data", Key="ds/logs/part-0.csv", Body=csv_text.encode())
    client.put_object(Bucket="data", Key="ds/logs/part-1.csv", Body=csv_text.encode())
    toml = '[dataset]\nname = "s3"\n[[sources]]\nname = "s"\nformat = "csv"\npath = "logs/*.csv"\n'
    toml += GENERIC_COLUMNS
    client.put_object(Bucket="data", Key="ds/sources.toml", Body=toml.encode())
    config = SourcesConfig.from_toml("s3://data/ds/sources.toml")
    assert config.base_dir == "s3://data/ds"
    tasks = plan_read_tasks(config, target_rows=7)
    assert {t.path for t in tasks} == {"s3://data/ds/logs/part-0.csv", "s3://data/ds/logs/part-1.csv"}
    events, rejects, rows_read = read_all(config, target_rows=7, chunk_bytes=100)
    assert rows_read == 2 * 57  # 59 lines, two of them blank
    assert events["file_index"].to_pylist().count(1) == events.num_rows // 2
    assert reject_list(rejects) == [(16, "malformed_row", "")] * 2


def test_headerless_csv_uses_positional_columns(tmp_path: Path):
    (tmp_path / "a.txt").write_text("7;8;1700000000\n9;10;1700000001\n")
    columns = '[sources.columns]\nuser = "0"\nitem = "1"\ntimestamp = "2"\n'
    config = one_source(
        tmp_path, "csv", "a.txt", 'header = false\ndelimiter = ";"\ndefault_action = 3', columns=columns
    )
    events, rejects, _ = read_all(config)
    assert rejects.num_rows == 0
    assert events.select(["user_id", "item_id", "action", "row"]).to_pylist() == [
        {"user_id": 7, "item_id": 8, "action": 3, "row": 0},
        {"user_id": 9, "item_id": 10, "action": 3, "row": 1},
    ]


def test_generate_to_s3_and_read_back(s3_server):
    boto3 = pytest.importorskip("boto3")
    from freescale.datasets.presets import preset
    from freescale.datasets.synthetic import generate

    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket="gen")
    config = generate(preset("tiny", n_users=30, malformed_fraction=0.05), "s3://gen/tiny")
    assert config.origin == "s3://gen/tiny/sources.toml"
    summary = json.loads(storage.read_bytes("s3://gen/tiny/generated.json"))
    events, rejects, rows_read = read_all(config)
    assert (events.num_rows, rows_read) == (summary["events"], summary["rows"])
    assert rejects.num_rows == sum(summary["rejects"].values())
    assert read_user_table(config)[0].num_rows == 30


def test_json_strings_that_look_like_dates_keep_their_text(tmp_path: Path):
    lines = [
        '{"uid": "2020-01-01", "item": 1, "ts": "2020-01-02T03:04:05Z", "act": "click"}',
        '{"uid": "2020-01-02", "item": 2, "ts": "2020-01-02 03:04:06", "act": "view"}',
    ]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    events, rejects, _ = read_all(one_source(tmp_path, "jsonl", "a.jsonl", 'timestamp_unit = "iso8601"'))
    assert rejects.num_rows == 0
    assert events["user_id"].to_pylist() == stable_id(["2020-01-01", "2020-01-02"]).tolist()
    assert events["ts"].to_pylist() == [1577934245, 1577934246]
