"""``freescale stats`` end to end: raw sources (through prepare's phases) and prepared datasets.

Analytic checks on hand-made sources (fixed lengths → sparsity 0, two known lengths → the exact
Eq. 1 value, disjoint / identical item sets → batch_overlap_rate 0 / 1, known ids → exact modulo
collisions), a generator with a given Zipf exponent, agreement with prepare's own balance report,
brute-force overlap on the random batching and on a prepared dataset's step groups, the stable JSON
schema, sampling, S3, and the CLI's errors.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mounts import bind_mount

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.balance import BalanceConfig
from freescale.pipeline.config import PrepareConfig, SampleConfig
from freescale.pipeline.prepare import prepare
from freescale.pipeline.stats import SCHEMA_VERSION, TOP_LEVEL_KEYS, StatsConfig, compute_stats, run_stats
from freescale.pipeline.stats.inputs import canonical
from freescale.pipeline.stats.plots import PLOTS, write_plots
from freescale.tools.cli import main as cli_main

FAST = {"workers": 1, "progress": False, "output": None}
SOURCES_TOML = """[dataset]
name = "hand"

[[sources]]
name = "events"
format = "parquet"
path = "events.parquet"
timestamp_unit = "s"
[sources.columns]
user = "uid"
item = "item"
timestamp = "ts"
"""


def hand_sources(folder: Path, histories: list[list[int]]) -> str:
    """One Parquet log: user u (id 1000 + u) saw ``histories[u]`` in that order."""
    folder.mkdir(parents=True, exist_ok=True)
    uid = np.repeat(1000 + np.arange(len(histories)), [len(h) for h in histories])
    item = np.concatenate([np.asarray(h, np.int64) for h in histories])
    ts = 1_600_000_000 + np.arange(item.size)
    pq.write_table(pa.table({"uid": uid, "item": item, "ts": ts}), folder / "events.parquet")
    (folder / "sources.toml").write_text(SOURCES_TOML)
    return str(folder / "sources.toml")


def rates(report: dict, table: str = "item") -> list:
    return report["batch_overlap"]["curve"]["tables"][table]["batch_overlap_rate"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tiny")
    generate(preset("tiny", seed=3), str(out))
    return str(out / "sources.toml")


@pytest.fixture(scope="module")
def prepared(tiny, tmp_path_factory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("prepared") / "ds")
    manifest = prepare(
        PrepareConfig(
            sources=tiny,
            output=out,
            samples=SampleConfig(max_uih_len=2048),
            balance=BalanceConfig(group_size=4, micro_batch_size=4, seed=1),
            workers=1,
            progress=False,
            memory_limit=512 * 2**20,
        )
    )
    return out, manifest


def test_fixed_lengths_and_disjoint_items(tmp_path) -> None:
    """Every user has 10 events of their own items: sparsity 0, nothing wasted, overlap 0."""
    toml = hand_sources(tmp_path, [list(range(10 * u, 10 * u + 10)) for u in range(64)])
    report = compute_stats(
        StatsConfig(input=toml, world_sizes=(2,), micro_batch_size=4, global_batch_sizes=(4, 8, 16), **FAST)
    )
    assert report["lengths"]["merged"]["p50"] == report["lengths"]["merged"]["max"] == 10
    assert report["sparsity"]["random"]["sparsity"] == 0.0
    assert report["sparsity"]["random"]["wasted_compute_pct"] == pytest.approx(0.0, abs=1e-9)
    assert rates(report) == [0.0, 0.0, 0.0] and rates(report, "user") == [0.0, 0.0, 0.0]
    assert report["straggler"]["by_world_size"]["2"]["random"]["straggler_pct"] == 0.0
    assert report["ids"]["tables"]["item"]["unique_ids"] == 640
    assert report["popularity"]["top_share"]["top_10pct"] == pytest.approx(0.1)


def test_identical_items_overlap_one_and_two_lengths_exact_eq1(tmp_path) -> None:
    """20 users of length 5 and 20 of length 20, all over the same 5 items; one batch of 40."""
    histories = [[1, 2, 3, 4, 5]] * 20 + [[1, 2, 3, 4, 5] * 4] * 20
    toml = hand_sources(tmp_path, histories)
    report = compute_stats(
        StatsConfig(
            input=toml, world_sizes=(2,), micro_batch_size=4, batch_size=40, global_batch_sizes=(2, 4, 8), **FAST
        )
    )
    sparsity = report["sparsity"]["random"]
    assert sparsity["batches"] == 1
    assert sparsity["sparsity"] == pytest.approx(1 - (20 * 5 + 20 * 20) / (40 * 20))  # 0.375
    assert rates(report) == [1.0, 1.0, 1.0] and rates(report, "action") == [1.0, 1.0, 1.0]
    merged = report["lengths"]["merged"]
    assert (merged["count"], merged["mean"], merged["share_above"]["256"]) == (40, 12.5, 0.0)
    assert report["ids"]["tables"]["item"]["unique_ids"] == 5
    assert report["ids"]["tables"]["item"]["occurrences"] == 500


def test_modulo_collisions_of_known_ids(tmp_path) -> None:
    toml = hand_sources(tmp_path, [[i, 1000 + i] for i in range(50)])
    report = compute_stats(
        StatsConfig(input=toml, table_sizes=(1000, 2000, 30), world_sizes=(1,), micro_batch_size=2, **FAST)
    )
    item = report["ids"]["tables"]["item"]
    assert (item["unique_ids"], item["min_id"], item["max_id"]) == (100, 0, 1049)
    assert item["colliding_ids"] == {"1000": 100, "2000": 0, "30": 100}
    assert item["hash_collision_rate"] == {"1000": 1.0, "2000": 0.0, "30": 1.0}
    user = report["ids"]["tables"]["user"]
    assert (user["unique_ids"], user["min_id"], user["max_id"]) == (50, 1000, 1049)
    # 50 consecutive user ids modulo 30: 20 rows hold two ids, 10 rows one
    assert user["colliding_ids"]["30"] == 40 and user["hash_collision_rate"]["2000"] == 0.0


def test_zipf_exponent_of_the_generator(tmp_path) -> None:
    for zipf in (0.9, 1.3):
        out = tmp_path / f"z{zipf}"
        generate(preset("tiny", n_users=400, median=150.0, sigma=0.5, n_items=20_000, zipf=zipf), str(out))
        report = compute_stats(
            StatsConfig(input=str(out / "sources.toml"), world_sizes=(4,), micro_batch_size=8, **FAST)
        )
        assert report["popularity"]["zipf_exponent"] == pytest.approx(zipf, abs=0.1)
        assert "least squares" in report["popularity"]["method"]


def test_agrees_with_prepare_and_brute_force(tiny, prepared) -> None:
    """Predictions at W = G equal prepare's own report; overlap equals sets built by hand, for the
    random batching of raw sources and for the step groups of the prepared dataset."""
    from freescale.pipeline.dataset.reader import PreparedDataset

    out, manifest = prepared
    sizes = (8, 12, 32)
    raw = compute_stats(
        StatsConfig(
            input=tiny,
            world_sizes=(4, 2),
            micro_batch_size=4,
            seed=1,
            global_batch_sizes=sizes,
            samples=SampleConfig(max_uih_len=2048),
            **FAST,
        )
    )
    predicted = manifest["balance"]["straggler_pct"]
    at_g = raw["straggler"]["by_world_size"]["4"]
    assert at_g["random"]["straggler_pct"] == predicted["random"]
    assert at_g["within_step"]["straggler_pct"] == predicted["within_step"]
    assert at_g["planned"]["straggler_pct"] == predicted["plan"]

    ours = compute_stats(StatsConfig(input=out, seed=1, global_batch_sizes=sizes, **FAST))
    assert ours["input"]["kind"] == "prepared" and ours["options"]["micro_batch_size"] == 4
    assert ours["options"]["world_sizes"] == [4, 8, 64, 256]
    for w in ("4", "2"):
        expected = manifest["balance"]["straggler_pct_by_world_size"][w]
        if w in ours["straggler"]["by_world_size"]:
            assert ours["straggler"]["by_world_size"][w]["plan"]["straggler_pct"] == expected
    assert ours["straggler"]["by_world_size"]["8"]["plan"]["straggler_pct"] is None  # 8 does not divide G = 4
    assert ours["straggler"]["by_world_size"]["4"]["random"]["straggler_pct"] == predicted["random"]
    assert ours["lengths"]["merged"] == raw["lengths"]["merged"]

    dataset = PreparedDataset(out)
    rows = [dataset.rows[i] for i in range(int(dataset.offsets[-1]))]
    group = np.repeat(np.arange(len(dataset.offsets) - 1), np.diff(dataset.offsets)) // dataset.group_size

    def brute(batches: list[set]) -> float | None:
        if len(batches) < 2:
            return None
        return pytest.approx(float(np.mean([len(b & a) / len(b) for a, b in itertools.pairwise(batches)])))

    step_sets = [
        set(np.concatenate([r["item_ids"] for r, g in zip(rows, group) if g == s]).tolist())
        for s in range(int(group.max()) + 1)
    ]
    head = ours["batch_overlap"]["headline"]
    assert head["layout"] == "step_group" and head["global_batch_size"] == 16
    assert head["tables"]["item"]["batch_overlap_rate"] == brute(step_sets)

    users = np.array([int(r["user_id"]) for r in rows])
    windows = np.array([int(r["window"]) for r in rows])
    canon, order = canonical(users, windows, np.ones(len(rows), bool), seed=1)
    shuffled = [rows[i] for i in canon[order]]
    assert raw["batch_overlap"]["curve"]["global_batch_sizes"] == [8, 12, 16, 32]  # with W·k = 8, 16
    for size, rate in zip(raw["batch_overlap"]["curve"]["global_batch_sizes"], rates(raw)):
        batches = [
            set(np.concatenate([r["item_ids"] for r in shuffled[i : i + size]]).tolist())
            for i in range(0, len(shuffled) - size + 1, size)
        ]
        assert rate == brute(batches)
    for size, rate in zip(ours["batch_overlap"]["curve"]["global_batch_sizes"], rates(ours)):  # plan order
        batches = [
            set(np.concatenate([r["item_ids"] for r in rows[i : i + size]]).tolist())
            for i in range(0, len(rows) - size + 1, size)
        ]
        assert rate == brute(batches)


def _keys(tree: object, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict):
        return set()
    out = set()
    for key, value in tree.items():
        out.add(prefix + key)
        if key not in (
            "by_reason",
            "events_read_by_source",
            "by_world_size",
            "tables",
            "by_source",
            "details",
            "share_above",
            "hash_collision_rate",
            "colliding_ids",
            "rows_used",
            "expected_if_random",
            "top_share",
            "model",
            "samples",
            "config",
            "histogram",
        ):
            out |= _keys(value, prefix + key + ".")
    return out


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


def test_plots_drawn_by_the_job_processes_match_one_process_drawing_them(tiny, tmp_path) -> None:
    """With 2 workers the local job's driver and worker draw the plots between them (``write_plots``
    with the executor): the same names and bytes as one process drawing them from the same report."""
    out = tmp_path / "stats"
    config = StatsConfig(input=tiny, output=str(out), workers=2, progress=False, world_sizes=(2,), micro_batch_size=8)
    report = run_stats(config)
    assert write_plots(report, str(tmp_path / "alone")) == report["plots"]
    assert sorted(report["plots"].values()) == sorted(PLOTS.values())
    for name in report["plots"].values():
        assert (out / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()


def test_sample_fraction_is_deterministic_and_reports_errors(tiny) -> None:
    config = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "sample_fraction": 0.5, **FAST}
    first, second = compute_stats(StatsConfig(**config)), compute_stats(StatsConfig(**config))
    first.pop("runtime_s"), second.pop("runtime_s")
    assert first == second
    sample = first["sample"]
    assert sample["estimated"] and "splitmix64" in sample["method"] and "stderr" in sample["errors"]
    assert 0.3 * sample["samples_total"] < sample["samples_selected"] < 0.7 * sample["samples_total"]
    assert first["lengths"]["merged"]["count"] == sample["samples_selected"]
    assert first["lengths"]["merged"]["stderr"]["p90"] > 0
    full = compute_stats(StatsConfig(**{**config, "sample_fraction": 1.0}))
    assert not full["sample"]["estimated"] and full["lengths"]["merged"]["stderr"] is None
    assert (
        abs(first["lengths"]["merged"]["mean"] - full["lengths"]["merged"]["mean"])
        < 5 * (first["lengths"]["merged"]["stderr"]["mean"])
    )


def test_sampled_lengths_are_the_sampled_users_exact_lengths(tiny, prepared) -> None:
    """Without k-core the sample is taken while reading (only sampled users' rows are converted and
    built): the figures are the exact figures of those users' samples (checked against the prepared
    dataset's rows), totals still cover every user, and the rows left out are accounted for."""
    from freescale.datasets.ids import selected
    from freescale.pipeline.dataset.reader import PreparedDataset

    out, manifest = prepared
    base = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "samples": SampleConfig(max_uih_len=2048)}
    report = compute_stats(StatsConfig(**base, sample_fraction=0.4, **FAST))
    dataset = PreparedDataset(out)
    rows = [dataset.rows[i] for i in range(int(dataset.offsets[-1]))]
    users = np.array([int(r["user_id"]) for r in rows])
    lengths = np.array([int(r["length"]) for r in rows])[selected(users, 0.4)]
    merged = report["lengths"]["merged"]
    assert (merged["count"], merged["events"], merged["max"]) == (lengths.size, lengths.sum(), lengths.max())
    edges = report["lengths"]["histogram"]["edges"]
    assert report["lengths"]["histogram"]["merged"] == np.histogram(lengths, edges)[0].tolist()
    assert report["sample"]["samples_total"] == manifest["rows"]["samples"] == len(rows)
    assert report["sample"]["users_total"] == np.unique(users).size
    accounting = report["rows"]
    assert accounting["balanced"] and accounting["events_read"] == manifest["rows"]["events_read"]
    assert accounting["events_filtered"]["by_reason"]["sample_fraction"] > 0
    assert accounting["events_used"] == lengths.sum()


