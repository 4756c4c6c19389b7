"""Deterministic 63-bit ids for string identifiers.

Every reader maps string user/item ids (``"A2SUAM1J3GNN3B"``, ``"u000123"``) to ``int64`` with the same
function so that two sources naming the same user agree, runs on different machines agree, and ids
stay non-negative (they index embedding tables after a modulo). Python's ``hash`` is salted per process,
so it cannot be used; blake2b is in the standard library and fast enough when only unique values are
hashed (logs repeat each user and popular item many times).
"""

from __future__ import annotations

import math
from hashlib import blake2b

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ID_MASK", "selected", "stable_id", "stable_id_one"]

_BLOCK = 1 << 16  # rows per block of ``selected``

#: Keeps ids in ``[0, 2**63)`` so they fit a signed int64 and stay non-negative.
ID_MASK = (1 << 63) - 1


def stable_id_one(value: str) -> int:
    """The id of one string: the first 8 bytes of blake2b(utf-8), little-endian, masked to 63 bits."""
    digest = blake2b(value.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ID_MASK


def _as_string_array(values: pa.Array | pa.ChunkedArray | list[str]) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=pa.string())
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        values = pc.cast(values, pa.string())
    return values


def _digests(strings: list[str]) -> np.ndarray:
    """One digest per string, assembled without per-value ints."""
    digests = b"".join(blake2b(s.encode("utf-8"), digest_size=8).digest() for s in strings)
    raw = np.frombuffer(digests, dtype="<u8") & np.uint64(ID_MASK)
    return raw.astype(np.int64)


# Ids already computed in this process. A worker reads many chunks of the same logs, and every chunk
# names mostly the same users again: looking them up costs a dict probe instead of a digest.
_KNOWN: dict[str, int] = {}
KNOWN_LIMIT = 1 << 18  # about 30 MB of entries; cleared (not evicted one by one) when full


def _hash_unique(strings: list[str]) -> np.ndarray:
    """Hash a list of distinct strings, reusing ids computed earlier in this process."""
    if not strings:
        return np.zeros(0, dtype=np.int64)
    if len(strings) > KNOWN_LIMIT:
        return _digests(strings)
    if len(_KNOWN) + len(strings) > KNOWN_LIMIT:
        _KNOWN.clear()
    missing = [s for s in strings if s not in _KNOWN]
    if missing:
        _KNOWN.update(zip(missing, _digests(missing).tolist()))
    return np.fromiter(map(_KNOWN.__getitem__, strings), dtype=np.int64, count=len(strings))


def stable_id(values: pa.Array | pa.ChunkedArray | list[str]) -> np.ndarray:
    """Map strings to deterministic non-negative int64 ids (nulls map to -1).

    The array is dictionary-encoded first so each distinct value is hashed once: a million-row chunk
    with ten thousand users costs ten thousand digests, not a million.
    """
    array = _as_string_array(values)
    if len(array) == 0:
        return np.zeros(0, dtype=np.int64)
    encoded = pc.dictionary_encode(array)
    hashes = _hash_unique(encoded.dictionary.to_pylist())
    indices = encoded.indices
    out = np.full(len(array), -1, dtype=np.int64)
    valid = ~np.asarray(pc.is_null(indices).to_numpy(zero_copy_only=False), dtype=bool)
    idx = indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    out[valid] = hashes[idx[valid]]
    return out


def selected(user_ids: np.ndarray, fraction: float) -> np.ndarray:
    """Users in a sample of ``fraction`` of all users: splitmix64(user_id) / 2^64 < fraction.

    A pure function of the id (independent of partitioning and read order), so every read task of a
    job, repeated runs and different fractions agree on who is in (a user in at f is in at every
    f' > f); ``read_task(user_fraction=...)`` and ``stats --sample-fraction`` use it."""
    ids = np.asarray(user_ids)
    if fraction >= 1.0:
        return np.ones(len(ids), dtype=bool)
    # splitmix64 in place on cache-sized blocks: a read calls this on every row it sees, and a
    # dozen whole-array temporaries cost 3x the arithmetic
    out = np.empty(len(ids), dtype=bool)
    x = np.empty(min(len(ids), _BLOCK), np.uint64)
    t = np.empty_like(x)
    # (x >> 11) < fraction·2^53 on integers: both sides are exact (53 bits), no float array needed
    limit = np.uint64(math.ceil(fraction * 2.0**53))
    for lo in range(0, len(ids), _BLOCK):
        xs, ts = x[: min(_BLOCK, len(ids) - lo)], t[: min(_BLOCK, len(ids) - lo)]
        xs[:] = ids[lo : lo + len(xs)]
        xs += np.uint64(0x9E3779B97F4A7C15)
        for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            np.right_shift(xs, np.uint64(shift), out=ts)
            xs ^= ts
            xs *= np.uint64(factor)
        np.right_shift(xs, np.uint64(31), out=ts)
        xs ^= ts
        np.right_shift(xs, np.uint64(11), out=xs)
        np.less(xs, limit, out=out[lo : lo + len(xs)])
    return out
