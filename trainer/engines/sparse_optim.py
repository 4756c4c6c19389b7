"""Sparse optimizers applied to the rows a step touched: row-wise Adagrad (default) and lazy Adam.

They update only rows with a gradient in this step, which is both what makes sharded tables cheap
and what prioritized embedding communication (docs/design.md#pec) reasons about: rows not in batch n do not
change in batch n's update. The same functions update a shard (``FreeScaleEngine``) and a full table
(the single-process reference in tests), so the two can be compared exactly.

Row-wise Adagrad follows fbgemm's ``EXACT_ROWWISE_ADAGRAD`` (TorchRec's default sparse optimizer):
one accumulator per row, ``state += mean(g²)``, ``w -= lr · g / (sqrt(state) + eps)``.
"""

from __future__ import annotations

import copy
import math

import torch

from freescale.trainer.learning_config import OptimizerConfig


class RowWiseAdagrad:
    """One float accumulator per row."""

    def __init__(self, rows: int, dim: int, lr: float, eps: float, device: torch.device) -> None:
        self.lr, self.eps = lr, eps
        self.state = {"momentum": torch.zeros(rows, dtype=torch.float32, device=device)}

    def updated(
        self, weight: torch.Tensor, state: dict[str, torch.Tensor], grads: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """New (rows, state rows) from gathered copies: the one place the update arithmetic lives.

        ``step`` applies it to a shard; PEC applies it to prefetched copies of rows another rank
        owns, and both must produce the same bits.
        """
        momentum = state["momentum"] + grads.pow(2).mean(dim=1)
        return weight - self.lr * grads / (momentum.sqrt() + self.eps)[:, None], {"momentum": momentum}

    @torch.no_grad()
    def step(self, weight: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """``rows``: unique local rows; ``grads``: their summed gradients [U, dim]."""
        if rows.numel() == 0:
            return
        new_rows, new_state = self.updated(weight[rows], self.state_rows(rows), grads)
        weight[rows] = new_rows
        for key, value in new_state.items():
            self.state[key][rows] = value

    def state_rows(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {key: tensor[rows] for key, tensor in self.state.items()}

    def rows_view(self, lo: int, hi: int) -> RowWiseAdagrad:
        """This optimizer restricted to rows ``[lo, hi)``: the same settings, its state views into this
        one's (one table of ``fused_tables.FusedTables``)."""
        view = copy.copy(self)
        view.state = {key: tensor[lo:hi] for key, tensor in self.state.items()}
        return view

    def state_width(self, dim: int) -> int:
        """Floats per row of ``pack`` (state travels with prefetched rows in PEC)."""
        return sum(math.prod(tensor.shape[1:]) for tensor in self.state.values())

    def pack(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """State rows as one float32 matrix, keys in ``self.state`` order (a bit-exact copy)."""
        return torch.cat([value.reshape(value.shape[0], math.prod(value.shape[1:])) for value in state.values()], dim=1)

    def unpack(self, packed: torch.Tensor) -> dict[str, torch.Tensor]:
        out, column = {}, 0
        for key, tensor in self.state.items():
            width = math.prod(tensor.shape[1:])
            out[key] = packed[:, column : column + width].reshape(packed.shape[0], *tensor.shape[1:])
            column += width
        return out


class LazyAdam(RowWiseAdagrad):
    """Adam moments per element, bias correction per row from the row's own update count."""

    def __init__(
        self, rows: int, dim: int, lr: float, eps: float, betas: tuple[float, float], device: torch.device
    ) -> None:
        self.lr, self.eps, self.betas = lr, eps, betas
        self.state = {
            "exp_avg": torch.zeros(rows, dim, dtype=torch.float32, device=device),
            "exp_avg_sq": torch.zeros(rows, dim, dtype=torch.float32, device=device),
            "steps": torch.zeros(rows, dtype=torch.float32, device=device),
        }

    def updated(
        self, weight: torch.Tensor, state: dict[str, torch.Tensor], grads: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        beta1, beta2 = self.betas
        steps = state["steps"] + 1
        exp_avg = state["exp_avg"] * beta1 + grads * (1 - beta1)
        exp_avg_sq = state["exp_avg_sq"] * beta2 + grads.pow(2) * (1 - beta2)
        column = steps[:, None]
        corrected = (exp_avg / (1 - beta1**column)) / ((exp_avg_sq / (1 - beta2**column)).sqrt() + self.eps)
        return weight - self.lr * corrected, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "steps": steps}


SparseOptimizer = RowWiseAdagrad  # LazyAdam shares its interface


def make_sparse_optimizer(cfg: OptimizerConfig, rows: int, dim: int, device: torch.device) -> SparseOptimizer:
    if cfg.sparse == "rowwise_adagrad":
        return RowWiseAdagrad(rows, dim, cfg.sparse_lr, cfg.eps, device)
    return LazyAdam(rows, dim, cfg.sparse_lr, cfg.eps, cfg.betas, device)


def sum_by_row(rows: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique rows and the sum of the gradients that name each (duplicates from several ranks)."""
    unique, inverse = torch.unique(rows, return_inverse=True)
    summed = torch.zeros(unique.numel(), grads.shape[1], dtype=grads.dtype, device=grads.device)
    summed.index_add_(0, inverse, grads)
    return unique, summed


def make_dense_optimizer(cfg: OptimizerConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The data-parallel parameters' optimizer (deterministic single-tensor implementations)."""
    if cfg.dense == "adam":
        return torch.optim.Adam(
            params, lr=cfg.dense_lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False
        )
    if cfg.dense == "adamw":
        return torch.optim.AdamW(
            params, lr=cfg.dense_lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False
        )
    return torch.optim.SGD(params, lr=cfg.dense_lr, weight_decay=cfg.weight_decay, foreach=False)
