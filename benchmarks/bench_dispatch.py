"""Dispatch/combine benchmark: naive per-destination loop vs vectorized PyTorch vs Triton.

Reproduces the paper's Fig. 7 setting (DESIGN.md §4): one rank's batch of samples is dispatched to W
ranks (jagged item embeddings, d = 256, bf16, plus dense features and labels) and combined back.
Sample lengths follow the heavy-tailed lognormal of the design brief (median 300, sigma 1.2, capped
at 21,000). Each implementation is timed in the same run (median over iterations, CUDA events after
warmup); the table shows times and ratios against Triton, and the JSON goes to
``benchmarks/results/bench_dispatch.json``.

Targets at W = 512: Triton >= 20x faster than naive and >= 2x faster than the vectorized reference.

    python benchmarks/bench_dispatch.py                      # GPU, W = 32..512
    python benchmarks/bench_dispatch.py --device cpu --small  # smoke run, no JSON unless --out
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from freescale.kernels import DispatchConfig, JaggedRows, combine_jagged, dispatch_jagged

RESULTS = Path(__file__).resolve().parent / "results" / "bench_dispatch.json"
TARGET_VS_NAIVE, TARGET_VS_PYTORCH, TARGET_WORLD = 20.0, 2.0, 512


@dataclass
class Settings:
    """Benchmark shape; ``--small`` shrinks it for a CPU smoke run."""

    device: str = "cuda"
    world_sizes: list[int] = field(default_factory=lambda: [32, 64, 128, 256, 512])
    batch: int = 128  # samples per rank
    dim: int = 256
    dense_dim: int = 128
    median: float = 300.0
    sigma: float = 1.2
    cap: int = 21_000
    warmup: int = 3
    iters: int = 10
    kernels: list[str] = field(default_factory=lambda: ["naive", "pytorch", "triton"])
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.world_sizes or min(self.world_sizes) < 1:
            raise ValueError(f"--world-sizes must be positive, got {self.world_sizes}")
        for name in ("batch", "dim", "cap", "iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        bad = set(self.kernels) - {"naive", "pytorch", "triton"}
        if bad or not self.kernels:
            raise ValueError(f"--kernels must be a subset of naive,pytorch,triton, got {self.kernels}")


def small_settings(device: str) -> Settings:
    return Settings(device=device, world_sizes=[4, 8, 16], batch=16, dim=16, dense_dim=8, median=30.0,
                    cap=2000, warmup=1, iters=3, kernels=["naive", "pytorch"])  # fmt: skip


def make_batch(s: Settings, world: int, gen: torch.Generator) -> tuple[JaggedRows, torch.Tensor]:
    """One rank's batch: lognormal lengths, bf16 embeddings and dense features, float labels."""
    normal = torch.randn(s.batch, generator=gen, dtype=torch.float64)
    lengths = torch.exp(math.log(s.median) + s.sigma * normal).round().clamp(1, s.cap).long()
    dev = torch.device(s.device)
    values = torch.randn(int(lengths.sum()), s.dim, generator=gen).to(torch.bfloat16)
    dense = torch.randn(s.batch, s.dense_dim, generator=gen).to(torch.bfloat16)
    labels = torch.rand(s.batch, generator=gen)
    dest = torch.randint(0, world, (s.batch,), generator=gen)
    batch = JaggedRows(values.to(dev), lengths.to(dev), dense.to(dev), labels.to(dev))
    return batch, dest.to(dev)


def time_ms(fn: Callable[[], object], s: Settings) -> float:
    """Median milliseconds per call: CUDA events on GPU (includes launch gaps), perf_counter on CPU."""
    for _ in range(s.warmup):
        fn()
    samples = []
    if s.device == "cuda":
        torch.cuda.synchronize()
        for _ in range(s.iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(s.iters):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _same(a: JaggedRows, b: JaggedRows) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("values", "lengths", "dense", "labels"))


def bench_world(s: Settings, world: int) -> dict[str, object]:
    """Check the implementations agree on this payload, then time dispatch and combine of each."""
    gen = torch.Generator().manual_seed(s.seed + world)
    batch, dest = make_batch(s, world, gen)
    cfg = DispatchConfig(validate=False)  # the baseline validates nothing either
    ref = dispatch_jagged(batch, dest, world, kernel=s.kernels[0], config=cfg)
    row: dict[str, object] = {
        "world_size": world, "samples": s.batch, "values": int(batch.values.shape[0]),
        "payload_bytes": _bytes(batch), "dispatch_ms": {}, "combine_ms": {},
    }  # fmt: skip
    for k in s.kernels:
        out = dispatch_jagged(batch, dest, world, kernel=k, config=cfg)
        back = combine_jagged(out.buffer, out.plan, kernel=k)
        if not _same(out.buffer, ref.buffer) or not _same(back, batch):
            raise AssertionError(f"kernel {k} disagrees with {s.kernels[0]} at W={world}")
        row["dispatch_ms"][k] = time_ms(lambda k=k: dispatch_jagged(batch, dest, world, kernel=k, config=cfg), s)
        row["combine_ms"][k] = time_ms(lambda k=k, o=out: combine_jagged(o.buffer, o.plan, kernel=k), s)
    row["speedup"] = _speedups(row)
    return row


