"""Shared helpers of the benchmark scripts: run a command and measure it as a user would see it; run a
benchmark's points with one retry each and its JSON rewritten after every point (``Points``); the
card's dense matmul ceiling (``matmul_tflops``) for GPU benchmarks to print beside their own TFLOP/s."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import torch

# the CLI through the interpreter, not a console script beside it: an install with pip --target (the GPU
# check's) has none there; -P keeps a checkout's own freescale/ folder in the cwd from shadowing the install
FREESCALE = [sys.executable, "-P", "-m", "freescale.tools.cli"]
T = TypeVar("T")


class CommandFailed(RuntimeError):
    """A measured command exited with a non-zero status (``run_measured``): a failed point, not the
    end of the benchmark (``Points`` retries it)."""


def process_role(process: psutil.Process, root: int) -> str:
    """What a process of a measured tree is: the command itself, a Ray system process, a Ray worker,
    or another child (the local executor's pool and writer processes)."""
    if process.pid == root:
        return "driver"
    name = process.name()
    command = " ".join(process.cmdline())
    # Ray's agents rename themselves ray::DashboardAgent, ray::RuntimeEnvAgent: system, not workers
    if "default_worker.py" in command or (name.startswith("ray::") and not name.endswith("Agent")):
        return "ray worker"
    # a path inside the ray package, not any "ray" in the command: this repository's worktree may be
    # named so (wt-rayspeed), which once booked the local executor's pool and writer as Ray processes
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
        try:
            roots = [psutil.Process(pid) for pid in (proc.pid, *also)]
        except psutil.Error:  # the command already ended
            return
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
        raise CommandFailed(f"{label} failed ({proc.returncode}):\n{err[-3000:]}")
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


class Points:
    """Runs a CPU benchmark's points one at a time: each point that raises is run once more, every
    failed try is recorded, and the JSON is rewritten after every point and every failure.

    Why: one failed training run (a rank that aborted at exit) once ended ``bench_pec`` and threw away
    its four finished points, 8 minutes of measurements. A point is whatever the benchmark compares
    side by side (e.g. one data point's none/pec/TorchRec runs), so a retry re-runs all of it and the
    arms stay measured together.

    ``report()`` builds the benchmark's JSON from what it has measured so far (it must cope with
    missing points: a target whose points are missing is not met). The written JSON carries, next to
    it, ``complete`` (the benchmark reached its end and no point failed for good), ``points_done``,
    ``points_failed`` (failed every try), ``points_retried`` and ``failures`` (one entry per failed
    try: point, attempt, seconds, error, then ``retried`` or ``gave up``). ``out = None`` (a
    ``--quick`` run without ``--out``) writes nothing but still retries and records.
    """

    RETRIES = 1  # a failed point runs once more

    def __init__(self, name: str, out: Path | None, report: Callable[[], dict[str, Any]]) -> None:
        self.name, self.out, self._report = name, out, report
        self.done: list[str] = []
        self.failed: list[str] = []
        self.failures: list[dict[str, Any]] = []

    def run(
        self, label: str, point: Callable[..., T], *args: Any, keep: Callable[[T], object] | None = None
    ) -> T | None:
        """``point(*args)``, tried up to ``1 + RETRIES`` times; its value, or None when every try failed.
        ``keep(value)`` stores a value where ``report()`` finds it, before the JSON is written. Only
        ``Exception``s count as failures: an interrupt (Ctrl-C) ends the benchmark, its JSON as last saved."""
        for attempt in range(1, self.RETRIES + 2):
            start = time.perf_counter()
            try:
                value = point(*args)
            except Exception as error:
                last = attempt > self.RETRIES
                self.failures.append({
                    "point": label, "attempt": attempt, "seconds": round(time.perf_counter() - start, 1),
                    "error": describe(error), "then": "gave up" if last else "retried",
                })  # fmt: skip
                first = (str(error).strip().splitlines() or [""])[0][:200]
                then = "giving up on this point" if last else "running it once more"
                print(f"{self.name}: {label}: try {attempt} failed ({type(error).__name__}: {first}); {then}",
                      file=sys.stderr, flush=True)  # fmt: skip
                if last:
                    self.failed.append(label)
                self.save()
                continue
            if keep is not None:
                keep(value)
            self.done.append(label)
            self.save()
            return value
        return None

    def status(self, final: bool = False) -> dict[str, Any]:
        """The recorder's fields of the JSON (``final``: the benchmark has run every point)."""
        return {
            "complete": final and not self.failed,
            "points_done": list(self.done),
            "points_failed": list(self.failed),
            "points_retried": sorted({f["point"] for f in self.failures if f["then"] == "retried"}),
            "failures": list(self.failures),
        }

    def save(self, final: bool = False) -> dict[str, Any]:
        """Build the report, add ``status``, write it (with ``out``) and return it. A report that
        cannot be built from partial results is recorded as ``report_error``, never raised: the
        points already measured must reach the file."""
        try:
            report = dict(self._report())
        except Exception as error:
            if final:
                raise
            report = {"benchmark": self.name, "report_error": describe(error)}
        report.update(self.status(final))
        if self.out is not None:
            write_result(self.out, report)
        return report

    def exit_code(self) -> int:
        """1 when some point failed for good, else 0."""
        return 1 if self.failed else 0


def machine() -> dict[str, Any]:
    """The host a result was measured on, as every benchmark's JSON records it."""
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}


