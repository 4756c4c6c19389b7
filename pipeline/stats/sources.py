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
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freescale.datasets.ids import selected
from freescale.pipeline import memory
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.records import PartitionRecord, RowTotals
from freescale.pipeline.stats import figures
from freescale.pipeline.stats import ids as stats_ids
from freescale.pipeline.stats.inputs import Collected, SampleBatch, canonical, reduce_spills, remove, spill_samples
from freescale.pipeline.steps.scan import partition_of, read_partition, remove_partition
from freescale.pipeline.steps.sequences import (
    numpy_column,
    planned_samples,
    run_partition,
    user_feature_lists,
    user_rank,
)


def _source_counts_path(spill_dir: str, partition: int) -> Path:
    return Path(spill_dir) / f"sources.p{partition:05d}.npy"


@dataclass
class StatsSink:
    """Where a partition's samples go in ``stats``: their id records and events per source. As
    ``run_partition``'s sink it takes the built samples; ``count_partition`` feeds it per-user counts.
    The arrays hold the partition's built samples in (user_id, window) order, which is also the order
    ``build_samples`` returns them in."""

    spill_dir: str
    lengths: np.ndarray  # planned length of each sample: the built ones must match
    fine: np.ndarray  # fine batch of each sample; -1: not in the sample
    n_buckets: int
    bits: int
    n_sources: int
    n_features: int

    def __call__(self, table: pa.Table, partition: int) -> None:
        self.check(table.column("length").to_numpy(), partition)
        keep = self.fine >= 0
        batch = SampleBatch.of_table(table, self.n_features).select(keep)
        self.save_source_counts(partition, batch.source_counts(self.n_sources))
        spill_samples(self.spill_dir, partition, self.n_buckets, self.bits, self.fine[keep], batch)

    def check(self, built: np.ndarray, partition: int) -> None:
        """The built samples' lengths must be the plan's (made from the scan's per-user counts)."""
        if not np.array_equal(built, self.lengths):
            raise RuntimeError(
                f"partition {partition}: built {len(built)} samples, but the plan (made from the scan's "
                f"per-user counts) has {len(self.lengths)} or other lengths; the work directory is stale"
            )

    def save_source_counts(self, partition: int, counts: np.ndarray) -> None:
        """Events per source of the partition's selected samples, ``[samples, n_sources]``."""
        path = _source_counts_path(self.spill_dir, partition)
        np.save(f"{path}.tmp.npy", counts)
        os.replace(f"{path}.tmp.npy", path)


def order_free(cfg: SampleConfig, event_counts: np.ndarray) -> bool:
    """Whether every sample is all of one user's events: no windows, no k-core and no user longer
    than ``max_uih_len``. Then which events a sample holds does not depend on their order, and
    neither does any figure (id sets, counts, lengths, events per source): ``count_partition``
    needs no time sort."""
    return not cfg.window_stride and not cfg.kcore and int(event_counts.max(initial=0)) <= cfg.max_uih_len


