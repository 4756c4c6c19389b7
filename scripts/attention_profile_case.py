"""One jagged HSTU attention forward, launched a few times, for a profiler to catch (``scripts/ncu_attention.sh``).

Why: on the H200 the Triton forward at uniform 8,192 runs at 2.6-3.2% of the card's matmul rate with
the time bias and 13.6% without it (docs/kernels.md), and timing variants has not said which
instructions the time bias costs. Nsight Compute's per-kernel counters (issue slots, stall reasons,
instruction mix, per-line stalls) can; this script gives it the same workload ``bench_hstu_attention``
measures (``Inputs``: d_model 256, 4 heads, bf16, lognormal gaps), one variant per process:
``time`` (the model's attention), ``no_time`` (no time bias), ``no_bias`` (no time bias, one position
bias). ``--launches`` forward calls run (the first ones compile and warm up); the profiler picks one.

    python scripts/attention_profile_case.py --variant time                  # CUDA, uniform 8,192
    TRITON_INTERPRET=1 python scripts/attention_profile_case.py --device cpu --small --variant time
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

VARIANTS = {"time": (True, True), "no_time": (False, True), "no_bias": (False, False)}  # (time bias, positions)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--small", action="store_true", help="bench_hstu_attention's small settings (CPU smoke run)")
    p.add_argument("--workload", default="uniform_8192", help="a bench_hstu_attention workload name")
    p.add_argument("--launches", type=int, default=3, help="forward calls (>= 1)")
    a = p.parse_args(argv)
    if a.launches < 1:
        p.error(f"--launches must be >= 1, got {a.launches}")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("attention_profile_case: no CUDA device (torch.cuda.is_available() is False); "
              "--device cpu with TRITON_INTERPRET=1 for a smoke run", file=sys.stderr)  # fmt: skip
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_hstu_attention as bench

    s = bench.small_settings() if a.small else bench.Settings(device=a.device)
    works = {w.name: w for w in bench.workloads(s)}
    if a.workload not in works:
        p.error(f"--workload {a.workload!r} is not one of {sorted(works)}")
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    inputs = bench.Inputs(s, works[a.workload], dtype)
    time_bias, positions = VARIANTS[a.variant]
    forward = bench.triton_call(inputs, time_bias=time_bias, pos_bias=positions)
    with torch.no_grad():
        for _ in range(a.launches):
            out = forward()
    if a.device == "cuda":
        torch.cuda.synchronize()
    print(f"{a.variant}: {a.launches} forward launches on {a.workload} "
          f"({len(works[a.workload].lengths)} samples), output {tuple(out.shape)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
