"""The evaluation protocol (trainer/eval/protocol.py, data.held_out, evaluate's exclude_history) and the id
tables the trainer sizes from a prepared dataset's vocabularies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from train_cli import FREESCALE, MODEL, prepare_tiny, run_toml, train

from freescale.pipeline.config import SampleConfig
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.pipeline.dataset.vocabulary import Vocabulary
from freescale.pipeline.steps.sequences import _window_bounds
from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import collate, split_query
from freescale.trainer.engines.engine import ItemShard
from freescale.trainer.eval.evaluate import EvalRanks, evaluate, metrics_from_ranks
from freescale.trainer.eval.protocol import BestTracker, TableSizeError, resolve_tables
from freescale.trainer.launch import check_table_sizes


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 40),
    stride=st.integers(0, 4),
    max_len=st.integers(3, 12),
    holdout=st.sampled_from([1, 2]),
)
def test_validation_and_test_items_never_become_training_targets(count, stride, max_len, holdout):
    """Every sample ``prepare`` cuts from one user (windows included), collated for training: no
    target is one of the user's last ``holdout`` events, and everything else still is a target."""
    events = np.arange(count, dtype=np.int64)  # event k of the user has item id k
    cfg = SampleConfig(max_uih_len=max_len, window_stride=stride, min_len=1)
    bounds = _window_bounds(np.zeros(1, np.int64), np.array([count]), cfg)
    samples = [
        {
            "item_ids": events[b:e],
            "actions": np.zeros(e - b, np.int64),
            "timestamps": events[b:e],
            "length": e - b,
            "window": int(w),
            "cost": 1.0,
            "user_id": 0,
        }
        for b, e, w in zip(bounds["begin"], bounds["end"], bounds["window"], strict=True)
    ]
    collate_cfg = CollateConfig(
        num_items=count, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0,
        holdout_events=holdout, window_stride=stride,
    )  # fmt: skip
    batch = collate(samples, collate_cfg, step=0, rank=0)
    targets = set(batch.item_ids[batch.target_index].tolist())
    if count >= holdout + 1:  # an evaluated user: the held-out events are never targets
        assert not targets & set(range(count - holdout, count))
    if stride == 0 and count >= 2:  # one window: every other event but the first is a target
        evaluated = count >= holdout + 1
        expected = set(range(max(1, count - max_len), count - (holdout if evaluated else 0)))
        assert targets == expected - {max(0, count - max_len)}


def test_split_queries_put_the_validation_item_in_the_test_history():
    sample = {"item_ids": np.array([5, 6, 7, 8]), "actions": np.zeros(4), "timestamps": np.arange(4), "length": 4}
    validation, test = split_query(sample, "validation"), split_query(sample, "test")
    assert validation["item_ids"].tolist() == [5, 6, 7] and validation["length"] == 3  # target 7
    assert test["item_ids"].tolist() == [5, 6, 7, 8]  # target 8, history holds the validation item 7


def test_best_tracker_picks_the_best_validation_and_stops_after_patience():
    tracker = BestTracker("ndcg@10", patience=2)
    scores = [(10, 0.10), (20, 0.30), (30, 0.30), (40, 0.25)]
    improved = [tracker.offer(step, {"ndcg@10": value}) for step, value in scores]
    assert improved == [True, True, False, False]  # a tie keeps the earlier step
    assert tracker.best.step == 20 and tracker.should_stop
    assert tracker.report()["best_step"] == 20 and tracker.report()["stopped_early"]
    assert not BestTracker("hr@10", patience=0).should_stop


class _FakeDataset:
    uri = "data/x"

    def __init__(self, items: int | None) -> None:
        self.items = items

    def vocabulary(self, table: str) -> Vocabulary | None:
        size = self.items if table == "item" else 3
        return None if size is None else Vocabulary(table, np.arange(size, dtype=np.int64) * 1000)

    def table_sizes(self) -> dict[str, int]:
        return {t: v.size for t in ("item", "action") if (v := self.vocabulary(t)) is not None}


