"""``freescale::`` custom ops for dispatch/combine, with fake (meta) kernels and autograd.

Why custom ops: the Triton launches are opaque to Dynamo, and the vectorized reference contains
data-dependent steps (``bincount``); wrapping both behind ``torch.library.custom_op`` with fake
implementations gives ``torch.compile(fullgraph=True)`` static output shapes (a dispatch is a
permutation, so every output size is known from the input sizes) and one autograd formula for every
implementation.

Ops (``kernel`` is ``"pytorch"`` or ``"triton"``; the naive baseline is plain PyTorch and needs none):

* ``freescale::dispatch_plan(dest, world_size, kernel)`` -> counts, offsets, perm, inverse;
* ``freescale::jagged_dispatch_plan(dest, lengths, world_size, kernel)`` -> the same plus the
  per-destination value counts/offsets, the send-side lengths/value offsets per row and the home
  value offsets;
* ``freescale::gather_rows(src, index, inverse, kernel)``: ``out[j] = src[index[j]]`` where ``index``
  is a permutation and ``inverse`` its inverse; the gradient is ``gather_rows`` with the two swapped,
  which is why dispatch's gradient is combine and combine's gradient is dispatch;
* ``freescale::jagged_gather(values, in_offsets, out_offsets, index, inverse, kernel)``: output
  segment ``j`` is input segment ``index[j]``; the gradient swaps offsets and permutations.

Eager calls do not go through the custom-op dispatcher: it costs ~45 µs per call (~90 µs with
autograd) on the host, several times the GPU time of a whole dispatch. The entry points at the bottom
(``plan``, ``jagged_plan``, ``gather``, ``jagged``) call the same implementations directly, through a
``torch.autograd.Function`` with the same backward formula when a gradient is needed, and use the
custom ops only while ``torch.compile`` traces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from . import dispatch_ref as ref
from . import dispatch_triton as tri

_PLANS: dict[str, Callable[..., ref.PlanTensors]] = {"pytorch": ref.pytorch_plan, "triton": tri.triton_plan}
_GATHERS: dict[str, Callable[..., Tensor]] = {
    "pytorch": ref.pytorch_gather_rows,
    "triton": tri.triton_gather_rows,
}
_JAGGED: dict[str, Callable[..., Tensor]] = {
    "pytorch": ref.pytorch_jagged_gather,
    "triton": tri.triton_jagged_gather,
}


def _pick(table: dict[str, Callable[..., Any]], kernel: str) -> Callable[..., Any]:
    if kernel not in table:
        raise ValueError(f"kernel must be one of {sorted(table)} for freescale ops, got {kernel!r}")
    return table[kernel]


def _i64(like: Tensor, n: int) -> Tensor:
    return like.new_empty(n, dtype=torch.int64)


# --------------------------------------------------------------------------------------------------
# plans (integer outputs: no autograd)
# --------------------------------------------------------------------------------------------------


@torch.library.custom_op("freescale::dispatch_plan", mutates_args=())
def dispatch_plan(dest: Tensor, world_size: int, kernel: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Counts, offsets, stable permutation and its inverse for grouping rows by destination."""
    p = _pick(_PLANS, kernel)(dest, world_size)
    return p.counts, p.offsets, p.perm, p.inverse


