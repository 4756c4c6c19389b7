"""Step-group planner benchmark: random batching vs within-step balancing vs our plan (docs/design.md#balancing).

Per-sample costs go through the cost model of a d = 256 HSTU (docs/design.md#cost-model; ``freescale.pipeline.cost``
when it is importable, else ``a·L² + b·L`` with a = 7·d·layers, b = 30·d²·layers + a small loss
term). Length shapes (``--shapes``):

* ``lognormal`` — the paper-like UIH lengths: lognormal, median 300, σ 1.2, capped at 21,000;
  524,288 samples.
* ``large_preset`` — the ``large`` preset's own users (``freescale generate --preset large``: 100,000
  users, lognormal median 120, σ 1.2, cap 21,000), drawn with ``freescale.datasets.synthetic``'s
  length sampler instead of generating 24.6M events; users under ``--min-len`` 2 dropped as
  ``prepare`` does. Only 12 step groups at G = 256, and its longest user costs more than a rank's
  share of the whole dataset there: the ``floor`` column is the least straggler_pct *any* plan can
  reach (``balance.report.straggler_floor_pct``).
* ``pareto`` — Pareto(α = 1.5) lengths from 50 (median ≈ 80), capped at 21,000 (the synthetic
  generator's ``length_dist = "pareto"``); 524,288 samples.

For each shape, mode and G (the largest world size planned for) the three strategies plan the same
costs in one run, k = 32 samples per micro-batch; the table shows the predicted ``straggler_pct``
side by side with ratios, the floor, the plan's ``imbalance``, ``max_over_lower_bound``, outlier
share (and the share in free-count outlier steps), ``composition_bias`` and the planner's runtime.
JSON goes to ``benchmarks/results/bench_balance.json``, a bar plot (log y) next to it.

Targets, one ``target_met`` per (shape, mode, G ∈ 8, 64, 256) at k = 32: our plan ≤ 1%
straggler_pct; marked ``feasible: false`` where the floor is above 1% (no plan can meet it). The
equal-count lognormal rows also keep the paper's random ≥ 50%. Free-count rows (k = the mean count,
budget k × mean cost; random = sequential packing by cost) are reported alongside.

    python benchmarks/bench_balance.py                       # G = 8, 64, 256; three shapes
    python benchmarks/bench_balance.py --modes equal_count --shapes pareto
    python benchmarks/bench_balance.py --small               # smoke run, no files unless --out
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from measure import Points

from freescale.pipeline.balance import BalanceConfig, plan_step_groups
from freescale.pipeline.balance.report import straggler_floor_pct

RESULTS = Path(__file__).resolve().parent / "results" / "bench_balance.json"
STRATEGIES = ("random", "within_step", "planned")
SHAPES = ("lognormal", "large_preset", "pareto")
TARGET_PLAN_PCT, TARGET_RANDOM_PCT, TARGET_GROUP_SIZES = 1.0, 50.0, (8, 64, 256)
# the quick model of docs/design.md#balancing (cost L² + 1280·L, 32 samples per rank): random / within-step / planned.
DESIGN_REFERENCE = {"8": [61, 46, 0], "64": [82, 79, 0], "256": [86, 84, 0]}


@dataclass
class Settings:
    """Benchmark shape; ``--small`` shrinks it for a smoke run."""

    group_sizes: list[int] = field(default_factory=lambda: [8, 64, 256])
    samples: int = 64 * 256 * 32  # 64 step groups at G = 256, k = 32
    micro_batch_size: int = 32
    modes: list[str] = field(default_factory=lambda: ["equal_count", "free_count"])
    shapes: list[str] = field(default_factory=lambda: list(SHAPES))
    median: float = 300.0
    sigma: float = 1.2
    cap: int = 21_000
    pareto_alpha: float = 1.5
    pareto_min: int = 50
    d_model: int = 256
    num_layers: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.group_sizes or min(self.group_sizes) < 1:
            raise ValueError(f"--group-sizes must be positive, got {self.group_sizes}")
        for name in ("samples", "micro_batch_size", "cap", "d_model", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        bad = set(self.modes) - {"equal_count", "free_count"}
        if bad or not self.modes:
            raise ValueError(f"--modes must be equal_count and/or free_count, got {self.modes}")
        if not self.shapes or set(self.shapes) - set(SHAPES):
            raise ValueError(f"--shapes must be among {', '.join(SHAPES)}, got {self.shapes}")


def cost_model(s: Settings) -> tuple[Any, dict[str, Any]]:
    """``cost(L)`` of one training step of a sample; the project's model when available."""
    try:
        from freescale.model_config import ModelConfig
        from freescale.pipeline.cost import CostModel

        model = CostModel.from_model(ModelConfig(d_model=s.d_model, num_layers=s.num_layers))
        return model.cost, {"source": "freescale.pipeline.cost", **model.to_dict()}
    except ImportError:  # the cost module is optional for this benchmark
        d, layers = s.d_model, s.num_layers
        a = 7.0 * d * layers  # attention fwd + bwd: 2·d·L² × (1 + 2.5)
        b = 30.0 * d * d * layers + 6.0 * d * 129  # projections fwd + bwd, plus a sampled-softmax term
        return (lambda lengths: a * lengths * lengths + b * lengths), {"source": "inline", "a": a, "b": b}


