"""The balanced streaming loader: rank ``r`` of ``W`` gets its micro-batch of every step, for any model.

A prepared dataset (``freescale prepare``, local or ``s3://``) is a sequence of step groups of ``G``
cost-balanced micro-batches; ``PreparedDataset.micro_batch_index`` says which one rank ``r`` of ``W``
reads at step ``s`` (``pipeline/dataset/reader.py``; epochs after the first permute whole groups by seed).
This module turns that schedule into a torchdata ``StatefulDataLoader``:

- the sampler is the step range ``[start_step, end)``; the dataset is map-style, step -> this rank's
  micro-batch, so worker processes read and collate ahead while the model computes, and
  ``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly (torchdata counts the steps the
  caller consumed, not the ones workers prefetched) — across epochs too, since the epoch is part of
  the step number;
- ``output`` picks what a step yields: ``samples`` (``Samples``: the prepared rows, numpy), ``kjt``
  (``kjt.KJTBatch``: a TorchRec ``KeyedJaggedTensor`` of keys ``item``, ``action``, ``timestamp`` plus
  lengths and next-item targets) or ``batch`` (the FreeScale trainer's ``Batch``). ``collate_fn``
  turns a step's samples into the batch (``samples.CollateFn``); by default ``kjt.kjt_batch`` for
  ``kjt`` and, for ``batch``, the trainer's collation, named (``TRAINER_COLLATE``) and imported only
  when that output is asked for: this module never imports the trainer. Ids become table rows through
  the dataset's exact vocabularies (``samples.sequence_arrays``): one mapping, whoever reads.

Workers receive the ``PreparedDataset`` by fork or pickle; its shard readers and checked-shard set
are per process (``PreparedDataset.__getstate__``), so each worker opens, checks and, for ``s3://``,
downloads the shards it reads itself (atomically, into the shared private cache).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import importlib
import math
import os
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from freescale import storage
from freescale.optional import torchrec_unavailable
from freescale.pipeline.dataset.kjt import KJTBatch, keyed_jagged, kjt_batch, register_pipelineable
from freescale.pipeline.dataset.manifest import ManifestError
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import CollateConfig, CollateFn, default_collate

OUTPUTS = ("samples", "batch", "kjt")
TRAINER_COLLATE = ("freescale.trainer.data.batches", "collate")  # output "batch": the FreeScale trainer's collation


@dataclass
class Config:
    """What to read and how. ``num_steps = 0`` reads ``epochs`` passes from step 0 (or from
    ``start_step`` to that end); ``collate = None`` (``batch``/``kjt``) maps ids through the dataset's
    exact vocabularies and holds out each user's validation and test items (``default_collate``);
    ``collate_fn = None`` collates as the output says (``output_collate``)."""

    path: str
    world_size: int = 1
    rank: int = 0
    output: str = "kjt"
    start_step: int = 0
    num_steps: int = 0
    epochs: float = 1.0
    seed: int = 0  # order of the step groups in epochs after the first
    num_workers: int = 2  # worker processes reading ahead (0: read in the calling process)
    prefetch_factor: int = 2  # micro-batches each worker reads ahead
    cache_dir: str | None = None  # s3:// shard cache (default: private per-user temp directory)
    verify: bool = True  # hash each shard against the manifest when first read
    collate: CollateConfig | None = None
    collate_fn: CollateFn | None = None  # (samples, collate config, step, rank) -> what a step yields
    # batch/kjt with the default collation: add every user-profile feature of the dataset, one exact row
    # per sample (KJT keys / ``Batch.profile_tables`` ``user.<feature>``)
    user_features: bool = False

    def __post_init__(self) -> None:
        checks = (
            ("path", bool(self.path), "must name a prepared dataset (directory or s3:// prefix)"),
            ("output", self.output in OUTPUTS, f"must be one of {', '.join(OUTPUTS)}"),
            ("world_size", self.world_size >= 1, "must be >= 1"),
            ("rank", 0 <= self.rank < max(1, self.world_size), f"must be in [0, world_size = {self.world_size})"),
            ("start_step", self.start_step >= 0, "must be >= 0"),
            ("num_steps", self.num_steps >= 0, "must be >= 0 (0: epochs)"),
            ("epochs", self.epochs > 0, "must be > 0"),
            ("num_workers", self.num_workers >= 0, "must be >= 0"),
            ("prefetch_factor", self.prefetch_factor >= 1, "must be >= 1"),
        )
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"loader option '{name}' {rule}, got {getattr(self, name)!r}")
        if self.output == "kjt" and (reason := torchrec_unavailable("loader option 'output' 'kjt'")):
            raise ValueError(f"{reason}; or read output='batch' or 'samples', which need neither")


def total_steps(dataset: PreparedDataset, world_size: int, epochs: float, max_steps: int = 0) -> int:
    """Steps of a run: ``max_steps`` when set, else ``epochs`` passes (at least one step); the
    trainer and the loader stop at the same step by both using this."""
    if max_steps:
        return max_steps
    return max(1, math.ceil(epochs * dataset.steps_per_epoch(world_size)))


def output_collate(config: Config) -> CollateFn | None:
    """The function that makes a step's batch: ``config.collate_fn``, else the output's own
    (``kjt``: ``kjt_batch``; ``batch``: the trainer's ``collate``, imported by name; ``samples``: None,
    the rows as prepared)."""
    if config.output == "samples":
        return None
    if config.collate_fn is not None:
        return config.collate_fn
    if config.output == "kjt":
        return kjt_batch
    module, name = TRAINER_COLLATE
    return getattr(importlib.import_module(module), name)


@dataclass
class Samples:
    """``output = "samples"``: one step's micro-batch as prepared (dicts of numpy arrays, raw ids)."""

    step: int
    micro_batch: int
    samples: list[dict[str, Any]]