def _bytes(b: JaggedRows) -> int:
    return sum(t.numel() * t.element_size() for t in (b.values, b.lengths, b.dense, b.labels))


def _speedups(row: dict[str, object]) -> dict[str, dict[str, float]]:
    """Time of each implementation divided by Triton's (or the fastest present) per operation."""
    out: dict[str, dict[str, float]] = {}
    for op in ("dispatch_ms", "combine_ms"):
        times: dict[str, float] = row[op]  # type: ignore[assignment]
        base = "triton" if "triton" in times else min(times, key=times.get)
        out[op.removesuffix("_ms")] = {f"{k}_over_{base}": times[k] / max(times[base], 1e-9) for k in times}
    return out


def print_table(rows: list[dict[str, object]], kernels: list[str]) -> None:
    """Median ms per implementation, then each baseline's time over Triton's (dispatch / combine)."""
    others = [k for k in kernels if k != "triton"] if "triton" in kernels else []
    head = f"{'W':>5} {'values':>9} | dispatch ms {' '.join(f'{k:>8}' for k in kernels)} | combine ms "
    head += " ".join(f"{k:>8}" for k in kernels)
    head += "".join(f" | {k}/triton (disp, comb)" for k in others)
    print(head)
    print("-" * len(head))
    for r in rows:
        d, c = r["dispatch_ms"], r["combine_ms"]  # type: ignore[index]
        line = f"{r['world_size']:>5} {r['values']:>9} | {'':11} {' '.join(f'{d[k]:8.3f}' for k in kernels)}"
        line += f" | {'':10} {' '.join(f'{c[k]:8.3f}' for k in kernels)}"
        for k in others:
            line += f" | {d[k] / d['triton']:8.1f}x {c[k] / c['triton']:8.1f}x{'':5}"
        print(line)


def check_targets(rows: list[dict[str, object]], kernels: list[str]) -> dict[str, object]:
    """Pass/fail of the issue's targets at W = 512 (dispatch and combine each)."""
    row = next((r for r in rows if r["world_size"] == TARGET_WORLD), None)
    if row is None or "triton" not in kernels:
        return {"evaluated": False, "reason": f"needs W={TARGET_WORLD} and the triton kernel"}
    res: dict[str, object] = {"evaluated": True}
    for op in ("dispatch_ms", "combine_ms"):
        t = row[op]  # type: ignore[index]
        for base, target in (("naive", TARGET_VS_NAIVE), ("pytorch", TARGET_VS_PYTORCH)):
            if base in t:
                ratio = t[base] / t["triton"]
                res[f"{op[:-3]}_vs_{base}"] = {"ratio": ratio, "target": target, "pass": ratio >= target}
    return res


def environment(s: Settings) -> dict[str, object]:
    env: dict[str, object] = {"torch": torch.__version__, "python": platform.python_version(), "device": s.device}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if s.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    return env


def parse(argv: list[str] | None) -> tuple[Settings, Path | None]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke run")
    p.add_argument("--world-sizes", type=lambda v: [int(x) for x in v.split(",")])
    p.add_argument("--batch", type=int, help="samples per rank")
    p.add_argument("--iters", type=int)
    p.add_argument("--kernels", type=lambda v: v.split(","), help="comma list of naive,pytorch,triton")
    p.add_argument("--out", type=Path, help=f"JSON path (default {RESULTS} on GPU; none on CPU)")
    a = p.parse_args(argv)
    s = small_settings(a.device) if a.small else Settings(device=a.device)
    for name in ("world_sizes", "batch", "iters", "kernels"):
        if getattr(a, name) is not None:
            setattr(s, name, getattr(a, name))
    s.__post_init__()
    out = a.out if a.out is not None else (RESULTS if a.device == "cuda" else None)
    return s, out


def main(argv: list[str] | None = None) -> int:
    try:
        s, out = parse(argv)
    except ValueError as e:
        print(f"bench_dispatch: {e}", file=sys.stderr)
        return 2
    if s.device == "cuda" and not torch.cuda.is_available():
        print("bench_dispatch: --device cuda requested but no CUDA device is available "
              "(torch.cuda.is_available() is False); run `--device cpu --small` for a smoke check",
              file=sys.stderr)  # fmt: skip
        return 2
    rows = [bench_world(s, w) for w in s.world_sizes]
    print_table(rows, s.kernels)
    report = {"benchmark": "bench_dispatch", "environment": environment(s), "settings": asdict(s),
              "results": rows, "targets": check_targets(rows, s.kernels)}  # fmt: skip
    print(json.dumps(report["targets"], indent=1))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
