"""Bubble arithmetic (trainer/metrics/bubbles.py): a known straggler's split, and the balancer's
overhead without waiting for other ranks."""

from __future__ import annotations

import pytest

from freescale.trainer.metrics.bubbles import (
    RankStep,
    analyze,
    balancer_metrics,
    step_metrics,
    summarize,
    summary_table,
)
from freescale.trainer.metrics.instrument import CommRecord, StageSpan, StepRecord


def _record(rank: int, step: int, start: float, comm_at: float, arrive_wait: float, end: float) -> StepRecord:
    """A step: data, compute until comm_at, one collective waited until arrive_wait, compute to end."""
    return StepRecord(
        step=step,
        rank=rank,
        start=start,
        end=end,
        samples=4,
        loss=1.0,
        cost=comm_at - start,
        stages=[
            StageSpan("data", "data", start, start + 1),
            StageSpan("forward", "compute", start + 1, comm_at),
            StageSpan("gradient_comm", "comm", comm_at, arrive_wait),
            StageSpan("dense_update", "compute", arrive_wait, end),
        ],
        comms=[CommRecord("dense", comm_at, comm_at, arrive_wait)],
    )


def test_bubble_split_of_a_known_straggler() -> None:
    # rank 0 reaches the all-reduce at t=4, rank 1 at t=8; the transfer then takes 1 (done at 9)
    records = [[_record(0, 0, 0.0, 4.0, 9.0, 10.0)], [_record(1, 0, 0.0, 8.0, 9.0, 10.0)]]
    (step,) = analyze(records)
    fast, slow = step
    assert (fast.idle, fast.comm, fast.data, fast.compute) == pytest.approx((4.0, 1.0, 1.0, 4.0))
    assert (slow.idle, slow.comm, slow.compute) == pytest.approx((0.0, 1.0, 8.0))
    for rank_step in step:
        assert rank_step.parts_total() == pytest.approx(rank_step.wall)
        assert rank_step.untimed == pytest.approx(0.0)
    metrics = step_metrics(step)
    assert metrics["straggler_pct"] == pytest.approx(20.0)  # mean idle (4 + 0) / 2 over wall 10
    assert metrics["exposed_comm_pct"] == pytest.approx(10.0)
    assert metrics["bubble_pct"] == pytest.approx(30.0)
    summary = summarize(analyze(records))
    assert summary["straggler_pct"] == pytest.approx(20.0)
    assert "straggler%" in summary_table(summary, "t")


def test_balancer_overhead_leaves_out_waiting_for_other_ranks() -> None:
    """The dispatch collective is the step's first sync point after placement: a rank that gets there
    early waits for the other's straggling, which is not the balancer's cost (straggler_pct has it)."""

    def rank_step(rank: int, dispatch_ms: float, waited_s: float) -> RankStep:
        extra = {"balancer.imbalance_before": 1.5, "balancer.imbalance_after": 1.0, "balancer.moved": 1.0,
                 "balancer.dispatch_ms": dispatch_ms, "balancer.combine_ms": 1.0}  # fmt: skip
        return RankStep(rank=rank, step=0, wall=0.1, compute=0.0, data=0.0, comm=0.0, idle=waited_s, untimed=0.0,
                        samples=1, loss=0.0, cost=0.0, stages={}, idle_by_name={"balancer.dispatch": waited_s},
                        extra=extra)  # fmt: skip

    metrics = balancer_metrics([rank_step(0, 7.0, 0.005), rank_step(1, 2.0, 0.0)])
    assert metrics["balancer_dispatch_ms"] == pytest.approx(2.0)  # (7 - 5 + 2) / 2
    assert metrics["balancer_combine_ms"] == pytest.approx(1.0)
    assert metrics["balancer_wait_ms"] == pytest.approx(2.5)
    assert metrics["balancer_moved"] == 2
