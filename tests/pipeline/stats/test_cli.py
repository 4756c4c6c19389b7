"""``freescale stats``'s command line: the stable JSON schema, the plots and the printed summary, the
straggler table, and its errors as one clear line (bad inputs and options, a file or read-only ``--out``).
"""

from __future__ import annotations

import json
from pathlib import Path

from mounts import bind_mount

from freescale.pipeline.stats import SCHEMA_VERSION, TOP_LEVEL_KEYS
from freescale.tools.cli import main as cli_main

SCHEMA_KEYS = {
    "input": {"kind", "uri", "dataset", "sources", "user_features"},
    "sample": {
        "fraction",
        "estimated",
        "method",
        "samples_total",
        "samples_selected",
        "users_total",
        "users_selected",
        "errors",
    },
    "lengths": {"definition", "merged", "by_source", "histogram"},
    "sparsity": {"batch_size", "definition", "cost_units", "random", "plan"},
    "straggler": {"micro_batch_size", "world_sizes", "cost_units", "strategies", "definition", "by_world_size"},
    "batch_overlap": {"definition", "order", "headline", "curve", "by_world_size"},
    "popularity": {
        "table",
        "unique_ids",
        "occurrences",
        "zipf_exponent",
        "stderr",
        "intercept",
        "method",
        "fit_ranks",
        "top_share",
        "rank_frequency",
    },
    "ids": {"hashing", "table_sizes", "definition", "tables"},
}


LENGTH_KEYS = {"count", "events", "mean", "min", "p50", "p90", "p99", "max", "share_above", "stderr"}


SPARSITY_KEYS = {
    "batches",
    "sparsity",
    "sparsity_mean",
    "stderr",
    "padded_cost",
    "jagged_cost",
    "wasted_compute_pct",
    "attention_wasted_pct",
}


STEP_KEYS = {"steps", "straggler_pct", "stderr", "imbalance", "max_over_lower_bound"}


OVERLAP_KEYS = {"batch_overlap_rate", "pooled", "stderr", "pairs", "mean_unique_ids"}


ID_KEYS = {
    "unique_ids",
    "occurrences",
    "min_id",
    "max_id",
    "hash_collision_rate",
    "colliding_ids",
    "rows_used",
    "expected_if_random",
}