@dataclass
class _Failure:
    """A worker's read that failed on the dataset (``ManifestError``: damaged, replaced under the
    reader). Sent as a value and raised again by ``Loader`` as the same one-line error: torch would
    re-raise it with the worker's traceback folded into its message."""

    error: ManifestError


@dataclass
class _Array:
    """A tensor on its way from a worker: as a numpy array, pickled by value through the pipe."""

    array: np.ndarray


@dataclass
class _KJT:
    keys: list[str]
    values: _Array
    lengths: _Array


def to_wire(obj: Any) -> Any:
    """``obj`` with every tensor as a numpy array (``_Array``), KJTs as ``_KJT``, through dataclasses
    and lists. Why: DataLoader workers send tensors through one shared-memory segment each, which
    costs ~0.1 ms per tensor on each side, and a trainer ``Batch`` holds ~50 small tensors (measured:
    receiving one cost as much as collating it); arrays pickled by value cost microseconds."""
    if isinstance(obj, torch.Tensor):
        return _Array(obj.numpy())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        wired = copy.copy(obj)
        for f in dataclasses.fields(obj):
            setattr(wired, f.name, to_wire(getattr(obj, f.name)))
        return wired
    if isinstance(obj, list):
        return [to_wire(item) for item in obj]
    if type(obj).__name__ == "KeyedJaggedTensor":
        return _KJT(obj.keys(), to_wire(obj.values()), to_wire(obj.lengths()))
    return obj


def from_wire(obj: Any) -> Any:
    """The inverse of ``to_wire`` (``torch.from_numpy``: no copy)."""
    if isinstance(obj, _Array):
        return torch.from_numpy(obj.array)
    if isinstance(obj, _KJT):
        return keyed_jagged(obj.keys, from_wire(obj.values), from_wire(obj.lengths))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            setattr(obj, f.name, from_wire(getattr(obj, f.name)))
        return obj
    if isinstance(obj, list):
        return [from_wire(item) for item in obj]
    return obj


