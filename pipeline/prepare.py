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

``PrepareJob`` is the driver (this module); its parts by role: the job's identity and places
(``prepare_identity``), the executor it runs the steps' calls on (``prepare_executor``), the phases
(``prepare_phases``) and the output's checks and publication (``prepare_output``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from freescale import storage
from freescale.datasets.sources import SourcesConfig
from freescale.pipeline import output as places
from freescale.pipeline.config import PrepareConfig
from freescale.pipeline.cost import CostModel
from freescale.pipeline.dataset.vocabulary import vocabulary_file
from freescale.pipeline.executors import Executor
from freescale.pipeline.manifest import build_manifest
from freescale.pipeline.output import NoSamplesError, OutputLock, PrepareError
from freescale.pipeline.prepare_executor import ExecutorCalls
from freescale.pipeline.prepare_identity import JobIdentity
from freescale.pipeline.prepare_output import OutputChecks
from freescale.pipeline.prepare_phases import Phases
from freescale.pipeline.steps import scan
from freescale.pipeline.steps.coverage import target_coverage
from freescale.pipeline.steps.sequences import planned_samples
from freescale.pipeline.steps.vocabularies import merge_partition_ids
from freescale.pipeline.workdir import RemoteWork, mirror_path

# Rows per scan task: each task writes a spill file per partition and a record, so fewer, larger tasks
# mean fewer files to create and for the samples phase to open (large: 30 tasks of 1M rows -> 14 of up
# to 4M, prepare ~0.5 s faster). A task's memory is bounded by its chunks, not by its size.
TARGET_ROWS_PER_TASK = 4_000_000


WORK_LAYOUT = 9  # bump when spill, bucket, plan or marker formats or the read-task plan change


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


class PrepareJob(JobIdentity, ExecutorCalls, Phases, OutputChecks):
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

    def run(self) -> dict[str, Any]:
        """Lock the output (and the work directory), then resume or start the job; a full disk ends
        it with one line naming where, leaving what is done for the next run. A job left without
        samples (``NoSamplesError``) removes its work directory: there is nothing to resume."""
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
        except NoSamplesError:
            self._remove_work()  # nothing to resume: the same job ends the same way
            raise
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
        plan_info = self._plan(removed_items, scan_summary, users_record)
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
        ``stats`` and ``simulate`` take on raw sources (sample lengths need no sample built). Sources
        that leave no sample fail with ``prepare``'s one line saying why."""
        if self.remote_work is not None:
            raise PrepareError("stats: an s3:// --work-dir is supported by prepare only; pass a local one")
        self._make_work_dirs()
        scan_summary, users_record = self._scan()
        removed_items = self._kcore()
        users, counts = self._user_counts(removed_items)
        if len(planned_samples(users, counts, self.config.samples)["length"]) == 0:
            raise PrepareError(self._no_samples(scan_summary.events_kept, len(users)))
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


def prepare(config: PrepareConfig, pool: ProcessPoolExecutor | None = None) -> dict[str, Any]:
    """Run ``freescale prepare`` with ``config`` (on ``pool``'s workers if given); returns the manifest."""
    return PrepareJob(config, pool).run()


__all__ = ["NoSamplesError", "PrepareError", "PrepareJob", "prepare"]
