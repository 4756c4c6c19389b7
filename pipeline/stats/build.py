"""The ``stats.json`` report built from what the scan collected: lengths, sparsity, stragglers, overlap.

``SCHEMA_VERSION`` and ``TOP_LEVEL_KEYS`` are the report's contract with its readers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from freescale import __version__
from freescale.pipeline.stats import figures
from freescale.pipeline.stats.config import DEFAULT_K, StatsConfig, StatsError
from freescale.pipeline.stats.inputs import Collected

SCHEMA_VERSION = 1
TOP_LEVEL_KEYS = (
    "schema_version",
    "created_by",
    "freescale_version",
    "input",
    "options",
    "sample",
    "rows",
    "cost_model",
    "lengths",
    "sparsity",
    "straggler",
    "batch_overlap",
    "popularity",
    "ids",
    "zch",
    "plots",
    "runtime_s",
)


def batch_sizes(config: StatsConfig, k: int, n: int) -> tuple[list[int], int, str]:
    """Global batch sizes of the curve (always with every W·k) and the headline size with the rule
    that chose it."""
    by_w = [w * k for w in config.world_sizes]
    if config.global_batch_sizes is not None:
        curve = list(config.global_batch_sizes)
    else:
        curve = [k * 4**j for j in range(32) if k * 4**j <= max(n // 2, k)]
    if config.global_batch_size is not None:
        head, rule = config.global_batch_size, "--global-batch-size"
    else:
        fits = [b for b in by_w if n // b >= 2]
        head, rule = (
            (max(fits), "largest W·k with at least 2 full global batches")
            if fits
            else (k, "k (no W·k has 2 full global batches)")
        )
    return sorted(set(curve) | set(by_w) | {head}), head, rule


def _source_lengths(
    c: Collected, thresholds: tuple[int, ...], estimated: bool, seed: int, edges: np.ndarray
) -> tuple[dict, dict]:
    summaries, hists = {}, {}
    for j, name in enumerate(c.source_names):
        counts = c.source_counts[:, j] if c.source_counts.size else np.zeros(0, np.int64)
        present = counts[counts > 0]
        summaries[name] = {
            **figures.length_summary(present, thresholds, estimated, seed),
            "samples_without": int((counts == 0).sum()),
        }
        hists[name] = figures.histogram(present, edges)
    return summaries, hists


def _lengths(c: Collected, config: StatsConfig, estimated: bool) -> dict[str, Any]:
    edges = figures.log_bin_edges(int(c.lengths.max()) if c.lengths.size else 1, config.histogram_bins)
    by_source, source_hists = _source_lengths(c, config.length_thresholds, estimated, config.seed, edges)
    return {
        "definition": "UIH length of a sample (events after merging sources, truncation and filters); "
        "by_source: events of that source in a sample, over samples that have any",
        "merged": figures.length_summary(c.lengths, config.length_thresholds, estimated, config.seed),
        "by_source": by_source,
        "histogram": {
            "edges": [int(e) for e in edges],
            "binning": "log-spaced integer edges, [e_i, e_i+1)",
            "merged": figures.histogram(c.lengths, edges),
            "by_source": source_hists,
        },
    }


def _sparsity(c: Collected, b: int) -> dict[str, Any]:
    random_lengths = c.lengths[c.random_order]
    out: dict[str, Any] = {
        "batch_size": b,
        "definition": "paper Eq. 1 per batch: 1 - sum(L_i) / (B * max_i L_i); 'sparsity' pooled over batches",
        "cost_units": c.cost_model.units,
        "random": figures.sparsity(random_lengths, figures.equal_offsets(random_lengths.size, b), c.cost_model),
        "plan": None,
    }
    if c.plan is not None:
        out["plan"] = {
            **figures.sparsity(c.plan["lengths"], c.plan["offsets"], c.cost_model),
            "batch_size": "the dataset's micro-batches",
            "scope": "all rows",
        }
    return out


def _straggler(c: Collected, config: StatsConfig, k: int) -> dict[str, Any]:
    costs = c.costs
    table: dict[str, Any] = {}
    for w in config.world_sizes:
        entry = c.predicted[w] if c.predicted is not None else figures.predict_strategies(costs, w, k, config.seed)
        if c.plan is not None:
            entry["plan"] = {
                **figures.plan_figures(c.plan["micro_batch_costs"], c.plan["group_size"], w),
                "scope": "all rows",
            }
        table[str(w)] = entry
    return {
        "micro_batch_size": k,
        "world_sizes": list(config.world_sizes),
        "cost_units": c.cost_model.units,
        "strategies": ["random", "within_step", "planned", *(["plan"] if c.plan is not None else [])],
        "definition": "straggler_pct: mean idle wait across ranks / step wall time, summed over steps (%); "
        "imbalance: max/mean rank cost per step; planned: what `prepare --group-size W` writes",
        "by_world_size": table,
    }


def _overlap(c: Collected, head_size: int | None, rule: str) -> dict[str, Any]:
    names = [layout.name for layout in c.layouts]
    reports = {layout.name: c.reducer.overlap_report(i) for i, layout in enumerate(c.layouts)}
    curve_layouts = [layout for layout in c.layouts if layout.name.startswith("global_batch_")]
    curve = {"global_batch_sizes": [layout.global_batch_size for layout in curve_layouts], "tables": {}}
    for table in c.reducer.tables:
        curve["tables"][table] = {
            "batch_overlap_rate": [reports[layout.name][table]["batch_overlap_rate"] for layout in curve_layouts],
            "stderr": [reports[layout.name][table]["stderr"] for layout in curve_layouts],
            "pairs": [reports[layout.name][table]["pairs"] for layout in curve_layouts],
        }
    head = c.headline if c.headline in names else f"global_batch_{head_size}"
    head_layout = c.layouts[names.index(head)]
    return {
        "definition": "share of the unique ids of global batch n+1 (per table) also in global batch n; "
        "mean over consecutive pairs of full batches, stderr over pairs",
        "order": "plan order (consecutive rows)" if c.kind == "prepared" else "random batching (seeded shuffle)",
        "headline": {
            "layout": head,
            "global_batch_size": head_layout.global_batch_size,
            "chosen_by": "the dataset's step groups" if head == "step_group" else rule,
            # with --sample-fraction f a step group keeps only its sampled rows (≈ f·G·k)
            "mean_samples_per_batch": c.lengths.size / max(head_layout.n_batches, 1)
            if head == "step_group"
            else head_layout.global_batch_size,
            "tables": reports[head],
        },
        "curve": curve,
    }


def _by_world_size_overlap(report: dict[str, Any], c: Collected, config: StatsConfig, k: int) -> dict[str, Any]:
    out = {}
    for w in config.world_sizes:
        name = f"global_batch_{w * k}"
        i = [layout.name for layout in c.layouts].index(name)
        out[str(w)] = {
            "global_batch_size": w * k,
            "tables": {t: v["batch_overlap_rate"] for t, v in c.reducer.overlap_report(i).items()},
        }
    report["by_world_size"] = out
    return report


def _sample_info(c: Collected, config: StatsConfig) -> dict[str, Any]:
    estimated = config.sample_fraction < 1.0
    return {
        "fraction": config.sample_fraction,
        "estimated": estimated,
        "method": "users kept when splitmix64(user_id)/2^64 < fraction; all their samples are used",
        "samples_total": c.samples_total,
        "samples_selected": int(c.lengths.size),
        "users_total": c.users_total,
        "users_selected": c.users_selected,
        "errors": (
            "figures over the selected samples; stderr fields: bootstrap (length percentiles), "
            "batch-to-batch (sparsity, batch_overlap_rate), step-to-step ratio estimator "
            "(straggler_pct), regression (zipf_exponent); unique ids and hash_collision_rate count "
            "only ids seen in the sample (lower bounds); 'plan' figures use all rows; a prepared "
            "dataset's step groups keep only their sampled rows (see mean_samples_per_batch)"
        )
        if estimated
        else "exact over all samples; stderr fields are batch-to-batch / step-to-step variability",
    }


def build_report(c: Collected, config: StatsConfig, input_uri: str, kind: str) -> dict[str, Any]:
    k = config.micro_batch_size or (c.plan["micro_batch_size"] if c.plan else DEFAULT_K)
    b = config.batch_size or k
    n = int(c.lengths.size)
    if n == 0:
        raise StatsError(
            f"{input_uri}: no samples to describe (check --min-len / --kcore, the sources, or raise --sample-fraction)"
        )
    _, head_size, rule = batch_sizes(config, k, n)
    estimated = config.sample_fraction < 1.0
    item_table = c.reducer.tables.index("item")
    popularity = {
        "table": "item",
        **figures.popularity(dict(c.reducer.freq_of_freq[item_table]), config.zipf_min_count),
    }
    overlap = _by_world_size_overlap(_overlap(c, head_size, rule), c, config, k)
    report = {
        "schema_version": SCHEMA_VERSION,
        "created_by": "freescale stats",
        "freescale_version": __version__,
        "input": {
            "kind": kind,
            "uri": input_uri,
            "dataset": c.dataset,
            "sources": c.source_names,
            "user_features": c.features,
            **(
                {
                    "plan": {
                        key: c.plan[key]
                        for key in (
                            "group_size",
                            "micro_batch_size",
                            "mode",
                            "strategy",
                            "n_step_groups",
                            "fingerprint",
                        )
                    }
                }
                if c.plan
                else {}
            ),
        },
        "options": {**config.options(), "micro_batch_size": k, "batch_size": b},
        "sample": _sample_info(c, config),
        "rows": c.rows,
        "cost_model": c.cost_model.to_dict(),
        "lengths": _lengths(c, config, estimated),
        "sparsity": _sparsity(c, b),
        "straggler": _straggler(c, config, k),
        "batch_overlap": overlap,
        "popularity": popularity,
        "ids": {
            "hashing": "modulo: row = id % T",
            "table_sizes": list(config.table_sizes),
            "definition": "hash_collision_rate: share of distinct ids that share their row with another id",
            "tables": c.reducer.ids_report(),
        },
        "zch": None,  # --zch-size: the replay's figures (``zch_replay``), filled in by ``run``
        "plots": {},
        "runtime_s": None,
    }
    return report
