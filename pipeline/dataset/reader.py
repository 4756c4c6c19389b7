"""Reader API for prepared datasets: which micro-batch rank ``r`` of ``W`` reads at step ``s``.

A prepared dataset is a sequence of step groups of ``G`` cost-balanced micro-batches. A run with
``W`` ranks (``W`` divides ``G``) spends ``G / W`` steps on a group and at each step rank ``r`` reads
micro-batch ``group·G + (s mod G/W)·W + r``. Any ``W`` dividing ``G`` therefore stays balanced, the
schedule is a pure function of the step counter (deterministic, resumable), and each rank reads only
its own rows — the loader, not mosaicml-streaming's shuffle, decides placement (docs/design.md#pitfalls).

Epochs: epoch 0 reads the groups in plan order; epoch ``e > 0`` reads them in the order of a
permutation drawn from ``(seed, e)`` (``group_order``). Whole groups move, never micro-batches
within a group, so every step still reads ``W`` micro-batches of one balanced group.

Rows are read by index with mosaicml-streaming's MDS shard reader; a shard of an ``s3://`` dataset
is first downloaded whole into a local cache. ``StreamingDataset`` (``rows``) is not on this path:
its shared-memory registration is collective under torch.distributed and refuses a cache directory
already registered by another process, which DataLoader worker processes would be.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import os
import stat
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from freescale import storage
from freescale.pipeline.dataset.manifest import INDEX_NAME, ManifestError, load_manifest
from freescale.pipeline.dataset.mds_rows import row_decoder
from freescale.pipeline.dataset.shard_files import DatasetIdentity, ShardFiles, read_at
from freescale.pipeline.dataset.vocabulary import Vocabulary
from freescale.pipeline.integrity import (
    IntegrityError,
    check_bytes,
    check_index,
    check_listing,
    files_by_path,
    safe_relative_path,
)
from freescale.pipeline.streaming_modules import import_streaming_module, streaming_dataset_class


class CacheDirError(ValueError):
    """The shard cache directory is not private to this user (another user could plant shards)."""


def private_dir(path: Path) -> Path:
    """``path`` as a directory only this user can write: created 0o700, or an existing one that is
    a real directory (not a symlink), owned by this user and not group/other-writable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise CacheDirError(
            f"cache directory {path} is not a directory (a symlink or file); remove it or pass cache_dir"
        )
    if info.st_uid != os.getuid():
        raise CacheDirError(f"cache directory {path} is owned by uid {info.st_uid}, not by you; pass another cache_dir")
    if info.st_mode & 0o022:
        raise CacheDirError(
            f"cache directory {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            "run chmod 700 on it or pass another cache_dir"
        )
    return path


def default_cache_dir(dataset: str) -> str:
    """``<tmp>/freescale-cache-<uid>/<digest of the URI>``: per user and private, because the
    cached shards are what the trainer reads (a shared /tmp path would let another user plant them)."""
    digest = hashlib.sha256(dataset.encode()).hexdigest()[:16]
    base = private_dir(Path(tempfile.gettempdir()) / f"freescale-cache-{os.getuid()}")
    return str(private_dir(base / digest))


def load_offsets(data: bytes, where: str, n_rows: int) -> np.ndarray:
    """``micro_batch_offsets.npy``: int64, starts at 0, never decreases, ends at the index's rows."""
    try:
        offsets = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise IntegrityError(f"{where}: not a readable .npy file ({error})") from error
    if offsets.ndim != 1 or offsets.dtype != np.int64 or len(offsets) < 1 or offsets[0] != 0:
        raise IntegrityError(f"{where}: not a 1-D int64 array starting at 0")
    if np.any(np.diff(offsets) < 0) or int(offsets[-1]) != n_rows:
        raise IntegrityError(f"{where}: offsets decrease or do not end at the index's {n_rows} rows")
    return offsets


