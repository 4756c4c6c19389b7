"""``freescale simulate`` (docs/design.md#scale-model): analytic cases, agreement with the planner and the online
placement, monotonicity, determinism, jitter solved from a noise floor, profile validation, and the
CLI end to end on a tiny generated + prepared dataset."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from prepare_configs import make_config

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.balance import BalanceConfig, plan_bin_costs, plan_step_groups, predict_straggler_pct
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.prepare import prepare
from freescale.tools.cli import main as cli_main
from freescale.trainer.simulate.network_model import NetworkModel
from freescale.trainer.simulate.sim_config import (
    PROFILE_DIR,
    ComputeConfig,
    HardwareProfile,
    JitterConfig,
    NetworkConfig,
    SimConfig,
    WorkloadConfig,
)
from freescale.trainer.simulate.sim_inputs import LengthSource, OwnLayout, parse_distribution
from freescale.trainer.simulate.simulator import (
    PLAN_MIN_STEPS,
    StepWork,
    find,
    jitter_sigma,
    simulate,
    time_steps,
)

FREE = NetworkConfig(
    intra_latency_us=0.0,
    inter_latency_us=0.0,
    per_peer_latency_us=0.0,
    intra_bandwidth_gbytes_s=math.inf,
    inter_bandwidth_gbytes_s=math.inf,
)
HEAVY = parse_distribution("lognormal:median=64,sigma=1.5,cap=4096")


@pytest.fixture
def seconds_per_event(tmp_path) -> str:
    """A calibrated-style cost model: cost(L) = 1 µs per event (a=0), no per-micro-batch constant."""
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"a": 0.0, "b": 1e-6, "c": 0.0, "units": "seconds"}))
    return str(path)


def config(cost: str, **overrides) -> SimConfig:
    options = {
        "world_sizes": (2, 4, 8),
        "compute": ComputeConfig(cost_model=cost),
        "network": FREE,
        "jitter": JitterConfig(),  # no jitter unless a test asks for it
        "workload": WorkloadConfig(micro_batch_size=4, steps=8, embedding_dim=16, num_layers=1, negatives=8),
    }
    options.update(overrides)
    return SimConfig(**options)


def data(values) -> LengthSource:
    return LengthSource(origin="test", kind="data", values=np.asarray(values, dtype=np.int64))


# ------------------------------------------------------------------------------------------ analytic
def test_identical_samples_never_straggle(seconds_per_event) -> None:
    report = simulate(config(seconds_per_event), data(np.full(1000, 100)))
    assert {row["straggler_pct"] for row in report["rows"]} == {0.0}
    assert {row["exposed_comm_pct"] for row in report["rows"]} == {0.0}


def test_one_rank_with_double_work_straggles_as_design_defines(seconds_per_event) -> None:
    """The waiting rank idles half of every step (its per-rank straggler_pct is 50%); the straggler_pct of
    docs/definitions.md is the mean over ranks: 50% · (W − 1) / W."""
    for w in (2, 4, 64):
        lengths = np.full(w * 3, 100)
        lengths[::w] = 200  # micro-batch 0 of every step (one sample each) is rank 0's: twice the work
        layout = OwnLayout(lengths, np.arange(lengths.size + 1, dtype=np.int64), w, "random")
        source = LengthSource(origin="test", kind="data", values=lengths, layout=layout)
        report = simulate(config(seconds_per_event, world_sizes=(w,), arms=("random",)), source)
        row = find(report, w, "random")
        assert row["straggler_pct"] == pytest.approx(50.0 * (w - 1) / w, abs=1e-3)
        assert row["per_rank_straggler_pct"]["max"] == pytest.approx(50.0)
        assert row["per_rank_straggler_pct"]["min"] == pytest.approx(0.0)
        assert row["source"].startswith("dataset's own random layout")


def test_free_network_exposes_no_communication(seconds_per_event) -> None:
    cfg = config(seconds_per_event, workload=replace(config(seconds_per_event).workload, batch_overlap_rate=0.3))
    report = simulate(cfg, HEAVY)
    assert {row["overlap"] for row in report["rows"]} == {"none", "pec"}
    assert {row["exposed_comm_pct"] for row in report["rows"]} == {0.0}
    assert all(row["straggler_pct"] == row["bubble_pct"] for row in report["rows"])


def test_network_model_by_hand() -> None:
    """Two nodes of 4: an all-to-all sends 3/8 of a rank's bytes over NVLink and 4/8 over the NIC."""
    net = NetworkModel(
        NetworkConfig(
            ranks_per_node=4,
            intra_latency_us=1.0,
            inter_latency_us=10.0,
            intra_bandwidth_gbytes_s=100.0,
            inter_bandwidth_gbytes_s=1.0,
        ),
        8,
    )
    nbytes = np.array([[8e6, 4e6, 0, 0, 0, 0, 0, 0]])
    assert net.all_to_all(nbytes)[0] == pytest.approx(10e-6 + 8e6 * 4 / 8 / 1e9)
    # ring all-reduce: 2 (W-1)/W bytes over the NIC; latency 2·(1 µs·log2 4 + 10 µs·log2 2)
    assert net.all_reduce(1e9) == pytest.approx(2 * (2 * 1e-6 + 10e-6) + 2 * 7 / 8)
    assert NetworkModel(NetworkConfig(), 1).all_reduce(1e9) == 0.0
    measured = NetworkModel(NetworkConfig(all_reduce_latency_us=700.0, intra_bandwidth_gbytes_s=1.0), 2)
    assert measured.all_reduce(1e6) == pytest.approx(700e-6 + 1e-3)
    own = NetworkModel(NetworkConfig(all_reduce_latency_us=0.0, all_reduce_bandwidth_gbytes_s=4.0), 2)
    assert own.all_reduce(1e6) == pytest.approx(1e6 / 4e9)


