"""The simulator's overlap slowdown (compute slowed by the exchanges it overlaps, unevenly over the
ranks), PEC's routing wait and its prefetch's host work, and the 2-host contention probe's fit
(``benchmarks/sim_hosts.py``)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from freescale.trainer.simulate.network_model import NetworkModel
from freescale.trainer.simulate.sim_config import ComputeConfig, NetworkConfig, SimConfig, WorkloadConfig
from freescale.trainer.simulate.simulator import StepWork, time_steps

STEPS = 200
NET = NetworkConfig(intra_latency_us=0.0, intra_bandwidth_gbytes_s=0.01)  # 10 MB/s: tens of ms per exchange
WORKLOAD = WorkloadConfig(embedding_dim=16, negatives=8, dense_params=1000, batch_overlap_rate=0.0)


def work(compute_s: float, events: float = 1e4) -> StepWork:
    """Equal work on 2 ranks: ``compute_s`` seconds and ``events`` looked-up ids each per step."""
    shape = (STEPS, 2)
    return StepWork(np.full(shape, compute_s), np.full(shape, events), np.full(shape, 4.0), None, "test")


def run(w: StepWork, overlap: str = "pec", **network) -> dict:
    net = replace(NET, **network)
    cfg = SimConfig(network=net, workload=WORKLOAD, compute=ComputeConfig(peak_tflops=1.0))
    return time_steps(w, overlap, cfg, NetworkModel(net, 2), 0.0, np.random.default_rng(0))


def background_mbytes(events: float = 1e4) -> float:
    """What PEC overlaps per rank and step at rate 0: routing (counts, ids), rows with 16 bytes of
    optimizer state and owners' marks each (``overlap.prefetch_exchange``), NOL gradients."""
    unique = events + WORKLOAD.negatives
    return 1e-6 * (2 * 8 + unique * 8 + 2 * 8 * unique + 2 * unique * WORKLOAD.row_bytes)


def test_zero_slowdown_is_the_formula_without_it() -> None:
    """No slowdown: the spread changes nothing (there is nothing to spread), for both schedules."""
    for overlap in ("none", "pec"):
        assert run(work(0.5), overlap, overlap_slowdown_spread=1.0) == run(work(0.5), overlap)


def test_slowdown_per_megabyte_moved_lengthens_every_step() -> None:
    """Compute long enough to hide the whole exchange: each step (steady state: the next batch is
    always in flight) is slower by exactly the coefficient times the megabytes it overlaps; spread 0:
    no idle."""
    base, slowed = run(work(0.5)), run(work(0.5), overlap_slowdown_s_per_mbyte=0.01)
    extra = 0.01 * background_mbytes()
    assert base["comm_ms"]["exposed_prefetch"] == 0.0
    assert slowed["step_s"] - base["step_s"] == pytest.approx(extra, rel=1e-6)
    assert slowed["straggler_pct"] == 0.0


def test_uneven_slowdown_makes_one_rank_late_and_the_other_idle() -> None:
    """Spread s on 2 ranks: one rank is slowed (1 + s)×, the other (1 − s)×; the early one idles the
    difference at the step's collectives, and straggling grows with s."""
    mean_s = 0.01 * background_mbytes()
    got = {s: run(work(0.5), overlap_slowdown_s_per_mbyte=0.01, overlap_slowdown_spread=s) for s in (0.0, 0.5, 1.0)}
    assert got[0.0]["straggler_pct"] == 0.0
    assert 0.0 < got[0.5]["straggler_pct"] < got[1.0]["straggler_pct"]
    idle_per_rank_s = got[1.0]["straggler_pct"] / 100 * got[1.0]["step_s"]  # one rank idles 2·s·mean
    assert idle_per_rank_s == pytest.approx(mean_s, rel=0.02)


def test_routing_wait_absorbs_the_slowed_ranks_lead() -> None:
    """PEC: where the next batch's routing outlasts the compute, the rank slowed less waits on the
    routing first, so its lead does not reach the collectives as idle time."""
    slow = {"overlap_slowdown_s_per_mbyte": 0.01, "overlap_slowdown_spread": 1.0}
    hidden = run(work(0.5), **slow)  # routing well inside the compute: the lead becomes idle
    slow_link = {**slow, "intra_bandwidth_gbytes_s": 1e-5}  # 10 kB/s: the routing outlasts compute
    absorbed = run(work(0.005, events=100), **slow_link)
    assert hidden["straggler_pct"] > 1.0
    assert absorbed["comm_ms"]["exposed_prefetch"] > 0
    assert absorbed["straggler_pct"] == pytest.approx(0.0, abs=1e-9)