def describe(error: BaseException, limit: int = 6000) -> str:
    """An error for the JSON: type, message and the innermost frame, at most ``limit`` characters."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = f"{type(error).__name__}{where}: {error}"
    return text if len(text) <= limit else text[: limit // 3] + "\n[...]\n" + text[-2 * limit // 3 :]


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
    """Dense ``n x n @ n x n`` matmul TFLOP/s of ``device`` (2 n^3 FLOPs per product).

    The card's own ceiling for benchmarks to print next to their TFLOP/s: a kernel's 300 TFLOP/s reads
    differently on a card whose cuBLAS bf16 matmul does 600 than on one that does 400. Three warm-up
    products (cuBLAS heuristics, clocks), then ``iters`` timed ones; on CUDA each is bracketed by its
    own pair of events recorded back to back on the current stream (one synchronize at the end, so no
    launch gap is timed) and the mean is reported. On CPU, wall time (for tests with a small ``n``).
    """
    if n < 1 or iters < 1:
        raise ValueError(f"matmul_tflops: n and iters must be >= 1, got n={n}, iters={iters}")
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.float32, generator=gen).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32, generator=gen).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    if device.type == "cuda":
        with torch.cuda.device(device):
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(iters)]  # fmt: skip
            for start, end in events:
                start.record()
                torch.matmul(a, b, out=out)
                end.record()
            torch.cuda.synchronize()
        seconds = sum(start.elapsed_time(end) for start, end in events) / iters / 1e3
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b, out=out)
        seconds = (time.perf_counter() - t0) / iters
    return 2.0 * n**3 / max(seconds, 1e-12) / 1e12


class Watchdog:
    """Ends a GPU benchmark that stopped making progress, after saving what it measured.

    A kernel that never finishes blocks the main thread inside a CUDA synchronize (with the GIL
    released), where no exception or ``timeout`` signal handler can reach it. If the ``with`` block is
    still running after ``seconds``, ``on_expire`` runs on the watchdog thread (the benchmarks write
    their partial report, the stuck point marked) and the process ends with exit code 3 through
    ``os._exit``: an orderly exit would wait on the same blocked CUDA call.
    """

    EXIT_CODE = 3

    def __init__(self, seconds: float | None, on_expire: Callable[[], object]) -> None:
        self.seconds, self.on_expire = seconds, on_expire
        self._timer: threading.Timer | None = None

    def _fire(self) -> None:
        try:
            self.on_expire()
        except Exception as e:  # the exit must happen whatever the report did
            print(f"watchdog: saving the partial report failed: {e!r}", file=sys.stderr)
        print(f"watchdog: still running after {self.seconds} s; exiting with code {self.EXIT_CODE}",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(self.EXIT_CODE)

    def __enter__(self) -> Watchdog:
        if self.seconds is not None and self.seconds > 0:
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()


def device_environment(device: str) -> dict[str, Any]:
    """What a GPU benchmark's JSON records of where it ran: versions, the device's name (the CPU's on
    ``cpu``), SMs, and whether Triton ran as its CPU interpreter."""
    import platform

    from freescale.kernels.triton_support import HAS_TRITON, interpreter_enabled, triton

    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "device": device,
                           "cuda": torch.version.cuda, "triton": triton.__version__ if HAS_TRITON else None,
                           "triton_interpret": interpreter_enabled()}  # fmt: skip
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env |= {"device_name": props.name, "gpu": props.name, "sms": props.multi_processor_count}
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env