class StepReads(Dataset):
    """Map-style: step -> this rank's micro-batch of that step, in the configured output form
    (``to_wire`` form when read by a worker process)."""

    def __init__(
        self, dataset: PreparedDataset, config: Config, collate_cfg: CollateConfig | None, collate_fn: CollateFn | None
    ) -> None:
        self.dataset, self.config, self.collate_cfg, self.collate_fn = dataset, config, collate_cfg, collate_fn

    def __getitem__(self, step: int) -> Samples | KJTBatch | Any:
        if not self.config.num_workers:
            return self.read(step)
        try:
            return to_wire(self.read(step))
        except ManifestError as error:  # a damaged or replaced dataset: the caller raises it as itself
            return _Failure(error)

    def read(self, step: int) -> Samples | KJTBatch | Any:
        c = self.config
        index = self.dataset.micro_batch_index(step, c.rank, c.world_size, c.seed)
        samples = self.dataset.micro_batch(index)
        if self.collate_fn is None:
            return Samples(step, index, samples)
        return self.collate_fn(samples, self.collate_cfg, step, c.rank)


class ShardPrefetch:
    """Downloads an ``s3://`` dataset's shards in the order this rank's steps first need them, on a
    daemon thread of the calling process, so workers rarely wait for a download (streaming's own
    reader downloads ahead the same way). A worker needing a shard being fetched waits on its lock
    (``PreparedDataset.fetch_shard``); an error here is left for that worker's read to raise, with
    its file name."""

    def __init__(self, dataset: PreparedDataset, config: Config, start: int, end: int) -> None:
        self.dataset, self.config, self.start, self.end = dataset, config, start, end
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="freescale-shard-prefetch", daemon=True)
        self.thread.start()

    def order(self) -> Iterator[int]:
        """Shards by first use over at most one epoch of steps (later epochs reread cached shards)."""
        c, seen = self.config, set()
        horizon = min(self.end, self.start + self.dataset.steps_per_epoch(c.world_size))
        for step in range(self.start, horizon):
            if len(seen) == len(self.dataset.shards):
                return
            for shard in self.dataset.shards_of(self.dataset.micro_batch_index(step, c.rank, c.world_size, c.seed)):
                if shard not in seen:
                    seen.add(shard)
                    yield shard

    def _run(self) -> None:
        try:
            for shard in self.order():
                if self.stop.is_set():
                    return
                self.dataset.fetch_shard(shard)
        except Exception:
            return


WORKER_NICE = 19


def _init_worker(worker_id: int) -> None:
    """Worker processes run at nice 19: on a host with spare cores this changes nothing, and where a
    worker shares its rank's core (``engine.pin_cpus``, one core per rank) it reads in the rank's idle
    moments (collective waits) instead of taking scheduler slices from its compute, which other ranks
    would wait for. When the rank does wait for a batch, the worker is the only one runnable. The
    garbage collector is on again: a forked worker inherits the trainer's ``gc.disable()``, which
    suits the timed loop, not a process that never flushes."""
    os.nice(WORKER_NICE - os.nice(0))
    gc.enable()
    parent = os.getppid()
    threading.Thread(target=_exit_with_parent, args=(parent,), name="freescale-parent-watch", daemon=True).start()


PARENT_CHECK_S = 1.0


def _exit_with_parent(parent: int) -> None:
    """End this worker once the process it reads for is gone (it is then re-parented).

    Why not torch's own check: a worker tests its parent only between index reads, and one whose
    result pipe is full (``prefetch_factor`` batches nobody will read, after the rank was killed)
    stays blocked in its queue's feeder thread at exit. It would live on holding the job's stdout
    and stderr, and a launcher or log reader waiting for those would wait forever."""
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            os._exit(1)


def _as_is(item: Any) -> Any:
    """The collate function: a step is already one batch (no numpy -> tensor conversion of samples)."""
    return item


def _torchdata_next_step(state: dict[str, Any], start_step: int) -> int:
    """The next step of a state saved before states recorded it (torchdata's own state under
    ``loader``): the steps it had yielded, counted by one process or by the worker snapshots."""
    inner = state.get("loader")
    if isinstance(inner, dict) and isinstance(inner.get("_num_yielded"), int):
        return start_step + inner["_num_yielded"]
    snapshot = inner.get("_snapshot") if isinstance(inner, dict) else None
    if isinstance(snapshot, dict) and isinstance(snapshot.get("_snapshot_step"), int):
        return start_step + snapshot["_snapshot_step"] + int(inner.get("_steps_since_snapshot", 0))
    raise ValueError("loader state has no next_step (not a state of this loader's state_dict())")


