"""SM contention benchmark: how much do overlapped copies slow compute, by copy mechanism?

DESIGN.md §6: NCCL-style copies run as kernels on SMs and slow the compute they overlap; copy-engine
(DMA) copies should not. One GPU, one process, two streams (two processes on one GPU would
time-slice without MPS, hiding the effect). For each compute workload (a bf16 GEMM, a causal
attention with HSTU's FLOP shape as a fused kernel, and HSTU's unfused SiLU attention, which is
memory-bound) we time the compute alone, then overlapped with the same bytes moved by:

* ``sm_triton``  - a Triton copy kernel (SM-based);
* ``sm_torch``   - a PyTorch elementwise kernel (``torch.mul(src, 1, out=dst)``, SM-based);
* ``nccl``       - a single-rank NCCL ``all_to_all_single`` (what NCCL launches for a local exchange);
* ``ce_d2h`` / ``ce_h2d`` - pinned-host copies with ``non_blocking=True`` (copy engines over PCIe);
* ``ce_d2d``     - a contiguous device-to-device ``copy_`` (``cudaMemcpyAsync``).

Whether a mechanism launched a kernel is *measured* with the profiler (``kernels_launched``), not
assumed: in particular same-device D2D memcpy may be executed by an SM kernel. Reported per pair:
compute slowdown % and the copy bandwidth while overlapped; JSON to
``benchmarks/results/bench_sm_contention.json``. Targets: copy-engine overlap slows compute <= 3%,
SM copies slow it >= 10%.

    python benchmarks/bench_sm_contention.py [--copy-mib 256] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).resolve().parent / "results" / "bench_sm_contention.json"
CE_MAX_SLOWDOWN, SM_MIN_SLOWDOWN = 3.0, 10.0

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)

except ImportError:  # pragma: no cover - triton is in the pinned stack
    triton = None  # type: ignore[assignment]


@dataclass
class Settings:
    copy_mib: int = 256  # bytes per copy operation
    gemm_n: int = 8192
    attn_batch: int = 8
    attn_heads: int = 4
    attn_len: int = 2048
    attn_dim: int = 128
    window_ms: float = 60.0  # how long each overlapped compute run lasts
    reps: int = 5
    out: str | None = None

    def __post_init__(self) -> None:
        for name in ("copy_mib", "gemm_n", "attn_len", "reps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


# --------------------------------------------------------------------------------------------------
# compute workloads
# --------------------------------------------------------------------------------------------------


def make_compute(s: Settings) -> dict[str, Callable[[], object]]:
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    a = torch.randn(s.gemm_n, s.gemm_n, device=dev, dtype=bf16)
    b = torch.randn(s.gemm_n, s.gemm_n, device=dev, dtype=bf16)
    shape = (s.attn_batch, s.attn_heads, s.attn_len, s.attn_dim)
    q, k, v = (torch.randn(shape, device=dev, dtype=bf16) for _ in range(3))
    mask = torch.ones(s.attn_len, s.attn_len, device=dev, dtype=bf16).tril()

    def hstu_unfused() -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2))
        return torch.matmul(F.silu(scores) * mask / s.attn_len, v)

    return {
        "gemm_bf16": lambda: torch.matmul(a, b),
        "attention_fused": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "hstu_unfused": hstu_unfused,
    }


# --------------------------------------------------------------------------------------------------
# copy mechanisms
# --------------------------------------------------------------------------------------------------


def _nccl_group() -> object | None:
    import torch.distributed as dist

    if not dist.is_nccl_available():
        return None
    if not dist.is_initialized():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", torch.cuda.current_device()))  # fmt: skip
    return dist.group.WORLD


def make_copies(s: Settings) -> dict[str, Callable[[], object] | str]:
    """Each entry moves ``copy_mib`` MiB once, or is a string saying why it is unavailable."""
    n = s.copy_mib << 20
    dev = torch.device("cuda")
    src, dst = torch.empty(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    src_h = src.view(torch.bfloat16)
    dst_h = dst.view(torch.bfloat16)
    copies: dict[str, Callable[[], object] | str] = {
        "sm_torch": lambda: torch.mul(src_h, 1, out=dst_h),
        "ce_d2h": lambda: host.copy_(src, non_blocking=True),
        "ce_h2d": lambda: dst.copy_(host, non_blocking=True),
        "ce_d2d": lambda: dst.copy_(src),
    }
    if triton is not None:
        src64, dst64 = src.view(torch.int64), dst.view(torch.int64)
        words = src64.numel()
        grid = (triton.cdiv(words, 4096),)
        copies["sm_triton"] = lambda: _copy_kernel[grid](src64, dst64, words, BLOCK=4096)
    else:
        copies["sm_triton"] = "triton is not installed"
    group = _nccl_group()
    if group is None:
        copies["nccl"] = "torch.distributed has no NCCL backend"
    else:
        import torch.distributed as dist

        copies["nccl"] = lambda: dist.all_to_all_single(dst, src, group=group)
    return copies


def kernels_launched(fn: Callable[[], object], stream: torch.cuda.Stream) -> list[str]:
    """Names of GPU kernels (not memcpy/memset) the profiler saw while ``fn`` ran on ``stream``."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
    names = set()
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            name = evt.name
            if not (name.startswith("Memcpy") or name.startswith("Memset") or "memcpy" in name.lower()):
                names.add(name)
    return sorted(names)


