"""Smoke runs of bench_bubbles (every variant, the noise-floor rank entry included), bench_loader and
bench_dispatch (CPU, Triton interpreted).

Figures from a 6-step run on tiny data mean nothing; the test checks the benchmark's plumbing (the
floor run starts its own torchrun with its own ``sys.path``, which once broke unnoticed) and that the
report carries the fields the README and closing notes quote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_bubbles.py"


def test_bench_bubbles_quick_runs_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "bubbles.json"
    command = [sys.executable, str(BENCH), "--quick", "--engines", "freescale", "--steps", "6", "--out", str(out)]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["run"] for r in report["runs"]] == ["freescale/random", "freescale/planned", "freescale/identical"]
    for run in report["runs"]:
        assert run["steps"] > 0 and 0.0 <= run["straggler_pct"] < 100.0
    comparisons = report["comparisons"]
    assert {"freescale_straggler_reduction_pct", "noise_floor_straggler_pct", "target_met"} <= comparisons.keys()
    assert out.with_suffix(".png").stat().st_size > 0


def test_bench_loader_quick_reads_every_row_local_and_s3(tmp_path: Path) -> None:
    """bench_loader's plumbing: the moto server process, both readers on both locations, the report."""
    bench = BENCH.parent / "bench_loader.py"
    out = tmp_path / "loader.json"
    result = subprocess.run(
        [sys.executable, str(bench), "--quick", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {(r["location"], r["arm"]): r for r in report["rows"]}
    assert set(rows) == {(loc, arm) for loc in ("local", "s3") for arm in ("bare streaming", "freescale loader")}
    assert len({r["rows"] for r in rows.values()}) == 1  # every reader read every row once
    assert {"ours_over_bare_local", "ours_over_bare_s3", "target_met"} <= report["comparisons"].keys()


def test_bench_dispatch_quick_on_cpu_with_the_triton_interpreter(tmp_path: Path) -> None:
    """bench_dispatch's CPU smoke mode (``--device cpu --small --quick``, Triton interpreted): every
    kernel checked against the reference and timed at W = 8, 64, 512, the JSON's environment and
    per-target ``target_met``. CPU times say nothing about the GPU targets; only the plumbing is tested."""
    bench = BENCH.parent / "bench_dispatch.py"
    out = tmp_path / "dispatch.json"
    command = [sys.executable, str(bench), "--device", "cpu", "--small", "--quick", "--out", str(out)]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"device_name", "torch", "triton"} <= report["environment"].keys()
    assert report["settings"]["quick"] and report["settings"]["small"]
    assert [r["world_size"] for r in report["results"]] == [8, 64, 512]
    for row in report["results"]:
        assert row["errors"] == {}
        assert set(row["dispatch_ms"]) == set(row["combine_ms"]) == {"naive", "pytorch", "triton"}
    targets = report["targets"]
    assert set(targets) == {"dispatch_vs_naive", "combine_vs_naive", "dispatch_vs_pytorch", "combine_vs_pytorch"}
    assert all(isinstance(t["target_met"], bool) and t["ratio"] > 0 for t in targets.values())
    assert isinstance(report["target_met"], bool)
    assert "naive/triton" in result.stdout  # the side-by-side table
