"""``freescale simulate``: options, the run, ``simulate.json``, ``simulate.png`` and the summary table.

Module-level imports stay light: the CLI builds every subcommand's parser on each call.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from freescale.overrides import add_set_option, apply_overrides
from freescale.trainer.simulate.sim_config import DEFAULT_PROFILE

JSON_NAME = "simulate.json"
PLOT_NAME = "simulate.png"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``simulate`` subcommand's options."""
    p.add_argument(
        "lengths",
        help="sample lengths: a prepared dataset (local or s3://), a source config TOML (or its folder), "
        "a .npy of lengths, or a distribution: lognormal:median=300,sigma=1.2,cap=21000 | "
        "pareto:scale=50,alpha=1.1,cap=21000",
    )
    p.add_argument("--out", default="freescale-simulate", help="directory for simulate.json and simulate.png")
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help="hardware profile: a shipped name or a TOML file ([compute], [network], [jitter]); "
        f"default {DEFAULT_PROFILE}",
    )
    p.add_argument("--cost-model", help="calibrated cost model (`freescale calibrate` JSON): seconds per sample here")
    p.add_argument("--model-config", help="TOML with [model]: d_model, num_layers, num_negatives set the workload")
    p.add_argument("--world-sizes", default="2,4,8,16,32,64,128,256,512,1024", help="W values, comma-separated")
    p.add_argument("--arms", default="random,online,plan,plan_online", help="subset of random,online,plan,plan_online")
    p.add_argument("--overlap", help="none,pec (default: none, plus pec when --batch-overlap-rate is given)")
    p.add_argument("--batch-overlap-rate", type=float, help="measured batch_overlap_rate (freescale stats)")
    p.add_argument("--micro-batch-size", "-k", type=int, default=32, help="k: samples per rank per step")
    p.add_argument("--steps", type=int, default=16, help="steps simulated per world size (default 16)")
    p.add_argument("--unique-fraction", type=float, default=1.0, help="distinct share of a rank's looked-up ids")
    p.add_argument("--jitter-cv", type=float, help="spread of identical work across ranks (overrides the profile)")
    p.add_argument(
        "--noise-floor",
        metavar="PCT[@W]",
        help="measured straggler_pct of an identical-work run (at W ranks, default 2); jitter is solved from it",
    )
    add_set_option(p, "override a profile or workload option with a TOML value, e.g. --set network.ranks_per_node=4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-uih-len", type=int, default=21000, help="raw sources: keep the most recent N events")
    p.add_argument("--min-len", type=int, default=2, help="raw sources: drop users with fewer events")
    p.add_argument("--no-verify", action="store_true", help="prepared dataset: skip the shards' hash check")
    p.add_argument("--no-plot", action="store_true", help="write simulate.json only")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _names(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.replace(" ", "").split(",") if part)


def build_config(args: argparse.Namespace) -> Any:
    """``SimConfig`` from the profile, the model config, the options and ``--set`` overrides."""
    from dataclasses import asdict

    from freescale.model_config import ModelConfig
    from freescale.pipeline.config import parse_int_list
    from freescale.trainer.simulate.sim_config import (
        ComputeConfig,
        HardwareProfile,
        JitterConfig,
        NetworkConfig,
        SimConfig,
        WorkloadConfig,
        _from_table,
    )

    profile = HardwareProfile.load(args.profile)
    workload: dict[str, Any] = {
        "micro_batch_size": args.micro_batch_size,
        "steps": args.steps,
        "unique_fraction": args.unique_fraction,
        "batch_overlap_rate": args.batch_overlap_rate,
    }
    if args.model_config:
        model = ModelConfig.from_toml(args.model_config)
        workload.update(embedding_dim=model.d_model, num_layers=model.num_layers, negatives=model.num_negatives)
    tables = {
        "compute": asdict(profile.compute),
        "network": asdict(profile.network),
        "jitter": asdict(profile.jitter),
        "workload": workload,
    }
    if args.cost_model:
        tables["compute"]["cost_model"] = args.cost_model
    if args.jitter_cv is not None:
        tables["jitter"].update(cv=args.jitter_cv, noise_floor_pct=None)
    if args.noise_floor:
        pct, _, at = args.noise_floor.partition("@")
        try:
            tables["jitter"].update(noise_floor_pct=float(pct), noise_floor_world_size=int(at or 2))
        except ValueError as error:
            raise ValueError(f"--noise-floor: expected PCT or PCT@W, got {args.noise_floor!r}") from error
    apply_overrides(tables, args.overrides, known=tables, example="network.ranks_per_node=4")
    return SimConfig(
        world_sizes=parse_int_list(args.world_sizes, "--world-sizes"),
        arms=_names(args.arms),
        overlaps=_names(args.overlap) if args.overlap else None,
        seed=args.seed,
        compute=_from_table(ComputeConfig, tables["compute"], "compute"),
        network=_from_table(NetworkConfig, tables["network"], "network"),
        jitter=_from_table(JitterConfig, tables["jitter"], "jitter"),
        workload=_from_table(WorkloadConfig, tables["workload"], "workload"),
    ), profile


