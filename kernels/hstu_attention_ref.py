"""HSTU pointwise attention over jagged sequences: the PyTorch oracle the Triton kernel is tested against.

One sample at a time, in float32, written the way the math reads (docs/kernels.md):

    s_ij = q_i · k_j + pos_bias[min(i - j, P - 1)] + time_bias[bucket(τ_i - t_j)]      (j <= i)
    out_i = Σ_j silu(s_ij) / n · v_j

per head, where ``n`` is the sample's own length, ``t_j`` the time of event ``j`` and ``τ_i`` the
time of the event position ``i`` predicts (the model module says why the bias reads it). Both biases
are shared by the heads. ``bucket`` is GR's log bucketing of the gap in seconds (``time_bucket``).

Simple on purpose: it is the oracle, not a production path (the model's own PyTorch attention pads
samples of similar length together; ``trainer/model/transducer.py``). Autograd gives every gradient.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

TIME_BUCKET_BASE = 0.301  # log(|Δt|) / 0.301: GR's bucketisation of time gaps in seconds


def time_bucket(delta: torch.Tensor, buckets: int) -> torch.Tensor:
    """Log-spaced bucket of a time gap in seconds (GR's relative time bias), in ``[0, buckets)``."""
    scaled = torch.log(delta.abs().clamp(min=1).to(torch.float32)) / TIME_BUCKET_BASE
    return scaled.long().clamp(0, buckets - 1)


def hstu_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    timestamps: torch.Tensor,
    query_times: torch.Tensor,
    pos_bias: torch.Tensor,
    time_bias: torch.Tensor,
    num_heads: int,
) -> torch.Tensor:
    """``[N, H·D]`` output of jagged ``q``/``k``/``v`` ``[N, H·D]`` (samples at ``offsets`` ``[B+1]``).

    ``timestamps``/``query_times`` ``[N]`` int64 seconds; ``pos_bias`` ``[P]``; ``time_bias``
    ``[buckets]`` (empty: no time bias). Computed in float32, returned in ``v``'s dtype.
    """
    n_rows, width = v.shape
    head_dim = width // num_heads
    outputs = []
    bounds = offsets.tolist()
    for start, end in itertools.pairwise(bounds):
        n = end - start
        if n == 0:
            continue
        qs, ks, vs = (t[start:end].float().unflatten(-1, (num_heads, head_dim)).transpose(0, 1) for t in (q, k, v))
        steps = torch.arange(n, device=q.device)
        distance = (steps[:, None] - steps[None, :]).clamp(0, pos_bias.numel() - 1)
        bias = pos_bias.float()[distance]
        if time_bias.numel():
            gaps = query_times[start:end, None] - timestamps[None, start:end]
            bias = bias + time_bias.float()[time_bucket(gaps, time_bias.numel())]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        weights = torch.where(causal, F.silu(qs @ ks.transpose(-1, -2) + bias) / n, 0.0)
        outputs.append((weights @ vs).transpose(0, 1).flatten(1))
    if not outputs:  # keep every input in the graph of an all-empty batch
        zero = 0.0 * (q.float().sum() + k.float().sum() + pos_bias.float().sum() + time_bias.float().sum())
        return (torch.zeros(n_rows, width, device=v.device) + 0.0 * v.float() + zero).to(v.dtype)
    return torch.cat(outputs).to(v.dtype)
