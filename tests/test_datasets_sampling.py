"""Sampling users while reading (``read_task(user_fraction=...)``, what ``stats --sample-fraction`` uses)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_datasets_sources import BAD_CSV, BAD_JSONL, one_source, read_all, reject_list

from freescale.datasets.ids import selected
from freescale.datasets.sources import plan_read_tasks, read_task


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
