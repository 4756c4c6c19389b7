"""The GPU check's training parts: a small realistic dataset, then short runs on one GPU and on two
ranks sharing it (``python -m freescale.tools.gpu_training data|run ...``; ``tools/gpu_check.py``
runs them, each as its own part with its own timeout).

``data`` generates the demo preset with planted sessions (heavy-tailed lengths, ~1.2M events) and
prepares it for up to 8 ranks on every core of the machine. ``run --ranks 1`` trains the FreeScale
engine on one GPU: HSTU, Triton attention, bf16 products, PEC (its own CUDA stream), a few dozen
steps, the bubble report. ``run --ranks 2`` is the same run with two ranks sharing the GPU (``engine.share_gpus``:
gloo for the dense all-reduce, copy engines through CUDA IPC for the all-to-alls) and, with
``--compare`` the one-rank result, checks that the two agree where they must: step 0's rank-0 loss
(same micro-batch, same initial state, so the sharded lookup across two processes must give the
same rows bit for bit) and the loss trend.

Each subcommand writes one JSON (``--out``): ``status``, ``figures``, ``target_met`` per target,
``notes``. ``--dry-run`` builds and validates everything (generator and prepare configs, the run
configs with their overrides) without generating, preparing or training: ``make test`` runs it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from freescale.trainer.config import RunConfig
from freescale.trainer.config_toml import write_run_toml

MODEL = {"d_model": 128, "num_layers": 2, "num_heads": 4, "num_negatives": 128, "max_uih_len": 512}
GROUP_SIZE, MICRO_BATCH = 8, 32
STEPS, LOG_EVERY, SKIP_STEPS = 40, 10, 10  # the first steps compile kernels: left out of the figures
EVAL_USERS = 512
LOSS_AGREEMENT = 1e-6  # relative: step 0 of rank 0 reads what W = 1 reads; only float noise may differ


# the zch run (``run --zch``): item ids and user ids through zero-collision tables on the GPU, the user
# table smaller than the users (evictions), an exact profile table beside them
ZCH_ITEMS = {"ids": "zch", "zch_size": 65_536, "zch_bucket_size": 64, "zch_max_probe": 16}
ZCH_USER_TABLES = {
    "age_bucket": {},
    "user_id": {"ids": "zch", "zch_size": 2_048, "zch_bucket_size": 64, "zch_max_probe": 8},
}


def run_tables(data: str, out: Path, zch: bool = False) -> dict[str, dict[str, Any]]:
    """The run config the runs share (the overrides of ``run_overrides`` make them GPU runs); ``zch``:
    item and user ids through zero-collision tables, plus an exact profile table."""
    tables = _base_tables(data, out)
    if zch:
        tables["model_extra"] |= ZCH_ITEMS
        tables["user_tables"] = ZCH_USER_TABLES
    return tables


def _base_tables(data: str, out: Path) -> dict[str, dict[str, Any]]:
    return {
        "model": MODEL,
        # the GPU configuration a user would run: the jagged Triton attention, bf16 products
        "model_extra": {"architecture": "hstu", "inbatch_negatives": 32, "attention": "triton", "precision": "bf16"},
        "data": {"path": data, "max_steps": STEPS, "workers": 1},
        "optimizer": {"dense_lr": 0.002, "sparse_lr": 0.05},
        "eval": {"max_users": EVAL_USERS},
        "logging": {"out_dir": str(out), "log_every": LOG_EVERY, "skip_steps": SKIP_STEPS, "progress": False},
    }


def run_overrides(ranks: int) -> list[str]:
    """What makes the run the check's: CUDA, the FreeScale engine, PEC; two ranks share the GPU."""
    overrides = ['engine.device="cuda"', 'engine.name="freescale"', 'engine.overlap="pec"']
    if ranks > 1:
        overrides.append("engine.share_gpus=true")  # transport "auto" then picks the copy engines
    return overrides


