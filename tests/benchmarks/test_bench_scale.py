"""bench_scale's quick run (W 8 and 64, the issue's model): the report's fields, its targets, the
break-even search and the plot. Figures are projections of the simulator's model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_scale.py"


def test_bench_scale_quick_reports_every_point_and_the_break_even(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = subprocess.run([sys.executable, str(BENCH), "--quick", "--out", str(out)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["projection"] is True and report["complete"] is True
    assert set(report["target_met"]) == {
        "pec_not_slower_than_none_at_256", "pec_collectives_at_most_torchrec_plus_1", "runtime_under_2_min",
        "hierarchical_no_slower_than_flat_at_256",
    }  # fmt: skip
    assert [r["world_size"] for r in report["hierarchical_all_to_all"]] == [8, 64]
    for row in report["hierarchical_all_to_all"]:  # one node of 8 at W = 8: the flat exchange exactly
        for overlap in ("none", "pec"):
            figures = row[overlap]
            assert figures["hierarchical_over_flat"] == figures["hierarchical_step_ms"] / figures["flat_step_ms"]
            assert row["world_size"] > 8 or figures["hierarchical_over_flat"] == 1.0
    assert report["target_met"]["pec_collectives_at_most_torchrec_plus_1"] is True
    assert report["target_met"]["pec_not_slower_than_none_at_256"] is False  # --quick stops at W = 64
    assert len(report["sweep"]) == 2 * 3  # W 8, 64 x three rates, one model
    for row in report["sweep"]:
        assert set(row["arms"]) == {"plan/none", "plan/pec", "torchrec"}
        assert row["pec_over_none_step"] == row["arms"]["plan/pec"]["step_ms"] / row["arms"]["plan/none"]["step_ms"]
    split = report["fixed_cost_split"]
    assert split["ops_per_layer"] > 0 and split["ops_outside_layers"] > 0
    for row in report["break_even"]:
        assert row["break_even_step_ms"] is not None and row["deciding_term"] in ("latency per collective", "bytes")
        # at the break-even PEC's step is no slower; with less compute it was slower (or none was needed)
        assert row["compute_added_ms"] >= 0.0
    w64 = [row for row in report["break_even"] if row["world_size"] == 64]
    assert all(row["compute_added_ms"] > 0 for row in w64)  # at 64 ranks PEC needs compute to hide behind
    assert out.with_suffix(".png").stat().st_size > 0


def test_the_break_even_is_where_pec_stops_being_slower() -> None:
    sys.path.insert(0, str(BENCH.parent))
    import bench_scale as bench

    from freescale.trainer.simulate.sim_inputs import parse_distribution

    work = bench.arm_works(bench.ISSUE_MODEL, 64, parse_distribution(bench.LENGTHS), fixed_costs=False)["plan"]
    cfg = bench.base_config(bench.ISSUE_MODEL, 64, 0.1)
    found = bench.break_even(work, cfg)
    added = found["compute_added_ms"] / 1e3
    assert bench.step_gap(work, cfg, added)[0] <= 0 < bench.step_gap(work, cfg, 0.98 * added)[0]
    assert found["deciding_term"] == max(("latency per collective", "bytes"), key=found["terms_ms"].get)
