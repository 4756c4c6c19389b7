"""Source file formats and typing: Parquet, Arrow IPC, ISO8601/TSV, id types, user table, headerless CSV, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from source_cases import GENERIC_COLUMNS, one_source, read_all, reject_list, write_toml

from freescale.datasets.ids import stable_id, stable_id_one
from freescale.datasets.sources import plan_read_tasks, read_user_table


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


def test_a_user_listed_twice_keeps_its_first_valid_row_and_rejects_the_others(tmp_path: Path, monkeypatch):
    """A users table lists a user twice (in one chunk, across chunks and across files): its first valid
    row is its profile and every later one a ``duplicate_user`` reject, so rows read = profiles + rejects.
    Before, the join kept the first row and dropped the others uncounted."""
    from freescale.datasets import sources

    monkeypatch.setattr(sources, "DEFAULT_CHUNK_BYTES", 24)  # a few lines per chunk
    (tmp_path / "u1.csv").write_text("user_id,age\n1,3\n2,x\n2,4\n1,5\n3,6\n2,7\n")
    (tmp_path / "u2.csv").write_text("user_id,age\n3,8\n4,9\n")
    (tmp_path / "a.csv").write_text("uid,item,ts,act\n")
    users_toml = '[users]\npath = "u*.csv"\n[users.columns]\nuser = "user_id"\nfeatures = ["age"]\n'
    config = write_toml(
        tmp_path, '[[sources]]\nname = "s"\nformat = "csv"\npath = "a.csv"\n' + GENERIC_COLUMNS + users_toml
    )
    users, rejects = read_user_table(config)
    assert users.to_pydict() == {"user_id": [1, 2, 3, 4], "age": [3, 4, 6, 9]}
    assert sorted(zip(rejects["file"].to_pylist(), *(rejects[c].to_pylist() for c in ("row", "reason", "field")))) == [
        (str(tmp_path / "u1.csv"), 1, "bad_type", "age"),
        (str(tmp_path / "u1.csv"), 3, "duplicate_user", "user"),
        (str(tmp_path / "u1.csv"), 5, "duplicate_user", "user"),
        (str(tmp_path / "u2.csv"), 0, "duplicate_user", "user"),
    ]


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
