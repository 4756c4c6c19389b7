"""``freescale stats``: how much of the cluster a dataset will waste, and why — before any GPU hour.

Point it at raw sources (the source config ``prepare`` reads) or at a prepared dataset. It reports,
with DESIGN §2's names:

* UIH length distribution per source and merged (count, mean, p50/p90/p99/max, share above
  thresholds, a log-binned histogram);
* ``sparsity`` (paper Eq. 1) at a per-rank batch size and the compute a padded model wastes
  against a jagged one under the cost model;
* predicted ``straggler_pct`` and ``imbalance`` at W ranks × k samples for random batching,
  within-step balancing, the planned step groups ``prepare`` would write, and a prepared
  dataset's own plan;
* ``batch_overlap_rate`` per table at a global batch size and its curve over global batch sizes,
  item popularity with a fitted Zipf exponent;
* ``hash_collision_rate`` under modulo hashing for table sizes T, unique ids and id ranges.

``run_stats`` writes ``stats.json`` (``SCHEMA_VERSION``; the top-level keys are ``TOP_LEVEL_KEYS``),
PNG plots and returns the report; ``compute_stats`` returns it without writing anything.
"""

from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from freescale import __version__, storage
from freescale.model_config import ModelConfig
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.dataset.manifest import MANIFEST_NAME, ManifestError, load_manifest
from freescale.pipeline.stats import figures
from freescale.pipeline.stats.inputs import Collected, collect_prepared, remove
from freescale.pipeline.stats.plots import write_plots
from freescale.pipeline.stats.sources import collect_sources, stats_job

SCHEMA_VERSION = 1
STATS_NAME = "stats.json"
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
    "plots",
    "runtime_s",
)
SOURCES_CONFIG_NAME = "sources.toml"
DEFAULT_WORLD_SIZES = (8, 64, 256)
DEFAULT_K = 32


class StatsError(ValueError):
    """``freescale stats`` cannot run as asked; the message says what to change."""


def _positive_ints(values: Any, option: str, allow_empty: bool = False) -> tuple[int, ...]:
    out = tuple(values)
    if (not out and not allow_empty) or any(
        isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1 for v in out
    ):
        raise ValueError(f"{option} must be a list of integers >= 1, got {list(out)!r}")
    return tuple(int(v) for v in out)


@dataclass
class StatsConfig:
    """Options of ``freescale stats`` (``None`` = chosen from the data; see the CLI help)."""

    input: str
    output: str | None = "freescale-stats"  # None: compute only, write nothing
    world_sizes: tuple[int, ...] | None = None  # None: 8, 64, 256 (and a prepared dataset's G)
    micro_batch_size: int | None = None  # k; None: 32, or the prepared dataset's
    batch_size: int | None = None  # sparsity batch; None: k
    global_batch_size: int | None = None  # headline batch_overlap_rate; None: see _batch_sizes
    global_batch_sizes: tuple[int, ...] | None = None  # the curve; None: k·4^j up to n/2, and every W·k
    table_sizes: tuple[int, ...] = (100_000, 1_000_000, 10_000_000)
    length_thresholds: tuple[int, ...] = (256, 1024, 4096, 16384)
    sample_fraction: float = 1.0
    seed: int = 0
    histogram_bins: int = 60
    zipf_min_count: int = 10
    samples: SampleConfig = field(default_factory=SampleConfig)  # raw sources: how samples are cut
    model: ModelConfig = field(default_factory=ModelConfig)
    cost_model_file: str | None = None
    memory_limit: int = 2 * 2**30
    workers: int = 2
    engine: str = "local"  # raw sources: where prepare's steps and the id pass run (``executors``)
    ray_address: str | None = None  # --engine ray: a running cluster; None starts one
    work_dir: str | None = None  # raw sources: prepare's work files; kept there for a fast re-run
    cache_dir: str | None = None  # prepared dataset on s3://: local shard cache
    verify: bool = True  # prepared dataset: check shard hashes against the manifest (--no-verify skips)
    plots: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.input:
            raise ValueError("stats needs an input: a source config TOML or a prepared dataset")
        if self.world_sizes is not None:
            self.world_sizes = _positive_ints(self.world_sizes, "--world-sizes")
        self.table_sizes = _positive_ints(self.table_sizes, "--table-sizes")
        self.length_thresholds = _positive_ints(self.length_thresholds, "--length-thresholds", allow_empty=True)
        if self.global_batch_sizes is not None:
            self.global_batch_sizes = _positive_ints(self.global_batch_sizes, "--global-batch-sizes")
        for option in ("micro_batch_size", "batch_size", "global_batch_size"):
            value = getattr(self, option)
            if value is not None:
                _positive_ints([value], f"--{option.replace('_', '-')}")
        f = self.sample_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 < f <= 1.0:
            raise ValueError(f"--sample-fraction must be in (0, 1], got {f!r}")
        if self.histogram_bins < 2:
            raise ValueError(f"--histogram-bins must be >= 2, got {self.histogram_bins}")
        if self.zipf_min_count < 1:
            raise ValueError(f"--zipf-min-count must be >= 1, got {self.zipf_min_count}")
        if self.memory_limit < 256 * 2**20:
            raise ValueError(f"--memory-limit must be at least 256MB, got {self.memory_limit} bytes")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        if max(self.table_sizes) > self.memory_limit // 8:
            raise ValueError(
                f"--table-sizes: {max(self.table_sizes):,} rows need one byte per row and table in "
                f"memory; raise --memory-limit above {8 * max(self.table_sizes):,} bytes or use "
                "smaller sizes"
            )

    def options(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("input", "output", "progress", "work_dir", "cache_dir", "verify"):
            out.pop(key)
        return out


def input_kind(uri: str) -> tuple[str, str]:
    """``("sources", toml)`` or ``("prepared", dataset)``; clear errors for anything else."""
    if not storage.exists(uri):
        raise StatsError(f"{uri} does not exist (expected a source config TOML or a prepared dataset)")
    fs, path = storage.filesystem(uri)
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type == pafs.FileType.File:
        if uri.endswith(MANIFEST_NAME):
            return "prepared", uri[: -len(MANIFEST_NAME)].rstrip("/") or "."
        return "sources", uri
    if storage.exists(storage.join(uri, MANIFEST_NAME)):
        return "prepared", uri
    if storage.exists(storage.join(uri, SOURCES_CONFIG_NAME)):
        return "sources", storage.join(uri, SOURCES_CONFIG_NAME)
    load_manifest(uri)  # raises ManifestError: "manifest.json is missing: not a finished prepare output"
    raise ManifestError(f"{uri}: not a prepared dataset")  # pragma: no cover - load_manifest raised


# ------------------------------------------------------------------------------------------ figures
def _batch_sizes(config: StatsConfig, k: int, n: int) -> tuple[list[int], int, str]:
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
    _, head_size, rule = _batch_sizes(config, k, n)
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
        "plots": {},
        "runtime_s": None,
    }
    return report


