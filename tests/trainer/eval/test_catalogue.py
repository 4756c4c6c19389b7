"""Item-level ranking (trainer/eval/catalogue.py, ``eval.catalogue``): every item of the evaluated
catalogue is a candidate scored by the row it reads, so a modulo table's collisions count against it;
the sampled protocol draws catalogue items."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.pipeline.dataset.samples import CollateConfig
from freescale.pipeline.dataset.vocabulary import UnknownIdError, Vocabulary
from freescale.trainer.engines.engine import ItemShard
from freescale.trainer.eval.catalogue import _my_chunks, eval_catalogue, row_weights
from freescale.trainer.eval.evaluate import evaluate


class _HistoryWinsEngine:
    """Queries = last history item's row + half the target's over ``table``'s rows (orthonormal by
    default: the history row scores 1, the target's 0.5, every other row 0). Batches hold rows."""

    device = torch.device("cpu")

    def __init__(self, table: torch.Tensor, is_item: torch.Tensor | None = None) -> None:
        self.table, self.is_item = table, is_item

    def encode(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        last = batch.last_input_rows()
        target_ids = batch.item_ids[batch.target_index[last]]
        history_ids = batch.item_ids[batch.input_index[last]]
        return self.table[history_ids] + 0.5 * self.table[target_ids], self.table[target_ids], target_ids

    def catalogue_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def lookup_items(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]

    def local_item_rows(self) -> ItemShard:
        return ItemShard(0, self.table, self.is_item)


def _samples(pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """One user per (history raw id, target raw id)."""
    return [
        {"item_ids": np.array(pair, np.int64), "actions": np.zeros(2, np.int64), "timestamps": np.arange(2),
         "cost": 1.0, "user_id": user, "window": 0, "length": 2}
        for user, pair in enumerate(pairs)
    ]  # fmt: skip


def _ranks(engine: Any, samples: list[dict[str, Any]], cfg: CollateConfig, catalogue: np.ndarray | None) -> dict:
    result = evaluate(engine, samples, cfg, num_candidates=0, k=10, keep_ranks=True, catalogue=catalogue)
    return dict(zip(result["ranks"].user_ids.tolist(), result["ranks"].ranks.tolist(), strict=True))


def test_a_modulo_tables_collisions_count_against_its_targets(one_rank_group):
    """8 modulo rows; the catalogue's items 3, 11, 19 share row 3, items 5, 13 row 5, item 7 is alone on
    row 7, and rows 0-2, 4, 6 hold no item. By rows every target ranks 1 (its history row beats it); by
    items the history row counts once per item on it, the other items on the target's row tie against
    it, and a history row holding no catalogue item is no candidate."""
    cfg = CollateConfig(num_items=8, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0)
    catalogue = np.array([3, 5, 7, 11, 13, 19], np.int64)
    engine = _HistoryWinsEngine(torch.eye(8))
    samples = _samples([(5, 3), (13, 7), (2, 7), (7, 11), (5, 5)])
    assert _ranks(engine, samples, cfg, None) == {0: 1, 1: 1, 2: 1, 3: 1, 4: 0}
    #                     history row 5: 2 items, target row 3: 2 others | 2 + 0 | 0 + 0 | 1 + 2 | target's row: 1 other
    assert _ranks(engine, samples, cfg, catalogue) == {0: 4, 1: 2, 2: 0, 3: 3, 4: 1}
    result = evaluate(engine, samples, cfg, num_candidates=0, k=1, catalogue=catalogue)
    assert result["catalogue"] == "items" and result["hr@1"] == 1 / 5
    assert evaluate(engine, samples, cfg, num_candidates=0, k=1)["catalogue"] == "rows"


def test_sampled_items_on_the_targets_row_tie_against_it_and_the_target_itself_is_left_out(one_rank_group):
    """The sampled protocol draws catalogue items: on the modulo table above, a drawn 11 or 19 (row 3,
    other items) ties against target 3, a drawn 3 is the target itself; by rows the row is the target."""
    cfg = CollateConfig(num_items=8, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0)
    catalogue = np.array([3, 5, 7, 11, 13, 19], np.int64)
    engine = _HistoryWinsEngine(torch.eye(8))
    samples = _samples([(5, 3)])  # the history row (5: items 5 and 13) beats the target, row 3 ties
    drawn = catalogue[torch.randint(0, 6, (400,), generator=torch.Generator().manual_seed(0)).numpy()]
    result = evaluate(engine, samples, cfg, num_candidates=400, k=1000, keep_ranks=True, catalogue=catalogue)
    assert result["catalogue"] == "items"
    assert result["ranks"].ranks.tolist() == [int(np.isin(drawn, [5, 13, 11, 19]).sum())]
    rows = evaluate(engine, samples, cfg, num_candidates=400, k=1000, keep_ranks=True)["ranks"].ranks.tolist()
    row_draws = torch.randint(0, 8, (400,), generator=torch.Generator().manual_seed(0)).numpy()
    assert rows == [int((row_draws == 5).sum())]  # by rows only row 5 beats it


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(2, 40), users=st.integers(1, 30))
def test_under_exact_ids_items_and_rows_rank_alike(one_rank_group, seed: int, rows: int, users: int):
    """The exact table is the vocabulary: ranking its items is ranking its rows, ties and all."""
    rng = np.random.default_rng(seed)
    raw = np.sort(rng.choice(10_000, rows, replace=False)).astype(np.int64)
    cfg = CollateConfig(
        num_items=rows, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0,
        item_vocab=Vocabulary("item", raw),
    )  # fmt: skip
    table = torch.from_numpy(rng.integers(-2, 3, (rows, 4))).float()  # small integers: ties happen
    pairs = [tuple(int(i) for i in rng.choice(raw, 2)) for _ in range(users)]
    engine = _HistoryWinsEngine(table)
    assert _ranks(engine, _samples(pairs), cfg, raw) == _ranks(engine, _samples(pairs), cfg, None)
    sampled = [
        evaluate(engine, _samples(pairs), cfg, num_candidates=16, k=5, keep_ranks=True, catalogue=catalogue)
        for catalogue in (raw, None)
    ]
    assert sampled[0]["ranks"].ranks.tolist() == sampled[1]["ranks"].ranks.tolist()


class _HeldEngine(_HistoryWinsEngine):
    """Raw ids as batches hold them under zch; ids >= ``held`` are not in the identity table (-1)."""

    held = 24

    def catalogue_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.where(ids < self.held, ids, -1)


def test_catalogue_items_without_a_row_are_no_candidates(one_rank_group):
    table = torch.eye(32)
    engine = _HeldEngine(table, is_item=torch.arange(32) < 24)
    cfg = CollateConfig(
        num_items=32, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0,
        item_pool=np.arange(40, dtype=np.int64),
    )  # fmt: skip
    weights = row_weights(engine, cfg, np.arange(40, dtype=np.int64))
    assert weights.tolist() == [1] * 24 + [0] * 8
    assert torch.equal(weights, row_weights(engine, cfg, None))


def test_a_catalogue_id_outside_an_exact_vocabulary_is_named(one_rank_group):
    cfg = CollateConfig(
        num_items=3, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0,
        item_vocab=Vocabulary("item", np.array([4, 8, 9], np.int64)),
    )  # fmt: skip
    with pytest.raises(UnknownIdError, match=r"^eval catalogue: item id 5 is not in"):
        row_weights(_HistoryWinsEngine(torch.eye(3)), cfg, np.array([4, 5], np.int64))


@given(size=st.integers(0, 300_000), world=st.integers(1, 8))
@settings(max_examples=40, deadline=None)
def test_every_rank_maps_its_share_in_as_many_calls(size: int, world: int):
    catalogue = np.arange(size, dtype=np.int64)
    shares = [_my_chunks(catalogue, rank, world) for rank in range(world)]
    assert len({len(chunks) for chunks in shares}) == 1  # collective lookups: equal counts
    parts = [chunk for chunks in shares for chunk in chunks]
    assert np.array_equal(np.concatenate(parts) if parts else catalogue, catalogue)


class _NoVocabulary:
    uri = "s3://bucket/old-prepared"

    def vocabulary(self, table: str) -> None:
        return None


def test_items_need_the_evaluated_datasets_vocabulary():
    with pytest.raises(ValueError, match=r"^s3://bucket/old-prepared has no item vocabulary .* = 'rows'"):
        eval_catalogue("items", _NoVocabulary())
    assert eval_catalogue("rows", _NoVocabulary()) is None
