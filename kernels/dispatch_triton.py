"""Triton dispatch/combine kernels: block histogram, scan, stable scatter, row gather, segment copy.

Why these kernels: the PyTorch baseline issues a handful of launches per destination (its cost grows
with the world size) and the vectorized reference needs a sort, a device-to-host sync (``bincount``)
and a materialized per-value index for jagged rows. Here a plan is three launches whatever the world
size, and moving the payload is one launch per tensor that reads each byte once and writes it once.

Plan (rows are cut into blocks of ``BLOCK`` rows):

1. ``_block_hist_kernel``: per block, count rows (and, for jagged rows, values) per destination with
   atomics into a zeroed ``[n_blocks, W_POW2]`` scratch;
2. ``_scan_kernel`` (one program): totals per destination, exclusive scan over destinations, then a
   tiled scan over blocks turns the scratch into the first send position of every (block, dest)
   (and, for jagged rows, the first send value of every (block, dest) and home value of every block);
3. ``_stable_scatter_kernel``: a row's position is its (block, dest) base plus the number of earlier
   rows of its block with the same destination (a BLOCK x BLOCK comparison), so order within a
   destination is the home order: the grouping is stable and deterministic, no sort needed. Jagged
   rows also get their send lengths, send value offsets and home value offsets here.

Every kernel was compiled for sm_90 with Triton's bundled ptxas on a GPU-less host: no register spills,
and the copy kernels emit 128-bit (``v2.b64``) loads/stores when rows are 16-word aligned.

Kernels are jitted lazily and call only Triton builtins (``triton_support`` says why).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import Tensor

from .dispatch_ref import PlanTensors
from .triton_support import jit_lazily, next_pow2, tl, triton, triton_unavailable_reason

PLAN_BLOCK = 64  # rows per block in the plan kernels (the scatter compares BLOCK x BLOCK pairs)
_SCAN_ELEMS = 4096  # scratch entries per scan tile
# Words moved per program iteration by the copy kernels, with 8 warps: 8 words per thread keeps ptxas at
# 64 registers (full occupancy) while 128-bit loads stay in flight (checked by compiling for sm_90).
_COPY_ELEMS = 2048
_COPY_WARPS = 8


# --------------------------------------------------------------------------------------------------
# plan kernels (plain functions; jitted by _jit)
# --------------------------------------------------------------------------------------------------


def _block_hist_kernel(
    dest_ptr, len_ptr, scratch_ptr, n_rows, W_POW2, VBASE, HAS_LEN: tl.constexpr, BLOCK: tl.constexpr
):
    pid = tl.program_id(0).to(tl.int64)  # int64 offsets everywhere (see _scratch_bases)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    mask = rows < n_rows
    d = tl.load(dest_ptr + rows, mask=mask, other=0).to(tl.int64)
    slot = scratch_ptr + pid * W_POW2 + d
    tl.atomic_add(slot, tl.full([BLOCK], 1, tl.int64), mask=mask)
    if HAS_LEN:
        lengths = tl.load(len_ptr + rows, mask=mask, other=0).to(tl.int64)
        tl.atomic_add(slot + VBASE, lengths, mask=mask)


def _scan_kernel(
    scratch_ptr,
    counts_ptr,
    offsets_ptr,
    vcounts_ptr,
    voffsets_ptr,
    svoff_ptr,
    hoff_ptr,
    world_size,
    n_blocks,
    n_rows,
    VBASE,
    HBASE,
    HAS_LEN: tl.constexpr,
    W_POW2: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    # One program; the [n_blocks, W] scratch is walked in [BLOCK_B, W] tiles (scan along blocks
    # inside a tile, a carried running sum across tiles), so a large batch costs n_blocks / BLOCK_B
    # dependent steps rather than n_blocks.
    d = tl.arange(0, W_POW2)
    rb = tl.arange(0, BLOCK_B).to(tl.int64)  # int64 tile offsets: (block, dest) can pass 2**31
    dmask = d < world_size
    vvals = VBASE  # start of the value-count half of the scratch
    total = tl.full([W_POW2], 0, tl.int64)
    vtotal = tl.full([W_POW2], 0, tl.int64)
    for b0 in range(0, n_blocks, BLOCK_B):
        tile = (b0 + rb)[:, None] * W_POW2 + d[None, :]
        tmask = (b0 + rb < n_blocks)[:, None]
        total += tl.reduce(tl.load(scratch_ptr + tile, mask=tmask, other=0), 0, tl.standard._sum_combine)
        if HAS_LEN:
            vtile = tl.load(scratch_ptr + vvals + tile, mask=tmask, other=0)
            vtotal += tl.reduce(vtile, 0, tl.standard._sum_combine)
    incl = tl.associative_scan(total, 0, tl.standard._sum_combine)
    tl.store(counts_ptr + d, total, mask=dmask)
    tl.store(offsets_ptr + 1 + d, incl, mask=dmask)
    tl.store(offsets_ptr + d, tl.full([W_POW2], 0, tl.int64), mask=d == 0)
    run = incl - total
    if HAS_LEN:
        vincl = tl.associative_scan(vtotal, 0, tl.standard._sum_combine)
        tl.store(vcounts_ptr + d, vtotal, mask=dmask)
        tl.store(voffsets_ptr + 1 + d, vincl, mask=dmask)
        tl.store(voffsets_ptr + d, tl.full([W_POW2], 0, tl.int64), mask=d == 0)
        n_values = tl.reduce(vtotal, 0, tl.standard._sum_combine)
        tl.store(svoff_ptr + n_rows, n_values)  # both value-offset arrays end at the value count
        tl.store(hoff_ptr + n_rows, n_values)
        vrun = vincl - vtotal
        hrun = n_values * 0
    for b0 in range(0, n_blocks, BLOCK_B):  # (block, dest) counts -> first send position of the rows
        tile = (b0 + rb)[:, None] * W_POW2 + d[None, :]
        bmask = b0 + rb < n_blocks
        here = tl.load(scratch_ptr + tile, mask=bmask[:, None], other=0)
        before = tl.associative_scan(here, 0, tl.standard._sum_combine) - here
        tl.store(scratch_ptr + tile, run[None, :] + before, mask=bmask[:, None])
        run += tl.reduce(here, 0, tl.standard._sum_combine)
        if HAS_LEN:
            vhere = tl.load(scratch_ptr + vvals + tile, mask=bmask[:, None], other=0)
            vbefore = tl.associative_scan(vhere, 0, tl.standard._sum_combine) - vhere
            tl.store(scratch_ptr + vvals + tile, vrun[None, :] + vbefore, mask=bmask[:, None])
            vrun += tl.reduce(vhere, 0, tl.standard._sum_combine)
            block_values = tl.reduce(vhere, 1, tl.standard._sum_combine)  # values per block
            hbefore = tl.associative_scan(block_values, 0, tl.standard._sum_combine) - block_values
            tl.store(scratch_ptr + HBASE + b0 + rb, hrun + hbefore, mask=bmask)  # first home value
            hrun += tl.reduce(block_values, 0, tl.standard._sum_combine)


def _stable_scatter_kernel(
    dest_ptr,
    len_ptr,
    scratch_ptr,
    perm_ptr,
    inv_ptr,
    slen_ptr,
    svoff_ptr,
    hoff_ptr,
    n_rows,
    W_POW2,
    VBASE,
    HBASE,
    HAS_LEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    local = tl.arange(0, BLOCK)
    rows = pid * BLOCK + local
    mask = rows < n_rows
    d = tl.load(dest_ptr + rows, mask=mask, other=-1).to(tl.int64)
    before = local[None, :] < local[:, None]
    earlier = (d[:, None] == d[None, :]) & before
    rank = tl.reduce(earlier.to(tl.int32), 1, tl.standard._sum_combine).to(tl.int64)
    base = tl.load(scratch_ptr + pid * W_POW2 + d, mask=mask, other=0)
    pos = base + rank
    tl.store(perm_ptr + pos, rows.to(tl.int64), mask=mask)
    tl.store(inv_ptr + rows, pos, mask=mask)
    if HAS_LEN:
        lengths = tl.load(len_ptr + rows, mask=mask, other=0).to(tl.int64)
        vrank = tl.reduce(tl.where(earlier, lengths[None, :], 0), 1, tl.standard._sum_combine)
        vbase = tl.load(scratch_ptr + VBASE + pid * W_POW2 + d, mask=mask, other=0)
        tl.store(slen_ptr + pos, lengths, mask=mask)
        tl.store(svoff_ptr + pos, vbase + vrank, mask=mask)
        hrank = tl.reduce(tl.where(before, lengths[None, :], 0), 1, tl.standard._sum_combine)
        hbase = tl.load(scratch_ptr + HBASE + pid)
        tl.store(hoff_ptr + rows, hbase + hrank, mask=mask)


# --------------------------------------------------------------------------------------------------
# copy kernels
# --------------------------------------------------------------------------------------------------


def _gather_rows_kernel(src_ptr, idx_ptr, out_ptr, n_rows, row_words, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n_rows
    src_rows = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
    src_base = src_rows[:, None] * row_words
    out_base = rows[:, None] * row_words
    for c0 in range(0, row_words, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        m = rmask[:, None] & (cols < row_words)[None, :]
        v = tl.load(src_ptr + src_base + cols[None, :], mask=m)
        tl.store(out_ptr + out_base + cols[None, :], v, mask=m)


def _jagged_gather_kernel(
    src_ptr,
    in_off_ptr,
    out_off_ptr,
    idx_ptr,
    out_ptr,
    n_seg,
    total_rows,
    row_words,
    n_iter,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # One program per BLOCK_T output value rows (not per segment): heavy-tailed lengths (one 21k-long
    # segment among 300-long ones) would otherwise leave one program doing most of the work.
    pid = tl.program_id(0).to(tl.int64)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < total_rows
    lo = tl.full([BLOCK_T], 0, tl.int64)
    hi = tl.full([BLOCK_T], 0, tl.int64) + (n_seg - 1)
    for _ in range(n_iter):  # largest j with out_off[j] <= t (skips empty segments)
        mid = (lo + hi + 1) // 2
        go = tl.load(out_off_ptr + mid, mask=tmask, other=0) <= t
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    seg_start = tl.load(out_off_ptr + lo, mask=tmask, other=0)
    src_seg = tl.load(idx_ptr + lo, mask=tmask, other=0).to(tl.int64)
    src_rows = tl.load(in_off_ptr + src_seg, mask=tmask, other=0) + (t - seg_start)
    src_base = src_rows[:, None] * row_words
    out_base = t[:, None] * row_words
    for c0 in range(0, row_words, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        m = tmask[:, None] & (cols < row_words)[None, :]
        v = tl.load(src_ptr + src_base + cols[None, :], mask=m)
        tl.store(out_ptr + out_base + cols[None, :], v, mask=m)


# --------------------------------------------------------------------------------------------------
# launchers
# --------------------------------------------------------------------------------------------------


def _check(device: torch.device, *others: Tensor) -> None:
    reason = triton_unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(f"kernel='triton': {reason} (use kernel='pytorch' on CPU)")
    for t in others:  # a kernel given a host pointer on a GPU reads garbage or faults
        if t.device != device:
            raise ValueError(f"triton dispatch: all tensors must be on {device}, got one on {t.device}")


def _launch_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Triton launches on the *current* CUDA device and its stream, whatever the tensors' device:
    make the tensors' device current for the launch (a rank whose tensors live on cuda:1 while
    cuda:0 is current would otherwise run the kernel on the wrong GPU)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _scratch_bases(n_blocks: int, w_pow2: int) -> tuple[int, int]:
    """Offsets of the value-count half and of the per-block home values in the plan scratch.

    Computed on the host: as Python ints Triton passes them as int64 once they pass 2**31, where an
    ``n_blocks * W_POW2`` product inside a kernel would be int32 and wrap.
    """
    return n_blocks * w_pow2, 2 * n_blocks * w_pow2


def triton_plan(dest: Tensor, world_size: int, lengths: Tensor | None = None) -> PlanTensors:
    """Histogram -> scan -> stable scatter in three launches (see the module docstring)."""
    _check(dest.device, *(() if lengths is None else (lengths,)))
    n, dev, has_len = dest.shape[0], dest.device, lengths is not None
    i64 = {"dtype": torch.int64, "device": dev}
    counts, offsets = torch.empty(world_size, **i64), torch.empty(world_size + 1, **i64)
    perm, inverse = torch.empty(n, **i64), torch.empty(n, **i64)
    jag = [world_size, world_size + 1, n, n + 1, n + 1] if has_len else [0] * 5
    vcounts, voffsets, slen, svoff, hoff = (torch.empty(k, **i64) for k in jag)
    if n == 0:
        for t in (counts, offsets, vcounts, voffsets, svoff, hoff):
            t.zero_()
        return PlanTensors(counts, offsets, perm, inverse, vcounts, voffsets, slen, svoff, hoff)
    dest = dest.contiguous()
    lens = lengths.contiguous() if has_len else dest
    w_pow2 = next_pow2(world_size)
    n_blocks = triton.cdiv(n, PLAN_BLOCK)
    vbase, hbase = _scratch_bases(n_blocks, w_pow2)
    # [block, dest] row counts | [block, dest] value counts | [block] first home value (zeroed: atomics)
    scratch = torch.zeros(((2 * w_pow2 + 1) if has_len else w_pow2) * n_blocks, **i64)
    with _launch_device(dev):
        jit_lazily(_block_hist_kernel)[(n_blocks,)](dest, lens, scratch, n, w_pow2, vbase, HAS_LEN=has_len,
                                              BLOCK=PLAN_BLOCK)  # fmt: skip
        jit_lazily(_scan_kernel)[(1,)](
            scratch,
            counts,
            offsets,
            vcounts,
            voffsets,
            svoff,
            hoff,
            world_size,
            n_blocks,
            n,
            vbase,
            hbase,
            HAS_LEN=has_len,
            W_POW2=w_pow2,
            BLOCK_B=max(1, _SCAN_ELEMS // w_pow2),
            num_warps=8,
        )
        jit_lazily(_stable_scatter_kernel)[(n_blocks,)](
            dest,
            lens,
            scratch,
            perm,
            inverse,
            slen,
            svoff,
            hoff,
            n,
            w_pow2,
            vbase,
            hbase,
            HAS_LEN=has_len,
            BLOCK=PLAN_BLOCK,
        )
    return PlanTensors(counts, offsets, perm, inverse, vcounts, voffsets, slen, svoff, hoff)


def _word_views(src: Tensor, out: Tensor, src_rows: int, out_rows: int) -> tuple[Tensor, Tensor, int]:
    """View contiguous ``src``/``out`` as ``[rows, words]`` of the widest integer word dividing a row.

    Copying 8-byte words instead of 2-byte bf16 elements gives wide loads on GPU, and one kernel
    instantiation per word size serves every dtype (bool, bf16, float, int) bit for bit.
    """
    row_bytes = out.numel() * out.element_size() // out_rows
    for word in (torch.int64, torch.int32, torch.int16, torch.uint8):
        size = torch.empty(0, dtype=word).element_size()
        if row_bytes % size == 0 and src.data_ptr() % size == 0 and out.data_ptr() % size == 0:
            words = row_bytes // size
            src_w = src.reshape(-1).view(torch.uint8).view(word).view(src_rows, words)
            out_w = out.reshape(-1).view(torch.uint8).view(word).view(out_rows, words)
            return src_w, out_w, words
    raise AssertionError("a uint8 word always divides a row")  # pragma: no cover


def _copy_blocks(row_words: int) -> tuple[int, int]:
    block_c = min(next_pow2(row_words), 256)
    return max(1, _COPY_ELEMS // block_c), block_c


def triton_gather_rows(src: Tensor, index: Tensor) -> Tensor:
    """``out[j] = src[index[j]]`` with one launch; any dtype and trailing shape."""
    _check(src.device, index)
    out = src.new_empty((index.shape[0], *src.shape[1:]))
    n = index.shape[0]
    if n == 0 or out.numel() == 0:
        return out
    src_w, out_w, row_words = _word_views(src.contiguous(), out, src.shape[0], n)
    block_r, block_c = _copy_blocks(row_words)
    with _launch_device(src.device):
        jit_lazily(_gather_rows_kernel)[(triton.cdiv(n, block_r),)](
            src_w,
            index.contiguous(),
            out_w,
            n,
            row_words,
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            num_warps=_COPY_WARPS,
        )
    return out


def triton_jagged_gather(values: Tensor, in_offsets: Tensor, out_offsets: Tensor, index: Tensor) -> Tensor:
    """Output segment ``j`` is input segment ``index[j]``; one launch over output value rows."""
    _check(values.device, in_offsets, out_offsets, index)
    out = torch.empty_like(values, memory_format=torch.contiguous_format)
    total, n_seg = values.shape[0], index.shape[0]
    if total == 0 or out.numel() == 0 or n_seg == 0:
        return out
    src_w, out_w, row_words = _word_views(values.contiguous(), out, total, total)
    block_t, block_c = _copy_blocks(row_words)
    n_iter = max(1, math.ceil(math.log2(n_seg))) + 1
    with _launch_device(values.device):
        jit_lazily(_jagged_gather_kernel)[(triton.cdiv(total, block_t),)](
            src_w,
            in_offsets.contiguous(),
            out_offsets.contiguous(),
            index.contiguous(),
            out_w,
            n_seg,
            total,
            row_words,
            n_iter,
            BLOCK_T=block_t,
            BLOCK_C=block_c,
            num_warps=_COPY_WARPS,
        )
    return out