def make_lengths(s: Settings, shape: str) -> np.ndarray:
    """Lengths of one shape (see the module docstring); the preset and Pareto shapes come from the
    synthetic generator's own sampler, so they are the lengths ``freescale generate`` writes."""
    from freescale.datasets.generator_config import GeneratorConfig
    from freescale.datasets.presets import preset
    from freescale.datasets.synthetic import sample_lengths

    if shape == "lognormal":  # unchanged since the first version, so results stay comparable
        rng = np.random.default_rng(s.seed)
        lengths = np.minimum(np.exp(rng.normal(np.log(s.median), s.sigma, s.samples)), s.cap).round()
        return np.maximum(lengths, 1.0)
    if shape == "large_preset":
        lengths = sample_lengths(preset("large")).astype(np.float64)
        return lengths[lengths >= 2]  # prepare's default --min-len 2
    pareto = GeneratorConfig(
        seed=s.seed, n_users=s.samples, length_dist="pareto", pareto_alpha=s.pareto_alpha,
        pareto_min=s.pareto_min, max_len=s.cap,
    )  # fmt: skip
    return sample_lengths(pareto).astype(np.float64)


def make_costs(s: Settings, shape: str) -> tuple[np.ndarray, dict[str, Any]]:
    lengths = make_lengths(s, shape)
    cost, info = cost_model(s)
    info["lengths"] = {
        "samples": int(lengths.size),
        "mean": float(lengths.mean()),
        "p50": float(np.median(lengths)),
        "p99": float(np.quantile(lengths, 0.99)),
        "at_cap": int((lengths >= s.cap).sum()),
        "max": float(lengths.max()),
    }
    return np.asarray(cost(lengths), dtype=np.float64), info


