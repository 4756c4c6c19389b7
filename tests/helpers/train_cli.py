"""Helpers of the tests that train through ``freescale train`` (torchrun, 2 gloo ranks).

Processes run with cwd = a temp dir so the repository's ``datasets/`` cannot shadow Hugging Face's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.model_config import ModelConfig
from freescale.pipeline.balance import BalanceConfig
from freescale.pipeline.config import PrepareConfig, SampleConfig
from freescale.pipeline.prepare import prepare
from freescale.trainer.config_toml import write_run_toml

FREESCALE = str(Path(sys.executable).parent / "freescale")
STEPS = 30
MODEL = {"d_model": 32, "num_layers": 1, "num_heads": 2, "num_negatives": 16, "max_uih_len": 64}


def run_toml(path: Path, data_path: str, out: Path, **extra: dict) -> str:
    tables = {
        "model": MODEL,
        "model_extra": {"num_items": 1000, "num_actions": 8, "inbatch_negatives": 16},
        "data": {"path": data_path, "max_steps": STEPS},
        "optimizer": {"dense_lr": 0.003, "sparse_lr": 0.05},
        "eval": {"max_users": 200},
        "logging": {"out_dir": str(out), "log_every": 10, "progress": False},
    }
    for table, values in extra.items():
        tables[table] = {**tables.get(table, {}), **values}
    return write_run_toml(path, tables)


def run_train(config: str, cwd: Path, *args: str, nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    """``freescale train`` to the end, whatever its exit status."""
    return subprocess.run(
        [FREESCALE, "train", "--config", config, "--nproc", str(nproc), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


def train(config: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    result = run_train(config, cwd, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def losses(out: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if "loss" in line}


def prepare_tiny(root: Path, seed: int = 3, strategy: str = "planned") -> str:
    """Generate the ``tiny`` preset (Markov structure) under ``root`` and prepare it for 2 or 4 ranks."""
    generate(preset("tiny", seed=seed, markov_prob=0.5), str(root / "src"))
    out = str(root / "prepared")
    prepare(
        PrepareConfig(
            sources=str(root / "src" / "sources.toml"),
            output=out,
            samples=SampleConfig(max_uih_len=64),
            model=ModelConfig(**MODEL),
            balance=BalanceConfig(group_size=4, micro_batch_size=8, seed=1, strategy=strategy),
            workers=1,
            progress=False,
            memory_limit=512 * 2**20,
        )
    )
    return out


def prepare_tiny_windows(root: Path, days: float = 2.0, item_lifetime_days: float = 1.0) -> list[str]:
    """The ``tiny`` preset over ``days`` days with item churn, prepared as one dataset per day
    (``prepare --time-window 1d``, docs/data.md#time-windows); returns the windows' dataset paths."""
    from freescale.pipeline.time_windows import prepare_windows

    generate(
        preset("tiny", seed=3, markov_prob=0.5, window_days=days, item_lifetime_days=item_lifetime_days),
        str(root / "src"),
    )
    out = str(root / "windows")
    config = PrepareConfig(
        sources=str(root / "src" / "sources.toml"),
        output=out,
        samples=SampleConfig(max_uih_len=64),
        model=ModelConfig(**MODEL),
        balance=BalanceConfig(group_size=4, micro_batch_size=8, seed=1),
        workers=1,
        progress=False,
        memory_limit=512 * 2**20,
    )
    return prepare_windows(config, 86_400).datasets(out)
