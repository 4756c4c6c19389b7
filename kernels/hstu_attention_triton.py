"""Triton kernels for jagged HSTU attention: forward, backward, and the launchers around them.

The math is ``hstu_attention_ref`` (docs/kernels.md): ``out_i = Σ_{j<=i} silu(q_i·k_j + pb[i-j] +
tb[bucket(τ_i - t_j)]) / n · v_j`` per sample and head, over flat rows with sample offsets (no
padding). Matrix products run in the inputs' dtype with float32 accumulation; scores, biases and
SiLU are float32.

Forward: one program per (query block, sample, head); blocks are launched longest-row first (the
causal last block of a long sample has the most key tiles).

Backward: one program per (key block, sample); it walks the heads, and for each computes
``dK``/``dV`` of its key block over the query blocks at or after it, then ``dQ`` of the query block
with the same index over the key blocks up to it (the pairing balances work: every program of a
sample visits ``n_blocks + 1`` tiles per head). No float atomics anywhere, so gradients are
bit-for-bit repeatable (PEC's exactness against synchronous training relies on it):

* the relative-position bias gradient of a tile is the sum of ``ds`` along its diagonals. The tile is
  written to a per-program scratch and read back skewed (row ``r`` shifted by ``r``), so a column sum
  gives the diagonal sums; they are added into the program's own row of a ``[programs, width]``
  partial buffer, summed over programs afterwards by ``torch.sum`` (deterministic);
* the time bias gradient: for each bucket present in the tile, a masked sum, accumulated in a
  per-program vector and stored in its own row of a ``[programs, buckets]`` buffer.

Times enter the kernels as int32 seconds since the sample's first event (``rebased_times``), so a
gap is one 32-bit subtraction instead of 64-bit arithmetic on every score (registers, and int64 is
two instructions per operation on the GPU); a sample spanning more than 2^30 s (34 years) would have
its far times clamped. The time bucket takes ``log`` and an IEEE division exactly as ``torch.log`` /
``/`` do on CUDA
(libdevice's ``logf`` and ``div.rn``), so a gap lands in the same bucket as in the PyTorch model; the
CPU interpreter uses numpy's ``log``, which can differ in the last bit (a bucket edge within one ulp).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .time_bucket_edges import bucket_edges
from .triton_support import HAS_TRITON, interpreter_enabled, jit_lazily, next_pow2, tl, triton

if HAS_TRITON:
    from triton.language.extra import libdevice
else:  # pragma: no cover - triton is in the pinned stack
    libdevice = None


@dataclass(frozen=True)
class AttentionKernelConfig:
    """Tile sizes and launch options (powers of two; blocks >= 16 for ``tl.dot``)."""

    # Defaults measured on an H200 (bench_hstu_attention, 2026-11-27): 128x32 forward tiles on 8 warps
    # (5.30 ms at uniform 8,192, against 6.19 ms for the 64x64 / 8 warps first chosen from ptxas's
    # register report on a GPU-less host) and 32x32 backward tiles on 4 warps (heavy-tailed forward +
    # backward 11.8 ms against 13.6 ms on 8 warps; 64x64 backward tiles spill: 17.3 ms).
    fwd_block_m: int = 128
    fwd_block_n: int = 32
    fwd_warps: int = 8
    fwd_stages: int = 2
    bwd_block: int = 32
    bwd_warps: int = 4
    bwd_stages: int = 1
    # A tile whose gaps span at most ``time_span`` consecutive buckets buckets them by comparing against
    # the bucket edges (``time_span - 1`` integer comparisons per score) instead of a log and a division.
    time_span: int = 4
    # bf16/fp16 on a GPU: SiLU's sigmoid as ``0.5 + 0.5·tanh(s/2)`` with the hardware's tanh.approx
    # (one special-function op per score instead of an exp and a reciprocal; absolute error <= 2^-12
    # on the sigmoid). float32 inputs and the interpreter always take the exact form.
    fast_silu: bool = False

    def __post_init__(self) -> None:
        for name in ("fwd_block_m", "fwd_block_n", "bwd_block"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"AttentionKernelConfig.{name} must be a power of two >= 16, got {value}")
        for name in ("fwd_warps", "bwd_warps", "fwd_stages", "bwd_stages", "time_span"):
            if getattr(self, name) < 1:
                raise ValueError(f"AttentionKernelConfig.{name} must be >= 1, got {getattr(self, name)}")


TIME_CLAMP = 2**30 - 1  # rebased times stay within +-(2^30 - 1) s: any difference of two fits in int32
_TIME_FAR = tl.constexpr(2**30) if HAS_TRITON else None  # past every rebased time (masked lanes' stand-in)

GPU_CONFIG = AttentionKernelConfig()
INTERPRETER_CONFIG = AttentionKernelConfig(16, 16, 1, 1, 16, 1, 1, 4)  # small tiles: numpy runs every program


def default_config(device: torch.device) -> AttentionKernelConfig:
    return INTERPRETER_CONFIG if device.type == "cpu" else GPU_CONFIG


# --------------------------------------------------------------------------------------------------
# device helpers (plain functions; jitted with the kernels, see _bind)
# --------------------------------------------------------------------------------------------------

# The kernels call the helpers by these names; ``_bind`` sets them to the jitted helpers of the current
# interpreter mode before every launch.
_dot = _time_bucket = _time_buckets = _scores = _sigmoid = _load_rows = _add_diagonals = _attend = None


def _dot_impl(a, b, PRECISION: tl.constexpr, COMPILED: tl.constexpr):
    """``a @ b`` accumulated in float32; the interpreter's ``tl.dot`` reads bfloat16 as raw bits, so
    there the operands (already rounded to their dtype) are widened first."""
    if COMPILED:
        return tl.dot(a, b, input_precision=PRECISION)
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


def _time_bucket_impl(delta, num_buckets, COMPILED: tl.constexpr):
    gap = tl.maximum(tl.abs(delta), 1).to(tl.float32)
    if COMPILED:
        scaled = tl.math.div_rn(libdevice.log(gap), 0.301)
    else:
        scaled = tl.log(gap) / 0.301
    return tl.minimum(tl.maximum(scaled.to(tl.int32), 0), num_buckets - 1)


def _time_buckets_impl(tq, tk, mask_m, mask_n, EDGES, num_buckets, SPAN: tl.constexpr, COMPILED: tl.constexpr):
    """Time buckets of a tile's gaps ``tq_i - tk_j`` (int32).

    Every gap lies between the tile's lowest (earliest query time - latest key time) and highest
    (latest query time - earliest key time), and the bucket does not decrease with a positive gap. So
    when the lowest gap is positive and the two bounds are at most ``SPAN - 1`` buckets apart, a gap's
    bucket is the lowest one plus the number of the next ``SPAN - 1`` bucket edges it reaches: integer
    comparisons instead of a ``log`` and a division per score. Far from the diagonal of a history that
    is the common case; other tiles take the formula per score. The edge loads stay outside the
    branch (Triton 3.6 does not pipeline a loop with a load inside a branch).
    """
    far = _TIME_FAR
    lowest = tl.reduce(tl.where(mask_m, tq, far), 0, tl.standard._elementwise_min)
    highest = tl.reduce(tl.where(mask_m, tq, -far), 0, tl.standard._elementwise_max)
    gap_lo = lowest - tl.reduce(tl.where(mask_n, tk, -far), 0, tl.standard._elementwise_max)
    gap_hi = highest - tl.reduce(tl.where(mask_n, tk, far), 0, tl.standard._elementwise_min)
    first = _time_bucket(gap_lo, num_buckets, COMPILED)
    gap = tq[:, None] - tk[None, :]
    bucket = gap * 0 + first
    for i in tl.static_range(1, SPAN):
        bucket += (gap >= tl.load(EDGES + first + i)).to(tl.int32)
    if (gap_lo < 1) | (_time_bucket(gap_hi, num_buckets, COMPILED) - first >= SPAN):
        bucket = _time_bucket(gap, num_buckets, COMPILED)
    return bucket


def _scores_impl(q, k, rm, rn, tq, TS, start, mask_m, mask_n, PB, TB, EDGES, num_pos, num_buckets,
                 HAS_TIME: tl.constexpr, SPAN: tl.constexpr, BELOW: tl.constexpr, COMPILED: tl.constexpr,
                 PRECISION: tl.constexpr):  # fmt: skip
    """Scores ``q·kᵀ + biases`` of a tile (float32) and its time buckets (0 without a time bias).
    ``BELOW``: every key of the tile precedes every query (no distance below 1 to clamp)."""
    s = _dot(q, tl.trans(k), PRECISION, COMPILED)
    if BELOW:
        distance = tl.minimum(rm[:, None] - rn[None, :], num_pos - 1)
    else:
        distance = tl.minimum(tl.maximum(rm[:, None] - rn[None, :], 0), num_pos - 1)
    s += tl.load(PB + distance).to(tl.float32)
    bucket = (distance * 0).to(tl.int32)
    if HAS_TIME:
        tk = tl.load(TS + start + rn, mask=mask_n, other=0)
        bucket = _time_buckets(tq, tk, mask_m, mask_n, EDGES, num_buckets, SPAN, COMPILED)
        s += tl.load(TB + bucket).to(tl.float32)
    return s, bucket


def _sigmoid_impl(s, FAST: tl.constexpr):
    """``sigmoid(s)``; ``FAST``: through the hardware's ``tanh.approx`` (compiled bf16/fp16 only)."""
    if FAST:
        half = 0.5 * s
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [half], dtype=tl.float32,
                                      is_pure=True, pack=1)  # fmt: skip
        return 0.5 + 0.5 * t
    return 1.0 / (1.0 + tl.exp(-s))


