"""The fixed 64-bit hash of zero-collision tables (``kernels/zch_hash.py``): pinned to splitmix64's published
outputs, and the torch form equal to the Python-int form the reference uses."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.kernels.zch_hash import as_signed, bucket_and_home, mix64, mix64_int


def test_pinned_hash_values() -> None:
    """splitmix64's published outputs (state 0 and 1234567) and a few more: a change here moves every id."""
    ids = torch.tensor([0 - 0x9E3779B97F4A7C15 + (1 << 64), 0, 1234567, 1, 2**63 - 1, 42], dtype=torch.int64)
    assert mix64_int(0) == 0xE220A8397B1DCDAF
    assert mix64_int(1234567) == 6457827717110365317
    assert mix64(ids).tolist() == [
        0,
        as_signed(0xE220A8397B1DCDAF),
        6457827717110365317,
        -7995527694508729151,
        3055647633038352039,
        -4767286540954276203,
    ]
    assert [as_signed(mix64_int(i)) for i in ids.tolist()] == mix64(ids).tolist()
    bucket, home = bucket_and_home(torch.tensor([0, 1, 42]), num_buckets=1000, bucket_size=128)
    assert (bucket.tolist(), home.tolist()) == ([767, 232, 706], [87, 27, 37])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50))
def test_torch_hash_equals_python_ints(values: list[int]) -> None:
    assert mix64(torch.tensor(values, dtype=torch.int64)).tolist() == [as_signed(mix64_int(v)) for v in values]
