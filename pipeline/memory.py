"""The memory-budget arithmetic of ``prepare`` and ``stats``, in one place.

Every bound a job keeps (``--memory-limit``, ``--plan-memory``) becomes a count here: partitions of the
scan, samples per write bucket, records per stats bucket, samples per planning window, a started Ray
runtime's object store. The per-item byte figures are measurements (where and how: beside each).

The floor, as users measure it (the process tree's RSS): each local task process costs
``LOCAL_PROCESS_BYTES`` (~170 MB between tasks, allocators released after each task) before its
data, so 256 MB holds one process with ~86 MB of task data; a scan task's Parquet read keeps ~75 MB
that does not shrink with its chunks. The job's processes run without transparent huge pages
(``processes.no_transparent_huge_pages``), without which the same job peaked 40-85 MB higher,
depending on the machine's setting. On the demo preset with 10,000 users (2.5M events) a 256 MB
job peaks at 175-188 MB, with one process; 512 MB and up keep a wide margin. Below 256 MB the
chunks and partitions stop shrinking (``MIN_TASK_BUDGET``, the ``MIN_READ_CHUNK_*`` floors) and the
job would overshoot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MIB = 2**20
# Bytes one event occupies while a partition is sorted and grouped (columns + sort copies).
BYTES_PER_EVENT_IN_MEMORY = 160
# Conservative on-disk bytes per event by format, to size partitions before reading anything.
ESTIMATED_BYTES_PER_EVENT = {"parquet": 6, "arrow": 20}
DEFAULT_BYTES_PER_EVENT = 20
# Bytes of an encoded event in a sample (item id 8, timestamp 8, action 4, source 1) plus slack for
# the per-sample header and scalars: what a bucket of samples occupies in the writer.
ENCODED_BYTES_PER_EVENT = 24
# The local executor's writer process. Measured 514 MB when it imported torch for MDSWriter; it writes
# with ``ShardWriter`` now (no torch), but the reservation is kept: it sizes the local executor's
# partitions and buckets, and the local figures in bench_prepare were measured with it.
WRITER_PROCESS_BYTES = 600 * MIB
# A stats id record while a bucket is sorted (key, count, sort copies).
BYTES_PER_RECORD_IN_MEMORY = 48
# The step-group planner's peak per sample (tracemalloc, lognormal costs, 50k-200k samples, both
# modes: 270-332 bytes), with margin.
PLAN_BYTES_PER_SAMPLE = 400
# Past this many samples a windowed prepare does not also plan the whole dataset to report what
# windowing cost: the comparison doubles the planning time, which grows with the samples.
COMPARE_MAX_SAMPLES = 2_000_000
MIN_TASK_BUDGET = 32 * MIB  # below this, per-task budgets stop shrinking (fixed costs dominate)
# A scan task's peak over its process's floor, per row of a chunk (columnar sources) and per byte of a
# text block (CSV, JSON Lines): the raw columns, the canonical events, the spill's sorted copy, the
# allocators' in-task retention. Measured one task per process after a first (demo preset, psutil RSS
# sampled every 5 ms, allocators released between tasks): Parquet 114-125 MB at 262,144-row chunks,
# 82-97 MB at 65,536 (~180 bytes a row over a ~75 MB part that does not shrink with the chunk: the
# file's pre-buffered column chunks, thread pools); JSON Lines 136-139 MB at 16 MB blocks, 49-50 MB at
# 4 MB; CSV 149 MB at 16 MB, 76 MB at 4 MB (~9 bytes a byte of text).
READ_BYTES_PER_ROW = 400
READ_BYTES_PER_TEXT_BYTE = 10
MAX_READ_CHUNK_ROWS = 262_144  # datasets.sources' defaults: larger chunks read no faster
MAX_READ_CHUNK_BYTES = 16 * MIB
MIN_READ_CHUNK_ROWS = 16_384
MIN_READ_CHUNK_BYTES = 1 * MIB
MIN_OBJECT_STORE_BYTES = 100 * MIB


# A local task process (this one, or a spawned pool worker) between tasks: the interpreter with numpy,
# polars, pyarrow and the step modules imported, plus what stays after its first tasks once its
# allocators released what they could (``processes.run_released``): arrow's thread pools and their
# allocator heaps, the compute kernels, caches. Measured with psutil: 106-107 MB RSS right after the
# imports (~56 MB of it shared library pages, which a process tree's RSS sum counts once per process,
# as the limit's users measure it), 150-177 MB between the scan tasks of the demo preset (anonymous
# 83-112 MB, file-backed 65 MB). 110 MB (the import-time figure) let a 256 MB job peak at 265 MB.
LOCAL_PROCESS_BYTES = 170 * MIB
LOCAL_TRACKER_BYTES = 12 * MIB  # multiprocessing's resource tracker, started with a spawn pool (12 MB RSS)


_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def parse_size(text: str | int, option: str) -> int:
    """Parse ``2GB``, ``512MiB``, ``1.5g`` or a byte count; errors name the option."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*?)(?:i?b)?\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"{option}: cannot parse size {text!r} (examples: 2GB, 512MB, 1073741824)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def preload_writer(memory_limit: int) -> bool:
    """Start the writer process with the job when reserving its memory leaves at least half of
    ``memory_limit`` to the workers."""
    return memory_limit - WRITER_PROCESS_BYTES >= memory_limit // 2


