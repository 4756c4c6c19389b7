"""Ranks as processes: a test file run as a script, one copy per rank, over a gloo file rendezvous."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_workers(script: str, world: int, tmp_path: Path, timeout: float = 240) -> None:
    """Start ``world`` copies of ``script`` as ranks; fail with every rank's output if one fails."""
    init_file = tmp_path / "pg_init"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world), str(init_file)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]  # fmt: skip
    outputs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
        outputs.append(out)
        codes.append(p.returncode)
    if any(codes):
        report = "\n".join(f"--- rank {r} (exit {c})\n{o[-3000:]}" for r, (c, o) in enumerate(zip(codes, outputs)))
        pytest.fail(f"transport workers failed:\n{report}")
