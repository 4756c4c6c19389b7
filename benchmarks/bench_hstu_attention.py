"""Jagged HSTU attention: the Triton kernel vs the model's padded PyTorch attention, on one GPU.

Workloads (d_model 256, 4 heads, bf16; issue 31):

* ``heavy``: 64 samples, lengths lognormal with median 256 (sigma 1.2), capped at 8,192;
* ``uniform_L`` for L in 512 / 2,048 / 8,192, each 32,768 positions (64, 16 and 4 samples);

event gaps lognormal around five minutes (sigma 2.5), the query time being the next event's.

Arms, timed in the same run on the same inputs (CUDA events, median after warm-up):

* ``triton``: ``freescale.kernels.hstu_attention`` (forward; forward + backward);
* ``torch``: the model's PyTorch attention (``model_extra.attention = "torch"``): samples padded in
  length groups, one batched ``silu(qkᵀ + bias)`` per group, under bf16 autocast; the per-forward
  bias indices (``attention_contexts``, shared by the layers of a forward) are built outside the
  timed region, which favours the baseline;
* ``compiled``: ``torch.compile`` of the same (where ``--compile-on`` names the workload);
* on the uniform 8,192 forward, a sweep of the kernel's tile configurations and a variant without
  the time bias, so a run shows where the forward's time goes.

FLOPs count the causal pairs only (``j <= i``): forward ``4 · d_model · Σ n(n+1)/2`` (two
products), backward 2.5× the forward (five products, the FlashAttention convention). The card's
dense bf16 matmul TFLOP/s is measured in the same run (``measure.matmul_tflops``).

Targets: forward + backward on ``heavy`` >= 4× faster than the padded PyTorch attention; the
forward on ``uniform_8192`` >= 35% of the measured matmul TFLOP/s. JSON (``target_met`` per target)
is written after every point; a failed arm (out of memory, compile error) is recorded and the run
goes on.

    python benchmarks/bench_hstu_attention.py                 # GPU, every workload
    python benchmarks/bench_hstu_attention.py --quick         # GPU, < ~90 s with compilation
    python benchmarks/bench_hstu_attention.py --device cpu --small   # CPU smoke (Triton interpreter)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from hstu_attention_report import check_targets, plot, print_table

RESULTS = Path(__file__).resolve().parent / "results" / "bench_hstu_attention.json"
SLOW_CALL_MS = 1000.0  # an arm whose call takes longer (after its compiling first call) is timed once


@dataclass
class Settings:
    device: str = "cuda"
    d_model: int = 256
    heads: int = 4
    time_buckets: int = 64
    heavy_samples: int = 64
    heavy_median: float = 256.0
    heavy_sigma: float = 1.2
    heavy_cap: int = 8192
    uniform_lengths: list[int] = field(default_factory=lambda: [512, 2048, 8192])
    uniform_tokens: int = 32768
    warmup: int = 3
    iters: int = 10
    compile_on: list[str] = field(default_factory=lambda: ["heavy", "uniform_2048"])
    sweep: bool = True
    matmul_n: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"--d-model {self.d_model} must be divisible by --heads {self.heads}")
        for name in ("heavy_samples", "heavy_cap", "uniform_tokens", "iters", "matmul_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.uniform_lengths or min(self.uniform_lengths) < 1:
            raise ValueError(f"--uniform-lengths must be positive, got {self.uniform_lengths}")


def quick_settings() -> Settings:
    return Settings(warmup=2, iters=5, compile_on=["uniform_2048"], matmul_n=8192)


def small_settings() -> Settings:
    # heavy: 3 samples of lengths 48 (the cap), 8 and 1 — still jagged, capped and with a one-event
    # sample; 6 (adding 24, 3, 2) cost the interpreted smoke run twice as long on its slowest workload
    # (54 s -> 30 s, loaded 2-core host), and the kernels' own tests cover lengths far more widely
    return Settings(device="cpu", d_model=16, heads=2, time_buckets=16, heavy_samples=3, heavy_median=12.0,
                    heavy_cap=48, uniform_lengths=[16, 40], uniform_tokens=80, warmup=1, iters=1,
                    compile_on=["uniform_16"], sweep=True, matmul_n=64)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# workloads and arms
# --------------------------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    lengths: list[int]

    @property
    def causal_pairs(self) -> int:
        return sum(n * (n + 1) // 2 for n in self.lengths)


def workloads(s: Settings) -> list[Workload]:
    gen = torch.Generator().manual_seed(s.seed)
    normal = torch.randn(s.heavy_samples, generator=gen, dtype=torch.float64)
    heavy = torch.exp(math.log(s.heavy_median) + s.heavy_sigma * normal).round().clamp(1, s.heavy_cap)
    out = [Workload("heavy", [int(x) for x in heavy])]
    for length in s.uniform_lengths:
        out.append(Workload(f"uniform_{length}", [length] * max(1, s.uniform_tokens // length)))
    return out


class Inputs:
    """One workload's tensors, an HSTU layer holding the biases, and both attentions' contexts."""

    def __init__(self, s: Settings, work: Workload, dtype: torch.dtype) -> None:
        from freescale.trainer.data.jagged import build_layout
        from freescale.trainer.model.transducer import HSTULayer, JaggedContext, attention_contexts

        dev = torch.device(s.device)
        gen = torch.Generator().manual_seed(s.seed + 1)
        n = sum(work.lengths)
        scale = (s.d_model // s.heads) ** -0.5
        self.q, self.k, self.v = (
            (torch.randn(n, s.d_model, generator=gen) * scale).to(dtype).to(dev).requires_grad_() for _ in range(3)
        )
        self.grad = torch.randn(n, s.d_model, generator=gen).to(dtype).to(dev)
        # gaps between events lognormal around 5 minutes (sigma 2.5: seconds inside a session, days
        # between sessions), as interaction logs are; the query time is the next event's
        gaps = torch.exp(math.log(300.0) + 2.5 * torch.randn(n + len(work.lengths), generator=gen)).long() + 1
        times, queries = [], []
        for sample in gaps.split([m + 1 for m in work.lengths]):
            clock = sample.cumsum(0)
            times.append(clock[:-1])
            queries.append(clock[1:])
        times, queries = torch.cat(times), torch.cat(queries)
        self.layout = build_layout(torch.tensor(work.lengths)).to(dev)
        self.layer = HSTULayer(s.d_model, s.heads, max(work.lengths), s.time_buckets, 0.0).to(dev)
        with torch.no_grad():
            self.layer.pos_bias.normal_(0, 0.1)
            self.layer.time_bias.normal_(0, 0.1)
        self.times, self.queries = times.to(dev), queries.to(dev)
        self.jagged = JaggedContext(self.layout.offsets, self.times, self.queries, max(work.lengths))
        self.groups = attention_contexts(self.layout, self.times, self.queries, max(work.lengths), s.time_buckets)

    def leaves(self) -> list[torch.Tensor]:
        return [self.q, self.k, self.v, self.layer.pos_bias, self.layer.time_bias]


def triton_call(x: Inputs, config=None, time_bias: bool = True, autograd: bool = False,
                pos_bias: bool = True) -> Callable[[], torch.Tensor]:  # fmt: skip
    """The kernel through ``hstu_attention`` (default tiles), or with ``config``'s tiles: forward only,
    or (``autograd``) through an autograd function running both kernels with those tiles. Without
    ``time_bias`` the time bias is empty; without ``pos_bias`` the position bias has one entry (every
    score reads the same one): the floor the biases' per-score work sits on."""
    from freescale.kernels import hstu_attention_triton as tri
    from freescale.kernels.hstu_attention import hstu_attention

    j, layer = x.jagged, x.layer
    bias = layer.time_bias if time_bias else layer.time_bias[:0]
    position = layer.pos_bias if pos_bias else layer.pos_bias[:1]
    args = (x.q, x.k, x.v, j.offsets, j.timestamps, j.query_times, position, bias, layer.num_heads, j.max_len)
    if config is None:
        return lambda: hstu_attention(*args)
    if not autograd:
        return lambda: tri.forward(*args, config)

    class Tiled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, pos_bias, time_bias):  # type: ignore[override]
            ctx.save_for_backward(q, k, v, pos_bias, time_bias)
            return tri.forward(q, k, v, *args[3:6], pos_bias, time_bias, *args[8:], config)

        @staticmethod
        def backward(ctx, grad):  # type: ignore[override]
            q, k, v, pos_bias, time_bias = ctx.saved_tensors
            dq, dk, dv, dpos, dtime = tri.backward(grad, q, k, v, *args[3:6], pos_bias, time_bias, *args[8:], config)
            return dq, dk, dv, dpos, dtime

    return lambda: Tiled.apply(x.q, x.k, x.v, layer.pos_bias, bias)


