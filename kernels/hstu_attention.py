"""Jagged HSTU attention: the public entry point, its ``freescale::`` custom ops and autograd.

``hstu_attention(q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, num_heads, max_len)``
computes ``hstu_attention_ref``'s math (docs/kernels.md) with the Triton kernels
(``hstu_attention_triton``); ``kernel="reference"`` runs the PyTorch oracle instead.

As with dispatch/combine (``dispatch_ops``): ``freescale::hstu_attention`` and
``freescale::hstu_attention_backward`` are custom ops with fake (meta) kernels, so ``torch.compile``
traces through the opaque Triton launches with static shapes, and one autograd formula serves
every caller. Eager calls skip the dispatcher (tens of microseconds a call, every layer of every
micro-batch) and go through a ``torch.autograd.Function`` with the same backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import hstu_attention_triton as tri
from .hstu_attention_ref import hstu_attention_reference
from .triton_support import triton_unavailable_reason

ATTENTION_KERNELS = ("triton", "reference")


def check_inputs(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor, query_times: Tensor,
                 pos_bias: Tensor, time_bias: Tensor, num_heads: int) -> None:  # fmt: skip
    """One-line ``ValueError`` naming the argument that does not fit (shapes, dtypes, devices)."""
    if q.dim() != 2 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"hstu_attention: q, k, v must be [N, H*D] of one shape, got {q.shape}, {k.shape}, {v.shape}")
    if num_heads < 1 or q.shape[1] % num_heads:
        raise ValueError(f"hstu_attention: width {q.shape[1]} is not divisible by num_heads = {num_heads}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"hstu_attention: q, k, v must share one of float32/bfloat16/float16, got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")  # fmt: skip
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("hstu_attention: q, k, v need unit stride along the feature dimension")
    for name, t in (("offsets", offsets), ("timestamps", timestamps), ("query_times", query_times)):
        if t.dtype != torch.int64 or t.dim() != 1:
            raise ValueError(f"hstu_attention: {name} must be a 1-d int64 tensor, got {t.dtype} {tuple(t.shape)}")
    if timestamps.numel() != q.shape[0] or query_times.numel() != q.shape[0]:
        raise ValueError(f"hstu_attention: timestamps and query_times need one entry per row ({q.shape[0]}), got "
                         f"{timestamps.numel()} and {query_times.numel()}")  # fmt: skip
    if pos_bias.dim() != 1 or pos_bias.numel() < 1 or time_bias.dim() != 1:
        raise ValueError("hstu_attention: pos_bias must be 1-d and non-empty, time_bias 1-d (empty: no time bias)")
    devices = {t.device for t in (q, k, v, offsets, timestamps, query_times, pos_bias, time_bias)}
    if len(devices) > 1:
        raise ValueError(f"hstu_attention: every tensor must be on one device, got {sorted(map(str, devices))}")


# --------------------------------------------------------------------------------------------------
# custom ops (used while torch.compile traces)
# --------------------------------------------------------------------------------------------------


@torch.library.custom_op("freescale::hstu_attention", mutates_args=())
def hstu_attention_op(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor, query_times: Tensor,
                      pos_bias: Tensor, time_bias: Tensor, num_heads: int, max_len: int) -> Tensor:  # fmt: skip
    """Forward of jagged HSTU attention (Triton)."""
    return tri.forward(q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, num_heads, max_len)


@hstu_attention_op.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor, query_times: Tensor,
      pos_bias: Tensor, time_bias: Tensor, num_heads: int, max_len: int) -> Tensor:  # fmt: skip
    return v.new_empty(v.shape)


@torch.library.custom_op("freescale::hstu_attention_backward", mutates_args=())
def hstu_attention_backward_op(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor,
                               query_times: Tensor, pos_bias: Tensor, time_bias: Tensor, num_heads: int,
                               max_len: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients with respect to q, k, v, pos_bias, time_bias (Triton)."""
    return tri.backward(grad, q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, num_heads, max_len)


@hstu_attention_backward_op.register_fake
def _(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor, query_times: Tensor,
      pos_bias: Tensor, time_bias: Tensor, num_heads: int, max_len: int) -> tuple[Tensor, ...]:  # fmt: skip
    like = (q, k, v, pos_bias, time_bias)
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in like)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs[:8])
    ctx.num_heads, ctx.max_len = inputs[8], inputs[9]


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, offsets, timestamps, query_times, pos_bias, time_bias = ctx.saved_tensors
    dq, dk, dv, dpos, dtime = hstu_attention_backward_op(
        grad, q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, ctx.num_heads, ctx.max_len
    )
    return dq, dk, dv, None, None, None, dpos, dtime, None, None


hstu_attention_op.register_autograd(_backward, setup_context=_setup)


# --------------------------------------------------------------------------------------------------
# eager entry point
# --------------------------------------------------------------------------------------------------


class _HSTUAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor,
                query_times: Tensor, pos_bias: Tensor, time_bias: Tensor, num_heads: int,
                max_len: int) -> Tensor:  # fmt: skip
        ctx.save_for_backward(q, k, v, offsets, timestamps, query_times, pos_bias, time_bias)
        ctx.num_heads, ctx.max_len = num_heads, max_len
        return tri.forward(q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, num_heads, max_len)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, offsets, timestamps, query_times, pos_bias, time_bias = ctx.saved_tensors
        dq, dk, dv, dpos, dtime = tri.backward(
            grad, q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, ctx.num_heads, ctx.max_len
        )
        return dq, dk, dv, None, None, None, dpos, dtime, None, None


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor, query_times: Tensor,
                   pos_bias: Tensor, time_bias: Tensor, num_heads: int, max_len: int,
                   kernel: str = "triton") -> Tensor:  # fmt: skip
    """Jagged HSTU attention of ``[N, H·D]`` rows; ``max_len`` is the longest sample (a host int).

    ``offsets`` ``[B+1]`` int64 (``offsets[-1] == N``); ``timestamps`` / ``query_times`` ``[N]``
    int64 seconds (each event's time / the time of the event its position predicts); ``pos_bias``
    ``[P]`` (distances clamp at ``P - 1``); ``time_bias`` ``[buckets]``, or empty for none.
    """
    check_inputs(q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, num_heads)
    if kernel == "reference":
        return hstu_attention_reference(q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, num_heads)
    if kernel != "triton":
        raise ValueError(f"hstu_attention: kernel must be one of {ATTENTION_KERNELS}, got {kernel!r}")
    args = (q, k, v, offsets, timestamps, query_times, pos_bias, time_bias, num_heads, max_len)
    if torch.compiler.is_compiling():
        return hstu_attention_op(*args)
    reason = triton_unavailable_reason(q.device)
    if reason is not None:
        raise ValueError(f"hstu_attention: kernel 'triton' cannot run: {reason}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, pos_bias, time_bias)):
        return _HSTUAttention.apply(*args)
    return tri.forward(*args)