def test_hierarchical_all_to_all_by_hand() -> None:
    """32 nodes of 8: per-peer latency for 7 + 31 peers instead of 255, the NIC's bytes unchanged, the
    node's links carrying 7/8 of the payload first; one node: the flat exchange."""
    base = dict(ranks_per_node=8, intra_latency_us=10.0, inter_latency_us=25.0, per_peer_latency_us=0.5,
                intra_bandwidth_gbytes_s=450.0, inter_bandwidth_gbytes_s=50.0)  # fmt: skip
    flat = NetworkModel(NetworkConfig(**base), 256)
    hier = NetworkModel(NetworkConfig(**base, all_to_all="hierarchical"), 256)
    assert flat.all_to_all(0.0) == pytest.approx(25e-6 + 0.5e-6 * 255)
    assert hier.all_to_all(0.0) == pytest.approx(2 * 10e-6 + 0.5e-6 * 14 + 25e-6 + 0.5e-6 * 31)
    nbytes = 1e6
    assert flat.all_to_all(nbytes) - flat.all_to_all(0.0) == pytest.approx(nbytes * 248 / 256 / 50e9)
    assert hier.all_to_all(nbytes) - hier.all_to_all(0.0) == pytest.approx(nbytes * (7 / 8 / 450e9 + 31 / 32 / 50e9))
    one_node = dict(base, ranks_per_node=256)
    flat_one = NetworkModel(NetworkConfig(**one_node), 256).all_to_all(nbytes)
    assert NetworkModel(NetworkConfig(**one_node, all_to_all="hierarchical"), 256).all_to_all(nbytes) == flat_one
    with pytest.raises(ValueError, match=r"network\.all_to_all must be 'flat' or 'hierarchical'"):
        NetworkConfig(all_to_all="tree")