def _add_diagonals_impl(scratch, pos_row, r, kk, offset, num_pos, pos_width, BLOCK: tl.constexpr):
    """Add the diagonal sums of the ``[BLOCK, BLOCK]`` tile in ``scratch`` for skewed columns ``kk``
    (relative distance ``kk - (BLOCK - 1)``, plus the tile's ``offset``) into this program's row of the
    position-bias partials; return the sum of the diagonals at or past the last bias entry."""
    column = r[:, None] + (BLOCK - 1) - kk[None, :]  # the tile column of row r on skewed column kk
    sums = tl.reduce(tl.load(scratch + r[:, None] * BLOCK + column, mask=(column >= 0) & (column < BLOCK),
                             other=0.0), 0, tl.standard._sum_combine)  # fmt: skip
    distance = offset + kk - (BLOCK - 1)
    inside = (distance >= 0) & (distance < num_pos - 1) & (distance < pos_width)
    kept = tl.load(pos_row + distance, mask=inside, other=0.0)
    tl.store(pos_row + distance, kept + sums, mask=inside)
    return tl.reduce(tl.where(distance >= num_pos - 1, sums, 0.0), 0, tl.standard._sum_combine)


def _load_rows_impl(PTR, rows, stride, col, mask_rows, mask_d):
    return tl.load(PTR + rows[:, None] * stride + col[None, :], mask=mask_rows[:, None] & mask_d[None, :], other=0.0)


