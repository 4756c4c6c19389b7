"""The checked-in examples run: the README's quick start (``examples/quickstart/``: raw logs to a trained
model and its HR@10) and ``examples/byo_torchrec_model.py`` (a user's own TorchRec model, sharded
``EmbeddingCollection`` + GRU, ``DistributedModelParallel``, ``TrainPipelineSparseDist``, on 2 gloo
ranks fed by the loader)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from train_cli import FREESCALE, prepare_tiny

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "byo_torchrec_model.py"
QUICKSTART = ROOT / "examples" / "quickstart"
# The quick start runs here on the tiny preset, for a few steps and a few evaluated users.
QUICKSTART_SMALLER = {"--preset demo": "--preset tiny"}
QUICKSTART_TRAIN_OPTIONS = ["--set", "data.max_steps=4", "--set", "eval.max_users=50"]

pytestmark = pytest.mark.slow


def test_byo_torchrec_model_trains_on_two_ranks_and_its_loss_falls(tmp_path: Path) -> None:
    data = prepare_tiny(tmp_path / "data")
    out = tmp_path / "losses.json"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command = [*torchrun, str(EXAMPLE), "--data", data, "--steps", "40", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    report = json.loads(out.read_text())
    losses = report["losses"]
    assert report["world_size"] == 2 and len(losses) == 40 and np.all(np.isfinite(losses))
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert last < 0.92 * first, (first, last)


def readme_quickstart_commands() -> list[list[str]]:
    """The ``freescale`` commands of the README's quick-start code block, as argument lists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: no bash block under ## Quick start"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    commands = [shlex.split(line, comments=True) for line in lines]
    return [command for command in commands if command]


def test_readme_quickstart_runs_from_raw_logs_to_hr_at_10(tmp_path: Path) -> None:
    """Every README quick-start command runs (from a folder holding ``examples/quickstart``) and the
    run ends with validation and test HR@10 of the trained model."""
    shutil.copytree(QUICKSTART, tmp_path / "examples" / "quickstart")
    commands = readme_quickstart_commands()
    assert [command[:2] for command in commands] == [
        ["freescale", "generate"],
        ["freescale", "prepare"],
        ["freescale", "train"],
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for command in commands:
        line = " ".join(command[1:])
        for old, new in QUICKSTART_SMALLER.items():
            line = line.replace(old, new)
        args = [FREESCALE, *shlex.split(line)]
        if command[1] == "train":
            args += QUICKSTART_TRAIN_OPTIONS
        result = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, shlex.join(args) + "\n" + result.stdout[-3000:] + result.stderr[-4000:]
    protocol = json.loads((tmp_path / "runs" / "quickstart" / "bubbles.json").read_text())["protocol"]
    for split in ("validation", "test"):
        assert 0.0 <= protocol[split]["hr@10"] <= 1.0 and protocol[split]["users"] > 0, protocol[split]
    assert "test: hr@10" in result.stdout
