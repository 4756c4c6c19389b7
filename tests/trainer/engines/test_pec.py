"""Prioritized embedding communication trains exactly like the synchronous engine (docs/design.md#pec).

Every comparison runs ``overlap = "none"`` and ``"pec"`` from the same seed on the same gloo ranks
and requires per-step losses and every piece of training state (table shards, row-wise optimizer
state, dense weights and Adam moments) to be *bitwise* equal: PEC changes when rows are written,
never the arithmetic. Batches come from ``overlap_batches`` with an exact ``batch_overlap_rate``.
The end-to-end run through ``freescale train`` (checkpoint + resume under PEC) is in
test_dist.py; the CLI comparison with ``--set engine.overlap=none`` is further down. At the
bottom, unit tests of ``PECEngine`` itself on a gloo world of one (in this process, not marked slow).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pec_check import (
    OverlapCase,
    global_id_sets,
    mismatches,
    overlap_batches,
    train_case,
    train_modes,
    training_state,
)
from train_cli import losses, prepare_tiny, run_toml, train

from freescale.trainer.engines.pec import MAX_RANKS, PECEngine
from freescale.trainer.runner import make_engine, step_seed


@pytest.fixture(scope="module")
def pool2(rank_pool):
    return rank_pool(2, train_modes)


@pytest.fixture(scope="module")
def pool4(rank_pool):
    return rank_pool(4, train_modes)


def assert_exact(results: list[dict]) -> None:
    problems = mismatches(results)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    overlap=st.floats(0.0, 1.0),
    samples=st.integers(1, 4),
    extra_ids=st.integers(0, 12),
    duplicates=st.integers(0, 8),
    d_model=st.sampled_from([8, 16]),
    sparse=st.sampled_from(["rowwise_adagrad", "adam"]),
    steps=st.integers(2, 6),
    seed=st.integers(0, 1000),
)
@example(overlap=0.0, samples=2, extra_ids=4, duplicates=3, d_model=8, sparse="rowwise_adagrad", steps=4, seed=1)
@example(overlap=1.0, samples=2, extra_ids=4, duplicates=3, d_model=8, sparse="adam", steps=4, seed=2)
@example(overlap=0.5, samples=1, extra_ids=0, duplicates=0, d_model=8, sparse="rowwise_adagrad", steps=1, seed=3)
def test_pec_equals_synchronous_for_any_overlap_and_shape(
    pool2, overlap, samples, extra_ids, duplicates, d_model, sparse, steps, seed
) -> None:
    case = OverlapCase(
        overlap=overlap,
        samples_per_rank=samples,
        ids_per_rank=2 * samples + extra_ids,
        duplicates=duplicates,
        d_model=d_model,
        sparse=sparse,
        steps=steps,
        seed=seed,
    )
    assert_exact(pool2.run(case))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_pec_equals_synchronous_over_fifty_steps(world_size: int, pool2, pool4) -> None:
    pool = pool2 if world_size == 2 else pool4
    case = OverlapCase(world_size=world_size, steps=50, overlap=0.3, samples_per_rank=4, ids_per_rank=24, seed=7)
    results = pool.run(case)
    assert_exact(results)
    assert len(results[0]["pec"]["losses"]) == 50


def test_a_hierarchical_all_to_all_trains_bitwise_like_the_flat_one(pool4) -> None:
    """Four ranks as two emulated nodes of two: every exchange of both engines goes through the node
    first, and training (losses and every state tensor) is bitwise the flat all-to-all's."""
    flat = OverlapCase(world_size=4, steps=12, overlap=0.4, samples_per_rank=3, ids_per_rank=20, seed=3)
    nodes = replace(flat, all_to_all="hierarchical", ranks_per_node=2)
    expected, got = pool4.run(flat), pool4.run(nodes)
    assert_exact(got)
    for rank, (want, have) in enumerate(zip(expected, got)):
        assert want["none"]["losses"] == have["none"]["losses"], rank
        for key, tensor in want["pec"]["state"].items():
            assert torch.equal(tensor, have["pec"]["state"][key]), (rank, key)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("no ids overlap: empty OL", {"overlap": 0.0}),
        ("all ids overlap: empty NOL", {"overlap": 1.0}),
        ("one sample per rank", {"samples_per_rank": 1, "ids_per_rank": 2, "duplicates": 0}),
        ("many duplicates", {"duplicates": 40}),
        ("time limit stops with a batch prefetched", {"stop_early": True}),
        ("evaluation/checkpoint settles every step", {"settle_every": 1}),
        ("settle every other step", {"settle_every": 2, "overlap": 0.8}),
        ("a single step (first = last batch)", {"steps": 1}),
        ("zch: evictions and fallback rows, adam", {"zch_size": 32, "sparse": "adam"}),
        ("zch ttl, a batch prefetched at the end", {"zch_size": 32, "zch_policy": "ttl", "stop_early": True}),
        ("zch lfu, settling every step", {"zch_size": 32, "zch_policy": "lfu", "settle_every": 1}),
        ("user-profile tables: hashed and zch user ids", {"profiles": True}),
        ("profile and item zch tables, adam", {"profiles": True, "zch_size": 32, "sparse": "adam"}),
    ],
)
def test_edge_cases_stay_exact(pool2, name: str, changes: dict) -> None:
    case = OverlapCase(**{"steps": 8, "overlap": 0.5, **changes})
    assert_exact(pool2.run(case))


