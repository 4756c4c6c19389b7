"""``freescale prepare``: heterogeneous UIH sources → globally load-balanced MDS shards.

Phases, each restartable from its completion markers in the work directory:

1. scan     — read all sources in parallel tasks, validate, spill events by user partition and
               count events per user;
2. k-core   — optional iterative filter over users and items (global item counts per pass);
3. plan     — every sample's length follows from its user's event count (``planned_samples``), so
               samples are costed (``cost``) and placed in step groups (``balance``) before any is built;
4. samples  — per partition: merge sources by time, cut samples (``sequences``), encode them as MDS
               bytes and split them into plan-order buckets (``writer.BucketSink``), in the workers;
5. write    — read buckets in order and write MDS shards in a writer process that was started with
               the job, so importing mosaicml-streaming overlaps the scan (``writer_process``);
6. manifest — accounting, balance report, config; written last, so its presence means "complete".
               A local output is built in a staging directory beside it that then replaces it in one
               rename; the output is locked for the whole job (``output``: lock, swap, overlap checks).

Intermediate files are deleted as soon as they are consumed (spill files when their partition is
built, buckets when their parts are written): besides disk, that hands their page cache to the next
files written (see ``scan.remove_partition``).

Memory stays bounded by ``--memory-limit``: partitions and buckets are sized so that the workers
hold at most half of what the engine leaves them (``memory.job_budget``: the local executor's writer
process reservation, or a started Ray runtime's processes and concurrent writers). The bucket size
is recorded when the samples step starts, so a job resumed on the other executor reads its buckets.
With ``--work-dir s3://`` the steps run in a node-local mirror synced with the prefix (``workdir``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.fs as pafs
from tqdm import tqdm

from freescale import storage
from freescale.datasets.sources import SourcesConfig
from freescale.pipeline import memory
from freescale.pipeline import output as places
from freescale.pipeline.balance.windows import plan_in_windows
from freescale.pipeline.config import PrepareConfig
from freescale.pipeline.cost import CostModel
from freescale.pipeline.dataset.manifest import MANIFEST_NAME, OFFSETS_NAME
from freescale.pipeline.dataset.vocabulary import Vocabulary, vocabulary_file
from freescale.pipeline.executors import Executor, Progress, make_executor
from freescale.pipeline.manifest import QUARANTINE_NAME, build_manifest, published_files, read_manifest_if_any
from freescale.pipeline.output import OutputLock, PrepareError
from freescale.pipeline.records import PartitionRecord, SamplePlan
from freescale.pipeline.steps import scan
from freescale.pipeline.steps.coverage import target_coverage
from freescale.pipeline.steps.sequences import kcore_item_counts, load_partition_record, planned_samples, run_partition
from freescale.pipeline.steps.vocabularies import merge_partition_ids
from freescale.pipeline.steps.writer import (
    PART_SIZE,
    BucketSink,
    merge_part_indexes,
    part_done,
    part_name,
    write_part,
    written_part_problem,
)
from freescale.pipeline.workdir import RemoteWork, mirror_path, remote_step

# Rows per scan task: each task writes a spill file per partition and a record, so fewer, larger tasks
# mean fewer files to create and for the samples phase to open (large: 30 tasks of 1M rows -> 14 of up
# to 4M, prepare ~0.5 s faster). A task's memory is bounded by its chunks, not by its size.
TARGET_ROWS_PER_TASK = 4_000_000


WORK_LAYOUT = 9  # bump when spill, bucket, plan or marker formats or the read-task plan change
KCORE_USER_COUNTS = "kcore_user_counts.npy"  # per-user event counts after the last k-core pass
BUCKET_SIZE_RECORD = "bucket_size.json"  # samples per write bucket, fixed when the samples step starts


@dataclass
class SampleCounts:
    """What the scan and k-core phases tell before any sample is built (``PrepareJob.count_samples``):
    accounting, every user's event count (``planned_samples`` turns them into sample lengths) and
    where the partitions' events wait for ``run_partition``."""

    scan: scan.ScanSummary
    users: dict[str, Any]  # the user table's record (``features``, rejects)
    user_ids: np.ndarray  # sorted
    event_counts: np.ndarray  # per user, after k-core item removal
    removed_items: str | None  # k-core's removed-item file, for ``run_partition``
    scan_dir: str
    n_partitions: int