def count_partition(
    scan_dir: str,
    partition: int,
    users: np.ndarray,
    cfg: SampleConfig,
    features: list[str],
    sink: StatsSink,
    keep: bool,
) -> PartitionRecord:
    """The partition step of an ``order_free`` job: each event's sample is its user's (a hash lookup,
    ``user_rank``), so the id records and events per source come from the spilled events as read,
    with ``build_samples``' filters and accounting. ``users``: the partition's sorted user ids (a
    superset of its events' users). Cheaper than building the samples: no time sort, no list
    columns, no vocabulary files. ``keep``: leave the spill files for a later run."""
    table = read_partition(scan_dir, partition)
    rank = user_rank(numpy_column(table, "user_id"), users).view(np.int64)
    counts = np.bincount(rank, minlength=users.size)
    kept = (counts >= cfg.min_len) & (counts > 0)
    sample_of = np.where(kept, np.cumsum(kept) - 1, -1)[rank]  # each event's sample, -1: its user dropped
    sink.check(counts[kept].astype(np.int32), partition)
    n_samples, in_sample = int(kept.sum()), sample_of >= 0
    source = numpy_column(table, "source").astype(np.int64)[in_sample]
    per_source = np.bincount(sample_of[in_sample] * sink.n_sources + source, minlength=n_samples * sink.n_sources)
    chosen = sink.fine >= 0
    sink.save_source_counts(partition, per_source.reshape(-1, sink.n_sources)[chosen].astype(np.int32))
    event_fine = np.where(in_sample, sink.fine[np.maximum(sample_of, 0)], -1)
    spilled = event_fine >= 0
    sample_users = users[kept]
    profile, missing = user_feature_lists(sample_users, scan_dir, partition, features)
    flat = pc.list_flatten(profile).to_numpy().reshape(-1, len(features))[chosen] if features else None
    items, actions = numpy_column(table, "item_id")[spilled], numpy_column(table, "action")[spilled]
    args = (sink.spill_dir, partition, sink.n_buckets, sink.bits, event_fine[spilled], items, actions)
    stats_ids.spill_chunk(*args, sink.fine[chosen], sample_users[chosen], flat)
    if not keep:
        remove_partition(scan_dir, partition)  # consumed: its pages go to the next files written
    used = int(counts[kept].sum())
    return PartitionRecord(
        events_in=int(rank.size),
        events_used=used,
        filtered={"kcore": 0, "min_len": int(rank.size) - used, "truncated_max_uih_len": 0},
        users_in=int((counts > 0).sum()),
        users_kept=n_samples,
        samples=n_samples,
        samples_without_profile=int(missing) if features else 0,
    )


def _prepare_job(config: Any, work: Path, pool: ProcessPoolExecutor | None) -> Any:
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
            executor=config.executor,
            ray_address=config.ray_address,
            user_fraction=1.0 if config.samples.kcore else config.sample_fraction,
            max_reject_fraction=config.max_reject_fraction,
        ),
        pool,
    )


@contextmanager
def stats_job(config: Any, work: Path, pool: ProcessPoolExecutor | None = None) -> Iterator[Any]:
    """``prepare``'s job for ``stats`` on raw sources; its executor (workers) stops on leaving.
    ``pool``: workers started earlier (``processes.start_pool``), as ``prepare`` takes them. The
    caller keeps the job until the report's plots are drawn: the workers draw some of them."""
    job = _prepare_job(config, work, pool)
    try:
        yield job
    finally:
        job.close()


def collect_sources(
    config: Any, work: Path, sizes_for: Callable[[int], tuple[list[int], str]], k: int, job: Any
) -> Collected:
    """Raw sources: the count-only path, then the partitions' samples straight into id records.

    ``sizes_for(n_selected)`` returns the global batch sizes and the headline layout's name; ``k``
    is the per-rank batch of the straggler predictions, which run beside the partitions' steps (they
    need only the lengths): in the driver after them, one core idled for their ~1 s on ``large``.
    ``job``: ``stats_job``'s."""
    counts = job.count_samples()
    return _collect_counted(config, work, sizes_for, k, job, counts)


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
    counted = order_free(config.samples, counts.event_counts)
    keep_input = config.work_dir is not None
    calls = []
    for p in range(counts.n_partitions):
        mine = np.flatnonzero(samples.built & (samples.partition == p))
        lengths = samples.lengths[mine].astype(np.int32)
        sink = StatsSink(str(spill_dir), lengths, fine[mine], n_buckets, bits, len(names), len(features))
        users = counts.user_ids[(user_partition == p) & user_built]
        if counted:
            calls.append((count_partition, (counts.scan_dir, p, users, config.samples, features, sink, keep_input)))
        else:
            args = (counts.scan_dir, str(samples_dir), p, config.samples, counts.removed_items, features, sink, users)
            calls.append((run_partition, (*args, keep_input)))
    costs = job.cost_model.cost(samples.lengths[canon])
    predictions = [(figures.predict_strategies, (costs, w, k, config.seed)) for w in config.world_sizes]
    done = job.map_calls([*predictions, *calls], "stats: samples", "task")
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