def worker_budget(memory_limit: int, writer_reserved: bool) -> int:
    """What the scan/sample workers may hold together: the limit less the writer's reservation."""
    return memory_limit - (WRITER_PROCESS_BYTES if writer_reserved else 0)


@dataclass(frozen=True)
class LocalSizing:
    """The local executor's task processes (this one and ``processes - 1`` spawned workers), what their
    tasks' data may hold together, and, when fewer than ``--workers`` fit, the one line that says so."""

    processes: int
    task_budget: int
    note: str | None


def local_sizing(memory_limit: int, workers: int, writer_reserved: bool) -> LocalSizing:
    """As many of ``workers`` task processes as the limit holds beside the writer's reservation, each
    counted with its interpreter (``LOCAL_PROCESS_BYTES``) and at least ``2 * MIN_TASK_BUDGET`` of
    task data (partitions are sized to half of a process's share, no smaller than ``MIN_TASK_BUDGET``).
    One process always fits: ``--memory-limit`` is at least 256 MB, and the writer is reserved only
    where half the limit stays for the workers."""
    available = worker_budget(memory_limit, writer_reserved)
    per_process = LOCAL_PROCESS_BYTES + 2 * MIN_TASK_BUDGET
    more = max(available - per_process - LOCAL_TRACKER_BYTES, 0) // per_process
    processes = max(1, min(workers, 1 + int(more)))
    fixed = processes * LOCAL_PROCESS_BYTES + (LOCAL_TRACKER_BYTES if processes > 1 else 0)
    note = None
    if processes < workers:
        note = (
            f"local executor: --memory-limit {memory_limit / MIB:,.0f} MB holds {processes} of the {workers} --workers "
            f"(each process ~{LOCAL_PROCESS_BYTES / MIB:,.0f} MB before its data, plus at least "
            f"{2 * MIN_TASK_BUDGET / MIB:,.0f} MB for it); running {processes}"
        )
    return LocalSizing(processes, max(available - fixed, MIN_TASK_BUDGET), note)


# mimalloc (pyarrow's pool) keeps freed memory this long before returning it (``processes``'
# ALLOCATOR_SETTINGS): faster chunk after chunk, but within a task it held up to ~50 MB more per
# process (a Parquet task of the demo preset peaked 51 MB higher at 1 s than at 0: 211 vs 160 MB
# anonymous). Kept only where that is at most a quarter of a process's share of the limit.
PURGE_DELAY_RETENTION = 50 * MIB


def allocator_purge_delay_ms(memory_limit: int, workers: int, writer_reserved: bool) -> int:
    """``MIMALLOC_PURGE_DELAY`` of the local executor's task processes: 1 s where a process's share of
    ``memory_limit`` (``local_sizing``) holds the retention four times over, else 0 (purge at once)."""
    sizing = local_sizing(memory_limit, workers, writer_reserved)
    return 1000 if sizing.task_budget // sizing.processes >= 4 * PURGE_DELAY_RETENTION else 0


def estimate_events(formats: dict[str, str], files: list[dict[str, Any]]) -> int:
    """Rough event count from file sizes (``formats``: source name -> format), before reading anything."""
    return sum(
        entry["size"] // ESTIMATED_BYTES_PER_EVENT.get(formats[entry["source"]], DEFAULT_BYTES_PER_EVENT)
        for entry in files
        if entry["source"] in formats
    )