@pytest.mark.slow
def test_instrumentation_measures_the_planted_overlap_rate(pool2) -> None:
    case = OverlapCase(steps=6, overlap=0.25, ids_per_rank=20, seed=5)
    results = pool2.run(case, overlaps=("pec",))
    sets = global_id_sets(case)
    for step in range(case.steps - 1):
        planted = len(set(sets[step]) & set(sets[step + 1])) / len(sets[step + 1])
        for table in ("item", "action"):
            ol = sum(r["pec"]["extras"][step][f"ol_unique.{table}"] for r in results)
            total = sum(r["pec"]["extras"][step][f"next_unique.{table}"] for r in results)
            assert ol / total == pytest.approx(planted, abs=1e-12), (step, table)
        assert all(r["pec"]["extras"][step]["prefetch_comm_s"] >= 0 for r in results)
    assert "next_unique.item" not in results[0]["pec"]["extras"][-1]  # no batch after the last one


@pytest.mark.slow
def test_cli_runs_with_and_without_pec_learn_bitwise_the_same(tmp_path: Path) -> None:
    """``freescale train`` end to end: 2 ranks, 16 steps (past the epoch end at 14), ``engine.overlap=pec``
    vs ``none``; 50 steps of the engines themselves are compared in-process above."""
    prepared = prepare_tiny(tmp_path, seed=4)
    reports = {}
    for overlap in ("pec", "none"):
        out = tmp_path / overlap
        config = run_toml(
            tmp_path / f"{overlap}.toml",
            prepared,
            out,
            data={"max_steps": 16},
            eval={"max_users": 0},
            engine={"overlap": overlap},
        )
        train(config, tmp_path)
        reports[overlap] = (losses(out), json.loads((out / "bubbles.json").read_text()))
    assert list(reports["pec"][0].values()) == list(reports["none"][0].values())  # bitwise
    assert len(reports["pec"][0]) == 16
    pec_summary = reports["pec"][1]["summary"]["embedding_comm"]
    assert 0.0 < pec_summary["batch_overlap_rate"]["item"] < 1.0
    assert "nol_hidden_pct" in pec_summary and "nol_hidden_pct" not in reports["none"][1]["summary"]["embedding_comm"]
    assert "prioritized" in reports["pec"][1]["pipeline"]


# PECEngine itself, one rank in this process ----------------------------------------------------------


def test_pec_refuses_more_ranks_than_its_reader_bitmask_holds() -> None:
    cfg = OverlapCase(world_size=1).run_config("pec")
    with pytest.raises(ValueError, match=rf"supports up to {MAX_RANKS} ranks; use 'none' for {MAX_RANKS + 1}"):
        PECEngine(cfg, 0, MAX_RANKS + 1, torch.device("cpu"))


@pytest.mark.parametrize(("overlap", "sparse"), [(0.0, "rowwise_adagrad"), (0.5, "adam"), (1.0, "rowwise_adagrad")])
def test_pec_on_one_rank_trains_bitwise_like_the_synchronous_engine(
    gloo_world_of_one, overlap: float, sparse: str
) -> None:
    """Prefetch, the hot one-hop update, the OL refresh and the deferred cold update on a single rank
    (every row's owner and reader is this rank): losses and state bitwise the synchronous engine's."""
    case = OverlapCase(world_size=1, steps=4, overlap=overlap, sparse=sparse, ids_per_rank=16, seed=3)
    results = [{mode: train_case(case, mode, 0) for mode in ("none", "pec")}]
    assert not mismatches(results), mismatches(results)[:5]
    sets, extras = global_id_sets(case), results[0]["pec"]["extras"]
    for step in range(case.steps - 1):
        planted = len(set(sets[step]) & set(sets[step + 1]))
        assert extras[step]["ol_unique.item"] == extras[step]["ol_unique.action"] == planted
        assert extras[step]["next_unique.item"] == 16 and extras[step]["prefetch_comm_s"] >= 0
    assert "next_unique.item" not in extras[-1]


def test_settle_applies_the_deferred_cold_gradients(gloo_world_of_one) -> None:
    """After one step with a batch prefetched, ``settle`` leaves the tables as the synchronous step's."""
    case = OverlapCase(world_size=1, steps=2, overlap=0.5, ids_per_rank=16, seed=4)
    synchronous = train_case(replace(case, steps=1), "none", 0)["state"]
    engine = make_engine(case.run_config("pec"), 0, 1, torch.device("cpu"), "pec")
    try:
        torch.manual_seed(step_seed(case.seed, 0, 0))
        engine.timer.begin_step(0)
        engine.step(iter(overlap_batches(case, 0)))
        engine.timer.end_step()
        engine.timer.begin_step(1)
        engine.settle()
        engine.settle()  # nothing left to wait for
        waits = [comm.name for comm in engine.timer.end_step().comms]
        assert waits == ["gradient_comm.nol_wait"]
        state = training_state(engine)
    finally:
        engine.close()
    assert state.keys() == synchronous.keys()
    assert [key for key in state if not torch.equal(state[key], synchronous[key])] == []


def test_finish_training_stops_the_worker_once(gloo_world_of_one) -> None:
    engine = make_engine(OverlapCase(world_size=1).run_config("pec"), 0, 1, torch.device("cpu"), "pec")
    try:
        assert engine.worker.submit(lambda: "alive").result(timeout=30) == "alive"
        engine.finish_training()
        engine.finish_training()  # idempotent (the runner calls it, then close does)
        with pytest.raises(RuntimeError):
            engine.worker.submit(lambda: "late")
    finally:
        engine.close()
