"""The online balancer's placement (trainer/engines/balancer.py), property-tested with hypothesis.

Every sample is placed exactly once on a valid rank; the answer is a pure function of the global
(costs, homes) vectors (what makes it identical on every rank); the maximum rank cost stays within
Graham's list-scheduling bound ``total / W + max cost`` that LPT (the planner's ``lpt_free``)
guarantees, and never above the home placement's; a balanced step moves nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freescale.trainer.engines.balancer import imbalance, lpt_bins, place_samples, rank_loads

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def steps(draw):
    """(costs, homes, W): heavy-tailed, tied or uniform costs; some ranks may hold no sample."""
    world = draw(st.integers(1, 9))
    n = draw(st.integers(0, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["lognormal", "ties", "giant", "uniform"]))
    if kind == "lognormal":
        lengths = np.minimum(np.exp(rng.normal(np.log(30), 1.2, n)), 2000).astype(np.int64) + 2
        costs = lengths.astype(np.float64) ** 2 + 1280.0 * lengths
    elif kind == "ties":
        costs = rng.integers(1, 3, n).astype(np.float64)
    elif kind == "giant":
        costs = rng.random(n) + 0.01
        if n:
            costs[rng.integers(n)] = 1e6
    else:
        costs = rng.random(n) * 100 + 1e-3
    homes = np.sort(rng.integers(0, world, n))  # global order is rank-major
    return costs, homes, world


@SETTINGS
@given(steps())
def test_every_sample_placed_exactly_once_on_a_valid_rank(step) -> None:
    costs, homes, world = step
    dest = place_samples(costs, homes, world)
    assert dest.shape == costs.shape and dest.dtype == np.int64
    assert ((dest >= 0) & (dest < world)).all()
    assert np.isclose(rank_loads(costs, dest, world).sum(), costs.sum())


@SETTINGS
@given(steps())
def test_placement_is_deterministic_for_the_same_input(step) -> None:
    costs, homes, world = step
    first = place_samples(costs, homes, world)
    again = place_samples(costs.copy(), homes.copy(), world)
    np.testing.assert_array_equal(first, again)


@SETTINGS
@given(steps())
def test_max_rank_cost_within_the_lpt_bound_and_never_above_home(step) -> None:
    costs, homes, world = step
    dest = place_samples(costs, homes, world)
    loads = rank_loads(costs, dest, world)
    if costs.size:
        bound = costs.sum() / world + costs.max()
        assert loads.max() <= bound * (1 + 1e-12)
        assert loads.max() <= rank_loads(costs, homes, world).max() * (1 + 1e-12)
        lpt = rank_loads(costs, lpt_bins(costs, world), world)
        assert loads.max() <= lpt.max() * (1 + 1e-12) or np.array_equal(dest, homes)


def test_a_balanced_step_moves_nothing() -> None:
    costs = np.array([5.0, 1.0, 4.0, 2.0, 3.0, 3.0])
    homes = np.array([0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(place_samples(costs, homes, 3), homes)


def test_a_giant_sample_sits_alone_and_the_rest_spread() -> None:
    costs = np.array([100.0, 1, 1, 1, 1, 1, 1])
    homes = np.array([0, 0, 0, 0, 1, 1, 1])
    dest = place_samples(costs, homes, 4)
    assert dest[0] == 0  # stays home, alone
    assert (dest[1:] != 0).all()
    assert sorted(np.bincount(dest[1:], minlength=4)[1:]) == [2, 2, 2]


def test_a_straggler_nobody_can_help_moves_nothing() -> None:
    costs = np.array([100.0, 1, 1, 1, 1, 1, 1])
    homes = np.array([0, 1, 1, 1, 1, 1, 1])  # the giant is alone already: max load cannot drop
    np.testing.assert_array_equal(place_samples(costs, homes, 4), homes)


def test_more_ranks_than_samples_leaves_ranks_empty() -> None:
    costs, homes = np.array([3.0, 2.0]), np.array([0, 0])
    dest = place_samples(costs, homes, 4)
    assert dest[0] == 0 and dest[1] != 0
    assert imbalance(rank_loads(costs, dest, 4)) == pytest.approx(3.0 / (5.0 / 4))


def test_min_gain_keeps_a_nearly_balanced_step_home() -> None:
    costs = np.array([10.0, 10.0, 10.0, 9.0, 9.0, 10.5])
    homes = np.array([0, 0, 0, 1, 1, 1])  # loads 30 / 28.5: LPT reaches 29.5, 1.7% below 30
    assert not np.array_equal(place_samples(costs, homes, 2), homes)
    np.testing.assert_array_equal(place_samples(costs, homes, 2, min_gain=0.02), homes)
    skewed = np.array([0, 0, 0, 0, 0, 1])  # loads 48 / 10.5: any gain threshold below 38% still moves
    assert not np.array_equal(place_samples(costs, skewed, 2, min_gain=0.3), skewed)


@SETTINGS
@given(steps(), st.floats(0.0, 0.5))
def test_min_gain_moves_only_for_a_gain_above_it(step, min_gain) -> None:
    costs, homes, world = step
    dest = place_samples(costs, homes, world, min_gain)
    if costs.size and not np.array_equal(dest, homes):
        home_max = rank_loads(costs, homes, world).max()
        assert rank_loads(costs, dest, world).max() < home_max * (1 - min_gain)


def test_bad_input_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="equal-length"):
        place_samples(np.ones(3), np.zeros(2, dtype=np.int64), 2)
    with pytest.raises(ValueError, match="world_size"):
        place_samples(np.ones(1), np.zeros(1, dtype=np.int64), 0)
