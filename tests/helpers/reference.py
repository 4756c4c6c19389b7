"""A single-process replay of a W-rank step, for verifying the sharded engine.

It holds whole tables (initialised with the same per-chunk generators as the shards) and the same
dense model, and applies the engine's rules literally: the loss of a step is the *sum* of every
rank's micro-batch loss (each a mean over its positions), dense gradients are then divided by W
(DDP's average), embedding gradients are left summed, and the sparse optimizer updates exactly the
rows some rank looked up. Equality with ``FreeScaleEngine`` after a step (tested) shows that the
explicit input/output/gradient all-to-alls, the de-duplication and the owner-side summation are
exact, up to float summation order.
"""

from __future__ import annotations

import torch

from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import Batch
from freescale.trainer.engines.engine import batch_features, batch_loss, table_specs
from freescale.trainer.engines.jagged_ids import split_features
from freescale.trainer.engines.sparse_optim import make_dense_optimizer, make_sparse_optimizer
from freescale.trainer.engines.table_layout import init_rows
from freescale.trainer.model.transducer import SequentialTransducer


class ReferenceTrainer:
    """Whole tables + dense model in one process, stepping on the W micro-batches of a step."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        torch.manual_seed(cfg.engine.seed)
        self.model = SequentialTransducer(cfg.model, cfg.model_extra)
        self.specs = table_specs(cfg)
        self.tables = [
            init_rows(cfg.engine.seed, t, spec, 0, spec.rows) for t, spec in enumerate(self.specs)
        ]
        self.sparse = [
            make_sparse_optimizer(cfg.optimizer, spec.rows, spec.dim, torch.device("cpu")) for spec in self.specs
        ]
        self.dense = make_dense_optimizer(cfg.optimizer, list(self.model.parameters()))
        self.table_of = {feature: t for t, spec in enumerate(self.specs) for feature in spec.features}

    def step(self, batches: list[Batch], step_seeds: list[int] | None = None) -> list[float]:
        """One step of ``len(batches)`` ranks (rank r's micro-batch is ``batches[r]``); per-rank losses."""
        self.model.train()
        leaves = [table.clone().requires_grad_() for table in self.tables]
        losses, touched = [], [[] for _ in self.tables]
        for rank, batch in enumerate(batches):
            if step_seeds is not None:
                torch.manual_seed(step_seeds[rank])
            ids = split_features(batch_features(batch))
            for name, values in ids.items():
                touched[self.table_of[name]].append(values)
            rows = {name: leaves[self.table_of[name]][values] for name, values in ids.items()}
            losses.append(batch_loss(self.model, batch, rows, self.cfg.model_extra.temperature))
        torch.stack(losses).sum().backward()
        for param in self.model.parameters():  # the engine all-reduces a grad for every parameter
            param.grad = torch.zeros_like(param) if param.grad is None else param.grad / len(batches)
        for table, leaf, optimizer, used in zip(self.tables, leaves, self.sparse, touched):
            rows = torch.unique(torch.cat(used)) if used else torch.zeros(0, dtype=torch.int64)
            grads = leaf.grad[rows] if leaf.grad is not None else torch.zeros(len(rows), table.shape[1])
            optimizer.step(table, rows, grads)
        self.dense.step()
        self.dense.zero_grad(set_to_none=True)
        return [float(loss.detach()) for loss in losses]
