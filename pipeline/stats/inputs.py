"""What ``freescale stats`` reads: raw sources through ``prepare``'s own phases, or a prepared dataset.

Raw sources go through ``PrepareJob.build_samples()`` (scan → k-core → samples, resumable, bounded
by ``--memory-limit``): the same readers, validation and sequence builder as ``prepare``, so the
lengths reported are the lengths ``prepare`` would cost and balance. Two passes over its partition
files follow, in worker processes: per-sample metadata (user, window, length, events per source),
then the id records of ``stats.ids`` once every sample's position in the random batching is known.

A prepared dataset is read once, in plan order, through ``PreparedDataset`` (local or ``s3://``).

``--sample-fraction f`` keeps the samples of users whose hashed id falls below ``f`` (splitmix64,
independent of the partitioning), so repeated runs and different fractions agree on who is in.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from freescale.pipeline import memory
from freescale.pipeline.cost import CostModel
from freescale.pipeline.records import RowTotals
from freescale.pipeline.stats import ids as stats_ids

RANDOM_ORDER_STREAM = 7  # rng stream of the random batching order (seeded by --seed)
PREPARED_CHUNK_EVENTS = 2_000_000


def selected(user_ids: np.ndarray, fraction: float) -> np.ndarray:
    """Users kept by ``--sample-fraction``: splitmix64(user_id) / 2^64 < fraction."""
    if fraction >= 1.0:
        return np.ones(len(user_ids), dtype=bool)
    with np.errstate(over="ignore"):
        x = np.asarray(user_ids).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) < fraction * 2.0**53


@dataclass
class Collected:
    """Everything the figures need, from either input."""

    kind: str  # "sources" | "prepared"
    dataset: str
    source_names: list[str]
    features: list[str]
    cost_model: CostModel
    rows: dict[str, Any]
    samples_total: int
    users_total: int
    users_selected: int
    lengths: np.ndarray  # selected samples, canonical (user_id, window) order
    source_counts: np.ndarray  # [n, sources] events per source of each selected sample, same order
    random_order: np.ndarray  # positions of the random batching: canonical indices
    reducer: stats_ids.IdReducer
    layouts: list[stats_ids.Layout]
    headline: str  # name of the layout the headline batch_overlap_rate uses
    plan: dict[str, Any] | None = None  # prepared: lengths/costs in plan order, offsets, layout
    notes: list[str] = field(default_factory=list)

    @property
    def costs(self) -> np.ndarray:
        return self.cost_model.cost(self.lengths)


def canonical(users: np.ndarray, windows: np.ndarray, keep: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the kept samples in canonical (user_id, window) order, and the random batching
    order over them (``order[i]`` = canonical index of position i): independent of partitioning."""
    idx = np.flatnonzero(keep)
    canon = idx[np.lexsort((windows[idx], users[idx]))]
    return canon, np.random.default_rng([seed, RANDOM_ORDER_STREAM]).permutation(canon.size)


def _flat(column: pa.ChunkedArray) -> np.ndarray:
    return pc.list_flatten(column).to_numpy()


def partition_meta(samples_dir: str, partition: int, n_sources: int) -> dict[str, np.ndarray]:
    """Pass 1 over a ``prepare`` partition: user, window, length and events per source per sample."""
    from freescale.pipeline.steps.sequences import read_samples

    table = read_samples(samples_dir, partition, ["user_id", "window", "length", "sources"])
    lengths = table.column("length").to_numpy().astype(np.int64)
    owner = np.repeat(np.arange(table.num_rows, dtype=np.int64), lengths)
    src = _flat(table.column("sources")).astype(np.int64)
    counts = np.bincount(owner * n_sources + src, minlength=table.num_rows * n_sources)
    return {
        "user_id": table.column("user_id").to_numpy(),
        "window": table.column("window").to_numpy(),
        "length": lengths,
        "source_counts": counts.reshape(-1, n_sources).astype(np.int32),
    }


