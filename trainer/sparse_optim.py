"""Sparse optimizers applied to the rows a step touched: row-wise Adagrad (default) and lazy Adam.

They update only rows with a gradient in this step, which is both what makes sharded tables cheap
and what prioritized embedding communication (DESIGN §5) reasons about: rows not in batch n do not
change in batch n's update. The same functions update a shard (``FreeScaleEngine``) and a full table
(the single-process reference in tests), so the two can be compared exactly.

Row-wise Adagrad follows fbgemm's ``EXACT_ROWWISE_ADAGRAD`` (TorchRec's default sparse optimizer):
one accumulator per row, ``state += mean(g²)``, ``w -= lr · g / (sqrt(state) + eps)``.
"""

from __future__ import annotations

import torch

from freescale.trainer.config import OptimizerConfig


class RowWiseAdagrad:
    """One float accumulator per row."""

    def __init__(self, rows: int, dim: int, lr: float, eps: float, device: torch.device) -> None:
        self.lr, self.eps = lr, eps
        self.state = {"momentum": torch.zeros(rows, dtype=torch.float32, device=device)}

    @torch.no_grad()
    def step(self, weight: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """``rows``: unique local rows; ``grads``: their summed gradients [U, dim]."""
        if rows.numel() == 0:
            return
        momentum = self.state["momentum"]
        momentum[rows] += grads.pow(2).mean(dim=1)
        weight[rows] -= self.lr * grads / (momentum[rows].sqrt() + self.eps)[:, None]


class LazyAdam:
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

    @torch.no_grad()
    def step(self, weight: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor) -> None:
        if rows.numel() == 0:
            return
        beta1, beta2 = self.betas
        state = self.state
        state["steps"][rows] += 1
        steps = state["steps"][rows][:, None]
        exp_avg = state["exp_avg"][rows] * beta1 + grads * (1 - beta1)
        exp_avg_sq = state["exp_avg_sq"][rows] * beta2 + grads.pow(2) * (1 - beta2)
        state["exp_avg"][rows], state["exp_avg_sq"][rows] = exp_avg, exp_avg_sq
        corrected = (exp_avg / (1 - beta1**steps)) / ((exp_avg_sq / (1 - beta2**steps)).sqrt() + self.eps)
        weight[rows] -= self.lr * corrected


SparseOptimizer = RowWiseAdagrad | LazyAdam


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