# --------------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------------


def _events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _one_ms(fn: Callable[[], object], stream: torch.cuda.Stream, reps: int = 5) -> float:
    with torch.cuda.stream(stream):
        fn()
        times = []
        for _ in range(reps):
            start, end = _events()
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


Streams = tuple[torch.cuda.Stream, torch.cuda.Stream]


def _run(compute: Callable[[], object] | None, n_compute: int, copy: Callable[[], object] | None,
         n_copy: int, streams: Streams) -> tuple[float, float]:  # fmt: skip
    """Start both streams together (after a device sleep covering the host's enqueueing)."""
    cs, ks = streams
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # ~tens of ms: both queues are full before either starts
    go = torch.cuda.Event()
    go.record()
    (c0, c1), (k0, k1) = _events(), _events()
    for stream, fn, n, (e0, e1) in ((ks, copy, n_copy, (k0, k1)), (cs, compute, n_compute, (c0, c1))):
        stream.wait_event(go)
        with torch.cuda.stream(stream):
            e0.record(stream)
            for _ in range(n if fn is not None else 0):
                fn()
            e1.record(stream)
    torch.cuda.synchronize()
    return c0.elapsed_time(c1), k0.elapsed_time(k1)


def measure_pair(compute: Callable[[], object], copy: Callable[[], object], s: Settings,
                 streams: Streams) -> dict[str, float]:  # fmt: skip
    """Compute alone vs overlapped with back-to-back copies that outlast it; medians over reps."""
    n_compute = max(1, math.ceil(s.window_ms / _one_ms(compute, streams[0])))
    n_copy = max(1, math.ceil(1.5 * s.window_ms / _one_ms(copy, streams[1])))
    alone, together, copy_ms = [], [], []
    for _ in range(s.reps):
        alone.append(_run(compute, n_compute, None, 0, streams)[0])
        c, k = _run(compute, n_compute, copy, n_copy, streams)
        together.append(c)
        copy_ms.append(k)
    base, over = statistics.median(alone), statistics.median(together)
    copy_alone = _run(None, 0, copy, n_copy, streams)[1]
    gbps = lambda ms: n_copy * (s.copy_mib << 20) / (ms * 1e-3) / 1e9  # noqa: E731
    return {"compute_alone_ms": base, "compute_overlapped_ms": over, "slowdown_pct": 100 * (over / base - 1),
            "copy_gbps_alone": gbps(copy_alone), "copy_gbps_overlapped": gbps(statistics.median(copy_ms)),
            "compute_iters": n_compute, "copy_ops": n_copy}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------