def test_sampled_with_kcore_builds_every_user_then_keeps_the_sample(tiny) -> None:
    """k-core counts items over every user, so with --kcore the scan keeps everyone and the sample is
    taken when the id records are spilled: the accounting is the exact run's."""
    base = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "samples": SampleConfig(kcore=2), **FAST}
    full = compute_stats(StatsConfig(**base))
    part = compute_stats(StatsConfig(**base, sample_fraction=0.4))
    assert part["rows"] == full["rows"] and "sample_fraction" not in part["rows"]["events_filtered"]["by_reason"]
    assert part["sample"]["samples_total"] == full["sample"]["samples_total"]
    assert 0 < part["sample"]["samples_selected"] < full["sample"]["samples_selected"]
    assert part["lengths"]["merged"]["max"] <= full["lengths"]["merged"]["max"]


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_counting_per_user_gives_the_built_samples_figures(tiny, monkeypatch, fraction) -> None:
    """Without windows, k-core or truncation a sample is all of its user's events: the partition step
    counts per user (``count_partition``, no time sort) and every figure and the row accounting equal
    those of building the samples with prepare's sequence builder (``run_partition``)."""
    from freescale.pipeline.stats import sources

    samples = SampleConfig(min_len=8)  # drops some users: the min_len accounting is exercised
    config = StatsConfig(
        input=tiny, world_sizes=(2,), micro_batch_size=4, samples=samples, sample_fraction=fraction, **FAST
    )
    calls = []
    monkeypatch.setattr(sources, "count_partition", _spy(sources.count_partition, calls))
    counted = compute_stats(config)
    assert calls and counted["rows"]["events_filtered"]["by_reason"]["min_len"] > 0
    monkeypatch.setattr(sources, "order_free", lambda cfg, counts: False)
    built = compute_stats(config)
    counted.pop("runtime_s"), built.pop("runtime_s")
    assert counted == built
    assert not sources.order_free(SampleConfig(max_uih_len=8), np.array([3, 9]))  # 9 > 8: truncated
    assert not sources.order_free(SampleConfig(window_stride=4), np.array([3]))