def partition_spill(
    samples_dir: str, partition: int, fine: np.ndarray, spill_dir: str, n_buckets: int, bits: int, n_features: int
) -> int:
    """Pass 2: the id records of a partition's selected samples (``fine`` < 0: not selected)."""
    from freescale.pipeline.steps.sequences import read_samples

    columns = ["length", "item_ids", "actions", "user_id"] + (["user_features"] if n_features else [])
    table = read_samples(samples_dir, partition, columns)
    keep = fine >= 0
    if not keep.all():
        table = table.filter(pa.array(keep))
    features = _flat(table.column("user_features")).reshape(-1, n_features) if n_features else None
    return stats_ids.spill_chunk(
        spill_dir,
        partition,
        n_buckets,
        bits,
        fine[keep],
        table.column("length").to_numpy(),
        _flat(table.column("item_ids")),
        _flat(table.column("actions")),
        table.column("user_id").to_numpy(),
        features,
    )


def reduce_spills(
    spill_dir: str, n_buckets: int, reducer: stats_ids.IdReducer, run: Callable[[Callable, list[tuple]], list]
) -> None:
    """Count every (bucket, table) with ``run(fn, jobs)`` (the job's executor, or serially), then merge
    the counts here: the sorts run in the workers, the driver only adds up."""
    jobs = [(reducer, spill_dir, b, j) for b in range(n_buckets) for j in range(len(reducer.tables))]
    for part in run(stats_ids.count_bucket, jobs):
        reducer.merge(part)


def _serially(progress: bool) -> Callable[[Callable, list[tuple]], list]:
    """``run`` for ``reduce_spills`` in this process, with a progress bar."""

    def run(fn: Callable, jobs: list[tuple]) -> list:
        bar = tqdm(jobs, desc="stats: id buckets", unit="bucket", disable=not progress, leave=False)
        return [fn(*job) for job in bar]

    return run


def _rows_from_built(built: Any) -> dict[str, Any]:
    """Row accounting of ``prepare``'s phases 1–3 (the same names as the manifest's ``rows``)."""
    totals = RowTotals.of(built.partitions)
    filtered, used = totals.filtered, totals.events_used
    rows = {
        "events_read": built.scan.rows_read,
        "events_read_by_source": dict(sorted(built.scan.rows_read_by_source.items())),
        "events_used": used,
        "events_rejected": {"total": built.scan.rejected_total, "by_reason": dict(sorted(built.scan.rejected.items()))},
        "events_filtered": {"total": sum(filtered.values()), "by_reason": dict(sorted(filtered.items()))},
        "users": totals.users,
        "samples": totals.samples,
    }
    rows["balanced"] = rows["events_read"] == used + rows["events_rejected"]["total"] + rows["events_filtered"]["total"]
    return rows


def collect_sources(config: Any, work: Path, sizes_for: Callable[[int], tuple[list[int], str]]) -> Collected:
    """Raw sources: ``prepare``'s phases 1–3, then the two stats passes over its partitions.

    ``sizes_for(n_selected)`` returns the global batch sizes and the headline layout's name."""
    from freescale.pipeline.config import PrepareConfig
    from freescale.pipeline.prepare import PrepareJob

    job = PrepareJob(
        PrepareConfig(
            sources=config.input,
            output=str(work / "unused-output"),
            samples=config.samples,
            model=config.model,
            cost_model_file=config.cost_model_file,
            memory_limit=config.memory_limit,
            workers=config.workers,
            work_dir=str(work / "prepare"),
            progress=config.progress,
            engine=config.engine,
            ray_address=config.ray_address,
        )
    )
    try:
        built = job.build_samples()
        return _collect_built(config, work, sizes_for, job, built)
    finally:
        job.close()