# data --------------------------------------------------------------------------------------------
def data_configs(work: Path) -> tuple[Any, Any]:
    """(generator config, prepare config) of the check's dataset."""
    from freescale.datasets.presets import preset
    from freescale.model_config import ModelConfig
    from freescale.pipeline.balance import BalanceConfig
    from freescale.pipeline.config import PrepareConfig, SampleConfig

    generator = preset("demo", sessions=True)
    prepare = PrepareConfig(
        sources=str(work / "src" / "sources.toml"),
        output=str(work / "prepared"),
        samples=SampleConfig(max_uih_len=MODEL["max_uih_len"]),
        model=ModelConfig(**MODEL),
        balance=BalanceConfig(group_size=GROUP_SIZE, micro_batch_size=MICRO_BATCH, seed=1),
        workers=max(1, min(16, os.cpu_count() or 1)),
        memory_limit=8 * 2**30,
        overwrite=True,
        progress=False,
    )
    return generator, prepare


def cmd_data(args: argparse.Namespace) -> dict[str, Any]:
    from freescale.datasets.synthetic import generate
    from freescale.pipeline.dataset.manifest import load_manifest
    from freescale.pipeline.prepare import prepare

    work = Path(args.work)
    generator, config = data_configs(work)
    figures: dict[str, Any] = {"preset": "demo", "sessions": True, "workers": config.workers, "path": config.output}
    if args.dry_run:
        return {"status": "ok", "figures": figures, "target_met": {}, "notes": ["dry run: configs validated"]}
    started = time.perf_counter()
    generate(generator, str(work / "src"))
    figures["generate_s"] = time.perf_counter() - started
    started = time.perf_counter()
    prepare(config)
    figures["prepare_s"] = time.perf_counter() - started
    manifest = load_manifest(config.output)
    rows, balance = manifest.rows, manifest.balance
    figures.update(
        events=rows.events_used, samples=rows.samples, micro_batches=balance.n_micro_batches,
        step_groups=balance.n_step_groups, items=manifest.tables["item"].size,
    )  # fmt: skip
    return {"status": "ok", "figures": figures, "target_met": {"prepared": True}, "notes": []}


# run ---------------------------------------------------------------------------------------------
def train(command: list[str], log: Path, timeout: float) -> tuple[str, int | None]:
    """``freescale train`` to its end or ``timeout``: SIGTERM (the launcher stops torchrun and its
    ranks), SIGKILL after 10 s. Returns (ok | failed | timeout, exit code)."""
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return "timeout", None
    return ("ok" if code == 0 else "failed"), code


def losses_of(out: Path) -> tuple[list[float | None], list[float | None]]:
    """(loss per step, step 0's loss per rank) from the run's ``metrics.jsonl``."""
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = sorted((line for line in lines if "loss" in line and "eval" not in line), key=lambda line: line["step"])
    return [line["loss"] for line in steps], (steps[0].get("rank_loss", []) if steps else [])