def torch_call(x: Inputs, s: Settings, compiled: bool = False) -> Callable[[], torch.Tensor]:
    attention = x.layer._attention
    if compiled:  # on CPU (the smoke run) aot_eager: the same tracing, without inductor's C++ build
        attention = torch.compile(attention, dynamic=False, backend="inductor" if s.device == "cuda" else "aot_eager")
    autocast = s.device == "cuda"

    def call() -> torch.Tensor:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
            return attention(x.q, x.k, x.v, x.layout, x.groups)

    return call


def with_backward(x: Inputs, forward: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def call() -> None:
        for t in x.leaves():
            t.grad = None
        forward().backward(x.grad)

    return call


# --------------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------------


def time_ms(fn: Callable[[], object], s: Settings, backward: bool) -> float:
    """Median milliseconds per call: CUDA events on GPU, perf_counter on CPU (forward-only arms run
    without autograd, as inference or a frozen layer would). The first call compiles and is never a
    sample; an arm whose second call takes over ``SLOW_CALL_MS`` is that one sample."""
    with contextlib.nullcontext() if backward else torch.no_grad():
        _timed(fn, s)
        second = _timed(fn, s)
        if second > SLOW_CALL_MS:
            return second
        for _ in range(max(0, s.warmup - 2)):
            fn()
        samples = []
        for _ in range(s.iters):
            if s.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _timed(fn: Callable[[], object], s: Settings) -> float:
    start = time.perf_counter()
    fn()
    if s.device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def tflops(work: Workload, s: Settings, ms: float, backward: bool) -> float:
    flops = 4.0 * s.d_model * work.causal_pairs * (3.5 if backward else 1.0)
    return flops / (ms * 1e-3) / 1e12


def measure_arm(label: str, fn: Callable[[], object], work: Workload, s: Settings, backward: bool) -> dict:
    """One timed arm; a failure is recorded, never raised (the run goes on)."""
    dev = torch.device(s.device)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        ms = time_ms(fn, s, backward)
    except Exception as error:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        print(f"  {label}: FAILED {message}", flush=True)
        return {"arm": label, "status": "failed", "error": message, "traceback": traceback.format_exc()[-2000:]}
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
    row = {"arm": label, "status": "ok", "ms": ms, "tflops": tflops(work, s, ms, backward), "peak_mib": peak}
    print(f"  {label:<28} {ms:9.3f} ms {row['tflops']:8.2f} TFLOP/s", flush=True)
    return row


def max_error(x: Inputs, s: Settings) -> float:
    """Largest |triton - torch| of the forward output, relative to the output's largest magnitude."""
    with torch.no_grad():
        ours = triton_call(x)().float()
        theirs = torch_call(x, s)().float()
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-12))


