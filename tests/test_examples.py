"""``examples/byo_torchrec_model.py``: a user's own TorchRec model (sharded ``EmbeddingCollection`` +
GRU, ``DistributedModelParallel``, ``TrainPipelineSparseDist``) on 2 gloo ranks, fed by the loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from train_cli import prepare_tiny

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "byo_torchrec_model.py"

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
