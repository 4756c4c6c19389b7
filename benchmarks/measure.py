"""Shared helpers of the benchmark scripts: run a command and measure it as a user would see it."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

FREESCALE = [str(Path(sys.executable).parent / "freescale")]


def process_role(process: psutil.Process, root: int) -> str:
    """What a process of a measured tree is: the command itself, a Ray system process, a Ray worker,
    or another child (the local engine's pool and writer processes)."""
    if process.pid == root:
        return "driver"
    name = process.name()
    command = " ".join(process.cmdline())
    # Ray's agents rename themselves ray::DashboardAgent, ray::RuntimeEnvAgent: system, not workers
    if "default_worker.py" in command or (name.startswith("ray::") and not name.endswith("Agent")):
        return "ray worker"
    # a path inside the ray package, not any "ray" in the command: this repository's worktree may be
    # named so (wt-rayspeed), which once booked the local engine's pool and writer as Ray processes
    if name in ("gcs_server", "raylet") or name.startswith("ray::") or "/ray/" in " ".join(process.cmdline()[:3]):
        return "ray system"
    return "child"


def run_measured(cmd: list[str], label: str, env: dict[str, str] | None = None, also: tuple[int, ...] = ()) -> dict:
    """Run ``cmd``; return wall seconds, the peak summed RSS of its whole process tree (workers
    included, sampled every 50 ms), each process's peak RSS by role (``process_role``: the largest
    process of each role and how many there were) and its stdout. ``also``: the roots of other
    process trees counted with it (a Ray cluster the command joins: its nodes' ``ray start``
    processes count as Ray system processes)."""
    start = time.perf_counter()
    # Run outside the repository so the root folders (e.g. datasets/) cannot shadow installed packages.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir(), env=env
    )
    peak = 0
    per_process: dict[int, tuple[str, int]] = {}
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        roots = [psutil.Process(pid) for pid in (proc.pid, *also)]
        while not stop.is_set():
            try:
                procs = [process for root in roots for process in (root, *root.children(recursive=True))]
                rss = {p.pid: (p, p.memory_info().rss) for p in procs if p.is_running()}
                peak = max(peak, sum(value for _, value in rss.values()))
                for pid, (p, value) in rss.items():
                    if pid not in per_process:
                        per_process[pid] = ("ray system" if pid in also else process_role(p, proc.pid), 0)
                    per_process[pid] = (per_process[pid][0], max(value, per_process[pid][1]))
            except psutil.Error:
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, err = proc.communicate()
    stop.set()
    thread.join()
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{label} failed ({proc.returncode}):\n{err[-3000:]}")
    roles: dict[str, dict[str, int]] = {}
    for role, value in per_process.values():
        entry = roles.setdefault(role, {"processes": 0, "max_peak_rss_bytes": 0})
        entry["processes"] += 1
        entry["max_peak_rss_bytes"] = max(entry["max_peak_rss_bytes"], value)
    return {"wall_s": wall, "peak_rss_bytes": peak, "peak_rss_by_role": roles, "stdout": out}


def write_result(path: Path, result: dict) -> None:
    """Write a benchmark's JSON result (parents created), as every script in benchmarks/ does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


def ensure_preset(preset: str, data_dir: str) -> Path:
    """Generated sources of ``preset`` under ``data_dir`` (generated once, reused by later runs)."""
    data = Path(data_dir) / preset
    if not (data / "sources.toml").exists():
        print(f"generating the {preset} preset into {data} (once; reused by later runs)")
        subprocess.run(
            [*FREESCALE, "generate", "--preset", preset, "--out", str(data)], check=True, cwd=tempfile.gettempdir()
        )
    return data


def matmul_tflops(device: torch.device, n: int = 8192, dtype: torch.dtype = torch.bfloat16, iters: int = 10) -> float:
    """The card's dense matmul TFLOP/s: ``n³`` products of random ``dtype`` matrices (mean after warm-up)."""
    gen = torch.Generator().manual_seed(0)
    dtype = dtype if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, generator=gen).to(dtype).to(device) for _ in range(2))
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            a @ b
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        seconds = (time.perf_counter() - t0) / iters
    return 2.0 * n**3 / seconds / 1e12
