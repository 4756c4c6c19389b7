"""Sharded tables (trainer/engines/sharded.py): shards concatenate to the whole table, routing notes
travel with the ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freescale.trainer.engines.input_dist import append_notes, split_notes
from freescale.trainer.engines.table_layout import TableSpec, init_rows, shard_bounds


def test_table_shards_concatenate_to_the_whole_table() -> None:
    rows, world = 10_000, 3
    spec = TableSpec("item", rows, 4, ("item",))
    whole = init_rows(7, 1, spec, 0, rows)
    pieces = [init_rows(7, 1, spec, *shard_bounds(rows, world, r)) for r in range(world)]
    assert torch.equal(torch.cat(pieces), whole)
    assert shard_bounds(rows, world, 2) == (6668, 10_000)
    assert whole.abs().max() <= (1 / rows) ** 0.5 < whole.abs().max() * 1.01  # TorchRec's range by default
    wide = init_rows(7, 1, TableSpec("item", rows, 4, ("item",), init_bound=0.5), 0, rows)
    assert torch.allclose(wide, whole * (0.5 / (1 / rows) ** 0.5), atol=1e-6)  # the same draws, scaled


@pytest.mark.parametrize(
    ("mode", "gain", "rows", "expected"),
    [
        ("rows", 1.0, 10_000, 0.01),  # TorchRec's sqrt(1/rows)
        ("rows", 2.0, 10_000, 0.02),
        ("dim", 0.25, 10_000, 0.25 / 8),  # d = 64: any table size
        ("dim", 0.25, 6, 0.25 / 8),
        ("floor", 0.25, 10_000, 0.25 / 8),  # a large table: dim's
        ("floor", 0.25, 6, (1 / 6) ** 0.5),  # a small one (actions): TorchRec's
        ("rows", 0.0, 10_000, 0.01),  # gain 0: the mode's default, 1.0 for rows
        ("dim", 0.0, 10_000, 0.25 / 8),  # and 0.25 for dim and floor
        ("floor", 0.0, 10_000, 0.25 / 8),
    ],
)
def test_embedding_init_modes_give_each_table_its_range(mode: str, gain: float, rows: int, expected: float) -> None:
    from freescale.trainer.engines.engine import init_bound
    from freescale.trainer.learning_config import ModelExtraConfig

    extra = ModelExtraConfig(embedding_init=mode, embedding_init_gain=gain)
    assert init_bound(TableSpec("item", rows, 64, ("item",)), extra) == pytest.approx(expected)
    assert ModelExtraConfig().embedding_init == "floor"  # the default


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("note_length", [0, 1, 4])
def test_routing_notes_travel_with_the_ids_and_come_apart_again(world: int, note_length: int) -> None:
    """``append_notes`` / ``split_notes`` across an emulated all-to-all: every destination gets its ids
    in source order and every source's note, whatever the (possibly empty) splits."""
    rng = np.random.default_rng(world * 10 + note_length)
    splits = [rng.integers(0, 4, world).tolist() for _ in range(world)]  # splits[s][d]: ids s sends d
    ids = [torch.from_numpy(rng.integers(0, 1000, sum(sp))) for sp in splits]
    notes = [torch.arange(note_length, dtype=torch.int64) + 100 * s for s in range(world)]
    sent = [append_notes(ids[s], splits[s], notes[s]) for s in range(world)]
    for d in range(world):
        chunks = []
        for s in range(world):
            start = sum(splits[s][:d]) + d * note_length
            chunks.append(sent[s][start : start + splits[s][d] + note_length])
        got_ids, got_notes = split_notes(torch.cat(chunks), [sp[d] for sp in splits], [note_length] * world)
        expected = [ids[s][sum(splits[s][:d]) : sum(splits[s][: d + 1])] for s in range(world)]
        assert torch.equal(got_ids, torch.cat(expected))
        assert len(got_notes) == world and all(torch.equal(a, b) for a, b in zip(got_notes, notes))
