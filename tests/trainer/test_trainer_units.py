"""Trainer pieces in one process: jagged attention, model, sparse optimizers, bubble arithmetic,
evaluation metrics, table initialisation and the run config's errors."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from collate_reference import per_sample_arrays, torch_build_layout
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.model_config import ModelConfig
from freescale.pipeline.dataset.samples import CollateConfig, sequence_arrays
from freescale.pipeline.dataset.vocabulary import Vocabulary
from freescale.tools.cli import main as cli_main
from freescale.trainer.config import ModelExtraConfig, RunConfig
from freescale.trainer.data.batches import collate
from freescale.trainer.data.jagged import (
    GROUP_OVERHEAD_ELEMENTS,
    build_layout,
    group_by_length,
    padded_sum_of_squares,
)
from freescale.trainer.engines.engine import batch_features, batch_loss
from freescale.trainer.engines.sharded import append_notes, init_rows, shard_bounds, split_features, split_notes
from freescale.trainer.engines.sparse_optim import LazyAdam, RowWiseAdagrad, sum_by_row
from freescale.trainer.eval.evaluate import metrics_from_ranks, popularity_metrics
from freescale.trainer.metrics.bubbles import (
    RankStep,
    analyze,
    balancer_metrics,
    step_metrics,
    summarize,
    summary_table,
)
from freescale.trainer.metrics.instrument import CommRecord, StageSpan, StepRecord
from freescale.trainer.model.transducer import SequentialTransducer


def make_samples(lengths: list[int], seed: int = 0, n_items: int = 50) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "item_ids": rng.integers(0, n_items, n),
            "actions": rng.integers(0, 3, n),
            "timestamps": np.cumsum(rng.integers(1, 10_000, n)),
            "cost": float(n * n),
            "user_id": u,
            "window": 0,
            "length": n,
        }
        for u, n in enumerate(lengths)
    ]


def collate_cfg(**overrides) -> CollateConfig:
    options = {"num_items": 50, "num_actions": 4, "max_len": 64, "num_negatives": 8, "inbatch_negatives": 4}
    return CollateConfig(**(options | overrides))


@pytest.mark.parametrize("architecture", ["hstu", "sasrec"])
def test_jagged_batch_equals_each_sample_alone(architecture: str) -> None:
    """Length groups and padding must not change any sample's output (no batch-max padding)."""
    torch.manual_seed(0)
    model = SequentialTransducer(
        ModelConfig(d_model=16, num_layers=2, num_heads=2, max_uih_len=64),
        ModelExtraConfig(architecture=architecture, length_group_ratio=1.5),
    ).eval()
    lengths = [5, 17, 2, 9, 30, 16]
    layout = build_layout(torch.tensor(lengths), ratio=1.5)
    n = sum(lengths)
    items, actions = torch.randn(n, 16), torch.randn(n, 16)
    times = torch.cumsum(torch.randint(1, 5000, (n,)), 0)
    queries = times + torch.randint(1, 5000, (n,))
    together = model(items, actions, layout, times, queries)
    start = 0
    for length in lengths:
        rows = slice(start, start + length)
        alone = model(items[rows], actions[rows], build_layout(torch.tensor([length])), times[rows], queries[rows])
        torch.testing.assert_close(together[rows], alone, atol=1e-5, rtol=1e-5)
        start += length


def test_length_groups_bound_attention_work() -> None:
    lengths = torch.tensor([400, 3, 390, 120, 100, 7, 8, 350, 2, 96])
    layout = build_layout(lengths, ratio=1.25)
    done, ideal = padded_sum_of_squares(layout)
    assert ideal <= done <= 1.25**2 * ideal + (len(lengths) - 1) * GROUP_OVERHEAD_ELEMENTS
    assert padded_sum_of_squares(build_layout(lengths, ratio=1.25, overhead=0))[0] <= 1.25**2 * ideal
    batch_max = len(lengths) * int(lengths.max()) ** 2
    assert done < 0.5 * batch_max  # what padding to the batch max would cost
    assert sorted(i for g in group_by_length(lengths.tolist(), 1.25) for i in g) == list(range(len(lengths)))


def _cut_cost(lengths: list[int], groups: list[list[int]], overhead: float) -> float:
    return sum(len(g) * max(lengths[i] for i in g) ** 2 + overhead for g in groups)


