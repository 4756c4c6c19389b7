"""Windowed planning (``--plan-memory``): a small bound plans in windows, stays within the bound, and
costs little balance against a whole-dataset plan on data that fits."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from prepare_configs import make_config

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.balance import BalanceConfig, plan_step_groups
from freescale.pipeline.balance.windows import PLAN_BYTES_PER_SAMPLE, plan_in_windows, windowing_cost
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.prepare import prepare

N = 100_000
CONFIG = BalanceConfig(group_size=8, micro_batch_size=32, seed=2)
BOUND = 4 * 2**20  # ~10k samples a window: 10 windows


@pytest.fixture(scope="module")
def costs() -> np.ndarray:
    lengths = np.minimum(np.random.default_rng(0).lognormal(np.log(300), 1.2, N), 21_000)
    return lengths**2 + 1280 * lengths


def traced_peak(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_small_bound_plans_in_windows_within_it(costs) -> None:
    plan, peak = traced_peak(lambda: plan_in_windows(costs, CONFIG, BOUND))
    windowing = plan.report["windowing"]
    unit = CONFIG.group_size * CONFIG.micro_batch_size
    assert windowing["windows"] == -(-N // windowing["window_samples"]) >= 5
    assert windowing["window_samples"] % unit == 0
    assert np.array_equal(np.sort(plan.order), np.arange(N))  # every sample once
    assert plan.micro_batch_offsets[-1] == N and plan.n_micro_batches % CONFIG.group_size == 0
    per_sample_outputs = 40 * N  # costs, permutation, order, offsets: the plan itself
    assert peak <= BOUND + per_sample_outputs, peak
    _, whole_peak = traced_peak(lambda: plan_step_groups(costs, CONFIG))
    assert whole_peak > 2 * (BOUND + per_sample_outputs)  # the bound is what made the difference
    assert plan.report["imbalance"]["max"] < 1.05


def test_fits_means_one_plan(costs) -> None:
    plan = plan_in_windows(costs[:1000], CONFIG, 1000 * PLAN_BYTES_PER_SAMPLE)
    whole = plan_step_groups(costs[:1000], CONFIG)
    assert plan.report["windowing"]["windows"] == 1
    assert np.array_equal(plan.order, whole.order)


def test_windowing_cost_is_reported_against_the_whole_plan(costs) -> None:
    plan = plan_in_windows(costs, CONFIG, BOUND, compare_memory=2**30)
    cost = plan.report["windowing"]["cost"]
    assert plan.report["windowing"]["windows"] >= 5
    assert cost == windowing_cost(costs, CONFIG, plan.report)
    assert cost["whole"] == {
        "imbalance_max": plan_step_groups(costs, CONFIG).report["imbalance"]["max"],
        **{key: cost["whole"][key] for key in ("imbalance_mean", "straggler_pct", "composition_bias")},
    }
    assert cost["windowed"]["straggler_pct"] == plan.report["straggler_pct"]["plan"]
    assert cost["windowed"]["straggler_pct"] <= cost["whole"]["straggler_pct"] + 1.0
    assert cost["windowed"]["imbalance_max"] <= cost["whole"]["imbalance_max"] + 0.05
    assert 0 < cost["windowed"]["composition_bias"] < 1
    delta = cost["windowed_minus_whole"]
    assert delta["imbalance_max"] == cost["windowed"]["imbalance_max"] - cost["whole"]["imbalance_max"]


def test_windowing_cost_says_why_it_was_not_compared(costs) -> None:
    """A whole plan over half the memory given is not made: the report says so instead."""
    plan = plan_in_windows(costs, CONFIG, BOUND, compare_memory=N * PLAN_BYTES_PER_SAMPLE)
    assert "over half of --memory-limit" in plan.report["windowing"]["cost"]["skipped"]
    assert "cost" not in plan_in_windows(costs, CONFIG, BOUND).report["windowing"]


def test_prepare_with_a_small_plan_memory_reports_its_windows(tmp_path) -> None:
    """Sliding windows of a tiny dataset: ~40k samples, whose plan needs ~16 MB: 1 MB plans in windows."""
    generate(preset("tiny", seed=3, n_users=1500), str(tmp_path / "src"))
    sources = str(tmp_path / "src" / "sources.toml")
    samples = SampleConfig(max_uih_len=64, window_stride=1)
    whole = prepare(make_config(sources, str(tmp_path / "whole"), samples=samples))
    windowed = prepare(make_config(sources, str(tmp_path / "windowed"), samples=samples, plan_memory=2**20))
    assert whole["balance"]["windowing"]["windows"] == 1
    windowing = windowed["balance"]["windowing"]
    assert windowing["windows"] == -(-whole["rows"]["samples"] // windowing["window_samples"]) > 1
    assert windowing["window_samples"] * PLAN_BYTES_PER_SAMPLE <= 2**20
    assert windowed["rows"] == whole["rows"]
    assert windowed["fingerprint"] != whole["fingerprint"]  # another plan, another dataset
    cost, whole_pct = windowed["balance"]["straggler_pct"]["plan"], whole["balance"]["straggler_pct"]["plan"]
    assert cost <= whole_pct + 1.0 < windowed["balance"]["straggler_pct"]["random"]
    compared = windowing["cost"]  # the whole plan fits --memory-limit: what windowing cost is reported
    assert compared["whole"]["straggler_pct"] == whole_pct
    assert compared["whole"]["imbalance_max"] == whole["balance"]["imbalance"]["max"]
    assert compared["windowed"]["straggler_pct"] == cost
    assert "cost" not in whole["balance"]["windowing"]
