"""The training part of ``make demo``: about a minute on 2 CPU ranks, then the bubble table.

The demo's own prepared dataset keeps histories up to 4,096 events and is planned with the default
(d = 256) cost model, which suits ``freescale stats`` and the balance report but not a one-minute CPU
run. So the demo trains on a second dataset prepared from the same sources with the trainer's model
dimensions (``[model]`` of the run config doubles as ``prepare --model-config``, so the planner
balances the costs this model actually has) and a 512-event cap. ``data.max_seconds`` stops the run
at the first log flush after the time budget; rank 0 prints the bubble table and the eval line
(HR@10 is near zero here: the demo preset has no planted sequential structure — see
``benchmarks/bench_quality.py`` for a model-quality comparison).
"""

from __future__ import annotations

import json
from pathlib import Path

DEMO_MODEL = {"d_model": 32, "num_layers": 1, "num_heads": 2, "num_negatives": 32, "max_uih_len": 512}


def write_demo_config(path: Path, dataset: Path, out_dir: Path, seconds: float, num_items: int) -> Path:
    """The demo's run config (TOML), readable by ``freescale train`` and ``prepare --model-config``."""
    tables = {
        "model": DEMO_MODEL,
        "model_extra": {"architecture": "hstu", "num_items": num_items, "num_actions": 0, "inbatch_negatives": 32},
        "data": {"path": str(dataset), "epochs": 10.0, "max_seconds": seconds},
        "optimizer": {"dense_lr": 0.002, "sparse_lr": 0.05},
        "engine": {"threads": 1},
        "eval": {"max_users": 200},
        "logging": {"out_dir": str(out_dir), "log_every": 5, "progress": True},
    }
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def demo_train(sources: str, out: str, seconds: float = 60.0, nproc: int = 2, num_items: int = 0) -> int:
    """Prepare a training dataset from ``sources`` with the demo model's dims, train ``nproc`` ranks."""
    from freescale.pipeline.balance import BalanceConfig
    from freescale.pipeline.config import PrepareConfig, SampleConfig
    from freescale.pipeline.cost import ModelConfig
    from freescale.pipeline.prepare import prepare
    from freescale.trainer.launch import launch

    root = Path(out)
    dataset = root / "prepared-train"
    config = write_demo_config(root / "train.toml", dataset, root / "logs", seconds, num_items)
    prepare(
        PrepareConfig(
            sources=sources,
            output=str(dataset),
            samples=SampleConfig(max_uih_len=DEMO_MODEL["max_uih_len"]),
            model=ModelConfig.from_toml(str(config)),
            balance=BalanceConfig(group_size=8, micro_batch_size=16),
            progress=False,
            overwrite=True,
        )
    )
    return launch(str(config), nproc=nproc)