def test_collectives_side_by_side_share_the_links_bandwidth() -> None:
    """Bandwidth-bound, the gradient exchange and the dense all-reduce in flight together take their
    bandwidth terms one after the other; latency-bound, the longer latency; ``none``'s critical path
    charges the dense all-reduce's bytes beside the gradient exchange."""
    net = NetworkModel(NetworkConfig(intra_latency_us=100.0, intra_bandwidth_gbytes_s=0.01), 2)
    a2a_latency, ar_latency = net.all_to_all(0.0), net.all_reduce(0.0)  # 100 µs; 2 × 100 µs (one hop)
    grads, dense = net.all_to_all(np.array([[2e6, 2e6]])), net.all_reduce(1e6)  # 0.1 s of bytes each
    assert net.side_by_side(grads, a2a_latency, dense, ar_latency)[0] == pytest.approx(200e-6 + 0.1 + 0.1)
    tiny = net.side_by_side(net.all_to_all(np.array([[8.0, 8.0]])), a2a_latency, net.all_reduce(8.0), ar_latency)
    assert tiny[0] == pytest.approx(200e-6, rel=0.01)  # the longer latency, not their sum
    workload = WorkloadConfig(embedding_dim=16, negatives=0, dense_params=250_000, batch_overlap_rate=0.0)
    cfg = SimConfig(network=net.cfg, workload=workload, compute=ComputeConfig(peak_tflops=1.0))
    w = StepWork(np.full((4, 2), 1.0), np.full((4, 2), 1e4), np.full((4, 2), 4.0), None, "test")
    got = time_steps(w, "none", cfg, net, 0.0, np.random.default_rng(0))
    rows = net.all_to_all(np.array([[1e4 * workload.row_bytes] * 2]))[0]  # latency included
    assert got["comm_ms"]["critical"] == pytest.approx(1e3 * (2 * rows - 100e-6 + 200e-6 + 0.1), rel=1e-6)


def test_pec_leaves_the_overlap_share_on_the_critical_path() -> None:
    """With compute long enough to hide the prefetch, PEC's exposed comm is the OL gradients and the
    dense all-reduce: it grows with batch_overlap_rate and stays below overlap=none."""
    net_cfg = NetworkConfig(intra_latency_us=0.0, intra_bandwidth_gbytes_s=1.0)
    work = StepWork(np.full((6, 2), 10.0), np.full((6, 2), 1e5), np.full((6, 2), 4.0), None, "test")
    net = NetworkModel(net_cfg, 2)
    rows = 0.5 * (1e5 + 8) * 64  # a rank's rows leave for the other rank half the time
    exposed = {}
    for rate in (0.0, 0.25, 1.0):
        wl = WorkloadConfig(embedding_dim=16, negatives=8, dense_params=1000, batch_overlap_rate=rate)
        cfg = SimConfig(network=net_cfg, workload=wl, compute=ComputeConfig(peak_tflops=1.0))
        got = time_steps(work, "pec", cfg, net, 0.0, np.random.default_rng(0))
        assert got["comm_ms"]["exposed_prefetch"] == 0.0  # 10 s of compute hides everything
        expected = rate * rows / 1e9 + 2 * 0.5 * 4000 / 1e9
        assert got["comm_ms"]["critical"] == pytest.approx(1e3 * expected)
        exposed[rate] = got["exposed_comm_pct"]
        none = time_steps(work, "none", cfg, net, 0.0, np.random.default_rng(0))
        assert got["exposed_comm_pct"] < none["exposed_comm_pct"]
    assert exposed[0.0] < exposed[0.25] < exposed[1.0]


