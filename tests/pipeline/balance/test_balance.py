"""Properties of the step-group planner (docs/design.md#balancing), checked with hypothesis.

Every plan must hold every sample exactly once, keep the counts its mode promises, and keep every
step within the provable greedy bound (max bin ≤ total/G + largest item ≤ 2 × lower_bound); on
heavy-tailed costs the planned strategy must beat within-step balancing, which must beat random
batching, also when read by a smaller world size.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freescale.pipeline.balance import (
    BalanceConfig,
    BalancePlan,
    lower_bound,
    plan_bin_costs,
    plan_step_groups,
    predict_straggler_pct,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cost_arrays(draw) -> np.ndarray:
    """Random costs with zeros, ties, a single huge outlier, any length (incl. < G·k, 0)."""
    n = draw(st.integers(0, 160))
    kind = draw(st.sampled_from(["lognormal", "ties", "zeros", "outlier", "mixed"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "lognormal":
        c = rng.lognormal(0.0, draw(st.floats(0.1, 2.5)), n)
    elif kind == "ties":
        c = rng.integers(0, 4, n).astype(np.float64)
    elif kind == "zeros":
        c = np.zeros(n)
    elif kind == "outlier":
        c = rng.random(n)
        if n:
            c[rng.integers(n)] = 1e6
    else:
        c = rng.lognormal(0.0, 1.5, n)
        c[rng.random(n) < 0.3] = 0.0
        c[rng.random(n) < 0.3] = 1.0
    return np.round(c, 3)


configs = st.builds(
    BalanceConfig,
    group_size=st.integers(1, 6),
    micro_batch_size=st.integers(1, 5),
    mode=st.sampled_from(["equal_count", "free_count"]),
    strategy=st.sampled_from(["planned", "within_step", "random"]),
    max_outlier_fraction=st.sampled_from([0.0, 0.1, 0.5]),
    algorithms=st.sampled_from([("lpt",), ("kk",), ("lpt", "kk")]),
    refine_swaps=st.sampled_from([0, 4]),
    seed=st.integers(0, 3),
    free_outliers=st.sampled_from(["auto", "off"]),
)


def _steps(plan: BalancePlan, costs: np.ndarray):
    g, o = plan.group_size, plan.micro_batch_offsets
    for s in range(plan.n_step_groups):
        mbs = [costs[plan.order[o[m] : o[m + 1]]] for m in range(s * g, (s + 1) * g)]
        yield s, mbs


@SETTINGS
@given(costs=cost_arrays(), config=configs)
def test_every_sample_once_and_offsets_consistent(costs: np.ndarray, config: BalanceConfig) -> None:
    plan = plan_step_groups(costs, config)
    n, g = costs.size, config.group_size
    assert plan.order.dtype == np.int64 and plan.micro_batch_offsets.dtype == np.int64
    assert np.array_equal(np.sort(plan.order), np.arange(n))
    o = plan.micro_batch_offsets
    assert o[0] == 0 and o[-1] == n and np.all(np.diff(o) >= 0)
    assert plan.n_micro_batches % g == 0
    rep = plan.report
    assert rep["n_samples"] == n and rep["n_micro_batches"] == plan.n_micro_batches
    assert rep["n_step_groups"] == plan.n_step_groups == plan.n_micro_batches // g
    json.dumps(rep)  # JSON-serialisable


@SETTINGS
@given(costs=cost_arrays(), config=configs)
def test_counts_respected(costs: np.ndarray, config: BalanceConfig) -> None:
    plan = plan_step_groups(costs, config)
    g, k = config.group_size, config.micro_batch_size
    counts = np.diff(plan.micro_batch_offsets).reshape(-1, g)
    left = plan.report["leftover"]
    partial = left["partial_step_group"]
    full = counts[:-1] if partial else counts
    free = np.zeros(counts.shape[0], dtype=bool)
    free[plan.report["free_count_outliers"]["step_groups"]] = True
    assert plan.report["free_count_outliers"]["samples"] == int(counts[free].sum())
    if config.mode == "equal_count":
        assert np.all(full[~free[: full.shape[0]]] == k)  # exactly k per micro-batch in full steps
        assert np.all(counts[free] >= 1)  # free-count outlier steps: counts free, none empty
        if partial:  # a last group of its own, or the leftover absorbed into the last full group
            assert counts[-1].max() - counts[-1].min() <= 1
            assert counts[-1].sum() in (left["samples"], g * k + left["samples"])
        else:
            assert left["samples"] == 0
    elif costs.size >= g:
        assert counts.min() >= 1  # free count: every micro-batch non-empty
    assert plan.report["empty_micro_batches"] == int((counts == 0).sum())


@SETTINGS
@given(costs=cost_arrays(), config=configs.filter(lambda c: c.strategy != "random"))
def test_steps_within_greedy_bound(costs: np.ndarray, config: BalanceConfig) -> None:
    plan = plan_step_groups(costs, config)
    g = config.group_size
    for _, mbs in _steps(plan, costs):
        items = np.concatenate(mbs)
        loads = np.array([m.sum() for m in mbs])
        tol = 1e-9 * max(1.0, items.sum())
        assert loads.max() <= items.sum() / g + items.max() + tol
        assert loads.max() <= 2 * lower_bound(items, g) + tol


def test_lower_bound_forms() -> None:
    assert lower_bound(np.array([5.0, 1, 1, 1]), 2) == 5.0  # largest item
    assert lower_bound(np.array([2.0, 2, 2, 2]), 2) == 4.0  # total / bins
    # exactly 2 per bin: the largest shares its bin with at least the smallest other item
    assert lower_bound(np.array([4.0, 3, 3, 1]), 2, items_per_bin=2) == 5.5
    assert lower_bound(np.array([10.0, 3, 2, 1]), 2, items_per_bin=2) == 11.0
    assert lower_bound(np.array([]), 3) == 0.0
    with pytest.raises(ValueError, match="bins"):
        lower_bound(np.ones(3), 0)


def test_predict_straggler_pct() -> None:
    # step 1: max 4, mean 2 → idle 2; step 2: balanced → idle 0; Σ idle / Σ wall = 2 / (4 + 2)
    b = np.array([[4.0, 0.0], [2.0, 2.0]])
    assert predict_straggler_pct(b) == pytest.approx(100 * 2 / 6)
    assert predict_straggler_pct(np.zeros((3, 4))) == 0.0
    assert predict_straggler_pct(np.zeros((0, 4))) == 0.0
    with pytest.raises(ValueError, match="bin_costs"):
        predict_straggler_pct(np.ones(4))


@SETTINGS
@given(costs=cost_arrays(), config=configs)
def test_deterministic(costs: np.ndarray, config: BalanceConfig) -> None:
    a, b = plan_step_groups(costs, config), plan_step_groups(costs.copy(), config)
    assert np.array_equal(a.order, b.order)
    assert np.array_equal(a.micro_batch_offsets, b.micro_batch_offsets)
    ra, rb = dict(a.report), dict(b.report)
    ra.pop("runtime_s"), rb.pop("runtime_s")
    assert ra == rb


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("group_size", 0),
        ("group_size", 2.5),
        ("micro_batch_size", 0),
        ("mode", "tokens"),
        ("strategy", "greedy"),
        ("max_outlier_fraction", 1.5),
        ("max_outlier_fraction", -0.1),
        ("target_imbalance", 0.9),
        ("target_imbalance", float("inf")),
        ("algorithms", ()),
        ("algorithms", ("lpt", "ckk")),
        ("algorithms", ("lpt", "lpt")),
        ("refine_swaps", -1),
        ("cost_budget", 0.0),
        ("cost_budget", float("nan")),
        ("seed", -1),
        ("compare_baselines", 1),
        ("free_outliers", "sometimes"),
    ],
)
def test_validation_names_the_option(option: str, value) -> None:
    with pytest.raises(ValueError, match=option):
        BalanceConfig(**{option: value})


def test_bad_costs_and_world_size() -> None:
    with pytest.raises(ValueError, match="costs"):
        plan_step_groups(np.array([1.0, -1.0]), BalanceConfig())
    with pytest.raises(ValueError, match="costs"):
        plan_step_groups(np.array([1.0, np.nan]), BalanceConfig())
    with pytest.raises(ValueError, match="costs"):
        plan_step_groups(np.ones((2, 2)), BalanceConfig())
    plan = plan_step_groups(np.ones(64), BalanceConfig(group_size=4, micro_batch_size=4))
    with pytest.raises(ValueError, match="world_size"):
        plan_bin_costs(plan, np.ones(64), 3)
    assert BalanceConfig(algorithms=["kk"]).algorithms == ("kk",)


def _heavy_tailed(n: int, seed: int = 0) -> np.ndarray:
    """The paper-like length distribution (lognormal median 300, σ 1.2, cap 21k), cost L² + 1280 L."""
    lengths = np.minimum(np.exp(np.random.default_rng(seed).normal(np.log(300), 1.2, n)), 21_000).round()
    return lengths**2 + 1280 * lengths


@pytest.fixture(scope="module")
def heavy_plans() -> dict[str, tuple[np.ndarray, BalancePlan]]:
    costs = _heavy_tailed(40_000)
    out = {}
    for mode in ("equal_count", "free_count"):
        plan = plan_step_groups(costs, BalanceConfig(group_size=16, micro_batch_size=16, mode=mode))
        out[mode] = (costs, plan)
    return out


@pytest.mark.parametrize("mode", ["equal_count", "free_count"])
def test_planned_beats_within_step_beats_random(heavy_plans, mode: str) -> None:
    costs, plan = heavy_plans[mode]
    pct = plan.report["straggler_pct"]
    assert pct["plan"] <= pct["within_step"] <= pct["random"]
    assert pct["plan"] < 1.0 < 30.0 < pct["random"]
    assert pct["plan"] == pytest.approx(predict_straggler_pct(plan_bin_costs(plan, costs, 16)), abs=1e-3)
    # the strategies on their own agree with the planned report's baselines
    cfg = plan.report["config"]
    for name in ("within_step", "random"):
        alone = BalanceConfig(**{**cfg, "strategy": name, "compare_baselines": False})
        other = plan_step_groups(costs, alone)
        assert other.report["straggler_pct"]["plan"] == pytest.approx(pct[name], abs=1e-3)
    bias = plan.report["composition_bias"]
    assert bias["plan"] >= bias["random"]  # the measurable price of grouping outliers
    assert plan.report["outlier_fraction"] <= plan.report["max_outlier_fraction"]
    assert plan.report["outlier_steps"] == len(plan.report["outlier_step_groups"])


@pytest.mark.parametrize("mode", ["equal_count", "free_count"])
@pytest.mark.parametrize("world_size", [8, 4])
def test_smaller_world_sizes_stay_balanced(heavy_plans, mode: str, world_size: int) -> None:
    costs, plan = heavy_plans[mode]
    b = plan_bin_costs(plan, costs, world_size)
    assert b.shape == (plan.n_micro_batches // world_size, world_size)
    assert predict_straggler_pct(b) < 1.0
    groups = plan_bin_costs(plan, costs, 16)
    # a W-slice of a group is never more spread than the whole group
    slice_ratio = (b.max(1) / np.maximum(b.min(1), 1e-300)).reshape(len(groups), -1).max(1)
    assert np.all(slice_ratio <= groups.max(1) / np.maximum(groups.min(1), 1e-300) * (1 + 1e-12))
    assert plan.report["straggler_pct_by_world_size"][str(world_size)] == pytest.approx(
        predict_straggler_pct(b), abs=1e-3
    )


def test_single_huge_outlier_gets_a_sorted_step() -> None:
    """One sample costing more than a whole micro-batch's share: within-step balancing cannot
    absorb it; the planned strategy groups it with the next-heaviest samples."""
    costs = np.ones(4096)
    costs[:16] = np.linspace(40, 50, 16)
    cfg = BalanceConfig(group_size=8, micro_batch_size=8, max_outlier_fraction=0.1)
    plan = plan_step_groups(costs, cfg)
    rep = plan.report
    assert rep["outlier_steps"] >= 1
    assert rep["straggler_pct"]["plan"] < rep["straggler_pct"]["within_step"]
    assert rep["imbalance"]["max"] <= cfg.target_imbalance


def test_leftover_reported_and_planned_leftover_is_cheap() -> None:
    """G·k does not divide n: the last group is shorter (counts differ by at most one) and holds,
    for the planned strategy, the cheapest samples, so it stays balanced."""
    costs = _heavy_tailed(8 * 16 * 20 + 45, seed=3)
    plan = plan_step_groups(costs, BalanceConfig(group_size=8, micro_batch_size=16, free_outliers="off"))
    left = plan.report["leftover"]
    assert left["samples"] == 45 and left["partial_step_group"] and not left["absorbed_into_last_full_group"]
    assert (left["min_count"], left["max_count"]) == (5, 6)
    last = plan.order[plan.micro_batch_offsets[-9] :]
    assert np.array_equal(np.sort(costs[last]), np.sort(costs)[:45])
    assert left["imbalance"] < 1.1
    # fewer than G leftover samples join the last group instead (no empty micro-batch)
    cfg = BalanceConfig(group_size=8, micro_batch_size=16, free_outliers="off")
    plan = plan_step_groups(costs[: 8 * 16 * 20 + 5], cfg)
    assert plan.report["leftover"]["absorbed_into_last_full_group"]
    assert plan.report["empty_micro_batches"] == 0


def test_free_outliers_keep_the_cheap_leftover() -> None:
    """With free-count outlier steps the leftover is (n − free-step samples) mod G·k and still the
    cheapest samples; here (20 steps of 128 samples) G·k outlier steps reach 14.8%, free ones < 1%."""
    costs = _heavy_tailed(8 * 16 * 20 + 45, seed=3)
    plan = plan_step_groups(costs, BalanceConfig(group_size=8, micro_batch_size=16))
    rep = plan.report
    free = rep["free_count_outliers"]
    assert free["steps"] >= 1 and rep["outlier_search"]["free_outliers_used"]
    assert rep["straggler_pct"]["plan"] < 1.0 and rep["target_reached"]
    left = rep["leftover"]
    assert left["samples"] == (costs.size - free["samples"]) % (8 * 16)
    last = plan.order[plan.micro_batch_offsets[-9] :]
    assert np.array_equal(np.sort(costs[last]), np.sort(costs)[: left["samples"]])


def _pareto_tailed(n: int, seed: int = 0) -> np.ndarray:
    """Pareto(α = 1.5) lengths from 50 (median ≈ 80), capped at 4,000: a heavier tail than the
    lognormal, where a few samples outweigh a rank's share of a G = 256 step."""
    lengths = np.minimum(np.round(50 * (1 + np.random.default_rng(seed).pareto(1.5, n))), 4_000)
    return lengths**2 + 1280 * lengths