def _spy(fn, calls: list):
    def spy(*args, **kwargs):
        calls.append(args)
        return fn(*args, **kwargs)

    return spy


def test_a_second_run_in_the_work_dir_skips_the_scan_and_gives_fresh_figures(tiny, tmp_path, monkeypatch) -> None:
    """With --work-dir the scan's spill files stay: a second run with another seed and W rebuilds the
    partitions from them (no read task runs again) and reports what a fresh run reports."""
    from freescale.pipeline.steps import scan

    first = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "work_dir": str(tmp_path), **FAST}
    compute_stats(StatsConfig(**first))
    assert list(tmp_path.rglob("t*.p*.arrow"))  # the scan's spill files were kept

    def no_scan(*args, **kwargs):
        raise AssertionError("the scan ran again")

    second = {**first, "world_sizes": (4,), "seed": 5}
    monkeypatch.setattr(scan, "run_scan_task", no_scan)
    again = compute_stats(StatsConfig(**second))
    monkeypatch.undo()
    fresh = compute_stats(StatsConfig(**{**second, "work_dir": None}))
    again.pop("runtime_s"), fresh.pop("runtime_s")
    assert again == fresh


def test_worker_processes_give_the_same_figures(tiny) -> None:
    """Two workers run the build and the id pass in parallel (the id pass on the build's executor)."""
    config = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "progress": False, "output": None}
    serial = compute_stats(StatsConfig(workers=1, **config))
    parallel = compute_stats(StatsConfig(workers=2, **config))
    for key in ("lengths", "sparsity", "straggler", "batch_overlap", "popularity", "ids"):
        assert parallel[key] == serial[key], key


