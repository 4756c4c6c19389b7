"""Training on CUDA against the runs it must reproduce (skipped without a CUDA device).

Three claims, each checked by comparing whole `freescale train` runs on the same prepared data and
seed (tiny model, 6 steps, every run ~10-20 s on an H100, most of it start-up):

- the device changes nothing but float summation order: the first steps' losses of a CUDA run are
  the CPU run's to within the tolerance below;
- PEC on CUDA (a communication thread with its own stream, events and ``record_stream``) trains
  exactly like the synchronous schedule: bitwise equal losses;
- two ranks sharing one GPU (``engine.share_gpus``) give bitwise the same losses with the copy-engine
  transport (CUDA IPC) as with the torch transport over gloo, and their step 0 (rank 0) is the
  one-rank run's step 0.

Bitwise claims run with ``engine.deterministic`` (``torch.use_deterministic_algorithms``): CUDA's
default ``index_add_``/``index_put_(accumulate=True)`` add a row's gradients with atomics, in an
order that changes from run to run, so without it two runs of one schedule already differ in the
last bits. Both sides use the PyTorch attention (``model_extra.attention = "torch"`` where the option
exists), so only the device, the schedule or the transport differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_cli import prepare_tiny, run_toml

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
STEPS = 6
# CPU vs CUDA, both fp32 (no autocast; PyTorch leaves TF32 off for matmuls): step 0 has seen no update,
# so only the forward's summation order differs (~1e-6 relative); the next steps carry that noise
# through dense SGD and row-wise Adagrad updates, which scale it but do not amplify it (dense Adam is
# avoided here: it turns noise in a near-zero gradient into an lr-sized step, DEVELOPERS.md).
FIRST_STEP_RTOL, LATER_RTOL = 1e-5, 1e-4


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> str:
    return prepare_tiny(tmp_path_factory.mktemp("gpu_data"))


def train(prepared: str, root: Path, name: str, nproc: int = 1, **engine: object) -> list[dict]:
    """A run of STEPS steps; its per-step lines of ``metrics.jsonl``. The CLI runs as a module: a GPU
    host with FreeScale in a --target folder has no ``freescale`` script next to the interpreter."""
    out = root / name
    tables = {
        "model_extra": {"attention": "torch"},
        "data": {"max_steps": STEPS, "workers": 0},
        "optimizer": {"dense": "sgd", "dense_lr": 0.05},
        "engine": {"deterministic": True, **engine},
        "eval": {"max_users": 0},
        "logging": {"log_every": STEPS, "trace_steps": 0, "timeline_steps": 0},
    }
    config = run_toml(root / f"{name}.toml", prepared, out, **tables)
    command = [sys.executable, "-P", "-m", "freescale.tools.cli", "train", "--config", config, "--nproc", str(nproc)]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = sorted((line for line in lines if "loss" in line), key=lambda line: line["step"])
    assert [line["step"] for line in steps] == list(range(STEPS))
    return steps


def losses(steps: list[dict]) -> list[float]:
    return [line["loss"] for line in steps]


@pytest.fixture(scope="module")
def cuda_none(prepared: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One rank on the GPU (NCCL), synchronous schedule: the reference of two tests."""
    return train(prepared, tmp_path_factory.mktemp("cuda_none"), "run", device="cuda", overlap="none")


def test_cuda_losses_match_the_cpu_run(prepared: str, cuda_none: list[dict], tmp_path: Path) -> None:
    cpu = losses(train(prepared, tmp_path, "cpu", device="cpu", overlap="none"))
    gpu = losses(cuda_none)
    assert gpu[0] == pytest.approx(cpu[0], rel=FIRST_STEP_RTOL), (cpu, gpu)
    assert gpu == pytest.approx(cpu, rel=LATER_RTOL), (cpu, gpu)


def test_pec_on_cuda_matches_the_synchronous_schedule_bitwise(
    prepared: str, cuda_none: list[dict], tmp_path: Path
) -> None:
    pec = train(prepared, tmp_path, "pec", device="cuda", overlap="pec")
    assert pec[0]["overlap"] == "pec" and cuda_none[0]["overlap"] == "none"
    gaps = [abs(a - b) for a, b in zip(losses(pec), losses(cuda_none))]
    assert losses(pec) == losses(cuda_none), f"largest difference {max(gaps):.3g}: {losses(pec)} vs {losses(cuda_none)}"


def test_two_ranks_on_one_gpu_copy_engine_equals_torch_transport(
    prepared: str, cuda_none: list[dict], tmp_path: Path
) -> None:
    shared = {"device": "cuda", "share_gpus": True, "overlap": "pec"}
    copy_engine = train(prepared, tmp_path, "copy_engine", nproc=2, transport="copy_engine", **shared)
    gloo = train(prepared, tmp_path, "torch", nproc=2, transport="torch", **shared)
    assert copy_engine[0]["transport"] == "copy_engine" and gloo[0]["transport"] == "torch"
    assert losses(copy_engine) == losses(gloo), (losses(copy_engine), losses(gloo))
    assert [line["rank_loss"] for line in copy_engine] == [line["rank_loss"] for line in gloo]
    assert copy_engine[0]["rank_loss"][0] == cuda_none[0]["loss"]  # micro-batch 0 from the same initial state