def test_cli_writes_stable_json_plots_and_summary(tiny, tmp_path, capsys) -> None:
    out = tmp_path / "stats"
    assert (
        cli_main(
            [
                "stats",
                tiny,
                "--out",
                str(out),
                "--workers",
                "1",
                "--quiet",
                "--world-sizes",
                "2,4",
                "-k",
                "8",
                "--table-sizes",
                "1000,100000",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for title in ("UIH length", "sparsity", "straggler_pct", "batch_overlap_rate", "hash_collision_rate", "Zipf"):
        assert title in printed
    report = json.loads((out / "stats.json").read_text())
    assert tuple(report) == TOP_LEVEL_KEYS and report["schema_version"] == SCHEMA_VERSION == 1
    for section, keys in SCHEMA_KEYS.items():
        assert set(report[section]) == keys, section
    assert set(report["lengths"]["merged"]) == LENGTH_KEYS
    assert set(report["lengths"]["by_source"]) == {"clicks", "purchases", "reviews"}
    assert set(report["sparsity"]["random"]) == SPARSITY_KEYS
    step = report["straggler"]["by_world_size"]["2"]
    assert set(step) == {"random", "within_step", "planned"} and set(step["random"]) == STEP_KEYS
    assert set(report["batch_overlap"]["headline"]["tables"]["item"]) == OVERLAP_KEYS
    assert set(report["ids"]["tables"]) == {"item", "action", "user", "user.age_bucket", "user.country_id"}
    assert set(report["ids"]["tables"]["item"]) == ID_KEYS
    by_source = sum(s["events"] for s in report["lengths"]["by_source"].values())
    assert by_source == report["lengths"]["merged"]["events"] == report["rows"]["events_used"]
    assert sum(report["lengths"]["histogram"]["merged"]) == report["lengths"]["merged"]["count"]
    assert report["plots"] == {
        "length_histogram": "lengths.png",
        "overlap_rate_curve": "overlap.png",
        "popularity": "popularity.png",
        "straggler_bars": "straggler.png",
    }
    for name in report["plots"].values():
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_are_one_clear_line(tiny, prepared, tmp_path, capsys) -> None:
    def fails(args: list[str], *needles: str) -> None:
        assert cli_main(["stats", *args, "--workers", "1", "--quiet", "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        for needle in needles:
            assert needle in err, err

    fails([str(tmp_path / "nope")], "does not exist")
    (tmp_path / "empty").mkdir()
    fails([str(tmp_path / "empty")], "manifest.json is missing")
    broken = tmp_path / "broken"
    broken.mkdir()
    manifest = json.loads((Path(prepared[0]) / "manifest.json").read_text())
    (broken / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 99}))
    fails([str(broken)], "schema_version 99")
    fails([tiny, "--sample-fraction", "0"], "--sample-fraction")
    fails([tiny, "--world-sizes", "8,0"], "--world-sizes")
    fails([tiny, "--table-sizes", "big"], "--table-sizes")
    fails([tiny, "-k", "0"], "--micro-batch-size")
    fails([tiny, "--memory-limit", "lots"], "--memory-limit")
    (tmp_path / "file").write_text("x")
    assert cli_main(["stats", tiny, "--out", str(tmp_path / "file"), "--workers", "1", "--quiet"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_too_many_rejects_name_examples_that_still_exist(tmp_path, capsys) -> None:
    """Stats on raw sources failing --max-reject-fraction named quarantine.jsonl inside its private
    work folder, which it removed on the way out: the examples named must exist after it returns."""
    (tmp_path / "log.csv").write_text("u,i,t\n1,2,100\n1,3,x\n1,4,y\n")
    (tmp_path / "sources.toml").write_text(
        '[[sources]]\nname = "log"\nformat = "csv"\npath = "log.csv"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\n'
    )
    assert (
        cli_main(["stats", str(tmp_path / "sources.toml"), "--workers", "1", "--quiet", "--out", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2 of 3 rows rejected" in err, err
    examples = Path(err.rsplit("examples in ", 1)[1])
    try:
        assert [json.loads(line)["row"] for line in examples.read_text().splitlines()] == [1, 2]
    finally:
        examples.unlink()


def test_a_dirty_source_is_described_under_a_raised_reject_limit(tmp_path, capsys) -> None:
    """``--max-reject-fraction`` means what it means for ``prepare``: raised, stats describes the rest."""
    (tmp_path / "log.csv").write_text("u,i,t\n1,2,100\n1,3,101\n2,4,100\n2,5,102\n1,3,x\n2,4,y\n")
    (tmp_path / "sources.toml").write_text(
        '[[sources]]\nname = "log"\nformat = "csv"\npath = "log.csv"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\n'
    )
    out = tmp_path / "anyway"
    args = ["stats", str(tmp_path / "sources.toml"), "--workers", "1", "--quiet", "--out", str(out)]
    assert cli_main(args) == 2 and "2 of 6 rows rejected" in capsys.readouterr().err
    assert cli_main([*args, "--max-reject-fraction", "0.5"]) == 0, capsys.readouterr().err
    rows = json.loads((out / "stats.json").read_text())["rows"]
    assert rows["samples"] == 2 and rows["events_rejected"]["total"] == 2 and rows["balanced"]
    assert cli_main([*args, "--max-reject-fraction", "1.5"]) == 2
    assert "--max-reject-fraction must be in [0, 1], got 1.5" in capsys.readouterr().err


def test_sources_that_leave_no_sample_fail_in_prepares_one_line(tmp_path, capsys) -> None:
    """Every user below --min-len: stats (and simulate, the same count path) crashed in its partition
    step with an IndexError; now prepare's reason, in one line."""
    (tmp_path / "log.csv").write_text("u,i,t\n1,2,100\n2,3,100\n3,4,100\n")
    (tmp_path / "sources.toml").write_text(
        '[[sources]]\nname = "log"\nformat = "csv"\npath = "log.csv"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\n'
    )
    args = ["stats", str(tmp_path / "sources.toml"), "--workers", "1", "--quiet", "--out", str(tmp_path / "o")]
    assert cli_main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no samples left after filtering: each of the 3 users has fewer than --min-len 2 events" in line


def test_a_read_only_out_folder_is_one_line_naming_it(tiny, tmp_path, capsys) -> None:
    """Checked before the sources are read (it was a traceback once the report was computed)."""
    (tmp_path / "rw").mkdir()
    with bind_mount(tmp_path / "rw", tmp_path / "ro", read_only=True) as folder:
        for out in (folder, folder / "stats"):  # the folder itself, or one to create in it
            assert cli_main(["stats", tiny, "--out", str(out), "--workers", "1", "--quiet"]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert f"--out {out}" in err and "Read-only file system" in err, err


def test_straggler_table_names_world_sizes_the_data_cannot_fill_instead_of_rows_of_na():
    from rich.console import Console

    from freescale.pipeline.stats.report import straggler_table

    filled = {"straggler_pct": 12.5, "imbalance": {"mean": 1.3}}
    empty = {"straggler_pct": None}
    report = {
        "straggler": {
            "micro_batch_size": 4,
            "strategies": ["random", "planned"],
            "world_sizes": [8, 256],
            "by_world_size": {"8": {"random": filled, "planned": filled}, "256": {"random": empty, "planned": empty}},
        }
    }
    console = Console(width=200, record=True)
    console.print(straggler_table(report))
    text = console.export_text()
    assert "n/a" not in text and "12.50% (1.30)" in text
    assert "W = 256: the data holds less than one" in " ".join(text.split())  # the caption wraps
