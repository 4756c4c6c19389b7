"""Model quality on data with planted sequential structure: HR@10 / NDCG@10 vs a most-popular baseline.

The generator's Markov option makes, with probability ``markov_prob``, a user's next item a fixed
function of the previous one (``(prev·a + b) mod n_items``). A sequential model can learn that; a
popularity ranking cannot. Each architecture trains on 2 CPU ranks (``freescale train``), then ranks
every user's held-out last item against the full catalogue (leave-last-out, no sampling); the
most-popular baseline ranks the same targets by training-event frequency; the random baseline is
k / n_items. Side-by-side table, JSON to ``benchmarks/results/bench_quality.json``.

    python benchmarks/bench_quality.py            # ~3 minutes on 2 cores
    python benchmarks/bench_quality.py --quick    # smoke run, no result file unless --out
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from measure import FREESCALE, write_result

from freescale.trainer.config import write_run_toml

RESULTS = Path(__file__).resolve().parent / "results" / "bench_quality.json"


@dataclass
class Settings:
    users: int = 2_000
    items: int = 2_000
    median: float = 30.0
    sigma: float = 0.8
    cap: int = 200
    markov_prob: float = 0.6
    zipf: float = 1.1
    epochs: float = 8.0
    micro_batch_size: int = 32
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 2
    k: int = 10
    seed: int = 0


def make_data(s: Settings, work: Path) -> str:
    from freescale.datasets.presets import preset
    from freescale.datasets.synthetic import generate
    from freescale.pipeline.balance import BalanceConfig
    from freescale.pipeline.config import PrepareConfig, SampleConfig
    from freescale.pipeline.prepare import prepare

    generate(
        preset(
            "demo",
            n_users=s.users,
            n_items=s.items,
            median=s.median,
            sigma=s.sigma,
            max_len=s.cap,
            markov_prob=s.markov_prob,
            zipf=s.zipf,
            seed=s.seed,
        ),
        str(work / "sources"),
    )
    out = work / "prepared"
    prepare(
        PrepareConfig(
            sources=str(work / "sources" / "sources.toml"),
            output=str(out),
            samples=SampleConfig(max_uih_len=s.cap),
            balance=BalanceConfig(group_size=2, micro_batch_size=s.micro_batch_size, seed=s.seed),
            workers=1,
            progress=False,
            overwrite=True,
        )
    )
    return str(out)


def popularity(data: str, k: int, items: int) -> dict[str, Any]:
    """Most-popular baseline on the same leave-last-out targets (window-0 samples)."""
    from freescale.pipeline.reader import PreparedDataset
    from freescale.trainer.evaluate import popularity_metrics

    dataset = PreparedDataset(data)
    train, targets = [], []
    for index in range(dataset.n_micro_batches):
        for sample in dataset.micro_batch(index):
            ids = np.asarray(sample["item_ids"])
            train.append(ids[:-1])
            if int(sample["window"]) == 0 and len(ids) >= 3:
                targets.append(int(ids[-1]))
    return popularity_metrics(np.concatenate(train), np.array(targets), items, k)


def write_config(path: Path, s: Settings, data: str, out: Path, architecture: str) -> str:
    tables = {
        "model": {
            "d_model": s.d_model,
            "num_layers": s.num_layers,
            "num_heads": s.num_heads,
            "num_negatives": 128,
            "max_uih_len": s.cap,
        },
        "model_extra": {
            "architecture": architecture,
            "num_items": s.items,
            "num_actions": 8,
            "inbatch_negatives": 64,
            "temperature": 0.05,
        },
        "data": {"path": data, "epochs": s.epochs, "seed": s.seed},
        "optimizer": {"dense_lr": 0.002, "sparse_lr": 0.05},
        "engine": {"threads": 1, "seed": s.seed},
        "eval": {"max_users": s.users, "k": s.k, "num_candidates": 0},
        "logging": {"out_dir": str(out), "log_every": 50, "progress": False},
    }
    return write_run_toml(path, tables)


def train(config: str, cwd: Path) -> dict[str, Any]:
    start = time.perf_counter()
    result = subprocess.run(
        [*FREESCALE, "train", "--config", config, "--nproc", "2"], cwd=cwd, capture_output=True, text=True
    )
    if result.returncode:
        raise RuntimeError(f"training failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    report = json.loads((Path(config).parent / Path(config).stem / "bubbles.json").read_text())
    losses = [line["loss"] for line in report["steps"]]
    return {
        "eval": report["evals"][-1]["eval"],
        "seconds": time.perf_counter() - start,
        "steps": len(losses),
        "first_loss": float(np.mean(losses[:10])),
        "last_loss": float(np.mean(losses[-10:])),
        "samples_per_s": report["summary"]["samples_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--architectures", default="hstu,sasrec")
    parser.add_argument("--out")
    parser.add_argument("--work")
    args = parser.parse_args(argv)
    s = Settings(users=400, items=500, epochs=3.0) if args.quick else Settings()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench_quality-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        data = make_data(s, work)
        rows: list[dict[str, Any]] = []
        for architecture in args.architectures.split(","):
            config = write_config(work / f"{architecture}.toml", s, data, work / architecture, architecture)
            result = train(config, work)
            rows.append({"model": f"{architecture} (ours, 2 ranks)", **result["eval"], **result})
        baseline = popularity(data, s.k, s.items)
        rows.append({"model": "most popular", **baseline})
        rows.append(
            {
                "model": "random",
                "protocol": "full",
                "users": baseline["users"],
                f"hr@{s.k}": s.k / s.items,
                f"ndcg@{s.k}": None,
            }
        )
    hr, ndcg = f"hr@{s.k}", f"ndcg@{s.k}"
    print(f"{'model':24} {'protocol':>8} {'users':>6} {hr:>7} {ndcg:>8} {'vs popular':>11}")
    for row in rows:
        ratio = row[hr] / baseline[hr] if baseline[hr] else float("nan")
        ndcg_text = f"{row[ndcg]:8.4f}" if row.get(ndcg) is not None else f"{'-':>8}"
        print(f"{row['model']:24} {row['protocol']:>8} {row['users']:6d} {row[hr]:7.4f} {ndcg_text} {ratio:10.2f}x")
    report = {
        "settings": asdict(s),
        "rows": rows,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "note": "leave-last-out, full ranking over all n_items table rows; planted Markov transitions",
    }
    out = Path(args.out) if args.out else (None if args.quick else RESULTS)
    if out is not None:
        write_result(out, report)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
