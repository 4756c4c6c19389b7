"""``prepare`` on bad input: malformed rows rejected, counted by reason and sampled to
``quarantine.jsonl``; a corrupt Parquet data page is one line naming the file and the source (also
from a Ray task). Real processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from prepare_cli import assert_one_line_error, cli_prepare, finish

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate


# --------------------------------------------------------------------------- quarantine option
def test_quarantine_examples_is_a_cli_option(tmp_path) -> None:
    generate(preset("tiny", seed=5, malformed_fraction=0.05), str(tmp_path / "src"))
    out = tmp_path / "ds"
    proc = cli_prepare(str(tmp_path / "src" / "sources.toml"), str(out), "--quarantine-examples", "1")
    code, err = finish(proc)
    assert code == 0, err
    reasons = [json.loads(line)["reason"] for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert reasons and len(reasons) == len(set(reasons))  # one example per reason
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["quarantine_examples"] == 1
    assert max(manifest["rows"]["events_rejected"]["by_reason"].values()) > 1  # more were rejected
    code, err = finish(cli_prepare(str(tmp_path / "src" / "sources.toml"), str(out), "--quarantine-examples", "-1"))
    assert_one_line_error(code, err, "--quarantine-examples")


# --------------------------------------------------------------------------- corrupt input
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_corrupt_parquet_page_is_one_line_naming_the_file(tmp_path, engine) -> None:
    """Also from a Ray task: the step's own error, not Ray's wrapper with a remote traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 20_000
    table = pa.table({"u": np.arange(n) % 300, "i": np.arange(n) * 7 % 1000, "t": 1_600_000_000 + np.arange(n)})
    path = tmp_path / "log.parquet"
    pq.write_table(table, path, row_group_size=5000)
    column = pq.ParquetFile(path).metadata.row_group(2).column(1)
    data = bytearray(path.read_bytes())
    for k in range(column.data_page_offset, column.data_page_offset + 8):  # a data page, not the footer
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))
    assert pq.ParquetFile(path).metadata.num_rows == n  # the footer still reads
    (tmp_path / "sources.toml").write_text(
        '[dataset]\nname = "x"\n[[sources]]\nname = "log"\nformat = "parquet"\npath = "log.parquet"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\n'
    )
    # Ray: a limit that holds the runtime started for the job, so no sizing warning stands beside the error
    roomy = ("--memory-limit", "8GB") if engine == "ray" else ()
    code, err = finish(cli_prepare(str(tmp_path / "sources.toml"), str(tmp_path / "out"), "--executor", engine, *roomy))
    assert_one_line_error(code, err, str(path), "source 'log'")


@pytest.mark.parametrize(
    ("content", "options", "needle"),
    [
        ("", (), "no samples: the sources hold no valid event (empty or header-only files"),
        ("u,i,t\n", (), "no samples: the sources hold no valid event (empty or header-only files"),
        ("u,i,t\n1,2,x\n", (), "no samples: the sources hold no valid event"),  # every row rejected
        ("u,i,t\n1,2,100\n3,4,100\n", (), "each of the 2 users has fewer than --min-len 2 events"),
        ("u,i,t\n1,2,100\n1,3,100\n", ("--kcore", "2"), "--kcore 2 removed every item of the 2 events"),
    ],
)
def test_no_samples_says_whether_there_was_no_event_or_the_filters_took_them(
    tmp_path, content, options, needle
) -> None:
    """An empty or header-only source was reported as "no samples left after filtering; check
    --min-len / --kcore", blaming filters that had nothing to filter; and k-core removing every item
    as a source without valid events. The job leaves no work directory: there is nothing to resume."""
    (tmp_path / "log.csv").write_text(content)
    (tmp_path / "sources.toml").write_text(
        '[[sources]]\nname = "log"\nformat = "csv"\nheader = true\npath = "log.csv"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\n'
    )
    out = str(tmp_path / "out")
    code, err = finish(cli_prepare(str(tmp_path / "sources.toml"), out, "--max-reject-fraction", "1", *options))
    assert_one_line_error(code, err, needle)
    assert not list(tmp_path.glob(".out*"))  # neither a work directory nor a lock file