# --------------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------------


def _attend_impl(acc, q, rm, tq, mask_m, inv_n, n0, n, start, col, mask_d, K, V, TS, PB, TB, EDGES,
                 stride_k, stride_v, num_pos, num_buckets, BLOCK_N: tl.constexpr, HAS_TIME: tl.constexpr,
                 SPAN: tl.constexpr, BELOW: tl.constexpr, FAST_SILU: tl.constexpr, COMPILED: tl.constexpr,
                 PRECISION: tl.constexpr):  # fmt: skip
    """``acc`` plus one key tile's ``silu(scores) / n · v``; ``BELOW``: the tile lies wholly below the
    causal diagonal of the query block (no mask to apply)."""
    rn = n0 + tl.arange(0, BLOCK_N)
    mask_n = rn < n
    k = _load_rows(K, start + rn, stride_k, col, mask_n, mask_d)
    v = _load_rows(V, start + rn, stride_v, col, mask_n, mask_d)
    s, _ = _scores(q, k, rm, rn, tq, TS, start, mask_m, mask_n, PB, TB, EDGES, num_pos, num_buckets,
                   HAS_TIME, SPAN, BELOW, COMPILED, PRECISION)  # fmt: skip
    p = s * _sigmoid(s, FAST_SILU) * inv_n
    if not BELOW:
        p = tl.where((rm[:, None] >= rn[None, :]) & mask_m[:, None], p, 0.0)
    return acc + _dot(p.to(v.dtype), v, PRECISION, COMPILED)


