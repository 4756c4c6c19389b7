"""Planning in windows of step groups, so the planner's memory is bounded (``--plan-memory``).

``plan_step_groups`` holds ~300 bytes per sample while it plans (``memory.PLAN_BYTES_PER_SAMPLE``); a
billion samples would need ~300 GB. Past
the bound, samples are dealt into windows by one seeded permutation (so every window is a random
sample of the dataset, like the random steps the planner starts from), each window of a whole number
of step groups (G·k samples each) is planned on its own, and the plans are concatenated in window
order. Memory then holds one window's planner state plus the per-sample arrays of the whole plan
(costs, order: 16 bytes a sample).

What windowing costs: outliers are grouped within a window, not across the dataset, so a window's
heaviest samples may share steps with lighter ones (imbalance), and composition bias is measured
against the window rather than the dataset. ``report["windowing"]`` records the windows and their
spread; given ``compare_memory`` (prepare passes ``--memory-limit``) and data whose whole plan fits it
(``memory.whole_plan_comparable``), ``report["windowing"]["cost"]`` also plans the same costs whole and
sets imbalance, straggler_pct and composition bias side by side (``windowing_cost``), or says why not.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..memory import PLAN_BYTES_PER_SAMPLE, whole_plan_comparable, window_samples
from .config import BalanceConfig
from .measures import predict_straggler_pct
from .plan import BalancePlan
from .planner import plan_step_groups

WINDOW_STREAM = 0x57494E  # random stream of the window membership ("WIN")


def plan_in_windows(
    costs: np.ndarray, config: BalanceConfig, plan_memory: int, compare_memory: int | None = None
) -> BalancePlan:
    """``plan_step_groups(costs, config)`` when it fits ``plan_memory``, else windows of it (see the
    module docstring). Same costs, config and bound → the same plan. ``compare_memory``: what a
    whole plan may hold to report what windowing cost (``None``: no comparison)."""
    costs = np.asarray(costs, np.float64)
    n = costs.size
    size = window_samples(n, config.group_size * config.micro_batch_size, plan_memory)
    if size >= n:
        plan = plan_step_groups(costs, config)
        plan.report["windowing"] = {"windows": 1, "window_samples": n, "plan_memory": plan_memory}
        return plan
    members = np.random.default_rng([config.seed, WINDOW_STREAM]).permutation(n)
    orders, offsets, reports = [], [np.zeros(1, np.int64)], []
    for start in range(0, n, size):  # every window but the last holds whole step groups
        idx = np.sort(members[start : start + size])
        window = plan_step_groups(costs[idx], replace(config, seed=config.seed + start // size))
        orders.append(idx[window.order])
        offsets.append(window.micro_batch_offsets[1:] + start)
        reports.append(window.report)
    plan = BalancePlan(np.concatenate(orders), np.concatenate(offsets), config.group_size)
    plan.report = merged_report(plan, costs, reports, size, plan_memory)
    if compare_memory is not None:
        why_not = whole_plan_comparable(n, compare_memory)
        plan.report["windowing"]["cost"] = (
            windowing_cost(costs, config, plan.report) if why_not is None else {"skipped": why_not}
        )
    return plan


def _weighted(values: list[float], weights: list[float]) -> float:
    total = float(sum(weights))
    return float(np.dot(values, weights) / total) if total else 0.0


def merged_report(
    plan: BalancePlan, costs: np.ndarray, reports: list[dict[str, Any]], size: int, plan_memory: int
) -> dict[str, Any]:
    """One report for the concatenated plan: imbalance, straggler_pct of the plan and micro-batch
    counts computed on it exactly; the baselines' straggler_pct, composition bias and the bound
    ratios are the windows' figures weighted by their step groups (each window is compared with
    its own samples)."""
    g = plan.group_size
    mb = np.bincount(plan.micro_batch_ids(), weights=costs[plan.order], minlength=plan.n_micro_batches)
    bins = mb.reshape(-1, g)
    mean = bins.mean(axis=1)
    imbalance = np.where(mean > 0, bins.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)
    weights = [r["n_step_groups"] for r in reports]
    counts = np.diff(plan.micro_batch_offsets)
    first = reports[0]
    straggler = {
        name: round(_weighted([r["straggler_pct"][name] for r in reports], weights), 4)
        for name in first["straggler_pct"]
    }
    straggler["plan"] = round(predict_straggler_pct(bins), 4)
    bias = {"metric": first["composition_bias"]["metric"] + "_window"}
    for key in ("plan", "random"):
        if key in first["composition_bias"]:
            bias[key] = _weighted([r["composition_bias"][key] for r in reports], weights)
    bias["plan_max"] = max(r["composition_bias"].get("plan_max", 0.0) for r in reports)
    return {
        **{key: first[key] for key in ("config", "group_size", "micro_batch_size", "mode", "strategy")},
        **{key: first[key] for key in ("target_imbalance", "max_outlier_fraction") if key in first},
        "n_samples": int(costs.size),
        "n_micro_batches": plan.n_micro_batches,
        "n_step_groups": plan.n_step_groups,
        "imbalance": {"max": float(imbalance.max()), "mean": float(imbalance.mean())},
        "max_over_lower_bound": {
            "max": max(r["max_over_lower_bound"]["max"] for r in reports),
            "mean": _weighted([r["max_over_lower_bound"]["mean"] for r in reports], weights),
        },
        "straggler_pct": straggler,
        "straggler_pct_by_world_size": {
            str(w): round(predict_straggler_pct(mb.reshape(-1, w)), 4) for w in range(1, g + 1) if g % w == 0
        },
        "composition_bias": bias,
        "micro_batch_counts": {"max": int(counts.max()), "mean": float(counts.mean()), "min": int(counts.min())},
        "empty_micro_batches": int((counts == 0).sum()),
        "outlier_fraction": _weighted([r["outlier_fraction"] for r in reports], [r["n_samples"] for r in reports]),
        "target_reached": all(r["target_reached"] for r in reports),
        "swaps": sum(r["swaps"] for r in reports),
        "leftover": reports[-1]["leftover"],
        "runtime_s": round(sum(r["runtime_s"] for r in reports), 4),  # logged, never in the manifest
        "windowing": {
            "windows": len(reports),
            "window_samples": size,
            "plan_memory": plan_memory,
            "bytes_per_sample": PLAN_BYTES_PER_SAMPLE,
            "imbalance_max_by_window": [r["imbalance"]["max"] for r in reports],
        },
    }


def _cost_figures(report: dict[str, Any]) -> dict[str, float]:
    return {
        "imbalance_max": report["imbalance"]["max"],
        "imbalance_mean": report["imbalance"]["mean"],
        "straggler_pct": report["straggler_pct"]["plan"],
        "composition_bias": report["composition_bias"]["plan"],
    }


def windowing_cost(costs: np.ndarray, config: BalanceConfig, windowed: dict[str, Any]) -> dict[str, Any]:
    """What the windowed plan (its report ``windowed``) cost against planning the same costs whole:
    imbalance, straggler_pct and composition bias of both, and windowed minus whole. The windowed
    composition bias is measured against each window's samples, the whole one's against the dataset."""
    whole = _cost_figures(plan_step_groups(np.asarray(costs, np.float64), config).report)
    mine = _cost_figures(windowed)
    return {
        "whole": whole,
        "windowed": mine,
        "windowed_minus_whole": {key: mine[key] - whole[key] for key in whole},
    }