def _cfg(**extra: Any) -> RunConfig:
    return RunConfig.from_dict({"data": {"path": "data/x"}, "model_extra": extra})


def test_table_sizes_come_from_the_vocabulary_and_too_small_ones_are_refused():
    tables = resolve_tables(_cfg(), _FakeDataset(770))
    assert (tables.num_items, tables.num_actions, tables.mode) == (770, 3, "exact")
    assert resolve_tables(_cfg(num_items=800), _FakeDataset(770)).num_items == 800  # more rows: allowed
    with pytest.raises(TableSizeError, match="num_items = 100 is smaller than the 770 item ids"):
        resolve_tables(_cfg(num_items=100), _FakeDataset(770))
    with pytest.raises(ValueError, match="num_items = 100 is smaller than the 770 item ids"):
        check_table_sizes(_cfg(num_items=100), {"item": 770})
    with pytest.raises(TableSizeError, match="no id vocabulary"):
        resolve_tables(_cfg(), _FakeDataset(None))
    hashed = resolve_tables(_cfg(ids="hashed", num_items=500), _FakeDataset(770))
    # ids 0, 1000, 2000, ...: modulo 500 every id shares its row (x000 % 500 == 0 for even x)
    assert hashed.mode == "hashed" and hashed.hash_collision_rate == 1.0 and "hash_collision_rate" in hashed.describe()
    with pytest.raises(ValueError, match=r"model_extra\.num_items must be set with model_extra\.ids 'hashed'"):
        _cfg(ids="hashed")