class PrepareJob:
    """One ``prepare`` run; ``run()`` returns the manifest."""

    def __init__(self, config: PrepareConfig, pool: ProcessPoolExecutor | None = None) -> None:
        """``pool``: workers started earlier (``processes.start_pool``), used instead of starting new ones."""
        self._started = time.perf_counter()
        self._pool = pool
        self._executor: Executor | None = None
        self._writer_reserved = False  # the local executor's writer process holds WRITER_PROCESS_BYTES
        self.config = config
        self.sources = SourcesConfig.from_toml(config.sources)
        self.cost_model = (
            CostModel.from_file(config.cost_model_file)
            if config.cost_model_file
            else CostModel.from_model(config.model)
        )
        self.tasks = scan.plan_read_tasks(self.sources, TARGET_ROWS_PER_TASK)
        self.source_files = self._source_files()
        self.fingerprint = self._fingerprint()
        # the layout version keeps a work dir of an older release (other spill/bucket formats) from being resumed
        work_name = f"{self.fingerprint[:16]}-w{WORK_LAYOUT}"
        self.remote_work: RemoteWork | None = None  # --work-dir s3://...: the steps use a local mirror
        if config.work_dir and storage.is_remote(config.work_dir):
            self.work_root = mirror_path(config.work_dir)
            self.remote_work = RemoteWork(storage.join(config.work_dir, work_name), str(self.work_root / work_name))
        else:
            self.work_root = Path(config.work_dir or self._default_work_dir())
        self.work = self.work_root / work_name
        # where this run writes the dataset: a staging directory swapped in whole (local output), or
        # the s3:// prefix itself (``output`` module)
        self.target = self.config.output
        if not storage.is_remote(self.config.output):
            self.target = str(places.staging_path(self.config.output, self.fingerprint))
        self._writing_to = str(self.work)  # what a full disk is reported against

    # ----------------------------------------------------------------- identity
    def _source_files(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for task in self.tasks:
            if task.path in seen:
                continue
            fs, path = storage.filesystem(task.path)
            info = fs.get_file_info(path)
            seen[task.path] = {
                "source": self.sources.sources[task.source].name,
                "uri": task.path,
                "size": info.size,
                "mtime_ns": info.mtime_ns,
            }
        if self.sources.users is not None:
            for uri in storage.expand(self.sources.resolve(self.sources.users.path)):
                fs, path = storage.filesystem(uri)
                info = fs.get_file_info(path)
                seen[uri] = {"source": "users", "uri": uri, "size": info.size, "mtime_ns": info.mtime_ns}
        return list(seen.values())

    def _fingerprint(self) -> str:
        identity = {
            "schema": 1,
            "config": self.config.fingerprint_fields(),
            "cost_model": self.cost_model.to_dict(),
            "sources": self.source_files,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()

    def _default_work_dir(self) -> str:
        """Beside a local output, never inside it (the output is replaced whole); for an s3:// output a
        directory of this user's under the temp dir (``output.private_work_root``)."""
        if storage.is_remote(self.config.output):
            return str(places.private_work_root())
        output = places.local_output(self.config.output)
        return str(output.parent / f".{output.name}.freescale-work")

    def _inputs(self) -> list[str]:
        """Every file the job reads: replacing an output that holds one would delete it."""
        inputs = [entry["uri"] for entry in self.source_files] + [self.config.sources]
        return inputs + ([self.config.cost_model_file] if self.config.cost_model_file else [])

    # ----------------------------------------------------------------- driver
    def run(self) -> dict[str, Any]:
        """Lock the output (and the work directory), then resume or start the job; a full disk ends
        it with one line naming where, leaving what is done for the next run."""
        places.check_no_overlap(self.config.output, self._inputs())
        work_dir = self.config.work_dir if self.remote_work else str(self.work_root)
        places.check_no_overlap(self.config.output, [work_dir], what="the work directory")
        places.check_output_place(self.config.output)
        locks = [
            OutputLock(places.lock_path(self.config.output, self.work_root), self.config.output),
            OutputLock(self.work.with_name(self.work.name + places.LOCK_SUFFIX), f"work directory {self.work}"),
        ]
        try:
            for lock in locks:
                lock.acquire()
            self._remove_leftovers()
            existing = self._check_output()
            if not storage.is_remote(self.config.output):  # all of them once the output is up to date
                places.remove_stale_staging(self.config.output, keep=None if existing else Path(self.target))
            if existing is not None:
                self._log("output is up to date (same config and sources): nothing to do")
                self._remove_work()  # a job killed after publishing left it
                return existing
            places.check_replaceable(self.config.output)
            if self.remote_work is None:
                places.record_work_owner(self.work, self.config.output)
            return self._run()
        except Exception as error:
            if places.disk_full(error):
                raise PrepareError(places.disk_full_message(error, self._writing_to)) from error
            raise
        finally:
            self.close()
            for lock in reversed(locks):
                lock.release()
            with contextlib.suppress(OSError):
                self.work_root.rmdir()  # only when no other job's work is left there

    def _run(self) -> dict[str, Any]:
        self._writer_reserved = self.config.executor == "local" and self.preload_writer
        self._start_executor(writer=self._writer_reserved)
        if self.remote_work is not None:
            self.remote_work.reset_mirror()  # the prefix is the truth: resume from its markers
        self._make_work_dirs()
        self._check_written_parts()
        scan_summary, users_record = self._scan()
        removed_items = self._kcore()
        plan_info = self._plan(removed_items)
        counts = self._user_counts(removed_items)[1]
        targets = target_coverage(counts, self.config.samples, self.config.model.max_uih_len)
        sample_records = self._build_buckets(removed_items, users_record["features"], plan_info)
        features = users_record["features"]
        vocabularies = merge_partition_ids(str(self.work / "samples"), self._n_partitions, features)
        self._write(plan_info, bool(users_record["features"]))
        manifest = build_manifest(self, scan_summary, users_record, sample_records, plan_info)
        manifest["tables"] = {
            table: {"size": vocab.size, "file": vocabulary_file(table, features), "ids": "exact: row r = vocab[r]"}
            for table, vocab in vocabularies.items()
        }
        manifest["targets"] = targets.to_dict()  # what the model's window never trains on
        # A JSON round trip: the caller gets exactly what a later reader of manifest.json gets.
        manifest = json.loads(json.dumps(manifest, default=str))
        files = {vocabulary_file(table, features): vocab for table, vocab in vocabularies.items()}
        self._publish(manifest, plan_info.offsets, scan_summary, users_record, files)
        self._remove_work()
        return manifest

    def _remove_leftovers(self) -> None:
        """Work directories of this output's earlier jobs that will never resume (another fingerprint,
        another layout) and their lock files; a local work root only (an s3:// one is the prefix's)."""
        if self.remote_work is not None:
            return
        own_root = self.config.work_dir is None and not storage.is_remote(self.config.output)
        for stale in places.remove_stale_work(self.work_root, self.work, self.config.output, own_root):
            self._log(f"removed the stale work directory {stale}")

    def _remove_work(self) -> None:
        if self.remote_work is not None:
            self.remote_work.remove()
        shutil.rmtree(self.work, ignore_errors=True)

    def _make_work_dirs(self) -> None:
        for sub in ("scan", "samples", "buckets"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)

    def count_samples(self) -> SampleCounts:
        """Scan and k-core (resumable), then every user's event count: the count-only path that
        ``stats`` and ``simulate`` take on raw sources (sample lengths need no sample built)."""
        if self.remote_work is not None:
            raise PrepareError("stats: an s3:// --work-dir is supported by prepare only; pass a local one")
        self._make_work_dirs()
        scan_summary, users_record = self._scan()
        removed_items = self._kcore()
        users, counts = self._user_counts(removed_items)
        return SampleCounts(
            scan=scan_summary,
            users=users_record,
            user_ids=users,
            event_counts=counts,
            removed_items=removed_items,
            scan_dir=str(self.work / "scan"),
            n_partitions=self._n_partitions,
        )

    def _log(self, message: str) -> None:
        if self.config.progress:
            tqdm.write(f"prepare [{time.perf_counter() - self._started:6.1f}s] {message}")

    def _check_written_parts(self) -> None:
        """A part marked written must be in the target as this job wrote it (``written_part_problem``).
        The target is not held between runs: a staging directory may have been removed, an s3:// output
        cleared by ``--overwrite``, and a killed release of ours left another dataset's parts under the
        staging name. The part's buckets are gone, so the work directory cannot finish the job: start
        it again (in an emptied staging directory) rather than publish files this job did not write."""
        buckets_dir = str(self.work / "buckets")
        remote = storage.is_remote(self.target)
        for marker in sorted(Path(buckets_dir).glob("write.part-*.done")):
            part = int(marker.name.split("-")[1].split(".")[0])
            problem = written_part_problem(self.target, buckets_dir, part, hash_shards=not remote)
            if problem is not None:
                self._log(f"{part_name(part)} is marked written but {problem}: starting over")
                self._remove_work()
                if not remote:
                    shutil.rmtree(self.target, ignore_errors=True)
                self._make_work_dirs()
                return

    def _check_output(self) -> dict[str, Any] | None:
        """Refuse to clobber a different dataset; report an identical finished one as up to date."""
        manifest = read_manifest_if_any(self.config.output, damaged_ok=self.config.overwrite)
        if manifest is not None and manifest.get("fingerprint") == self.fingerprint and not self.config.overwrite:
            return manifest
        if manifest is not None and not self.config.overwrite:
            raise PrepareError(
                f"{self.config.output} already holds a different prepared dataset (fingerprint "
                f"{manifest.get('fingerprint', '?')[:12]} != {self.fingerprint[:12]}); pass --overwrite to replace it"
            )
        if manifest is None and not self.config.overwrite and self._has_foreign_files():
            raise PrepareError(
                f"{self.config.output} is not empty and holds no FreeScale manifest; pass --overwrite "
                "to replace its contents or choose another --output"
            )
        remote = storage.is_remote(self.config.output)
        if remote and self.config.overwrite and (manifest is not None or self._has_foreign_files()):
            self._clear_output()  # s3 has no swap: the old dataset goes first, its manifest first of all
        return None

    def _has_foreign_files(self) -> bool:
        """Entries that are not an unfinished FreeScale output (parts of a killed job that wrote in place)."""
        fs, path = storage.filesystem(self.config.output)
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return False
        if fs.get_file_info(path).type != pafs.FileType.Directory:
            return True
        entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return bool(entries) and not places.is_unfinished_own_output([entry.base_name for entry in entries])

    def _clear_output(self) -> None:
        """Empty an s3:// output, ``manifest.json`` first: a reader never sees a manifest without its files."""
        fs, path = storage.filesystem(self.config.output)
        entries = sorted(fs.get_file_info(pafs.FileSelector(path)), key=lambda e: e.base_name != MANIFEST_NAME)
        for entry in entries:
            if entry.type == pafs.FileType.Directory:
                fs.delete_dir(entry.path)
            else:
                fs.delete_file(entry.path)

    def _start_executor(self, writer: bool) -> Executor:
        """The ``--executor``'s executor, started once per job (``executors``)."""
        if self._executor is None:
            progress = Progress(self.config.progress, self._log)
            self._executor = make_executor(
                self.config.executor,
                self.config.workers,
                progress,
                pool=self._pool,
                writer=writer,
                ray_address=self.config.ray_address,
                memory_limit=self.config.memory_limit,
            )
            self._pool = None  # the executor owns it now
        return self._executor

    def close(self) -> None:
        """Stop the executor's workers (and the local executor's writer process)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        if self._pool is not None:  # a pool handed in for a job that never started its executor
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def map(self, fn: Callable[..., Any], jobs: list[tuple], desc: str, unit: str) -> list[Any]:
        """Run ``fn(*job)`` for each job on the executor; results in job order."""
        return self.map_calls([(fn, job) for job in jobs], desc, unit)

    def map_calls(self, calls: list[tuple[Callable[..., Any], tuple]], desc: str, unit: str) -> list[Any]:
        """Run ``fn(*args)`` for each call on the executor (started in list order); results in order."""
        return self._run_calls(calls, desc, unit)

    def _run_calls(
        self, calls: list[tuple[Callable[..., Any], tuple]], desc: str, unit: str, write: bool = False
    ) -> list[Any]:
        """Run a step's calls on the executor (``write``: the write step's, ``Executor.write``); with an
        s3:// work directory each call syncs its files with the prefix (``workdir.RemoteStep``) and
        the driver then downloads the records the calls wrote, wherever they ran."""
        if self.remote_work is not None:
            calls = [(remote_step(self.remote_work, fn), args) for fn, args in calls]
        executor = self._start_executor(writer=False)
        results = executor.write(calls, desc) if write else executor.map(calls, desc, unit)
        if self.remote_work is not None:
            self.remote_work.pull_records()
        return results or []

    def _save_driver_records(self) -> None:
        """The driver's own records (partition count, k-core, plan) into the s3:// work directory."""
        if self.remote_work is not None:
            self.remote_work.push_records()

    # ----------------------------------------------------------------- phases
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
        self._check_rejects(summary)
        return summary, scan.load_user_table_record(scan_dir)

    def _check_rejects(self, summary: scan.ScanSummary) -> None:
        fraction = summary.rejected_total / max(summary.rows_read, 1)
        if fraction <= self.config.max_reject_fraction:
            return
        quarantine = self.work / QUARANTINE_NAME
        quarantine.write_text(quarantine_lines(summary.examples))
        reasons = ", ".join(f"{reason}={count}" for reason, count in sorted(summary.rejected.items()))
        raise PrepareError(
            f"{summary.rejected_total} of {summary.rows_read} rows rejected ({fraction:.2%}) exceeds "
            f"--max-reject-fraction {self.config.max_reject_fraction:.2%} ({reasons}); examples in {quarantine}"
        )

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

    def _plan(self, removed_items: str | None) -> SamplePlan:
        """Cost and place every sample before any is built: lengths follow from per-user counts."""
        done = SamplePlan.load_if_done(self.work)
        if done is not None:
            return done
        users, counts = self._user_counts(removed_items)
        meta = planned_samples(users, counts, self.config.samples)  # canonical (user_id, window) order
        if len(meta["length"]) == 0:
            raise PrepareError("no samples left after filtering; check --min-len / --kcore and the sources")
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

    def _publish(
        self,
        manifest: dict[str, Any],
        offsets: np.ndarray,
        summary: scan.ScanSummary,
        users: dict[str, Any],
        vocabularies: dict[str, Vocabulary],
    ) -> None:
        """Write the offsets, quarantine and vocabulary files (``vocabularies``: by path), then the
        manifest with every file's hash, then (local output) swap the dataset in."""
        for name, vocab in vocabularies.items():
            storage.write_bytes(storage.join(self.target, name), vocab.to_bytes())
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(offsets, np.int64))
        storage.write_bytes(storage.join(self.target, OFFSETS_NAME), buffer.getvalue())
        examples = {**summary.examples}
        for reason, rows in users.get("examples", {}).items():
            examples.setdefault(f"users:{reason}", rows)
        storage.write_bytes(storage.join(self.target, QUARANTINE_NAME), quarantine_lines(examples).encode())
        manifest["files"] = published_files(self.target, list(vocabularies))  # every file above, sized and hashed
        storage.write_bytes(
            storage.join(self.target, MANIFEST_NAME),
            (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode(),
        )
        if not storage.is_remote(self.config.output):  # the finished directory becomes the output at once
            listed = {entry["path"] for entry in manifest["files"]} | {MANIFEST_NAME}
            for name in places.remove_unlisted(Path(self.target), listed):
                self._log(f"removed {name} from {self.target}: not part of the dataset")
            places.publish_local(Path(self.target), places.local_output(self.config.output))


def quarantine_lines(examples: dict[str, list[dict]]) -> str:
    return "".join(
        json.dumps(row, sort_keys=True, default=str) + "\n" for reason in sorted(examples) for row in examples[reason]
    )


def prepare(config: PrepareConfig, pool: ProcessPoolExecutor | None = None) -> dict[str, Any]:
    """Run ``freescale prepare`` with ``config`` (on ``pool``'s workers if given); returns the manifest."""
    return PrepareJob(config, pool).run()


__all__ = ["PrepareError", "PrepareJob", "prepare"]
