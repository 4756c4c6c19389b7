"""Training that fails loudly: pessimistic evaluation of ties and NaN, non-finite steps, launcher
validation, empty steps, metrics on resume, checkpoint trust, hung and orphaned ranks.

One-process pieces run on a single-rank gloo group in this process; multi-rank cases start
``freescale train`` with 2 gloo ranks on the ``tiny`` preset (``train_cli``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from freescale.trainer.data import CollateConfig
from freescale.trainer.evaluate import evaluate

NUM_ITEMS = 50


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory) -> Any:
    """A gloo process group of this process alone (evaluation and the skip vote are collectives)."""
    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def eval_samples(users: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    samples = []
    for user in range(users):
        n = int(rng.integers(3, 9))
        samples.append(
            {
                "item_ids": rng.integers(0, NUM_ITEMS, n),
                "actions": rng.integers(0, 3, n),
                "timestamps": np.cumsum(rng.integers(1, 1000, n)),
                "cost": float(n * n),
                "user_id": user,
                "window": 0,
                "length": n,
            }
        )
    return samples


class TableEngine:
    """An engine stand-in whose item table and queries the test chooses (``evaluate``'s hooks only)."""

    device = torch.device("cpu")

    def __init__(self, table: torch.Tensor, query: str) -> None:
        self.table, self.query = table, query

    def encode(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        last = batch.last_input_rows()
        target_ids = batch.item_ids[batch.target_index[last]]
        targets = self.table[target_ids]
        queries = targets.clone() if self.query == "target" else torch.full_like(targets, float("nan"))
        return queries, targets, target_ids

    def lookup_items(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]

    def local_item_rows(self) -> tuple[int, torch.Tensor]:
        return 0, self.table


def run_eval(table: torch.Tensor, query: str, num_candidates: int) -> dict[str, Any]:
    cfg = CollateConfig(num_items=NUM_ITEMS, num_actions=4, max_len=64, num_negatives=4, inbatch_negatives=0)
    return evaluate(TableEngine(table, query), eval_samples(40), cfg, num_candidates, k=10)


@pytest.mark.parametrize("num_candidates", [0, 30])
def test_tied_and_nan_scores_are_not_hits(one_rank_group, num_candidates: int) -> None:
    torch.manual_seed(0)
    distinct = torch.randn(NUM_ITEMS, 8)
    exact = run_eval(distinct, "target", num_candidates)  # query = target row: the unique best
    assert exact["hr@10"] == 1.0 and exact["ndcg@10"] == 1.0
    tied = run_eval(torch.ones(NUM_ITEMS, 8), "target", num_candidates)  # every item scores the same
    assert tied["hr@10"] == 0.0 and tied["ndcg@10"] == 0.0
    diverged = run_eval(distinct, "nan", num_candidates)
    assert diverged["users"] == 40 and diverged["hr@10"] == 0.0 and diverged["ndcg@10"] == 0.0