def write_plot(report: dict[str, Any], path: Path) -> None:
    """``bubble_pct`` and ``exposed_comm_pct`` against W (log2 axis), a line per arm and overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = report["rows"]
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    overlaps = list(dict.fromkeys(r["overlap"] for r in rows))
    colors = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, key in zip(axes, ("bubble_pct", "exposed_comm_pct")):
        for arm in arms:
            for overlap in overlaps:
                pts = sorted((r["world_size"], r[key]) for r in rows if r["arm"] == arm and r["overlap"] == overlap)
                style = "-" if overlap == "none" else "--"
                ax.plot(*zip(*pts), style, marker="o", ms=3, color=colors[arm], label=f"{arm} ({overlap})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("world size W (ranks)")
        ax.set_ylabel(f"predicted {key}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"freescale simulate: {report['lengths']['origin']} on {report.get('profile', {}).get('name', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(report: dict[str, Any]) -> str:
    """One line per (W, arm, overlap): the four figures the issue asks for."""
    head = (
        f"{'W':>5} {'arm':12} {'overlap':7} {'straggler%':>10} {'exp_comm%':>9} {'bubble%':>8} "
        f"{'step ms':>9} {'samples/s':>11}"
    )
    lines = [head]
    for r in report["rows"]:
        lines.append(
            f"{r['world_size']:5d} {r['arm']:12} {r['overlap']:7} {r['straggler_pct']:10.2f} "
            f"{r['exposed_comm_pct']:9.2f} {r['bubble_pct']:8.2f} {1e3 * r['step_s']:9.2f} {r['samples_per_s']:11.1f}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``freescale simulate``: validate, load lengths, simulate, write JSON (+ PNG), print the table."""
    from freescale.pipeline.config import SampleConfig
    from freescale.trainer.simulate.sim_inputs import load_lengths
    from freescale.trainer.simulate.simulator import simulate

    config, profile = build_config(args)
    samples = SampleConfig(max_uih_len=args.max_uih_len, min_len=args.min_len)
    progress = not args.quiet and sys.stderr.isatty()  # bars redraw lines: only where someone watches
    source = load_lengths(args.lengths, samples=samples, verify=not args.no_verify, progress=progress)
    report = simulate(config, source, progress=progress)
    report["profile"] = {"name": profile.name, "path": profile.path, "description": profile.description}
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory")
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_plot:
        write_plot(report, out / PLOT_NAME)
        report["plot"] = PLOT_NAME
    (out / JSON_NAME).write_text(json.dumps(report, indent=1) + "\n")
    print(summary_table(report))
    jitter = report["jitter"]
    print(f"jitter sigma {jitter['sigma']:.4f} ({jitter['origin']}); cost: {report['cost']['origin']}")
    print(f"wrote {JSON_NAME}{'' if args.no_plot else ', ' + PLOT_NAME} to {out} ({report['runtime_s']:.1f} s)")
    return 0


__all__ = ["add_arguments", "build_config", "run", "summary_table", "write_plot"]
