"""Turn gathered step records into ``straggler_pct``, ``exposed_comm_pct`` and ``bubble_pct``
(docs/design.md#definitions).

For collective ``i`` of step ``s`` every rank recorded its arrival (launch) and the interval it
blocked waiting. The collective cannot complete before the slowest rank arrives, so for rank ``r``

    idle_r  = max(0, min(wait_end_r, max_r' launch_r') - wait_start_r)   (waiting for stragglers)
    comm_r  = (wait_end_r - wait_start_r) - idle_r                        (exposed communication)

and, from the rank's contiguous stages, ``data`` (loader) and ``compute`` = stage time - data - all
waits (forward, backward, optimizer, local lookup, bucketing). The parts add up to the stage total;
``untimed`` = wall - stage total is what no stage covers. Our engine's stages tile the step
(``StepTimer.stage`` is contiguous), so there it is zero by construction and the test checks the
split instead: no part negative, waits inside stages, parts = wall within 5%.

Per step: ``straggler_pct`` = mean over ranks of idle_r / wall_r, ``exposed_comm_pct`` likewise for
comm_r, ``bubble_pct`` their sum. Run summaries are time-weighted (Σ idle / Σ wall over ranks and
steps) and leave out the first ``skip_steps`` warm-up steps.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from freescale.trainer.metrics.instrument import StepRecord
from freescale.trainer.metrics.zch import summarize_zch, zch_step_metrics

PARTS = ("compute", "data", "comm", "idle", "untimed")


@dataclass
class RankStep:
    """One rank's step split into parts (seconds)."""

    step: int
    rank: int
    wall: float
    compute: float
    data: float
    comm: float
    idle: float
    untimed: float
    samples: int
    loss: float
    cost: float
    stages: dict[str, float]
    positions: int = 0  # targets trained on (0: an empty micro-batch, its loss means nothing)
    comm_by_name: dict[str, float] = field(default_factory=dict)  # exposed comm seconds per collective name
    idle_by_name: dict[str, float] = field(default_factory=dict)  # seconds waiting for other ranks, per name
    extra: dict[str, float] = field(default_factory=dict)  # the engine's counters (StepRecord.extra)

    def parts_total(self) -> float:
        return self.compute + self.data + self.comm + self.idle + self.untimed

    def parts(self) -> dict[str, float]:
        """Seconds per part plus wall, step and rank (``bubbles.json`` → ``rank_steps``)."""
        return {
            "step": self.step,
            "rank": self.rank,
            "wall": self.wall,
            **{part: getattr(self, part) for part in PARTS},
            "stages": self.stages,
            "comm_by_name": self.comm_by_name,
        }


def max_launches(records: list[StepRecord]) -> list[float]:
    """Latest arrival per collective ordinal over ranks (ranks issue the same collectives in order)."""
    count = min(len(r.comms) for r in records)
    return [max(r.comms[i].launch for r in records) for i in range(count)]


def split_rank_step(record: StepRecord, max_launch: list[float]) -> RankStep:
    """Split one rank's step into compute / data / comm / idle / untimed."""
    waits = idle = 0.0
    comm_by_name: dict[str, float] = defaultdict(float)
    idle_by_name: dict[str, float] = defaultdict(float)
    for i, comm in enumerate(record.comms):
        blocked = max(0.0, comm.wait_end - comm.wait_start)
        waits += blocked
        waited_for_others = 0.0
        if i < len(max_launch):
            waited_for_others = min(blocked, max(0.0, min(comm.wait_end, max_launch[i]) - comm.wait_start))
        idle += waited_for_others
        comm_by_name[comm.name] += blocked - waited_for_others
        idle_by_name[comm.name] += waited_for_others
    stages: dict[str, float] = defaultdict(float)
    data = 0.0
    for span in record.stages:
        stages[span.name] += span.end - span.start
        if span.kind == "data":
            data += span.end - span.start
    staged = sum(stages.values())
    wall = record.end - record.start
    return RankStep(
        step=record.step,
        rank=record.rank,
        wall=wall,
        compute=staged - data - waits,
        data=data,
        comm=waits - idle,
        idle=idle,
        untimed=wall - staged,
        samples=record.samples,
        loss=record.loss,
        cost=record.cost,
        stages=dict(stages),
        positions=record.positions,
        comm_by_name=dict(comm_by_name),
        idle_by_name=dict(idle_by_name),
        extra=dict(record.extra),
    )


