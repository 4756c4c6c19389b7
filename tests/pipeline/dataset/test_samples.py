"""``sequence_arrays`` (pipeline/dataset/samples.py) maps a micro-batch's ids as the per-sample
construction does."""

from __future__ import annotations

import numpy as np
from collate_reference import per_sample_arrays
from hypothesis import given, settings
from hypothesis import strategies as st
from trainer_samples import make_samples

from freescale.pipeline.dataset.samples import CollateConfig, sequence_arrays
from freescale.pipeline.dataset.vocabulary import Vocabulary


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