def _collect_built(config: Any, work: Path, sizes_for: Callable, job: Any, built: Any) -> Collected:
    """``collect_sources``' two passes over the built partitions. The id pass runs on the build's
    executor, whose workers are warm: a pool started for it paid ~1 s of spawn and imports per
    worker, so on ``large`` (25M events) it ran in this process alone."""
    names = [spec.name for spec in job.sources.sources]
    features = list(built.users.get("features", []))
    parts = range(built.n_partitions)
    # Pass 1 is light (four columns): in this process.
    metas = [
        partition_meta(built.samples_dir, p, len(names))
        for p in tqdm(parts, desc="stats: samples", unit="partition", disable=not config.progress, leave=False)
    ]
    users = np.concatenate([m["user_id"] for m in metas])
    windows = np.concatenate([m["window"] for m in metas])
    lengths = np.concatenate([m["length"] for m in metas])
    source_counts = np.concatenate([m["source_counts"] for m in metas])
    bounds = np.cumsum([0] + [len(m["length"]) for m in metas])
    del metas
    keep = selected(users, config.sample_fraction)
    canon, order = canonical(users, windows, keep, config.seed)
    n = canon.size
    sizes, headline = sizes_for(n)
    g0, layouts = stats_ids.fine_batches_equal(n, sizes)
    fine = np.full(users.size, -1, np.int64)
    fine[canon[order]] = np.arange(n, dtype=np.int64) // g0
    bits = stats_ids.fine_bits(layouts[0].batch_of_fine.size)
    events = int(lengths[keep].sum())
    n_buckets = memory.stats_bucket_count(events + n * (1 + len(features)), config.memory_limit, config.workers)
    spill_dir = work / "spill"
    remove(spill_dir)  # records of an interrupted run would be counted twice
    spill_dir.mkdir(parents=True)
    jobs = [
        (built.samples_dir, p, fine[bounds[p] : bounds[p + 1]], str(spill_dir), n_buckets, bits, len(features))
        for p in parts
    ]
    job.map(partition_spill, jobs, "stats: ids", "partition")
    reducer = stats_ids.IdReducer(stats_ids.table_names(features), config.table_sizes, layouts, bits)
    reduce_spills(str(spill_dir), n_buckets, reducer, lambda fn, calls: job.map(fn, calls, "stats: ids", "bucket"))
    return Collected(
        kind="sources",
        dataset=job.sources.name,
        source_names=names,
        features=features,
        cost_model=job.cost_model,
        rows=_rows_from_built(built),
        samples_total=int(users.size),
        users_total=int(np.unique(users).size),
        users_selected=int(np.unique(users[keep]).size),
        lengths=lengths[canon],
        source_counts=source_counts[canon],
        random_order=order,
        reducer=reducer,
        layouts=layouts,
        headline=headline,
    )


# ------------------------------------------------------------------------------------------ prepared
def _source_names(manifest: dict[str, Any]) -> list[str]:
    """Source names in index order: the manifest lists source files in (source, file) order."""
    names: list[str] = []
    for entry in manifest.get("sources", []):
        if entry["source"] != "users" and entry["source"] not in names:
            names.append(entry["source"])
    return names or sorted(manifest["rows"].get("events_read_by_source", {}))


def _stack(rows: list[dict[str, Any]], name: str, dtype: Any) -> np.ndarray:
    return np.concatenate([np.asarray(r[name], dtype=dtype) for r in rows]) if rows else np.zeros(0, dtype)