@pytest.mark.parametrize("seed", range(6))
def test_length_groups_minimise_padding_plus_group_overhead(seed: int) -> None:
    """The cut is the cheapest admissible one (brute force over every cut of the sorted samples)."""
    rng = np.random.default_rng(seed)
    lengths = [int(x) for x in np.exp(rng.uniform(0, np.log(300), 7)).round()]
    overhead, ratio = 2000.0, 1.25
    groups = group_by_length(lengths, ratio, overhead=overhead)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    best = np.inf
    for mask in range(2 ** (len(order) - 1)):  # bit j set: cut after sorted position j
        cuts = [0] + [j + 1 for j in range(len(order) - 1) if mask >> j & 1] + [len(order)]
        cand = [order[a:b] for a, b in itertools.pairwise(cuts)]
        ok = all(
            len(g) * max(lengths[i] for i in g) ** 2
            <= ratio**2 * sum(lengths[i] ** 2 for i in g) + (len(g) - 1) * overhead + 1e-9
            for g in cand
        )
        if ok:
            best = min(best, _cut_cost(lengths, cand, overhead))
    assert _cut_cost(lengths, groups, overhead) == pytest.approx(best)


def test_short_samples_share_one_group_long_ones_stay_exact() -> None:
    """Per-group overhead outweighs padding short samples; long distinct lengths keep their own group."""
    assert len(group_by_length([2, 3, 4, 6, 8, 11, 15, 20], 1.25)) == 1
    long = [700, 600, 500]
    assert group_by_length(long, 1.25) == [[0], [1], [2]]
    assert group_by_length([768] * 5, 1.25) == [[0, 1, 2, 3, 4]]
    assert group_by_length([0, 5, 0], 1.25) == [[1]] and group_by_length([], 1.25) == []
    assert len(group_by_length([100] * 8, 1.25, max_elements=3 * 100**2)) == 3  # memory cap still holds


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 400), max_size=24),
    ratio=st.sampled_from([1.0, 1.25, 1.5]),
    overhead=st.sampled_from([0.0, float(GROUP_OVERHEAD_ELEMENTS)]),
)
def test_layout_is_the_torch_construction_bit_for_bit(lengths: list[int], ratio: float, overhead: float) -> None:
    """``build_layout`` (numpy, for the loader worker's speed) gives the tensors the torch construction
    gave: same dtypes, shapes and values, so attention and the loss are unchanged."""
    got = build_layout(torch.tensor(lengths, dtype=torch.int64), ratio, overhead)
    want = torch_build_layout(torch.tensor(lengths, dtype=torch.int64), ratio, overhead)
    pairs = [(got.lengths, want.lengths), (got.offsets, want.offsets), (got.inverse, want.inverse)]
    pairs += [(got.positions, want.positions), (got.sample_of, want.sample_of)]
    assert len(got.groups) == len(want.groups)
    for mine, theirs in zip(got.groups, want.groups):
        pairs += list(
            zip(
                (mine.samples, mine.index, mine.valid, mine.lengths),
                (theirs.samples, theirs.index, theirs.valid, theirs.lengths),
            )
        )
    for a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), max_size=10),
    windows=st.lists(st.integers(0, 3), min_size=10, max_size=10),
    max_len=st.integers(2, 9),
    stride=st.integers(0, 2),
    holdout=st.booleans(),
    exact=st.booleans(),
)
def test_batch_id_mapping_is_the_per_sample_construction(
    lengths: list[int], windows: list[int], max_len: int, stride: int, holdout: bool, exact: bool
) -> None:
    """``sequence_arrays`` maps a micro-batch's ids at once; rows, lengths, kept samples, truncation
    counts and input rows equal the per-sample construction's, exact vocabularies or hashed."""
    samples = make_samples(lengths, seed=sum(lengths) + max_len)
    for sample, window in zip(samples, windows):
        sample["window"] = window
    vocab = {"item_vocab": Vocabulary("item", np.arange(50, dtype=np.int64))} if exact else {}
    cfg = CollateConfig(7, 3, max_len, 4, 2, holdout_events=2, window_stride=stride, **vocab)
    got = sequence_arrays(samples, cfg, holdout)
    items, actions, times, sizes, kept, truncated, inputs = per_sample_arrays(samples, cfg, holdout)
    for a, b in ((got.items, items), (got.actions, actions), (got.times, times), (got.lengths, sizes)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert got.kept == kept and got.truncated == truncated
    assert got.input_rows().dtype == inputs.dtype and np.array_equal(got.input_rows(), inputs)


def test_collate_holds_out_validation_and_test_items_and_draws_reproducible_negatives() -> None:
    samples = make_samples([6, 1, 4])
    batch = collate(samples, collate_cfg(), step=3, rank=1)
    assert batch.lengths.tolist() == [4, 2]  # the 1-event sample is dropped, the last two events held out
    assert batch.num_positions == 3 + 1
    first = torch.from_numpy(samples[0]["item_ids"][:4] % 50)
    assert batch.item_ids[:4].tolist() == first.tolist()
    assert batch.item_ids[batch.target_index[:3]].tolist() == first[1:].tolist()
    test_only = collate(samples, collate_cfg(holdout_events=1), step=3, rank=1)
    assert test_only.lengths.tolist() == [5, 3]
    again = collate(samples, collate_cfg(), step=3, rank=1)
    assert torch.equal(batch.negative_ids, again.negative_ids)
    assert not torch.equal(batch.negative_ids, collate(samples, collate_cfg(), step=4, rank=1).negative_ids)
    evaluation = collate(samples, collate_cfg(), step=0, rank=0, holdout=False)
    assert evaluation.lengths.tolist() == [6, 4]


@pytest.mark.parametrize("architecture", ["hstu", "sasrec"])
def test_time_bias_reads_the_predicted_events_time(architecture: str) -> None:
    """HSTU's time bias buckets t_{i+1} - t_j (GR): moving only the last target's time changes only the
    last position's output, moving every time alike changes nothing; SASRec reads no timestamps."""
    torch.manual_seed(0)
    model = SequentialTransducer(
        ModelConfig(d_model=16, num_layers=2, num_heads=2, max_uih_len=64), ModelExtraConfig(architecture=architecture)
    ).eval()
    for layer in model.layers:  # zero-initialised biases would hide the dependence
        for name, param in layer.named_parameters():
            if name in ("pos_bias", "time_bias"):
                param.data.normal_()
    n = 12
    items, actions = torch.randn(n, 16), torch.randn(n, 16)
    times = torch.cumsum(torch.randint(1, 100, (n,)), 0)
    queries = torch.cat([times[1:], times[-1:] + 50])
    later = queries.clone()
    later[-1] += 10 * 86_400  # the last target comes after a long gap
    layout = build_layout(torch.tensor([n]))
    before, after = model(items, actions, layout, times, queries), model(items, actions, layout, times, later)
    torch.testing.assert_close(before[:-1], after[:-1])
    assert torch.equal(before[-1], after[-1]) == (architecture == "sasrec")
    shifted = model(items, actions, layout, times + 5_000, later + 5_000)  # only gaps count
    torch.testing.assert_close(shifted, after)


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


def test_table_shards_concatenate_to_the_whole_table() -> None:
    rows, world = 10_000, 3
    whole = init_rows(7, 1, rows, 0, rows, 4)
    pieces = [init_rows(7, 1, rows, *shard_bounds(rows, world, r), 4) for r in range(world)]
    assert torch.equal(torch.cat(pieces), whole)
    assert shard_bounds(rows, world, 2) == (6668, 10_000)
    assert whole.abs().max() <= (1 / rows) ** 0.5


def _record(rank: int, step: int, start: float, comm_at: float, arrive_wait: float, end: float) -> StepRecord:
    """A step: data, compute until comm_at, one collective waited until arrive_wait, compute to end."""
    return StepRecord(
        step=step,
        rank=rank,
        start=start,
        end=end,
        samples=4,
        loss=1.0,
        cost=comm_at - start,
        stages=[
            StageSpan("data", "data", start, start + 1),
            StageSpan("forward", "compute", start + 1, comm_at),
            StageSpan("gradient_comm", "comm", comm_at, arrive_wait),
            StageSpan("dense_update", "compute", arrive_wait, end),
        ],
        comms=[CommRecord("dense", comm_at, comm_at, arrive_wait)],
    )


def test_bubble_split_of_a_known_straggler() -> None:
    # rank 0 reaches the all-reduce at t=4, rank 1 at t=8; the transfer then takes 1 (done at 9)
    records = [[_record(0, 0, 0.0, 4.0, 9.0, 10.0)], [_record(1, 0, 0.0, 8.0, 9.0, 10.0)]]
    (step,) = analyze(records)
    fast, slow = step
    assert (fast.idle, fast.comm, fast.data, fast.compute) == pytest.approx((4.0, 1.0, 1.0, 4.0))
    assert (slow.idle, slow.comm, slow.compute) == pytest.approx((0.0, 1.0, 8.0))
    for rank_step in step:
        assert rank_step.parts_total() == pytest.approx(rank_step.wall)
        assert rank_step.untimed == pytest.approx(0.0)
    metrics = step_metrics(step)
    assert metrics["straggler_pct"] == pytest.approx(20.0)  # mean idle (4 + 0) / 2 over wall 10
    assert metrics["exposed_comm_pct"] == pytest.approx(10.0)
    assert metrics["bubble_pct"] == pytest.approx(30.0)
    summary = summarize(analyze(records))
    assert summary["straggler_pct"] == pytest.approx(20.0)
    assert "straggler%" in summary_table(summary, "t")


def test_balancer_overhead_leaves_out_waiting_for_other_ranks() -> None:
    """The dispatch collective is the step's first sync point after placement: a rank that gets there
    early waits for the other's straggling, which is not the balancer's cost (straggler_pct has it)."""

    def rank_step(rank: int, dispatch_ms: float, waited_s: float) -> RankStep:
        extra = {"balancer.imbalance_before": 1.5, "balancer.imbalance_after": 1.0, "balancer.moved": 1.0,
                 "balancer.dispatch_ms": dispatch_ms, "balancer.combine_ms": 1.0}  # fmt: skip
        return RankStep(rank=rank, step=0, wall=0.1, compute=0.0, data=0.0, comm=0.0, idle=waited_s, untimed=0.0,
                        samples=1, loss=0.0, cost=0.0, stages={}, idle_by_name={"balancer.dispatch": waited_s},
                        extra=extra)  # fmt: skip

    metrics = balancer_metrics([rank_step(0, 7.0, 0.005), rank_step(1, 2.0, 0.0)])
    assert metrics["balancer_dispatch_ms"] == pytest.approx(2.0)  # (7 - 5 + 2) / 2
    assert metrics["balancer_combine_ms"] == pytest.approx(1.0)
    assert metrics["balancer_wait_ms"] == pytest.approx(2.5)
    assert metrics["balancer_moved"] == 2


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


def test_ranking_metrics_and_popularity_baseline() -> None:
    metrics = metrics_from_ranks(np.array([0, 1, 9, 10, 500]), k=10)
    assert metrics["hr@10"] == pytest.approx(3 / 5)
    assert metrics["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(11)) / 5)
    train = np.array([5, 5, 5, 7, 7, 1])
    popular = popularity_metrics(train, np.array([5, 7, 1, 2]), num_items=20, k=2)
    assert popular["hr@2"] == pytest.approx(0.5)  # 5 (rank 0) and 7 (rank 1) are hits


def write_config(path: Path, **tables: dict) -> str:
    base = {"data": {"path": "/tmp/x"}}
    base.update(tables)
    lines = []
    for table, values in base.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {value!r}".replace("'", '"') for key, value in values.items())
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"model": {"d_model": 30, "num_heads": 4}}, "model.d_model"),
        ({"model": {"layers": 2}}, r"unknown option\(s\) \['layers'\] in \[model\]"),
        ({"model_extra": {"architecture": "bert"}}, "model_extra.architecture"),
        ({"model_extra": {"temperature": 0}}, "model_extra.temperature"),
        ({"optimizer": {"sparse": "sgd"}}, "optimizer.sparse"),
        ({"optimizer": {"dense_lr": -1}}, "optimizer.dense_lr"),
        ({"engine": {"name": "megatron"}}, "engine.name"),
        ({"engine": {"backend": "nccl"}}, "engine.backend"),
        ({"data": {"path": ""}}, "data.path"),
        ({"data": {"path": "x", "max_steps": -2}}, "data.max_steps"),
        ({"checkpoint": {"every": 5}}, "checkpoint.dir"),
        ({"engine": {"name": "torchrec"}, "checkpoint": {"dir": "/tmp/c"}}, "checkpoint.dir must be empty"),
        ({"logging": {"log_every": 0}}, "logging.log_every"),
        ({"eval": {"k": 0}}, "eval.k"),
        ({"trainer": {"x": 1}}, r"unknown table\(s\) \['trainer'\]"),
        ({"optimizer": {"dense_lr": math.inf}}, "optimizer.dense_lr must be finite"),
        ({"optimizer": {"sparse_lr": math.inf}}, "optimizer.sparse_lr must be finite"),
        ({"optimizer": {"weight_decay": math.inf}}, "optimizer.weight_decay must be finite"),
        ({"optimizer": {"betas": [0.9, math.nan]}}, "optimizer.betas must be finite"),
        ({"model_extra": {"length_group_ratio": math.inf}}, "model_extra.length_group_ratio must be finite"),
        ({"data": {"path": "x", "max_seconds": math.inf}}, "data.max_seconds must be finite"),
        ({"data": {"path": "x", "max_steps": 1.5}}, "data.max_steps must be an integer, got 1.5"),
        ({"engine": {"threads": 2.0}}, "engine.threads must be an integer"),
        ({"engine": {"collective_timeout_s": 0}}, "engine.collective_timeout_s"),
        ({"engine": {"max_nonfinite_skips": -1}}, "engine.max_nonfinite_skips"),
        ({"engine": {"name": "torchrec", "max_nonfinite_skips": 2}}, "engine.max_nonfinite_skips must be 0"),
        ({"engine": {"transport": "nvlink"}}, "engine.transport"),
        ({"engine": {"balancer": "online", "balancer_min_gain": 1.0}}, "engine.balancer_min_gain must be in"),
        ({"engine": {"transport": "copy_engine"}}, "engine.transport 'copy_engine' needs engine.device 'cuda'"),
        ({"engine": {"name": "torchrec", "transport": "torch"}}, "engine.transport 'torch' applies to the freescale"),
    ],
)
def test_config_errors_name_the_option(tmp_path: Path, tables: dict, message: str) -> None:
    path = write_config(tmp_path / "run.toml", **tables)
    with pytest.raises(ValueError, match=message):
        RunConfig.from_toml(path)


