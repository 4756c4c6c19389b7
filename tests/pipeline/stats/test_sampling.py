"""``freescale stats`` on a sample of the users: ``--sample-fraction``'s determinism and error estimates,
sampled lengths equal to the sampled users' exact lengths, k-core with sampling, and counting per user
(no sample build) giving the built samples' figures.
"""

from __future__ import annotations

import numpy as np
import pytest
from stats_options import FAST

from freescale.pipeline.config import SampleConfig
from freescale.pipeline.stats import StatsConfig, compute_stats


def test_sample_fraction_is_deterministic_and_reports_errors(tiny) -> None:
    config = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "sample_fraction": 0.5, **FAST}
    first, second = compute_stats(StatsConfig(**config)), compute_stats(StatsConfig(**config))
    first.pop("runtime_s"), second.pop("runtime_s")
    assert first == second
    sample = first["sample"]
    assert sample["estimated"] and "splitmix64" in sample["method"] and "stderr" in sample["errors"]
    assert 0.3 * sample["samples_total"] < sample["samples_selected"] < 0.7 * sample["samples_total"]
    assert first["lengths"]["merged"]["count"] == sample["samples_selected"]
    assert first["lengths"]["merged"]["stderr"]["p90"] > 0
    full = compute_stats(StatsConfig(**{**config, "sample_fraction": 1.0}))
    assert not full["sample"]["estimated"] and full["lengths"]["merged"]["stderr"] is None
    assert (
        abs(first["lengths"]["merged"]["mean"] - full["lengths"]["merged"]["mean"])
        < 5 * (first["lengths"]["merged"]["stderr"]["mean"])
    )


def test_sampled_lengths_are_the_sampled_users_exact_lengths(tiny, prepared) -> None:
    """Without k-core the sample is taken while reading (only sampled users' rows are converted and
    built): the figures are the exact figures of those users' samples (checked against the prepared
    dataset's rows), totals still cover every user, and the rows left out are accounted for."""
    from freescale.datasets.ids import selected
    from freescale.pipeline.dataset.reader import PreparedDataset

    out, manifest = prepared
    base = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "samples": SampleConfig(max_uih_len=2048)}
    report = compute_stats(StatsConfig(**base, sample_fraction=0.4, **FAST))
    dataset = PreparedDataset(out)
    rows = [dataset.rows[i] for i in range(int(dataset.offsets[-1]))]
    users = np.array([int(r["user_id"]) for r in rows])
    lengths = np.array([int(r["length"]) for r in rows])[selected(users, 0.4)]
    merged = report["lengths"]["merged"]
    assert (merged["count"], merged["events"], merged["max"]) == (lengths.size, lengths.sum(), lengths.max())
    edges = report["lengths"]["histogram"]["edges"]
    assert report["lengths"]["histogram"]["merged"] == np.histogram(lengths, edges)[0].tolist()
    assert report["sample"]["samples_total"] == manifest["rows"]["samples"] == len(rows)
    assert report["sample"]["users_total"] == np.unique(users).size
    accounting = report["rows"]
    assert accounting["balanced"] and accounting["events_read"] == manifest["rows"]["events_read"]
    assert accounting["events_filtered"]["by_reason"]["sample_fraction"] > 0
    assert accounting["events_used"] == lengths.sum()


def test_sampled_with_kcore_builds_every_user_then_keeps_the_sample(tiny) -> None:
    """k-core counts items over every user, so with --kcore the scan keeps everyone and the sample is
    taken when the id records are spilled: the accounting is the exact run's."""
    base = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "samples": SampleConfig(kcore=2), **FAST}
    full = compute_stats(StatsConfig(**base))
    part = compute_stats(StatsConfig(**base, sample_fraction=0.4))
    assert part["rows"] == full["rows"] and "sample_fraction" not in part["rows"]["events_filtered"]["by_reason"]
    assert part["sample"]["samples_total"] == full["sample"]["samples_total"]
    assert 0 < part["sample"]["samples_selected"] < full["sample"]["samples_selected"]
    assert part["lengths"]["merged"]["max"] <= full["lengths"]["merged"]["max"]


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_counting_per_user_gives_the_built_samples_figures(tiny, monkeypatch, fraction) -> None:
    """Without windows, k-core or truncation a sample is all of its user's events: the partition step
    counts per user (``count_partition``, no time sort) and every figure and the row accounting equal
    those of building the samples with prepare's sequence builder (``run_partition``)."""
    from freescale.pipeline.stats import sources

    samples = SampleConfig(min_len=8)  # drops some users: the min_len accounting is exercised
    config = StatsConfig(
        input=tiny, world_sizes=(2,), micro_batch_size=4, samples=samples, sample_fraction=fraction, **FAST
    )
    calls = []
    monkeypatch.setattr(sources, "count_partition", _spy(sources.count_partition, calls))
    counted = compute_stats(config)
    assert calls and counted["rows"]["events_filtered"]["by_reason"]["min_len"] > 0
    monkeypatch.setattr(sources, "order_free", lambda cfg, counts: False)
    built = compute_stats(config)
    counted.pop("runtime_s"), built.pop("runtime_s")
    assert counted == built
    assert not sources.order_free(SampleConfig(max_uih_len=8), np.array([3, 9]))  # 9 > 8: truncated
    assert not sources.order_free(SampleConfig(window_stride=4), np.array([3]))


def _spy(fn, calls: list):
    def spy(*args, **kwargs):
        calls.append(args)
        return fn(*args, **kwargs)

    return spy