def bench_one(costs: np.ndarray, s: Settings, g: int, mode: str) -> dict[str, Any]:
    """Plan the same costs with each strategy (alone, timed) and collect the metrics of docs/definitions.md."""
    row: dict[str, Any] = {"group_size": g, "mode": mode, "strategies": {}}
    row["straggler_pct_floor"] = round(straggler_floor_pct(costs, g), 4)
    for strategy in STRATEGIES:
        config = BalanceConfig(
            group_size=g,
            micro_batch_size=s.micro_batch_size,
            mode=mode,
            strategy=strategy,
            seed=s.seed,
            compare_baselines=False,
        )
        t0 = time.perf_counter()
        plan = plan_step_groups(costs, config)
        runtime = time.perf_counter() - t0
        rep = plan.report
        row["strategies"][strategy] = {
            "straggler_pct": rep["straggler_pct"]["plan"],
            "straggler_pct_by_world_size": rep["straggler_pct_by_world_size"],
            "imbalance": rep["imbalance"],
            "max_over_lower_bound": rep["max_over_lower_bound"],
            "composition_bias": rep["composition_bias"]["plan"],
            "outlier_fraction": rep["outlier_fraction"],
            "outlier_steps": rep["outlier_steps"],
            "free_count_outliers": rep["free_count_outliers"],
            "free_outliers_used": bool(rep["outlier_search"].get("free_outliers_used", False)),
            "n_step_groups": rep["n_step_groups"],
            "micro_batch_counts": rep["micro_batch_counts"],
            "algorithm_wins": rep["algorithm_wins"],
            "swaps": rep["swaps"],
            "leftover_samples": rep["leftover"]["samples"],
            "target_reached": rep["target_reached"],
            "runtime_s": round(runtime, 3),
        }
    st = row["strategies"]
    plan_pct = st["planned"]["straggler_pct"]
    row["ratios"] = {
        "random_over_plan": st["random"]["straggler_pct"] / max(plan_pct, 1e-9),
        "within_step_over_plan": st["within_step"]["straggler_pct"] / max(plan_pct, 1e-9),
        "within_step_over_random": st["within_step"]["straggler_pct"] / max(st["random"]["straggler_pct"], 1e-9),
    }
    row["pass"] = plan_pct <= TARGET_PLAN_PCT
    row["feasible"] = row["straggler_pct_floor"] <= TARGET_PLAN_PCT
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None
    headers = [
        "shape", "G", "mode", "steps", "random %", "within %", "plan %", "floor %", "random/plan",
        "within/plan", "imbalance max", "max/LB max", "outliers (free)", "KS plan/rand",
        "mb size within/plan (max)", "planner s", "target",
    ]  # fmt: skip
    table_rows = []
    for r in rows:
        st = r["strategies"]
        p = st["planned"]
        free = p["free_count_outliers"]["sample_share"]
        verdict = "pass" if r["pass"] else ("FAIL" if r["feasible"] else "infeasible")
        table_rows.append([
            r["shape"], str(r["group_size"]), r["mode"], str(p["n_step_groups"]),
            f"{st['random']['straggler_pct']:.2f}", f"{st['within_step']['straggler_pct']:.2f}",
            f"{p['straggler_pct']:.4f}", f"{r['straggler_pct_floor']:.2f}",
            f"{r['ratios']['random_over_plan']:.0f}x", f"{r['ratios']['within_step_over_plan']:.0f}x",
            f"{p['imbalance']['max']:.4f}", f"{p['max_over_lower_bound']['max']:.4f}",
            f"{100 * p['outlier_fraction']:.2f}% ({100 * free:.2f}%)",
            f"{p['composition_bias']:.3f}/{st['random']['composition_bias']:.3f}",
            f"{st['within_step']['micro_batch_counts']['mean']:.0f}/{p['micro_batch_counts']['mean']:.0f}"
            f" ({p['micro_batch_counts']['max']})",
            f"{p['runtime_s']:.2f}", verdict,
        ])  # fmt: skip
    if Console is not None:
        table = Table(title="predicted straggler_pct: random batching vs within-step balancing vs plan")
        for h in headers:
            table.add_column(h, justify="left" if h == "mode" else "right")
        for tr in table_rows:
            table.add_row(*tr)
        Console(width=240).print(table)
        return
    widths = [max(len(h), *(len(tr[i]) for tr in table_rows)) for i, h in enumerate(headers)]
    print(" ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for tr in table_rows:
        print(" ".join(c.rjust(w) for c, w in zip(tr, widths)))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r["mode"] for r in rows})
    shapes = [shape for shape in SHAPES if any(r["shape"] == shape for r in rows)]
    fig, axes = plt.subplots(len(shapes), len(modes), figsize=(6.5 * len(modes), 4.2 * len(shapes)), squeeze=False)
    colors = {"random": "#c0504d", "within_step": "#f0a30a", "planned": "#2e75b6"}
    panels = [(ax, shape, mode) for row_axes, shape in zip(axes, shapes) for ax, mode in zip(row_axes, modes)]
    for ax, shape, mode in panels:
        sel = [r for r in rows if r["mode"] == mode and r["shape"] == shape]
        x = np.arange(len(sel))
        width = 0.27
        for i, strategy in enumerate(STRATEGIES):
            vals = [max(r["strategies"][strategy]["straggler_pct"], 1e-4) for r in sel]
            bars = ax.bar(x + (i - 1) * width, vals, width, label=strategy, color=colors[strategy])
            for bar, v in zip(bars, vals):
                ax.annotate(f"{v:.3g}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom",
                            fontsize=7)  # fmt: skip
        ax.axhline(TARGET_PLAN_PCT, color="gray", linestyle="--", linewidth=0.8, label="plan target 1%")
        floors = np.array([r["straggler_pct_floor"] for r in sel])
        if (floors > 0).any():  # only where some sample outweighs a rank's share of the dataset
            ax.scatter((x + width)[floors > 0], floors[floors > 0], marker="_", s=300, color="black",
                       zorder=3, label="floor (any plan)")  # fmt: skip
        ax.set_yscale("log")
        ax.set_ylim(top=2e3)
        ax.set_xticks(x, [f"G = {r['group_size']}" for r in sel])
        ax.set_ylabel("predicted straggler_pct (%)")
        ax.set_title(f"{shape}, {mode}, k = {sel[0]['micro_batch_size']}")
        ax.legend(fontsize=7, loc="upper center", ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def small_settings() -> Settings:
    return Settings(group_sizes=[4, 16], samples=16 * 16 * 32)


def parse(argv: list[str] | None) -> tuple[Settings, Path | None]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="tiny shapes for a smoke run")
    p.add_argument("--group-sizes", type=lambda v: [int(x) for x in v.split(",")], help="e.g. 8,64,256")
    p.add_argument("--samples", type=int, help="number of samples (default 64 groups at G = 256)")
    p.add_argument("--micro-batch-size", type=int, help="k, samples per micro-batch (default 32)")
    p.add_argument("--modes", nargs="+", help="equal_count and/or free_count")
    p.add_argument("--shapes", nargs="+", help=f"length shapes among {', '.join(SHAPES)}")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", type=Path, help=f"JSON path (default {RESULTS}; none with --small)")
    a = p.parse_args(argv)
    s = small_settings() if a.small else Settings()
    for name in ("group_sizes", "samples", "micro_batch_size", "modes", "shapes", "seed"):
        if getattr(a, name) is not None:
            setattr(s, name, getattr(a, name))
    s.__post_init__()
    out = a.out if a.out is not None else (None if a.small else RESULTS)
    return s, out