def _lognormal_capped(n: int, seed: int = 0) -> np.ndarray:
    lengths = np.minimum(np.exp(np.random.default_rng(seed).normal(np.log(300), 1.2, n)), 4_000).round()
    return lengths**2 + 1280 * lengths


@pytest.fixture(scope="module")
def tail_plans() -> dict[tuple[str, int], tuple[np.ndarray, BalancePlan]]:
    out = {}
    for shape, make in (("pareto", _pareto_tailed), ("lognormal", _lognormal_capped)):
        costs = make(50_000)
        for g in (8, 64, 256):
            out[shape, g] = (costs, plan_step_groups(costs, BalanceConfig(group_size=g)))
    return out


@pytest.mark.parametrize("shape", ["pareto", "lognormal"])
@pytest.mark.parametrize("g", [8, 64, 256])
def test_default_plan_under_1pct_on_heavy_tails(tail_plans, shape: str, g: int) -> None:
    """The default plan (equal_count, k = 32) holds ≤ 1% predicted straggler_pct at G = 8, 64, 256
    on 50k samples (6 step groups at G = 256). Before free-count outlier steps the Pareto shape
    stayed at 63% at G = 256: no G·k outlier step fits in max_outlier_fraction = 10%."""
    costs, plan = tail_plans[shape, g]
    rep = plan.report
    assert np.array_equal(np.sort(plan.order), np.arange(costs.size))  # every sample once
    assert rep["straggler_pct"]["floor"] == 0.0  # feasible: no sample outweighs total / G
    assert rep["straggler_pct"]["plan"] <= 1.0
    assert predict_straggler_pct(plan_bin_costs(plan, costs, g)) <= 1.0
    assert rep["target_reached"]  # max/mean ≤ 1.01 on every full step
    # the composition bias stays bounded by the knob and is reported consistently
    counts = np.diff(plan.micro_batch_offsets).reshape(-1, g)
    outlier = rep["outlier_step_groups"]
    free = rep["free_count_outliers"]
    assert rep["outlier_fraction"] <= rep["max_outlier_fraction"]
    assert rep["outlier_fraction"] * costs.size == pytest.approx(counts[outlier].sum())
    assert set(free["step_groups"]) <= set(outlier)
    assert free["samples"] == counts[free["step_groups"]].sum()
    assert free["sample_share"] == pytest.approx(free["samples"] / costs.size)
    others = np.setdiff1d(np.arange(counts.shape[0] - 1), free["step_groups"])
    assert np.all(counts[others] == 32)  # every other full step keeps exactly k
    if outlier:
        assert rep["composition_bias"]["plan_outlier_steps"] > rep["composition_bias"]["random"]


