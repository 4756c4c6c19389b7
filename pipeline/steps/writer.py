"""Phases 4–5 of ``prepare``: samples into plan-order buckets, then MDS shards, within the memory limit.

Samples are built per user partition, but the plan interleaves all partitions. An external bucket
sort bridges the two: as a worker builds a partition's samples it encodes them to MDS bytes
(``mds_encode``) and sends each to the position bucket the plan gives it (``BucketSink``); then
buckets are read in order (memory-mapped), sorted by position and framed into MDS shards
(``mds_shards.ShardWriter``, the bytes ``MDSWriter`` writes). Memory
holds one partition or one bucket at a time. Rows end up in plan order, so a micro-batch is a
contiguous row range and a rank streaming from object storage downloads only the shards its
micro-batches live in.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import xxhash

from freescale import storage
from freescale.pipeline.dataset.manifest import ManifestError
from freescale.pipeline.integrity import HASH_ALGO, check_index, file_hash
from freescale.pipeline.steps.mds_encode import LIST_COLUMNS, SCALAR_COLUMNS, encode_samples, mds_columns
from freescale.pipeline.steps.mds_shards import ShardWriter

storage_join = storage.join
__all__ = [
    "LIST_COLUMNS",
    "SCALAR_COLUMNS",
    "BucketSink",
    "WrittenPart",
    "mds_columns",
    "part_writer",
    "write_part",
    "written_part_problem",
]


def bucket_files(buckets_dir: str, bucket: int) -> list[Path]:
    return sorted(Path(buckets_dir).glob(f"b{bucket:05d}.p*.arrow"))


@dataclass(frozen=True)
class BucketSink:
    """``run_partition``'s sink in ``prepare``: encode a partition's samples as MDS bytes (in the
    workers, in parallel) with their plan cost and micro-batch, and split them into position buckets
    (``position // bucket_size``). The arrays hold the partition's planned samples in (user_id,
    window) order, which is also the order ``build_samples`` returns them in."""

    buckets_dir: str
    positions: np.ndarray
    costs: np.ndarray
    micro_batches: np.ndarray
    lengths: np.ndarray
    bucket_size: int
    with_user_features: bool

    def __call__(self, table: pa.Table, partition: int) -> None:
        lengths = table.column("length").to_numpy()
        if len(lengths) != len(self.lengths) or not np.array_equal(lengths, self.lengths):
            raise RuntimeError(
                f"partition {partition}: built {len(lengths)} samples, but the plan (made from the scan's "
                f"per-user counts) has {len(self.lengths)} or other lengths; the work directory is stale"
            )
        table = table.append_column("cost", pa.array(self.costs, pa.float64()))
        table = table.append_column("micro_batch", pa.array(self.micro_batches, pa.int64()))
        encoded = pa.table(
            {
                "position": pa.array(self.positions, pa.int64()),
                "sample": encode_samples(table, self.with_user_features),
            }
        )
        buckets = self.positions // self.bucket_size
        for bucket in np.unique(buckets):
            rows = encoded.filter(pa.array(buckets == bucket))
            path = Path(self.buckets_dir) / f"b{int(bucket):05d}.p{partition:05d}.arrow"
            with ipc.new_file(f"{path}.tmp", rows.schema) as writer:
                writer.write_table(rows)
            os.replace(f"{path}.tmp", path)


def iter_bucket_samples(
    buckets_dir: str, bucket: int, start: int = 0, end: int = 2**62, maps: list[mmap.mmap] | None = None
) -> Iterator[memoryview]:
    """Encoded samples of one bucket with plan positions in [start, end), in plan order.

    Bucket files are memory-mapped and each sample is a view into them: nothing is copied before
    the shard writer joins a shard's samples, so the writer touches each byte once. ``maps``: gets
    the mappings, so that the writer can drop the pages it has written from its RSS
    (``release_mapped``).
    """
    views, positions, bounds = [], [], []
    for path in bucket_files(buckets_dir, bucket):
        with open(path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        if maps is not None:
            maps.append(mapped)
        for batch in ipc.open_file(pa.BufferReader(pa.py_buffer(mapped))).read_all().to_batches():
            column = batch.column("sample")
            _, offsets_buffer, data_buffer = column.buffers()
            offsets = np.frombuffer(offsets_buffer, np.int64)[column.offset : column.offset + len(column) + 1]
            views.append(memoryview(data_buffer))
            positions.append(batch.column("position").to_numpy())
            bounds.append(np.stack([np.full(len(column), len(views) - 1), offsets[:-1], offsets[1:]], axis=1))
    if not views:
        return
    position = np.concatenate(positions)
    mine = np.flatnonzero((position >= start) & (position < end))
    spans = np.concatenate(bounds)[mine[np.argsort(position[mine])]].tolist()
    for view, lo, hi in spans:
        yield views[view][lo:hi]


def release_mapped(maps: list[mmap.mmap]) -> None:
    """Drop the bucket files' pages from this process's RSS (``MADV_DONTNEED``; they stay in the page
    cache, and a later read of them is a minor fault). Called after each ``WRITE_CHUNK`` the shard
    writer has written: without it a shard's samples (up to ``--shard-size-limit``, 64 MB) stayed
    resident until the shard was flushed, and the 256 MB job's write step peaked at 274-283 MB."""
    for mapped in maps:
        if not mapped.closed:
            mapped.madvise(mmap.MADV_DONTNEED)


