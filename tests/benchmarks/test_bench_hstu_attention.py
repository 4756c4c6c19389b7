"""bench_hstu_attention's plumbing on CPU (Triton interpreter, tiny shapes): every arm, the tile
sweeps, the JSON with its targets and the plot. The figures of such a run mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_hstu_attention.py"


def test_bench_hstu_attention_small_cpu_run(tmp_path: Path) -> None:
    out = tmp_path / "attention.json"
    command = [sys.executable, str(BENCH), "--device", "cpu", "--small", "--out", str(out)]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["workload"] for r in report["results"]] == ["heavy", "uniform_16", "uniform_40"]
    for row in report["results"]:
        assert all(arm["status"] == "ok" for arm in row["arms"]), row["arms"]
        assert row["triton_vs_torch_max_rel_error"] < 1e-4  # float32 on CPU: the two attentions agree
    heavy = {arm["arm"] for arm in report["results"][0]["arms"]}
    sweep = {"triton fwd+bwd, bwd 32 w8", "triton fwd+bwd, bwd 32 w4 fast_silu"}
    assert {"triton fwd+bwd", "torch fwd+bwd", *sweep} <= heavy
    longest = {arm["arm"] for arm in report["results"][2]["arms"]}
    assert len(longest) == 4 + 2 + 6  # the arms, the two bias floors, the forward sweep
    assert {"triton fwd, no time bias, one position bias", "triton fwd 128x32 w8 s2 span1",
            "triton fwd 128x32 w8 s2 fast_silu"} <= longest  # fmt: skip
    assert report["results"][1]["arms"][-1]["arm"] == "compiled fwd+bwd"  # torch.compile, after the rest
    targets = report["targets"]
    assert {"heavy_fwd_bwd_speedup_vs_padded_torch", "uniform_40_fwd_share_of_matmul", "target_met"} <= targets.keys()
    assert out.with_suffix(".png").stat().st_size > 0
    assert report["environment"]["triton_interpret"] is True