def run_figures(out: Path) -> dict[str, Any]:
    """What the check reports of a finished run (``bubbles.json``, ``metrics.jsonl``)."""
    report = json.loads((out / "bubbles.json").read_text())
    summary, protocol = report["summary"], report.get("protocol") or {}
    losses, step0 = losses_of(out)
    step_ms = summary.get("step_ms") or 0.0
    return {
        "transport": report["transport"], "overlap": report["overlap"], "world_size": report["world_size"],
        "attention": report["config"]["model_extra"].get("attention", "model default"),
        "steps": len(losses), "measured_steps": summary.get("steps"), "step_ms": step_ms,
        "steps_per_s": 1000.0 / step_ms if step_ms else None, "samples_per_s": summary.get("samples_per_s"),
        "first_step_ms": report["steps"][0]["step_ms"] if report["steps"] else None,
        "exposed_comm_pct": summary.get("exposed_comm_pct"), "straggler_pct": summary.get("straggler_pct"),
        "bubble_pct": summary.get("bubble_pct"), "embedding_comm": summary.get("embedding_comm"),
        "stage_ms": summary.get("stage_ms"), "losses": losses, "step0_rank_loss": step0,
        "validation": protocol.get("validation"), "test": protocol.get("test"),
        "zch": summary.get("zch"),
    }  # fmt: skip


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def run_targets(
    figures: dict[str, Any], ranks: int, compare: dict[str, Any] | None, zch: bool = False
) -> tuple[dict, list[str]]:
    """``target_met`` of a run, and notes (what could not be checked); ``zch``: the run of ``--zch``."""
    losses = [loss for loss in figures["losses"] if loss is not None]
    targets = {
        "trained_all_steps": figures["steps"] == STEPS,
        "finite_losses": len(losses) == STEPS and all(math.isfinite(loss) for loss in losses),
        "loss_falls": len(losses) >= 10 and mean(losses[-5:]) < mean(losses[:5]),
        "overlap_pec": figures["overlap"] == "pec",
    }
    notes: list[str] = []
    targets["attention_triton"] = figures["attention"] == "triton"
    if zch:
        tables = figures.get("zch") or {}
        targets["zch_tables_reported"] = sorted(tables) == ["item", "user.user_id"]
        targets["zch_item_collision_rate_le_0.5pct"] = tables.get("item", {}).get("collision_rate", 1.0) <= 0.005
        targets["zch_user_evictions"] = tables.get("user.user_id", {}).get("eviction_rate", 0.0) > 0
    if ranks > 1:
        targets["transport_copy_engine"] = figures["transport"] == "copy_engine"
    if compare is not None:
        mine, theirs = (figures["step0_rank_loss"] or [None])[0], (compare.get("step0_rank_loss") or [None])[0]
        agree = mine is not None and theirs is not None and abs(mine - theirs) <= LOSS_AGREEMENT * abs(theirs)
        figures["agreement"] = {
            "step0_rank0_loss": mine, "step0_rank0_loss_one_rank": theirs,
            "bitwise": mine == theirs, "relative_tolerance": LOSS_AGREEMENT,
            "last10_mean_loss": mean(losses[-10:]) if len(losses) >= 10 else None,
            "last10_mean_loss_one_rank": mean([x for x in compare["losses"][-10:] if x is not None] or [math.nan]),
        }  # fmt: skip
        targets["step0_loss_matches_one_rank"] = agree
    return targets, notes


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "run"
    config = write_run_toml(run_dir / "run.toml", run_tables(args.data, out, args.zch))
    overrides = run_overrides(args.ranks)
    RunConfig.from_toml(config, overrides)  # a config error fails here, in one line
    command = [sys.executable, "-P", "-m", "freescale.tools.cli", "train", "--config", config]
    command += ["--nproc", str(args.ranks), *(x for o in overrides for x in ("--set", o))]
    result: dict[str, Any] = {"command": command, "figures": {}, "target_met": {}, "notes": []}
    if args.dry_run:
        return {**result, "status": "ok", "notes": ["dry run: run config and overrides validated"]}
    status, code = train(command, run_dir / "train.log", args.timeout)
    result.update(status=status, returncode=code)
    if status != "ok" or not (out / "bubbles.json").exists():
        tail = (run_dir / "train.log").read_text(errors="replace").splitlines()[-40:]
        return {**result, "status": "failed" if status == "ok" else status, "log_tail": "\n".join(tail)}
    figures = run_figures(out)
    compare = json.loads(Path(args.compare).read_text()).get("figures") if args.compare else None
    if args.compare and not (compare and compare.get("losses")):
        result["notes"].append(f"{args.compare} holds no finished one-rank run: no agreement check")
        compare = None
    targets, notes = run_targets(figures, args.ranks, compare, args.zch)
    return {**result, "figures": figures, "target_met": targets, "notes": result["notes"] + notes}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m freescale.tools.gpu_training", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="generate and prepare the check's dataset")
    data.add_argument("--work", required=True, help="folder for the sources and the prepared dataset")
    run = sub.add_parser("run", help="one short training run on the GPU")
    run.add_argument("--ranks", type=int, choices=[1, 2], required=True)
    run.add_argument("--data", required=True, help="the prepared dataset")
    run.add_argument("--run-dir", required=True, help="where the run config, its log and its outputs go")
    run.add_argument("--compare", help="the one-rank run's JSON (two ranks: agreement check)")
    run.add_argument("--timeout", type=float, default=90.0, help="seconds before the run is stopped")
    run.add_argument("--zch", action="store_true", help="item and user ids through zero-collision tables")
    for command in (data, run):
        command.add_argument("--out", required=True, help="the JSON this part writes")
        command.add_argument("--dry-run", action="store_true", help="validate the configs, run nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started = time.perf_counter()
    try:
        result = cmd_data(args) if args.command == "data" else cmd_run(args)
    except Exception as error:  # the part's JSON says what went wrong; the exit status says that it did
        result = {"status": "failed", "error": f"{type(error).__name__}: {error}", "target_met": {}}
    result["seconds"] = time.perf_counter() - started
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    if result["status"] != "ok":
        print(f"gpu_training {args.command}: {result['status']}: {result.get('error', '')}", file=sys.stderr)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
