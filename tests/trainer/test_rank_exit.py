"""What a rank process leaves alive at interpreter exit: nothing that finalization could abort on.

A TorchRec rank aborted at exit once in ~12 runs ("terminate called without an active exception",
SIGABRT, after its run had finished). The process group outlived ``destroy_process_group``: TorchRec's
sharded modules hold it in reference cycles, so its gloo worker and transport threads, its
connections and the works holding tensors were left to the interpreter's finalization, which destroys
them in an unspecified order with the interpreter half torn down. The race itself cannot be forced,
so this checks its precondition directly in every rank (``tests/helpers/exit_check``: an ``atexit`` hook that
runs right before finalization): no gloo thread and no Python thread besides the main one.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from train_cli import FREESCALE, prepare_tiny, run_toml

pytestmark = pytest.mark.slow

EXIT_CHECK = Path(__file__).resolve().parents[1] / "helpers" / "exit_check"


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return prepare_tiny(tmp_path_factory.mktemp("exit-data"))


def threads_at_exit(config: str, cwd: Path, *args: str) -> list[dict]:
    """Train with ``tests/helpers/exit_check`` first on every process's path; each rank's threads at exit."""
    folder = cwd / "exit"
    folder.mkdir()
    path = os.pathsep.join(p for p in (str(EXIT_CHECK), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "FREESCALE_EXIT_CHECK": str(folder)}
    command = [FREESCALE, "train", "--config", config, "--nproc", "2", *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_a_torchrec_rank_reaches_interpreter_exit_without_process_group_threads(
    tiny_dataset: str, tmp_path: Path
) -> None:
    config = run_toml(tmp_path / "run.toml", tiny_dataset, tmp_path / "out", eval={"max_users": 0},
                      data={"max_steps": 6, "workers": 0})  # fmt: skip
    for rank, seen in enumerate(threads_at_exit(config, tmp_path, "--engine", "torchrec")):
        left = [name for name in seen["os_threads"] if "gloo" in name]
        assert not left, f"rank {rank} reached interpreter exit with {left} alive: {seen}"
        assert seen["python_threads"] == [], f"rank {rank}: {seen}"
