"""PNG plots of a ``freescale stats`` report, drawn from the report alone (so they match the JSON).

* ``lengths.png``    — UIH length histogram per source and merged, log–log, with p50/p90/p99;
* ``overlap.png``    — ``batch_overlap_rate`` per table over global batch sizes, W·k marked;
* ``popularity.png`` — item rank–frequency, log–log, with the fitted Zipf line;
* ``straggler.png``  — predicted ``straggler_pct`` per world size and batching strategy.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from freescale import storage

COLORS = {"random": "#d62728", "within_step": "#ff7f0e", "planned": "#2ca02c", "plan": "#1f77b4"}
PLOTS = {
    "length_histogram": "lengths.png",
    "overlap_rate_curve": "overlap.png",
    "popularity": "popularity.png",
    "straggler_bars": "straggler.png",
}


def _save(fig: Any, output: str, name: str) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    storage.write_bytes(storage.join(output, name), buffer.getvalue())
    return name


def _title(report: dict[str, Any]) -> str:
    sample = report["sample"]
    suffix = f", sample {sample['fraction']:g} of users" if sample["estimated"] else ""
    return f"{report['input']['dataset'] or report['input']['uri']} ({report['input']['kind']}{suffix})"


def plot_lengths(ax: Any, report: dict[str, Any]) -> None:
    lengths = report["lengths"]
    hist = lengths["histogram"]
    edges = np.asarray(hist["edges"], dtype=np.float64)
    merged = lengths["merged"]
    ax.stairs(
        np.asarray(hist["merged"], dtype=np.float64),
        edges,
        color="black",
        linewidth=2,
        label=f"merged ({merged['count']:,} samples)",
    )
    for name, counts in hist["by_source"].items():
        ax.stairs(
            np.asarray(counts, dtype=np.float64),
            edges,
            linewidth=1.2,
            label=f"{name} ({lengths['by_source'][name]['count']:,})",
        )
    for p, style in (("p50", ":"), ("p90", "--"), ("p99", "-.")):
        if merged["count"]:
            ax.axvline(max(merged[p], 1), color="gray", linestyle=style, linewidth=1, label=f"{p} = {merged[p]:,.0f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("UIH length (events per sample, log-spaced bins)")
    ax.set_ylabel("samples per bin")
    sp = report["sparsity"]["random"]
    if sp["sparsity"] is not None:
        _corner_note(
            ax,
            f"sparsity at B = {report['sparsity']['batch_size']}: {sp['sparsity']:.1%}\n"
            f"padded compute wasted: {sp['wasted_compute_pct']:.1f}%",
        )
    ax.legend(fontsize=8, loc="lower left")


def _corner_note(ax: Any, text: str) -> None:
    """A boxed note in the top-right corner of ``ax`` (figures that summarise the curve they sit on)."""
    ax.text(
        0.99,
        0.97,
        text,
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=9,
        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "lightgray"},
    )


def plot_overlap(ax: Any, report: dict[str, Any]) -> None:
    overlap = report["batch_overlap"]
    sizes = np.asarray(overlap["curve"]["global_batch_sizes"], dtype=np.float64)
    drawn = False
    for table, values in overlap["curve"]["tables"].items():
        rate = np.array([np.nan if v is None else v for v in values["batch_overlap_rate"]])
        err = np.array([0.0 if v is None else v for v in values["stderr"]])
        if np.isnan(rate).all():
            continue
        ax.errorbar(
            sizes,
            rate,
            yerr=err,
            marker="o",
            markersize=4,
            capsize=2,
            label=table,
            linewidth=2 if table == "item" else 1,
        )
        drawn = True
    for w, entry in overlap["by_world_size"].items():
        ax.axvline(entry["global_batch_size"], color="lightgray", linestyle="--", linewidth=1, zorder=0)
        ax.text(
            entry["global_batch_size"],
            0.01,
            f" W·k, W={w}",
            rotation=90,
            fontsize=7,
            ha="right",
            va="bottom",
            color="gray",
            transform=ax.get_xaxis_transform(),
        )
    head = overlap["headline"]
    item = head["tables"].get("item", {})
    if head["layout"] == "step_group" and item.get("batch_overlap_rate") is not None and head["global_batch_size"]:
        ax.plot(
            [head["global_batch_size"]],
            [item["batch_overlap_rate"]],
            marker="*",
            markersize=14,
            color="black",
            linestyle="none",
            label="item, the dataset's step groups",
        )
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel(f"global batch size (samples; {overlap['order']})")
    ax.set_ylabel("batch_overlap_rate (ids of batch n+1 also in batch n)")
    if drawn:
        ax.legend(fontsize=8, loc="best")
    else:
        ax.text(0.5, 0.5, "fewer than 2 full global batches at every size", transform=ax.transAxes, ha="center")


def plot_popularity(ax: Any, report: dict[str, Any]) -> None:
    pop = report["popularity"]
    rank = np.asarray(pop["rank_frequency"]["rank"], dtype=np.float64)
    freq = np.asarray(pop["rank_frequency"]["frequency"], dtype=np.float64)
    if rank.size:
        ax.step(
            rank,
            freq,
            where="post",
            color="black",
            linewidth=1.5,
            label=f"{pop['table']} ids ({pop['unique_ids']:,} unique, {pop['occurrences']:,} occurrences)",
        )
    if pop.get("zipf_exponent") is not None:
        lo, hi = pop["fit_ranks"]
        r = np.geomspace(lo, hi, 50)
        ax.plot(
            r,
            10 ** pop["intercept"] * r ** -pop["zipf_exponent"],
            color="#d62728",
            linestyle="--",
            linewidth=2,
            label=f"Zipf fit s = {pop['zipf_exponent']:.3f} ± {pop['stderr']:.3f} (ranks {lo}–{hi:,})",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rank (most frequent first)")
    ax.set_ylabel("occurrences")
    shares = pop.get("top_share", {})
    if shares:
        _corner_note(
            ax,
            "\n".join(
                f"{k.replace('top_', 'top ').replace('pct', '%')} of ids: {v:.1%} of events" for k, v in shares.items()
            ),
        )
    ax.legend(fontsize=8, loc="lower left")


def plot_straggler(ax: Any, report: dict[str, Any]) -> None:
    from freescale.pipeline.stats.report import fillable_world_sizes

    st = report["straggler"]
    filled = fillable_world_sizes(st)[0]
    worlds = [str(w) for w in (filled or st["world_sizes"])]  # sizes the data cannot fill: no bars of n/a
    strategies = st["strategies"]
    width = 0.8 / len(strategies)
    x = np.arange(len(worlds))
    top = 1.0
    for i, name in enumerate(strategies):
        values = [st["by_world_size"][w][name].get("straggler_pct") for w in worlds]
        heights = [np.nan if v is None else v for v in values]
        bars = ax.bar(x + (i - (len(strategies) - 1) / 2) * width, heights, width, color=COLORS.get(name), label=name)
        for bar, v in zip(bars, values):
            label = "n/a" if v is None else f"{v:.1f}%" if v >= 0.1 else f"{v:.2f}%"
            ax.text(
                bar.get_x() + bar.get_width() / 2, 0 if v is None else v, label, ha="center", va="bottom", fontsize=7
            )
        top = max([top, *[v for v in values if v is not None]])
    labels = []
    for w in worlds:
        steps = [e.get("steps") for e in st["by_world_size"][w].values() if e.get("steps")]
        labels.append(f"W = {w}\n({max(steps):,} steps)" if steps else f"W = {w}\n(< 1 step of W·k)")
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.5, len(worlds) - 0.5)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel(f"predicted straggler_pct (k = {st['micro_batch_size']} samples per rank)")
    ax.legend(fontsize=8)


def _light_log_ticks(ax: Any) -> None:
    """No minor ticks on a log axis that spans more than one decade of its base.

    There they are unlabelled marks (matplotlib's ``LogFormatter`` labels minor ticks only on axes
    spanning at most ``minor_thresholds[0]`` = 1 decade), yet each is a ``Tick`` of five artists laid
    out at every draw: a third of the drawing time of the four plots. A narrower log axis keeps them,
    as its values are read from their labels. Major ticks, labels and grid are unchanged.
    """
    from matplotlib.ticker import NullLocator

    for axis, (low, high) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        low, high = min(low, high), max(low, high)
        if axis.get_scale() == "log" and low > 0 and math.log(high / low, axis.get_transform().base) > 1:
            axis.set_minor_locator(NullLocator())


DRAWN_BY = {
    "length_histogram": (plot_lengths, "UIH length distribution"),
    "overlap_rate_curve": (plot_overlap, "batch_overlap_rate vs global batch size"),
    "popularity": (plot_popularity, "item popularity"),
    "straggler_bars": (plot_straggler, "predicted straggler_pct"),
}


def draw_plot(report: dict[str, Any], output: str, key: str) -> str:
    """Draw one plot (``PLOTS[key]``) under ``output``; returns its name. A figure with its own Agg
    canvas (no pyplot state), so any process can draw any plot: ``write_plots`` spreads them."""
    from freescale.pipeline.executors.processes import imports_without_gc

    with imports_without_gc():
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

    draw, title = DRAWN_BY[key]
    fig = Figure(figsize=(8, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.97, top=0.92, bottom=0.14)
    draw(ax, report)
    # y=1.0 as matplotlib would place it (no axis decorations above these plots): a title at an
    # automatic height makes every draw lay out all tick labels once more to find it
    ax.set_title(f"{title} — {_title(report)}", fontsize=10, y=1.0)
    ax.grid(True, which="major", alpha=0.3)
    _light_log_ticks(ax)
    return _save(fig, output, PLOTS[key])


def write_plots(
    report: dict[str, Any], output: str, run: Callable[[list[tuple[Callable, tuple]]], list[Any]] | None = None
) -> dict[str, str]:
    """Draw the four plots under ``output`` (local directory or ``s3://`` prefix); returns their names.

    ``run``: runs ``(fn, args)`` calls in several processes at once (``stats`` passes its local job's
    executor, whose worker idles once the report is built): each process imports matplotlib (~0.3 s)
    and draws a share of the plots. On ``large`` the plots took 0.83 s in the driver alone and 0.62 s
    on the driver and the worker; ``None`` draws them here, one after the other."""
    calls = [(draw_plot, (report, output, key)) for key in PLOTS]
    names = run(calls) if run is not None else [fn(*args) for fn, args in calls]
    return dict(zip(PLOTS, names))