def choose_partition_count(estimated_events: int, budget: int, workers: int) -> int:
    """Enough partitions that ``workers`` partitions held at once fit in half of ``budget``."""
    per_worker_budget = max(budget // (2 * workers), MIN_TASK_BUDGET)
    events_per_partition = max(per_worker_budget // BYTES_PER_EVENT_IN_MEMORY, 1)
    return max(workers * 2, -(-estimated_events // events_per_partition))


def read_chunk_sizes(task_budget: int) -> tuple[int, int]:
    """Rows and text bytes of a scan task's chunks, so that one task's data fits ``task_budget`` (what
    one process's task may hold: ``JobBudget.per_task``), within the defaults and a floor."""
    rows = min(MAX_READ_CHUNK_ROWS, max(MIN_READ_CHUNK_ROWS, task_budget // READ_BYTES_PER_ROW))
    text = min(MAX_READ_CHUNK_BYTES, max(MIN_READ_CHUNK_BYTES, task_budget // READ_BYTES_PER_TEXT_BYTE))
    return int(rows), int(text)


def local_writer_budget(memory_limit: int) -> int:
    """What the local executor's one writer may hold: what its process's reservation leaves."""
    return max(memory_limit - WRITER_PROCESS_BYTES, memory_limit // 8)


def write_bucket_size(n_samples: int, total_events: int, writer_budget: int, part_size: int) -> int:
    """Samples per write bucket: a part's worth (a part then reads one bucket's files and frees them),
    fewer when that many encoded samples (memory-mapped by a writer while it writes the part, beside
    a shard's copy) would not fit ``writer_budget``, what one writer may hold (the local executor's
    writer: ``local_writer_budget``; each of the Ray executor's concurrent write tasks: its share of
    ``RaySizing.task_budget``)."""
    budget_events = max(writer_budget // (2 * ENCODED_BYTES_PER_EVENT), 1)
    return max(1, min(part_size, int(n_samples * budget_events // max(total_events, 1))))


def stats_bucket_count(records: int, memory_limit: int, workers: int = 1) -> int:
    """Buckets of the stats id pass, so that ``workers`` buckets' records sort at once (each worker
    counts one table of a bucket) within half the limit: a multiple of ``workers``, so the item
    table (most of the records) keeps every worker busy (large: 3 item buckets on 2 workers took
    two rounds, 4 take two half-size ones)."""
    budget = max(memory_limit // (2 * workers), MIN_TASK_BUDGET)
    buckets = max(1, -(-records * BYTES_PER_RECORD_IN_MEMORY // budget))
    return -(-buckets // workers) * workers


def window_samples(n_samples: int, unit: int, plan_memory: int) -> int:
    """Samples per planning window: all when their plan fits ``plan_memory``, else the most whole
    step groups (``unit`` = G·k samples) that fit, at least one."""
    if n_samples * PLAN_BYTES_PER_SAMPLE <= plan_memory:
        return n_samples
    return max(plan_memory // PLAN_BYTES_PER_SAMPLE // unit, 1) * unit


def whole_plan_comparable(n_samples: int, memory_limit: int) -> str | None:
    """``None`` when a windowed job may also plan all ``n_samples`` at once to measure what windowing
    cost (the whole plan within half of ``--memory-limit`` and at most ``COMPARE_MAX_SAMPLES``), else
    the reason it may not, in one line."""
    need = n_samples * PLAN_BYTES_PER_SAMPLE
    if need > memory_limit // 2:
        return f"a whole plan of {n_samples:,} samples needs ~{need / MIB:,.0f} MB, over half of --memory-limit"
    if n_samples > COMPARE_MAX_SAMPLES:
        return f"{n_samples:,} samples: over {COMPARE_MAX_SAMPLES:,}, planning them twice would cost too long"
    return None


# A Ray runtime started on this host for a job (bench_prepare on large at --memory-limit 2GB, peak
# RSS by process role, shards written without torch): its system processes (GCS, raylet, monitor,
# log monitor, dashboard and runtime-env agents: ~500 MB together), the driver (320-390 MB: ray,
# polars, pyarrow, the plan, the first scan calls it runs while the runtime starts) and, per task
# worker, the interpreter with ray, polars and pyarrow before any task data (~100 MB; the rest of
# a worker's peak is its tasks' data, which the partition and bucket sizing bound).
RAY_SYSTEM_BYTES = 520 * MIB
RAY_DRIVER_BYTES = 400 * MIB
RAY_WORKER_BYTES = 120 * MIB
# The least task data a worker is worth starting for: a partition of a few hundred thousand events
# or a write bucket beside its 64 MB shard buffer.
RAY_MIN_TASK_BYTES = 256 * MIB


@dataclass(frozen=True)
class RaySizing:
    """CPUs (concurrent task workers) and object store of a Ray runtime started for a job, what
    their tasks' data may hold together (``task_budget``: sizes partitions and write buckets), and,
    when ``--memory-limit`` cannot hold even one worker, the one line that says so."""

    cpus: int
    object_store_bytes: int
    task_budget: int
    warning: str | None


def ray_sizing(memory_limit: int, workers: int) -> RaySizing:
    """As many of ``workers`` task workers as fit what the limit leaves after the runtime's fixed
    processes and object store, each with at least ``RAY_MIN_TASK_BYTES`` of task data. When not even
    one fits, fewer workers would not keep the limit either: all ``workers`` run, and the warning
    gives the peak to expect."""
    store = ray_object_store_bytes(memory_limit)
    fixed = RAY_SYSTEM_BYTES + RAY_DRIVER_BYTES + store
    fits = (memory_limit - fixed) // (RAY_WORKER_BYTES + RAY_MIN_TASK_BYTES)
    if fits >= 1:
        cpus = min(workers, int(fits))
        return RaySizing(cpus, store, memory_limit - fixed - cpus * RAY_WORKER_BYTES, None)
    per_worker = RAY_WORKER_BYTES + RAY_MIN_TASK_BYTES
    peak = fixed + workers * per_worker
    return RaySizing(
        workers,
        store,
        workers * RAY_MIN_TASK_BYTES,
        f"ray executor: --memory-limit {memory_limit / MIB:,.0f} MB cannot hold Ray's runtime, driver and object "
        f"store (~{fixed / MIB:,.0f} MB) plus one task worker (~{per_worker / MIB:,.0f} MB with its least "
        f"task data); running {workers} workers, peak up to ~{peak / MIB:,.0f} MB",
    )


def ray_object_store_bytes(memory_limit: int) -> int:
    """Object store of a Ray runtime started for a job: a sixteenth of its limit, at least 100 MB.
    Tasks pass paths, configs and the plan's per-partition arrays (28 bytes a sample), and get
    records back; the store's shared memory is resident only as far as objects fill it, and Ray
    spills to disk past it."""
    return max(memory_limit // 16, MIN_OBJECT_STORE_BYTES)


@dataclass(frozen=True)
class JobBudget:
    """What a job's tasks may hold: ``tasks`` bytes for ``concurrent`` partitions at once (sizes the
    scan's partitions), and ``writer`` bytes for each concurrent write (sizes the write buckets)."""

    tasks: int
    concurrent: int
    writer: int

    @property
    def per_task(self) -> int:
        """What one of the concurrent tasks may hold."""
        return max(self.tasks // self.concurrent, MIN_TASK_BUDGET)


def job_budget(
    executor: str, memory_limit: int, workers: int, joined_cluster: bool, writer_reserved: bool
) -> JobBudget:
    """The local executor: ``local_sizing``'s task budget (the limit less the writer process's reservation
    and its task processes' interpreters) for the processes that fit, one writer. A Ray runtime
    started for the job: ``ray_sizing``'s task budget, shared by its CPUs, which all write at once.
    A joined Ray cluster: its processes are its own, so the limit bounds the job's data only."""
    if executor != "ray":
        sizing = local_sizing(memory_limit, workers, writer_reserved)
        return JobBudget(sizing.task_budget, sizing.processes, local_writer_budget(memory_limit))
    if joined_cluster:
        return JobBudget(memory_limit, workers, memory_limit // (2 * workers))
    sizing = ray_sizing(memory_limit, workers)
    return JobBudget(sizing.task_budget, sizing.cpus, sizing.task_budget // sizing.cpus)
