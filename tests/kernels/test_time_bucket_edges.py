"""The bucket edges the attention kernels compare against give ``time_bucket``'s bucket for every gap."""

from __future__ import annotations

import torch

from freescale.kernels.hstu_attention_ref import time_bucket
from freescale.kernels.time_bucket_edges import NEVER, bucket_edges


def bucket_by_edges(gaps: torch.Tensor, edges: torch.Tensor, buckets: int) -> torch.Tensor:
    """What a kernel tile computes: the number of edges (past bucket 0) a positive gap reaches."""
    inner = edges[1:buckets].to(torch.int64)
    return (gaps[:, None] >= inner[None, :]).sum(1)


def test_edges_reproduce_the_bucket_at_and_around_every_edge() -> None:
    for buckets in (1, 7, 64, 90):
        edges = bucket_edges(buckets, 4, "cpu")
        assert edges.dtype == torch.int32 and edges.shape == (buckets + 4,)
        assert edges[0] == 1 and bool((edges[buckets:] == NEVER).all())
        reached = edges[:buckets][edges[:buckets] < NEVER].to(torch.int64)
        near = (reached[:, None] + torch.arange(-3, 4)[None, :]).flatten().clamp(1, NEVER - 1)
        spread = torch.randint(1, NEVER - 1, (20_000,), generator=torch.Generator().manual_seed(0))
        gaps = torch.cat([near, spread, torch.arange(1, 5_000)])
        assert torch.equal(bucket_by_edges(gaps, edges, buckets), time_bucket(gaps, buckets)), buckets


def test_edges_do_not_decrease_and_are_cached() -> None:
    edges = bucket_edges(64, 4, "cpu")
    reached = edges[edges < NEVER]
    assert bool((reached[1:] >= reached[:-1]).all())
    assert bucket_edges(64, 4, "cpu") is edges
    assert edges.tolist()[:4] == [1, 2, 2, 3]  # log(2)/0.301 = 2.3: buckets 1 and 2 both start at gap 2
