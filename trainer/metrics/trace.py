"""Chrome/Perfetto trace and a PNG timeline of a few steps for all ranks.

Open ``trace.json`` in https://ui.perfetto.dev or chrome://tracing: one process per rank; thread 0
holds steps and their stages (compute / comm / data), thread 1 the blocking collective waits, each
split into "idle" (before the slowest rank arrived: straggler bubble) and the exposed communication
after it. ``timeline.png`` draws the same for ``logging.timeline_steps`` steps, so a straggler bubble
is visible as red at the same wall-clock moment on every fast rank.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from freescale.trainer.metrics.bubbles import max_launches
from freescale.trainer.metrics.instrument import StepRecord

COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "data": "#8C8C8C", "idle": "#C44E52"}


def _by_step(records_by_rank: list[list[StepRecord]]) -> dict[int, list[StepRecord]]:
    steps: dict[int, list[StepRecord]] = {}
    for rank_records in records_by_rank:
        for record in rank_records:
            steps.setdefault(record.step, []).append(record)
    return steps


def wait_segments(records: list[StepRecord]) -> list[tuple[int, str, float, float, str]]:
    """(rank, "idle" | collective name, start, end, collective) pieces of every blocking wait of one step."""
    max_launch = max_launches(records)
    pieces = []
    for record in records:
        for i, comm in enumerate(record.comms):
            split = comm.wait_start
            if i < len(max_launch):
                split = min(comm.wait_end, max(comm.wait_start, max_launch[i]))
            if split > comm.wait_start:
                pieces.append((record.rank, "idle", comm.wait_start, split, comm.name))
            if comm.wait_end > split:
                pieces.append((record.rank, comm.name, split, comm.wait_end, comm.name))
    return pieces


def chrome_trace(records_by_rank: list[list[StepRecord]], max_steps: int) -> dict[str, Any]:
    """Trace events (µs) for the first ``max_steps`` steps."""
    steps = _by_step(records_by_rank)
    chosen = sorted(steps)[:max_steps]
    if not chosen:
        return {"traceEvents": []}
    origin = min(r.start for s in chosen for r in steps[s])
    events: list[dict[str, Any]] = []

    def span(name: str, cat: str, rank: int, tid: int, start: float, end: float, **args: Any) -> None:
        events.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "pid": rank,
                "tid": tid,
                "ts": (start - origin) * 1e6,
                "dur": max(0.0, end - start) * 1e6,
                "args": args,
            }
        )

    for step in chosen:
        for record in steps[step]:
            span(
                f"step {step}",
                "step",
                record.rank,
                0,
                record.start,
                record.end,
                loss=record.loss,
                samples=record.samples,
                cost=record.cost,
            )
            for stage in record.stages:
                span(stage.name, stage.kind, record.rank, 0, stage.start, stage.end, step=step)
        for rank, name, start, end, collective in wait_segments(steps[step]):
            span(name, "idle" if name == "idle" else "comm", rank, 1, start, end, step=step, collective=collective)
    for rank in range(len(records_by_rank)):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "stages"}})
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": 1, "args": {"name": "collective waits"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: Path, records_by_rank: list[list[StepRecord]], max_steps: int) -> None:
    path.write_text(json.dumps(chrome_trace(records_by_rank, max_steps)))


def plot_timeline(
    path: Path, records_by_rank: list[list[StepRecord]], first_step: int, num_steps: int, title: str = ""
) -> bool:
    """Draw ``num_steps`` steps from ``first_step`` for all ranks; False when nothing to draw.

    Draws on a bare ``Figure`` (the Agg canvas; pyplot is not imported) with one ``broken_barh``
    per rank and bar, and the step starts as one ``vlines``: one collection per bar instead of one per
    span keeps the drawing well under a second, once at the end of every run."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    steps = _by_step(records_by_rank)
    chosen = [s for s in sorted(steps) if s >= first_step][:num_steps]
    if not chosen or num_steps == 0:
        return False
    origin = min(r.start for s in chosen for r in steps[s])
    world = len(records_by_rank)
    stage_bars: dict[int, tuple[list, list]] = {y: ([], []) for y in range(world)}  # y: (xranges, colors)
    wait_bars: dict[int, tuple[list, list]] = {y: ([], []) for y in range(world)}
    starts = []
    for step in chosen:
        for record in steps[step]:
            spans, colors = stage_bars[world - 1 - record.rank]
            for stage in record.stages:
                spans.append(((stage.start - origin) * 1e3, (stage.end - stage.start) * 1e3))
                colors.append(COLORS[stage.kind])
            starts.append((record.start - origin) * 1e3)
        for rank, name, start, end, _ in wait_segments(steps[step]):
            spans, colors = wait_bars[world - 1 - rank]
            spans.append(((start - origin) * 1e3, (end - start) * 1e3))
            colors.append(COLORS["idle" if name == "idle" else "comm"])
    fig = Figure(figsize=(12, 1.0 + 0.9 * world))
    ax = fig.subplots()
    for y, (spans, colors) in stage_bars.items():
        if spans:
            ax.broken_barh(spans, (y + 0.45, 0.4), facecolors=colors, edgecolor="white", linewidth=0.3)
    for y, (spans, colors) in wait_bars.items():
        if spans:
            ax.broken_barh(spans, (y + 0.05, 0.35), facecolors=colors)
    ax.vlines(starts, 0, 1, transform=ax.get_xaxis_transform(), color="black", linewidth=0.4, alpha=0.3)
    ax.set_yticks([world - 1 - r + 0.45 for r in range(world)], [f"rank {r}" for r in range(world)])
    ax.set_xlabel("ms (upper bar: stages; lower bar: blocking collective waits)")
    ax.set_title(title or f"steps {chosen[0]}–{chosen[-1]}")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="upper right", ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True