def test_config_round_trip_overrides_and_model_table(tmp_path: Path) -> None:
    path = write_config(tmp_path / "run.toml", model={"d_model": 32, "num_heads": 2, "max_uih_len": 128})
    cfg = RunConfig.from_toml(path, ["engine.name=torchrec", "data.max_steps=7", 'data.path="s3://b/p"'])
    assert (cfg.engine.name, cfg.data.max_steps, cfg.data.path) == ("torchrec", 7, "s3://b/p")
    assert ModelConfig.from_toml(path).d_model == 32  # [model] stays readable by `prepare --model-config`
    (tmp_path / "resolved.toml").write_text(cfg.to_toml())
    assert RunConfig.from_toml(str(tmp_path / "resolved.toml")) == cfg
    with pytest.raises(ValueError, match=r"table\.option=value"):
        RunConfig.from_toml(path, ["max_steps=3"])


def test_configs_built_in_code_refuse_non_finite_floats() -> None:
    from freescale.trainer.config import DataConfig, OptimizerConfig

    with pytest.raises(ValueError, match=r"optimizer\.sparse_lr must be finite"):
        RunConfig(data=DataConfig(path="x"), optimizer=OptimizerConfig(sparse_lr=math.inf))


def test_cli_train_reports_config_errors_with_status_2(tmp_path: Path, capsys) -> None:
    path = write_config(tmp_path / "run.toml", engine={"threads": 0})
    assert cli_main(["train", "--config", path, "--nproc", "2"]) == 2
    assert "engine.threads" in capsys.readouterr().err
    assert cli_main(["train", "--config", path, "--nproc", "0", "--set", "engine.threads=1"]) == 2
    assert "--nproc" in capsys.readouterr().err