@dispatch_plan.register_fake
def _(dest: Tensor, world_size: int, kernel: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    n = dest.shape[0]
    return _i64(dest, world_size), _i64(dest, world_size + 1), _i64(dest, n), _i64(dest, n)


@torch.library.custom_op("freescale::jagged_dispatch_plan", mutates_args=())
def jagged_dispatch_plan(
    dest: Tensor, lengths: Tensor, world_size: int, kernel: str
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The row plan, value counts/offsets per destination, send lengths/offsets and home offsets."""
    return tuple(_pick(_PLANS, kernel)(dest, world_size, lengths))  # type: ignore[return-value]


@jagged_dispatch_plan.register_fake
def _(dest: Tensor, lengths: Tensor, world_size: int, kernel: str) -> tuple[Tensor, ...]:
    n, w = dest.shape[0], world_size
    return (
        _i64(dest, w), _i64(dest, w + 1), _i64(dest, n), _i64(dest, n),
        _i64(dest, w), _i64(dest, w + 1), _i64(dest, n), _i64(dest, n + 1), _i64(dest, n + 1),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# payload movement (differentiable)
# --------------------------------------------------------------------------------------------------


@torch.library.custom_op("freescale::gather_rows", mutates_args=())
def gather_rows(src: Tensor, index: Tensor, inverse: Tensor, kernel: str) -> Tensor:
    """``out[j] = src[index[j]]``; ``inverse`` is only used by the backward."""
    out = _pick(_GATHERS, kernel)(src, index)
    return out if out is not src else out.clone()


@gather_rows.register_fake
def _(src: Tensor, index: Tensor, inverse: Tensor, kernel: str) -> Tensor:
    return src.new_empty((index.shape[0], *src.shape[1:]))


def _gather_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _, index, inverse, kernel = inputs
    ctx.save_for_backward(index, inverse)
    ctx.kernel = kernel


def _gather_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
    index, inverse = ctx.saved_tensors
    return gather_rows(grad.contiguous(), inverse, index, ctx.kernel), None, None, None


gather_rows.register_autograd(_gather_backward, setup_context=_gather_setup)


@torch.library.custom_op("freescale::jagged_gather", mutates_args=())
def jagged_gather(
    values: Tensor, in_offsets: Tensor, out_offsets: Tensor, index: Tensor, inverse: Tensor, kernel: str
) -> Tensor:
    """Output segment ``j`` (rows ``out_offsets[j]:out_offsets[j+1]``) is input segment ``index[j]``."""
    out = _pick(_JAGGED, kernel)(values, in_offsets, out_offsets, index)
    return out if out is not values else out.clone()


@jagged_gather.register_fake
def _(values: Tensor, in_offsets: Tensor, out_offsets: Tensor, index: Tensor, inverse: Tensor, kernel: str) -> Tensor:
    return torch.empty_like(values, memory_format=torch.contiguous_format)


def _jagged_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _, in_offsets, out_offsets, index, inverse, kernel = inputs
    ctx.save_for_backward(in_offsets, out_offsets, index, inverse)
    ctx.kernel = kernel


def _jagged_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None, None]:
    in_offsets, out_offsets, index, inverse = ctx.saved_tensors
    g = jagged_gather(grad.contiguous(), out_offsets, in_offsets, inverse, index, ctx.kernel)
    return g, None, None, None, None, None


jagged_gather.register_autograd(_jagged_backward, setup_context=_jagged_setup)


# --------------------------------------------------------------------------------------------------
# entry points: custom ops under torch.compile, direct calls in eager mode (see the module docstring)
# --------------------------------------------------------------------------------------------------


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, src: Tensor, index: Tensor, inverse: Tensor, kernel: str) -> Tensor:
        ctx.save_for_backward(index, inverse)
        ctx.kernel = kernel
        return _pick(_GATHERS, kernel)(src, index)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        index, inverse = ctx.saved_tensors
        return gather(grad.contiguous(), inverse, index, ctx.kernel), None, None, None


class _JaggedGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, values: Tensor, in_offsets: Tensor, out_offsets: Tensor, index: Tensor,
                inverse: Tensor, kernel: str) -> Tensor:  # fmt: skip
        ctx.save_for_backward(in_offsets, out_offsets, index, inverse)
        ctx.kernel = kernel
        return _pick(_JAGGED, kernel)(values, in_offsets, out_offsets, index)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None, None]:
        in_offsets, out_offsets, index, inverse = ctx.saved_tensors
        g = jagged(grad.contiguous(), out_offsets, in_offsets, inverse, index, ctx.kernel)
        return g, None, None, None, None, None


def _needs_grad(t: Tensor) -> bool:
    return t.requires_grad and torch.is_grad_enabled()


def plan(dest: Tensor, world_size: int, kernel: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Row plan: ``freescale::dispatch_plan`` semantics."""
    if torch.compiler.is_compiling():
        return dispatch_plan(dest, world_size, kernel)
    p = _pick(_PLANS, kernel)(dest, world_size)
    return p.counts, p.offsets, p.perm, p.inverse


def jagged_plan(dest: Tensor, lengths: Tensor, world_size: int, kernel: str) -> tuple[Tensor, ...]:
    """Jagged plan: ``freescale::jagged_dispatch_plan`` semantics."""
    if torch.compiler.is_compiling():
        return jagged_dispatch_plan(dest, lengths, world_size, kernel)
    return tuple(_pick(_PLANS, kernel)(dest, world_size, lengths))


def gather(src: Tensor, index: Tensor, inverse: Tensor, kernel: str) -> Tensor:
    """``freescale::gather_rows`` semantics (differentiable)."""
    if torch.compiler.is_compiling():
        return gather_rows(src, index, inverse, kernel)
    if _needs_grad(src):
        return _GatherRows.apply(src, index, inverse, kernel)
    return _pick(_GATHERS, kernel)(src, index)


def jagged(values: Tensor, in_offsets: Tensor, out_offsets: Tensor, index: Tensor, inverse: Tensor,
           kernel: str) -> Tensor:  # fmt: skip
    """``freescale::jagged_gather`` semantics (differentiable)."""
    if torch.compiler.is_compiling():
        return jagged_gather(values, in_offsets, out_offsets, index, inverse, kernel)
    if _needs_grad(values):
        return _JaggedGather.apply(values, in_offsets, out_offsets, index, inverse, kernel)
    return _pick(_JAGGED, kernel)(values, in_offsets, out_offsets, index)