# --------------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------------


def forward_sweep() -> list:
    """Forward configurations besides the default (GPU_CONFIG), timed on the longest uniform point:
    other tiles, the time-bucket comparison span (1: only tiles of one bucket skip the log), fast SiLU."""
    from freescale.kernels.hstu_attention_triton import GPU_CONFIG, AttentionKernelConfig

    tiles = [AttentionKernelConfig(fwd_block_m=m, fwd_block_n=n, fwd_warps=w, fwd_stages=st)
             for m, n, w, st in ((64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3))]  # fmt: skip
    variants = [replace(GPU_CONFIG, time_span=1), replace(GPU_CONFIG, time_span=8),
                replace(GPU_CONFIG, fast_silu=True)]  # fmt: skip
    return tiles + variants


def sweep_label(cfg) -> str:
    """``triton fwd 128x32 w8 s2`` plus what differs from the default besides tiles."""
    from freescale.kernels.hstu_attention_triton import GPU_CONFIG

    label = f"triton fwd {cfg.fwd_block_m}x{cfg.fwd_block_n} w{cfg.fwd_warps} s{cfg.fwd_stages}"
    if cfg.time_span != GPU_CONFIG.time_span:
        label += f" span{cfg.time_span}"
    if cfg.fast_silu != GPU_CONFIG.fast_silu:
        label += " fast_silu" if cfg.fast_silu else " exact_silu"
    return label


def backward_sweep() -> list:
    """Backward configurations besides the default, timed forward + backward on ``heavy``."""
    from freescale.kernels.hstu_attention_triton import GPU_CONFIG, AttentionKernelConfig

    return [AttentionKernelConfig(bwd_block=32, bwd_warps=8), replace(GPU_CONFIG, fast_silu=True)]


