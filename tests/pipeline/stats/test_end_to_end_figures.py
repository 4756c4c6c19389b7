"""``freescale stats`` figures end to end, from raw sources (through prepare's phases) and prepared datasets.

Analytic checks on hand-made sources (fixed lengths → sparsity 0, two known lengths → the exact
Eq. 1 value, disjoint / identical item sets → batch_overlap_rate 0 / 1, known ids → exact modulo
collisions), a generator with a given Zipf exponent, agreement with prepare's own balance report,
and brute-force overlap on the random batching and on a prepared dataset's step groups.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from stats_options import FAST

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.stats import StatsConfig, compute_stats
from freescale.pipeline.stats.inputs import canonical

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
