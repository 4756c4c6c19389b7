"""bench_zch's own functions, so the benchmark cannot rot without a full run: the modulo arm's
collision accounting, the arms' table sizes, the targets from per-window rows, and the kernel point
(ours against TorchRec's read-only module) on a tiny table."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_zch")


def test_modulo_collisions_count_lookups_whose_row_another_item_of_the_window_uses(bench) -> None:
    # rows 10: ids 3 and 13 share row 3 (3 + 1 lookups), 5 is alone (2 lookups), 7 alone (1)
    items = np.array([3, 3, 3, 13, 5, 5, 7], dtype=np.int64)
    earlier = np.zeros(10, dtype=bool)
    earlier[7] = True
    stats = bench.modulo_collisions(items, 10, earlier)
    assert stats["lookups"] == 7 and stats["distinct_items"] == 4
    assert stats["collision_rate"] == pytest.approx(4 / 7)
    assert stats["items_sharing_a_row"] == pytest.approx(2 / 4)
    assert stats["occupancy"] == pytest.approx(3 / 10)
    assert stats["stale_row_rate"] == pytest.approx(1 / 7)


def test_table_sizes_are_whole_buckets_of_the_peak_and_of_the_stream(bench) -> None:
    s = bench.Settings()
    sizes = bench.table_sizes([35_000, 49_815, 40_000], 216_890, s)
    assert sizes["peak_live_items"] == 49_815
    assert sizes["rows"] % s.bucket_size == 0 and 1.25 * 49_815 <= sizes["rows"] < 1.25 * 49_815 + s.bucket_size
    assert sizes["oracle_rows"] % s.bucket_size == 0 and sizes["oracle_rows"] >= 1.5 * 216_890


def _row(ndcg: float, step_ms: float, collision: float = 0.0) -> dict:
    return {"ndcg@10": ndcg, "hr@10": 2 * ndcg, "step_ms": step_ms, "collision_rate": collision}


def test_targets_read_every_window_and_refuse_an_oracle_that_measured_nothing(bench) -> None:
    windows = [
        {"window": 0, "oracle": _row(0.10, 100), "hashed": _row(0.08, 100, 0.4), "zch": _row(0.099, 105, 0.001)},
        {"window": 1, "oracle": _row(0.12, 100), "hashed": _row(0.09, 100, 0.5), "zch": _row(0.118, 108, 0.004)},
    ]
    goals = bench.targets(windows, None)
    assert all(goal["target_met"] for goal in goals.values()), goals
    windows[1]["zch"]["collision_rate"] = 0.006  # one window over 0.5%
    windows[0]["zch"]["step_ms"] = windows[1]["zch"]["step_ms"] = 120  # 1.2x the exact-id path
    goals = bench.targets(windows, None)
    assert not goals["zch collision rate <= 0.5% of lookups in every window"]["target_met"]
    assert not next(g for name, g in goals.items() if name.startswith("zch step time"))["target_met"]
    nothing = [{"window": 0, **{arm: _row(0.0, 100) for arm in bench.ARMS}}]
    assert not any(goal["target_met"] for name, goal in bench.targets(nothing, None).items() if "NDCG" in name)


def test_an_arms_first_window_starts_from_an_empty_folder_and_later_ones_keep_it(bench, tmp_path: Path) -> None:
    """A reused ``--work`` (or a retried first window) holds the last run's checkpoint folder, which
    ``train`` refuses to take over: window 0 starts the arm afresh, later windows continue its run."""
    stale = tmp_path / "zch" / "ckpt" / "step_00000300"
    stale.mkdir(parents=True)
    assert bench.arm_folder(tmp_path, "zch", 1) == tmp_path / "zch" and stale.is_dir()
    assert bench.arm_folder(tmp_path, "zch", 0) == tmp_path / "zch"
    assert list((tmp_path / "zch").iterdir()) == []
    assert bench.arm_folder(tmp_path, "oracle", 0).is_dir()


def test_a_day_without_a_dataset_stops_the_stream_instead_of_pairing_days_two_apart(bench, tmp_path, monkeypatch):
    """Each arm trains on ``datasets[t]`` and scores ``datasets[t + 1]``: a day that ``prepare
    --time-window`` left without a dataset (no events, or every user under --min-len) must not shift
    the pairs."""
    import freescale.datasets.synthetic as synthetic
    import freescale.pipeline.time_windows as time_windows

    def fake_generate(config, out: str) -> None:
        Path(out).mkdir(parents=True)
        (Path(out) / "sources.toml").write_text("[sources.columns]\n")

    entries = (
        time_windows.WindowEntry("window=0000", 0, 1, 5, path="window=0000", samples=2),
        time_windows.WindowEntry(
            "window=0001", 1, 2, 3, skipped="no samples left after filtering", filtered={"min_len": 3}
        ),
        time_windows.WindowEntry("window=0002", 2, 3, 5, path="window=0002", samples=2),
    )
    index = time_windows.WindowsIndex(86_400, None, entries, 13, 0, 13, 13, 0)
    monkeypatch.setattr(synthetic, "generate", fake_generate)
    monkeypatch.setattr(time_windows, "prepare_windows", lambda config, window_s: index)
    with pytest.raises(SystemExit, match=r"no dataset for window=0001 \(no samples left after filtering\)"):
        bench.make_stream(bench.QUICK, tmp_path)


def test_kernel_point_times_ours_and_torchrec_read_only_on_cpu(bench) -> None:
    s = bench.Settings(kernel_slots=256, kernel_batches=(64,), kernel_repeats=1)
    kernel = bench.kernel_point(s)
    (row,) = kernel["rows"]
    assert kernel["occupancy_full"] == 1.0 and row["ids"] == 64
    assert all(row[key] > 0 for key in ("ours_empty_s", "ours_full_miss_s", "ours_hits_s", "ours_insert_s"))
    if kernel["torchrec_error"] is None:  # torchrec installed: its read-only remap ran, training mode did not
        assert row["torchrec_empty_s"] > 0 and row["torchrec_full_miss_s"] > 0
        assert kernel["torchrec_train_mode_cpu"] != "ran"


def test_kernel_only_rerun_keeps_the_measured_windows(bench, tmp_path: Path) -> None:
    import json

    out = tmp_path / "bench_zch.json"
    windows = [{"window": 0}]
    out.write_text(json.dumps({"benchmark": "bench_zch", "windows": windows, "kernel": None}))
    s = bench.Settings(kernel_slots=256, kernel_batches=(64,), kernel_repeats=1)
    assert bench.rerun_kernel(out, s) == 0
    result = json.loads(out.read_text())
    assert result["windows"] == windows and result["kernel"]["rows"][0]["ids"] == 64
    assert "kernel_rerun" in result and set(result["targets"]) and out.with_suffix(".png").stat().st_size > 0


@pytest.fixture
def seg(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("zch_segments")


def test_segments_split_users_by_whether_an_earlier_window_held_their_target(seg) -> None:
    from freescale.trainer.eval.evaluate import EvalRanks

    targets = seg.EvalTargets(users=np.array([1, 2, 3, 4]), items=np.array([50, 60, 70, 80]),
                              known=np.array([True, False, True, False]))  # fmt: skip
    per_user = EvalRanks(user_ids=np.array([4, 3, 2, 1]), ranks=np.array([0, 20, 3, 1]))
    got = seg.segments(per_user, targets)
    assert got["all"]["users"] == 4 and got["all"]["hits"] == 3 and got["all"]["hr@10"] == 0.75
    assert got["known"]["users"] == 2 and got["known"]["hits"] == 1  # users 3 (rank 20) and 1 (rank 1)
    assert got["new"]["hits"] == 2 and got["new"]["ndcg@10"] == pytest.approx((1 + 1 / np.log2(5)) / 2)
    assert got["all"]["hr@10_ci95"] == pytest.approx(1.96 * np.sqrt(0.75 * 0.25 / 4))
    with pytest.raises(ValueError, match="evaluated user 9 has no test target"):
        seg.segments(EvalRanks(np.array([9]), np.array([0])), targets)


def test_two_arms_separate_only_beyond_twice_their_combined_standard_error(seg) -> None:
    a = {"ndcg@10": 0.044, "ndcg@10_se": 0.008}
    b = {"ndcg@10": 0.021, "ndcg@10_se": 0.006}
    assert seg.separable(a, b) is True  # 0.023 > 2 * 0.010
    assert seg.separable(a, {"ndcg@10": 0.030, "ndcg@10_se": 0.006}) is False
    assert seg.separable(a, {"ndcg@10": 0.0, "ndcg@10_se": None}) is None


def test_smoke_and_issue_scale_runs_leave_the_default_results_file_alone(bench, capsys) -> None:
    assert bench.default_results(quick=False, issue_scale=False) == bench.RESULTS
    assert bench.default_results(quick=True, issue_scale=False) is None
    assert bench.default_results(quick=False, issue_scale=True) == bench.ISSUE_SCALE_RESULTS != bench.RESULTS
    with pytest.raises(SystemExit):  # a smoke kernel point would have replaced the measured one
        bench.main(["--quick", "--kernel-only"])
    assert "--kernel-only --quick needs --out" in capsys.readouterr().err


@pytest.fixture
def lookup(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_zch_lookup")


def test_lookup_bench_on_cpu_times_both_paths_on_the_same_calls(lookup, tmp_path: Path) -> None:
    """``bench_zch_lookup --device cpu``: the host shortcuts against the masked path, every point written,
    no target off CUDA."""
    out = tmp_path / "lookup.json"
    assert lookup.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and result["target_met"] is None and result["targets"] == {}
    assert [r["slots"] for r in result["results"]] == [12_288, 65_536]
    for row in result["results"]:
        assert row["masked_ms"] > 0 and row["host_shortcuts_ms"] > 0 and row["evictions"] > 0
        assert row["speedup"] == pytest.approx(row["masked_ms"] / row["host_shortcuts_ms"])


def test_lookup_bench_judges_the_kernel_at_the_first_point(lookup) -> None:
    s = lookup.Settings(device="cuda")
    row = {"slots": 12_288, "ids": 650, "new_ids": 20}
    assert lookup.targets(s, [{**row, "speedup": 3.2}])["target_met"] is True
    assert lookup.targets(s, [{**row, "speedup": 2.9}])["target_met"] is False
    assert lookup.targets(s, [{**row, "slots": 65_536, "speedup": 9.0}])["target_met"] is False  # not measured
