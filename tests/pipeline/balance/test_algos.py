"""Partition kernels of the planner against one-at-a-time references (hypothesis).

The kernels are vectorised across steps (batched LPT, lockstep KK, block-wise swaps); these tests pin
them to the plain sequential definitions of docs/design.md#balancing and to their invariants: cardinality, the
greedy bound, and swaps that never raise a step's max bin or change its counts.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freescale.pipeline.balance.algos import (
    _lpt,
    _nearest_pairs,
    kk_equal,
    kk_free,
    lpt_equal,
    lpt_free,
    refine_swaps,
)
from freescale.pipeline.balance.step_membership import stable_group

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def rows(draw, width_max: int = 40):
    """``x[S, W]`` descending per row with per-row real sizes (zero padding after)."""
    g = draw(st.integers(1, 6))
    width = draw(st.integers(1, width_max))
    n_steps = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["pareto", "ties", "uniform"]))
    if kind == "pareto":
        x = np.floor(rng.pareto(1.0, (n_steps, width)) * 5)
    elif kind == "ties":
        x = rng.integers(0, 3, (n_steps, width)).astype(np.float64)
    else:
        x = rng.random((n_steps, width))
    sizes = rng.integers(0, width + 1, n_steps)
    x = np.where(np.arange(width) < sizes[:, None], -np.sort(-x, axis=1), 0.0)
    return g, x, sizes


def _sequential_lpt(x: np.ndarray, g: int, m: int, constrained: bool) -> np.ndarray:
    q, rem = m // g, m % g
    loads, counts, n_big = np.zeros(g), np.zeros(g, dtype=int), 0
    for v in x[:m]:
        free = (counts < q) | ((counts == q) & (n_big < rem)) if constrained else np.ones(g, bool)
        b = int(np.argmin(np.where(free, loads, np.inf)))
        n_big += bool(counts[b] == q)
        loads[b] += v
        counts[b] += 1
    return loads


@SETTINGS
@given(data=rows())
def test_lpt_matches_sequential_definition(data) -> None:
    g, x, sizes = data
    for constrained, kernel in ((True, lpt_equal), (False, lpt_free)):
        bins = kernel(x, g, sizes=sizes)
        for s, m in enumerate(sizes):
            loads = np.bincount(bins[s, :m], weights=x[s, :m], minlength=g)
            ref = _sequential_lpt(x[s], g, int(m), constrained)
            assert np.isclose(loads.max(), ref.max())
            counts = np.bincount(bins[s, :m], minlength=g)
            if constrained:
                assert counts.max() - counts.min() <= 1
            elif m >= g:
                assert counts.min() >= 1
            if m:
                assert loads.max() <= x[s, :m].sum() / g + x[s, 0] + 1e-9


@SETTINGS
@given(data=rows(width_max=80))
def test_lpt_free_of_one_step_is_the_batched_kernel(data) -> None:
    """The plain-Python one-step path (the online balancer's) gives the batched kernel's exact bins."""
    g, x, sizes = data
    for row, m in zip(x, sizes):
        one = row[None, : int(m)]
        np.testing.assert_array_equal(lpt_free(one, g), _lpt(one, g, None, False))


@SETTINGS
@given(data=rows())
def test_kk_equal_one_item_per_round(data) -> None:
    g, x, _ = data
    width = -(-x.shape[1] // g) * g
    x = np.pad(x, ((0, 0), (0, width - x.shape[1])))
    bins = kk_equal(x, g)
    rounds = bins.reshape(x.shape[0], -1, g)
    assert np.all(np.sort(rounds, axis=2) == np.arange(g))  # cardinality: one per bin per round
    for s in range(x.shape[0]):
        loads = np.bincount(bins[s], weights=x[s], minlength=g)
        assert loads.max() <= x[s].sum() / g + x[s].max() + 1e-9


@SETTINGS
@given(data=rows(), head=st.integers(0, 12))
def test_kk_free_loads_consistent(data, head: int) -> None:
    g, x, _ = data
    bins, loads = kk_free(x, g, head)
    h = bins.shape[1]
    assert h == min(head, x.shape[1])
    for s in range(x.shape[0]):
        assert np.allclose(np.bincount(bins[s], weights=x[s, :h], minlength=g), loads[s])
        if h:
            assert loads[s].max() <= x[s, :h].sum() / g + x[s, :h].max() + 1e-9


@SETTINGS
@given(data=rows(width_max=60), iterations=st.integers(1, 30))
def test_swaps_never_raise_max_and_keep_counts(data, iterations: int) -> None:
    g, x, sizes = data
    n_steps = x.shape[0]
    c = max(1, -(-x.shape[1] // g))
    rng = np.random.default_rng(int(sizes.sum()))
    vals = np.full((n_steps, g, c), np.nan)
    for s in range(n_steps):  # a random (unbalanced) layout of each step's items
        slots = rng.permutation(g * c)[: sizes[s]]
        vals[s].ravel()[slots] = x[s, : sizes[s]]
    idx = np.where(np.isnan(vals), -1, np.arange(vals.size).reshape(vals.shape))
    before = np.nansum(vals, axis=2)
    new_vals, new_idx, _ = refine_swaps(vals, idx, iterations)
    after = np.nansum(new_vals, axis=2)
    assert np.all(after.max(1) <= before.max(1) * (1 + 1e-12) + 1e-12)
    assert np.all(after.min(1) >= before.min(1) * (1 - 1e-12) - 1e-12)
    assert np.array_equal(np.isnan(new_vals), np.isnan(vals))  # counts per bin unchanged
    for s in range(n_steps):  # the same items, moved together with their ids
        ok = new_idx[s] >= 0
        assert np.array_equal(np.sort(new_idx[s][ok]), np.sort(idx[s][idx[s] >= 0]))
        assert np.array_equal(new_vals[s][ok], vals.ravel()[new_idx[s][ok]])


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), c=st.integers(1, 70))
def test_nearest_pairs_matches_exhaustive(seed: int, c: int) -> None:
    rng = np.random.default_rng(seed)
    va, vb = rng.random((3, c)) * 10, rng.random((3, c)) * 10
    va[rng.random((3, c)) < 0.2] = -np.inf
    vb[rng.random((3, c)) < 0.2] = np.inf
    delta = rng.random(3) * 3
    flat, score = _nearest_pairs(va, vb, delta)
    with np.errstate(invalid="ignore"):
        full = np.abs(va[:, :, None] - vb[:, None, :] - delta[:, None, None]).reshape(3, -1)
    full = np.where(np.isnan(full), np.inf, full)
    best = full.min(axis=1)
    finite = np.isfinite(best)
    assert np.allclose(score[finite], best[finite])
    assert np.allclose(full[np.arange(3), flat][finite], best[finite])


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 300), top=st.sampled_from([1, 300, 70_000, 2**40]))
def test_stable_group_is_a_stable_argsort(seed: int, n: int, top: int) -> None:
    keys = np.random.default_rng(seed).integers(0, top, n)
    assert np.array_equal(stable_group(keys), np.argsort(keys, kind="stable"))
