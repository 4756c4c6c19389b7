"""Zero-collision item tables in the FreeScale engine (trainer/engines/zch_shard.py, sharded.py).

On a gloo world of one (this process): a reassigned row starts over (embedding and every optimizer
state tensor) when its batch starts training, not before; a checkpoint taken while the next batch's
lookup is already done holds the table without it; evaluation routes read-only. On 2 gloo ranks
(``online_check``'s pool): a run resumed from a mid-run checkpoint continues bit for bit, with and
without PEC, and the online balancer trains what ``balancer = "none"`` trains. PEC against the
synchronous engine with evictions is in test_pec.py's edge cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from online_check import OnlineCase, differences, train_online_modes
from pec_check import OverlapCase, mismatches, train_case

from freescale.kernels.zch_rows import hashed_uniform
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.trainer.engines.jagged_ids import JaggedIds
from freescale.trainer.eval.catalogue import row_weights
from freescale.trainer.runner import make_engine

ZCH = {"zch_size": 8, "zch_bucket_size": 8, "zch_max_probe": 8}  # one bucket: 8 ids fill it, the 9th evicts


def zch_engine(sparse: str = "rowwise_adagrad"):
    case = OverlapCase(world_size=1, sparse=sparse, **ZCH)
    return make_engine(case.run_config("none"), 0, 1, torch.device("cpu"), "none")


def route(engine, ids: list[int], train: bool = True):
    features = JaggedIds(["item"], torch.tensor(ids, dtype=torch.int64), [len(ids)])
    return engine.tables.start_input_dist(features, train=train).route().finish()


@pytest.mark.parametrize("sparse", ["rowwise_adagrad", "adam"])
def test_eviction_resets_the_row_and_its_optimizer_state_when_its_batch_trains(gloo_world_of_one, sparse) -> None:
    engine = zch_engine(sparse)
    try:
        tables = engine.tables
        tables.apply_resets(route(engine, list(range(100, 108))))  # fills the 8 slots
        weight, states = tables.weights[0], tables.optimizers[0].state
        weight.fill_(7.0)
        for tensor in states.values():
            tensor.fill_(1.0)  # as if every row had trained
        ctx = route(engine, [100, 200, 201])  # lru: two new ids evict the two least recent
        (step,) = ctx.zch
        reassigned = step.reassigned
        assert reassigned.numel() == 2 and step.stats.tolist()[:5] == [3, 1, 2, 2, 0]
        assert bool((weight == 7.0).all()), "nothing is reset before the batch trains"
        tables.apply_resets(ctx)
        tables.apply_resets(ctx)  # idempotent
        assert sorted(step.reassigned_ids.tolist()) == [200, 201]  # the new holders, row by row
        fresh = hashed_uniform(step.reassigned_ids, tables.dim, bound=tables.specs[0].bound, table=0)
        assert torch.equal(weight[reassigned], fresh)  # keyed by the id each row now holds
        kept = torch.ones(9, dtype=torch.bool)
        kept[reassigned] = False
        assert bool((weight[kept] == 7.0).all())
        for name, tensor in states.items():
            assert bool((tensor[reassigned] == 0).all()), name
            assert bool((tensor[kept] == 1.0).all()), name
    finally:
        engine.close()


def test_an_id_starts_from_the_same_row_whatever_table_placed_it(gloo_world_of_one) -> None:
    """Reset values are keyed by the raw id, not by its slot: another bucket layout gives an id another
    row but the same initial embedding, so placement does not change what trains."""
    ids = [5, 1 << 40, 977, 12, 300]
    rows_by_layout = []
    for layout in ({"zch_size": 64, "zch_bucket_size": 64, "zch_max_probe": 64},
                   {"zch_size": 64, "zch_bucket_size": 16, "zch_max_probe": 4}):  # fmt: skip
        case = OverlapCase(world_size=1, sparse="rowwise_adagrad", **layout)
        engine = make_engine(case.run_config("none"), 0, 1, torch.device("cpu"), "none")
        try:
            engine.tables.apply_resets(route(engine, ids))
            rows = torch.tensor(evaluated_rows(engine, ids))
            rows_by_layout.append((rows, engine.tables.weights[0][rows].clone()))
        finally:
            engine.close()
    (rows_a, values_a), (rows_b, values_b) = rows_by_layout
    assert not torch.equal(rows_a, rows_b)
    assert torch.equal(values_a, values_b)


def test_every_fallback_row_starts_from_the_same_vector(gloo_world_of_one) -> None:
    """The fallback row (what evaluation reads for an id the table does not hold) is keyed like a reset
    row, by a key no raw id has, not by its position: the same vector in any table size or world size."""
    engine = zch_engine()
    try:
        tables, spec = engine.tables, engine.tables.specs[0]
        want = hashed_uniform(torch.tensor([-1]), tables.dim, bound=spec.bound, table=0)[0]
        assert torch.equal(tables.weights[0][-1], want)
        (row,) = evaluated_rows(engine, [12345])  # unknown: the fallback row
        assert row == spec.rows - 1
    finally:
        engine.close()


def evaluated_rows(engine, ids: list[int]) -> list[int]:
    ctx = route(engine, ids, train=False)
    engine.tables.output_dist(ctx, engine.tables.lookup(ctx))
    return engine.tables.feature_keys(ctx)["item"].tolist()


def test_checkpoints_and_evaluation_see_the_table_as_of_the_trained_batches(gloo_world_of_one) -> None:
    engine = zch_engine()
    try:
        tables, first = engine.tables, list(range(100, 108))
        tables.apply_resets(route(engine, first))
        trained = {k: t.clone() for k, t in tables.local_state().items() if k.startswith("zch.")}
        rows = evaluated_rows(engine, first)
        assert sorted(rows) == list(range(8))
        ctx = route(engine, [100, 200, 201, 202])  # looked up ahead, not trained yet
        live = tables.zch[0].table
        assert int(live.step) == 2 and int((live.identities >= 200).sum()) == 3
        saved = {k: t for k, t in tables.local_state().items() if k.startswith("zch.")}
        assert [k for k in trained if not torch.equal(trained[k], saved[k])] == []
        assert evaluated_rows(engine, first) == rows  # the evicted ids still have their rows
        tables.apply_resets(ctx)  # the batch trains: the lookup belongs to the state now
        assert torch.equal(tables.local_state()["zch.item.identities"], live.identities)
        assert evaluated_rows(engine, first).count(8) == 3  # now they fall back
        assert tables.global_shapes()["zch.item.counters"] == (7,)
    finally:
        engine.close()


def test_evaluation_routes_read_only_and_unknown_ids_use_the_fallback_row(gloo_world_of_one) -> None:
    engine = zch_engine()
    try:
        tables = engine.tables
        tables.apply_resets(route(engine, [5, 6, 7]))
        before = {k: t.clone() for k, t in tables.local_state().items()}
        ctx = route(engine, [5, 99], train=False)
        tables.output_dist(ctx, tables.lookup(ctx))
        keys = tables.feature_keys(ctx)["item"]
        assert ctx.zch is None and int(keys[1]) == 8  # the fallback row: the shard's last
        assert int(keys[0]) == int(torch.nonzero(tables.zch[0].table.identities == 5)[0, 0])
        assert tables.zch[0].is_fallback(keys).tolist() == [False, True]  # evaluation: 99 has no row
        assert tables.zch[0].is_fallback(torch.tensor([17, 16, 9])).tolist() == [True, False, False]  # any rank's
        after = tables.local_state()
        assert [k for k in before if not torch.equal(before[k], after[k])] == []
    finally:
        engine.close()


def test_evaluations_catalogue_counts_the_slots_holding_its_items(gloo_world_of_one) -> None:
    """``eval.catalogue = "items"``: catalogue ids the table holds count on their slots, ids it does not
    hold count nowhere (not on the fallback row), and nothing in the table changes."""
    engine = zch_engine()
    try:
        tables = engine.tables
        tables.apply_resets(route(engine, [5, 6, 7]))
        before = {k: t.clone() for k, t in tables.local_state().items()}
        rows = engine.catalogue_rows(torch.tensor([7, 99, 5], dtype=torch.int64))
        identities = tables.zch[0].table.identities
        slot = {held: row for row, held in enumerate(identities.tolist()) if held >= 0}
        assert rows.tolist() == [slot[7], -1, slot[5]]
        cfg = CollateConfig(num_items=8, num_actions=1, max_len=8, num_negatives=1, inbatch_negatives=0,
                            item_pool=np.array([5, 6, 7, 99], np.int64))  # fmt: skip
        weights = row_weights(engine, cfg, np.array([5, 6, 7, 99, 100], np.int64))
        assert weights.tolist() == [*(identities >= 0).long().tolist(), 0]  # 8 slots, then the fallback row
        after = tables.local_state()
        assert [k for k in before if not torch.equal(before[k], after[k])] == []
    finally:
        engine.close()


@pytest.mark.parametrize("policy", ["lru", "ttl"])
def test_pec_on_one_rank_with_evictions_is_bitwise_synchronous(gloo_world_of_one, policy: str) -> None:
    case = OverlapCase(world_size=1, steps=5, overlap=0.5, ids_per_rank=16, zch_size=16, zch_policy=policy, seed=2)
    results = [{mode: train_case(case, mode, 0) for mode in ("none", "pec")}]
    assert not mismatches(results), mismatches(results)[:5]
    extras = results[0]["none"]["extras"]
    assert sum(e["zch.item.evictions"] for e in extras) > 0 and sum(e["zch.item.collisions"] for e in extras) > 0


@pytest.fixture(scope="module")
def pool2(rank_pool):
    return rank_pool(2, train_online_modes)


def exact(results: list[dict], base: str, other: str) -> list[str]:
    return differences(results, base, other, rtol=0.0)


@pytest.mark.slow
def test_two_ranks_resume_bit_for_bit_and_online_matches_none(pool2, tmp_path) -> None:
    case = {"world_size": 2, "steps": 6, "sigma": 1.2, "seed": 4, "zch_size": 64, "num_items": 256}
    straight = pool2.run(OnlineCase(**case), ("none", "pec", "online"))
    resumed = pool2.run(OnlineCase(**case, resume_at=3, checkpoint_dir=str(tmp_path)), ("none", "pec"))
    assert exact(straight, "none", "pec") == []
    for mode in ("none", "pec"):
        merged = [{"straight": a["none"], mode: b[mode]} for a, b in zip(straight, resumed)]
        assert exact(merged, "straight", mode) == [], mode
    assert differences(straight, "none", "online", rtol=1e-5) == []
    extras = [e for rank in straight for e in rank["none"]["extras"]]
    assert sum(e["zch.item.evictions"] for e in extras) > 0
    assert sum(e["balancer.moved"] for rank in straight for e in rank["online"]["extras"]) > 0
