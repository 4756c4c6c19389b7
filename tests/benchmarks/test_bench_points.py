"""``measure.Points``: a CPU benchmark's points run one at a time, a failed one once more, and the JSON
rewritten after each, so one failed run no longer throws away the points already measured.

The benchmark-level tests run a benchmark's own point functions with the expensive part (the
training runs, the planner) replaced or failing on purpose, and read the JSON the benchmark wrote.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    """Import a benchmark script as its own directory would (``from measure import ...``)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))

    def load(name: str) -> ModuleType:
        return importlib.import_module(name)

    return load


# ------------------------------------------------------------------------------------------ Points


def test_a_point_that_fails_once_is_retried_and_the_failure_recorded(bench, tmp_path: Path) -> None:
    measure = bench("measure")
    out = tmp_path / "r.json"
    done: list[int] = []
    seen_on_disk: list[list[int]] = []
    tries = {"b": 0}

    def point(value: int) -> int:
        seen_on_disk.append(json.loads(out.read_text())["values"] if out.exists() else [])
        if value == 2:
            tries["b"] += 1
            if tries["b"] == 1:
                raise RuntimeError("rank 1 aborted\nmore lines")
        return value

    points = measure.Points("bench_x", out, lambda: {"values": list(done)})
    for label, value in (("a", 1), ("b", 2), ("c", 3)):
        assert points.run(label, point, value, keep=done.append) == value
    final = points.save(final=True)
    assert seen_on_disk == [[], [1], [1], [1, 2]]  # each point saw the previous ones on disk
    assert json.loads(out.read_text()) == final
    assert final["values"] == [1, 2, 3] and final["complete"] is True and points.exit_code() == 0
    assert final["points_done"] == ["a", "b", "c"] and final["points_failed"] == []
    assert final["points_retried"] == ["b"]
    (failure,) = final["failures"]
    assert failure["point"] == "b" and failure["attempt"] == 1 and failure["then"] == "retried"
    assert failure["error"].startswith("RuntimeError") and "rank 1 aborted" in failure["error"]


def test_a_point_that_fails_twice_is_given_up_and_the_others_still_run(bench, tmp_path: Path) -> None:
    measure = bench("measure")
    out = tmp_path / "r.json"
    done: list[str] = []

    def point(label: str) -> str:
        if label == "b":
            raise ValueError(f"{label} broke")
        return label

    points = measure.Points("bench_x", out, lambda: {"values": list(done), "nested": {"target_met": True}})
    for label in ("a", "b", "c"):
        points.run(label, point, label, keep=done.append)
    after_failure = json.loads(out.read_text())
    assert after_failure["values"] == ["a", "c"] and after_failure["complete"] is False
    final = points.save(final=True)
    assert final["complete"] is False and points.exit_code() == 1
    assert final["points_failed"] == ["b"] and final["points_done"] == ["a", "c"]
    assert [(f["attempt"], f["then"]) for f in final["failures"]] == [(1, "retried"), (2, "gave up")]


def test_an_interrupt_is_not_retried(bench, tmp_path: Path) -> None:
    points = bench("measure").Points("bench_x", tmp_path / "r.json", dict)
    calls = []

    def point() -> None:
        calls.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        points.run("a", point)
    assert calls == [1]


