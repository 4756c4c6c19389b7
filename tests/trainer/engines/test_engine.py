"""``batch_features`` / ``batch_loss`` (trainer/engines/engine.py): the loss reaches rows and dense
parameters."""

from __future__ import annotations

import math

import torch
from trainer_samples import collate_cfg, make_samples

from freescale.model_config import ModelConfig
from freescale.trainer.data.batches import collate
from freescale.trainer.engines.engine import batch_features, batch_loss
from freescale.trainer.engines.jagged_ids import split_features
from freescale.trainer.learning_config import ModelExtraConfig
from freescale.trainer.model.transducer import SequentialTransducer


def test_loss_backpropagates_to_rows_and_dense_params() -> None:
    torch.manual_seed(0)
    model = SequentialTransducer(ModelConfig(d_model=8, num_layers=1, num_heads=2, max_uih_len=64), ModelExtraConfig())
    batch = collate(make_samples([7, 12, 3]), collate_cfg(), step=0, rank=0)
    ids = split_features(batch_features(batch))
    tables = {"item": torch.randn(50, 8, requires_grad=True), "action": torch.randn(4, 8, requires_grad=True)}
    rows = {
        "item": tables["item"][ids["item"]],
        "action": tables["action"][ids["action"]],
        "neg": tables["item"][ids["neg"]],
    }
    loss = batch_loss(model, batch, rows, temperature=0.1)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and float(loss.detach()) > 0
    assert all(p.grad is not None for p in model.parameters())
    assert tables["item"].grad.abs().sum() > 0