def analyze(records_by_rank: list[list[StepRecord]]) -> list[list[RankStep]]:
    """Per step (in step order), the ``RankStep`` of every rank."""
    by_step: dict[int, list[StepRecord]] = defaultdict(list)
    for rank_records in records_by_rank:
        for record in rank_records:
            by_step[record.step].append(record)
    steps = []
    for step in sorted(by_step):
        records = sorted(by_step[step], key=lambda r: r.rank)
        max_launch = max_launches(records)
        steps.append([split_rank_step(r, max_launch) for r in records])
    return steps


DENSE_COMM = "gradient_comm.dense"


def is_prefetch_wait(name: str) -> bool:
    """Waits on work the PEC engine started one step ahead (NOL rows, routing, deferred gradients)."""
    return "nol" in name or "prefetch" in name


def embedding_comm_metrics(ranks: list[RankStep]) -> dict[str, Any]:
    """Exposed embedding communication of one step (mean over ranks), split OL / NOL, and PEC's counters.

    Everything but the dense all-reduce counts as embedding communication: the id and row
    all-to-alls, the embedding gradients, and (PEC) the waits on prefetched work, which form the NOL
    part. ``nol_hidden_pct`` compares the NOL waits with the time the PEC worker spent in collectives;
    ``batch_overlap_rate`` per table is Σ distinct OL rows / Σ distinct next-batch rows over owners.
    """
    world = len(ranks)
    nol = sum(v for r in ranks for n, v in r.comm_by_name.items() if n != DENSE_COMM and is_prefetch_wait(n)) / world
    ol = sum(v for r in ranks for n, v in r.comm_by_name.items() if n != DENSE_COMM and not is_prefetch_wait(n)) / world
    walls = [r.wall for r in ranks if r.wall > 0]
    out: dict[str, Any] = {
        "embedding_comm_ms": 1000.0 * (ol + nol),
        "embedding_comm_ol_ms": 1000.0 * ol,
        "embedding_comm_nol_ms": 1000.0 * nol,
        "embedding_comm_pct": 100.0 * (ol + nol) / (sum(walls) / len(walls)) if walls else 0.0,
    }
    prefetch = sum(r.extra.get("prefetch_comm_s", 0.0) for r in ranks) / world
    if prefetch > 0:
        out["prefetch_comm_ms"] = 1000.0 * prefetch
        out["nol_hidden_pct"] = 100.0 * max(0.0, 1.0 - nol / prefetch)
    tables = sorted({key.split(".", 1)[1] for r in ranks for key in r.extra if key.startswith("next_unique.")})
    rates = {}
    for table in tables:
        total = sum(r.extra.get(f"next_unique.{table}", 0.0) for r in ranks)
        rates[table] = sum(r.extra.get(f"ol_unique.{table}", 0.0) for r in ranks) / total if total else 0.0
    if rates:
        out["batch_overlap_rate"] = rates
    return out


BALANCER_PARTS = ("exchange", "placement", "dispatch", "combine")


def balancer_metrics(ranks: list[RankStep]) -> dict[str, Any]:
    """The online balancer's per-step fields (``engine.balancer = "online"``; none otherwise).

    Overheads are the mean over ranks of each part's milliseconds *less the time its collective
    waited for slower ranks* (``balancer_wait_ms``): that wait is straggling the step has anyway —
    without the balancer it would be spent at the next collective — and ``straggler_pct`` counts it.
    So a part's overhead is the balancer's own compute plus its exposed communication. The
    imbalances (max / mean rank cost under the cost model, home vs balanced placement) are the same
    on every rank; ``moved`` counts the samples computed away from home.
    """
    if not any("balancer.imbalance_before" in r.extra for r in ranks):
        return {}
    world = len(ranks)
    out: dict[str, Any] = {}
    for part in BALANCER_PARTS:
        elapsed = sum(r.extra.get(f"balancer.{part}_ms", 0.0) for r in ranks) / world
        waited = 1000.0 * sum(r.idle_by_name.get(f"balancer.{part}", 0.0) for r in ranks) / world
        out[f"balancer_{part}_ms"] = max(0.0, elapsed - waited)
    out["balancer_wait_ms"] = 1000.0 * sum(v for r in ranks for n, v in r.idle_by_name.items()
                                           if n.startswith("balancer.")) / world  # fmt: skip
    out["balancer_imbalance_before"] = ranks[0].extra["balancer.imbalance_before"]
    out["balancer_imbalance_after"] = ranks[0].extra["balancer.imbalance_after"]
    out["balancer_moved"] = int(sum(r.extra.get("balancer.moved", 0.0) for r in ranks))
    return out


