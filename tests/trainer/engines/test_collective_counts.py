"""Collectives per step of every FreeScale engine, counted at the communication seam (trainer/engines/comm.py).

Each engine trains the same case on 2 gloo ranks for S and S + 2 steps while a wrapper around
``TimedTransport`` counts launches by name (``collective_count``); half the difference is the steady
state per step. The counts are what docs/design.md#pec and the simulator's ``overlap = pec`` model
assume: the synchronous engine runs TorchRec's pipeline schedule (counts, ids, rows, gradients,
dense all-reduce: five); PEC moves rows, their optimizer state and the owners' OL marks in one
prefetch exchange and adds only the split of the gradients into hot and cold parts (six); the
online balancer adds its dispatch and combine on a step that moves samples (here every step does).
"""

from __future__ import annotations

import pytest
from collective_count import count_modes
from online_check import OnlineCase

from freescale.trainer.simulate.simulator import COLLECTIVES_PER_STEP

pytestmark = pytest.mark.slow

SYNCHRONOUS = {
    "input_dist.counts": 1,
    "input_dist.ids": 1,
    "embedding_comm.rows": 1,
    "gradient_comm.embeddings": 1,
    "gradient_comm.dense": 1,
}
PEC = {
    "input_dist.counts": 1,
    "input_dist.ids": 1,
    "embedding_comm.prefetch": 1,
    "gradient_comm.ol": 1,
    "gradient_comm.dense": 1,
    "gradient_comm.nol": 1,
}
BALANCER = {"balancer.dispatch": 1, "balancer.combine": 1}
EXPECTED = {"none": SYNCHRONOUS, "pec": PEC, "online": SYNCHRONOUS | BALANCER, "pec+online": PEC | BALANCER}
STEPS = 3


@pytest.fixture(scope="module")
def counted(rank_pool) -> list[dict]:
    # rank 0 holds all the long samples: the balancer moves samples on every step
    schedule = [[[40, 40, 40, 30], [3, 3, 3, 3]] for _ in range(STEPS + 2)]
    case = OnlineCase(steps=STEPS, schedule=schedule, min_gain=0.0)
    return rank_pool(2, count_modes).run(case, tuple(EXPECTED))


def per_step(result: dict) -> dict[str, float]:
    names = set(result["short"]) | set(result["long"])
    diff = {name: (result["long"].get(name, 0) - result["short"].get(name, 0)) / 2 for name in names}
    return {name: n for name, n in diff.items() if n}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_each_engine_issues_the_pinned_collectives_per_step(counted: list[dict], mode: str) -> None:
    for rank, result in enumerate(counted):
        assert per_step(result[mode]) == EXPECTED[mode], (mode, rank)
    if "online" in mode:  # every step moved samples (the balancer's exchanges ran on each)
        assert all(sum(r[mode]["moved"][step] for r in counted) > 0 for step in range(STEPS))


def test_pec_needs_at_most_one_collective_more_than_the_synchronous_schedule() -> None:
    assert sum(PEC.values()) <= sum(SYNCHRONOUS.values()) + 1


def test_the_simulator_counts_the_engines_collectives() -> None:
    counted = {"none": sum(SYNCHRONOUS.values()), "pec": sum(PEC.values())}
    assert counted == COLLECTIVES_PER_STEP
