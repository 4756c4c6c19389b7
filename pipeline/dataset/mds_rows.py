"""Decoding a range of MDS rows in one pass, for the encodings ``prepare`` writes.

Why not streaming's ``MDSReader.decode_sample``: it looks up a coder per field, copies each field's
bytes out of the sample and builds scalars through ``np.frombuffer(...)[0]`` of a copy. A loader
worker decodes every row of every micro-batch, on a host where it may share the rank's core; for a
micro-batch of 8 rows that was ~0.4 ms of its ~2.5 ms per batch. Here each column's decoder is
chosen once per shard and every value is a view at its offset into the range's bytes (read-only,
as streaming's are): same values, same dtypes and shapes, a fraction of the calls.

Only ``ndarray:<dtype>`` (shape in the datum) and fixed-size numeric scalars are decoded here; a
shard with any other encoding (written by another tool) gets ``None`` from ``RowDecoder.of`` and
is read by streaming's own decoder (``row_decoder`` caches the choice per layout).
"""

from __future__ import annotations

import functools
import itertools
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from freescale.pipeline.steps.mds_shards import FIXED_SIZES

# MDS ``ndarray`` datum head: one byte ``ndim << 2 | code``, then ``ndim`` dims of the code's uint.
SHAPE_FORMATS = ("B", "H", "I", "Q")
SHAPE_SIZES = tuple(struct.calcsize(f"<{fmt}") for fmt in SHAPE_FORMATS)
SCALARS = tuple(FIXED_SIZES)  # the scalar encodings the shard writer knows, which are also ndarray dtypes


@dataclass(frozen=True)
class _Column:
    name: str
    dtype: np.dtype
    array: bool  # an ``ndarray:<dtype>`` datum of variable size; else a scalar of ``dtype.itemsize``


@dataclass(frozen=True)
class RowDecoder:
    """Decodes rows of one shard layout (its ``column_names`` and ``column_encodings``)."""

    columns: tuple[_Column, ...]
    variable: int  # columns whose size is in the row's head (uint32 each, in column order)

    @classmethod
    def of(cls, names: list[str], encodings: list[str]) -> RowDecoder | None:
        """The decoder of a shard's columns, or ``None`` if one of them is not an encoding handled here."""
        columns = []
        for name, encoding in zip(names, encodings, strict=True):
            kind, _, dtype = encoding.partition(":")
            if kind == "ndarray" and dtype in SCALARS:
                columns.append(_Column(name, np.dtype(dtype), True))
            elif encoding in SCALARS:
                columns.append(_Column(name, np.dtype(encoding), False))
            else:
                return None
        return cls(tuple(columns), sum(c.array for c in columns))

    def rows(self, data: bytes, bounds: np.ndarray) -> list[dict[str, Any]]:
        """The rows whose bytes are ``data[bounds[i] - bounds[0] : bounds[i + 1] - bounds[0]]``."""
        base = int(bounds[0])
        edges = (bounds - base).tolist()
        return [self.row(data, start, end) for start, end in itertools.pairwise(edges)]

    def row(self, data: bytes, pos: int, end: int) -> dict[str, Any]:
        sizes = struct.unpack_from(f"<{self.variable}I", data, pos)
        pos += 4 * self.variable
        out: dict[str, Any] = {}
        k = 0
        for column in self.columns:
            if column.array:
                size = sizes[k]
                k += 1
                out[column.name] = _array(data, pos, size, column)
                pos += size
            else:
                out[column.name] = np.frombuffer(data, column.dtype, 1, pos)[0]
                pos += column.dtype.itemsize
        if pos != end:
            raise ValueError(f"a row's fields take {pos} bytes of its {end}")
        return out


def _array(data: bytes, pos: int, size: int, column: _Column) -> np.ndarray:
    head = data[pos]
    ndim, code = head >> 2, head & 3
    shape = struct.unpack_from(f"<{ndim}{SHAPE_FORMATS[code]}", data, pos + 1)
    start = pos + 1 + ndim * SHAPE_SIZES[code]
    count, extra = divmod(size - (start - pos), column.dtype.itemsize)
    if extra or count != math.prod(shape):
        raise ValueError(f"column {column.name!r}: {size} bytes do not hold an array of shape {shape}")
    return np.frombuffer(data, column.dtype, count, start).reshape(shape)


@functools.lru_cache(maxsize=64)
def row_decoder(names: tuple[str, ...], encodings: tuple[str, ...]) -> RowDecoder | None:
    """``RowDecoder.of``, once per shard layout (every shard of a dataset has the same one)."""
    return RowDecoder.of(list(names), list(encodings))
