"""The Chrome/Perfetto trace and the PNG timeline (trainer/metrics/trace.py) of known steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freescale.trainer.metrics.instrument import CommRecord, StageSpan, StepRecord
from freescale.trainer.metrics.trace import chrome_trace, plot_timeline, wait_segments, write_trace


def _step(rank: int, step: int, start: float, arrive: float, done: float, end: float) -> StepRecord:
    """Data for 1 s, compute until ``arrive``, the all-reduce waited until ``done``, compute to ``end``."""
    return StepRecord(
        step=step,
        rank=rank,
        start=start,
        end=end,
        samples=4,
        loss=2.5,
        cost=1.0,
        stages=[
            StageSpan("data", "data", start, start + 1),
            StageSpan("forward", "compute", start + 1, arrive),
            StageSpan("gradient_comm", "comm", arrive, done),
            StageSpan("dense_update", "compute", done, end),
        ],
        comms=[CommRecord("dense", arrive, arrive, done)],
    )


def _two_ranks_two_steps(origin: float = 100.0) -> list[list[StepRecord]]:
    """Rank 1 reaches each all-reduce 4 s after rank 0; the transfer then takes 1 s."""
    return [
        [_step(0, s, origin + 10 * s, origin + 10 * s + 4, origin + 10 * s + 9, origin + 10 * s + 10) for s in (0, 1)],
        [_step(1, s, origin + 10 * s, origin + 10 * s + 8, origin + 10 * s + 9, origin + 10 * s + 10) for s in (0, 1)],
    ]


def test_wait_segments_split_each_wait_at_the_last_ranks_arrival() -> None:
    fast, slow = _step(0, 0, 0.0, 4.0, 9.0, 10.0), _step(1, 0, 0.0, 8.0, 9.0, 10.0)
    assert wait_segments([fast, slow]) == [
        (0, "idle", 4.0, 8.0, "dense"),
        (0, "dense", 8.0, 9.0, "dense"),
        (1, "dense", 8.0, 9.0, "dense"),
    ]
    # a wait that ended before the other rank launched is all idle; a collective only one rank
    # recorded (no cross-rank ordinal) is all communication
    early = _step(0, 0, 0.0, 2.0, 3.0, 10.0)
    early.comms.append(CommRecord("extra", 6.0, 6.0, 7.0))
    late = _step(1, 0, 0.0, 5.0, 6.0, 10.0)
    assert wait_segments([early, late]) == [
        (0, "idle", 2.0, 3.0, "dense"),
        (0, "extra", 6.0, 7.0, "extra"),
        (1, "dense", 5.0, 6.0, "dense"),
    ]


def test_chrome_trace_holds_the_first_steps_one_process_per_rank() -> None:
    records = _two_ranks_two_steps(origin=100.0)
    trace = chrome_trace(records, max_steps=1)
    assert trace["displayTimeUnit"] == "ms"
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["args"].get("step") for e in spans if e["cat"] != "step"} == {0}
    steps = [e for e in spans if e["cat"] == "step"]
    assert [(e["name"], e["pid"], e["ts"], e["dur"]) for e in steps] == [("step 0", r, 0.0, 10e6) for r in (0, 1)]
    assert steps[0]["args"] == {"loss": 2.5, "samples": 4, "cost": 1.0}
    stages = [(e["pid"], e["name"], e["cat"]) for e in spans if e["tid"] == 0 and e["cat"] != "step"]
    assert stages.count((1, "gradient_comm", "comm")) == 1 and len(stages) == 8
    waits = [(e["pid"], e["name"], e["cat"], e["ts"], e["dur"]) for e in spans if e["tid"] == 1]
    assert waits == [
        (0, "idle", "idle", pytest.approx(4e6), pytest.approx(4e6)),
        (0, "dense", "comm", pytest.approx(8e6), pytest.approx(1e6)),
        (1, "dense", "comm", pytest.approx(8e6), pytest.approx(1e6)),
    ]
    meta = [(e["name"], e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["ph"] == "M"]
    assert meta == [
        ("process_name", 0, "rank 0"),
        ("thread_name", 0, "stages"),
        ("thread_name", 0, "collective waits"),
        ("process_name", 1, "rank 1"),
        ("thread_name", 1, "stages"),
        ("thread_name", 1, "collective waits"),
    ]
    both = chrome_trace(records, max_steps=5)
    assert sorted({e["args"]["step"] for e in both["traceEvents"] if e["ph"] == "X" and e["cat"] != "step"}) == [0, 1]
    assert chrome_trace(records, max_steps=0) == {"traceEvents": []} == chrome_trace([[], []], max_steps=3)


def test_write_trace_writes_the_chrome_trace_as_json(tmp_path: Path) -> None:
    records = _two_ranks_two_steps()
    write_trace(tmp_path / "trace.json", records, max_steps=2)
    assert json.loads((tmp_path / "trace.json").read_text()) == chrome_trace(records, max_steps=2)


def test_plot_timeline_draws_the_chosen_steps_or_says_there_is_nothing(tmp_path: Path) -> None:
    records = _two_ranks_two_steps()
    path = tmp_path / "timeline.png"
    assert not plot_timeline(path, records, first_step=2, num_steps=3) and not path.exists()
    assert not plot_timeline(path, records, first_step=0, num_steps=0) and not path.exists()
    assert plot_timeline(path, records, first_step=1, num_steps=3, title="one step")
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