def test_sharded_tables_read_torchrec_keyed_jagged_tensors() -> None:
    """The KJT boundary: our tables take TorchRec's KeyedJaggedTensor as well as their own JaggedIds."""
    pytest.importorskip("torchrec")
    from freescale.trainer.engines.kjt import batch_to_kjt

    batch = collate(make_samples([6, 3, 9]), collate_cfg(), step=0, rank=0)
    kjt = batch_to_kjt(batch)
    ours, theirs = split_features(batch_features(batch)), split_features(kjt)
    assert list(theirs) == ["item", "action", "neg"]
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert kjt.stride() == batch.num_samples


def test_torchrec_engine_close_waits_for_the_read_ahead_exchanges(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline ends with the next batch's all-to-alls in flight: ``close`` waits for them and
    drops the pipeline (detached) before the process group goes, instead of leaving gloo works to
    interpreter exit (a 2-host rank aborted there once)."""
    pytest.importorskip("torchrec")
    from types import SimpleNamespace

    import torch.distributed as dist

    from freescale.trainer.engines import torchrec_engine
    from freescale.trainer.metrics.instrument import StepTimer

    class Pending:
        def __init__(self) -> None:
            self.done = False

        def wait(self, *args, **kwargs) -> bool:
            self.done = True
            return True

        def is_completed(self) -> bool:
            return self.done

    launched: list[Pending] = []

    def fake_all_to_all(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        launched.append(Pending())
        return launched[-1]

    monkeypatch.setattr(dist, "all_to_all_single", fake_all_to_all)
    in_flight: list = []
    original = torchrec_engine._install_a2a_timing(StepTimer(0, torch.device("cpu"), True), in_flight)
    for _ in range(3):
        dist.all_to_all_single(torch.empty(1), torch.empty(1), async_op=True)
    launched[0].wait()  # finished ones are dropped at the next launch
    dist.all_to_all_single(torch.empty(1), torch.empty(1), async_op=True)
    assert in_flight == launched[1:]
    detached = []
    engine = SimpleNamespace(_in_flight=in_flight, _original_a2a=original, _batches=iter([]),
                             pipeline=SimpleNamespace(detach=lambda: detached.append(True)))  # fmt: skip
    engine.finish_training = lambda: torchrec_engine.TorchRecEngine.finish_training(engine)
    torchrec_engine.TorchRecEngine.close(engine)  # close finishes training first (the engine protocol)
    assert all(work.done for work in launched) and in_flight == []
    assert detached == [True] and engine.pipeline is None and engine._batches is None
    assert dist.all_to_all_single is fake_all_to_all


def test_pin_to_cpus_gives_each_local_rank_its_own_cores() -> None:
    import os

    from freescale.trainer.cpus import pin_to_cpus

    allowed = os.sched_getaffinity(0)
    try:
        slices = []
        for rank in range(2):
            os.sched_setaffinity(0, allowed)
            slices.append(pin_to_cpus(rank, 2))
            assert os.sched_getaffinity(0) == set(slices[-1])
        if len(allowed) >= 2:
            assert not set(slices[0]) & set(slices[1])
        assert set(slices[0]) | set(slices[1]) <= allowed
    finally:
        os.sched_setaffinity(0, allowed)


def test_every_trainer_all_to_all_goes_through_the_transport() -> None:
    """The seam: no trainer module calls ``dist.all_to_all_single`` itself (TorchRec's engine only
    wraps the function TorchRec calls, to time it)."""
    import freescale.trainer

    root = Path(freescale.trainer.__file__).parent
    callers = sorted(p.name for p in root.glob("*.py") if "all_to_all_single(" in p.read_text())
    assert callers == [], callers


@pytest.mark.parametrize(
    ("requested", "device", "cores", "threads", "expected"),
    [
        ("auto", "cpu", 1, 1, "none"),  # the comm thread would take the compute's only core
        ("auto", "cpu", 2, 1, "pec"),
        ("auto", "cpu", 4, 4, "none"),
        ("auto", "cuda", 1, 1, "pec"),  # communication runs on its own stream
        ("pec", "cpu", 1, 1, "pec"),  # an explicit choice is kept
        ("none", "cuda", 8, 1, "none"),
    ],
)
def test_auto_overlap_is_pec_where_its_thread_has_room(
    requested: str, device: str, cores: int, threads: int, expected: str
) -> None:
    from freescale.trainer.runner import overlap_choice

    assert overlap_choice(requested, device, cores, threads) == expected