def test_completion_spread_moves_exposed_comm_into_idle_at_the_next_collective() -> None:
    """Equal work, no jitter: a rank released early from the row exchange waits at the next
    collective, so ``completion_spread`` f turns a share f of the row exchange (here half of the
    exposed communication: the gradient exchange is as large) into idle time, and leaves the bubble
    and the step time as they were; 0 changes nothing."""
    net_cfg = NetworkConfig(intra_latency_us=0.0, intra_bandwidth_gbytes_s=0.01)
    work = StepWork(np.full((200, 2), 0.5), np.full((200, 2), 1e5), np.full((200, 2), 4.0), None, "test")
    wl = WorkloadConfig(embedding_dim=16, negatives=8, dense_params=1000)

    def run(w: StepWork, spread: float) -> dict:
        net = replace(net_cfg, completion_spread=spread)
        cfg = SimConfig(network=net, workload=wl, compute=ComputeConfig(peak_tflops=1.0))
        return time_steps(w, "none", cfg, NetworkModel(net, 2), 0.0, np.random.default_rng(0))

    got = {f: run(work, f) for f in (0.0, 0.1, 0.25)}
    base = got[0.0]
    assert base["straggler_pct"] == 0.0 and base["exposed_comm_pct"] > 20
    for f in (0.1, 0.25):
        assert got[f]["straggler_pct"] == pytest.approx(f / 2 * base["exposed_comm_pct"], rel=0.02)
        assert got[f]["exposed_comm_pct"] == pytest.approx((1 - f / 2) * base["exposed_comm_pct"], rel=0.02)
        assert got[f]["bubble_pct"] == pytest.approx(base["bubble_pct"], rel=0.01)
        assert got[f]["step_s"] == pytest.approx(base["step_s"], rel=0.01)
    # the slow rank's lead shortens the step; the fast rank's lead is absorbed by its shorter compute
    uneven = replace(work, compute=np.tile([0.5, 2.0], (200, 1)))
    assert run(uneven, 0.25)["bubble_pct"] < run(uneven, 0.0)["bubble_pct"]
    with pytest.raises(ValueError, match=r"network\.completion_spread"):
        NetworkConfig(completion_spread=0.7)


# ------------------------------------------------------------------------------------------ the product's algorithms
def test_plan_arm_is_the_planners_prediction(seconds_per_event) -> None:
    """No jitter, free network: the plan arm's straggler_pct is exactly the planner's own prediction."""
    report = simulate(config(seconds_per_event, arms=("plan", "random")), HEAVY)
    for w in (2, 4, 8):
        lengths, _resampled = HEAVY.draw(PLAN_MIN_STEPS * w * 4, np.random.default_rng([0, w, 3]))
        cfg = BalanceConfig(group_size=w, micro_batch_size=4, strategy="planned", seed=0, compare_baselines=False)
        costs = lengths * 1e-6
        expected = predict_straggler_pct(plan_bin_costs(plan_step_groups(costs, cfg), costs, w))
        assert find(report, w, "plan")["straggler_pct"] == pytest.approx(expected, abs=1e-3)
        assert find(report, w, "plan")["straggler_pct"] < find(report, w, "random")["straggler_pct"]


def test_cost_model_error_leaves_planned_steps_imbalanced(seconds_per_event) -> None:
    """Placement uses predicted costs, ranks spend actual ones: a cost model off by 20% per sample
    leaves the plan straggling where the exact model predicts (almost) none; cv 0 changes nothing."""

    def plan_with(cv: float | None):
        compute = ComputeConfig(cost_model=seconds_per_event, **({} if cv is None else {"cost_error_cv": cv}))
        return simulate(config(seconds_per_event, arms=("plan",), compute=compute), HEAVY)

    exact, off, zero = plan_with(None), plan_with(0.2), plan_with(0.0)
    for w in (2, 4, 8):
        assert find(off, w, "plan")["straggler_pct"] > find(exact, w, "plan")["straggler_pct"] + 0.5
        assert find(zero, w, "plan")["straggler_pct"] == find(exact, w, "plan")["straggler_pct"]
    with pytest.raises(ValueError, match=r"compute\.cost_error_cv"):
        ComputeConfig(cost_model=seconds_per_event, cost_error_cv=-0.1)


