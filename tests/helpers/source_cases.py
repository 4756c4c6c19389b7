"""Shared cases of the source tests (tests/datasets/): a sources TOML with one source, reading every
task of a config, the rejects as (row, reason, field), and a CSV and a JSONL file with every reject reason."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from freescale.datasets.config import SourcesConfig
from freescale.datasets.sources import EVENT_SCHEMA, REJECT_SCHEMA, plan_read_tasks, read_task

GENERIC_COLUMNS = """
[sources.columns]
user = "uid"
item = "item"
timestamp = "ts"
action = "act"
[sources.action_map]
click = 1
view = 0
"""


def write_toml(folder: Path, body: str) -> SourcesConfig:
    path = folder / "sources.toml"
    path.write_text('[dataset]\nname = "t"\n' + body)
    return SourcesConfig.from_toml(str(path))


def one_source(folder: Path, fmt: str, path: str, extra: str = "", columns: str = GENERIC_COLUMNS):
    body = f'[[sources]]\nname = "s"\nformat = "{fmt}"\npath = "{path}"\n{extra}\n{columns}'
    return write_toml(folder, body)


def read_all(config: SourcesConfig, **kwargs) -> tuple[pa.Table, pa.Table, int]:
    events, rejects, rows_read = [], [], 0
    for task in plan_read_tasks(config, **{k: v for k, v in kwargs.items() if k in ("target_rows", "count_lines")}):
        for chunk in read_task(config, task, **{k: v for k, v in kwargs.items() if k.startswith("chunk")}):
            assert chunk.rows_read == chunk.events.num_rows + chunk.rejects.num_rows
            assert chunk.events.schema == EVENT_SCHEMA
            assert chunk.rejects.schema == REJECT_SCHEMA
            events.append(chunk.events)
            rejects.append(chunk.rejects)
            rows_read += chunk.rows_read
    ev = pa.concat_tables(events) if events else EVENT_SCHEMA.empty_table()
    rj = pa.concat_tables(rejects) if rejects else REJECT_SCHEMA.empty_table()
    return ev, rj, rows_read


def reject_list(rejects: pa.Table) -> list[tuple[int, str, str]]:
    columns = (rejects[c].to_pylist() for c in ("row", "reason", "field"))
    return sorted(zip(*columns))


BAD_CSV = """uid,item,ts,act
1,10,1700000000,click
2,20,1700000001,view
u3,30,1700000002,click

,40,1700000003,click
5,-1,1700000004,click
6,12.5,1700000005,click
7,70,notatime,click
8,80,1700000007,buy
9,90
10,100,99999999999,click
11,110,1700000009,7
-12,120,1700000010,click
"""


BAD_JSONL = [
    '{"uid": 1, "item": 10, "ts": 1700000000, "act": "click"}',
    '{"uid": "u2", "item": 20, "ts": 1700000001, "act": "view"}',
    '{"uid": 3, "item": 30, "ts": 17000',
    "not json at all",
    '{"uid": null, "item": 40, "ts": 1700000003, "act": "click"}',
    '{"item": 41, "ts": 1700000003, "act": "click"}',
    '{"uid": 5, "item": -5, "ts": 1700000004, "act": "click"}',
    '{"uid": 6, "item": 6.5, "ts": 1700000005, "act": "click"}',
    '{"uid": 7, "item": true, "ts": 1700000005, "act": "click"}',
    '{"uid": 8, "item": 80, "ts": "yesterday", "act": "click"}',
    '{"uid": 9, "item": 90, "ts": 1700000009, "act": "refund"}',
    "[1, 2, 3]",
    '{"uid": 10, "item": 100, "ts": 1700000010, "act": "click"}{"uid": 1}',
    "",
    '{"uid": 11, "item": 110, "ts": 1700000011, "act": "view"}',
]
