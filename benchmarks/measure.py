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

FREESCALE = [str(Path(sys.executable).parent / "freescale")]


def run_measured(cmd: list[str], label: str) -> dict:
    """Run ``cmd``; return wall seconds, the peak summed RSS of its whole process tree (workers
    included, sampled every 50 ms) and its stdout."""
    start = time.perf_counter()
    # Run outside the repository so the root folders (e.g. datasets/) cannot shadow installed packages.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
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
    return {"wall_s": wall, "peak_rss_bytes": peak, "stdout": out}


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
