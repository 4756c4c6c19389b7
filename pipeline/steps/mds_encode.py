"""MDS sample encoding for whole tables at once, without importing mosaicml-streaming.

``MDSWriter.encode_sample`` turns one sample dict into bytes with a few dozen Python calls; for a
100k-sample dataset that was most of the write phase, and it ran in the one process that holds the
writer. Here the same bytes are built column-wise with numpy and one pyarrow
``binary_join_element_wise`` per table, in the worker processes that scatter samples into buckets:
the writer only hands finished byte strings to ``MDSWriter.write``.

An encoded sample is, for the columns in sorted name order (MDSWriter's order):
``uint32 size of each variable-size column`` then each column's datum, where a 1-D ``ndarray:<dtype>``
datum is ``[ndim << 2 | shape-dtype code: 1 byte][length: smallest unsigned dtype][raw values]``
and a scalar (``int64``, ``int32``, ``float64``) is its raw native bytes. ``tests/pipeline/steps/test_writer.py``
checks the result against ``MDSWriter.encode_sample`` byte for byte.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["LIST_COLUMNS", "SCALAR_COLUMNS", "encode_samples", "mds_columns"]

LIST_COLUMNS = {"item_ids": "int64", "timestamps": "int64", "actions": "int32", "sources": "int8"}
SCALAR_COLUMNS = {"user_id": "int64", "window": "int32", "length": "int32", "cost": "float64", "micro_batch": "int64"}
_FEATURES = ("user_features", "int32")
_SHAPE_WIDTH = np.array([1, 2, 4, 8], np.int64)  # bytes of the length for shape-dtype codes 0..3


def mds_columns(with_user_features: bool) -> dict[str, str]:
    """MDS column encodings: jagged per-event arrays plus per-sample scalars."""
    columns = {name: f"ndarray:{dtype}" for name, dtype in LIST_COLUMNS.items()}
    if with_user_features:
        columns["user_features"] = f"ndarray:{_FEATURES[1]}"
    columns.update(SCALAR_COLUMNS)
    return columns


def _binary(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A large_binary array over ``data`` (uint8) cut at ``offsets`` (n + 1 values), without copies."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))]
    )


def _list_parts(column: pa.ChunkedArray | pa.Array, dtype: str) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """The shape prefix and the raw values of a list column as per-sample binaries, and datum sizes."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    if values.dtype != np.dtype(dtype):
        raise TypeError(f"MDS column needs {dtype} values, got {values.dtype}")
    offsets -= offsets[0]
    lengths = np.diff(offsets)
    if len(lengths) and int(lengths.min()) <= 0:
        raise ValueError("MDS ndarray columns need non-empty arrays (streaming rejects empty shapes)")
    code = (lengths >= 1 << 8).astype(np.int64) + (lengths >= 1 << 16) + (lengths >= 1 << 32)
    prefix_size = 1 + _SHAPE_WIDTH[code]
    staging = np.zeros((len(lengths), 9), np.uint8)
    staging[:, 0] = (1 << 2) | code  # ndim 1, shape dtype code
    staging[:, 1:] = lengths.astype("<u8").view(np.uint8).reshape(-1, 8)
    prefix = staging[np.arange(9) < prefix_size[:, None]]  # row-major: each sample's bytes in order
    prefix_offsets = np.concatenate([[0], np.cumsum(prefix_size)])
    itemsize = values.dtype.itemsize
    raw = _binary(offsets * itemsize, values.view(np.uint8))
    return _binary(prefix_offsets, prefix), raw, prefix_size + lengths * itemsize


def _scalar_part(column: pa.ChunkedArray | pa.Array, dtype: str) -> pa.Array:
    values = np.ascontiguousarray(np.asarray(column.to_numpy()).astype(np.dtype(dtype), copy=False))
    return _binary(np.arange(len(values) + 1, dtype=np.int64) * values.dtype.itemsize, values.view(np.uint8))


def encode_samples(table: pa.Table, with_user_features: bool) -> pa.Array:
    """Every row of ``table`` (the ``mds_columns`` names) as the bytes ``MDSWriter.encode_sample``
    gives for it, as one large_binary array."""
    columns = mds_columns(with_user_features)
    n = table.num_rows
    sizes, parts = [], []
    for name in sorted(columns):
        encoding = columns[name]
        if encoding.startswith("ndarray:"):
            prefix, raw, size = _list_parts(table.column(name), encoding.split(":", 1)[1])
            parts.extend([prefix, raw])
            sizes.append(size)
        else:
            parts.append(_scalar_part(table.column(name), encoding))
    head = np.ascontiguousarray(np.stack(sizes, axis=1).astype(np.uint32)) if sizes else np.zeros((n, 0), np.uint32)
    header = _binary(np.arange(n + 1, dtype=np.int64) * head.shape[1] * 4, head.reshape(-1).view(np.uint8))
    if n == 0:
        return pa.array([], pa.large_binary())
    return pc.binary_join_element_wise(header, *parts, pa.scalar(b"", pa.large_binary()))
