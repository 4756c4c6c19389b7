"""FreeScale without TorchRec and fbgemm (a GPU host has neither): the FreeScale engine trains, and
asking for TorchRec fails with one line naming what to install.

Every process runs with ``tests/helpers/no_torchrec`` first on ``PYTHONPATH``: its ``sitecustomize`` makes
``import torchrec`` and ``import fbgemm_gpu`` raise in the launcher, torchrun's ranks and the loader's
worker processes alike, and logs every attempt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_cli import FREESCALE, losses, prepare_tiny, run_toml

pytestmark = pytest.mark.slow
BLOCKER = Path(__file__).resolve().parents[1] / "helpers" / "no_torchrec"


def blocked_env(log: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(BLOCKER), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, FREESCALE_BLOCKED_IMPORT_LOG=str(log))


def run_blocked(command: list[str], cwd: Path, log: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=blocked_env(log), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> str:
    return prepare_tiny(tmp_path_factory.mktemp("no_torchrec_data"))


def test_the_blocker_blocks(tmp_path: Path) -> None:
    log = tmp_path / "attempts.txt"
    for module in ("torchrec", "fbgemm_gpu", "torchrec.sparse.jagged_tensor"):
        result = run_blocked([sys.executable, "-c", f"import {module}"], tmp_path, log)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, result.stderr[-2000:]
    assert log.read_text().count("\n") == 3


def test_freescale_engine_trains_without_torchrec_or_fbgemm(prepared: str, tmp_path: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "attempts.txt"
    config = run_toml(tmp_path / "run.toml", prepared, out, data={"max_steps": 3}, eval={"max_users": 16})
    command = [FREESCALE, "train", "--config", config, "--nproc", "1", "--set", 'engine.name="freescale"']
    result = run_blocked(command, tmp_path, log)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert sorted(losses(out)) == [0, 1, 2]
    assert not log.exists(), f"something tried to import TorchRec or fbgemm:\n{log.read_text()}"


def test_torchrec_engine_without_torchrec_is_one_line(prepared: str, tmp_path: Path) -> None:
    config = run_toml(tmp_path / "run.toml", prepared, tmp_path / "run")
    command = [FREESCALE, "train", "--config", config, "--nproc", "1", "--set", 'engine.name="torchrec"']
    result = run_blocked(command, tmp_path, tmp_path / "attempts.txt")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("freescale train: error: engine.name 'torchrec' needs TorchRec")
    assert "'torchrec' and 'fbgemm_gpu' cannot be imported" in lines[0] and "fbgemm-gpu" in lines[0]


def test_a_rank_asked_for_torchrec_fails_in_one_line(tmp_path: Path) -> None:
    """A rank started by torchrun directly (no launcher check) raises the runner's one-line error."""
    code = (
        "import torch\n"
        "from freescale.trainer.config import RunConfig\n"
        "from freescale.trainer.runner import TrainingError, make_engine\n"
        "cfg = RunConfig.from_dict({'data': {'path': 'x'}, 'engine': {'name': 'torchrec'}})\n"
        "try:\n"
        "    make_engine(cfg, 0, 1, torch.device('cpu'), 'torchrec')\n"
        "except TrainingError as error:\n"
        "    print(error)\n"
    )
    result = run_blocked([sys.executable, "-c", code], tmp_path, tmp_path / "attempts.txt")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().startswith("engine.name 'torchrec' needs TorchRec, but 'torchrec' and 'fbgemm_gpu'")


def test_kjt_loader_output_without_torchrec_is_one_line(prepared: str, tmp_path: Path) -> None:
    code = (
        "from freescale.pipeline.dataset.loader import Config, Loader\n"
        f"batches = list(Loader(Config(path={prepared!r}, output='batch', num_steps=2, num_workers=0)))\n"
        "assert len(batches) == 2\n"
        "try:\n"
        f"    Config(path={prepared!r}, output='kjt')\n"
        "except ValueError as error:\n"
        "    print(error)\n"
    )
    result = run_blocked([sys.executable, "-c", code], tmp_path, tmp_path / "attempts.txt")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loader option 'output' 'kjt' needs TorchRec"), result.stdout
    assert lines[0].endswith("or read output='batch' or 'samples', which need neither")