def collect_prepared(config: Any, work: Path, sizes_for: Callable[[int], tuple[list[int], str]]) -> Collected:
    """A prepared dataset, read once in plan order (rows of micro-batch m are [o[m], o[m+1]))."""
    from freescale.pipeline.reader import PreparedDataset

    dataset = PreparedDataset(config.input, cache_dir=config.cache_dir, verify=config.verify)
    manifest = dataset.manifest
    names = _source_names(manifest)
    features = list(manifest["layout"].get("user_features", []))
    g = dataset.group_size
    offsets = dataset.offsets.astype(np.int64)
    n_rows = int(offsets[-1])
    micro_batch = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    mean_len = max(float(manifest.get("lengths", {}).get("mean", 1.0)), 1.0)
    chunk_rows = max(1, int(PREPARED_CHUNK_EVENTS / mean_len))
    # Selection is by user hash, known per row as rows arrive; positions count selected rows in plan
    # order, so one sequential pass suffices. Batch sizes are fixed up front from the expected count.
    sizes, headline = sizes_for(int(n_rows * min(config.sample_fraction, 1.0)))
    tracker = stats_ids.FineTracker(sizes)
    # The bucket count must be fixed before spilling: size it from the manifest's event count.
    n_buckets = memory.stats_bucket_count(
        int(manifest["rows"].get("events_used", n_rows)) + n_rows * (1 + len(features)), config.memory_limit
    )
    bits = stats_ids.fine_bits(n_rows)  # a fine batch starts at most once per row
    spill_dir = work / "spill"
    remove(spill_dir)  # records of an interrupted run would be counted twice
    spill_dir.mkdir(parents=True)
    users, windows, lengths, costs, counts, keep_all = [], [], [], [], [], []
    position = 0
    _ = dataset.rows  # opened before the progress bar
    bar = tqdm(total=n_rows, desc="stats: rows", unit="sample", disable=not config.progress, leave=False)
    for chunk, start in enumerate(range(0, n_rows, chunk_rows)):
        batch = [dataset.row(i) for i in range(start, min(start + chunk_rows, n_rows))]  # shards checked
        length = np.array([int(r["length"]) for r in batch], np.int64)
        user = np.array([int(r["user_id"]) for r in batch], np.int64)
        keep = selected(user, config.sample_fraction)
        src = _stack(batch, "sources", np.int64)
        owner = np.repeat(np.arange(len(batch)), np.array([len(r["sources"]) for r in batch], np.int64))
        counts.append(
            np.bincount(owner * len(names) + src, minlength=len(batch) * len(names))
            .reshape(-1, len(names))
            .astype(np.int32)
        )
        users.append(user)
        windows.append(np.array([int(r["window"]) for r in batch], np.int64))
        lengths.append(length)
        costs.append(np.array([float(r["cost"]) for r in batch], np.float64))
        keep_all.append(keep)
        sel = [r for r, k in zip(batch, keep) if k]
        positions = position + np.arange(len(sel), dtype=np.int64)
        position += len(sel)
        fine = tracker.assign(positions, micro_batch[start : start + len(batch)][keep] // g)
        feats = _stack(sel, "user_features", np.int64).reshape(-1, len(features)) if features and sel else None
        stats_ids.spill_chunk(
            str(spill_dir),
            chunk,
            n_buckets,
            bits,
            fine,
            length[keep],
            _stack(sel, "item_ids", np.int64),
            _stack(sel, "actions", np.int64),
            user[keep],
            feats,
        )
        bar.update(len(batch))
    bar.close()
    users_a, windows_a = np.concatenate(users), np.concatenate(windows)
    lengths_a, costs_a, keep_a = np.concatenate(lengths), np.concatenate(costs), np.concatenate(keep_all)
    counts_a = np.concatenate(counts)
    n_groups = (len(offsets) - 1) // g
    layout_cfg = manifest["layout"]
    group_batch = g * int(layout_cfg["micro_batch_size"]) if layout_cfg.get("mode") == "equal_count" else None
    layouts = tracker.layouts(position, n_groups, group_batch)
    reducer = stats_ids.IdReducer(stats_ids.table_names(features), config.table_sizes, layouts, bits)
    reduce_spills(str(spill_dir), n_buckets, reducer, _serially(config.progress))
    canon, order = canonical(users_a, windows_a, keep_a, config.seed)
    mb_costs = np.bincount(micro_batch, weights=costs_a, minlength=len(offsets) - 1)
    return Collected(
        kind="prepared",
        dataset=str(manifest.get("dataset", "")),
        source_names=names,
        features=features,
        cost_model=CostModel(**manifest["cost_model"]),
        rows=manifest["rows"],
        samples_total=n_rows,
        users_total=int(np.unique(users_a).size),
        users_selected=int(np.unique(users_a[keep_a]).size),
        lengths=lengths_a[canon],
        source_counts=counts_a[canon],
        random_order=order,
        reducer=reducer,
        layouts=layouts,
        headline=headline,
        plan={
            "lengths": lengths_a,
            "offsets": offsets,
            "micro_batch_costs": mb_costs,
            "group_size": g,
            "micro_batch_size": int(layout_cfg["micro_batch_size"]),
            "mode": layout_cfg.get("mode"),
            "strategy": layout_cfg.get("strategy"),
            "seed": manifest["config"]["balance"].get("seed", 0),
            "fingerprint": manifest.get("fingerprint"),
            "n_step_groups": n_groups,
        },
    )


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
