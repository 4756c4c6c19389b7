"""Dispatch/combine: group rows by destination rank into one contiguous send buffer, and undo it.

This is the data movement of the online balancer (docs/design.md#online-balancer): after the sharded-embedding
communication each sample (its embeddings, dense features and labels) is dispatched to the rank that
balances per-rank cost; after backward the embedding gradients are combined back to the samples' home
ranks. Both are permutations, so ``combine(dispatch(x)) == x`` bit for bit, dispatch's gradient is
combine and combine's gradient is dispatch.

One dispatcher, three implementations (the generative-recommenders ``ops/`` pattern), chosen by
``kernel=`` or ``DispatchConfig.kernel``:

* ``"naive"``: the paper's PyTorch baseline, a boolean mask per destination (linear in world size);
* ``"pytorch"``: vectorized reference (bincount, exclusive scan, stable sort), default on CPU;
* ``"triton"``: histogram/scan/stable-scatter and copy kernels, default on CUDA.

All three produce the same stable layout (home order within a destination), so they agree exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from . import dispatch_ops as ops
from . import dispatch_ref as ref
from .triton_support import HAS_TRITON, triton_unavailable_reason

KERNELS = ("naive", "pytorch", "triton")


@dataclass(frozen=True)
class DispatchConfig:
    """How dispatch/combine run.

    ``kernel``: ``"naive" | "pytorch" | "triton"`` or None for the device default (triton on CUDA,
    pytorch on CPU). ``validate``: check destinations and jagged lengths against the data (on CPU a
    ``ValueError``; on CUDA an asynchronous device assert, so no host sync is added); skipped while
    ``torch.compile`` traces.
    """

    kernel: str | None = None
    validate: bool = True

    def __post_init__(self) -> None:
        if self.kernel is not None and self.kernel not in KERNELS:
            raise ValueError(f"DispatchConfig.kernel must be one of {KERNELS} or None, got {self.kernel!r}")
        if not isinstance(self.validate, bool):
            raise ValueError(f"DispatchConfig.validate must be a bool, got {self.validate!r}")


class DispatchPlan(NamedTuple):
    """Where every row went; enough to combine and to size the all-to-all.

    ``counts[d]`` rows go to destination ``d``, occupying send rows ``offsets[d]:offsets[d+1]``;
    send row ``j`` holds home row ``perm[j]`` and home row ``i`` sits at send row ``inverse[i]``.
    Jagged plans add ``value_counts[d]`` (the send-side lengths per destination: values sent to
    ``d``), ``value_offsets`` (their offsets in the send buffer), and the per-row lengths and value
    offsets of the home and the send layout.
    """

    world_size: int
    dest: Tensor
    counts: Tensor
    offsets: Tensor
    perm: Tensor
    inverse: Tensor
    value_counts: Tensor | None = None
    value_offsets: Tensor | None = None
    home_lengths: Tensor | None = None
    home_value_offsets: Tensor | None = None
    send_lengths: Tensor | None = None
    send_value_offsets: Tensor | None = None

    @property
    def is_jagged(self) -> bool:
        return self.value_counts is not None


@dataclass
class JaggedRows:
    """Samples with variable-length item embeddings that move as units.

    ``values[offsets[i]:offsets[i+1]]`` are sample i's ``lengths[i]`` item rows (any trailing shape);
    ``dense`` and ``labels`` (optional) have one row per sample.

    The payload ``dispatch_jagged``/``combine_jagged`` move, here in kernels/ below the trainer. The
    trainer's ``jagged.JaggedLayout`` (a micro-batch's attention layout: lengths, offsets, length
    groups, no values) and ``jagged_ids.JaggedIds`` (ids keyed by feature, lengths per key, as in
    TorchRec's ``KeyedJaggedTensor``) are other shapes of jagged data, not copies of this one.
    """

    values: Tensor
    lengths: Tensor
    dense: Tensor | None = None
    labels: Tensor | None = None

    def __post_init__(self) -> None:
        if self.lengths.dim() != 1 or self.lengths.dtype.is_floating_point or self.lengths.is_complex():
            raise ValueError(f"JaggedRows.lengths must be a 1-D integer tensor, got {self.lengths.dtype} "
                             f"of shape {tuple(self.lengths.shape)}")  # fmt: skip
        if self.values.dim() < 1:
            raise ValueError("JaggedRows.values must have a leading value dimension")
        n = self.lengths.shape[0]
        for name in ("dense", "labels"):
            t = getattr(self, name)
            if t is not None and (t.dim() < 1 or t.shape[0] != n):
                raise ValueError(f"JaggedRows.{name} must have one row per sample ({n}), got shape "
                                 f"{tuple(t.shape)}")  # fmt: skip

    @property
    def num_rows(self) -> int:
        return self.lengths.shape[0]


class DispatchResult(NamedTuple):
    """The send buffer (same structure as the input rows) and the plan that produced it."""

    buffer: Any
    plan: DispatchPlan


# --------------------------------------------------------------------------------------------------
# kernel selection and validation
# --------------------------------------------------------------------------------------------------


def default_kernel(device: torch.device) -> str:
    """Triton on CUDA (when installed), the vectorized PyTorch reference elsewhere."""
    return "triton" if device.type == "cuda" and HAS_TRITON else "pytorch"


def resolve_kernel(kernel: str | None, device: torch.device, config: DispatchConfig | None = None) -> str:
    """The implementation to use: explicit ``kernel``, else the config's, else the device default."""
    choice = kernel if kernel is not None else (config.kernel if config is not None else None)
    if choice is None:
        return default_kernel(device)
    if choice not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {choice!r}")
    if choice == "triton" and not torch.compiler.is_compiling():  # the launchers re-check at run time
        reason = triton_unavailable_reason(device)
        if reason is not None:
            raise RuntimeError(f"kernel='triton': {reason} (use kernel='pytorch' on CPU)")
    return choice


def _check_dest(dest: Tensor, world_size: int, n_rows: int, validate: bool) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if dest.dim() != 1 or dest.dtype.is_floating_point or dest.dtype == torch.bool or dest.is_complex():
        raise ValueError(f"dest must be a 1-D integer tensor, got {dest.dtype} of shape {tuple(dest.shape)}")
    if dest.shape[0] != n_rows:
        raise ValueError(f"dest has {dest.shape[0]} entries but the rows have {n_rows}")
    if not validate or torch.compiler.is_compiling() or n_rows == 0:
        return
    bad = (dest < 0) | (dest >= world_size)
    if dest.device.type == "cuda":
        torch._assert_async(~bad.any(), f"dest values must lie in [0, world_size={world_size})")
    elif bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"dest[{i}] = {int(dest[i])} is outside [0, world_size={world_size})")


