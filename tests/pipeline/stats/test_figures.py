"""Figures of ``freescale stats`` against analytic values and brute force, on arrays (no readers).

Sparsity (paper Eq. 1) for fixed and two known lengths, padded compute, batch_overlap_rate from the
spill/reduce machinery against Python sets (several layouts, buckets, packed and 63-bit ids),
disjoint → 0 and identical → 1, modulo hash collisions of known ids, the Zipf fit on exact and
sampled Zipf data, straggler predictions through the balance helpers, and the user sampling hash.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freescale.pipeline.balance import BalanceConfig, plan_bin_costs, plan_step_groups, predict_straggler_pct
from freescale.pipeline.cost import CostModel
from freescale.pipeline.stats import figures
from freescale.pipeline.stats import ids as stats_ids
from freescale.pipeline.stats.inputs import selected

ATTENTION_ONLY = CostModel(a=1.0, b=0.0)


# ------------------------------------------------------------------------------------------ sparsity
def test_fixed_lengths_have_zero_sparsity_and_waste() -> None:
    lengths = np.full(96, 37)
    out = figures.sparsity(lengths, figures.equal_offsets(96, 32), CostModel(a=3.0, b=5.0, c=1.0))
    assert out["batches"] == 3
    assert out["sparsity"] == 0.0 and out["sparsity_mean"] == 0.0
    assert out["wasted_compute_pct"] == pytest.approx(0.0, abs=1e-12)
    assert out["attention_wasted_pct"] == pytest.approx(0.0, abs=1e-12)


def test_two_known_lengths_give_exact_eq1() -> None:
    # one batch of 3 × L=5 and 1 × L=20: 1 - 35 / (4 · 20) = 0.5625; a second batch of only 20s: 0
    lengths = np.array([5, 5, 20, 5, 20, 20, 20, 20])
    out = figures.sparsity(lengths, figures.equal_offsets(8, 4), ATTENTION_ONLY)
    assert out["sparsity_mean"] == pytest.approx((0.5625 + 0.0) / 2)
    assert out["sparsity"] == pytest.approx(1 - (35 + 80) / (4 * 20 + 4 * 20))
    # attention-only cost: padded 8 · 400 = 3200, jagged 3·25 + 5·400 = 2075
    assert out["attention_wasted_pct"] == pytest.approx(100 * (1 - 2075 / 3200))
    assert out["wasted_compute_pct"] == pytest.approx(100 * (1 - 2075 / 3200))
    assert out["padded_cost"] == 3200 and out["jagged_cost"] == 2075


def test_sparsity_with_variable_micro_batches_and_partial_tail() -> None:
    lengths = np.array([1, 3, 2, 2, 2, 9])
    out = figures.sparsity(lengths, np.array([0, 2, 5, 5, 6]), ATTENTION_ONLY)  # an empty micro-batch
    assert out["batches"] == 3
    assert out["sparsity"] == pytest.approx(1 - 19 / (2 * 3 + 3 * 2 + 1 * 9))
    assert figures.equal_offsets(10, 4).tolist() == [0, 4, 8]  # partial tail dropped


# ------------------------------------------------------------------------------------------ overlap
def _reduce(
    tmp_path, per_sample_items: list[np.ndarray], sizes: list[int], n_buckets: int = 1, table_sizes=(10,)
) -> stats_ids.IdReducer:
    """Run samples (in batch order) through spill_chunk/IdReducer like the stats passes do."""
    n = len(per_sample_items)
    g0, layouts = stats_ids.fine_batches_equal(n, sizes)
    bits = stats_ids.fine_bits(layouts[0].batch_of_fine.size)
    fine = np.arange(n) // g0
    lengths = np.array([len(x) for x in per_sample_items])
    items = np.concatenate(per_sample_items).astype(np.int64)
    half = n // 2  # two chunks, like two partitions
    cut = int(lengths[:half].sum())
    for chunk, (rows, events) in enumerate([(slice(0, half), slice(0, cut)), (slice(half, n), slice(cut, None))]):
        stats_ids.spill_chunk(
            str(tmp_path),
            chunk,
            n_buckets,
            bits,
            np.repeat(fine[rows], lengths[rows]),
            items[events],
            np.zeros(int(lengths[rows].sum()), np.int64),
            fine[rows],
            np.arange(n)[rows] * 7,
            None,
        )
    reducer = stats_ids.IdReducer(stats_ids.table_names([]), table_sizes, layouts, bits)
    for b in range(n_buckets):
        for j in range(len(reducer.tables)):
            reducer.merge(reducer.count(str(tmp_path), b, j))
    assert not list(tmp_path.glob(f"*{stats_ids.SPILL_SUFFIX}"))
    return reducer


def _brute_overlap(per_sample_items: list[np.ndarray], size: int) -> list[float]:
    batches = [
        set(np.concatenate(per_sample_items[i : i + size]).tolist())
        for i in range(0, len(per_sample_items) - size + 1, size)
    ]
    return [len(b & a) / len(b) for a, b in itertools.pairwise(batches) if b]


def test_disjoint_batches_overlap_zero_identical_batches_one(tmp_path) -> None:
    disjoint = [np.arange(10) + 10 * i for i in range(16)]
    (tmp_path / "a").mkdir()
    reducer = _reduce(tmp_path / "a", disjoint, [4])
    assert reducer.overlap_report(0)["item"]["batch_overlap_rate"] == 0.0
    assert reducer.overlap_report(0)["user"]["batch_overlap_rate"] == 0.0
    identical = [np.array([3, 1, 4, 1, 5]) for _ in range(16)]
    (tmp_path / "b").mkdir()
    reducer = _reduce(tmp_path / "b", identical, [4, 8])
    for index in (0, 1):
        report = reducer.overlap_report(index)["item"]
        assert report["batch_overlap_rate"] == 1.0 and report["stderr"] in (0.0, None)
        assert report["mean_unique_ids"] == 4.0
    assert reducer.overlap_report(0)["action"]["batch_overlap_rate"] == 1.0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(2, 60),
    vocab=st.sampled_from([5, 50, 10**6]),
    big=st.booleans(),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=3, unique=True),
    buckets=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    wide=st.booleans(),
)
def test_overlap_and_popularity_match_brute_force(tmp_path_factory, n, vocab, big, sizes, buckets, seed, wide) -> None:
    rng = np.random.default_rng(seed)
    offset = (1 << 62) + 12345 if big else 0  # 63-bit ids take the raw (ranked) path
    # wide: the second chunk's ids need int64 keys while the first chunk's fit uint32 ones
    shift = [(1 << 40) if wide and not big and i >= n // 2 else 0 for i in range(n)]
    samples = [rng.integers(0, vocab, rng.integers(1, 9)) + offset + shift[i] for i in range(n)]
    reducer = _reduce(tmp_path_factory.mktemp("spill"), samples, sizes, buckets, table_sizes=(7, 1000))
    for index, size in enumerate(sizes):
        report = reducer.overlap_report(index)["item"]
        expected = _brute_overlap(samples, size)
        if not expected:
            assert report["batch_overlap_rate"] is None
        else:
            assert report["pairs"] == len(expected)
            assert report["batch_overlap_rate"] == pytest.approx(float(np.mean(expected)))
    flat = np.concatenate(samples)
    values, counts = np.unique(flat, return_counts=True)
    j = reducer.tables.index("item")
    assert reducer.distinct[j] == values.size and reducer.occurrences[j] == flat.size
    assert reducer.min_id[j] == values.min() and reducer.max_id[j] == values.max()
    f, m = np.unique(counts, return_counts=True)
    assert dict(reducer.freq_of_freq[j]) == dict(zip(f.tolist(), m.tolist()))
    ids = reducer.ids_report()["item"]
    for t in (7, 1000):
        _, per_row = np.unique(values % t, return_counts=True)
        assert ids["colliding_ids"][str(t)] == int(per_row[per_row > 1].sum())


def test_modulo_hashing_of_known_ids_gives_exact_collisions(tmp_path) -> None:
    # ids 0..49 and 1000..1049 and 7: modulo 1000, 0..49 share rows with 1000..1049; 7 also with 1007
    samples = [np.array([i, 1000 + i]) for i in range(50)] + [np.array([7])]
    reducer = _reduce(tmp_path, samples, [1], table_sizes=(1000, 2000, 10))
    ids = reducer.ids_report()["item"]
    assert ids["unique_ids"] == 100
    assert ids["colliding_ids"] == {"1000": 100, "2000": 0, "10": 100}
    assert ids["hash_collision_rate"]["1000"] == 1.0 and ids["hash_collision_rate"]["2000"] == 0.0
    assert ids["rows_used"] == {"1000": 50, "2000": 100, "10": 10}
    samples = [np.array([0, 1, 2, 3, 13])]  # T = 10: rows 0, 1, 2, 3, 3 → 2 of 5 ids collide
    (tmp_path / "b").mkdir()
    reducer = _reduce(tmp_path / "b", samples * 2, [1], table_sizes=(10,))
    assert reducer.ids_report()["item"]["hash_collision_rate"]["10"] == pytest.approx(0.4)
    assert figures.expected_collision_rate(1, 10) == 0.0
    assert figures.expected_collision_rate(2, 10) == pytest.approx(0.1)


def test_fine_tracker_refines_step_groups_and_equal_batches_across_chunks() -> None:
    tracker = stats_ids.FineTracker([4, 6])  # g0 = 2
    groups = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    positions = np.arange(10)
    fine = np.concatenate([tracker.assign(positions[:5], groups[:5]), tracker.assign(positions[5:], groups[5:])])
    layouts = tracker.layouts(10, 3, None)
    by_name = {layout.name: layout for layout in layouts}
    assert by_name["step_group"].batch_of_fine[fine].tolist() == groups.tolist()
    assert by_name["global_batch_4"].batch_of_fine[fine].tolist() == (positions // 4).tolist()
    assert by_name["global_batch_6"].batch_of_fine[fine].tolist() == (positions // 6).tolist()
    assert np.all(np.diff(fine) >= 0)


# ------------------------------------------------------------------------------------------ popularity
def test_zipf_fit_recovers_exact_and_sampled_exponents() -> None:
    ranks = np.arange(1, 20001)
    exact = np.round(1e7 * ranks**-1.2).astype(np.int64)
    values, mult = np.unique(exact[exact > 0], return_counts=True)
    fit = figures.zipf_fit(dict(zip(values.tolist(), mult.tolist())), min_count=10)
    assert fit["zipf_exponent"] == pytest.approx(1.2, abs=0.01)
    from freescale.datasets.generator_config import GeneratorConfig
    from freescale.datasets.synthetic import ItemSampler

    for s in (0.9, 1.3):
        sampler = ItemSampler(GeneratorConfig(n_items=50_000, zipf=s))
        draws = sampler.draw(np.random.default_rng(1), 400_000)
        _, counts = np.unique(draws, return_counts=True)
        f, m = np.unique(counts, return_counts=True)
        pop = figures.popularity(dict(zip(f.tolist(), m.tolist())), min_count=10)
        assert pop["zipf_exponent"] == pytest.approx(s, abs=0.05)
        assert pop["occurrences"] == 400_000 and 0 < pop["top_share"]["top_1pct"] < 1
    assert figures.zipf_fit({1: 100}, min_count=10)["zipf_exponent"] is None


# ------------------------------------------------------------------------------------------ stragglers
def test_predictions_use_the_balance_planner() -> None:
    costs = np.random.default_rng(0).lognormal(0, 1.2, 4 * 8 * 10) ** 2
    out = figures.predict_strategies(costs, 4, 8, seed=3)
    plan = plan_step_groups(
        costs, BalanceConfig(group_size=4, micro_batch_size=8, strategy="random", seed=3, compare_baselines=False)
    )
    assert out["random"]["straggler_pct"] == round(predict_straggler_pct(plan_bin_costs(plan, costs, 4)), 4)
    assert out["random"]["steps"] == 10 and out["random"]["stderr"] > 0
    assert out["random"]["straggler_pct"] > out["within_step"]["straggler_pct"] >= out["planned"]["straggler_pct"]
    assert out["within_step"]["max_over_lower_bound"]["max"] >= 1.0
    assert out["planned"]["imbalance"]["max"] <= out["random"]["imbalance"]["max"]
    short = figures.predict_strategies(costs[:31], 4, 8, seed=0)
    assert short["random"]["straggler_pct"] is None and "fewer than one step" in short["random"]["reason"]
    plan_out = figures.plan_figures(np.ones(8), group_size=8, world_size=3)
    assert plan_out["straggler_pct"] is None and "does not divide" in plan_out["reason"]
    assert figures.plan_figures(np.ones(8), group_size=8, world_size=4)["straggler_pct"] == 0.0


def test_length_summary_and_histogram() -> None:
    lengths = np.arange(1, 101)
    out = figures.length_summary(lengths, (50, 90))
    assert out["count"] == 100 and out["mean"] == 50.5 and out["max"] == 100
    assert out["p50"] == np.percentile(lengths, 50) and out["share_above"] == {"50": 0.5, "90": 0.1}
    assert out["stderr"] is None
    estimated = figures.length_summary(lengths, (50,), estimated=True)
    assert estimated["stderr"]["mean"] == pytest.approx(lengths.std(ddof=1) / 10)
    assert estimated["stderr"]["p50"] > 0
    edges = figures.log_bin_edges(100, 20)
    assert edges[0] == 1 and edges[-1] == 101 and np.all(np.diff(edges) > 0)
    assert sum(figures.histogram(lengths, edges)) == 100


def test_user_sampling_is_deterministic_and_close_to_the_fraction() -> None:
    users = np.arange(200_000, dtype=np.int64) * 7919
    keep = selected(users, 0.1)
    assert keep.mean() == pytest.approx(0.1, abs=0.005)
    assert np.array_equal(keep, selected(users, 0.1))
    assert np.all(selected(users, 0.2)[keep])  # nested: a larger fraction keeps everyone a smaller one did
    assert selected(users, 1.0).all()


# ------------------------------------------------------------------------------------------ plots
def test_log_axes_drop_minor_ticks_only_where_they_carry_no_labels() -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogLocator, NullLocator

    from freescale.pipeline.stats.plots import _light_log_ticks

    ax = Figure().add_subplot()
    ax.plot([1.0, 5e4], [20.0, 80.0])  # x: 4.7 decades, y: 0.6 of a decade (read from minor labels)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _light_log_ticks(ax)
    assert isinstance(ax.xaxis.get_minor_locator(), NullLocator)
    assert isinstance(ax.yaxis.get_minor_locator(), LogLocator) and ax.yaxis.get_minorticklocs().size
    assert isinstance(ax.xaxis.get_major_locator(), LogLocator) and ax.xaxis.get_majorticklocs().size
    linear = Figure().add_subplot()
    linear.plot([0.0, 1e6], [0.0, 1.0])
    minor = type(linear.xaxis.get_minor_locator())
    _light_log_ticks(linear)
    assert type(linear.xaxis.get_minor_locator()) is minor  # linear axes are left alone
