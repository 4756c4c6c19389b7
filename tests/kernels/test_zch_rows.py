"""Reassigned rows start over: fresh embedding, zero optimizer state, with the project's sparse optimizers.

The check that matters: after ``reset_rows`` a row that an old id trained behaves, under
``RowWiseAdagrad`` and ``LazyAdam``, bit for bit like a row that was never trained and holds the same
values; the other rows keep their weights and state.
"""

from __future__ import annotations

import pytest
import torch

from freescale.kernels.zch import ZchTable
from freescale.kernels.zch_rows import hashed_uniform, reset_rows
from freescale.kernels.zch_types import ZchConfig
from freescale.trainer.engines.sparse_optim import LazyAdam, RowWiseAdagrad

ROWS, DIM = 12, 4


def make_optimizer(kind: str) -> RowWiseAdagrad:
    if kind == "adagrad":
        return RowWiseAdagrad(ROWS, DIM, lr=0.1, eps=1e-8, device=torch.device("cpu"))
    return LazyAdam(ROWS, DIM, lr=0.01, eps=1e-8, betas=(0.9, 0.999), device=torch.device("cpu"))


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_reset_row_trains_like_a_fresh_row(kind: str) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(ROWS, DIM, generator=generator)
    optimizer = make_optimizer(kind)
    for _ in range(3):
        rows = torch.tensor([1, 3, 5, 7])
        optimizer.step(weight, rows, torch.randn(4, DIM, generator=generator))
    kept_weight = weight.clone()
    kept_state = {k: v.clone() for k, v in optimizer.state.items()}

    reset = torch.tensor([3, 8])
    reset_rows(weight, reset, optimizer.state, seed=1, table=2, step=3)
    fresh_values = hashed_uniform(reset, DIM, bound=(1 / ROWS) ** 0.5, seed=1, table=2, step=3)
    assert torch.equal(weight[reset], fresh_values)
    others = torch.tensor([r for r in range(ROWS) if r not in reset.tolist()])
    assert torch.equal(weight[others], kept_weight[others])
    for name, tensor in optimizer.state.items():
        assert not tensor[reset].any(), name
        assert torch.equal(tensor[others], kept_state[name][others]), name

    grads = torch.randn(1, DIM, generator=generator)
    optimizer.step(weight, torch.tensor([3]), grads)
    fresh_weight, fresh_optimizer = fresh_values[:1].clone(), make_optimizer(kind)
    fresh_optimizer_rows = torch.tensor([0])
    fresh_optimizer.step(fresh_weight, fresh_optimizer_rows, grads)
    assert torch.equal(weight[3], fresh_weight[0])
    for name, tensor in optimizer.state.items():
        assert torch.equal(tensor[3], fresh_optimizer.state[name][0]), name


def test_reset_with_an_embedding_module_and_table_lookup() -> None:
    """The rows a lookup reassigns are the rows to reset; the fallback row and held rows stay."""
    config = ZchConfig(zch_size=8, bucket_size=4, max_probe=4, policy="lru")
    table, embedding = ZchTable(config), torch.nn.Embedding(config.num_rows, DIM)
    optimizer = RowWiseAdagrad(config.num_rows, DIM, lr=0.1, eps=1e-8, device=torch.device("cpu"))
    optimizer.state["momentum"].fill_(1.0)
    before = embedding.weight.detach().clone()
    result = table.lookup(torch.tensor([11, 22, 11]))
    reset_rows(embedding, result.reassigned, optimizer.state, step=int(table.step))
    changed = (embedding.weight != before).any(dim=1).nonzero().squeeze(1)
    assert changed.tolist() == result.reassigned.tolist() and len(changed) == 2
    assert (optimizer.state["momentum"] == 0).nonzero().squeeze(1).tolist() == result.reassigned.tolist()


def test_hashed_uniform_is_a_function_of_its_key() -> None:
    rows = torch.tensor([0, 5, 5, 1_000_000])
    a = hashed_uniform(rows, 16, bound=0.5, seed=3, table=1, step=9)
    assert torch.equal(a, hashed_uniform(rows, 16, bound=0.5, seed=3, table=1, step=9))
    assert torch.equal(a[1], a[2]) and not torch.equal(a[0], a[1])
    assert not torch.equal(a, hashed_uniform(rows, 16, bound=0.5, seed=3, table=1, step=10))
    assert not torch.equal(a, hashed_uniform(rows, 16, bound=0.5, seed=3, table=2, step=9))
    assert a.dtype == torch.float32 and float(a.min()) >= -0.5 and float(a.max()) < 0.5
    many = hashed_uniform(torch.arange(4096), 8, bound=1.0)
    assert abs(float(many.mean())) < 0.02 and abs(float(many.std()) - (1 / 3) ** 0.5) < 0.02


def test_hashed_uniform_with_a_step_per_row_equals_row_by_row() -> None:
    rows, steps = torch.tensor([0, 5, 5, 1_000_000, 7]), torch.tensor([9, 9, 10, 0, 123456789])
    together = hashed_uniform(rows, 16, bound=0.5, seed=3, table=1, step=steps)
    for i in range(len(rows)):
        one = hashed_uniform(rows[i : i + 1], 16, bound=0.5, seed=3, table=1, step=int(steps[i]))
        assert torch.equal(together[i : i + 1], one)


def test_state_without_a_row_per_entry_is_refused() -> None:
    weight = torch.zeros(ROWS, DIM)
    with pytest.raises(ValueError, match="optimizer state 'step' has shape"):
        reset_rows(weight, torch.tensor([1]), {"step": torch.tensor(4.0)})
    assert not weight.any()