def test_free_outliers_off_keeps_the_old_plan() -> None:
    """``free_outliers="off"`` is the previous planner: on the Pareto shape at G = 256 its G·k
    outlier steps do not fit the bound and the plan straggles."""
    costs = _pareto_tailed(50_000)
    off = plan_step_groups(costs, BalanceConfig(group_size=256, free_outliers="off", compare_baselines=False))
    assert off.report["straggler_pct"]["plan"] > 30.0
    assert off.report["free_count_outliers"]["steps"] == 0
    assert not off.report["outlier_search"]["free_outliers_used"]


def test_straggler_floor_bounds_every_plan() -> None:
    """One sample costing more than a rank's share of the whole dataset: no plan beats the floor
    1 − (total / G) / c₁; the planner gets as close as max_outlier_fraction allows and says so."""
    costs = np.ones(20_000)
    costs[0] = 2_000.0  # total / G = 21,999 / 16 ≈ 1,375 < 2,000
    floor = 100 * (1 - costs.sum() / 16 / 2_000)
    for fraction in (0.1, 1.0):
        cfg = BalanceConfig(group_size=16, micro_batch_size=8, max_outlier_fraction=fraction)
        rep = plan_step_groups(costs, cfg).report
        assert rep["straggler_pct"]["floor"] == pytest.approx(floor, abs=1e-3)
        assert rep["straggler_pct"]["plan"] >= floor - 1e-3
        assert not rep["target_reached"]
        assert rep["outlier_fraction"] <= fraction
    # with the whole dataset allowed in outlier steps the plan sits on the floor
    assert rep["straggler_pct"]["plan"] == pytest.approx(floor, abs=0.5)


