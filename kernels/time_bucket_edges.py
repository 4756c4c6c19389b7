"""The integer gaps where the HSTU time bucket changes: the table the attention kernels compare against.

``time_bucket`` (``hstu_attention_ref``) is non-decreasing in a positive gap, so bucket ``b`` starts
at one integer gap, ``edge[b]`` (the smallest gap whose bucket is at least ``b``). A kernel tile whose
gaps lie in a few consecutive buckets then buckets a gap with a few integer comparisons against the
edges instead of a ``log`` and an IEEE division per score (docs/kernels.md, "Time buckets").

The edges are found by evaluating ``time_bucket`` itself (a binary search over int32 gaps on the
device the model runs on), so a compared bucket is the bucket the PyTorch model computes there, to
the last bit of its ``log``. Entries past the last bucket hold ``NEVER`` (no int32 gap reaches it),
so a kernel may read up to ``pad`` entries past a tile's first bucket without bounds checks.
"""

from __future__ import annotations

import torch

from .hstu_attention_ref import time_bucket

NEVER = 2**31 - 1  # no int32 gap of the kernels (|gap| < 2^31 - 1) reaches this edge
_CACHE: dict[tuple[int, int, str], torch.Tensor] = {}


def bucket_edges(num_buckets: int, pad: int, device: torch.device | str) -> torch.Tensor:
    """int32 ``[num_buckets + pad]``: ``edge[b]`` = smallest gap >= 1 with ``time_bucket >= b``
    (``edge[0] = 1``), ``NEVER`` for buckets no int32 gap reaches and for the ``pad`` entries after."""
    key = (num_buckets, pad, str(torch.device(device)))
    if key not in _CACHE:
        _CACHE[key] = _search_edges(num_buckets, pad, torch.device(device))
    return _CACHE[key]


def _search_edges(num_buckets: int, pad: int, device: torch.device) -> torch.Tensor:
    target = torch.arange(num_buckets, device=device)
    low = torch.ones(num_buckets, dtype=torch.int64, device=device)
    high = torch.full((num_buckets,), NEVER - 1, dtype=torch.int64, device=device)
    reached = time_bucket(high, num_buckets) >= target
    for _ in range(32):  # invariant: the edge lies in [low, high] (where reached)
        middle = (low + high) // 2
        above = time_bucket(middle, num_buckets) >= target
        high = torch.where(above, middle, high)
        low = torch.where(above, low, middle + 1)
    edges = torch.where(reached, low, torch.full_like(low, NEVER))
    tail = torch.full((pad,), NEVER, dtype=torch.int64, device=device)
    return torch.cat([edges, tail]).to(torch.int32)