def judge(rows: list[dict[str, Any]], failed: int = 0) -> dict[str, Any]:
    """One ``target_met`` per (shape, mode, G ∈ 8, 64, 256) at k = 32, plus the paper's random ≥ 50%
    on the equal-count lognormal rows; ``pass`` = every feasible target met and no point ``failed``."""
    judged = [r for r in rows if r["group_size"] in TARGET_GROUP_SIZES and r["micro_batch_size"] == 32]
    items = []
    for r in judged:
        items.append({
            "target": f"plan straggler_pct <= {TARGET_PLAN_PCT}%", "shape": r["shape"], "mode": r["mode"],
            "group_size": r["group_size"], "value": r["strategies"]["planned"]["straggler_pct"],
            "floor": r["straggler_pct_floor"], "feasible": r["feasible"], "target_met": r["pass"],
        })  # fmt: skip
        if r["shape"] == "lognormal" and r["mode"] == "equal_count":
            random_pct = r["strategies"]["random"]["straggler_pct"]
            items.append({
                "target": f"random straggler_pct >= {TARGET_RANDOM_PCT}%", "shape": r["shape"],
                "mode": r["mode"], "group_size": r["group_size"], "value": random_pct, "feasible": True,
                "target_met": random_pct >= TARGET_RANDOM_PCT,
            })  # fmt: skip
    feasible = [t for t in items if t["feasible"]]
    return {
        "group_sizes": list(TARGET_GROUP_SIZES),
        "plan_straggler_pct_max": TARGET_PLAN_PCT,
        "random_straggler_pct_min": TARGET_RANDOM_PCT,
        "evaluated": bool(items),
        "items": items,
        "met": sum(t["target_met"] for t in items),
        "infeasible": [f"{t['shape']}/{t['mode']}/G={t['group_size']}" for t in items if not t["feasible"]],
        "points_failed": failed,
        "pass": bool(feasible) and not failed and all(t["target_met"] for t in feasible),
    }