class _LastItemEngine:
    """Queries = last history item's row + half the target's, over orthonormal item rows: the last
    history item always outranks the target, which outranks everything else."""

    device = torch.device("cpu")

    def __init__(self, items: int) -> None:
        self.table = torch.eye(items)

    def encode(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        last = batch.last_input_rows()
        target_ids = batch.item_ids[batch.target_index[last]]
        history_ids = batch.item_ids[batch.input_index[last]]
        return self.table[history_ids] + 0.5 * self.table[target_ids], self.table[target_ids], target_ids

    def local_item_rows(self) -> ItemShard:
        return ItemShard(0, self.table)


def test_exclude_history_leaves_history_items_out_of_the_full_ranking(one_rank_group):
    rng = np.random.default_rng(0)
    samples = [
        {"item_ids": rng.permutation(32)[:5], "actions": np.zeros(5, np.int64), "timestamps": np.arange(5),
         "cost": 1.0, "user_id": u, "window": 0, "length": 5}
        for u in range(20)
    ]  # fmt: skip
    cfg = CollateConfig(num_items=32, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0)
    engine = _LastItemEngine(32)
    plain = evaluate(engine, samples, cfg, num_candidates=0, k=1)
    excluded = evaluate(engine, samples, cfg, num_candidates=0, k=1, exclude_history=True)
    assert plain["hr@1"] == 0.0 and plain["protocol"] == "full"
    assert excluded["hr@1"] == 1.0 and excluded["protocol"] == "full-exclude-history"


def test_per_user_ranks_follow_their_users_and_give_the_metrics(one_rank_group, tmp_path: Path):
    """``keep_ranks``: each user's rank, in a CSV that reads back to the same HR@k / NDCG@k."""
    samples = [
        {"item_ids": np.array([u % 7, 10 + u]), "actions": np.zeros(2, np.int64), "timestamps": np.arange(2),
         "cost": 1.0, "user_id": 1000 + u, "window": 0, "length": 2}
        for u in range(9, -1, -1)
    ]  # fmt: skip
    cfg = CollateConfig(num_items=32, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0)
    result = evaluate(_LastItemEngine(32), samples, cfg, num_candidates=0, k=1, keep_ranks=True)
    per_user = result.pop("ranks")
    assert sorted(per_user.user_ids.tolist()) == list(range(1000, 1010))
    assert result["hr@1"] == 0.0 and (per_user.ranks == 1).all()  # the history row beats every target
    per_user.write_csv(tmp_path / "eval_ranks" / "test.csv")
    back = EvalRanks.read_csv(tmp_path / "eval_ranks" / "test.csv")
    assert back.user_ids.tolist() == per_user.user_ids.tolist() and back.ranks.tolist() == per_user.ranks.tolist()
    assert metrics_from_ranks(back.ranks, 1) == {k: v for k, v in result.items() if "@" in k}
    assert "ranks" not in evaluate(_LastItemEngine(32), samples, cfg, num_candidates=0, k=1)


class _PhantomRowsEngine(_LastItemEngine):
    """As ``_LastItemEngine``, but the rows of the history items stand for no item (a zero-collision
    table's empty slots): ranking must skip them as it skips excluded history."""

    def local_item_rows(self) -> ItemShard:
        return ItemShard(0, self.table, self.is_item)


def test_rows_that_stand_for_no_item_are_no_candidates(one_rank_group):
    rng = np.random.default_rng(1)
    samples = [
        {"item_ids": np.array([u, 20 + u % 5]), "actions": np.zeros(2, np.int64), "timestamps": np.arange(2),
         "cost": 1.0, "user_id": u, "window": 0, "length": 2}
        for u in rng.permutation(20)
    ]  # fmt: skip
    cfg = CollateConfig(num_items=32, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0)
    engine = _PhantomRowsEngine(32)
    engine.is_item = torch.ones(32, dtype=torch.bool)
    assert evaluate(engine, samples, cfg, num_candidates=0, k=1)["hr@1"] == 0.0  # the history row wins
    engine.is_item[:20] = False  # the history rows are empty slots: the target ranks first
    assert evaluate(engine, samples, cfg, num_candidates=0, k=1)["hr@1"] == 1.0


def test_evaluate_reproduces_the_best_checkpoint_figures(tmp_path: Path):
    """A run with periodic validation keeps the best-validation checkpoint and reports its validation
    and test figures; ``freescale evaluate`` on that checkpoint gives the same figures exactly."""
    data = prepare_tiny(tmp_path)
    config = run_toml(
        tmp_path / "run.toml",
        data,
        tmp_path / "out",
        model={**MODEL, "max_uih_len": 32},  # below prepare's 64: the run counts what it cuts
        model_extra={"num_items": 0, "num_actions": 0},
        data={"max_steps": 40},
        optimizer={"dense_lr": 0.003, "sparse_lr": 0.02},
        eval={"max_users": -1, "every": 10, "patience": 2, "write_ranks": True},
        checkpoint={"dir": str(tmp_path / "ckpt")},
    )
    result = train(config, tmp_path)
    report = json.loads((tmp_path / "out" / "bubbles.json").read_text())
    protocol = report["protocol"]
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    evals = {line["step"]: line["eval"] for line in lines if "eval" in line}
    assert all(e["split"] == "validation" for e in evals.values())
    best_step = max(evals, key=lambda step: (evals[step]["ndcg@10"], -step))
    assert protocol["best_step"] == best_step and protocol["validation"] == evals[best_step]
    assert protocol["best_checkpoint"].endswith(f"best/step_{best_step:08d}")
    for step, line in evals.items():  # eval.write_ranks: every user's rank, giving the line's figures
        per_user = EvalRanks.read_csv(Path(line["ranks_file"]))
        assert line["ranks_file"].endswith(f"eval_ranks/validation_step{step:08d}.csv")
        assert len(set(per_user.user_ids.tolist())) == len(per_user.ranks) == line["users"]
        assert metrics_from_ranks(per_user.ranks, 10) == {k: line[k] for k in ("hr@10", "ndcg@10")}
    test_ranks = EvalRanks.read_csv(Path(protocol["test"]["ranks_file"]))
    assert [p.name for p in (tmp_path / "ckpt" / "best").iterdir()] == [f"step_{best_step:08d}"]
    users = protocol["validation"]["users"]
    assert users == protocol["test"]["users"] > 150  # every evaluable user of the tiny preset
    assert report["training"]["ids"] == "exact" and report["training"]["num_items"] > 0
    # each event cut once, not once per epoch: the run read every micro-batch two epochs or more
    dataset = PreparedDataset(data)
    assert report["training"]["steps"] >= 2 * dataset.steps_per_epoch(2)
    cut = CollateConfig(num_items=10**12, num_actions=10**6, max_len=32, num_negatives=1, inbatch_negatives=0)
    once = sum(collate(dataset.micro_batch(m), cut, 0, 0).truncated for m in range(dataset.n_micro_batches))
    assert report["training"]["events_truncated_by_model_max_uih_len"] == once > 0
    assert "model.max_uih_len 32 < prepare --max-uih-len 64" in result.stdout
    assert f"best checkpoint: {protocol['best_checkpoint']}" in result.stdout
    import subprocess

    evaluated = subprocess.run(
        [FREESCALE, "evaluate", "--config", config, "--checkpoint", protocol["best_checkpoint"], "--nproc", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    again = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    rewritten = EvalRanks.read_csv(Path(again["test"]["ranks_file"]))  # 2 ranks: the same users, same ranks
    assert dict(zip(rewritten.user_ids.tolist(), rewritten.ranks.tolist())) == dict(
        zip(test_ranks.user_ids.tolist(), test_ranks.ranks.tolist())
    )
    for split in ("validation", "test"):
        drop = {"seconds"}
        assert {k: v for k, v in again[split].items() if k not in drop} == {
            k: v for k, v in protocol[split].items() if k not in drop
        }


def test_full_softmax_scores_each_target_against_every_item_row():
    """``loss = "full_softmax"``: the negatives are the whole catalogue, and the shared-negatives loss
    with the target's own row masked is then exactly cross entropy over all rows."""
    import torch.nn.functional as F

    from freescale.trainer.data.batches import draw_negatives
    from freescale.trainer.model.transducer import sampled_softmax_loss

    cfg = CollateConfig(
        num_items=40, num_actions=1, max_len=64, num_negatives=8, inbatch_negatives=4, full_softmax=True
    )
    targets = np.array([3, 7, 7, 39])
    negatives = draw_negatives(targets, cfg, step=5, rank=1)
    assert negatives.tolist() == list(range(40))  # no sampling, no in-batch duplicates
    torch.manual_seed(0)
    table, queries = torch.randn(40, 8), torch.randn(4, 8)
    ids = torch.from_numpy(targets)
    loss = sampled_softmax_loss(queries, table[ids], table, ids, torch.from_numpy(negatives), 0.1)
    logits = F.normalize(queries, dim=-1) @ F.normalize(table, dim=-1).T / 0.1
    assert torch.allclose(loss, F.cross_entropy(logits, ids), atol=1e-5)
    assert RunConfig.from_dict({"data": {"path": "x"}, "model_extra": {"loss": "full_softmax"}}).model_extra.loss


def test_events_beyond_model_max_uih_len_are_counted():
    sample = {"item_ids": np.arange(10), "actions": np.zeros(10, np.int64), "timestamps": np.arange(10),
              "length": 10, "window": 0, "cost": 1.0, "user_id": 0}  # fmt: skip
    cfg = CollateConfig(num_items=10, num_actions=1, max_len=5, num_negatives=1, inbatch_negatives=0)
    batch = collate([sample], cfg, step=0, rank=0)
    assert batch.truncated == 3 and batch.lengths.tolist() == [5]  # 10 - 2 held out - 5 kept


def _figures(protocol: dict[str, Any]) -> dict[str, Any]:
    """A protocol report without wall times and checkpoint paths (they differ between runs)."""
    strip = {"seconds", "best_checkpoint", "history", "evaluations"}

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in strip}
        return value

    return clean(protocol)


def test_a_resumed_run_keeps_the_best_validation_of_before_the_resume(tmp_path: Path):
    data = prepare_tiny(tmp_path)
    common = {
        "model_extra": {"num_items": 0, "num_actions": 0},
        "optimizer": {"dense_lr": 0.003, "sparse_lr": 0.02},
        "eval": {"every": 2},
    }
    whole = run_toml(tmp_path / "a.toml", data, tmp_path / "a", data={"max_steps": 8}, **common)
    train(whole, tmp_path)
    first = run_toml(
        tmp_path / "b.toml", data, tmp_path / "b", data={"max_steps": 4}, checkpoint={"dir": str(tmp_path / "ck")},
        **common,
    )  # fmt: skip
    train(first, tmp_path)
    resumed = run_toml(
        tmp_path / "c.toml", data, tmp_path / "b", data={"max_steps": 8},
        checkpoint={"dir": str(tmp_path / "ck"), "resume": "latest"}, **common,
    )  # fmt: skip
    train(resumed, tmp_path)
    expected = json.loads((tmp_path / "a" / "bubbles.json").read_text())["protocol"]
    got = json.loads((tmp_path / "b" / "bubbles.json").read_text())["protocol"]
    assert got["evaluations"] == expected["evaluations"] == 4
    assert _figures(got) == _figures(expected)


def test_most_popular_scores_every_evaluated_users_held_out_items(tmp_path: Path) -> None:
    """The demo's and bench_quality's baseline: one target per evaluated user and split, ranked by
    training frequency, where the held-out items themselves are not training events."""
    from train_cli import prepare_tiny

    from freescale.pipeline.dataset.reader import PreparedDataset
    from freescale.trainer.eval.evaluate import most_popular

    dataset = PreparedDataset(prepare_tiny(tmp_path))
    samples = [s for m in range(dataset.n_micro_batches) for s in dataset.micro_batch(m)]
    users = sum(1 for s in samples if int(s["window"]) == 0 and int(s["length"]) >= 3)
    result = most_popular(dataset, 10)
    vocab = dataset.vocabulary("item")
    train = [vocab.rows(s["item_ids"])[: -2 if int(s["length"]) >= 3 else None] for s in samples]
    counts = np.bincount(np.concatenate(train), minlength=vocab.size)
    top = set(np.argsort(-counts, kind="stable")[:10].tolist())
    tests = [int(vocab.rows(s["item_ids"])[-1]) for s in samples if int(s["length"]) >= 3]
    for split in ("validation", "test"):
        assert result[split]["users"] == users and 0.0 < result[split]["ndcg@10"] <= result[split]["hr@10"] < 1.0
    assert result["test"]["hr@10"] >= np.mean([t in top for t in tests])  # ties count in the target's favour


class _UnknownTargetsEngine(_LastItemEngine):
    """Queries = the target's row: every target ranks first, except that targets >= ``held`` come back with
    id -1, as a zero-collision table's engine returns a target it does not hold (its fallback row)."""

    held = 24

    def encode(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        target_ids = batch.item_ids[batch.target_index[batch.last_input_rows()]]
        rows = self.table[target_ids]
        return rows, rows, torch.where(target_ids < self.held, target_ids, -1)

    def lookup_items(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]


def test_a_target_without_a_row_of_its_own_is_a_miss(one_rank_group):
    """The shared fallback row must not rank an unknown target: before, its score decided (here: first)."""
    samples = [
        {"item_ids": np.array([u, 10 + u]), "actions": np.zeros(2, np.int64), "timestamps": np.arange(2),
         "cost": 1.0, "user_id": u, "window": 0, "length": 2}
        for u in range(20)
    ]  # fmt: skip
    cfg = CollateConfig(num_items=32, num_actions=1, max_len=64, num_negatives=1, inbatch_negatives=0)
    result = evaluate(_UnknownTargetsEngine(32), samples, cfg, num_candidates=0, k=1, keep_ranks=True)
    ranks = dict(zip(result["ranks"].user_ids.tolist(), result["ranks"].ranks.tolist(), strict=True))
    assert all(ranks[u] == 0 for u in range(14)) and all(ranks[u] >= 31 for u in range(14, 20))
    assert result["hr@1"] == 14 / 20
    sampled = evaluate(_UnknownTargetsEngine(32), samples, cfg, num_candidates=8, k=8)
    assert sampled["hr@8"] <= 14 / 20
