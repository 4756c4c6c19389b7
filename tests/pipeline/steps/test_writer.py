"""The specialised MDS sample encoder and shard writer write exactly the bytes streaming's MDSWriter writes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.pipeline.steps.mds_encode import encode_samples
from freescale.pipeline.steps.writer import LIST_COLUMNS, SCALAR_COLUMNS, mds_columns, part_writer


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


def _streaming_part(out, samples: list[bytes], limit: int | None, with_features: bool) -> None:
    """The reference: streaming's own ``MDSWriter`` writing the same encoded samples."""
    from streaming import MDSWriter

    class Encoded(MDSWriter):
        def encode_sample(self, sample: bytes) -> bytes:
            return sample

    with Encoded(columns=mds_columns(with_features), out=str(out), size_limit=limit, hashes=["xxh64"]) as writer:
        for sample in samples:
            writer.write(sample)


def _files(directory) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 700), min_size=1, max_size=40),
    limit=st.sampled_from([None, 600, 1500, 5000]),
    with_features=st.booleans(),
)
def test_shard_writer_writes_mdswriters_files(tmp_path_factory, sizes, limit, with_features) -> None:
    """``ShardWriter`` (no torch) writes the shards and ``index.json`` ``MDSWriter`` writes, byte for
    byte: the same shard cuts (a sample over the limit included), headers, hashes and index."""
    samples = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    reference = tmp_path_factory.mktemp("streaming") / "part"
    _streaming_part(reference, samples, limit, with_features)
    ours = tmp_path_factory.mktemp("ours") / "part"
    with part_writer(with_features, str(ours), limit) as writer:
        assert writer.write_encoded(iter(samples[:3])) + writer.write_encoded(samples[3:]) == len(samples)
    assert _files(ours) == _files(reference)


def test_flushing_a_shard_holds_neither_the_size_limit_nor_a_second_copy(tmp_path, monkeypatch) -> None:
    """A shard is written in runs of ``WRITE_CHUNK`` bytes: the bytes match ``MDSWriter``'s across run
    boundaries, and flushing allocates a run, not the size limit (a whole-shard buffer zero-filled all
    64 MB of the default limit for a shard of a few KB, and took ``prepare --memory-limit 256MB`` to
    272 MB in CI)."""
    import tracemalloc

    from freescale.pipeline.steps import mds_shards

    monkeypatch.setattr(mds_shards, "WRITE_CHUNK", 1000, raising=False)
    samples = [bytes([i % 251]) * (300 + i) for i in range(40)]
    reference, ours = tmp_path / "streaming", tmp_path / "ours"
    _streaming_part(reference, samples, 64 << 20, False)
    tracemalloc.start()
    with part_writer(False, str(ours), 64 << 20) as writer:
        writer.write_encoded(samples)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert _files(ours) == _files(reference)
    assert peak < 1 << 20, f"flushing a {sum(map(len, samples)):,}-byte shard peaked at {peak:,} bytes"


def test_shard_writer_output_reads_back_with_streaming(tmp_path) -> None:
    """Shards written without streaming read back through ``StreamingDataset`` sample for sample."""
    from freescale.pipeline.streaming_modules import streaming_dataset_class

    rng = np.random.default_rng(0)
    samples = [
        {
            **{name: rng.integers(0, 1000, n).astype(dtype) for name, dtype in LIST_COLUMNS.items()},
            **{name: i for name in SCALAR_COLUMNS},
        }
        for i, n in enumerate([1, 5, 300, 2, 70])
    ]
    for sample in samples:
        sample["cost"] = float(sample["cost"])
    encoded = encode_samples(_table(samples, False), False)
    with part_writer(False, str(tmp_path / "ds"), 1 << 16) as writer:
        writer.write_encoded(e.as_py() for e in encoded)
    dataset = streaming_dataset_class()(local=str(tmp_path / "ds"), shuffle=False, batch_size=1)
    for i, sample in enumerate(samples):
        row = dataset[i]
        assert all(np.array_equal(row[name], sample[name]) for name in LIST_COLUMNS)
        assert all(row[name] == sample[name] for name in SCALAR_COLUMNS)


def test_writing_a_part_does_not_import_torch(tmp_path) -> None:
    """The write step's imports stay light: no torch (what made Ray's write workers 1.2 GB)."""
    probe = (
        "import sys; from freescale.pipeline.steps.writer import part_writer\n"
        f"with part_writer(False, {str(tmp_path / 'p')!r}, None) as w: w.write_encoded([b'abc'])\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "False"


LEAN_IMPORT_PROBE = """
import sys
from freescale.pipeline.streaming_modules import streaming_dataset_class
dataset = streaming_dataset_class()
heavy = sorted(m for m in ("transformers", "torchvision") if m in sys.modules)
lingering = "streaming" in sys.modules
import streaming
print(heavy, lingering, streaming.StreamingDataset is dataset)
"""


def test_streaming_classes_load_without_the_heavy_package_init(tmp_path) -> None:
    """The dataset class comes without transformers/torchvision, leaves no stand-in package
    behind, and is the very class a later ``import streaming`` exposes."""
    result = subprocess.run(
        [sys.executable, "-c", LEAN_IMPORT_PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] == "[] False True"