def test_online_placement_never_straggles_more_than_random(seconds_per_event) -> None:
    report = simulate(config(seconds_per_event, world_sizes=(2, 8, 32)), HEAVY)
    for w in (2, 8, 32):
        random, online = find(report, w, "random"), find(report, w, "online")
        assert online["straggler_pct"] <= random["straggler_pct"] + 1e-9
        assert online["imbalance_mean"] <= random["imbalance_mean"] + 1e-9
    assert find(report, 32, "online")["straggler_pct"] < find(report, 32, "random")["straggler_pct"]


# ------------------------------------------------------------------------------------------ properties
def test_exposed_comm_grows_with_latency(seconds_per_event) -> None:
    base = config(seconds_per_event, workload=replace(config(seconds_per_event).workload, batch_overlap_rate=0.2))
    previous = None
    for latency in (0.0, 10.0, 100.0, 1000.0):
        net = NetworkConfig(ranks_per_node=2, intra_latency_us=latency, inter_latency_us=2 * latency)
        rows = simulate(replace(base, network=net), HEAVY)["rows"]
        figures = {(r["world_size"], r["arm"], r["overlap"]): (r["exposed_comm_pct"], r["step_s"]) for r in rows}
        if previous is not None:
            for key, (comm, step) in figures.items():
                assert comm > previous[key][0] and step > previous[key][1], key
        previous = figures


def test_same_seed_same_report_other_seed_other_draws(seconds_per_event) -> None:
    cfg = config(seconds_per_event, jitter=JitterConfig(cv=0.05), network=NetworkConfig())

    def rows(seed: int) -> list[dict]:
        return simulate(replace(cfg, seed=seed), HEAVY)["rows"]

    assert rows(3) == rows(3)
    assert rows(3) != rows(4)


def test_jitter_solved_from_a_noise_floor_reproduces_it(seconds_per_event) -> None:
    """Identical work: the noise floor measured at 2 ranks comes back at 2 ranks and grows with W."""
    cfg = config(
        seconds_per_event,
        world_sizes=(2, 64),
        arms=("random",),
        jitter=JitterConfig(noise_floor_pct=5.0, noise_floor_world_size=2),
        workload=WorkloadConfig(micro_batch_size=1, steps=2000, embedding_dim=16, negatives=0),
    )
    sigma, origin = jitter_sigma(cfg.jitter, 0)
    assert sigma > 0 and "noise floor" in origin
    report = simulate(cfg, data(np.full(10, 50)))
    assert find(report, 2, "random")["straggler_pct"] == pytest.approx(5.0, abs=0.4)
    assert find(report, 64, "random")["straggler_pct"] > 15.0
    assert jitter_sigma(JitterConfig(noise_floor_pct=0.0), 0)[0] == 0.0


# ------------------------------------------------------------------------------------------ validation
def test_shipped_profiles_load_and_cite_their_numbers() -> None:
    names = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
    assert "h100_nvlink_ib400" in names
    default = HardwareProfile.load("h100_nvlink_ib400")  # SimConfig's defaults are the default profile's
    assert (SimConfig().compute, SimConfig().network, SimConfig().jitter) == (
        default.compute,
        default.network,
        default.jitter,
    )
    for name in names:
        profile = HardwareProfile.load(name)
        assert profile.network.ranks_per_node >= 1 and profile.compute.peak_tflops
        text = (PROFILE_DIR / f"{name}.toml").read_text()
        for line in text.splitlines():  # every number has a comment above it (its source or ASSUMPTION)
            if "=" in line and not line.startswith(("#", "name", "description")):
                before = text[: text.index(line)].rstrip().splitlines()[-1]
                assert before.startswith("#"), f"{name}: {line!r} has no source comment"


