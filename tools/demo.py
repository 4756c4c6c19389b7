"""The training part of ``make demo``: 240 steps on 2 CPU ranks (about 80 s on an idle 2-core host),
the bubble table, then model quality next to a most-popular baseline.

The demo's sources carry planted sequential structure (``freescale generate --set markov_prob=…``:
with that probability a user's next item is a fixed function of the previous one, the generator
``bench_quality`` uses), so a sequential model has something to learn that item popularity cannot
show: the demo ends with validation and test HR@10 / NDCG@10 of the model and of most-popular under
the same leave-one-out protocol (``trainer/eval/protocol.py``; full ranking over the exact item table).

The demo's own prepared dataset keeps histories up to 4,096 events and is planned with the default
(d = 256) cost model, which suits ``freescale stats`` and the balance report but not a one-minute CPU
run. So the demo trains on a second dataset prepared from the same sources with the trainer's model
dimensions (``[model]`` of the run config doubles as ``prepare --model-config``, so the planner
balances the costs this model actually has) and a 512-event cap. The run is a number of steps, not of
seconds: with TorchRec's table-size-dependent embedding init (``model_extra.embedding_init = "rows"``)
the gain over most-popular appeared between steps 130 and 190 (test NDCG@10 0.0007 after 130 steps on
a loaded host, 0.134 after 190 on an idle one, most popular 0.124), so a time budget made the demo's
result depend on the machine's load. With the default ``floor`` init learning is faster (test NDCG@10
0.414 after 240 steps against ``rows``' 0.249: docs/training.md), but the result still should not
depend on the machine. ``data.max_seconds`` is only a ceiling for a very slow machine; evaluation
runs once, after the last step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEMO_MODEL = {"d_model": 32, "num_layers": 1, "num_heads": 2, "num_negatives": 32, "max_uih_len": 512}
MARKOV_PROB = 0.6  # share of events that follow the planted transition from the previous item
K = 10


DEMO_STEPS = 240
DEMO_MAX_SECONDS = 600.0  # a ceiling: the demo stops at the first log flush past it


def write_demo_config(path: Path, dataset: Path, out_dir: Path, steps: int, seconds: float, num_items: int) -> Path:
    """The demo's run config (TOML), readable by ``freescale train`` and ``prepare --model-config``."""
    tables = {
        "model": DEMO_MODEL,
        "model_extra": {"architecture": "hstu", "num_items": num_items, "num_actions": 0, "inbatch_negatives": 32},
        "data": {"path": str(dataset), "max_steps": steps, "max_seconds": seconds},
        "optimizer": {"dense_lr": 0.002, "sparse_lr": 0.05},
        "engine": {"threads": 1},
        "eval": {"max_users": -1, "k": K},
        "logging": {"out_dir": str(out_dir), "log_every": 5, "progress": True},
    }
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def quality_table(model: dict[str, Any], popular: dict[str, dict[str, Any]]) -> str:
    """Validation and test HR@k / NDCG@k of the model (best validation) and of most-popular."""
    hr, ndcg = f"hr@{K}", f"ndcg@{K}"
    lines = [
        f"model quality, leave-one-out, full ranking ({popular['test']['users']} users):",
        f"{'':24} {'val HR@10':>10} {'val NDCG@10':>12} {'test HR@10':>11} {'test NDCG@10':>13}",
    ]
    for name, figures in (("HSTU (this run)", model), ("most popular", popular)):
        val, test = figures["validation"], figures["test"]
        lines.append(f"{name:24} {val[hr]:10.4f} {val[ndcg]:12.4f} {test[hr]:11.4f} {test[ndcg]:13.4f}")
    if popular["test"][ndcg]:
        lines.append(f"test NDCG@10: {model['test'][ndcg] / popular['test'][ndcg]:.2f}x most popular")
    return "\n".join(lines)


def report_quality(dataset: Path, logs: Path) -> dict[str, Any]:
    """Print and save (``quality.json`` beside the logs) the model's and most-popular's figures."""
    from freescale.pipeline.dataset.reader import PreparedDataset
    from freescale.trainer.eval.evaluate import most_popular

    protocol = json.loads((logs / "bubbles.json").read_text())["protocol"]
    model = {"validation": protocol["validation"], "test": protocol["test"]}
    popular = most_popular(PreparedDataset(str(dataset)), K)
    print(quality_table(model, popular), flush=True)
    result = {"model": model, "most_popular": popular, "best_step": protocol["best_step"]}
    (logs.parent / "quality.json").write_text(json.dumps(result, indent=1))
    return result


def demo_train(
    sources: str,
    out: str,
    steps: int = DEMO_STEPS,
    seconds: float = DEMO_MAX_SECONDS,
    nproc: int = 2,
    num_items: int = 0,
) -> int:
    """Prepare a training dataset from ``sources`` with the demo model's dims, train ``nproc`` ranks,
    then compare the model with most-popular."""
    from freescale.model_config import ModelConfig
    from freescale.pipeline.balance import BalanceConfig
    from freescale.pipeline.config import PrepareConfig, SampleConfig
    from freescale.pipeline.prepare import prepare
    from freescale.trainer.launch import launch

    root = Path(out)
    dataset = root / "prepared-train"
    config = write_demo_config(root / "train.toml", dataset, root / "logs", steps, seconds, num_items)
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
    status = launch(str(config), nproc=nproc)
    if status == 0:
        report_quality(dataset, root / "logs")
    return status
