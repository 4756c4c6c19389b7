"""A sharded table's layout: its spec (rows, width, the features that read it), the ``torch.chunk`` row
range each rank owns, and initial rows identical for every sharding of the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freescale.kernels.zch_types import ZchConfig

INIT_CHUNK_ROWS = 4096


@dataclass
class TableSpec:
    """One embedding table and the features that read it."""

    name: str
    rows: int
    dim: int
    features: tuple[str, ...]
    zch: ZchConfig | None = None  # a zero-collision table: rows = zch_size + world_size (zch_shard.py)
    init_bound: float | None = None  # rows start uniform in [-init_bound, init_bound); None: sqrt(1/rows)

    @property
    def bound(self) -> float:
        """The initial rows' range (``model_extra.embedding_init``; TorchRec's sqrt(1/rows) by default)."""
        return (1.0 / self.rows) ** 0.5 if self.init_bound is None else self.init_bound


def init_rows(seed: int, table_index: int, spec: TableSpec, lo: int, hi: int) -> torch.Tensor:
    """Rows ``[lo, hi)`` of a table's initial weights, identical for every sharding of the table.

    Uniform(±``spec.bound``), drawn per 4096-row chunk from a generator seeded by (seed, table, chunk):
    any rank can produce its shard, and a single process the whole table.
    """
    total_rows, dim, bound = spec.rows, spec.dim, spec.bound
    out = torch.empty(max(0, hi - lo), dim, dtype=torch.float32)
    for chunk in range(lo // INIT_CHUNK_ROWS, -(-hi // INIT_CHUNK_ROWS)):
        start = chunk * INIT_CHUNK_ROWS
        rows = min(INIT_CHUNK_ROWS, total_rows - start)
        generator = torch.Generator().manual_seed(seed * 1_000_003 + table_index * 7_919 + chunk)
        block = torch.rand(rows, dim, generator=generator) * (2 * bound) - bound
        a, b = max(lo, start), min(hi, start + rows)
        out[a - lo : b - lo] = block[a - start : b - start]
    return out


def shard_bounds(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """``torch.chunk`` row range of ``rank`` (the last shards may be short or empty)."""
    per_rank = -(-rows // world_size)
    return min(rows, rank * per_rank), min(rows, (rank + 1) * per_rank)
