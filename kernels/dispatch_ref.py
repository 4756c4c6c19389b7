"""PyTorch implementations of dispatch/combine: the paper's naive baseline and a vectorized reference.

Both are written against the same contract as the Triton kernels (``dispatch_triton``) so the three can
be tested for exact agreement:

* a *plan* maps a destination rank per row to ``counts[W]``, ``offsets[W+1]``, ``perm[N]`` (send row
  ``j`` holds home row ``perm[j]``) and ``inverse[N]`` (home row ``i`` sits at send row ``inverse[i]``);
  rows keep their home order within a destination (a *stable* grouping), so a receiver sees a
  deterministic layout whatever implementation produced it;
* for jagged rows the plan also carries the per-destination value counts (the send-side lengths per
  destination), the send-side lengths per row and the send-side value offsets;
* applying a plan is a pure gather (``out[j] = src[index[j]]``); combine is the gather with the inverse
  permutation, so both directions are copies and agree bit for bit.

The *naive* functions reproduce the baseline the paper measures (one boolean mask and one
``index_select`` per destination and per tensor): their cost grows linearly with the world size,
which is the point of keeping them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class PlanTensors(NamedTuple):
    """Raw plan tensors shared by all implementations (jagged fields are empty for fixed rows)."""

    counts: Tensor
    offsets: Tensor
    perm: Tensor
    inverse: Tensor
    value_counts: Tensor
    value_offsets: Tensor
    send_lengths: Tensor
    send_value_offsets: Tensor
    home_value_offsets: Tensor


def exclusive_offsets(counts: Tensor) -> Tensor:
    """``[0, c0, c0+c1, ...]`` of length ``len(counts) + 1`` in int64 (offsets of contiguous groups)."""
    out = counts.new_zeros(counts.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=out[1:])
    return out


def invert_permutation(perm: Tensor) -> Tensor:
    """``inverse[perm[j]] = j``: the scatter that undoes a gather by ``perm``."""
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.shape[0], device=perm.device, dtype=perm.dtype)
    return inverse


def _jagged_fields(dest: Tensor, world_size: int, lengths: Tensor, perm: Tensor) -> tuple[Tensor, ...]:
    """Value-level plan fields computed from a row-level permutation (shared by naive and pytorch)."""
    lengths = lengths.long()
    value_counts = torch.zeros(world_size, dtype=torch.int64, device=dest.device)
    value_counts.index_add_(0, dest.long(), lengths)
    send_lengths = lengths.index_select(0, perm)
    return (value_counts, exclusive_offsets(value_counts), send_lengths, exclusive_offsets(send_lengths),
            exclusive_offsets(lengths))  # fmt: skip


def _empty_jagged(device: torch.device) -> tuple[Tensor, ...]:
    return tuple(torch.empty(0, dtype=torch.int64, device=device) for _ in range(5))


# --------------------------------------------------------------------------------------------------
# vectorized reference: bincount -> exclusive scan -> stable scatter
# --------------------------------------------------------------------------------------------------


def pytorch_plan(dest: Tensor, world_size: int, lengths: Tensor | None = None) -> PlanTensors:
    """Histogram with ``bincount``, exclusive scan, then a stable sort as the stable scatter.

    ``argsort(stable=True)`` is the vectorized form of "place row i at offsets[dest[i]] + (number of
    earlier rows with the same destination)", which is exactly what the Triton scatter computes.
    """
    dest = dest.long()
    counts = torch.bincount(dest, minlength=world_size)
    offsets = exclusive_offsets(counts)
    perm = torch.argsort(dest, stable=True)
    inverse = invert_permutation(perm)
    if lengths is None:
        jagged = _empty_jagged(dest.device)
    else:
        jagged = _jagged_fields(dest, world_size, lengths, perm)
    return PlanTensors(counts, offsets, perm, inverse, *jagged)


def pytorch_gather_rows(src: Tensor, index: Tensor) -> Tensor:
    """``out[j] = src[index[j]]`` (dispatch with ``perm``, combine with ``inverse``)."""
    return src.index_select(0, index)


def jagged_row_index(in_offsets: Tensor, out_offsets: Tensor, index: Tensor, total: int) -> Tensor:
    """Source value row of every output value row when output segment j is input segment index[j].

    Built with ``repeat_interleave`` (with ``output_size`` so CUDA needs no host sync): each output
    row ``t`` in segment ``j`` reads ``in_offsets[index[j]] + (t - out_offsets[j])``.
    """
    out_lengths = out_offsets[1:] - out_offsets[:-1]
    shift = in_offsets.index_select(0, index) - out_offsets[:-1]
    rows = torch.arange(total, device=in_offsets.device, dtype=torch.int64)
    return rows + torch.repeat_interleave(shift, out_lengths, output_size=total)


def pytorch_jagged_gather(values: Tensor, in_offsets: Tensor, out_offsets: Tensor, index: Tensor) -> Tensor:
    """Move whole variable-length segments: output segment ``j`` is input segment ``index[j]``."""
    total = values.shape[0]
    if total == 0:
        return values.clone()
    return values.index_select(0, jagged_row_index(in_offsets, out_offsets, index, total))


# --------------------------------------------------------------------------------------------------
# naive baseline: one boolean mask + index_select per destination (linear in world size)
# --------------------------------------------------------------------------------------------------


def naive_plan(dest: Tensor, world_size: int, lengths: Tensor | None = None) -> PlanTensors:
    """Loop over destinations: ``nonzero(dest == d)`` for each d, then concatenate."""
    dest = dest.long()
    pieces = [torch.nonzero(dest == d).squeeze(1) for d in range(world_size)]
    counts = torch.tensor([p.shape[0] for p in pieces], dtype=torch.int64, device=dest.device)
    perm = torch.cat(pieces) if pieces else dest.new_empty(0)
    inverse = invert_permutation(perm)
    if lengths is None:
        jagged = _empty_jagged(dest.device)
    else:
        jagged = _jagged_fields(dest, world_size, lengths, perm)
    return PlanTensors(counts, exclusive_offsets(counts), perm, inverse, *jagged)


def naive_dispatch_rows(src: Tensor, dest: Tensor, world_size: int) -> Tensor:
    """The paper's PyTorch baseline: ``src[dest == d]`` for every destination, concatenated."""
    parts = [src[dest == d] for d in range(world_size)]
    return torch.cat(parts) if parts else src[:0].clone()


def naive_combine_rows(buffer: Tensor, dest: Tensor, counts: list[int]) -> Tensor:
    """Inverse of ``naive_dispatch_rows``: write each destination's slice back through its mask."""
    out = buffer.new_empty(buffer.shape)
    start = 0
    for d, c in enumerate(counts):
        out[dest == d] = buffer[start : start + c]
        start += c
    return out


def value_destinations(dest: Tensor, lengths: Tensor) -> Tensor:
    """Destination of every value row (a row's items travel with the row)."""
    return torch.repeat_interleave(dest.long(), lengths.long())