# --------------------------------------------------------------------------- users table
BAD_USERS = "user_id,age\n1,25-34\n2,35-44\n2,35-44\n-3,7\n"  # age ranges where integers belong, a negative id


def users_sources(tmp_path, users: str) -> str:
    """8 users of 6 events each, and a users table holding ``users`` (an ``age`` feature)."""
    events = "".join(f"{u},{i},{1_600_000_000 + 60 * i},1\n" for u in range(1, 9) for i in range(6))
    (tmp_path / "log.csv").write_text("u,i,t,a\n" + events)
    (tmp_path / "users.csv").write_text(users)
    (tmp_path / "sources.toml").write_text(
        '[[sources]]\nname = "log"\nformat = "csv"\npath = "log.csv"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\naction = "a"\n'
        '[users]\npath = "users.csv"\n[users.columns]\nuser = "user_id"\nfeatures = ["age"]\n'
    )
    return str(tmp_path / "sources.toml")


def test_a_users_table_past_the_reject_limit_fails_in_one_line(tmp_path) -> None:
    """--max-reject-fraction covered the event rows only: a users table whose rows were all rejected
    passed, every sample silently without a profile. Its own rows now count against the limit."""
    sources = users_sources(tmp_path, BAD_USERS)
    code, err = finish(cli_prepare(sources, str(tmp_path / "out")))
    assert_one_line_error(
        code,
        err,
        f"users table {tmp_path / 'users.csv'}: 4 of 4 rows rejected (100.00%) exceeds --max-reject-fraction 5.00%",
        "(bad_type=3, negative_id=1); examples in ",
    )
    quarantine = Path(err.strip().rsplit("examples in ", 1)[1])
    reasons = [json.loads(line)["reason"] for line in quarantine.read_text().splitlines()]
    assert reasons == ["bad_type", "bad_type", "bad_type", "negative_id"]
    assert not (tmp_path / "out").exists()
    # within the limit: one duplicate row of 25 (4%) passes, counted
    users = "user_id,age\n" + "".join(f"{u},{u % 7}\n" for u in range(1, 25)) + "3,5\n"
    code, err = finish(cli_prepare(users_sources(tmp_path, users), str(tmp_path / "ok")))
    assert code == 0, err
    rows = json.loads((tmp_path / "ok" / "manifest.json").read_text())["rows"]
    assert rows["users_table_rows_read"] == 25 and rows["users_table_rejected"] == {"duplicate_user": 1}


def test_stats_holds_the_users_table_to_the_reject_limit(tmp_path, capsys) -> None:
    from freescale.tools.cli import main

    sources = users_sources(tmp_path, BAD_USERS)
    assert main(["stats", sources, "--workers", "1", "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "users table " in err and "4 of 4 rows rejected" in err, err
    Path(err.rsplit("examples in ", 1)[1]).unlink()  # a copy outside stats' work folder


def test_the_summary_shows_the_users_tables_rejects(tmp_path, capsys) -> None:
    """A users table whose rows are all rejected left every sample without a profile while the printed
    accounting showed only events: its rows read, rejects by reason and the samples without a profile
    are printed too (``prepare`` and ``inspect`` print the same summary)."""
    from freescale.tools.cli import main

    sources = users_sources(tmp_path, BAD_USERS)
    code, err = finish(cli_prepare(sources, str(tmp_path / "out"), "--max-reject-fraction", "1"))
    assert code == 0, err
    assert main(["inspect", str(tmp_path / "out")]) == 0
    lines = [" ".join(line.strip("│ ").split()) for line in capsys.readouterr().out.splitlines()]
    for row in ("users-table rows read │ 4", "users-table rows rejected │ 4", "bad_type │ 3", "negative_id │ 1"):
        assert row in lines, lines
    assert "samples without a profile │ 8" in lines, lines