def summarize_balancer(steps: list[list[RankStep]]) -> dict[str, Any]:
    """``{"balancer": means over steps of balancer_metrics}`` for online-balanced runs, else ``{}``."""
    per_step = [m for m in (balancer_metrics(ranks) for ranks in steps) if m]
    if not per_step:
        return {}
    return {"balancer": {key: sum(m[key] for m in per_step) / len(per_step) for key in per_step[0]}}


def step_loss(ranks: list[RankStep]) -> dict[str, Any]:
    """The step's loss: the mean over ranks that had targets. Why: a micro-batch without targets
    (tail step groups of two-event samples) reports loss 0.0 without training; counted in, it pulls
    the mean down, and a step where no rank had one is ``empty`` (loss null), not a perfect 0.0."""
    trained = [r.loss for r in ranks if r.positions > 0]
    line: dict[str, Any] = {"loss": sum(trained) / len(trained) if trained else None}
    if not trained:
        line["empty"] = True
    if any(r.extra.get("nonfinite") for r in ranks):  # NaN is not JSON; the step trained nothing
        line["loss"], line["nonfinite_skipped"] = None, True
    return line


def rank_losses(ranks: list[RankStep]) -> list[float | None]:
    """Each rank's own loss (None: no targets, or not finite). Why keep them beside the mean: rank r of
    a W-rank run reads at step 0 the micro-batch rank r of any other world size reads, from the same
    initial state, so step 0's per-rank losses must agree across world sizes and transports."""
    return [r.loss if r.positions > 0 and math.isfinite(r.loss) else None for r in ranks]


def step_metrics(ranks: list[RankStep]) -> dict[str, Any]:
    """The per-step JSONL fields for one step (all ranks)."""

    def pct(part: str) -> float:
        return 100.0 * sum(getattr(r, part) / r.wall for r in ranks if r.wall > 0) / len(ranks)

    wall = max(r.wall for r in ranks)
    costs = [r.cost for r in ranks]
    mean_cost = sum(costs) / len(costs)
    straggler, comm = pct("idle"), pct("comm")
    return {
        "step": ranks[0].step,
        **step_loss(ranks),
        "rank_loss": rank_losses(ranks),
        "samples": sum(r.samples for r in ranks),
        "step_ms": 1000.0 * wall,
        "samples_per_s": sum(r.samples for r in ranks) / wall if wall > 0 else 0.0,
        "straggler_pct": straggler,
        "exposed_comm_pct": comm,
        "bubble_pct": straggler + comm,
        "compute_pct": pct("compute"),
        "data_pct": pct("data"),
        "untimed_pct": pct("untimed"),
        "imbalance": max(costs) / mean_cost if mean_cost > 0 else 1.0,
        "rank_ms": [1000.0 * r.wall for r in ranks],
        "rank_idle_ms": [1000.0 * r.idle for r in ranks],
        **embedding_comm_metrics(ranks),
        **balancer_metrics(ranks),
        **zch_step_metrics([r.extra for r in ranks]),
    }


def summarize(steps: list[list[RankStep]], skip_steps: int = 0) -> dict[str, Any]:
    """Time-weighted run summary, per rank and overall, without the first ``skip_steps`` steps."""
    kept = steps[skip_steps:] if len(steps) > skip_steps else steps
    if not kept:
        return {"steps": 0}
    world = len(kept[0])
    per_rank = [_totals([s[r] for s in kept if r < len(s)]) for r in range(world)]
    overall = _totals([rank_step for s in kept for rank_step in s])
    step_walls = [max(r.wall for r in s) for s in kept]
    samples = sum(r.samples for s in kept for r in s)
    stage_ms: dict[str, float] = defaultdict(float)
    for s in kept:
        for r in s:
            for name, seconds in r.stages.items():
                stage_ms[name] += 1000.0 * seconds / (len(kept) * world)
    return {
        "steps": len(kept),
        "skipped_steps": len(steps) - len(kept),
        "world_size": world,
        "step_ms": 1000.0 * sum(step_walls) / len(step_walls),
        "samples_per_s": samples / sum(step_walls) if sum(step_walls) > 0 else 0.0,
        **overall,
        "per_rank": per_rank,
        "stage_ms": dict(stage_ms),
        "embedding_comm": summarize_embedding_comm(kept),
        **summarize_balancer(kept),
        **summarize_zch([[r.extra for r in s] for s in steps]),  # identity tables: every step, warm-up too
        "per_step": {
            key: [step_metrics(s)[key] for s in kept]
            for key in ("straggler_pct", "exposed_comm_pct", "bubble_pct", "samples_per_s", "imbalance")
        },
    }