def evaluate(results: dict[str, dict[str, dict[str, object]]], sm_free: dict[str, bool]) -> dict[str, object]:
    """Targets: every SM-free mechanism <= 3% slowdown, every SM-based one >= 10%, per workload."""
    out: dict[str, object] = {}
    for work, rows in results.items():
        for mech, r in rows.items():
            if "slowdown_pct" not in r:
                continue
            slow = float(r["slowdown_pct"])  # type: ignore[arg-type]
            ok = slow <= CE_MAX_SLOWDOWN if sm_free[mech] else slow >= SM_MIN_SLOWDOWN
            kind = "sm_free" if sm_free[mech] else "sm_based"
            out[f"{work}/{mech}"] = {"kind": kind, "slowdown_pct": slow, "pass": ok}
    return out


def print_table(results: dict[str, dict[str, dict[str, object]]], launched: dict[str, list[str]]) -> None:
    print(f"{'workload':<16} {'copy':<10} {'kernels?':<9} {'alone ms':>9} {'overlap ms':>10} {'slowdown':>9} "
          f"{'GB/s alone':>10} {'GB/s ovl':>9}")  # fmt: skip
    for work, rows in results.items():
        for mech, r in rows.items():
            if "slowdown_pct" not in r:
                print(f"{work:<16} {mech:<10} skipped: {r.get('skipped')}")
                continue
            kern = "yes" if launched[mech] else "no"
            print(
                f"{work:<16} {mech:<10} {kern:<9} {r['compute_alone_ms']:9.2f} "
                f"{r['compute_overlapped_ms']:10.2f} {r['slowdown_pct']:8.1f}% "
                f"{r['copy_gbps_alone']:10.1f} {r['copy_gbps_overlapped']:9.1f}"
            )


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def parse(argv: list[str] | None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copy-mib", type=int, default=Settings.copy_mib)
    p.add_argument("--gemm-n", type=int, default=Settings.gemm_n)
    p.add_argument("--attn-len", type=int, default=Settings.attn_len)
    p.add_argument("--window-ms", type=float, default=Settings.window_ms)
    p.add_argument("--reps", type=int, default=Settings.reps)
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args(argv)
    return Settings(copy_mib=a.copy_mib, gemm_n=a.gemm_n, attn_len=a.attn_len, window_ms=a.window_ms,
                    reps=a.reps, out=a.out)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    try:
        s = parse(argv)
    except ValueError as e:
        print(f"bench_sm_contention: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_sm_contention: needs a CUDA GPU (torch.cuda.is_available() is False); "
              "SM contention cannot be measured on CPU", file=sys.stderr)  # fmt: skip
        return 2
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    computes, copies = make_compute(s), make_copies(s)
    launched = {m: (kernels_launched(c, streams[1]) if callable(c) else []) for m, c in copies.items()}
    sm_free = {m: callable(c) and not launched[m] for m, c in copies.items()}
    results: dict[str, dict[str, dict[str, object]]] = {}
    for work, compute in computes.items():
        results[work] = {}
        for mech, copy in copies.items():
            results[work][mech] = (measure_pair(compute, copy, s, streams) if callable(copy)
                                   else {"skipped": copy})  # fmt: skip
    print_table(results, launched)
    report = {"benchmark": "bench_sm_contention", "settings": asdict(s),
              "environment": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                              "cuda": torch.version.cuda, "python": platform.python_version(),
                              "nccl": _nccl_version()},
              "kernels_launched": launched, "sm_free": sm_free, "results": results,
              "targets": evaluate(results, sm_free)}  # fmt: skip
    print(json.dumps(report["targets"], indent=1))
    out = Path(s.out) if s.out else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
