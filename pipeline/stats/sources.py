"""Raw sources for ``freescale stats``: ``prepare``'s count-only path, then one pass over the partitions.

``PrepareJob.count_samples`` runs ``prepare``'s scan (its readers and validation) and k-core and
returns every user's event count. Sample lengths follow from those counts alone
(``planned_samples``, what ``prepare`` plans with), so the random batching order and every
sample's fine batch (``stats.ids``) are known before any sample is built. One step per partition
then builds its samples with ``prepare``'s sequence builder (``run_partition``) and hands them to
``StatsSink``, which spills their id records and events per source at once: no sample file is
written and read back, and nothing else is kept.

``--sample-fraction f`` (without k-core) is applied in the scan itself (``PrepareConfig.user_fraction``):
only the events of sampled users are spilled, sorted and counted; the per-user counts still cover
every user, so the sample totals stay exact. With ``--kcore`` the scan keeps every user (k-core counts
items over all of them) and the sink drops the users outside the sample.

With ``--work-dir`` the scan's spill files are kept (``run_partition(keep_input=True)``): a second run
with other W, k, seed or table sizes skips the scan and rebuilds the partitions from them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from freescale.datasets.ids import selected
from freescale.pipeline import memory
from freescale.pipeline.records import PartitionRecord, RowTotals
from freescale.pipeline.stats import figures
from freescale.pipeline.stats import ids as stats_ids
from freescale.pipeline.stats.inputs import Collected, SampleBatch, canonical, reduce_spills, remove, spill_samples
from freescale.pipeline.steps.scan import partition_of
from freescale.pipeline.steps.sequences import planned_samples, run_partition


def _source_counts_path(spill_dir: str, partition: int) -> Path:
    return Path(spill_dir) / f"sources.p{partition:05d}.npy"


@dataclass
class StatsSink:
    """``run_partition``'s sink in ``stats``: spill the id records of a partition's selected samples
    and save their events per source. The arrays hold the partition's built samples in (user_id,
    window) order, which is also the order ``build_samples`` returns them in."""

    spill_dir: str
    lengths: np.ndarray  # planned length of each sample: the built ones must match
    fine: np.ndarray  # fine batch of each sample; -1: not in the sample
    n_buckets: int
    bits: int
    n_sources: int
    n_features: int

    def __call__(self, table: pa.Table, partition: int) -> None:
        built = table.column("length").to_numpy()
        if not np.array_equal(built, self.lengths):
            raise RuntimeError(
                f"partition {partition}: built {len(built)} samples, but the plan (made from the scan's "
                f"per-user counts) has {len(self.lengths)} or other lengths; the work directory is stale"
            )
        keep = self.fine >= 0
        batch = SampleBatch.of_table(table, self.n_features).select(keep)
        path = _source_counts_path(self.spill_dir, partition)
        np.save(f"{path}.tmp.npy", batch.source_counts(self.n_sources))
        os.replace(f"{path}.tmp.npy", path)
        spill_samples(self.spill_dir, partition, self.n_buckets, self.bits, self.fine[keep], batch)


def _prepare_job(config: Any, work: Path) -> Any:
    from freescale.pipeline.config import PrepareConfig
    from freescale.pipeline.prepare import PrepareJob

    return PrepareJob(
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
            user_fraction=1.0 if config.samples.kcore else config.sample_fraction,
        )
    )


def collect_sources(config: Any, work: Path, sizes_for: Callable[[int], tuple[list[int], str]], k: int) -> Collected:
    """Raw sources: the count-only path, then the partitions' samples straight into id records.

    ``sizes_for(n_selected)`` returns the global batch sizes and the headline layout's name; ``k``
    is the per-rank batch of the straggler predictions, which run beside the partitions' steps (they
    need only the lengths): in the driver after them, one core idled for their ~1 s on ``large``."""
    job = _prepare_job(config, work)
    try:
        counts = job.count_samples()
        return _collect_counted(config, work, sizes_for, k, job, counts)
    finally:
        job.close()


@dataclass(frozen=True)
class _Samples:
    """Every planned sample (canonical order) and which are selected, built and where."""

    users: np.ndarray
    windows: np.ndarray
    lengths: np.ndarray
    keep: np.ndarray  # in the sample
    built: np.ndarray  # its events were spilled by the scan (every sample, or the selected ones)
    partition: np.ndarray


def _plan(config: Any, job: Any, counts: Any) -> _Samples:
    meta = planned_samples(counts.user_ids, counts.event_counts, config.samples)
    keep = selected(meta["user_id"], config.sample_fraction)
    return _Samples(
        users=meta["user_id"],
        windows=meta["window"],
        lengths=meta["length"],
        keep=keep,
        built=keep if job.config.user_fraction < 1.0 else np.ones(keep.size, bool),
        partition=partition_of(meta["user_id"], counts.n_partitions),
    )


def _collect_counted(config: Any, work: Path, sizes_for: Callable, k: int, job: Any, counts: Any) -> Collected:
    names = [spec.name for spec in job.sources.sources]
    features = list(counts.users.get("features", []))
    samples = _plan(config, job, counts)
    canon, order = canonical(samples.users, samples.windows, samples.keep, config.seed)
    n = canon.size
    sizes, headline = sizes_for(n)
    g0, layouts = stats_ids.fine_batches_equal(n, sizes)
    fine = np.full(samples.users.size, -1, np.int64)
    fine[canon[order]] = np.arange(n, dtype=np.int64) // g0
    bits = stats_ids.fine_bits(layouts[0].batch_of_fine.size)
    events = int(samples.lengths[samples.keep].sum())
    n_buckets = memory.stats_bucket_count(events + n * (1 + len(features)), config.memory_limit, config.workers)
    spill_dir, samples_dir = work / "spill", work / "samples"
    for folder in (spill_dir, samples_dir):  # records of an interrupted run would be counted twice
        remove(folder)
        folder.mkdir(parents=True)
    user_partition = partition_of(counts.user_ids, counts.n_partitions)
    user_built = selected(counts.user_ids, job.config.user_fraction)
    jobs = []
    for p in range(counts.n_partitions):
        mine = np.flatnonzero(samples.built & (samples.partition == p))
        sink = StatsSink(
            str(spill_dir),
            samples.lengths[mine].astype(np.int32),
            fine[mine],
            n_buckets,
            bits,
            len(names),
            len(features),
        )
        users = counts.user_ids[(user_partition == p) & user_built]
        args = (counts.scan_dir, str(samples_dir), p, config.samples, counts.removed_items, features, sink, users)
        jobs.append((*args, config.work_dir is not None))
    costs = job.cost_model.cost(samples.lengths[canon])
    predictions = [(figures.predict_strategies, (costs, w, k, config.seed)) for w in config.world_sizes]
    done = job.map_calls([*predictions, *((run_partition, args) for args in jobs)], "stats: samples", "task")
    predicted, records = dict(zip(config.world_sizes, done[: len(predictions)])), done[len(predictions) :]
    source_counts = np.zeros((samples.users.size, len(names)), np.int32)
    for p in range(counts.n_partitions):
        source_counts[np.flatnonzero(samples.keep & (samples.partition == p))] = np.load(
            _source_counts_path(str(spill_dir), p)
        )
    reducer = stats_ids.IdReducer(stats_ids.table_names(features), config.table_sizes, layouts, bits)
    reduce_spills(str(spill_dir), n_buckets, reducer, lambda fn, calls: job.map(fn, calls, "stats: ids", "bucket"))
    return Collected(
        kind="sources",
        dataset=job.sources.name,
        source_names=names,
        features=features,
        cost_model=job.cost_model,
        rows=_rows(counts, records),
        samples_total=int(samples.users.size),
        users_total=_distinct_sorted(samples.users),
        users_selected=_distinct_sorted(samples.users[samples.keep]),
        lengths=samples.lengths[canon],
        source_counts=source_counts[canon],
        random_order=order,
        reducer=reducer,
        layouts=layouts,
        headline=headline,
        predicted=predicted,
    )


def _distinct_sorted(values: np.ndarray) -> int:
    """Distinct values of a sorted array."""
    return int(np.count_nonzero(np.diff(values))) + 1 if values.size else 0


def _rows(counts: Any, records: list[PartitionRecord]) -> dict[str, Any]:
    """Row accounting (the manifest's ``rows`` names). Events of users outside a sample applied in
    the scan are filtered under ``sample_fraction``; ``users`` and ``samples`` then count the sample."""
    totals = RowTotals.of(records)
    filtered = dict(totals.filtered)
    if counts.scan.sampled_out:
        filtered["sample_fraction"] = counts.scan.sampled_out
    scan = counts.scan
    rows = {
        "events_read": scan.rows_read,
        "events_read_by_source": dict(sorted(scan.rows_read_by_source.items())),
        "events_used": totals.events_used,
        "events_rejected": {"total": scan.rejected_total, "by_reason": dict(sorted(scan.rejected.items()))},
        "events_filtered": {"total": sum(filtered.values()), "by_reason": dict(sorted(filtered.items()))},
        "users": totals.users,
        "samples": totals.samples,
    }
    rejected, dropped = rows["events_rejected"]["total"], rows["events_filtered"]["total"]
    rows["balanced"] = rows["events_read"] == totals.events_used + rejected + dropped
    return rows