@pytest.mark.parametrize(
    ("table", "body", "option"),
    [
        ("network", "inter_bandwidth_gbytes_s = 0", "network.inter_bandwidth_gbytes_s"),
        ("network", "ranks_per_node = 0", "network.ranks_per_node"),
        ("network", "intra_latency_us = -1", "network.intra_latency_us"),
        ("compute", "mfu = 1.5", "compute.mfu"),
        ("compute", "peak_tflops = 'fast'", "compute.peak_tflops"),
        ("jitter", "noise_floor_pct = 120", "jitter.noise_floor_pct"),
        ("network", "bandwidth = 3", "unknown option(s) ['bandwidth'] in [network]"),
    ],
)
def test_profile_errors_name_the_option(tmp_path, table, body, option) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        f"[compute]\npeak_tflops = 100.0\n[{table}]\n{body}\n" if table != "compute" else f"[compute]\n{body}\n"
    )
    with pytest.raises(ValueError, match=r"bad\.toml") as error:
        HardwareProfile.load(str(path))
    assert option in str(error.value)


def test_config_and_distribution_errors() -> None:
    with pytest.raises(ValueError, match="--overlap pec needs --batch-overlap-rate"):
        SimConfig(overlaps=("pec",))
    with pytest.raises(ValueError, match="--arms"):
        SimConfig(arms=("magic",))
    with pytest.raises(ValueError, match="--batch-overlap-rate"):
        WorkloadConfig(batch_overlap_rate=1.5)
    with pytest.raises(ValueError, match="missing \\['sigma'\\]"):
        parse_distribution("lognormal:median=300,cap=100")
    with pytest.raises(ValueError, match="unknown distribution"):
        parse_distribution("zipf:a=1")
    with pytest.raises(ValueError, match="no such file or shipped profile"):
        HardwareProfile.load("no_such_profile")
    x = parse_distribution("pareto:scale=10,alpha=1.2,cap=500").draw(10_000, np.random.default_rng(0))[0]
    assert x.min() >= 10 and x.max() == 500


# ------------------------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, str]:
    out = tmp_path_factory.mktemp("sim")
    generate(preset("tiny", seed=3), str(out / "src"))
    sources = str(out / "src" / "sources.toml")
    prepare(make_config(sources, str(out / "ds")))  # G = 4, k = 4, max_uih_len 2048
    return sources, str(out / "ds")


def test_cli_end_to_end_on_a_prepared_dataset(tiny, tmp_path, capsys) -> None:
    sources, dataset = tiny
    out = tmp_path / "sim"
    args = ["simulate", dataset, "--out", str(out), "--world-sizes", "2,4,8", "-k", "4", "--steps", "4"]
    assert cli_main([*args, "--batch-overlap-rate", "0.2", "--noise-floor", "3@2", "--quiet"]) == 0
    report = json.loads((out / "simulate.json").read_text())
    assert (out / "simulate.png").stat().st_size > 10_000
    assert len(report["rows"]) == 3 * 4 * 2
    n = int(PreparedDataset(dataset).offsets[-1])
    assert report["lengths"]["samples"] == n and report["lengths"]["own_plan"]["group_size"] == 4
    for w in (2, 4):  # W divides G: the dataset's own plan, all of it
        row = find(report, w, "plan", "pec")
        assert row["source"].startswith("dataset's own planned layout") and not row["resampled"]
        assert row["steps"] == PreparedDataset(dataset).n_micro_batches // w
    assert find(report, 8, "plan")["source"] == "planner (G = W)"
    for row in report["rows"]:
        assert row["bubble_pct"] == pytest.approx(row["straggler_pct"] + row["exposed_comm_pct"], abs=1e-3)
        assert 0 <= row["straggler_pct"] < 100 and row["samples_per_s"] > 0
    printed = capsys.readouterr().out
    assert "straggler%" in printed and "wrote simulate.json, simulate.png" in printed

    # raw sources through prepare's own phases give the same lengths the prepared dataset holds
    raw = tmp_path / "raw"
    assert cli_main(["simulate", sources, "--out", str(raw), "--max-uih-len", "2048", "--world-sizes", "2",
                     "--arms", "random", "--steps", "2", "-k", "4", "--no-plot", "--quiet"]) == 0  # fmt: skip
    raw_report = json.loads((raw / "simulate.json").read_text())
    assert raw_report["lengths"]["samples"] == n
    for key in ("mean", "p50", "p99", "max"):
        assert raw_report["lengths"][key] == report["lengths"][key]


