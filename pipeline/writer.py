"""Phase 4 of ``prepare``: write samples as MDS shards in plan order, within the memory limit.

Samples are built per user partition, but the plan interleaves all partitions. An external bucket
sort bridges the two: every partition's samples go to the position bucket the plan gives them
(``position // bucket_size``), then buckets are read in order, sorted by position and written with
``MDSWriter``. Memory holds one partition or one bucket at a time. Rows end up in plan order, so a
micro-batch is a contiguous row range and a rank streaming from object storage downloads only the
shards its micro-batches live in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from freescale import storage
from freescale.pipeline.sequences import read_samples

storage_join = storage.join

LIST_COLUMNS = {"item_ids": "int64", "timestamps": "int64", "actions": "int32", "sources": "int8"}
SCALAR_COLUMNS = {"user_id": "int64", "window": "int32", "length": "int32", "cost": "float64", "micro_batch": "int64"}


def mds_columns(with_user_features: bool) -> dict[str, str]:
    """MDS column encodings: jagged per-event arrays plus per-sample scalars."""
    columns = {name: f"ndarray:{dtype}" for name, dtype in LIST_COLUMNS.items()}
    if with_user_features:
        columns["user_features"] = "ndarray:int32"
    columns.update(SCALAR_COLUMNS)
    return columns


def bucket_files(buckets_dir: str, bucket: int) -> list[Path]:
    return sorted(Path(buckets_dir).glob(f"b{bucket:05d}.p*.arrow"))


def scatter_partition(
    samples_dir: str,
    buckets_dir: str,
    partition: int,
    positions: np.ndarray,
    costs: np.ndarray,
    micro_batches: np.ndarray,
    bucket_size: int,
) -> None:
    """Split one partition's samples into position buckets (marker: ``scatter.p*.done``)."""
    table = read_samples(samples_dir, partition)
    table = table.append_column("position", pa.array(positions, pa.int64()))
    table = table.append_column("cost", pa.array(costs, pa.float64()))
    table = table.append_column("micro_batch", pa.array(micro_batches, pa.int64()))
    buckets = positions // bucket_size
    for bucket in np.unique(buckets):
        rows = table.filter(pa.array(buckets == bucket))
        path = Path(buckets_dir) / f"b{int(bucket):05d}.p{partition:05d}.arrow"
        with ipc.new_file(f"{path}.tmp", rows.schema) as writer:
            writer.write_table(rows)
        os.replace(f"{path}.tmp", path)
    Path(buckets_dir, f"scatter.p{partition:05d}.done").touch()


def scatter_done(buckets_dir: str, partition: int) -> bool:
    return Path(buckets_dir, f"scatter.p{partition:05d}.done").exists()


def _column_arrays(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    column = table.column(name).combine_chunks()
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False)
    return offsets - offsets[0], values[offsets[0] : offsets[-1]]


def iter_bucket_samples(buckets_dir: str, bucket: int, with_user_features: bool, start: int = 0, end: int = 2**62):
    """Samples of one bucket with plan positions in [start, end), in plan order, as dicts ready for
    ``MDSWriter.write``."""
    tables = [ipc.open_file(path).read_all() for path in bucket_files(buckets_dir, bucket)]
    if not tables:
        return
    table = pa.concat_tables(tables)
    position = table.column("position").to_numpy()
    table = table.filter(pa.array((position >= start) & (position < end))).sort_by("position")
    lists = {name: _column_arrays(table, name) for name in LIST_COLUMNS}
    if with_user_features:
        lists["user_features"] = _column_arrays(table, "user_features")
    scalars = {name: table.column(name).to_numpy() for name in SCALAR_COLUMNS}
    for i in range(table.num_rows):
        sample: dict[str, Any] = {
            name: values[offsets[i] : offsets[i + 1]] for name, (offsets, values) in lists.items()
        }
        sample.update({name: values[i] for name, values in scalars.items()})
        yield sample


# MDS "ndarray" shape header: the smallest unsigned dtype holding the length (streaming's NDArray codes).
_SHAPE_DTYPES = ((1 << 8, np.uint8, 0), (1 << 16, np.uint16, 1), (1 << 32, np.uint32, 2), (1 << 64, np.uint64, 3))


def encode_ndarray_1d(values: np.ndarray) -> bytes:
    """Bytes of ``mds_encode("ndarray:<dtype>", values)`` for a non-empty 1-D array, without its
    per-call checks: a one-byte ndim/shape-dtype header, the length, then the raw values."""
    length = values.shape[0]
    for bound, dtype, code in _SHAPE_DTYPES:
        if length < bound:
            return bytes([(1 << 2) | code]) + np.array([length], dtype).tobytes() + values.tobytes()
    raise ValueError(f"array of {length} elements is too long for MDS")


def fast_mds_writer(with_user_features: bool, **kwargs: Any):
    """An ``MDSWriter`` whose ``encode_sample`` is specialised to the FreeScale sample schema.

    Streaming's generic encoder spends ~40 µs of Python per array (coder lookup, dtype checks, shape
    min/max); with five jagged arrays per sample that dominated ``prepare``. The output bytes are
    identical (``tests/test_writer.py`` checks against ``MDSWriter.encode_sample``).
    """
    from streaming import MDSWriter  # heavy import (torchvision, transformers): only when writing

    class FreeScaleMDSWriter(MDSWriter):
        def encode_sample(self, sample: dict[str, Any]) -> bytes:
            sizes, data = [], []
            for name, encoding in zip(self.column_names, self.column_encodings):
                value = sample[name]
                if encoding.startswith("ndarray:"):
                    if value.dtype != _LIST_DTYPES[name] or value.ndim != 1 or value.size == 0:
                        return super().encode_sample(sample)  # let streaming raise its own error
                    datum = encode_ndarray_1d(value)
                    sizes.append(len(datum))
                else:
                    datum = _SCALAR_DTYPES[encoding](value).tobytes()
                data.append(datum)
            return np.array(sizes, np.uint32).tobytes() + b"".join(data)

    return FreeScaleMDSWriter(columns=mds_columns(with_user_features), **kwargs)


_LIST_DTYPES = {**{name: np.dtype(dtype) for name, dtype in LIST_COLUMNS.items()}, "user_features": np.dtype("int32")}
_SCALAR_DTYPES = {"int64": np.int64, "int32": np.int32, "float64": np.float64}


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

    The marker ``write.part-NNNNN.done`` lets a resumed job skip finished parts; an unfinished
    part's directory is emptied by ``MDSWriter`` when it is written again.
    """
    start, end = part * PART_SIZE, min((part + 1) * PART_SIZE, n_samples)
    written = 0
    with fast_mds_writer(
        with_user_features, out=storage_join(output, part_name(part)), size_limit=shard_size_limit, exist_ok=True
    ) as writer:
        for bucket in range(start // bucket_size, (end - 1) // bucket_size + 1):
            for sample in iter_bucket_samples(buckets_dir, bucket, with_user_features, start, end):
                writer.write(sample)
                written += 1
    Path(buckets_dir, f"write.{part_name(part)}.done").touch()
    return written


def part_done(buckets_dir: str, part: int) -> bool:
    return Path(buckets_dir, f"write.{part_name(part)}.done").exists()


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


def save_json(path: Path, data: Any) -> None:
    Path(f"{path}.tmp").write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(f"{path}.tmp", path)
