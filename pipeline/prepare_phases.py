"""A ``prepare`` job's phases (``prepare.py``'s docstring): scan, k-core, plan, samples into plan-order
buckets and write, each resumable from its completion records in the work directory.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from freescale import storage
from freescale.pipeline import memory
from freescale.pipeline import output as places
from freescale.pipeline.balance.windows import plan_in_windows
from freescale.pipeline.config import PrepareConfig
from freescale.pipeline.manifest import QUARANTINE_NAME, no_sample_rows
from freescale.pipeline.output import NoSamplesError, PrepareError, RejectsError
from freescale.pipeline.prepare_output import quarantine_examples, quarantine_lines
from freescale.pipeline.records import PartitionRecord, SamplePlan
from freescale.pipeline.steps import scan
from freescale.pipeline.steps.sequences import (
    dropped_users,
    kcore_item_counts,
    load_partition_record,
    planned_samples,
    run_partition,
)
from freescale.pipeline.steps.writer import PART_SIZE, BucketSink, merge_part_indexes, part_done, write_part

KCORE_USER_COUNTS = "kcore_user_counts.npy"  # per-user event counts after the last k-core pass


BUCKET_SIZE_RECORD = "bucket_size.json"  # samples per write bucket, fixed when the samples step starts


class Phases:
    """``PrepareJob``'s phases (a mixin: the attributes and the executor calls are the job's)."""

    config: PrepareConfig
    work: Path
    target: str
    source_files: list[dict[str, Any]]
    _n_partitions: int

    @property
    def preload_writer(self) -> bool:
        """Start the writer process with the job (``WriterProcess``) when reserving its memory leaves
        at least half of ``--memory-limit`` to the workers."""
        return memory.preload_writer(self.config.memory_limit)

    @property
    def n_partitions(self) -> int:
        formats = {source.name: source.format for source in self.sources.sources}
        estimated = memory.estimate_events(formats, self.source_files)
        budget = self._budget()
        return memory.choose_partition_count(estimated, budget.tasks, budget.concurrent)

    def _budget(self) -> memory.JobBudget:
        """What the engine leaves the tasks' data (``memory.job_budget``)."""
        config = self.config
        joined = bool(config.ray_address)
        return memory.job_budget(config.executor, config.memory_limit, config.workers, joined, self._writer_reserved)

    def _scan(self) -> tuple[scan.ScanSummary, dict[str, Any]]:
        scan_dir = str(self.work / "scan")
        state_path = self.work / "scan" / "partitions.json"
        if state_path.exists():
            n_partitions = json.loads(state_path.read_text())["n_partitions"]
        else:
            n_partitions = self.n_partitions
            scan.save_json(state_path, {"n_partitions": n_partitions})
        self._n_partitions = n_partitions
        examples, fraction = self.config.quarantine_examples, self.config.user_fraction
        read_budget, time_range = self._budget().per_task, self.config.time_range
        todo = [
            (
                scan.run_scan_task,
                (self.sources, task, i, n_partitions, scan_dir, examples, fraction, read_budget, time_range),
            )
            for i, task in enumerate(self.tasks)
            if scan.load_task_record(scan_dir, i) is None
        ]
        todo.sort(key=lambda call: call[1][1].est_cost, reverse=True)  # longest first; records are per task id
        self._log(f"scan: {len(self.tasks)} read tasks ({len(todo)} to do), {n_partitions} user partitions")
        if scan.load_user_table_record(scan_dir) is None:  # small: last, beside the other worker's last task
            user_table = (self.sources, n_partitions, scan_dir, examples)
            todo.append((scan.run_user_table_task, user_table))
        self._save_driver_records()
        self._run_calls(todo, "scan", "task")
        summary = scan.ScanSummary()
        for i in range(len(self.tasks)):
            summary.add(scan.load_task_record(scan_dir, i), self.config.quarantine_examples)
        users = scan.load_user_table_record(scan_dir)
        self._check_rejects(summary.rejected, summary.rows_read, "", summary.examples)
        self._check_user_rejects(summary, users)
        return summary, users

    def _check_user_rejects(self, summary: scan.ScanSummary, users: dict[str, Any]) -> None:
        """The users table against ``--max-reject-fraction`` over its own rows (a table whose rows were
        all rejected left every sample without a profile, and the job succeeded)."""
        files = ", ".join(self._users_files())
        examples = quarantine_examples(summary, users)  # the events' too, as the dataset's quarantine holds them
        self._check_rejects(Counter(users["rejected"]), users["rows_read"], f"users table {files}: ", examples)

    def _check_rejects(self, rejected: Counter, rows_read: int, table: str, examples: dict[str, list[dict]]) -> None:
        """``--max-reject-fraction`` over one table's rows (``table``: how the error names it; the events
        are counted over every source, the users table over its own rows): past it, the examples go
        to the work directory's quarantine file and the job ends in one line naming it."""
        total = sum(rejected.values())
        fraction = total / max(rows_read, 1)
        if fraction <= self.config.max_reject_fraction:
            return
        quarantine = self.work / QUARANTINE_NAME
        quarantine.write_text(quarantine_lines(examples))
        reasons = ", ".join(f"{reason}={count}" for reason, count in sorted(rejected.items()))
        raise RejectsError(
            f"{table}{total} of {rows_read} rows rejected ({fraction:.2%}) exceeds "
            f"--max-reject-fraction {self.config.max_reject_fraction:.2%} ({reasons})",
            quarantine,
        )

    def _users_files(self, shown: int = 3) -> list[str]:
        """The users table's files (``shown`` of them, then how many more) for a message."""
        files = [entry["uri"] for entry in self.source_files if entry["source"] == "users"]
        return files[:shown] + ([f"(+{len(files) - shown} more)"] if len(files) > shown else [])

    def _kcore(self) -> str | None:
        """Grow the set of removed items until a pass removes nothing new (a k-core fixpoint).

        Users live in one partition each, so a pass drops weak users locally and returns item counts;
        items are global, so the counts are summed here. The removed-item set fully determines the
        state: users with fewer than k events left are dropped again when samples are built.
        """
        k = self.config.samples.kcore
        if not k:
            return None
        path = self.work / "samples" / "kcore_removed_items.npy"
        if path.exists():
            return str(path)
        removed = np.zeros(0, np.int64)
        scan_dir = str(self.work / "scan")
        for iteration in range(self.config.samples.kcore_max_iterations):
            jobs = [(scan_dir, p, removed, k) for p in range(self._n_partitions)]
            results = self.map(kcore_item_counts, jobs, f"k-core pass {iteration + 1}", "partition")
            totals = pl.concat([items for items, _ in results]).group_by("item_id").agg(pl.col("count").sum())
            weak = totals.filter(pl.col("count") < k)["item_id"].to_numpy()
            if len(weak) == 0:
                users = pl.concat([user_counts for _, user_counts in results]).sort("user_id")
                places.save_npy_atomic(self.work / "samples" / KCORE_USER_COUNTS, users.to_numpy().T.astype(np.int64))
                break
            removed = np.union1d(removed, weak)
        else:
            raise PrepareError(
                f"k-core did not converge in {self.config.samples.kcore_max_iterations} passes; "
                "raise kcore_max_iterations or lower --kcore"
            )
        self._log(f"k-core {k}: {len(removed)} items removed after {iteration + 1} passes, {totals.height} kept")
        places.save_npy_atomic(path, removed)  # its presence marks k-core done: whole or absent
        self._save_driver_records()
        return str(path)

    def _user_counts(self, removed_items: str | None) -> tuple[np.ndarray, np.ndarray]:
        """Every user's event count as ``run_partition`` will see it: from the scan's per-task counts,
        or after k-core item removal from the last k-core pass."""
        if removed_items is not None:
            users, counts = np.load(self.work / "samples" / KCORE_USER_COUNTS)
            return users, counts
        return scan.user_event_counts(str(self.work / "scan"), len(self.tasks))

    def _no_samples(self, events: int, n_users: int) -> str:
        """Why no sample is left: no valid event at all (``events``: the scan's), k-core removed every
        item, or users too short for the filters (``n_users``: those with events after k-core)."""
        if not events:
            return (
                "no samples: the sources hold no valid event (empty or header-only files, or every row "
                "rejected or outside --time-range)"
            )
        samples = self.config.samples
        if not n_users:
            return (
                f"no samples left after filtering: --kcore {samples.kcore} removed every item of the {events:,} "
                "events; lower --kcore or check the sources"
            )
        kcore = f" after --kcore {samples.kcore}" if samples.kcore else ""
        return (
            f"no samples left after filtering: each of the {n_users:,} users has fewer than --min-len "
            f"{samples.min_len} events{kcore}; lower --min-len / --kcore or check the sources"
        )

    def _filtered_without_samples(self, summary: scan.ScanSummary, counts: np.ndarray) -> dict[str, int]:
        """Where the scan's events went when no user keeps a sample (``counts``: per user, after k-core's
        item removal): the reasons and counts ``build_samples`` would have recorded."""
        weak, short = dropped_users(counts, self.config.samples)
        removed_items = summary.events_kept - int(counts.sum())  # k-core's removed items' events
        return {
            "kcore": removed_items + int(counts[weak].sum()),
            "min_len": int(counts[short].sum()),
            "truncated_max_uih_len": 0,
        }

    def _plan(self, removed_items: str | None, summary: scan.ScanSummary, users_record: dict[str, Any]) -> SamplePlan:
        """Cost and place every sample before any is built: lengths follow from per-user counts.
        No sample at all is a ``NoSamplesError`` carrying the accounting (``no_sample_rows``)."""
        done = SamplePlan.load_if_done(self.work)
        if done is not None:
            return done
        users, counts = self._user_counts(removed_items)
        meta = planned_samples(users, counts, self.config.samples)  # canonical (user_id, window) order
        if len(meta["length"]) == 0:
            filtered = self._filtered_without_samples(summary, counts)
            message = self._no_samples(summary.events_kept, len(users))
            raise NoSamplesError(message, no_sample_rows(summary, users_record, filtered))
        costs = self.cost_model.cost(meta["length"])
        self._log(f"plan: {len(costs)} samples into step groups of {self.config.balance.group_size}")
        balanced = plan_in_windows(costs, self.config.balance, self.config.plan_memory, self.config.memory_limit)
        self._log(f"plan: balanced in {balanced.report['runtime_s']:.2f}s")  # not in the manifest: not reproducible
        plan = SamplePlan(
            users=users,
            partition=scan.partition_of(meta["user_id"], self._n_partitions),
            length=meta["length"],
            cost=costs,
            order=balanced.order,
            offsets=balanced.micro_batch_offsets,
            report=balanced.report,
        )
        plan.save(self.work)
        self._save_driver_records()
        return plan

    def _bucket_size(self, plan: SamplePlan) -> int:
        """Samples per write bucket (``memory.write_bucket_size``), fixed by the first run of the job:
        the bucket files are numbered by it, and a resumed run may have another engine (whose budget
        differs) or --memory-limit."""
        path = self.work / "buckets" / BUCKET_SIZE_RECORD
        if path.exists():
            return int(json.loads(path.read_text())["bucket_size"])
        size = memory.write_bucket_size(plan.n_samples, plan.total_events, self._budget().writer, PART_SIZE)
        scan.save_json(path, {"bucket_size": size})
        self._save_driver_records()
        return size

    def _build_buckets(self, removed_items: str | None, features: list[str], plan: SamplePlan) -> list[PartitionRecord]:
        """Build each partition's samples and encode them into plan-order buckets (``BucketSink``)."""
        position, micro_batch = plan.positions(), plan.micro_batches()
        bucket_size = self._bucket_size(plan)
        samples_dir = str(self.work / "samples")
        user_partition = scan.partition_of(plan.users, self._n_partitions)
        jobs = []
        for p in range(self._n_partitions):
            if load_partition_record(samples_dir, p) is not None:
                continue
            mine = np.flatnonzero(plan.partition == p)  # canonical order, as build_samples returns them
            sink = BucketSink(
                str(self.work / "buckets"),
                position[mine],
                plan.cost[mine],
                micro_batch[mine],
                plan.length[mine].astype(np.int32),
                bucket_size,
                bool(features),
            )
            users = plan.users[user_partition == p]
            jobs.append(
                (str(self.work / "scan"), samples_dir, p, self.config.samples, removed_items, features, sink, users)
            )
        self.map(run_partition, jobs, "samples", "partition")
        return [load_partition_record(samples_dir, p) for p in range(self._n_partitions)]

    def _write(self, plan: SamplePlan, with_features: bool) -> None:
        n = plan.n_samples
        bucket_size = self._bucket_size(plan)
        n_buckets = -(-n // bucket_size)
        buckets_dir = str(self.work / "buckets")
        self._log(f"write: {n} samples in {n_buckets} buckets → {self.target}")
        self._writing_to = self.target
        if not storage.is_remote(self.target):
            Path(self.target).mkdir(parents=True, exist_ok=True)
        n_parts = -(-n // PART_SIZE)
        executor = self._start_executor(writer=False)
        executor.release()  # idle workers keep their peak memory: release it before the writer's peak
        todo = [part for part in range(n_parts) if not part_done(buckets_dir, part)]
        args = (self.target, buckets_dir, bucket_size)
        tail = (n, with_features, self.config.shard_size_limit)
        self._run_calls([(write_part, (*args, part, *tail)) for part in todo], "write", "part", write=True)
        self._log(f"write: {n_parts} parts of up to {PART_SIZE} samples written")
        storage.write_bytes(storage.join(self.target, "index.json"), merge_part_indexes(self.target, n_parts))
