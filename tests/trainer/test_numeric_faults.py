"""Training that fails loudly on numbers: pessimistic evaluation of ties and NaN, non-finite steps that
update nothing and stop the run after the allowed skips, steps without targets.

One-process pieces run on a single-rank gloo group in this process; the run case starts
``freescale train`` on the ``tiny`` preset (``train_cli``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from freescale.pipeline.dataset.samples import CollateConfig
from freescale.trainer.engines.engine import ItemShard
from freescale.trainer.eval.evaluate import evaluate

NUM_ITEMS = 50


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

    def local_item_rows(self) -> ItemShard:
        return ItemShard(0, self.table)


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


# non-finite steps --------------------------------------------------------------------------------
def tiny_run_config(overlap: str, temperature: float) -> Any:
    from freescale.trainer.config import RunConfig

    return RunConfig.from_dict(
        {
            "model": {"d_model": 16, "num_layers": 1, "num_heads": 2, "num_negatives": 4, "max_uih_len": 64},
            "model_extra": {"num_items": NUM_ITEMS, "num_actions": 4, "temperature": temperature},
            "data": {"path": "unused"},
            "engine": {"overlap": overlap},
        }
    )


def training_state(engine: Any) -> dict[str, torch.Tensor]:
    """Every parameter and optimizer state a step may touch, copied."""
    state = {f"model.{k}": v.clone() for k, v in engine.model.state_dict().items()}
    state.update({k: v.clone() for k, v in engine.tables.local_state().items()})
    for index, values in engine.dense_optimizer.state_dict()["state"].items():
        state.update({f"dense_optimizer.{index}.{k}": torch.as_tensor(v).clone() for k, v in values.items()})
    return state


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    return sorted(
        k for k in set(before) | set(after) if k not in before or k not in after or not torch.equal(before[k], after[k])
    )


@pytest.mark.parametrize("overlap", ["none", "pec"])
def test_nonfinite_step_updates_nothing(one_rank_group, overlap: str) -> None:
    from freescale.trainer.data.batches import collate
    from freescale.trainer.run_data import collate_config
    from freescale.trainer.runner import make_engine

    cfg = tiny_run_config(overlap, temperature=1e-45)  # logits overflow: the loss is NaN/inf
    engine = make_engine(cfg, 0, 1, torch.device("cpu"), cfg.engine.overlap)
    batches = iter([collate(eval_samples(8, seed=s), collate_config(cfg), s, 0) for s in range(3)])
    try:
        before = training_state(engine)
        engine.step(batches)
        engine.settle()
        assert engine.nonfinite
        assert changed(before, training_state(engine)) == []
        cfg.model_extra.temperature = 0.05  # a finite step afterwards trains as usual
        engine.step(batches)
        engine.settle()
        assert not engine.nonfinite
        touched = changed(before, training_state(engine))
        assert any(k.startswith("tables.item") for k in touched) and any(k.startswith("model.") for k in touched)
    finally:
        engine.close()


@pytest.mark.slow
def test_nonfinite_loss_stops_the_run_after_the_allowed_skips(tiny_dataset, tmp_path) -> None:
    from train_cli import run_toml, run_train

    config = run_toml(
        tmp_path / "run.toml",
        tiny_dataset,
        tmp_path / "out",
        model_extra={"temperature": 1e-45},  # logits overflow from the first step on
        engine={"max_nonfinite_skips": 2},
    )
    result = run_train(config, tmp_path)
    assert result.returncode != 0
    assert "step 2: non-finite loss or gradient" in result.stderr, result.stderr[-3000:]
    assert "engine.max_nonfinite_skips = 2" in result.stderr
    assert "step 0: non-finite loss or gradient, step skipped" in result.stdout
    assert "Traceback" not in result.stderr


def test_steps_without_targets_are_reported_empty_and_left_out_of_the_loss() -> None:
    from freescale.trainer.metrics.bubbles import analyze, step_metrics
    from freescale.trainer.metrics.instrument import StageSpan, StepRecord

    def record(step: int, rank: int, loss: float, positions: int) -> StepRecord:
        stages = [StageSpan("forward", "compute", 0.0, 1.0)]
        return StepRecord(step, rank, 0.0, 1.0, stages, [], loss=loss, samples=4, positions=positions)

    mixed, empty = analyze([[record(0, 0, 2.0, 5), record(1, 0, 0.0, 0)], [record(0, 1, 0.0, 0), record(1, 1, 0.0, 0)]])
    assert step_metrics(mixed)["loss"] == 2.0 and "empty" not in step_metrics(mixed)
    assert step_metrics(empty)["loss"] is None and step_metrics(empty)["empty"] is True
    assert step_metrics(mixed)["rank_loss"] == [2.0, None] and step_metrics(empty)["rank_loss"] == [None, None]
    (diverged,) = analyze([[record(0, 0, float("nan"), 5)], [record(0, 1, 3.0, 5)]])
    assert step_metrics(diverged)["rank_loss"] == [None, 3.0]
