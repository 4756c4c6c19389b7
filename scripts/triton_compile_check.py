"""Compile FreeScale's Triton kernels for a GPU target on a host without a GPU.

Why: GPU time is lent by the minute; a kernel that Triton cannot compile for sm_90 (a construct the
CPU interpreter accepts, a Triton version difference) should fail here, not there. A stand-in active
driver reports the target, and ``JITFunction.run`` only warms up (compiles, never launches), so the
launchers run with CPU tensors and produce exactly the specializations (dtypes, ``== 1`` and
divisible-by-16 integers, constexprs) a GPU run would. Outputs are garbage; only compilation matters.

    python scripts/triton_compile_check.py                # the installed Triton, sm_90
    PYTHONPATH=/path/to/triton-3.6/site-packages python scripts/triton_compile_check.py --arch 90

Relies on Triton internals (``triton.runtime.driver.set_active``, ``JITFunction.run``), checked with
Triton 3.6 and 3.8 (a few minutes on a 2-core host for every kernel below, cold cache; the HSTU
attention's backward is the slowest).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction


class _TargetOnlyDriver:
    """Just enough of an active driver for Triton to pick a target and key its caches."""

    def __init__(self, arch: int) -> None:
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def compile_hstu_attention(all_tiles: bool) -> None:
    """Both attention kernels through their launchers: bf16 (the GPU runs), float32 (the fp32 model),
    with and without the time bias, the default tiles (``all_tiles``: and the ones bench_hstu_attention
    sweeps)."""
    from freescale.kernels import hstu_attention_triton as att

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_hstu_attention import backward_sweep, forward_sweep

    lengths = [300, 0, 1, 70]
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    n = int(offsets[-1])
    times = torch.arange(n, dtype=torch.int64)
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.zeros(n, 3 * 256, dtype=dtype)[:, :256]  # a strided view, as the model's split gives
        for buckets in (64, 0):
            bias = (torch.zeros(8192), torch.zeros(buckets))
            args = (q, q, q, offsets, times, times, *bias, 4, max(lengths))
            att.forward(*args)
            att.backward(torch.zeros(n, 256, dtype=dtype), *args)
    args = (q.to(torch.bfloat16), q.to(torch.bfloat16), q.to(torch.bfloat16), offsets, times, times,
            torch.zeros(8192), torch.zeros(64), 4, max(lengths))  # fmt: skip
    if not all_tiles:
        return
    for config in forward_sweep():
        att.forward(*args, config)
    for config in backward_sweep():
        att.backward(torch.zeros(n, 256, dtype=torch.bfloat16), *args, config)


def compile_zch_rounds() -> None:
    """The zero-collision kernel, alone (the rounds) and fused (the whole call), under every policy (lfu with
    and without a halflife) at buckets of 64 probed 16 deep with a tile of 128 ids (8 warps); then the
    trainer's default (the whole bucket of 64 probed), a one-id tile and a small odd bucket (4 warps),
    once each: about a dozen compiles."""
    from freescale.kernels import zch_triton as zrt

    zrt.triton_unavailable_reason = lambda device: None  # CPU tensors stand in for CUDA ones
    policies = (("ttl", 10, 0), ("lru", None, 0), ("lfu", None, 0), ("lfu", None, 3))
    shapes = [(64, 16, 512, policy, fused) for policy in policies for fused in (False, True)]
    shapes += [(64, 64, 512, ("lru", None, 0), fused) for fused in (False, True)]
    shapes += [(64, 16, 1, ("lru", None, 0), True), (5, 3, 512, ("lru", None, 0), True)]
    for bucket_size, max_probe, n, (policy, ttl, halflife), fused in shapes:
        slots = 4 * bucket_size
        table = zrt.BucketState(
            torch.full((slots,), -1, dtype=torch.int64), torch.zeros(slots, dtype=torch.int64),
            torch.zeros(slots, dtype=torch.int64), bucket_size=bucket_size, max_probe=max_probe,
            policy=policy, ttl=ttl, halflife=halflife, fallback_row=slots,
        )  # fmt: skip
        bucket_local, everyone = torch.arange(n) % 4, torch.ones(n, dtype=torch.bool)
        per_position = {"home": torch.zeros(n, dtype=torch.int64), "clock": torch.zeros(n, dtype=torch.int64),
                        "prio": torch.arange(n)}  # fmt: skip
        if fused:
            groups = zrt.group_by_bucket(everyone, bucket_local, table.buckets)
            zrt.look_up_in_kernel(table, groups, int(groups.largest), ids=torch.arange(n),
                                  occurrences=torch.ones(n, dtype=torch.int64), **per_position)  # fmt: skip
        else:
            zrt.place_in_rounds(table, bucket_local=bucket_local, admitted=everyone,
                                claimed=torch.zeros(slots, dtype=torch.int64), **per_position)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="compute capability as an int (90 = H100/H200)")
    p.add_argument("--all-tiles", action="store_true", help="also every attention tile the benchmark sweeps")
    a = p.parse_args(argv)
    driver.set_active(_TargetOnlyDriver(a.arch))
    compiled: dict[str, list[float]] = {}
    run = JITFunction.run

    def warm_only(self: JITFunction, *args: object, grid: object, warmup: bool, **kw: object) -> object:
        t0 = time.perf_counter()
        kernel = run(self, *args, grid=grid, warmup=True, **kw)
        compiled.setdefault(self.fn.__name__, []).append(time.perf_counter() - t0)
        return kernel

    JITFunction.run = warm_only  # type: ignore[method-assign]
    from freescale.kernels import dispatch_triton as tri

    tri._check = lambda *args, **kwargs: None  # CPU tensors stand in for CUDA ones
    tri._launch_device = lambda device: contextlib.nullcontext()
    # the plan at the benchmark's and tests' world sizes, one row to many blocks, int32 and int64 dest
    for world in (1, 8, 64, 512, 3000):
        for n in (1, 256, 100_000):
            dest = torch.randint(0, world, (n,))
            tri.triton_plan(dest, world, torch.ones(n, dtype=torch.int64))
            tri.triton_plan(dest, world)
    tri.triton_plan(torch.randint(0, 64, (4096,), dtype=torch.int32), 64)
    # copies: bf16 d = 256 (64 words), dense 128 bf16, float32 labels, int64 ids, odd byte rows
    for shape, dtype in (((4096, 256), torch.bfloat16), ((256, 128), torch.bfloat16), ((256,), torch.float32),
                         ((4096,), torch.int64), ((100, 1001), torch.uint8), ((5, 3), torch.bfloat16)):  # fmt: skip
        src, index = torch.zeros(shape, dtype=dtype), torch.arange(shape[0])
        offsets = torch.arange(shape[0] + 1)
        tri.triton_gather_rows(src, index)
        tri.triton_jagged_gather(src, offsets, offsets, index)
    compile_hstu_attention(a.all_tiles)
    compile_zch_rounds()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_sm_contention

    words = torch.zeros(1 << 20, dtype=torch.int64)
    bench_sm_contention._copy_kernel[(256,)](words, words.clone(), words.numel(), BLOCK=4096)
    for name, times in compiled.items():
        print(f"{name:<26} {len(times):3} launches compiled or cached, slowest {max(times):.2f} s")
    print(f"triton {triton.__version__}: every kernel compiled for sm_{a.arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
