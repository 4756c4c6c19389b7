"""``freescale bench``: run a benchmark script from ``benchmarks/`` with the arguments given."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/")
    p.add_argument("name", help="balance | prepare | stats | bubbles | pec | quality | dispatch | sm_contention")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def cmd_bench(args: argparse.Namespace) -> int:
    script = REPO_ROOT / "benchmarks" / f"bench_{args.name}.py"
    if not script.exists():
        available = sorted(p.stem.removeprefix("bench_") for p in (REPO_ROOT / "benchmarks").glob("bench_*.py"))
        raise ValueError(f"unknown benchmark {args.name!r}; available: {available}")
    return subprocess.call([sys.executable, str(script), *args.args])
