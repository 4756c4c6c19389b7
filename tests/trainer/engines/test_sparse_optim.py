"""The sparse optimizers (trainer/engines/sparse_optim.py) touch only the rows they are given."""

from __future__ import annotations

import math

import torch

from freescale.trainer.engines.sparse_optim import LazyAdam, RowWiseAdagrad, sum_by_row


def test_rowwise_adagrad_and_lazy_adam_touch_only_given_rows() -> None:
    weight = torch.ones(5, 2)
    adagrad = RowWiseAdagrad(5, 2, lr=0.1, eps=1e-8, device=torch.device("cpu"))
    rows, grads = sum_by_row(torch.tensor([3, 1, 3]), torch.tensor([[1.0, 1.0], [2.0, 0.0], [1.0, 1.0]]))
    assert rows.tolist() == [1, 3] and grads.tolist() == [[2.0, 0.0], [2.0, 2.0]]
    adagrad.step(weight, rows, grads)
    assert adagrad.state["momentum"].tolist() == [0.0, 2.0, 0.0, 4.0, 0.0]
    torch.testing.assert_close(weight[3], torch.tensor([1 - 0.1 * 2 / 2, 1 - 0.1 * 2 / 2]))
    torch.testing.assert_close(weight[1], torch.tensor([1 - 0.1 * 2 / math.sqrt(2), 1.0]))
    assert weight[[0, 2, 4]].eq(1).all()
    adam_weight = torch.zeros(4, 2)
    adam = LazyAdam(4, 2, lr=0.01, eps=1e-8, betas=(0.9, 0.99), device=torch.device("cpu"))
    adam.step(adam_weight, torch.tensor([2]), torch.tensor([[3.0, -3.0]]))
    torch.testing.assert_close(adam_weight[2], torch.tensor([-0.01, 0.01]))  # first Adam step: lr·sign
    assert adam.state["steps"].tolist() == [0, 0, 1, 0]