def part_writer(with_user_features: bool, out: str, size_limit: int | None) -> ShardWriter:
    """A ``ShardWriter`` for one part's samples, already encoded in the workers
    (``mds_encode.encode_samples``, byte-identical to ``MDSWriter.encode_sample``), recording xxh64
    shard hashes (the manifest's file table takes them from the index)."""
    return ShardWriter(mds_columns(with_user_features), out, size_limit, [HASH_ALGO])


PART_SIZE = 32_768  # samples per part (resume granularity); fixed so output bytes never depend on the job


def part_name(part: int) -> str:
    return f"part-{part:05d}"


def write_part(
    output: str,
    buckets_dir: str,
    bucket_size: int,
    part: int,
    n_samples: int,
    with_user_features: bool,
    shard_size_limit: int,
) -> int:
    """Write plan positions [part·PART_SIZE, (part+1)·PART_SIZE) as MDS shards under ``part-NNNNN/``.

    The marker ``write.part-NNNNN.done`` (``WrittenPart``) lets a resumed job skip finished parts
    once it has checked them (``written_part_problem``); an unfinished part's directory is emptied by
    ``ShardWriter`` when it is written again. Parts are independent: the Ray executor writes them in
    parallel tasks.
    """
    start, end = part * PART_SIZE, min((part + 1) * PART_SIZE, n_samples)
    if part_done(buckets_dir, part):  # a retried task (Ray) whose first run got past the marker
        return end - start
    written, maps = 0, []
    with part_writer(with_user_features, storage_join(output, part_name(part)), shard_size_limit) as writer:
        writer.after_write = lambda: release_mapped(maps)
        for bucket in range(start // bucket_size, (end - 1) // bucket_size + 1):
            written += writer.write_encoded(iter_bucket_samples(buckets_dir, bucket, start, end, maps))
    WrittenPart(xxhash.xxh64(writer.index_data).hexdigest()).save(marker_path(buckets_dir, part))
    # buckets that lie wholly in this part: parts may be written at once (Ray), so a bucket shared
    # with a neighbouring part stays until the work directory is removed
    for bucket in range(-(-start // bucket_size), end // bucket_size):
        for path in bucket_files(buckets_dir, bucket):
            path.unlink()
    return written


def marker_path(buckets_dir: str, part: int) -> Path:
    return Path(buckets_dir, f"write.{part_name(part)}.done")


def part_done(buckets_dir: str, part: int) -> bool:
    return marker_path(buckets_dir, part).exists()


@dataclass(frozen=True)
class WrittenPart:
    """What a part's marker records: the xxh64 of the ``index.json`` its writer wrote, which holds
    every shard's size and hash. A resumed job finds the part's files in a directory it does not
    hold between runs (a staging directory, an ``s3://`` prefix), so a marker's presence alone does
    not say those files are the ones this job wrote."""

    index_xxh64: str

    def save(self, path: Path) -> None:
        """Written whole or not at all: a temporary file renamed into place."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"index_xxh64": self.index_xxh64}))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> WrittenPart | None:
        """The marker's record, or None when it is missing or is not one (a marker of an older layout)."""
        try:
            return cls(str(json.loads(path.read_text())["index_xxh64"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def written_part_problem(output: str, buckets_dir: str, part: int, hash_shards: bool) -> str | None:
    """None when the part under ``output`` is the one its marker describes; else what differs, in a few
    words. The part's ``index.json`` must hash to the marker's record, and every shard it lists must
    exist with its recorded size and (``hash_shards``: read back, for a local output) its xxh64."""
    marker = WrittenPart.load(marker_path(buckets_dir, part))
    if marker is None:
        return "its marker records no index hash"
    where = storage_join(output, part_name(part))
    try:
        data = storage.read_bytes(storage_join(where, "index.json"))
    except (FileNotFoundError, OSError):
        return f"{where}/index.json is missing"
    if xxhash.xxh64(data).hexdigest() != marker.index_xxh64:
        return f"{where}/index.json is not the index this job wrote"
    try:
        shards = check_index(data, f"{where}/index.json")
    except ManifestError as error:
        return str(error)
    fs, root = storage.filesystem(where)
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    sizes = {info.base_name: info.size for info in infos if info.type == pafs.FileType.File}
    for shard in shards:
        raw = shard["raw_data"]
        name = raw["basename"]
        if sizes.get(name) != raw["bytes"]:
            return f"{where}/{name} is missing or not {raw['bytes']} bytes"
        if hash_shards and file_hash(storage_join(where, name)) != raw.get("hashes", {}).get(HASH_ALGO):
            return f"{where}/{name} does not have the {HASH_ALGO} hash this job wrote"
    return None


def merge_part_indexes(output: str, n_parts: int) -> bytes:
    """The root ``index.json``: every part's shards in part order, basenames prefixed by the part
    directory (what ``streaming.base.util.merge_index`` writes, without its download round trips)."""
    shards = []
    for part in range(n_parts):
        index = json.loads(storage.read_bytes(storage_join(output, part_name(part), "index.json")))
        for shard in index["shards"]:
            for key in ("raw_data", "zip_data"):
                if shard.get(key):
                    shard[key]["basename"] = f"{part_name(part)}/{shard[key]['basename']}"
            shards.append(shard)
    return json.dumps({"shards": shards, "version": 2}, sort_keys=True).encode()
