"""Splitting source reads: byte-range splitting, many files with file indices, and reads from S3."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from source_cases import GENERIC_COLUMNS, one_source, read_all, reject_list

from freescale import storage
from freescale.datasets.config import SourcesConfig
from freescale.datasets.sources import iter_events, plan_read_tasks, read_user_table

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
