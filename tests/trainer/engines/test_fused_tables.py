"""Fused table storage (trainer/engines/fused_tables.py): per-table views of one tensor, and one update
of every table's rows that gives the bits separate per-table tensors and optimizers give."""

from __future__ import annotations

import pytest
import torch

from freescale.trainer.engines.fused_tables import FusedTables
from freescale.trainer.engines.sparse_optim import make_sparse_optimizer, sum_by_row
from freescale.trainer.engines.table_layout import TableSpec, init_rows, shard_bounds
from freescale.trainer.learning_config import OptimizerConfig

DIM = 8
TABLE_ROWS = [50, 3, 20]  # with 4 ranks, rank 3 holds nothing of the 3-row table


def shards(rank: int, world: int) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
    bounds = [shard_bounds(rows, world, rank) for rows in TABLE_ROWS]
    specs = [TableSpec(f"t{t}", rows, DIM, (f"t{t}",)) for t, rows in enumerate(TABLE_ROWS)]
    return [init_rows(5, t, spec, lo, hi) for t, (spec, (lo, hi)) in enumerate(zip(specs, bounds))], bounds


@pytest.mark.parametrize("sparse", ["rowwise_adagrad", "adam"])
@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 2), (3, 4)])
def test_one_fused_update_gives_the_bits_of_per_table_updates(sparse: str, rank: int, world: int) -> None:
    cfg = OptimizerConfig(sparse=sparse, sparse_lr=0.1)
    initial, bounds = shards(rank, world)
    fused = FusedTables(initial, bounds, cfg, torch.device("cpu"))
    separate = [rows.clone() for rows in initial]
    optimizers = [make_sparse_optimizer(cfg, hi - lo, DIM, torch.device("cpu")) for lo, hi in bounds]
    generator = torch.Generator().manual_seed(rank)
    for _ in range(3):
        tables = torch.randint(0, len(TABLE_ROWS), (60,), generator=generator)
        tables = tables[torch.tensor([bounds[t][1] > bounds[t][0] for t in tables.tolist()])]
        lo, hi = (torch.tensor([b[i] for b in bounds])[tables] for i in (0, 1))
        ids = lo + (torch.rand(tables.numel(), generator=generator) * (hi - lo)).long()  # duplicates too
        grads = torch.randn(tables.numel(), DIM, generator=generator)
        fused.update(fused.index(ids, tables), grads)
        for t, (weight, optimizer) in enumerate(zip(separate, optimizers)):
            in_table = tables == t
            optimizer.step(weight, *sum_by_row(ids[in_table] - bounds[t][0], grads[in_table]))
    for t in range(len(TABLE_ROWS)):
        assert torch.equal(fused.weights[t], separate[t])
        for key, tensor in optimizers[t].state.items():
            assert torch.equal(fused.optimizers[t].state[key], tensor), key


def test_per_table_views_write_into_the_fused_storage_and_read_its_updates() -> None:
    initial, bounds = shards(1, 2)
    fused = FusedTables(initial, bounds, OptimizerConfig(sparse="adam"), torch.device("cpu"))
    assert [w.shape[0] for w in fused.weights] == [hi - lo for lo, hi in bounds]
    assert all(w.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr() for w in fused.weights)
    fused.weights[2][0] = 7.0  # a checkpoint load / zch reset writes one table's view
    fused.optimizers[2].state["steps"][0] = 3.0
    row = fused.index(torch.tensor([bounds[2][0]]), torch.tensor([2]))
    assert torch.equal(fused.gather(row), torch.full((1, DIM), 7.0))
    assert fused.state_rows(row)[0, -1] == 3.0  # adam packs exp_avg, exp_avg_sq, steps
    fused.update(row, torch.ones(1, DIM))
    assert fused.optimizers[2].state["steps"][0] == 4.0
    assert not torch.equal(fused.weights[2][0], torch.full((DIM,), 7.0))
