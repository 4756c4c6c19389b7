"""What ``freescale stats`` reads: raw sources through ``prepare``'s own phases, or a prepared dataset.

Raw sources (``stats.sources``) go through ``prepare``'s readers, validation and sequence builder, so
the lengths reported are the lengths ``prepare`` would cost and balance. A prepared dataset is read
once, in plan order, through ``PreparedDataset`` (local or ``s3://``). Both hand their samples to
``spill_samples`` as ``SampleBatch``es: the id records of ``stats.ids`` and the events per source.

``--sample-fraction f`` keeps the samples of users whose hashed id falls below ``f``
(``datasets.ids.selected``: splitmix64, independent of the partitioning), so repeated runs and different
fractions agree on who is in.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from freescale.datasets.ids import selected
from freescale.pipeline import memory
from freescale.pipeline.cost import CostModel
from freescale.pipeline.stats import ids as stats_ids

if TYPE_CHECKING:
    from freescale.pipeline.dataset.manifest import Manifest

RANDOM_ORDER_STREAM = 7  # rng stream of the random batching order (seeded by --seed)
PREPARED_CHUNK_EVENTS = 2_000_000


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
    # ``figures.predict_strategies`` per W when computed beside the build (raw sources), else None
    predicted: dict[int, dict[str, Any]] | None = None
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


def _stack(rows: list[dict[str, Any]], name: str, dtype: Any) -> np.ndarray:
    return np.concatenate([np.asarray(r[name], dtype=dtype) for r in rows]) if rows else np.zeros(0, dtype)


@dataclass(frozen=True)
class SampleBatch:
    """Consecutive samples as flat arrays: what the id records and events per source are made of,
    whether the samples come from ``run_partition`` (an Arrow table) or a prepared dataset's rows."""

    user_id: np.ndarray  # per sample
    length: np.ndarray  # per sample
    items: np.ndarray  # per event, samples back to back
    actions: np.ndarray  # per event
    sources: np.ndarray  # per event: index of the source it came from
    features: np.ndarray | None  # [samples, features] or None without a profile table

    @classmethod
    def of_table(cls, table: pa.Table, n_features: int) -> SampleBatch:
        """``sequences.SAMPLE_SCHEMA`` columns."""
        return cls(
            user_id=table.column("user_id").to_numpy(),
            length=table.column("length").to_numpy().astype(np.int64),
            items=_flat(table.column("item_ids")),
            actions=_flat(table.column("actions")),
            sources=_flat(table.column("sources")),
            features=_flat(table.column("user_features")).reshape(-1, n_features) if n_features else None,
        )

    @classmethod
    def of_rows(cls, rows: list[dict[str, Any]], n_features: int) -> SampleBatch:
        """Rows of a prepared dataset (``PreparedDataset.row``)."""
        return cls(
            user_id=np.array([int(r["user_id"]) for r in rows], np.int64),
            length=np.array([int(r["length"]) for r in rows], np.int64),
            items=_stack(rows, "item_ids", np.int64),
            actions=_stack(rows, "actions", np.int64),
            sources=_stack(rows, "sources", np.int64),
            features=_stack(rows, "user_features", np.int64).reshape(-1, n_features) if n_features else None,
        )

    def select(self, keep: np.ndarray) -> SampleBatch:
        """The samples where ``keep`` is true."""
        if keep.all():
            return self
        events = np.repeat(keep, self.length)
        return SampleBatch(
            user_id=self.user_id[keep],
            length=self.length[keep],
            items=self.items[events],
            actions=self.actions[events],
            sources=self.sources[events],
            features=None if self.features is None else self.features[keep],
        )

    def source_counts(self, n_sources: int) -> np.ndarray:
        """Events per source of each sample, ``[samples, n_sources]``."""
        owner = np.repeat(np.arange(self.length.size, dtype=np.int64), self.length)
        counts = np.bincount(owner * n_sources + self.sources.astype(np.int64), minlength=self.length.size * n_sources)
        return counts.reshape(-1, n_sources).astype(np.int32)