def bench_workload(s: Settings, work: Workload, dtype: torch.dtype) -> dict:
    x = Inputs(s, work, dtype)
    row: dict = {"workload": work.name, "samples": len(work.lengths), "positions": sum(work.lengths),
                 "max_len": max(work.lengths), "causal_pairs": work.causal_pairs, "arms": []}  # fmt: skip
    print(f"{work.name}: {row['samples']} samples, {row['positions']} positions, max {row['max_len']}", flush=True)
    arms = row["arms"]
    arms.append(measure_arm("triton fwd", triton_call(x), work, s, False))
    arms.append(measure_arm("triton fwd+bwd", with_backward(x, triton_call(x)), work, s, True))
    arms.append(measure_arm("torch fwd", torch_call(x, s), work, s, False))
    arms.append(measure_arm("torch fwd+bwd", with_backward(x, torch_call(x, s)), work, s, True))
    if s.sweep and work.name == f"uniform_{max(s.uniform_lengths)}":
        arms.append(measure_arm("triton fwd, no time bias", triton_call(x, time_bias=False), work, s,
                                False))  # fmt: skip
        arms.append(measure_arm("triton fwd, no time bias, one position bias", triton_call(
            x, time_bias=False, pos_bias=False), work, s, False))  # fmt: skip
        for cfg in forward_sweep():
            arms.append(measure_arm(sweep_label(cfg), triton_call(x, cfg), work, s, False))
    if s.sweep and work.name == "heavy":
        for cfg in backward_sweep():
            label = f"triton fwd+bwd, bwd {cfg.bwd_block} w{cfg.bwd_warps}" + (" fast_silu" if cfg.fast_silu else "")
            arms.append(measure_arm(label, with_backward(x, triton_call(x, cfg, autograd=True)), work, s, True))
    try:
        row["triton_vs_torch_max_rel_error"] = max_error(x, s)
    except Exception as error:
        row["triton_vs_torch_max_rel_error"] = f"failed: {type(error).__name__}: {error}"[:300]
    return row


def environment(s: Settings) -> dict:
    from measure import device_environment

    return device_environment(s.device)


def parse(argv: list[str] | None) -> tuple[Settings, Path | None]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="fewer iterations, one compiled point (< ~90 s on a GPU)")
    p.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke run (Triton interpreter)")
    p.add_argument("--iters", type=int)
    p.add_argument("--out", type=Path, help=f"JSON path (default {RESULTS} on GPU; none on CPU)")
    a = p.parse_args(argv)
    s = small_settings() if a.small else quick_settings() if a.quick else Settings()
    s.device = a.device
    if a.iters is not None:
        s.iters = a.iters
    s.__post_init__()
    out = a.out if a.out is not None else (RESULTS if a.device == "cuda" else None)
    return s, out


def main(argv: list[str] | None = None) -> int:
    try:
        s, out = parse(argv)
    except ValueError as error:
        print(f"bench_hstu_attention: {error}", file=sys.stderr)
        return 2
    if s.device == "cuda" and not torch.cuda.is_available():
        print("bench_hstu_attention: --device cuda needs a CUDA device (torch.cuda.is_available() is False); "
              "run `--device cpu --small` for a smoke check", file=sys.stderr)  # fmt: skip
        return 2
    if s.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from measure import matmul_tflops, write_result

    dtype = torch.bfloat16 if s.device == "cuda" else torch.float32
    report: dict = {"benchmark": "bench_hstu_attention", "environment": environment(s), "settings": asdict(s),
                    "results": [], "targets": {}}  # fmt: skip
    try:
        matmul = matmul_tflops(torch.device(s.device), n=s.matmul_n)
    except Exception as error:
        print(f"matmul TFLOP/s: FAILED {error}", file=sys.stderr)
        matmul = None
    report["matmul_tflops"] = matmul
    for work in workloads(s):
        try:
            report["results"].append(bench_workload(s, work, dtype))
        except Exception as error:
            report["results"].append({"workload": work.name, "status": "failed", "error": repr(error)[:300],
                                      "arms": []})  # fmt: skip
        report["targets"] = check_targets(report["results"], matmul, s)
        if out is not None:
            write_result(out, report)
    for row in report["results"]:  # torch.compile last: its compilation is the slowest part of a run
        work = next((w for w in workloads(s) if w.name == row["workload"] and w.name in s.compile_on), None)
        if work is None or not row["arms"]:
            continue
        print(f"{work.name}: torch.compile", flush=True)
        x = Inputs(s, work, dtype)
        row["arms"].append(measure_arm("compiled fwd+bwd", with_backward(x, torch_call(x, s, compiled=True)), work, s,
                                       True))  # fmt: skip
        if out is not None:
            write_result(out, report)
    print_table(report["results"], matmul)
    print({k: v for k, v in report["targets"].items()})
    if out is not None:
        plot(report["results"], out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