def _check_lengths(batch: JaggedRows, validate: bool) -> None:
    if not validate or torch.compiler.is_compiling():
        return
    lengths, total = batch.lengths, batch.values.shape[0]
    ok = (lengths >= 0).all() & (lengths.sum() == total)
    if lengths.device.type == "cuda":
        torch._assert_async(ok, "JaggedRows.lengths must be >= 0 and sum to values.shape[0]")
    elif not bool(ok):
        raise ValueError(f"JaggedRows.lengths must be >= 0 and sum to values.shape[0] = {total}; "
                         f"got min {int(lengths.min())}, sum {int(lengths.sum())}")  # fmt: skip


def _check_total(values: Tensor, offsets: Tensor, validate: bool) -> None:
    """The values to combine must be exactly the plan's send-side values (the kernels index by offset)."""
    if not validate or torch.compiler.is_compiling():
        return
    ok = offsets[-1] == values.shape[0]
    if values.device.type == "cuda":
        torch._assert_async(ok, "combine_jagged: values rows differ from the plan's send-side value count")
    elif not bool(ok):
        raise ValueError(f"combine_jagged: the plan sent {int(offsets[-1])} values, got {values.shape[0]}")


def _check_plan_device(t: Tensor, plan: DispatchPlan) -> None:
    """Combine's rows must sit with the plan: a Triton kernel handed a host index for a GPU tensor
    would read host addresses on the device (a fault at best), and the PyTorch paths raise late."""
    if t.device != plan.perm.device:
        raise ValueError(f"combine: rows are on {t.device} but the plan is on {plan.perm.device}")