def balance_point(costs: np.ndarray, s: Settings, g: int, mode: str, shape: str) -> dict[str, Any]:
    """One row of the table: ``bench_one`` on a shape's costs, printed as it finishes."""
    row = bench_one(costs, s, g, mode)
    row.update(shape=shape, micro_batch_size=s.micro_batch_size)
    st = row["strategies"]
    pct = {k: v["straggler_pct"] for k, v in st.items()}
    print(
        f"{shape} G={g:>4} {mode}: random {pct['random']:.2f}%  within_step {pct['within_step']:.2f}%  "
        f"plan {pct['planned']:.4f}% (floor {row['straggler_pct_floor']:.2f}%, "
        f"{st['planned']['n_step_groups']} groups, planner {st['planned']['runtime_s']:.2f} s)",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    try:
        s, out = parse(argv)
    except ValueError as e:
        print(f"bench_balance: {e}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    cost_info: dict[str, Any] = {}

    def report() -> dict[str, Any]:
        return {
            "benchmark": "bench_balance",
            "environment": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
            },
            "settings": asdict(s),
            "cost_model": cost_info,
            "design_reference_pct": DESIGN_REFERENCE,
            "results": rows,
            "targets": judge(rows, len(recorder.failed)),
        }

    recorder = Points("bench_balance", out, report)
    for shape in s.shapes:
        costs, cost_info[shape] = make_costs(s, shape)
        info = cost_info[shape]
        print(f"{shape}: {costs.size:,} samples, cost model: {info['source']} (a={info['a']:.4g}, "
              f"b={info['b']:.4g}), lengths {info['lengths']}")  # fmt: skip
        for mode in s.modes:
            for g in s.group_sizes:
                recorder.run(f"{shape} G={g} {mode}", balance_point, costs, s, g, mode, shape, keep=rows.append)
    print_table(rows)
    targets = recorder.save(final=True)["targets"]
    verdict = "pass" if targets["pass"] else "FAIL"
    if not targets["evaluated"]:
        verdict = "not evaluated (needs G in 8, 64, 256 and k = 32)"
    print(f"targets (plan <= {TARGET_PLAN_PCT}% per shape/mode/G, random >= {TARGET_RANDOM_PCT}% on "
          f"equal-count lognormal): {targets['met']}/{len(targets['items'])} met; "
          f"infeasible (floor > 1%): {targets['infeasible'] or 'none'}; feasible ones: {verdict}")  # fmt: skip
    if out is not None:
        png = out.with_suffix(".png")
        plot(rows, png)
        print(f"wrote {out} and {png}")
    return 0 if (targets["pass"] or not targets["evaluated"]) and not recorder.failed else 1


if __name__ == "__main__":
    sys.exit(main())