class PreparedDataset:
    """A finished ``freescale prepare`` output (local directory or ``s3://`` prefix).

    Opening it checks the dataset against the manifest's ``files`` table (``integrity``): every file
    present with its size, the index and offsets hashed, shard names inside the dataset. A shard's
    header is checked when it is first read, and with ``verify`` (the default) its hash too; the file
    is then held open, and a dataset prepared again under this reader is an error, not another
    dataset's rows read under this one's plan (``shard_files``)."""

    def __init__(self, uri: str, cache_dir: str | None = None, verify: bool = True) -> None:
        self.uri = uri
        self.verify = verify
        self._identity = DatasetIdentity.of(uri)  # first: what is read next must belong to it
        self.info = load_manifest(uri)  # the typed manifest: shape and types checked, errors name the field
        self.group_size: int = self.info.layout.group_size
        self.files = files_by_path(self.info)
        if self.files is None:
            warnings.warn(
                f"{uri}: the manifest has no file table (prepared by an older FreeScale), so damaged "
                "files cannot be detected; re-run `freescale prepare --overwrite` to add it",
                stacklevel=2,
            )
        else:
            check_listing(uri, self.files)
        self._index_bytes = self._read_checked(INDEX_NAME)
        self.shards = check_index(self._index_bytes, storage.join(uri, INDEX_NAME))
        self._check_shards_listed()
        self._shard_ends = np.cumsum([int(shard["samples"]) for shard in self.shards], dtype=np.int64)
        offsets_name = safe_relative_path(self.info.layout.offsets_file, f"{uri}: layout.offsets_file")
        n_rows = int(self._shard_ends[-1]) if len(self.shards) else 0
        self.offsets = load_offsets(self._read_checked(offsets_name), storage.join(uri, offsets_name), n_rows)
        self.n_micro_batches = len(self.offsets) - 1
        self.info.check_plan(self.n_micro_batches)
        self.n_step_groups = self.n_micro_batches // self.group_size
        self._identity.check()  # manifest, index and offsets are of one dataset
        self.cache_dir = cache_dir or (default_cache_dir(uri) if storage.is_remote(uri) else None)
        self._files = ShardFiles(self._identity, self.shards, self.files, verify, self.cache_dir)
        self._readers: dict[int, Any] = {}
        self._orders: dict[tuple[int, int], np.ndarray] = {}
        self._rows: Any = None
        if storage.is_remote(uri):  # before any process (loader workers too) fetches a shard
            self._refresh_cache_index()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for DataLoader worker processes: manifest, index and offsets travel (already
        checked), and the dataset's identity with them; shard readers, open (checked) shard files and
        the ``StreamingDataset`` are per process."""
        return {**self.__dict__, "_readers": {}, "_rows": None}

    def _read_checked(self, name: str) -> bytes:
        uri = storage.join(self.uri, name)
        if not storage.exists(uri):
            raise IntegrityError(f"{uri}: missing; re-run `freescale prepare --overwrite`")
        data = storage.read_bytes(uri)
        self._identity.check()  # read from the dataset this reader opened, not one prepared since
        check_bytes(uri, data, None if self.files is None else self.files.get(name))
        return data

    def table_sizes(self) -> dict[str, int]:
        """Rows of each exact id table (``{}`` for a dataset prepared before vocabularies existed)."""
        return self.info.table_sizes()

    def vocabulary(self, table: str) -> Vocabulary | None:
        """A table's exact vocabulary (``vocab/<table>.npy``, hash-checked), or None for a dataset
        prepared before vocabularies existed."""
        entry = self.info.tables.get(table)
        if entry is None:
            return None
        name = safe_relative_path(entry.file, f"{self.uri}: tables.{table}.file")
        vocab = Vocabulary.from_bytes(table, self._read_checked(name), storage.join(self.uri, name))
        if vocab.size != entry.size:
            where = storage.join(self.uri, name)
            raise ManifestError(f"{where}: {vocab.size} ids != tables.{table}.size {entry.size} in the manifest")
        return vocab

    def _check_shards_listed(self) -> None:
        if self.files is None:
            return
        for shard in self.shards:
            name = shard["raw_data"]["basename"]
            if name not in self.files:
                raise IntegrityError(f"{storage.join(self.uri, INDEX_NAME)}: shard {name} is not in the manifest")

    @property
    def rows(self) -> Any:
        """The MDS rows (``StreamingDataset``), opened lazily: the import is heavy.

        Under torch.distributed, opening it is collective (streaming synchronises the ranks), so every
        rank must open it at the same point, not lazily in a prefetch thread. ``size`` is the
        dataset's total row count (``len()`` would be this rank's share of streaming's own split).
        For ``s3://`` the index streaming reads is the one checked here, written into the cache."""
        if self._rows is None:
            StreamingDataset = streaming_dataset_class()

            remote = self.uri if storage.is_remote(self.uri) else None
            local = self.cache_dir if remote else self.uri
            self._rows = StreamingDataset(
                remote=remote, local=local, shuffle=False, batch_size=1, allow_unsafe_types=False
            )
            if self._rows.size != int(self.offsets[-1]):
                raise ManifestError(
                    f"{self.uri}: {self._rows.size} rows in the shards but the plan covers {int(self.offsets[-1])}"
                )
        return self._rows

    def _refresh_cache_index(self) -> None:
        """Put the checked index into the cache; when it differs from a cached one (the dataset was
        prepared again), cached shards of the same names are stale: remove them first."""
        cache = private_dir(Path(self.cache_dir))
        cached = cache / INDEX_NAME
        if cached.exists() and cached.read_bytes() == self._index_bytes:
            return
        for shard in self.shards:
            (cache / shard["raw_data"]["basename"]).unlink(missing_ok=True)
        tmp = cache / f"{INDEX_NAME}.tmp-{os.getpid()}"
        tmp.write_bytes(self._index_bytes)
        os.replace(tmp, cached)

    def _shard_of(self, row: int) -> int:
        return int(np.searchsorted(self._shard_ends, row, side="right"))

    def fetch_shard(self, shard_id: int) -> str:
        """The local path of a shard, downloaded first for ``s3://`` (``ShardFiles.fetch``; not yet
        checked: reading checks)."""
        return self._files.fetch(shard_id)

    def _shard(self, shard_id: int) -> tuple[int, Any]:
        """The open descriptor of a shard and its MDS reader (column layout); the first time in this
        process, the shard is fetched, checked (``ShardFiles``) and its layout validated."""
        fd, opened = self._files.fd(shard_id)
        if opened or shard_id not in self._readers:
            shard = self.shards[shard_id]
            reader = import_streaming_module("streaming.base.format").reader_from_json(self._files.root, None, shard)
            reader.validate(allow_unsafe_types=False)
            self._readers[shard_id] = reader
        return fd, self._readers[shard_id]

    def row(self, index: int) -> dict[str, Any]:
        """Row ``index`` (plan order), its shard checked first (``_shard``); decoding errors name the shard."""
        shard_id = self._shard_of(index)
        fd, reader = self._shard(shard_id)
        lo = index - (int(self._shard_ends[shard_id - 1]) if shard_id else 0)
        try:
            _, data = self._sample_bytes(fd, lo, lo + 1)
            return reader.decode_sample(data)
        except Exception as error:  # a decoding error deep in streaming: name the file it came from
            name = self.shards[shard_id]["raw_data"]["basename"]
            raise IntegrityError(f"{storage.join(self.uri, name)}: cannot read row {index} ({error})") from error

    def check_world_size(self, world_size: int) -> None:
        if world_size < 1 or self.group_size % world_size:
            divisors = [w for w in range(1, self.group_size + 1) if self.group_size % w == 0]
            raise ValueError(
                f"world size {world_size} does not divide the dataset's group size "
                f"{self.group_size}; balanced world sizes: {divisors}"
            )

    def steps_per_epoch(self, world_size: int) -> int:
        self.check_world_size(world_size)
        return self.n_step_groups * (self.group_size // world_size)

    def group_order(self, epoch: int, seed: int) -> np.ndarray:
        """Step groups in the order epoch ``epoch`` reads them: plan order in epoch 0, then a
        permutation drawn from ``(seed, epoch)``, so a resumed run (any world size) reads the same."""
        if epoch == 0:
            return np.arange(self.n_step_groups)
        key = (epoch, seed)
        if key not in self._orders:
            self._orders.clear()  # one epoch at a time is read: memory stays flat over long runs
            self._orders[key] = np.random.default_rng([seed, epoch]).permutation(self.n_step_groups)
        return self._orders[key]

    def micro_batch_index(self, step: int, rank: int, world_size: int, seed: int = 0) -> int:
        """The micro-batch rank ``rank`` of ``world_size`` reads at ``step``; after the first epoch the
        step groups come in ``group_order(epoch, seed)``."""
        self.check_world_size(world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside [0, {world_size})")
        steps_per_group = self.group_size // world_size
        epoch, step = divmod(step, self.steps_per_epoch(world_size))
        group, sub = divmod(step, steps_per_group)
        group = int(self.group_order(epoch, seed)[group])
        return group * self.group_size + sub * world_size + rank

    def shards_of(self, index: int) -> range:
        """Shards holding micro-batch ``index``'s rows (what reading it will fetch)."""
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return range(self._shard_of(start), self._shard_of(max(start, end - 1)) + 1)

    def micro_batch(self, index: int) -> list[dict[str, Any]]:
        """Micro-batch ``index``'s rows; each row's ``micro_batch`` column must say ``index`` (the
        offsets and the shards agree: both come from one plan)."""
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        samples = self.row_range(start, end)
        for row, sample in enumerate(samples, start):
            if "micro_batch" in sample and int(sample["micro_batch"]) != index:
                raise IntegrityError(
                    f"{self.uri}: row {row} belongs to micro-batch {int(sample['micro_batch'])} in the shards, "
                    f"but {self.info.layout.offsets_file} places it in micro-batch {index}; "
                    "re-run `freescale prepare --overwrite`"
                )
        return samples

    def row_range(self, start: int, end: int) -> list[dict[str, Any]]:
        """Rows ``[start, end)`` (plan order): each shard's part with two reads of the held file, decoded
        in one pass (``_shard_rows``). Why not ``row`` per index: streaming's reader opens the shard file
        for every row (7 system calls), and a micro-batch is read in the loader's worker, which shares
        the rank's core; a micro-batch's rows are contiguous, so its bytes are too."""
        samples: list[dict[str, Any]] = []
        row = start
        while row < end:
            shard_id = self._shard_of(row)
            first = int(self._shard_ends[shard_id - 1]) if shard_id else 0
            stop = min(end, int(self._shard_ends[shard_id]))
            samples.extend(self._shard_rows(shard_id, row - first, stop - first, row))
            row = stop
        return samples

    def _shard_rows(self, shard_id: int, lo: int, hi: int, first_row: int) -> list[dict[str, Any]]:
        """Rows ``[lo, hi)`` of a checked shard (an MDS file: sample count, uint32 offsets, data),
        decoded by ``mds_rows.row_decoder`` where its encodings allow (``prepare``'s always do)."""
        fd, reader = self._shard(shard_id)
        try:
            bounds, data = self._sample_bytes(fd, lo, hi)
            decoder = row_decoder(tuple(reader.column_names), tuple(reader.column_encodings))
            if decoder is not None:
                return decoder.rows(data, bounds)
            base = int(bounds[0])
            return [reader.decode_sample(data[a - base : b - base]) for a, b in itertools.pairwise(bounds)]
        except Exception as error:  # a decoding error deep in streaming: name the file it came from
            name = self.shards[shard_id]["raw_data"]["basename"]
            rows = f"rows {first_row}..{first_row + hi - lo - 1}"
            raise IntegrityError(f"{storage.join(self.uri, name)}: cannot read {rows} ({error})") from error

    @staticmethod
    def _sample_bytes(fd: int, lo: int, hi: int) -> tuple[np.ndarray, bytes]:
        """The offsets of samples ``[lo, hi)`` of an MDS shard file (count, uint32 offsets, data) and
        their bytes: two reads of the held file."""
        bounds = np.frombuffer(read_at(fd, (hi - lo + 1) * 4, (1 + lo) * 4), np.uint32).astype(np.int64)
        if len(bounds) != hi - lo + 1:
            raise ValueError("the file is shorter than its offsets say")
        data = read_at(fd, int(bounds[-1] - bounds[0]), int(bounds[0]))
        if len(data) != int(bounds[-1] - bounds[0]):
            raise ValueError("the file is shorter than its offsets say")
        return bounds, data

    def micro_batch_cost(self, index: int) -> float:
        return float(sum(sample["cost"] for sample in self.micro_batch(index)))


@dataclass
class RankReader:
    """Iterates one rank's micro-batches step by step; resumable from ``state_dict()``."""

    dataset: PreparedDataset
    world_size: int
    rank: int
    step: int = 0
    num_steps: int | None = None  # None: one epoch from the current step
    seed: int = 0  # order of the step groups after the first epoch (``group_order``)

    def __post_init__(self) -> None:
        self.dataset.check_world_size(self.world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside [0, {self.world_size})")

    def __iter__(self) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        end = self.step + (
            self.num_steps if self.num_steps is not None else self.dataset.steps_per_epoch(self.world_size) - self.step
        )
        while self.step < end:
            index = self.dataset.micro_batch_index(self.step, self.rank, self.world_size, self.seed)
            batch = self.dataset.micro_batch(index)
            step = self.step
            self.step += 1
            yield step, batch

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "world_size": self.world_size, "rank": self.rank}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["world_size"] != self.world_size:
            raise ValueError(
                f"checkpoint was taken with world size {state['world_size']}, resuming with {self.world_size}"
            )
        self.step = int(state["step"])
