"""The specialised MDS sample encoders write exactly the bytes streaming's generic encoder writes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.pipeline.steps.mds_encode import encode_samples
from freescale.pipeline.steps.writer import LIST_COLUMNS, SCALAR_COLUMNS, fast_mds_writer, mds_columns


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


def test_fast_writer_passes_encoded_samples_through(tmp_path) -> None:
    """Workers encode (``encode_samples``); the writer must hand those bytes on untouched."""
    writer = fast_mds_writer(True, out=str(tmp_path / "fast"))
    encoded = b"\x01\x02\x03"
    assert writer.encode_sample(encoded) is encoded
    view = memoryview(encoded)
    assert writer.encode_sample(view) is view


def _table(samples: list[dict], with_features: bool) -> pa.Table:
    columns = {
        name: pa.array([s[name] for s in samples], pa.list_(pa.from_numpy_dtype(np.dtype(dtype))))
        for name, dtype in LIST_COLUMNS.items()
    }
    if with_features:
        columns["user_features"] = pa.array([s["user_features"] for s in samples], pa.list_(pa.int32()))
    kinds = {"int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64()}
    columns.update({name: pa.array([s[name] for s in samples], kinds[kind]) for name, kind in SCALAR_COLUMNS.items()})
    return pa.table(columns)


@settings(max_examples=15, deadline=None)
@given(with_features=st.booleans(), data=st.data())
def test_table_encoder_matches_streaming(tmp_path_factory, with_features, data) -> None:
    """``encode_samples`` (whole tables, in workers) writes the bytes ``MDSWriter.encode_sample`` writes."""
    from streaming import MDSWriter

    samples = data.draw(st.lists(sample_strategy(with_features), min_size=1, max_size=4))
    table = _table(samples, with_features)
    reference = MDSWriter(columns=mds_columns(with_features), out=str(tmp_path_factory.mktemp("mds")))
    encoded = encode_samples(table.slice(1), with_features)  # a sliced table: offsets must be honoured
    assert [e.as_py() for e in encoded] == [MDSWriter.encode_sample(reference, s) for s in samples[1:]]


def test_joint_shard_matches_streaming(tmp_path) -> None:
    from streaming import MDSWriter

    writer = fast_mds_writer(True, out=str(tmp_path / "fast"))
    writer.new_samples = [b"abc", memoryview(b"de"), b"", b"fghij" * 100]
    assert writer.encode_joint_shard() == MDSWriter.encode_joint_shard(writer)
    writer.new_samples = [b"xy", b"z" * 7]  # a smaller shard in the reused buffer: no stale bytes
    assert writer.encode_joint_shard() == MDSWriter.encode_joint_shard(writer)


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(0, 700), min_size=1, max_size=40), limit=st.sampled_from([None, 600, 1500, 5000]))
def test_bulk_write_cuts_the_shards_write_does(tmp_path_factory, sizes, limit) -> None:
    """``write_encoded`` is ``write`` per sample: same shard files, same index."""
    samples = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    one_by_one = tmp_path_factory.mktemp("write")
    with fast_mds_writer(False, out=str(one_by_one), size_limit=limit) as writer:
        for sample in samples:
            writer.write(sample)
    bulk = tmp_path_factory.mktemp("bulk")
    with fast_mds_writer(False, out=str(bulk), size_limit=limit) as writer:
        assert writer.write_encoded(iter(samples[:3])) + writer.write_encoded(samples[3:]) == len(samples)
    files = sorted(path.name for path in one_by_one.iterdir())
    assert files == sorted(path.name for path in bulk.iterdir())
    assert all((one_by_one / name).read_bytes() == (bulk / name).read_bytes() for name in files)


def test_finishing_a_part_does_not_poll_the_upload_queue(tmp_path, monkeypatch) -> None:
    """``MDSWriter`` waits for queued shard uploads with ``sleep(1)`` polls before it writes the
    index; ours drains the queue first, so no poll (and no idle second per part) happens."""
    import time

    import streaming.base.format.base.writer as base_writer

    def poll(seconds: float) -> None:
        raise AssertionError(f"MDSWriter polled its upload queue (sleep({seconds}))")

    monkeypatch.setattr(base_writer, "sleep", poll)
    writer = fast_mds_writer(False, out=str(tmp_path / "out"), size_limit=1 << 10)
    upload = writer.cloud_writer.upload_file
    monkeypatch.setattr(writer.cloud_writer, "upload_file", lambda name: (time.sleep(0.05), upload(name)))
    with writer:
        for _ in range(8):
            writer.write(b"x" * 600)  # a shard per sample: uploads queue up behind the slow one
    assert len(writer.shards) == 8 and (tmp_path / "out" / "index.json").exists()


LEAN_IMPORT_PROBE = """
import sys
from freescale.pipeline.streaming_modules import mds_writer_class, streaming_dataset_class
writer, dataset = mds_writer_class(), streaming_dataset_class()
heavy = sorted(m for m in ("transformers", "torchvision") if m in sys.modules)
lingering = "streaming" in sys.modules
import streaming
print(heavy, lingering, streaming.MDSWriter is writer, streaming.StreamingDataset is dataset)
"""


def test_streaming_classes_load_without_the_heavy_package_init(tmp_path) -> None:
    """The writer and dataset classes come without transformers/torchvision, leave no stand-in
    package behind, and are the very classes a later ``import streaming`` exposes."""
    result = subprocess.run(
        [sys.executable, "-c", LEAN_IMPORT_PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] == "[] False True True"