def spill_samples(spill_dir: str, chunk: int, n_buckets: int, bits: int, fine: np.ndarray, batch: SampleBatch) -> int:
    """The id records of ``batch`` (every sample selected; ``fine``: each one's fine batch)."""
    fine = np.asarray(fine, np.int64)
    event_fine = np.repeat(fine, batch.length)
    return stats_ids.spill_chunk(
        spill_dir, chunk, n_buckets, bits, event_fine, batch.items, batch.actions, fine, batch.user_id, batch.features
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


# ------------------------------------------------------------------------------------------ prepared
def _source_names(manifest: Manifest) -> list[str]:
    """Source names in index order: the manifest lists source files in (source, file) order."""
    names: list[str] = []
    for source in manifest.source_names:
        if source != "users" and source not in names:
            names.append(source)
    return names or sorted(manifest.rows.events_read_by_source)


def collect_prepared(config: Any, work: Path, sizes_for: Callable[[int], tuple[list[int], str]]) -> Collected:
    """A prepared dataset, read once in plan order (rows of micro-batch m are [o[m], o[m+1]))."""
    from freescale.pipeline.dataset.reader import PreparedDataset

    dataset = PreparedDataset(config.input, cache_dir=config.cache_dir, verify=config.verify)
    manifest = dataset.info
    names = _source_names(manifest)
    features = list(manifest.layout.user_features)
    g = dataset.group_size
    offsets = dataset.offsets.astype(np.int64)
    n_rows = int(offsets[-1])
    micro_batch = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    mean_len = max(manifest.lengths.mean, 1.0)
    chunk_rows = max(1, int(PREPARED_CHUNK_EVENTS / mean_len))
    # Selection is by user hash, known per row as rows arrive; positions count selected rows in plan
    # order, so one sequential pass suffices. Batch sizes are fixed up front from the expected count.
    sizes, headline = sizes_for(int(n_rows * min(config.sample_fraction, 1.0)))
    tracker = stats_ids.FineTracker(sizes)
    # The bucket count must be fixed before spilling: size it from the manifest's event count.
    n_buckets = memory.stats_bucket_count(manifest.rows.events_used + n_rows * (1 + len(features)), config.memory_limit)
    bits = stats_ids.fine_bits(n_rows)  # a fine batch starts at most once per row
    spill_dir = work / "spill"
    remove(spill_dir)  # records of an interrupted run would be counted twice
    spill_dir.mkdir(parents=True)
    users, windows, lengths, costs, counts, keep_all = [], [], [], [], [], []
    position = 0
    _ = dataset.rows  # opened before the progress bar
    bar = tqdm(total=n_rows, desc="stats: rows", unit="sample", disable=not config.progress, leave=False)
    for chunk, start in enumerate(range(0, n_rows, chunk_rows)):
        rows = [dataset.row(i) for i in range(start, min(start + chunk_rows, n_rows))]  # shards checked
        batch = SampleBatch.of_rows(rows, len(features))
        keep = selected(batch.user_id, config.sample_fraction)
        counts.append(batch.source_counts(len(names)))
        users.append(batch.user_id)
        windows.append(np.array([int(r["window"]) for r in rows], np.int64))
        lengths.append(batch.length)
        costs.append(np.array([float(r["cost"]) for r in rows], np.float64))
        keep_all.append(keep)
        positions = position + np.arange(int(keep.sum()), dtype=np.int64)
        position += positions.size
        fine = tracker.assign(positions, micro_batch[start : start + len(rows)][keep] // g)
        spill_samples(str(spill_dir), chunk, n_buckets, bits, fine, batch.select(keep))
        bar.update(len(rows))
    bar.close()
    users_a, windows_a = np.concatenate(users), np.concatenate(windows)
    lengths_a, costs_a, keep_a = np.concatenate(lengths), np.concatenate(costs), np.concatenate(keep_all)
    counts_a = np.concatenate(counts)
    n_groups = (len(offsets) - 1) // g
    layout = manifest.layout
    group_batch = g * layout.micro_batch_size if layout.mode == "equal_count" else None
    layouts = tracker.layouts(position, n_groups, group_batch)
    reducer = stats_ids.IdReducer(stats_ids.table_names(features), config.table_sizes, layouts, bits)
    reduce_spills(str(spill_dir), n_buckets, reducer, _serially(config.progress))
    canon, order = canonical(users_a, windows_a, keep_a, config.seed)
    mb_costs = np.bincount(micro_batch, weights=costs_a, minlength=len(offsets) - 1)
    return Collected(
        kind="prepared",
        dataset=manifest.dataset,
        source_names=names,
        features=features,
        cost_model=manifest.cost_model,
        rows=manifest.rows.to_dict(),
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
            "micro_batch_size": layout.micro_batch_size,
            "mode": layout.mode,
            "strategy": layout.strategy,
            "seed": manifest.balance_seed,
            "fingerprint": manifest.fingerprint,
            "n_step_groups": n_groups,
        },
    )


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
