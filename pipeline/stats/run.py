"""``compute_stats`` / ``run_stats``: read the input, build the report, write ``stats.json`` and the plots."""

from __future__ import annotations

import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from freescale import storage
from freescale.pipeline.dataset.manifest import load_manifest
from freescale.pipeline.output import RejectsError
from freescale.pipeline.stats.build import batch_sizes, build_report
from freescale.pipeline.stats.config import DEFAULT_K, DEFAULT_WORLD_SIZES, StatsConfig, StatsError, input_kind
from freescale.pipeline.stats.inputs import collect_prepared, remove
from freescale.pipeline.stats.plots import write_plots
from freescale.pipeline.stats.sources import collect_sources, stats_job

STATS_NAME = "stats.json"


def compute_stats(config: StatsConfig, pool: ProcessPoolExecutor | None = None) -> dict[str, Any]:
    """The report (``stats.json``'s content) for ``config.input``; writes nothing but temp files.

    ``pool``: workers started earlier (``processes.start_pool``) for the scan of raw sources, as
    ``prepare`` takes them, so their imports overlap this process's; a prepared dataset needs none."""
    return _compute(config, pool, plots_to=None)


def _compute(config: StatsConfig, pool: ProcessPoolExecutor | None, plots_to: str | None) -> dict[str, Any]:
    """``compute_stats``; with ``plots_to``, the plots are drawn there too (``report["plots"]``): on
    raw sources with the local executor, by the job's processes before its workers stop."""
    started = time.perf_counter()
    kind, uri = input_kind(config.input)
    config = replace(config, input=uri)
    if config.zch is not None and kind == "prepared" and load_manifest(uri).samples.window_stride:
        raise StatsError(
            f"{uri}: --zch-size replays each event once in time order, and this dataset's windowed samples "
            "(--window-stride > 0) repeat events; pass its source config"
        )
    own_work = config.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="freescale-stats-")) if own_work else Path(config.work_dir)
    try:
        if kind == "sources":
            config = replace(config, world_sizes=config.world_sizes or DEFAULT_WORLD_SIZES)
            k = config.micro_batch_size or DEFAULT_K

            def sizes_for(n: int) -> tuple[list[int], str]:
                sizes, head, _ = batch_sizes(config, k, n)
                return sizes, f"global_batch_{head}"

            with stats_job(config, work, pool) as job:
                collected = collect_sources(config, work, sizes_for, k, job)
                report = build_report(collected, config, uri, kind)
                if config.zch is not None:
                    report["zch"] = _zch(config, kind, uri, work, report)
                report = _round_trip(report, started)
                if plots_to is not None and config.executor == "local":  # Ray's workers may sit on other hosts
                    report["plots"] = write_plots(report, plots_to, lambda calls: job.map_calls(calls, "plots", "plot"))
        else:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            layout = load_manifest(uri).layout
            k = config.micro_batch_size or layout.micro_batch_size
            g = layout.group_size
            config = replace(config, world_sizes=config.world_sizes or tuple(sorted({*DEFAULT_WORLD_SIZES, g})))

            def sizes_for(n: int) -> tuple[list[int], str]:
                sizes, head, _ = batch_sizes(config, k, n)
                return sizes, "step_group" if config.global_batch_size is None else f"global_batch_{head}"

            collected = collect_prepared(config, work, sizes_for)
            report = build_report(collected, config, uri, kind)
            if config.zch is not None:
                report["zch"] = _zch(config, kind, uri, work, report)
            report = _round_trip(report, started)
    except RejectsError as error:
        if not own_work:
            raise
        raise _kept_quarantine(error) from error
    finally:
        remove(work / "spill")
        if own_work:
            remove(work)
    if plots_to is not None and not report["plots"]:
        report["plots"] = write_plots(report, plots_to)
    return report


def _kept_quarantine(error: RejectsError) -> RejectsError:
    """``error`` naming a copy of its quarantine examples outside the private work folder, which is
    removed on the way out (the message named a file that no longer existed)."""
    fd, kept = tempfile.mkstemp(prefix="freescale-stats-quarantine-", suffix=".jsonl")
    with os.fdopen(fd, "wb") as out:
        out.write(error.quarantine.read_bytes())
    return RejectsError(error.summary, Path(kept))


def _zch(config: StatsConfig, kind: str, uri: str, work: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The ZCH replay of the input's item (or user) ids (``zch_replay``), beside modulo hashing at the same rows."""
    from freescale.pipeline.stats import zch_replay

    assert config.zch is not None
    if kind == "sources":
        from freescale.datasets.sources import SourcesConfig

        pairs = zch_replay.source_pairs(SourcesConfig.from_toml(uri), config.zch.ids)
        events = "every valid event of the sources (before --min-len, --kcore, --sample-fraction)"
    else:
        from freescale.pipeline.dataset.reader import PreparedDataset

        dataset = PreparedDataset(uri, cache_dir=config.cache_dir, verify=config.verify)
        pairs = zch_replay.prepared_pairs(dataset, ids=config.zch.ids)
        events = "every event of the prepared samples (each in one sample: --window-stride 0)"
    replayed = zch_replay.replay_pairs(pairs, work / "spill" / "zch", config.zch)
    size = str(config.zch.table.zch_size)
    return {
        "events": f"{events}, in event-time order",
        "definition": "rates per lookup (id occurrence); collision: the id got the fallback row",
        **replayed,
        "modulo_hash_collision_rate": report["ids"]["tables"][config.zch.ids]["hash_collision_rate"][size],
    }


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