def _config(config: DispatchConfig | None) -> DispatchConfig:
    return config if config is not None else DispatchConfig()


def _as_tuple(rows: Tensor | Sequence[Tensor]) -> tuple[tuple[Tensor, ...], bool]:
    if isinstance(rows, Tensor):
        return (rows,), True
    rows = tuple(rows)
    if not rows:
        raise ValueError("rows must be a tensor or a non-empty sequence of tensors")
    return rows, False


# --------------------------------------------------------------------------------------------------
# plans
# --------------------------------------------------------------------------------------------------


def plan_dispatch(
    dest: Tensor,
    world_size: int,
    *,
    lengths: Tensor | None = None,
    kernel: str | None = None,
    config: DispatchConfig | None = None,
) -> DispatchPlan:
    """Compute where each row goes (counts, offsets, stable permutation); jagged when ``lengths``."""
    cfg = _config(config)
    _check_dest(dest, world_size, dest.shape[0] if dest.dim() == 1 else -1, cfg.validate)
    k = resolve_kernel(kernel, dest.device, cfg)
    if lengths is None:
        if k == "naive":
            p = ref.naive_plan(dest, world_size)
            counts, offsets, perm, inverse = p.counts, p.offsets, p.perm, p.inverse
        else:
            counts, offsets, perm, inverse = ops.plan(dest, world_size, k)
        return DispatchPlan(world_size, dest, counts, offsets, perm, inverse)
    if lengths.shape != dest.shape:
        raise ValueError(f"lengths must have one entry per row ({dest.shape[0]}), got {tuple(lengths.shape)}")
    lengths = lengths.long()
    if k == "naive":
        fields = tuple(ref.naive_plan(dest, world_size, lengths))
    else:
        fields = ops.jagged_plan(dest, lengths, world_size, k)
    counts, offsets, perm, inverse, vcounts, voffsets, slen, svoff, home_voff = fields
    return DispatchPlan(world_size, dest, counts, offsets, perm, inverse, vcounts, voffsets,
                        lengths, home_voff, slen, svoff)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# fixed-width rows
# --------------------------------------------------------------------------------------------------


def _move_rows(t: Tensor, plan: DispatchPlan, k: str, forward: bool) -> Tensor:
    """Dispatch (``forward``) or combine one per-row tensor with the chosen implementation."""
    if k == "naive":
        if forward:
            return ref.naive_dispatch_rows(t, plan.dest, plan.world_size)
        return ref.naive_combine_rows(t, plan.dest, plan.counts.tolist())
    index, inverse = (plan.perm, plan.inverse) if forward else (plan.inverse, plan.perm)
    return ops.gather(t, index, inverse, k)


def dispatch(
    rows: Tensor | Sequence[Tensor],
    dest: Tensor,
    world_size: int,
    *,
    kernel: str | None = None,
    config: DispatchConfig | None = None,
) -> DispatchResult:
    """Group rows by ``dest`` into one contiguous send buffer per tensor.

    ``rows`` is a tensor or a sequence of tensors sharing the leading row dimension (a sample's dense
    features and labels move together); the buffer has the same structure.
    """
    tensors, single = _as_tuple(rows)
    n = tensors[0].shape[0]
    for t in tensors:
        if t.dim() < 1 or t.shape[0] != n:
            raise ValueError(f"all row tensors need the same leading dimension {n}, got {tuple(t.shape)}")
        if t.device != dest.device:
            raise ValueError(f"rows are on {t.device} but dest is on {dest.device}")
    cfg = _config(config)
    _check_dest(dest, world_size, n, cfg.validate)
    plan = plan_dispatch(dest, world_size, kernel=kernel, config=DispatchConfig(cfg.kernel, validate=False))
    k = resolve_kernel(kernel, dest.device, cfg)
    out = tuple(_move_rows(t, plan, k, forward=True) for t in tensors)
    return DispatchResult(out[0] if single else out, plan)