def test_s3_sources_and_output(tiny, s3_bucket) -> None:
    from freescale import storage

    folder = Path(tiny).parent
    for path in folder.rglob("*"):
        if path.is_file():
            storage.write_bytes(f"s3://{s3_bucket}/src/{path.relative_to(folder)}", path.read_bytes())
    config = {"world_sizes": (2,), "micro_batch_size": 4, "workers": 1, "progress": False}
    remote = run_stats(
        StatsConfig(input=f"s3://{s3_bucket}/src/sources.toml", output=f"s3://{s3_bucket}/stats", plots=False, **config)
    )
    local = compute_stats(StatsConfig(input=tiny, output=None, **config))
    assert remote["lengths"] == local["lengths"] and remote["batch_overlap"] == local["batch_overlap"]
    written = json.loads(storage.read_bytes(f"s3://{s3_bucket}/stats/stats.json"))
    assert written["input"]["uri"] == f"s3://{s3_bucket}/src/sources.toml"


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


@pytest.mark.parametrize("which", ["sources", "prepared"])
def test_cli_prestarted_workers_give_the_one_process_report(which, tiny, prepared, tmp_path) -> None:
    """``--workers 2`` starts the scan's workers before the driver's imports (a prepared dataset hands
    them back unused): the report is the one a single process writes."""
    uri = tiny if which == "sources" else prepared[0]
    reports = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        args = ["stats", uri, "--out", str(out), "--workers", workers, "--quiet", "--no-plots", "--world-sizes", "2"]
        assert cli_main(args) == 0
        report = json.loads((out / "stats.json").read_text())
        reports.append({key: report[key] for key in TOP_LEVEL_KEYS if key not in ("options", "runtime_s")})
    assert reports[0] == reports[1]
