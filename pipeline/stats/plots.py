"""PNG plots of a ``freescale stats`` report, drawn from the report alone (so they match the JSON).

* ``lengths.png``    — UIH length histogram per source and merged, log–log, with p50/p90/p99;
* ``overlap.png``    — ``batch_overlap_rate`` per table over global batch sizes, W·k marked;
* ``popularity.png`` — item rank–frequency, log–log, with the fitted Zipf line;
* ``straggler.png``  — predicted ``straggler_pct`` per world size and batching strategy.
"""

from __future__ import annotations

import io
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


def write_plots(report: dict[str, Any], output: str, keys: list[str] | None = None) -> dict[str, str]:
    """Draw the plots named ``keys`` (default: all four) under ``output`` (local directory or
    ``s3://`` prefix); returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = {}
    for key, (draw, title) in {
        "length_histogram": (plot_lengths, "UIH length distribution"),
        "overlap_rate_curve": (plot_overlap, "batch_overlap_rate vs global batch size"),
        "popularity": (plot_popularity, "item popularity"),
        "straggler_bars": (plot_straggler, "predicted straggler_pct"),
    }.items():
        if keys is not None and key not in keys:
            continue
        fig, ax = plt.subplots(figsize=(8, 5))
        fig.subplots_adjust(left=0.1, right=0.97, top=0.92, bottom=0.14)
        try:
            draw(ax, report)
            ax.set_title(f"{title} — {_title(report)}", fontsize=10)
            ax.grid(True, which="major", alpha=0.3)
            written[key] = _save(fig, output, PLOTS[key])
        finally:
            plt.close(fig)
    return written


class PlotProcesses:
    """Draws the plots in helper processes that start with the run: they import matplotlib (~0.4
    core-s each) at low priority while the scan runs, then each draws its share of the plots once
    the report exists. Drawn in the driver after the figures, import and drawing (~1.2 s on one
    core on ``large``) were serial wall time that ``prepare`` does not pay.

    Helpers write PNGs to a local temporary directory; ``draw`` copies them under ``output``
    (local or ``s3://``) with ``storage``, so the bytes match ``write_plots``'."""

    def __init__(self, processes: int = 2) -> None:
        import subprocess
        import sys
        import tempfile

        self._dir = tempfile.mkdtemp(prefix="freescale-plots-")
        keys = list(PLOTS)
        shares = [keys[i::processes] for i in range(processes)]
        self._procs = [
            subprocess.Popen(
                # this file as a script: ``-m`` would import the whole ``stats`` package first
                [sys.executable, __file__, self._dir, *share],
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for share in shares
            if share
        ]

    def draw(self, report: dict[str, Any], output: str) -> dict[str, str]:
        """Hand ``report`` to the helpers, wait for them and publish the PNGs; names as ``write_plots``."""
        import json

        payload = json.dumps(report).encode()
        failures = []
        for proc in self._procs:
            try:
                proc.stdin.write(payload)
                proc.stdin.close()
            except BrokenPipeError:  # it died early: its exit status and stderr say why
                pass
        for proc in self._procs:
            err = proc.stderr.read().decode(errors="replace")
            if proc.wait() != 0:
                failures.append(err.strip().splitlines()[-1] if err.strip() else f"exit status {proc.returncode}")
        if failures:
            raise RuntimeError(f"drawing the plots failed: {failures[0]}")
        written = {}
        for key, name in PLOTS.items():
            with open(f"{self._dir}/{name}", "rb") as png:
                storage.write_bytes(storage.join(output, name), png.read())
            written[key] = name
        return written

    def close(self) -> None:
        """Stop helpers still running (the run failed before ``draw``) and remove their files."""
        import shutil

        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stderr):
                if stream is not None and not stream.closed:
                    stream.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _helper_main(argv: list[str]) -> None:
    """A ``PlotProcesses`` helper: import matplotlib at low priority, read the report from stdin,
    draw the plots named in ``argv[1:]`` under the local directory ``argv[0]``."""
    import json
    import os
    import sys

    os.nice(10)  # its imports run in the scan's idle moments, not in place of the scan
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    report = json.loads(sys.stdin.buffer.read())
    write_plots(report, argv[0], argv[1:])


if __name__ == "__main__":
    import sys

    _helper_main(sys.argv[1:])
