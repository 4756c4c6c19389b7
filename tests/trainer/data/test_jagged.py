"""Length groups and the jagged layout (trainer/data/jagged.py): bounded attention work, the cheapest
admissible cut, and the numpy layout equal to the torch construction bit for bit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from collate_reference import torch_build_layout
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.trainer.data.jagged import (
    GROUP_OVERHEAD_ELEMENTS,
    build_layout,
    group_by_length,
    padded_sum_of_squares,
)


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