def test_a_report_that_cannot_be_built_from_partial_points_still_saves_the_status(bench, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    points = bench("measure").Points("bench_x", out, lambda: {"ratio": 1 / 0})
    points.run("a", lambda: 1)
    saved = json.loads(out.read_text())
    assert saved["points_done"] == ["a"] and "ZeroDivisionError" in saved["report_error"]


def test_a_failed_measured_command_is_a_failed_point_not_the_end(bench) -> None:
    """``run_measured`` once raised SystemExit, which no point retry catches."""
    measure = bench("measure")
    with pytest.raises(measure.CommandFailed, match="false failed"):
        measure.run_measured(["false"], "false")


# ------------------------------------------------------------------------------------------ bench_pec


def fake_report(label: str, steps: int) -> dict[str, Any]:
    """A ``bubbles.json`` as ``bench_pec.run_point`` reads it (figures made up)."""
    comm = {"none": 10.0, "pec": 0.5, "torchrec": 12.0}[label]
    line = {"embedding_comm_ms": comm, "embedding_comm_ol_ms": comm / 2, "embedding_comm_nol_ms": comm / 2,
            "embedding_comm_pct": 10.0, "batch_overlap_rate": {"item": 0.05}}  # fmt: skip
    summary = {"step_ms": 100.0, "samples_per_s": 50.0, "exposed_comm_pct": 10.0, "straggler_pct": 2.0,
               "embedding_comm": {"embedding_comm_ms": comm}}  # fmt: skip
    steps_lines = [{**line, "step": step, "loss": 1.0 / (step + 1)} for step in range(steps)]
    return {"pipeline": label, "summary": summary, "steps": steps_lines}


@pytest.mark.parametrize("torchrec_failures", [1, 2])
def test_bench_pec_keeps_finished_points_when_a_run_fails(
    bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torchrec_failures: int
) -> None:
    """The reported case: the TorchRec run of a later point fails (a rank aborted at exit). Once: the
    point is run again and the JSON records the retry. Twice: the point is recorded as failed, the
    sweep goes on, the earlier point stays in the JSON and the target is not met."""
    bench_pec = bench("bench_pec")
    out = tmp_path / "pec.json"
    on_disk: list[int] = []
    failures = {"left": torchrec_failures}

    def train(config: str, engine: str, run_out: Path, cwd: Path) -> dict[str, Any]:
        label = run_out.name.rsplit("-", 1)[1]  # zipf<z>-rows<n>-<label>
        if "-rows500-" in run_out.name:  # the quick sweep's second point
            on_disk.append(len(json.loads(out.read_text())["points"]))
            if label == "torchrec" and failures["left"]:
                failures["left"] -= 1
                raise RuntimeError("torchrec run failed:\nterminate called without an active exception")
        return {**fake_report(label, 8), "wall_s": 1.0}

    monkeypatch.setattr(bench_pec, "prepare_point", lambda s, zipf, work: str(work / f"prepared-zipf{zipf}"))
    monkeypatch.setattr(bench_pec, "train", train)
    monkeypatch.setattr(bench_pec, "plot", lambda points, path: None)
    monkeypatch.setattr(sys, "argv", ["bench_pec.py", "--quick", "--out", str(out), "--work", str(tmp_path / "w")])
    code = bench_pec.main()
    report = json.loads(out.read_text())
    assert on_disk and set(on_disk) == {1}  # the first point was on disk while the second ran
    labels = ["zipf 0.5, table rows 200000", "zipf 1.1, table rows 500"]
    assert report["failures"][0]["point"] == labels[1] and "terminate called" in report["failures"][0]["error"]
    if torchrec_failures == 1:
        assert code == 0 and report["complete"] is True
        assert [p["table_rows"] for p in report["points"]] == [200_000, 500]
        assert report["points_retried"] == [labels[1]] and report["points_failed"] == []
        assert [f["then"] for f in report["failures"]] == ["retried"]
        assert report["verdict"]["target_met"] is True
    else:
        assert code == 1 and report["complete"] is False
        assert [p["table_rows"] for p in report["points"]] == [200_000]
        assert report["points_failed"] == [labels[1]] and report["points_done"] == [labels[0]]
        assert [f["then"] for f in report["failures"]] == ["retried", "gave up"]
        assert report["verdict"]["target_met"] is False and report["verdict"]["points_failed"] == 1


# ------------------------------------------------------------------------------------------ bench_balance


def test_bench_balance_retries_a_failed_point_with_the_real_planner(bench, tmp_path: Path, monkeypatch) -> None:
    """The real points (``--small``: G = 4 and 16, both modes, the lognormal shape), the planner of
    one point failing on its first try."""
    bench_balance = bench("bench_balance")
    out = tmp_path / "balance.json"
    real, calls = bench_balance.bench_one, []

    def bench_one(costs, s, g, mode):
        calls.append((g, mode))
        if (g, mode) == (16, "free_count") and calls.count((g, mode)) == 1:
            assert len(json.loads(out.read_text())["results"]) == 3  # the earlier points are on disk
            raise MemoryError("planner ran out of memory")
        return real(costs, s, g, mode)

    monkeypatch.setattr(bench_balance, "bench_one", bench_one)
    monkeypatch.setattr(bench_balance, "plot", lambda rows, path: None)
    assert bench_balance.main(["--small", "--shapes", "lognormal", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(r["group_size"], r["mode"]) for r in report["results"]] == [
        (4, "equal_count"), (16, "equal_count"), (4, "free_count"), (16, "free_count"),
    ]  # fmt: skip
    assert report["complete"] is True and report["points_retried"] == ["lognormal G=16 free_count"]
    assert report["failures"][0]["error"].startswith("MemoryError") and report["failures"][0]["then"] == "retried"


# ------------------------------------------------------------------------------------------ bench_bubbles


def test_bench_bubbles_pools_the_repeats_that_ran_and_records_the_one_that_did_not(
    bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two interleaved repeats; TorchRec's planned run fails both tries in repeat 1: its row pools
    repeat 0 alone, the failure is in the JSON, the exit status says so."""
    bench_bubbles = bench("bench_bubbles")
    out = tmp_path / "bubbles.json"
    tries: dict[tuple[str, str, int], int] = {}

    def one_run(s, work, data, engine, variant, repeat, steps, engine_extra=None, label=None):
        key = (engine, variant, repeat)
        tries[key] = tries.get(key, 0) + 1
        if key == ("torchrec", "planned", 1):
            raise RuntimeError("torchrec run failed:\nterminate called without an active exception")
        straggler = {"random": 20.0, "planned": 2.0, "identical": 1.0}[variant]
        per_step = {"straggler_pct": [straggler], "exposed_comm_pct": [1.0], "samples_per_s": [10.0],
                    "imbalance": [0.0]}  # fmt: skip
        return {"run": f"{engine}/{variant}", "engine": engine, "data": variant, "pipeline": engine, "wall_s": 1.0,
                "steps": 10, "step_ms": 100.0, "samples_per_s": 10.0, "compute_pct": 80.0, "data_pct": 1.0,
                "straggler_pct": straggler, "exposed_comm_pct": 1.0, "bubble_pct": straggler + 1.0,
                "untimed_pct": 0.0, "median_step_straggler_pct": straggler, "per_step": per_step,
                "stage_ms": {"forward": 10.0}, "predicted_straggler_pct_w2": 0.0, "timeline": "/tmp/x.png"}  # fmt: skip

    class Dataset:  # the reader, never read: full_group_steps is replaced
        def __init__(self, path: str) -> None:
            pass

    import freescale.pipeline.dataset.reader

    data = {"datasets": {k: {"path": k, "predicted_straggler_pct_w2": 0.0} for k in ("random", "planned")}}
    monkeypatch.setattr(bench_bubbles, "make_data", lambda s, work: data)
    monkeypatch.setattr(bench_bubbles, "full_group_steps", lambda dataset, group_size: 8)
    monkeypatch.setattr(freescale.pipeline.dataset.reader, "PreparedDataset", Dataset)
    monkeypatch.setattr(bench_bubbles, "one_run", one_run)
    monkeypatch.setattr(bench_bubbles, "plot", lambda report, path: None)
    code = bench_bubbles.main(["--repeats", "2", "--out", str(out), "--work", str(tmp_path / "w")])
    report = json.loads(out.read_text())
    assert code == 1 and report["complete"] is False
    assert tries[("torchrec", "planned", 1)] == 2 and report["points_failed"] == ["torchrec/planned repeat 1"]
    by = {r["run"]: r for r in report["runs"]}
    assert by["torchrec/planned"]["repeats"] == 1 and by["freescale/planned"]["repeats"] == 2
    assert all("timeline" not in r for r in report["runs"])
    assert report["comparisons"]["targets"]["straggler_reduction"]["target_met"] is True


# ------------------------------------------------------------------------------------------ sim_hosts


def test_bench_simulate_hosts_caps_are_points_of_the_same_record(
    bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_simulate's 2-host part: each cap (probes, none and pec runs) is a point of bench_simulate's
    ``Points``: a cap failing once is measured again, one failing twice is left out and recorded."""
    import contextlib

    import freescale.tools.hosts

    sim_hosts, measure = bench("sim_hosts"), bench("measure")
    tries: dict[float | None, int] = {}

    def measure_cap(hosts, s, data, cap, work, payload, spec):
        tries[cap] = tries.get(cap, 0) + 1
        if cap == 200.0 or (cap is None and tries[cap] == 1):
            raise RuntimeError(f"pec run over the {cap} link failed")
        return {"cap_mbit": cap, "link": {}, "runs": {}}

    monkeypatch.setattr(freescale.tools.hosts, "two_hosts", lambda: contextlib.nullcontext([]))
    monkeypatch.setattr(sim_hosts, "contention_spec", lambda *args: {})
    monkeypatch.setattr(sim_hosts, "measure_cap", measure_cap)
    points = measure.Points("bench_simulate", tmp_path / "sim.json", dict)
    rows = sim_hosts.measure(None, "data", [None, 200.0, 50.0], tmp_path, {}, 0.1, points)
    assert [r["cap_mbit"] for r in rows] == [None, 50.0] and tries == {None: 2, 200.0: 2, 50.0: 1}
    saved = json.loads((tmp_path / "sim.json").read_text())
    assert saved["points_retried"] == ["hosts link 200mbit", "hosts link uncapped"]
    assert saved["points_failed"] == ["hosts link 200mbit"]
