"""``mds_rows.RowDecoder`` decodes MDS rows exactly as streaming's ``MDSReader.decode_sample`` does."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.pipeline.dataset.mds_rows import SCALARS, RowDecoder, row_decoder


@st.composite
def layouts(draw) -> dict[str, str]:
    """Column name -> encoding: ``ndarray:<dtype>`` and scalars, at least one of each kind."""
    n = draw(st.integers(2, 6))
    encodings = [f"ndarray:{draw(st.sampled_from(SCALARS))}"]
    encodings.append(draw(st.sampled_from(SCALARS)))
    for _ in range(n - 2):
        dtype = draw(st.sampled_from(SCALARS))
        encodings.append(draw(st.sampled_from([dtype, f"ndarray:{dtype}"])))
    return {f"c{i}": e for i, e in enumerate(draw(st.permutations(encodings)))}


def _value(encoding: str, rng: np.random.Generator, shape: tuple[int, ...]) -> object:
    dtype = np.dtype(encoding.removeprefix("ndarray:"))
    if encoding.startswith("ndarray:"):
        return (rng.random(shape) * 200 - 100).astype(dtype)
    return dtype.type(rng.random() * 100)


# shapes whose largest dim needs a uint8, uint16 and uint32 in the datum's head, 1-D to 3-D
SHAPES = [(1,), (5,), (255,), (256,), (70_000,), (3, 4), (1, 300), (2, 1, 3)]


@settings(max_examples=30, deadline=None)
@given(layout=layouts(), shapes=st.lists(st.sampled_from(SHAPES), min_size=1, max_size=5), seed=st.integers(0, 2**16))
def test_rows_equal_streamings_decoding(tmp_path_factory, layout, shapes, seed) -> None:
    from streaming import MDSWriter
    from streaming.base.format import reader_from_json

    rng = np.random.default_rng(seed)
    out = tmp_path_factory.mktemp("mds")
    rows = [{name: _value(enc, rng, shape) for name, enc in layout.items()} for shape in shapes]
    with MDSWriter(columns=layout, out=str(out)) as writer:
        for row in rows:
            writer.write(row)
    shard = json.loads((out / "index.json").read_text())["shards"][0]
    reader = reader_from_json(str(out), None, shard)
    data = (out / shard["raw_data"]["basename"]).read_bytes()
    bounds = np.frombuffer(data, np.uint32, len(rows) + 1, 4).astype(np.int64)
    decoder = RowDecoder.of(shard["column_names"], shard["column_encodings"])
    ours = decoder.rows(data[int(bounds[0]) : int(bounds[-1])], bounds)
    for i, got in enumerate(ours):
        expected = reader.get_item(i)
        assert list(got) == list(expected)
        for name, value in expected.items():
            assert type(got[name]) is type(value), name
            assert np.shape(got[name]) == np.shape(value), name
            assert np.asarray(got[name]).dtype == np.asarray(value).dtype, name
            assert np.array_equal(got[name], value, equal_nan=True), name


@pytest.mark.parametrize("encoding", ["str", "pkl", "json", "bytes", "ndarray", "ndarray:int32:3,4", "int"])
def test_other_encodings_are_left_to_streaming(encoding) -> None:
    assert RowDecoder.of(["a", "b"], ["int64", encoding]) is None
    assert row_decoder(("a", "b"), ("int64", encoding)) is None


def test_a_row_whose_sizes_disagree_with_its_bytes_is_refused() -> None:
    decoder = RowDecoder.of(["a", "n"], ["ndarray:int32", "int64"])
    values = np.arange(3, dtype=np.int32)
    datum = bytes([1 << 2 | 0, 3]) + values.tobytes()  # 1-D, uint8 shape, 3 values
    row = np.uint32(len(datum)).tobytes() + datum + np.int64(7).tobytes()
    got = decoder.row(row, 0, len(row))
    assert np.array_equal(got["a"], values) and got["n"] == 7
    with pytest.raises(ValueError, match="take"):
        decoder.row(row + b"\0", 0, len(row) + 1)
    short = np.uint32(len(datum) - 4).tobytes() + datum[:-4] + np.int64(7).tobytes()
    with pytest.raises(ValueError, match="do not hold"):
        decoder.row(short, 0, len(short))