# ------------------------------------------------------------------------------------------ driver
def compute_stats(config: StatsConfig, pool: ProcessPoolExecutor | None = None) -> dict[str, Any]:
    """The report (``stats.json``'s content) for ``config.input``; writes nothing but temp files.

    ``pool``: workers started earlier (``processes.start_pool``) for the scan of raw sources, as
    ``prepare`` takes them, so their imports overlap this process's; a prepared dataset needs none."""
    return _compute(config, pool, plots_to=None)


def _compute(config: StatsConfig, pool: ProcessPoolExecutor | None, plots_to: str | None) -> dict[str, Any]:
    """``compute_stats``; with ``plots_to``, the plots are drawn there too (``report["plots"]``): on
    raw sources with the local engine, by the job's processes before its workers stop."""
    started = time.perf_counter()
    kind, uri = input_kind(config.input)
    config = replace(config, input=uri)
    own_work = config.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="freescale-stats-")) if own_work else Path(config.work_dir)
    try:
        if kind == "sources":
            config = replace(config, world_sizes=config.world_sizes or DEFAULT_WORLD_SIZES)
            k = config.micro_batch_size or DEFAULT_K

            def sizes_for(n: int) -> tuple[list[int], str]:
                sizes, head, _ = _batch_sizes(config, k, n)
                return sizes, f"global_batch_{head}"

            with stats_job(config, work, pool) as job:
                collected = collect_sources(config, work, sizes_for, k, job)
                report = _round_trip(build_report(collected, config, uri, kind), started)
                if plots_to is not None and config.engine == "local":  # Ray's workers may sit on other hosts
                    report["plots"] = write_plots(report, plots_to, lambda calls: job.map_calls(calls, "plots", "plot"))
        else:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            layout = load_manifest(uri).layout
            k = config.micro_batch_size or layout.micro_batch_size
            g = layout.group_size
            config = replace(config, world_sizes=config.world_sizes or tuple(sorted({*DEFAULT_WORLD_SIZES, g})))

            def sizes_for(n: int) -> tuple[list[int], str]:
                sizes, head, _ = _batch_sizes(config, k, n)
                return sizes, "step_group" if config.global_batch_size is None else f"global_batch_{head}"

            collected = collect_prepared(config, work, sizes_for)
            report = _round_trip(build_report(collected, config, uri, kind), started)
    finally:
        remove(work / "spill")
        if own_work:
            remove(work)
    if plots_to is not None and not report["plots"]:
        report["plots"] = write_plots(report, plots_to)
    return report


def _round_trip(report: dict[str, Any], started: float) -> dict[str, Any]:
    """The report with its runtime, through JSON: the caller gets exactly what a later reader of
    stats.json gets (and the plots are drawn from that)."""
    report["runtime_s"] = round(time.perf_counter() - started, 3)
    return json.loads(json.dumps(report, default=_json_default))


def run_stats(config: StatsConfig, pool: ProcessPoolExecutor | None = None) -> dict[str, Any]:
    """Compute the report, then write ``stats.json`` and the PNG plots under ``config.output``
    (``pool``: see ``compute_stats``)."""
    if config.output is not None and storage.exists(config.output):
        fs, path = storage.filesystem(config.output)
        import pyarrow.fs as pafs

        if fs.get_file_info(path).type == pafs.FileType.File:
            raise StatsError(f"--out {config.output} is a file; give a directory")
    if config.output is not None and not storage.is_remote(config.output):
        problem = storage.local_write_problem(config.output)  # before the work, not when writing its results
        if problem is not None:
            raise StatsError(f"--out {config.output}: {problem}")
    started = time.perf_counter()
    report = _compute(config, pool, plots_to=config.output if config.plots else None)
    if config.output is None:
        return report
    report["runtime_s"] = round(time.perf_counter() - started, 3)
    storage.write_bytes(
        storage.join(config.output, STATS_NAME),
        (json.dumps(report, indent=1, sort_keys=False, default=_json_default) + "\n").encode(),
    )
    return report


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value)}")


__all__ = [
    "SCHEMA_VERSION",
    "STATS_NAME",
    "TOP_LEVEL_KEYS",
    "StatsConfig",
    "StatsError",
    "compute_stats",
    "input_kind",
    "run_stats",
]
