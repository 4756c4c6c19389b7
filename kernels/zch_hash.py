"""The fixed 64-bit hash of raw ids for zero-collision tables (docs/design.md#open-id-spaces-mpzch).

A raw id must land in the same bucket and home slot in every process, on every machine and in every
version, or a resumed run would look its ids up in the wrong rows. Python's ``hash`` is salted and
torch has no stable integer hash, so this is splitmix64's finaliser (Vigna), written with torch int64
arithmetic: additions and multiplications wrap modulo 2**64 like the unsigned original, and right
shifts are made logical by masking off the sign bits that torch's arithmetic shift copies in.
``mix64_int`` is the same function on Python integers (the tests hold the two to each other and to
pinned values). Changing anything here changes every table's layout: bump ``HASH_VERSION``.
"""

from __future__ import annotations

import torch

HASH_VERSION = 1
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def as_signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def logical_shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """``z >>> bits`` on int64: torch's ``>>`` is arithmetic, so the copied sign bits are masked off."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix64(ids: torch.Tensor) -> torch.Tensor:
    """splitmix64(id): ``z = id + golden; z = (z ^ z>>>30)·m1; z = (z ^ z>>>27)·m2; z ^ z>>>31`` (int64 bits)."""
    z = ids.to(torch.int64) + as_signed(GOLDEN)
    z = (z ^ logical_shift_right(z, 30)) * as_signed(MIX1)
    z = (z ^ logical_shift_right(z, 27)) * as_signed(MIX2)
    return z ^ logical_shift_right(z, 31)


def mix64_int(value: int) -> int:
    """``mix64`` on a Python int (any int64), returned unsigned in [0, 2**64): the reference's hash."""
    z = (value + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def bucket_and_home(ids: torch.Tensor, num_buckets: int, bucket_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bucket of each id and its home slot inside the bucket, from the top 63 bits of ``mix64``."""
    h = logical_shift_right(mix64(ids), 1)
    if num_buckets & (num_buckets - 1) == 0 and bucket_size & (bucket_size - 1) == 0:  # powers of two (h >= 0)
        shift = num_buckets.bit_length() - 1
        return h & (num_buckets - 1), (h >> shift) & (bucket_size - 1)
    return h % num_buckets, (h // num_buckets) % bucket_size


def pending_slot(ids: torch.Tensor, slots: int) -> torch.Tensor:
    """Slot of an id in the admission counters: a second round of mixing, so it is independent of the bucket."""
    return logical_shift_right(mix64(mix64(ids)), 1) % slots