def test_cli_errors_are_one_line(tiny, tmp_path, capsys) -> None:
    _, dataset = tiny
    base = ["simulate", dataset, "--out", str(tmp_path / "o"), "--quiet", "--world-sizes", "2"]
    cases = [
        (["--set", "network.ranks_per_node=0"], "network.ranks_per_node"),
        (["--set", "network.nope=1"], "unknown option(s) ['nope'] in [network]"),
        (["--overlap", "pec"], "--batch-overlap-rate"),
        (["--world-sizes", "2,x"], "--world-sizes"),
        (["--noise-floor", "abc"], "--noise-floor"),
        (["--profile", str(tmp_path / "missing.toml")], "missing.toml"),
    ]
    for extra, needle in cases:
        assert cli_main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert err.startswith("freescale simulate: error:") and needle in err and "\n" not in err, err
    assert cli_main(["simulate", str(tmp_path / "nowhere"), "--quiet"]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert cli_main(["simulate", "lognormal:median=3", "--quiet", "--out", str(tmp_path / "o")]) == 2
    assert "missing" in capsys.readouterr().err


def test_write_plot_and_summary_from_a_distribution(tmp_path) -> None:
    out = tmp_path / "d"
    argv = ["simulate", "lognormal:median=300,sigma=1.2,cap=21000", "--out", str(out), "--world-sizes", "8,64"]
    assert cli_main([*argv, "--steps", "4", "--batch-overlap-rate", "0.1", "--quiet"]) == 0
    report = json.loads((out / "simulate.json").read_text())
    assert report["profile"]["name"] == "h100_nvlink_ib400"
    assert report["cost"]["origin"].startswith("analytic FLOPs")
    # planning beats random batching at scale (the quick model of docs/design.md#balancing: ≈0% vs > 80%
    # of the per-sample work; the profile's fixed costs per micro-batch, layer and step, the same on
    # every rank, dilute the imbalance to ~23% of the step)
    assert find(report, 64, "plan")["straggler_pct"] < 5 < 15 < find(report, 64, "random")["straggler_pct"]
    assert Path(out / "simulate.png").exists()


def test_a_user_profile_file_changes_only_what_it_says(tmp_path, capsys) -> None:
    """A copy of the H100 profile with a 4x slower NIC: multi-node W pay more exposed comm, one node
    (W <= 8 ranks) predicts exactly the same."""
    text = (PROFILE_DIR / "h100_nvlink_ib400.toml").read_text()
    slow = tmp_path / "slow_nic.toml"
    slow.write_text(text.replace("inter_bandwidth_gbytes_s = 50.0", "inter_bandwidth_gbytes_s = 12.5"))
    reports = {}
    for name, profile in (("h100", "h100_nvlink_ib400"), ("slow", str(slow))):
        out = tmp_path / name
        argv = ["simulate", "lognormal:median=100,sigma=1.0,cap=2000", "--out", str(out), "--profile", profile]
        assert cli_main([*argv, "--world-sizes", "8,64", "--steps", "4", "--arms", "random,plan", "--quiet"]) == 0
        reports[name] = json.loads((out / "simulate.json").read_text())
    assert reports["slow"]["profile"]["path"] == str(slow)
    for arm in ("random", "plan"):
        assert find(reports["slow"], 8, arm) == find(reports["h100"], 8, arm)
        assert find(reports["slow"], 64, arm)["exposed_comm_pct"] > find(reports["h100"], 64, arm)["exposed_comm_pct"]