def compute_growth(w: StepWork, link: dict, slowdown: dict) -> float:
    """Seconds per step the slowdown adds to compute: step time grown, less the exposed prefetch it
    hides (spread 0: no idle)."""
    base, slowed = run(w, **link), run(w, **link, **slowdown)
    hidden_more = 1e-3 * (base["comm_ms"]["exposed_prefetch"] - slowed["comm_ms"]["exposed_prefetch"])
    return slowed["step_s"] - base["step_s"] + hidden_more


def test_a_slower_link_moves_fewer_bytes_during_compute() -> None:
    """Per byte, not per second: once the exchange outlasts the compute only its hidden share of the
    bytes slows compute, so a 4x slower link slows compute less (a per-second model: more)."""
    fast, slow = {"intra_bandwidth_gbytes_s": 0.05}, {"intra_bandwidth_gbytes_s": 0.0125}
    w = work(0.05)
    per_byte = {"overlap_slowdown_s_per_mbyte": 0.01}
    assert compute_growth(w, fast, per_byte) == pytest.approx(0.01 * background_mbytes())
    assert 0.0 < compute_growth(w, slow, per_byte) < 0.95 * compute_growth(w, fast, per_byte)
    per_second = {"overlap_slowdown": 0.2}
    assert compute_growth(w, slow, per_second) > 2.0 * compute_growth(w, fast, per_second)


def test_slowdown_options_are_validated() -> None:
    with pytest.raises(ValueError, match=r"network\.overlap_slowdown_s_per_mbyte"):
        NetworkConfig(overlap_slowdown_s_per_mbyte=-1.0)
    with pytest.raises(ValueError, match=r"network\.overlap_slowdown_spread"):
        NetworkConfig(overlap_slowdown_spread=1.5)


# ------------------------------------------------------------------------------------------ prefetch host work
def run_host(w: StepWork, host_s: float, overlap: str = "pec") -> dict:
    """``run`` with ``compute.prefetch_host_s`` seconds of PEC prefetch work outside the collectives."""
    cfg = SimConfig(network=NET, workload=WORKLOAD, compute=ComputeConfig(peak_tflops=1.0, prefetch_host_s=host_s))
    return time_steps(w, overlap, cfg, NetworkModel(NET, 2), 0.0, np.random.default_rng(0))


def test_zero_host_work_is_the_formula_without_it_and_none_has_no_worker() -> None:
    for compute_s in (0.5, 0.005):
        assert run_host(work(compute_s), 0.0) == run(work(compute_s))
        assert run_host(work(compute_s), 0.3, "none") == run(work(compute_s), "none")


def test_host_work_is_exposed_only_where_the_prefetch_outlasts_the_compute() -> None:
    """Compute of 0.5 s hides exchanges + 0.1 s: nothing changes. Compute of 5 ms, outlasted by the
    exchanges alone: every step (the first batch's fetch included) waits exactly the host work longer."""
    assert run_host(work(0.5), 0.1) == run(work(0.5))
    base, longer = run(work(0.005)), run_host(work(0.005), 0.02)
    assert base["comm_ms"]["exposed_prefetch"] > 0
    assert longer["comm_ms"]["exposed_prefetch"] - base["comm_ms"]["exposed_prefetch"] == pytest.approx(20.0)
    assert longer["step_s"] - base["step_s"] == pytest.approx(0.02)


def test_exposed_comm_grows_monotonically_with_host_work() -> None:
    """Compute about as long as the prefetch: more host work never exposes less, and some exposes more."""
    w = work(0.16)
    got = [run_host(w, h)["exposed_comm_pct"] for h in (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)]
    assert got == sorted(got)
    assert got[-1] > got[0]