def test_prepare_flag_sets_free_outliers() -> None:
    """``freescale prepare --free-outliers off`` reaches the planner; the default is auto."""
    from freescale.tools.cli import build_parser
    from freescale.tools.commands.prepare import prepare_config_from_args

    base = ["prepare", "--sources", "s.toml", "--output", "out"]
    args = build_parser().parse_args(base)
    assert prepare_config_from_args(args).balance.free_outliers == "auto"
    args = build_parser().parse_args([*base, "--free-outliers", "off"])
    assert prepare_config_from_args(args).balance.free_outliers == "off"


def test_stats_lower_bound_skips_the_k_form_on_free_steps() -> None:
    """``freescale stats`` figures: a free-count outlier step (one micro-batch holds the one heavy
    sample alone) is measured against the free lower bound, so max / lower_bound never drops below
    1; the k-items form still applies to equal-count steps."""
    from freescale.pipeline.stats.figures import step_figures

    free_step = np.array([10.0] + [1.0] * 10)  # bins: [10] and ten 1s: max 10 = total / 2 = largest
    equal_step = np.array([10.0, 1.0, 1.0, 1.0])  # k = 2: the 10 shares its bin with a 1
    figures = step_figures(np.array([[10.0, 10.0], [11.0, 2.0]]), [free_step, equal_step], items_per_bin=2)
    assert figures["max_over_lower_bound"]["mean"] == pytest.approx(1.0)
    assert figures["max_over_lower_bound"]["max"] == pytest.approx(1.0)