def summarize_embedding_comm(steps: list[list[RankStep]]) -> dict[str, Any]:
    """Means over steps of ``embedding_comm_metrics``."""
    return mean_embedding_comm([embedding_comm_metrics(ranks) for ranks in steps])


def mean_embedding_comm(per_step: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of per-step ``embedding_comm_metrics`` (or ``metrics.jsonl`` lines, which carry them).

    PEC's counters and overlap rates are averaged over the steps that have them (the last step of
    the data has no next batch).
    """
    if not per_step:
        return {}
    keys = ("embedding_comm_ms", "embedding_comm_ol_ms", "embedding_comm_nol_ms", "embedding_comm_pct")
    out: dict[str, Any] = {key: sum(m[key] for m in per_step) / len(per_step) for key in keys}
    for key in ("prefetch_comm_ms", "nol_hidden_pct"):
        values = [m[key] for m in per_step if key in m]
        if values:
            out[key] = sum(values) / len(values)
    rated = [m["batch_overlap_rate"] for m in per_step if "batch_overlap_rate" in m]
    if rated:
        out["batch_overlap_rate"] = {t: sum(r[t] for r in rated) / len(rated) for t in rated[0]}
    return out


def embedding_comm_line(emb: dict[str, Any]) -> str:
    """One line on exposed embedding communication for the summary table (empty if not measured)."""
    if not emb:
        return ""
    line = (
        f"exposed embedding comm ms/step: {emb['embedding_comm_ms']:.2f} "
        f"(OL/critical path {emb['embedding_comm_ol_ms']:.2f}, NOL waits {emb['embedding_comm_nol_ms']:.2f})"
    )
    if "batch_overlap_rate" in emb:
        rates = ", ".join(f"{t} {r:.3f}" for t, r in emb["batch_overlap_rate"].items())
        line += f"; batch_overlap_rate {rates}"
    if "nol_hidden_pct" in emb:
        line += f"; NOL comm hidden {emb['nol_hidden_pct']:.1f}%"
    return line


def _totals(rank_steps: list[RankStep]) -> dict[str, float]:
    return part_shares([r.parts() for r in rank_steps])


def part_shares(rank_steps: list[dict[str, Any]]) -> dict[str, float]:
    """Each part's share of the wall time, and the bubble figures of docs/definitions.md, over rank-steps given as
    ``RankStep.parts()`` (``bubbles.json``'s ``rank_steps``): each weighted by its wall time."""
    wall = sum(r["wall"] for r in rank_steps)
    if wall <= 0:
        return {f"{p}_pct": 0.0 for p in PARTS} | {"straggler_pct": 0.0, "exposed_comm_pct": 0.0, "bubble_pct": 0.0}
    share = {f"{p}_pct": 100.0 * sum(r[p] for r in rank_steps) / wall for p in PARTS}
    share["straggler_pct"] = share["idle_pct"]
    share["exposed_comm_pct"] = share["comm_pct"]
    share["bubble_pct"] = share["idle_pct"] + share["comm_pct"]
    return share


def summary_table(summary: dict[str, Any], title: str = "") -> str:
    """A plain-text table of a run summary (printed at the end of a run and by ``make demo``)."""
    if not summary.get("steps"):
        return f"{title}: no steps measured"
    header = f"{'':8} {'compute%':>9} {'data%':>7} {'exposed_comm%':>14} {'straggler%':>11} {'bubble%':>8}"
    lines = [
        title,
        f"steps {summary['steps']} (after {summary['skipped_steps']} warm-up), "
        f"{summary['world_size']} ranks, {summary['step_ms']:.1f} ms/step, "
        f"{summary['samples_per_s']:.1f} samples/s",
        header,
    ]

    def row(name: str, values: dict[str, float]) -> str:
        return (
            f"{name:8} {values['compute_pct']:9.1f} {values['data_pct']:7.1f} {values['exposed_comm_pct']:14.1f} "
            f"{values['straggler_pct']:11.1f} {values['bubble_pct']:8.1f}"
        )

    lines.extend(row(f"rank {r}", values) for r, values in enumerate(summary["per_rank"]))
    lines.append(row("all", summary))
    stages = ", ".join(f"{name} {ms:.2f}" for name, ms in summary["stage_ms"].items())
    lines.append(f"stage ms/step: {stages}")
    lines.append(embedding_comm_line(summary.get("embedding_comm", {})))
    return "\n".join(line for line in lines if line)
