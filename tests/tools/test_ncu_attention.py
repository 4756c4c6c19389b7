"""``scripts/ncu_attention.sh`` (Nsight Compute profiles of the attention forward, run on a GPU machine)
must assemble on CPU: its dry run runs the profiled case through the Triton interpreter and prints one
ncu command per variant; each variant of the case runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_prints_one_profile_per_variant(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "ncu_attention.sh"), str(tmp_path), "--dry-run"],
                            capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    commands = [line for line in result.stdout.splitlines() if line.startswith("ncu ")]
    assert [c.split("--variant ")[1].split()[0] for c in commands] == ["time", "no_time", "no_bias"]
    assert all("--clock-control none" in c and "regex:_hstu_fwd" in c for c in commands)


@pytest.mark.parametrize("variant", ["time", "no_time", "no_bias"])
def test_each_variant_of_the_case_runs(variant: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import attention_profile_case

    argv = ["--device", "cpu", "--small", "--workload", "uniform_16", "--variant", variant, "--launches", "1"]
    assert attention_profile_case.main(argv) == 0
    assert capsys.readouterr().out.startswith(f"{variant}: 1 forward launches on uniform_16")
