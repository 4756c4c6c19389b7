"""Dispatch/combine benchmark: Triton vs the naive per-destination loop and the vectorized PyTorch reference.

Reproduces the paper's Fig. 7 setting (docs/design.md#online-balancer): one rank's batch of samples is dispatched to W
ranks (jagged item embeddings, d = 256, bf16, plus dense features and labels) and combined back.
Sample lengths follow the heavy-tailed lognormal of the design brief (median 300, sigma 1.2, capped
at 21,000). Every implementation runs on the same batch in the same run: its output is first checked
byte for byte against the vectorized reference (a wrong kernel is not timed), then timed (median
milliseconds per call over ``iters`` calls after warm-up; on CUDA each call between two events, then a
synchronize, so the host's launch time counts as the trainer would see it). The table shows times
and each baseline's time over Triton's.

Targets at W = 512 (issue 31; the paper reports 24x and 590x): Triton >= 20x faster than the naive
loop for dispatch and >= 100x for combine. Beside them, not counted in ``target_met``: Triton at
least as fast as the vectorized reference (``extra_targets_met``), because Triton is the CUDA default
(``default_kernel``): were the reference faster, the default should change.

A point (one W) that fails (an exception, a CUDA out-of-memory) is recorded in its row and the run
goes on; the JSON is rewritten after every point, and a watchdog (``--timeout-s``) saves it and ends
the process if a kernel hangs.

    python benchmarks/bench_dispatch.py                       # GPU, W = 8..512, ~1 min
    python benchmarks/bench_dispatch.py --quick               # GPU, W = 8, 64, 512, few iterations
    TRITON_INTERPRET=1 python benchmarks/bench_dispatch.py --device cpu --small --quick --out x.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from measure import Watchdog, device_environment, write_result

from freescale.kernels import DispatchConfig, JaggedRows, combine_jagged, dispatch_jagged
from freescale.kernels.triton_support import interpreter_enabled

RESULTS = Path(__file__).resolve().parent / "results" / "bench_dispatch.json"
TARGET_WORLD = 512
QUICK_WORLDS = [8, 64, 512]
ISSUE = "issue 31"
# name: (operation, baseline, minimum baseline_ms / triton_ms at W = TARGET_WORLD, source)
TARGETS: dict[str, tuple[str, str, float, str]] = {
    "dispatch_vs_naive": ("dispatch", "naive", 20.0, f"{ISSUE} (paper: 24x)"),
    "combine_vs_naive": ("combine", "naive", 100.0, f"{ISSUE} (paper: 590x)"),
    "dispatch_vs_pytorch": ("dispatch", "pytorch", 1.0, "ours: Triton is the CUDA default kernel"),
    "combine_vs_pytorch": ("combine", "pytorch", 1.0, "ours: Triton is the CUDA default kernel"),
}
KERNEL_NAMES = ("naive", "pytorch", "triton")


@dataclass
class Settings:
    """Benchmark shape; ``--small`` shrinks it for a CPU smoke run, ``--quick`` cuts points and iterations."""

    device: str = "cuda"
    world_sizes: list[int] = field(default_factory=lambda: [8, 16, 32, 64, 128, 256, 512])
    batch: int = 128  # samples per rank
    dim: int = 256
    dense_dim: int = 128
    median: float = 300.0
    sigma: float = 1.2
    cap: int = 21_000
    warmup: int = 3
    iters: int = 20
    kernels: list[str] = field(default_factory=lambda: list(KERNEL_NAMES))
    seed: int = 0
    quick: bool = False
    small: bool = False
    timeout_s: float = 900.0  # watchdog: the whole run

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"--device must be cuda or cpu, got {self.device!r}")
        if not self.world_sizes or min(self.world_sizes) < 1:
            raise ValueError(f"--world-sizes must be positive, got {self.world_sizes}")
        for name in ("batch", "dim", "dense_dim", "cap", "iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.median <= 0 or self.sigma < 0:
            raise ValueError(f"lengths need median > 0 and sigma >= 0, got {self.median}, {self.sigma}")
        bad = set(self.kernels) - set(KERNEL_NAMES)
        if bad or not self.kernels:
            raise ValueError(f"--kernels must be a subset of naive,pytorch,triton, got {self.kernels}")
        if self.device == "cpu" and "triton" in self.kernels and not interpreter_enabled():
            raise ValueError("--kernels triton on --device cpu needs TRITON_INTERPRET=1 (Triton's interpreter)")


def make_settings(device: str, small: bool, quick: bool) -> Settings:
    """Defaults for the mode: ``small`` = tiny shapes (CPU smoke), ``quick`` = W in {8, 64, 512}, few
    iterations (the GPU check's mode: about a minute on an H100 with Triton compiling)."""
    # Triton runs on CPU only through its interpreter: without it a CPU run compares the other two
    kernels = list(KERNEL_NAMES) if device == "cuda" or interpreter_enabled() else ["naive", "pytorch"]
    s = Settings(device=device, quick=quick, small=small, kernels=kernels)
    if small:
        s.world_sizes, s.batch, s.dim, s.dense_dim, s.median, s.cap = [4, 8, 16], 16, 16, 8, 30.0, 2000
        s.warmup, s.iters = 1, 3
    if quick:
        s.world_sizes, s.warmup, s.iters = list(QUICK_WORLDS), 1, min(s.iters, 5)
        s.timeout_s = 300.0
    return s


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


def _bytes_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bitwise equality (a permutation moves bytes; ``torch.equal`` would call NaN != NaN)."""
    if a is None or b is None:
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _same(a: JaggedRows, b: JaggedRows) -> bool:
    return all(_bytes_equal(getattr(a, f), getattr(b, f)) for f in ("values", "lengths", "dense", "labels"))


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= 600 else text[:600] + " ..."


def _recover(s: Settings) -> None:
    """After a failed kernel: give back what an out-of-memory left cached (a sticky CUDA error, e.g. an
    illegal address, makes every later CUDA call fail; those points are recorded as failed too)."""
    if s.device == "cuda":
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


def bench_world(s: Settings, world: int) -> dict[str, Any]:
    """Check each implementation against the reference on this payload, then time its dispatch and
    combine. A kernel that raises or disagrees is recorded under ``errors`` and not timed."""
    gen = torch.Generator().manual_seed(s.seed + world)
    batch, dest = make_batch(s, world, gen)
    cfg = DispatchConfig(validate=False)  # the baseline validates nothing either
    row: dict[str, Any] = {
        "world_size": world, "samples": s.batch, "values": int(batch.values.shape[0]),
        "payload_bytes": _bytes(batch), "dispatch_ms": {}, "combine_ms": {}, "errors": {},
    }  # fmt: skip
    order = sorted(s.kernels, key=lambda k: k != "pytorch")  # the reference first: the others match it
    ref = None
    for k in order:
        try:
            out = dispatch_jagged(batch, dest, world, kernel=k, config=cfg)
            back = combine_jagged(out.buffer, out.plan, kernel=k)
            if ref is None:
                ref = (k, out.buffer)
            elif not _same(out.buffer, ref[1]):
                raise AssertionError(f"dispatch output differs from {ref[0]}'s")
            if not _same(back, batch):
                raise AssertionError("combine(dispatch(x)) != x")
            row["dispatch_ms"][k] = time_ms(lambda k=k: dispatch_jagged(batch, dest, world, kernel=k, config=cfg), s)
            row["combine_ms"][k] = time_ms(lambda k=k, o=out: combine_jagged(o.buffer, o.plan, kernel=k), s)
        except Exception as e:
            row["errors"][k] = _short(e)  # a dispatch time taken before a failed combine stays
            print(f"bench_dispatch: W={world} kernel={k} failed: {_short(e)}", file=sys.stderr)
            traceback.print_exc(limit=3, file=sys.stderr)
            _recover(s)
    row["speedup"] = speedups(row)
    return row


def _bytes(b: JaggedRows) -> int:
    return sum(t.numel() * t.element_size() for t in (b.values, b.lengths, b.dense, b.labels))


def speedups(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each baseline's time over Triton's, per operation (empty when Triton was not timed)."""
    out: dict[str, dict[str, float]] = {}
    for op in ("dispatch", "combine"):
        times: dict[str, float] = row[f"{op}_ms"]
        if "triton" in times:
            out[op] = {f"{k}_over_triton": times[k] / max(times["triton"], 1e-9) for k in times if k != "triton"}
    return out


def print_table(rows: list[dict[str, Any]], kernels: list[str]) -> None:
    """Median ms per implementation, then each baseline's time over Triton's (dispatch / combine)."""
    others = [k for k in kernels if k != "triton"] if "triton" in kernels else []
    cell = lambda v: f"{v:9.3f}" if v is not None else f"{'-':>9}"  # noqa: E731
    ratio = lambda a, b: f"{a / b:8.{1 if a >= 10 * b else 2}f}x" if a is not None and b else f"{'-':>9}"  # noqa: E731
    head = f"{'W':>5} {'values':>9} | dispatch ms{''.join(f' {k:>9}' for k in kernels)} | combine ms"
    head += "".join(f" {k:>9}" for k in kernels)
    head += "".join(f" | {k}/triton (disp, comb)" for k in others)
    print(head)
    print("-" * len(head))
    for r in rows:
        if "values" not in r:
            print(f"{r['world_size']:>5} point failed: {r.get('error')}")
            continue
        d, c = r["dispatch_ms"], r["combine_ms"]
        line = f"{r['world_size']:>5} {r['values']:>9} | {'':11}{''.join(' ' + cell(d.get(k)) for k in kernels)}"
        line += f" | {'':10}{''.join(' ' + cell(c.get(k)) for k in kernels)}"
        for k in others:
            line += f" | {ratio(d.get(k), d.get('triton'))} {ratio(c.get(k), c.get('triton'))}{'':5}"
        print(line)
        for k, err in r.get("errors", {}).items():
            print(f"{'':7}{k} failed: {err}")


def check_targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One entry per target at W = 512 with ``target_met``; ``target_met`` overall = issue 31's targets.
    A target whose times are missing (W = 512 not run, a kernel failed) is not met, with the reason."""
    row = next((r for r in rows if r.get("world_size") == TARGET_WORLD), None)
    targets: dict[str, Any] = {}
    for name, (op, base, minimum, source) in TARGETS.items():
        entry: dict[str, Any] = {"target": f"{op}: {base} time / triton time >= {minimum:g}x at W={TARGET_WORLD}",
                                 "source": source, "minimum": minimum, "ratio": None}  # fmt: skip
        times = (row or {}).get(f"{op}_ms", {})
        if row is None:
            entry["reason"] = f"W={TARGET_WORLD} was not run"
        elif "triton" not in times or base not in times:
            missing = [k for k in ("triton", base) if k not in times]
            entry["reason"] = f"no time for {', '.join(missing)} at W={TARGET_WORLD}"
        else:
            entry["ratio"] = times[base] / max(times["triton"], 1e-9)
        entry["target_met"] = entry["ratio"] is not None and entry["ratio"] >= minimum
        targets[name] = entry
    issue = [t for t in targets.values() if t["source"].startswith(ISSUE)]
    extra = [t for t in targets.values() if not t["source"].startswith(ISSUE)]
    return {"targets": targets, "target_met": all(t["target_met"] for t in issue),
            "extra_targets_met": all(t["target_met"] for t in extra)}  # fmt: skip


def environment(s: Settings) -> dict[str, Any]:
    return device_environment(s.device)


def parse(argv: list[str] | None) -> tuple[Settings, Path | None]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke run")
    p.add_argument("--quick", action="store_true", help=f"W in {QUICK_WORLDS}, 1 warm-up and 5 timed calls")
    p.add_argument("--world-sizes", type=lambda v: [int(x) for x in v.split(",")])
    p.add_argument("--batch", type=int, help="samples per rank")
    p.add_argument("--iters", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--kernels", type=lambda v: v.split(","), help="comma list of naive,pytorch,triton")
    p.add_argument("--timeout-s", type=float, help="watchdog: save the JSON and exit 3 after this long")
    p.add_argument("--out", type=Path, help=f"JSON path (default {RESULTS} on GPU; none on CPU)")
    a = p.parse_args(argv)
    s = make_settings(a.device, a.small, a.quick)
    for name in ("world_sizes", "batch", "iters", "warmup", "kernels", "timeout_s"):
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
    rows: list[dict[str, Any]] = []
    report: dict[str, Any] = {"benchmark": "bench_dispatch", "environment": environment(s), "settings": asdict(s),
                              "results": rows, **check_targets(rows)}  # fmt: skip

    def save(note: str | None = None) -> None:
        report.update(check_targets(rows))
        if note:
            report["aborted"] = note
        if out is not None:
            write_result(out, report)

    started = time.perf_counter()
    current: dict[str, Any] = {}

    def on_hang() -> None:
        rows.append({"world_size": current.get("world_size"), "error": f"watchdog: no result after {s.timeout_s} s"})
        save(f"watchdog fired after {s.timeout_s} s at W={current.get('world_size')}")

    with Watchdog(s.timeout_s, on_hang):
        for w in s.world_sizes:
            current["world_size"] = w
            try:
                rows.append(bench_world(s, w))
            except Exception as e:  # the batch itself failed (e.g. out of memory): record, go on
                rows.append({"world_size": w, "error": _short(e)})
                print(f"bench_dispatch: W={w} failed: {_short(e)}", file=sys.stderr)
                _recover(s)
            save()
    report["wall_s"] = time.perf_counter() - started
    save()
    print_table(rows, s.kernels)
    print(json.dumps({k: report[k] for k in ("targets", "target_met", "extra_targets_met")}, indent=1))
    if out is not None:
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