def combine(
    buffer: Tensor | Sequence[Tensor],
    plan: DispatchPlan,
    *,
    kernel: str | None = None,
    config: DispatchConfig | None = None,
) -> Tensor | tuple[Tensor, ...]:
    """Inverse of ``dispatch``: put send-buffer rows back in home order."""
    tensors, single = _as_tuple(buffer)
    n = plan.perm.shape[0]
    for t in tensors:
        if t.dim() < 1 or t.shape[0] != n:
            raise ValueError(f"combine expects {n} rows (the plan's), got shape {tuple(t.shape)}")
        _check_plan_device(t, plan)
    k = resolve_kernel(kernel, plan.perm.device, _config(config))
    out = tuple(_move_rows(t, plan, k, forward=False) for t in tensors)
    return out[0] if single else out


# --------------------------------------------------------------------------------------------------
# jagged rows
# --------------------------------------------------------------------------------------------------


def _move_values(values: Tensor, plan: DispatchPlan, k: str, forward: bool) -> Tensor:
    """Move whole variable-length value segments (a sample's item embeddings) with their sample."""
    if k == "naive":
        value_dest = ref.value_destinations(plan.dest, plan.home_lengths)
        if forward:
            return ref.naive_dispatch_rows(values, value_dest, plan.world_size)
        return ref.naive_combine_rows(values, value_dest, plan.value_counts.tolist())
    if forward:
        return ops.jagged(values, plan.home_value_offsets, plan.send_value_offsets,
                                 plan.perm, plan.inverse, k)  # fmt: skip
    return ops.jagged(values, plan.send_value_offsets, plan.home_value_offsets,
                             plan.inverse, plan.perm, k)  # fmt: skip


def _move_jagged(batch: JaggedRows, plan: DispatchPlan, k: str, forward: bool) -> JaggedRows:
    values = _move_values(batch.values, plan, k, forward)
    if k == "naive" and forward:
        lengths = ref.naive_dispatch_rows(plan.home_lengths, plan.dest, plan.world_size)
    else:
        lengths = plan.send_lengths if forward else plan.home_lengths
    dense = None if batch.dense is None else _move_rows(batch.dense, plan, k, forward)
    labels = None if batch.labels is None else _move_rows(batch.labels, plan, k, forward)
    return JaggedRows(values, lengths, dense, labels)


def dispatch_jagged(
    batch: JaggedRows,
    dest: Tensor,
    world_size: int,
    *,
    kernel: str | None = None,
    config: DispatchConfig | None = None,
) -> DispatchResult:
    """Dispatch whole samples: value segments, lengths, dense features and labels move together.

    The plan's ``value_counts`` are the send-side lengths per destination (the value split sizes of
    the all-to-all), ``counts`` the sample split sizes.
    """
    cfg = _config(config)
    for t in (batch.values, batch.lengths, batch.dense, batch.labels):
        if t is not None and t.device != dest.device:
            raise ValueError(f"JaggedRows tensors are on {t.device} but dest is on {dest.device}")
    _check_lengths(batch, cfg.validate)
    _check_dest(dest, world_size, batch.num_rows, cfg.validate)
    plan = plan_dispatch(
        dest, world_size, lengths=batch.lengths, kernel=kernel, config=DispatchConfig(cfg.kernel, validate=False)
    )
    k = resolve_kernel(kernel, dest.device, cfg)
    return DispatchResult(_move_jagged(batch, plan, k, forward=True), plan)


def combine_jagged(
    batch: JaggedRows,
    plan: DispatchPlan,
    *,
    kernel: str | None = None,
    config: DispatchConfig | None = None,
) -> JaggedRows:
    """Inverse of ``dispatch_jagged`` (e.g. embedding gradients back to their home order)."""
    if not plan.is_jagged:
        raise ValueError("combine_jagged needs a plan from dispatch_jagged (this one has no lengths)")
    if batch.num_rows != plan.perm.shape[0]:
        raise ValueError(f"combine_jagged expects {plan.perm.shape[0]} samples, got {batch.num_rows}")
    for t in (batch.values, batch.lengths, batch.dense, batch.labels):
        if t is not None:
            _check_plan_device(t, plan)
    _check_total(batch.values, plan.send_value_offsets, _config(config).validate)
    k = resolve_kernel(kernel, plan.perm.device, _config(config))
    return _move_jagged(batch, plan, k, forward=False)