def test_steady_state_a_window_predicts_what_it_predicts_repeated() -> None:
    """Steady state: the per-step figures of a window of unequal steps equal those of the same window
    run 4 times over, for both schedules (a run's first fetch and last drain are in neither)."""
    pattern = np.array([0.004, 0.3, 0.02, 0.15])
    for overlap in ("none", "pec"):
        figures = []
        for repeats in (1, 4):
            compute = np.tile(pattern, repeats)[:, None] * np.ones((1, 2))
            events, samples = np.full(compute.shape, 1e4), np.full(compute.shape, 4.0)
            got = run_host(StepWork(compute, events, samples, None, "test"), 0.01, overlap)
            figures.append((got["exposed_comm_pct"], got["straggler_pct"], got["step_s"]))
        assert figures[0] == pytest.approx(figures[1]), overlap


def test_host_work_option_is_validated() -> None:
    with pytest.raises(ValueError, match=r"compute\.prefetch_host_s"):
        ComputeConfig(peak_tflops=1.0, prefetch_host_s=-0.1)


# ------------------------------------------------------------------------------------------ the probe's fit
def sim_hosts():
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "sim_hosts.py"
    spec = importlib.util.spec_from_file_location("sim_hosts_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_contention_fit_recovers_the_slowdown_and_its_spread() -> None:
    """Synthetic probe times: 60 ms alone on both ranks, beside the exchange one rank (alternating)
    +30 ms and the other +10 ms, the exchange over before the compute: 20 ms per 2 MB on average,
    spread (30 − 10) / (2·20) = 0.5. Where the exchange outlasts the compute (it waits as long again
    after it), only half the bytes count."""
    reps = 6
    alone = [0.06] * reps
    slow = [0.09 if i % 2 else 0.07 for i in range(reps)]
    fast = [0.07 if i % 2 else 0.09 for i in range(reps)]
    per_rank = [
        {"alone": alone, "beside": slow, "wait": [0.0] * reps},
        {"alone": alone, "beside": fast, "wait": [0.0] * reps},
    ]
    fit = sim_hosts().contention_fit(per_rank, 2e6)
    assert fit["slowdown_ms"] == pytest.approx(20.0)
    assert fit["overlap_slowdown_s_per_mbyte"] == pytest.approx(0.01)
    assert fit["overlap_slowdown_spread"] == pytest.approx(0.5)
    outlasting = [{**r, "wait": r["beside"]} for r in per_rank]
    assert sim_hosts().contention_fit(outlasting, 2e6)["overlap_slowdown_s_per_mbyte"] == pytest.approx(0.02)
    unslowed = [{**r, "beside": alone} for r in per_rank]
    assert sim_hosts().contention_fit(unslowed, 2e6)["overlap_slowdown_s_per_mbyte"] == 0.0


# ------------------------------------------------------------------------------------------ measured window
def test_measured_steady_figures_leave_out_warm_up_and_the_drain_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps 0-3 on 2 ranks, skip 1: steps 1 and 2 only (step 3 is the run's drain), weighted by wall
    time like ``bubbles.summarize``: idle 10 + 30 of 400 ms, comm 20 + 20."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from bench_pec import steady_figures

    def rank_step(step: int, rank: int, idle: float, comm: float) -> dict:
        return {"step": step, "rank": rank, "wall": 0.1, "compute": 0.1 - idle - comm, "data": 0.0,
                "comm": comm, "idle": idle, "untimed": 0.0}  # fmt: skip

    drain = 0.09  # the last step: almost all communication
    ranks = [rank_step(0, r, 0.05, 0.05) for r in (0, 1)] + [rank_step(3, r, 0.0, drain) for r in (0, 1)]
    ranks += [rank_step(1, 0, 0.01, 0.01), rank_step(1, 1, 0.0, 0.01), rank_step(2, 0, 0.0, 0.01)]
    ranks += [rank_step(2, 1, 0.03, 0.01)]
    lines = [{"step": s, "step_ms": 100.0, "samples": 8, "straggler_pct": 0.0, "exposed_comm_pct": 0.0,
              "bubble_pct": 0.0, "samples_per_s": 80.0, "imbalance": 1.0} for s in range(4)]  # fmt: skip
    got = steady_figures({"steps": lines, "rank_steps": ranks}, 1)
    assert got["steps"] == 2 and got["step_ms"] == pytest.approx(100.0)
    assert got["straggler_pct"] == pytest.approx(100 * 0.04 / 0.4)
    assert got["exposed_comm_pct"] == pytest.approx(100 * 0.04 / 0.4)
    assert got["bubble_pct"] == pytest.approx(20.0)
    assert got["samples_per_s"] == pytest.approx(80.0)
    assert len(got["per_step"]["straggler_pct"]) == 2
