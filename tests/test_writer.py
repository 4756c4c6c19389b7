"""The specialised MDS sample encoder writes exactly the bytes streaming's generic encoder writes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.pipeline.writer import LIST_COLUMNS, SCALAR_COLUMNS, fast_mds_writer


def sample_strategy(with_features: bool):
    lengths = st.sampled_from([1, 2, 255, 256, 300, 65_535, 65_536, 70_000])
    scalars = {name: st.integers(-(2**31), 2**31 - 1) for name in SCALAR_COLUMNS}
    scalars["cost"] = st.floats(0, 1e18, allow_nan=False)

    @st.composite
    def build(draw):
        n = draw(lengths)
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        sample = {name: rng.integers(-100, 2**20, n).astype(dtype) for name, dtype in LIST_COLUMNS.items()}
        if with_features:
            sample["user_features"] = rng.integers(-1, 50, draw(st.integers(1, 4))).astype(np.int32)
        sample.update({name: draw(strategy) for name, strategy in scalars.items()})
        return sample

    return build()


@settings(max_examples=40, deadline=None)
@given(sample=sample_strategy(with_features=True))
def test_fast_encoder_matches_streaming_with_features(tmp_path_factory, sample) -> None:
    from streaming import MDSWriter

    out = tmp_path_factory.mktemp("mds")
    writer = fast_mds_writer(True, out=str(out / "fast"))
    reference = MDSWriter(columns=writer.columns, out=str(out / "ref"))
    assert writer.encode_sample(sample) == MDSWriter.encode_sample(reference, sample)


@settings(max_examples=20, deadline=None)
@given(sample=sample_strategy(with_features=False))
def test_fast_encoder_matches_streaming_without_features(tmp_path_factory, sample) -> None:
    from streaming import MDSWriter

    out = tmp_path_factory.mktemp("mds")
    writer = fast_mds_writer(False, out=str(out / "fast"))
    reference = MDSWriter(columns=writer.columns, out=str(out / "ref"))
    assert writer.encode_sample(sample) == MDSWriter.encode_sample(reference, sample)
