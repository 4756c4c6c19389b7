"""bench_bubbles' report: the targets and comparisons judged from a finished report's pooled rows
(``comparisons``), the table it prints (``table``), its PNG (``plot``, ``time_bars``) and ``publish``, which
prints the one and writes the other. A row is ``bench_bubbles.pool``'s (one per engine/variant); bench_online
shares ``time_bars`` and ``publish``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

TARGET_REDUCTION_PCT = 80.0
TARGET_OURS_OVER_TORCHREC = 1.0  # samples/s on planned data (issue 15)
TARGET_DATA_PCT = 2.0  # ours: the rank's wait for its next batch, % of step time, random and planned (issue 18)


def comparisons(report: dict[str, Any]) -> dict[str, Any]:
    by = {r["run"]: r for r in report["runs"]}
    out: dict[str, Any] = {}
    for engine in ("freescale", "torchrec"):
        random, planned = by.get(f"{engine}/random"), by.get(f"{engine}/planned")
        if random and planned and random["straggler_pct"] > 0:
            out[f"{engine}_straggler_reduction_pct"] = 100.0 * (1 - planned["straggler_pct"] / random["straggler_pct"])
            out[f"{engine}_speedup_planned_vs_random"] = planned["samples_per_s"] / random["samples_per_s"]
    ours, theirs = by.get("freescale/planned"), by.get("torchrec/planned")
    if ours and theirs:
        out["samples_per_s_ours_over_torchrec"] = ours["samples_per_s"] / theirs["samples_per_s"]
        out["exposed_comm_pct_ours_minus_torchrec"] = ours["exposed_comm_pct"] - theirs["exposed_comm_pct"]
    floor = by.get("freescale/identical")
    if floor:
        out["noise_floor_straggler_pct"] = floor["straggler_pct"]
        random = by.get("freescale/random")
        if random and random["straggler_pct"] > 0:
            out["best_possible_reduction_pct"] = 100.0 * (1 - floor["straggler_pct"] / random["straggler_pct"])
    reduction = out.get("freescale_straggler_reduction_pct")
    ratio = out.get("samples_per_s_ours_over_torchrec")
    data = [by[f"freescale/{variant}"]["data_pct"] for variant in ("random", "planned") if f"freescale/{variant}" in by]
    out["targets"] = {
        "straggler_reduction": {
            "target": f"straggler_pct reduction >= {TARGET_REDUCTION_PCT:.0f}% (ours, planned vs random)",
            "target_met": reduction is not None and reduction >= TARGET_REDUCTION_PCT,
        },
        "ours_vs_torchrec": {
            "target": f"samples/s on planned data >= {TARGET_OURS_OVER_TORCHREC:.2f}x TorchRec's",
            "target_met": ratio is not None and ratio >= TARGET_OURS_OVER_TORCHREC,
        },
        "data_share": {
            "target": f"data_pct <= {TARGET_DATA_PCT:.0f}% of step time (ours, random and planned data)",
            "target_met": len(data) == 2 and max(data) <= TARGET_DATA_PCT,
        },
    }
    out["target"] = "; ".join(t["target"] for t in out["targets"].values())
    out["target_met"] = all(t["target_met"] for t in out["targets"].values())
    return out


def table(report: dict[str, Any]) -> str:
    header = (
        f"{'run':20} {'ms/step':>8} {'samples/s':>10} {'compute%':>9} {'data%':>6} {'exp_comm%':>10} "
        f"{'straggler%':>11} {'(median)':>9} {'bubble%':>8} {'predicted':>10}"
    )
    lines = [header]
    for r in report["runs"]:
        predicted = r["predicted_straggler_pct_w2"]
        lines.append(
            f"{r['run']:20} {r['step_ms']:8.1f} {r['samples_per_s']:10.1f} {r['compute_pct']:9.1f} "
            f"{r['data_pct']:6.1f} {r['exposed_comm_pct']:10.1f} {r['straggler_pct']:11.1f} "
            f"{r['median_step_straggler_pct']:9.1f} {r['bubble_pct']:8.1f} "
            f"{predicted if predicted is not None else float('nan'):10.1f}"
        )
    lines.append("")
    lines.extend(
        f"{r['run']}: straggler_pct by repeat {', '.join(f'{x:.1f}' for x in r['straggler_pct_by_repeat'])}"
        for r in report["runs"]
    )
    lines.append("")
    lines.extend(
        f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}"
        for key, value in report["comparisons"].items()
        if key != "targets"
    )
    return "\n".join(lines)


def time_bars(axis: Any, runs: list[dict[str, Any]]) -> None:
    """Stacked compute / data / exposed comm / straggler shares of step time, one bar per run."""
    names = [r["run"] for r in runs]
    bottom = np.zeros(len(runs))
    for part, color in (
        ("compute_pct", "#4C72B0"),
        ("data_pct", "#8C8C8C"),
        ("exposed_comm_pct", "#DD8452"),
        ("straggler_pct", "#C44E52"),
    ):
        values = np.array([r[part] for r in runs])
        axis.bar(names, values, bottom=bottom, color=color, label=part.removesuffix("_pct"))
        bottom += values


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    time_bars(left, runs)
    left.set_ylabel("% of step wall time (time-weighted, 2 ranks)")
    left.set_title("where the time goes")
    left.set_ylim(0, 118)  # room above the bars for a one-row legend
    left.legend(fontsize=8, ncol=4, loc="upper center")
    left.tick_params(axis="x", labelrotation=15)
    for r in runs:
        right.plot(r["per_step"]["straggler_pct"], label=r["run"], linewidth=1)
    right.set_xlabel("step (after warm-up)")
    right.set_ylabel("straggler_pct")
    right.set_title("measured straggler_pct per step")
    right.legend(fontsize=8)
    fig.suptitle(
        f"bench_bubbles: 2 CPU ranks × 1 thread, {report['steps_per_run']} steps per run × {report['repeats']} repeats"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def publish(report: dict[str, Any], out: Path | None, table: Any, plot: Any) -> int:
    """Print ``table(report)``; with ``out`` (the JSON is already there: ``Points``), ``plot`` it
    beside as PNG. Returns the exit status: 1 when some point failed for good. Shared with bench_online."""
    print(table(report))
    if out is not None:
        plot(report, out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}")
    return 1 if report["points_failed"] else 0