def test_outlier_share_never_exceeds_the_bound() -> None:
    """Fewer than G leftover samples join an ordinary step, not an outlier step, so the samples in
    outlier steps never exceed max_outlier_fraction (here 72 of 234 > 30% before), and free-count
    steps are always outlier steps."""
    costs = np.round(np.random.default_rng(2).lognormal(0, 2.5, 234), 3)
    cfg = BalanceConfig(group_size=3, micro_batch_size=2, max_outlier_fraction=0.3, seed=1)
    plan = plan_step_groups(costs, cfg)
    rep = plan.report
    assert rep["leftover"]["absorbed_into_last_full_group"] and rep["free_count_outliers"]["steps"] > 0
    assert rep["outlier_fraction"] <= 0.3
    assert plan.n_step_groups - 1 not in rep["outlier_step_groups"]
    rng = np.random.default_rng(1)
    for _ in range(60):
        n, g, k = int(rng.integers(0, 300)), int(rng.integers(1, 9)), int(rng.integers(1, 6))
        fraction = float(rng.choice([0.1, 0.3, 1.0]))
        mode = ["equal_count", "free_count"][int(rng.integers(2))]
        cfg = BalanceConfig(group_size=g, micro_batch_size=k, mode=mode, max_outlier_fraction=fraction)
        rep = plan_step_groups(np.round((rng.pareto(1.1, n) + 1) ** 2, 3), cfg).report
        assert rep["outlier_fraction"] <= fraction + 1e-12
        assert set(rep["free_count_outliers"]["step_groups"]) <= set(rep["outlier_step_groups"])
        assert rep["straggler_pct"]["plan"] >= rep["straggler_pct"]["floor"] - 1e-3
