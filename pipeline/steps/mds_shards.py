"""MDS shards and their ``index.json`` from already-encoded samples, without mosaicml-streaming.

``streaming.MDSWriter`` imports torch (via ``streaming.base``): ~2 s of CPU and ~500 MB resident in
every process that writes a part. With the Ray executor that is each task worker that runs a write
task (measured on ``large``: 1.6 s of warm-up across the write tasks, and 1.23 GB per worker, which
put a started runtime at ~3 GB against a 2 GB ``--memory-limit``). The write step only needs
shard framing, a hash and a JSON index, so this module writes them itself.

The bytes are ``MDSWriter``'s (``columns``, ``hashes``, ``size_limit``, no compression), file for
file: ``tests/pipeline/steps/test_writer.py`` writes the same samples with both and compares every file, and reads
ours back with ``StreamingDataset``. A shard is

    uint32 sample count | uint32 offsets (count + 1, from the file start) | config JSON | samples

where the config is ``MDSWriter.get_config()`` serialised with ``sort_keys``. A new shard starts when
the next sample (plus 4 bytes for its offset) would take the shard past ``size_limit``, counting the
shard's fixed bytes (8 + config), exactly as ``Writer.write`` decides; like it, a sample bigger than
the limit flushes the (possibly empty) shard before it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from freescale import storage

INDEX_NAME = "index.json"
FORMAT_VERSION = 2
BYTES_PER_SAMPLE_OFFSET = 4  # MDSWriter.extra_bytes_per_sample
# MDS column encodings this writer knows, and their fixed sizes (None: variable, a uint32 in the
# sample's head); ``streaming.base.format.mds.encodings.get_mds_encoded_size`` gives the same
FIXED_SIZES: dict[str, int | None] = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
}
HASHES = {"xxh64": xxhash.xxh64}
WRITE_CHUNK = 1 << 20  # bytes joined per write and hash update when a shard is flushed


def _column_size(encoding: str) -> int | None:
    if encoding.startswith("ndarray:"):
        return None  # the ``ndarray:<dtype>`` datum carries its shape: variable size
    if encoding not in FIXED_SIZES:
        raise ValueError(f"MDS column encoding {encoding!r} is not supported here (known: ndarray:*, {FIXED_SIZES})")
    return FIXED_SIZES[encoding]


def shard_config(columns: dict[str, str], hashes: list[str], size_limit: int | None) -> dict[str, Any]:
    """``MDSWriter.get_config()``: what every shard header and every index entry repeats."""
    names = sorted(columns)
    return {
        "version": FORMAT_VERSION,
        "format": "mds",
        "compression": None,
        "hashes": list(hashes),
        "size_limit": size_limit,
        "column_names": names,
        "column_encodings": [columns[name] for name in names],
        "column_sizes": [_column_size(columns[name]) for name in names],
    }


class ShardWriter:
    """Writes encoded samples as MDS shards under ``out`` (a local directory, emptied first as
    ``MDSWriter(exist_ok=True)`` does, or an ``s3://`` prefix), then ``index.json`` on ``finish``.

    Shards are assembled in one buffer reused for every shard of the process: a fresh shard-sized
    buffer per shard paid page faults on zeroed memory (~4x slower to fill on this kind of host)."""

    def __init__(self, columns: dict[str, str], out: str, size_limit: int | None, hashes: list[str]) -> None:
        unknown = [algo for algo in hashes if algo not in HASHES]
        if unknown or list(hashes) != sorted(set(hashes)):
            raise ValueError(f"hashes must be sorted, unique and among {sorted(HASHES)}, got {hashes}")
        if size_limit is not None and not 0 < size_limit < 2**32:
            raise ValueError(f"size_limit must be in (0, 2**32) bytes (uint32 offsets), got {size_limit}")
        self.out = out
        self.size_limit = size_limit
        self.hashes = list(hashes)
        self.config = shard_config(columns, self.hashes, size_limit)
        self.config_data = json.dumps(self.config, sort_keys=True).encode("utf-8")
        self.shards: list[dict[str, Any]] = []
        self.index_data: bytes | None = None  # the index.json written by ``finish``
        self._samples: list[bytes | memoryview] = []
        self.after_write: Callable[[], None] | None = None  # called after each chunk of a shard is written
        self._fixed = 4 + 4 + len(self.config_data)  # count, last offset, config
        self._size = self._fixed
        if not storage.is_remote(out):
            shutil.rmtree(out, ignore_errors=True)
            Path(out).mkdir(parents=True)

    def write_encoded(self, samples: Iterable[bytes | memoryview]) -> int:
        """Append already-encoded samples (``mds_encode.encode_samples``); returns how many."""
        limit, count = self.size_limit, 0
        for sample in samples:
            size = len(sample) + BYTES_PER_SAMPLE_OFFSET
            if limit and limit < self._size + size:
                self._flush()
            self._samples.append(sample)
            self._size += size
            count += 1
        return count

    def finish(self) -> None:
        """Flush the last shard and write ``index.json`` (last: its presence means the part is whole)."""
        if self._samples:
            self._flush()
        index = json.dumps({"version": FORMAT_VERSION, "shards": self.shards}, sort_keys=True)
        self.index_data = index.encode("utf-8")
        storage.write_bytes(storage.join(self.out, INDEX_NAME), self.index_data)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is None:
            self.finish()

    def _flush(self) -> None:
        basename = f"shard.{len(self.shards):05}.mds"
        path = storage.join(self.out, basename)
        hashers = {algo: HASHES[algo]() for algo in self.hashes}
        size = 0
        if storage.is_remote(self.out):
            data = b"".join(self._shard_chunks())
            storage.write_bytes(path, data)
            size = len(data)
            for hasher in hashers.values():
                hasher.update(data)
        else:
            with open(path, "wb") as handle:
                for chunk in self._shard_chunks():
                    handle.write(chunk)
                    size += len(chunk)
                    for hasher in hashers.values():
                        hasher.update(chunk)
                    if self.after_write is not None:
                        self.after_write()
        hashes = {algo: hasher.hexdigest() for algo, hasher in hashers.items()}
        raw = {"basename": basename, "bytes": size, "hashes": hashes}
        self.shards.append({"samples": len(self._samples), "raw_data": raw, "zip_data": None, **self.config})
        self._samples = []
        self._size = self._fixed

    def _shard_chunks(self) -> Iterable[bytes]:
        """The shard's bytes in order, as the header and then runs of samples of about ``WRITE_CHUNK``
        bytes: a shard is never copied whole (a whole-shard buffer cost up to ``size_limit`` of
        memory beside the samples, and zero-filled all of it even for a shard of a few KB)."""
        sizes = np.fromiter(map(len, self._samples), np.int64, len(self._samples))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.uint32)
        count = np.uint32(len(sizes)).tobytes()
        offsets += len(count) + len(offsets.tobytes()) + len(self.config_data)
        yield b"".join([count, offsets.tobytes(), self.config_data])
        run: list[bytes] = []
        run_bytes = 0
        for sample in self._samples:
            run.append(sample)
            run_bytes += len(sample)
            if run_bytes >= WRITE_CHUNK:
                yield b"".join(run)
                run, run_bytes = [], 0
        if run:
            yield b"".join(run)


__all__ = ["INDEX_NAME", "ShardWriter", "shard_config"]