class Loader:
    """Rank ``config.rank``'s micro-batches of steps ``[start_step, end)``, read ahead by worker processes.

    ``dataset``: an already opened ``PreparedDataset`` of ``config.path`` (the trainer passes its own);
    else it is opened here. ``state_dict()`` after consuming ``k`` steps, loaded into a fresh loader of
    the same config, yields exactly the steps an uninterrupted loader would have yielded next, whatever
    its ``num_workers``: a step's batch is a function of the step alone (workers hold no state), so the
    state is the next step, and resuming rebuilds the step range from it."""

    def __init__(self, config: Config, dataset: PreparedDataset | None = None) -> None:
        self.config = config
        self.dataset = dataset or PreparedDataset(config.path, cache_dir=config.cache_dir, verify=config.verify)
        self.dataset.check_world_size(config.world_size)
        self.end = config.start_step + (
            config.num_steps or total_steps(self.dataset, config.world_size, config.epochs) - config.start_step
        )
        collate_cfg = None
        if config.output != "samples":
            collate_cfg = config.collate or default_collate(self.dataset, config.user_features)
        if config.output == "kjt":
            register_pipelineable()
        self._reads = StepReads(self.dataset, config, collate_cfg, output_collate(config))
        self._iterator: Any = None
        self._prefetch: ShardPrefetch | None = None
        self._resume(config.start_step)

    def _resume(self, first: int) -> None:
        """Read steps ``[first, end)`` from the next ``iter()`` on (a fresh torchdata loader)."""
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.close()
        self._prefetch = None  # the next pass downloads ahead from its own first step
        self._first, self._consumed = first, 0
        workers = self.config.num_workers
        with warnings.catch_warnings():  # torchdata 0.11 calls torch's deprecated set_vital in __init__
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            self._loader = StatefulDataLoader(
                self._reads,
                batch_size=None,
                sampler=range(first, max(first, self.end)),
                collate_fn=_as_is,
                num_workers=workers,
                prefetch_factor=self.config.prefetch_factor if workers else None,
                worker_init_fn=_init_worker if workers else None,
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset.steps_per_epoch(self.config.world_size)

    def __len__(self) -> int:
        return max(0, self.end - self.config.start_step)

    def __iter__(self) -> Iterator[Any]:
        self._consumed = 0  # a new pass over [first, end)
        self._iterator = iter(self._loader)  # workers fork first: never while the prefetch thread is in S3 calls
        if storage.is_remote(self.dataset.uri) and self._prefetch is None:
            self._prefetch = ShardPrefetch(self.dataset, self.config, self._first, self.end)
        return self._batches(self._iterator)

    def _batches(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for item in iterator:
            if isinstance(item, _Failure):
                raise item.error
            self._consumed += 1  # handed to the caller: prefetched batches are not counted
            yield from_wire(item) if self.config.num_workers else item

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: its placement and the next step it would yield (``num_workers`` is
        recorded for information: a state loads into a loader with any number of workers)."""
        c = self.config
        placement = {"world_size": c.world_size, "rank": c.rank, "seed": c.seed, "start_step": c.start_step}
        return {**placement, "next_step": self._first + self._consumed, "num_workers": c.num_workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` was taken, with this loader's workers; the placement must match
        (another world size, rank or seed would read other micro-batches)."""
        c = self.config
        for name in ("world_size", "rank", "seed", "start_step"):
            mine = getattr(c, name)
            if state.get(name) != mine:
                raise ValueError(f"loader state was taken with {name} {state.get(name)!r}, this loader has {mine}")
        next_step = state["next_step"] if "next_step" in state else _torchdata_next_step(state, c.start_step)
        if isinstance(next_step, bool) or not isinstance(next_step, int) or not c.start_step <= next_step <= self.end:
            raise ValueError(
                f"loader state's next step {next_step!r} is outside this loader's steps [{c.start_step}, {self.end}]"
            )
        self._resume(next_step)

    def close(self) -> None:
        """Stop the worker processes of the current pass (they also stop when it is exhausted)."""
        shutdown = getattr(self._iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._iterator = None
        if self._prefetch is not None:
            self._prefetch.stop.set()
