"""This rank's shards of several equal-width tables in one tensor, with one sparse optimizer over it.

TorchRec-style fused storage: table ``t``'s shard (its rows ``[lo_t, hi_t)``) is the rows
``[start_t, start_t + hi_t - lo_t)`` of one weight tensor ``[sum of the shard rows, dim]``, and its
optimizer state is fused the same way. A stage addresses rows by fused index
(``start_t + id - lo_t``, one ``shift`` per table), so a lookup is one gather, an update one
``sum_by_row`` and one optimizer step, a state read one gather: no per-table boolean mask, each of
which is a host sync on CUDA (the sizes depend on the data).

Per table, ``weights[t]`` and ``optimizers[t]`` (its ``state``) are views into the fused storage:
checkpoints (``sharded.local_state``, the same keys and shapes as separate tensors), zero-collision
row resets and tests read and write one table as before, and see every fused update.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from freescale.trainer.engines.sparse_optim import SparseOptimizer, make_sparse_optimizer, sum_by_row
from freescale.trainer.learning_config import OptimizerConfig


class FusedTables:
    """One weight tensor and one sparse optimizer for all of this rank's table shards."""

    def __init__(
        self,
        shards: list[torch.Tensor],
        bounds: list[tuple[int, int]],
        optimizer: OptimizerConfig,
        device: torch.device,
    ) -> None:
        """``shards``: each table's initial rows ``[hi - lo, dim]`` (any device); ``bounds``: their ``(lo, hi)``."""
        sizes = [shard.shape[0] for shard in shards]
        starts = [0, *accumulate(sizes)][:-1]
        self.weight = torch.cat(shards).to(device)
        self.optimizer: SparseOptimizer = make_sparse_optimizer(optimizer, sum(sizes), self.weight.shape[1], device)
        self.weights = [self.weight[start : start + size] for start, size in zip(starts, sizes)]
        self.optimizers = [self.optimizer.rows_view(start, start + size) for start, size in zip(starts, sizes)]
        shifts = [start - lo for start, (lo, _) in zip(starts, bounds)]
        self.shift = torch.tensor(shifts, dtype=torch.int64, device=device)

    def index(self, ids: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        """Fused row of each (table, global id of a row this rank owns)."""
        return ids + self.shift[tables]

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """The rows at fused ``index`` (a copy)."""
        return self.weight[index]

    def update(self, index: torch.Tensor, grads: torch.Tensor) -> None:
        """Sum the gradients of duplicate fused rows and apply one optimizer step to the rows."""
        rows, summed = sum_by_row(index, grads)
        self.optimizer.step(self.weight, rows, summed)

    def state_rows(self, index: torch.Tensor) -> torch.Tensor:
        """Optimizer state of the rows at fused ``index``, packed one row per index (``SparseOptimizer.pack``)."""
        return self.optimizer.pack(self.optimizer.state_rows(index))