def _hstu_fwd_kernel(
    Q, K, V, OUT, OFF, TS, QT, PB, TB, EDGES,
    stride_q, stride_k, stride_v, stride_o,
    num_heads, num_pos, num_buckets, num_blocks,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_TIME: tl.constexpr, SPAN: tl.constexpr, FAST_SILU: tl.constexpr, COMPILED: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    block = num_blocks - 1 - tl.program_id(0)
    pair = tl.program_id(1)
    b = pair // num_heads
    h = pair % num_heads
    start = tl.load(OFF + b)
    n = (tl.load(OFF + b + 1) - start).to(tl.int32)  # lengths fit in 32 bits; offsets may not
    m0 = block * BLOCK_M
    if m0 >= n:
        return
    rm = m0 + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    mask_m = rm < n
    mask_d = rd < HEAD_DIM
    col = h * HEAD_DIM + rd
    q = _load_rows(Q, start + rm, stride_q, col, mask_m, mask_d)
    tq = tl.load(QT + start + rm, mask=mask_m, other=0)
    inv_n = 1.0 / n.to(tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    below = (m0 // BLOCK_N) * BLOCK_N  # key tiles before it precede every query of the block
    for n0 in range(0, below, BLOCK_N):
        acc = _attend(acc, q, rm, tq, mask_m, inv_n, n0, n, start, col, mask_d, K, V, TS, PB, TB, EDGES,
                      stride_k, stride_v, num_pos, num_buckets, BLOCK_N, HAS_TIME, SPAN, True, FAST_SILU,
                      COMPILED, PRECISION)  # fmt: skip
    for n0 in range(below, tl.minimum(m0 + BLOCK_M, n), BLOCK_N):
        acc = _attend(acc, q, rm, tq, mask_m, inv_n, n0, n, start, col, mask_d, K, V, TS, PB, TB, EDGES,
                      stride_k, stride_v, num_pos, num_buckets, BLOCK_N, HAS_TIME, SPAN, False, FAST_SILU,
                      COMPILED, PRECISION)  # fmt: skip
    out = OUT + (start + rm)[:, None] * stride_o + col[None, :]
    tl.store(out, acc.to(OUT.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


# --------------------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------------------


def _hstu_bwd_kernel(
    Q, K, V, DO, DQ, DK, DV, OFF, BLKOFF, TS, QT, PB, TB, EDGES, SCR, DPOS, DTIME,
    stride_q, stride_k, stride_v, stride_do, stride_dq, stride_dk, stride_dv,
    num_heads, num_pos, num_buckets, num_blocks, pos_width,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, BUCKETS_POW2: tl.constexpr,
    HAS_TIME: tl.constexpr, SPAN: tl.constexpr, FAST_SILU: tl.constexpr, COMPILED: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    jb = num_blocks - 1 - tl.program_id(0)
    b = tl.program_id(1)
    start = tl.load(OFF + b)
    n = (tl.load(OFF + b + 1) - start).to(tl.int32)  # lengths fit in 32 bits; offsets may not
    j0 = jb * BLOCK
    if j0 >= n:
        return
    row = tl.load(BLKOFF + b) + jb  # this program's row of the bias-gradient partials
    scratch = SCR + row * (BLOCK * BLOCK)
    pos_row = DPOS + row * pos_width
    inv_n = 1.0 / n.to(tl.float32)
    r = tl.arange(0, BLOCK)
    rd = tl.arange(0, BLOCK_D)
    mask_d = rd < HEAD_DIM
    buckets = tl.arange(0, BUCKETS_POW2)
    time_grad = tl.full([BUCKETS_POW2], 0.0, tl.float32)
    rn = j0 + r
    mask_n = rn < n
    tn = tl.load(QT + start + rn, mask=mask_n, other=0)  # query times of the block as queries (dQ)
    for h in range(0, num_heads):
        col = h * HEAD_DIM + rd
        k = _load_rows(K, start + rn, stride_k, col, mask_n, mask_d)
        v = _load_rows(V, start + rn, stride_v, col, mask_n, mask_d)
        dk = tl.full([BLOCK, BLOCK_D], 0.0, tl.float32)
        dv = tl.full([BLOCK, BLOCK_D], 0.0, tl.float32)
        for i0 in range(j0, n, BLOCK):  # query blocks that see this key block
            rm = i0 + r
            mask_m = rm < n
            q = _load_rows(Q, start + rm, stride_q, col, mask_m, mask_d)
            do = _load_rows(DO, start + rm, stride_do, col, mask_m, mask_d)
            tq = tl.load(QT + start + rm, mask=mask_m, other=0)
            s, bucket = _scores(q, k, rm, rn, tq, TS, start, mask_m, mask_n, PB, TB, EDGES, num_pos,
                                num_buckets, HAS_TIME, SPAN, False, COMPILED, PRECISION)  # fmt: skip
            valid = (rm[:, None] >= rn[None, :]) & mask_m[:, None]
            sig = _sigmoid(s, FAST_SILU)
            p = tl.where(valid, s * sig * inv_n, 0.0)
            dv += _dot(tl.trans(p.to(do.dtype)), do, PRECISION, COMPILED)
            g = _dot(do, tl.trans(v), PRECISION, COMPILED)
            ds = tl.where(valid, g * inv_n * sig * (1.0 + s * (1.0 - sig)), 0.0)
            dk += _dot(tl.trans(ds.to(q.dtype)), q, PRECISION, COMPILED)
            # relative position bias: diagonal sums of ds through the skewed scratch
            tl.store(scratch + r[:, None] * BLOCK + r[None, :], ds)
            tl.debug_barrier()
            clamped = _add_diagonals(scratch, pos_row, r, r, i0 - j0, num_pos, pos_width, BLOCK)
            clamped += _add_diagonals(scratch, pos_row, r, r + BLOCK, i0 - j0, num_pos, pos_width, BLOCK)
            last = pos_row + num_pos - 1
            has_last = num_pos - 1 < pos_width
            tl.store(last, tl.load(last, mask=has_last, other=0.0) + clamped, mask=has_last)
            tl.debug_barrier()
            if HAS_TIME:
                present = tl.where(valid, bucket, num_buckets)
                lo = tl.reduce(tl.reduce(present, 1, tl.standard._elementwise_min), 0, tl.standard._elementwise_min)
                hi = tl.reduce(tl.reduce(tl.where(valid, bucket, -1), 1, tl.standard._elementwise_max), 0,
                               tl.standard._elementwise_max)  # fmt: skip
                for one in range(lo, hi + 1):
                    part = tl.reduce(tl.reduce(tl.where(valid & (bucket == one), ds, 0.0), 1,
                                               tl.standard._sum_combine), 0, tl.standard._sum_combine)  # fmt: skip
                    time_grad += tl.where(buckets == one, part, 0.0)
        out = (start + rn)[:, None]
        out_mask = mask_n[:, None] & mask_d[None, :]
        tl.store(DK + out * stride_dk + col[None, :], dk.to(DK.dtype.element_ty), mask=out_mask)
        tl.store(DV + out * stride_dv + col[None, :], dv.to(DV.dtype.element_ty), mask=out_mask)
        # dQ of the query block with this block's index
        qn = _load_rows(Q, start + rn, stride_q, col, mask_n, mask_d)
        don = _load_rows(DO, start + rn, stride_do, col, mask_n, mask_d)
        dq = tl.full([BLOCK, BLOCK_D], 0.0, tl.float32)
        for c0 in range(0, tl.minimum(j0 + BLOCK, n), BLOCK):
            rc = c0 + r
            mask_c = rc < n
            kc = _load_rows(K, start + rc, stride_k, col, mask_c, mask_d)
            vc = _load_rows(V, start + rc, stride_v, col, mask_c, mask_d)
            s, _ = _scores(qn, kc, rn, rc, tn, TS, start, mask_n, mask_c, PB, TB, EDGES, num_pos, num_buckets,
                           HAS_TIME, SPAN, False, COMPILED, PRECISION)  # fmt: skip
            valid = (rn[:, None] >= rc[None, :]) & mask_n[:, None]
            sig = _sigmoid(s, FAST_SILU)
            g = _dot(don, tl.trans(vc), PRECISION, COMPILED)
            ds = tl.where(valid, g * inv_n * sig * (1.0 + s * (1.0 - sig)), 0.0)
            dq += _dot(ds.to(kc.dtype), kc, PRECISION, COMPILED)
        tl.store(DQ + out * stride_dq + col[None, :], dq.to(DQ.dtype.element_ty), mask=out_mask)
    if HAS_TIME:
        tl.store(DTIME + row * BUCKETS_POW2 + buckets, time_grad)


# --------------------------------------------------------------------------------------------------
# launchers
# --------------------------------------------------------------------------------------------------


def _bind() -> tuple[object, object]:
    """Jit the helpers and kernels for the current interpreter mode; the kernels call the helpers by
    these module-level names, so they are (re)bound before every launch."""
    globals()["_dot"] = jit_lazily(_dot_impl)
    globals()["_time_bucket"] = jit_lazily(_time_bucket_impl)
    globals()["_time_buckets"] = jit_lazily(_time_buckets_impl)
    globals()["_scores"] = jit_lazily(_scores_impl)
    globals()["_sigmoid"] = jit_lazily(_sigmoid_impl)
    globals()["_attend"] = jit_lazily(_attend_impl)
    globals()["_load_rows"] = jit_lazily(_load_rows_impl)
    globals()["_add_diagonals"] = jit_lazily(_add_diagonals_impl)
    return jit_lazily(_hstu_fwd_kernel), jit_lazily(_hstu_bwd_kernel)


def rebased_times(offsets: Tensor, timestamps: Tensor, query_times: Tensor) -> tuple[Tensor, Tensor]:
    """int32 seconds since each sample's first event, of the events and of the times they predict."""
    n = timestamps.numel()
    lengths = offsets[1:] - offsets[:-1]
    first = timestamps[offsets[:-1].clamp(max=max(n - 1, 0))] if n else timestamps[:0]
    base = torch.repeat_interleave(first, lengths, output_size=n)
    return tuple(  # type: ignore[return-value]
        (t - base).clamp(-TIME_CLAMP, TIME_CLAMP).to(torch.int32) for t in (timestamps, query_times)
    )


def _precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: float32 inputs follow ``torch.set_float32_matmul_precision``
    ("highest": IEEE float32 products, as ``torch.matmul``; otherwise TF32 tensor cores); bf16/fp16
    products are exact in the float32 accumulator and ignore it ("tf32" is Triton's default)."""
    if dtype != torch.float32:
        return "tf32"
    return "ieee" if interpreter_enabled() or torch.get_float32_matmul_precision() == "highest" else "tf32"


def _edges(time_bias: Tensor, cfg: AttentionKernelConfig) -> Tensor:
    """The bucket edges the kernels compare gaps against (``time_bucket_edges``), padded for a tile's
    ``time_span - 1`` look-ahead past its first bucket."""
    return bucket_edges(max(time_bias.numel(), 1), cfg.time_span, time_bias.device)


def _fast_silu(cfg: AttentionKernelConfig, dtype: torch.dtype) -> bool:
    return cfg.fast_silu and dtype != torch.float32 and not interpreter_enabled()


def forward(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor, query_times: Tensor,
            pos_bias: Tensor, time_bias: Tensor, num_heads: int, max_len: int,
            config: AttentionKernelConfig | None = None) -> Tensor:  # fmt: skip
    """``[N, H·D]`` attention output (``v``'s dtype); see the module docstring."""
    cfg = config or default_config(q.device)
    n_rows, width = v.shape
    out = torch.zeros(n_rows, width, dtype=v.dtype, device=v.device)
    batch = offsets.numel() - 1
    if n_rows == 0 or batch == 0 or max_len == 0:
        return out
    head_dim = width // num_heads
    fwd, _ = _bind()
    num_blocks = triton.cdiv(max_len, cfg.fwd_block_m)
    has_time = time_bias.numel() > 0
    times, queries = rebased_times(offsets, timestamps, query_times)
    fwd[(num_blocks, batch * num_heads)](
        q, k, v, out, offsets, times, queries, pos_bias, time_bias if has_time else pos_bias,
        _edges(time_bias, cfg),
        q.stride(0), k.stride(0), v.stride(0), out.stride(0),
        num_heads, pos_bias.numel(), max(time_bias.numel(), 1), num_blocks,
        HEAD_DIM=head_dim, BLOCK_D=max(16, next_pow2(head_dim)), BLOCK_M=cfg.fwd_block_m, BLOCK_N=cfg.fwd_block_n,
        HAS_TIME=has_time, SPAN=cfg.time_span, FAST_SILU=_fast_silu(cfg, q.dtype),
        COMPILED=not interpreter_enabled(), PRECISION=_precision(q.dtype),
        num_warps=cfg.fwd_warps, num_stages=cfg.fwd_stages,
    )  # fmt: skip
    return out


def backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, timestamps: Tensor,
             query_times: Tensor, pos_bias: Tensor, time_bias: Tensor, num_heads: int, max_len: int,
             config: AttentionKernelConfig | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of ``forward`` with respect to q, k, v, pos_bias and time_bias."""
    cfg = config or default_config(q.device)
    n_rows, width = v.shape
    dq, dk, dv = (torch.zeros(n_rows, width, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dpos = torch.zeros(pos_bias.shape, dtype=torch.float32, device=pos_bias.device)
    dtime = torch.zeros(time_bias.shape, dtype=torch.float32, device=time_bias.device)
    batch = offsets.numel() - 1
    if n_rows == 0 or batch == 0 or max_len == 0:
        return dq, dk, dv, dpos.to(pos_bias.dtype), dtime.to(time_bias.dtype)
    block = cfg.bwd_block
    head_dim = width // num_heads
    _, bwd = _bind()
    blocks_per_sample = torch.div(offsets[1:] - offsets[:-1] + block - 1, block, rounding_mode="floor")
    first_row = torch.cumsum(blocks_per_sample, 0) - blocks_per_sample
    rows = batch + n_rows // block  # >= Σ ceil(n_b / block), known without reading the device
    pos_width = max(1, min(max_len, pos_bias.numel()))
    has_time = time_bias.numel() > 0
    buckets_pow2 = next_pow2(max(time_bias.numel(), 1))
    scratch = torch.empty(rows, block * block, dtype=torch.float32, device=q.device)
    pos_part = torch.zeros(rows, pos_width, dtype=torch.float32, device=q.device)
    time_part = torch.zeros(rows if has_time else 1, buckets_pow2, dtype=torch.float32, device=q.device)
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    num_blocks = triton.cdiv(max_len, block)
    times, queries = rebased_times(offsets, timestamps, query_times)
    bwd[(num_blocks, batch)](
        q, k, v, grad, dq, dk, dv, offsets, first_row, times, queries, pos_bias,
        time_bias if has_time else pos_bias, _edges(time_bias, cfg), scratch, pos_part, time_part,
        q.stride(0), k.stride(0), v.stride(0), grad.stride(0), dq.stride(0), dk.stride(0), dv.stride(0),
        num_heads, pos_bias.numel(), max(time_bias.numel(), 1), num_blocks, pos_width,
        HEAD_DIM=head_dim, BLOCK_D=max(16, next_pow2(head_dim)), BLOCK=block, BUCKETS_POW2=buckets_pow2,
        HAS_TIME=has_time, SPAN=cfg.time_span, FAST_SILU=_fast_silu(cfg, q.dtype),
        COMPILED=not interpreter_enabled(), PRECISION=_precision(q.dtype),
        num_warps=cfg.bwd_warps, num_stages=cfg.bwd_stages,
    )  # fmt: skip
    dpos[:pos_width] = pos_part.sum(0)
    if has_time:
        dtime = time_part.sum(0)[: time_bias.numel()]
    return dq, dk, dv, dpos.to(pos_bias.dtype), dtime.to(time_bias.dtype)
