"""Mounts for tests that need a second path to the same files, or a read-only place (we run as root)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def bind_mount(source: Path, target: Path, read_only: bool = False) -> Iterator[Path]:
    """``target`` as a second path to ``source`` (``mount --bind``), read-only if asked; skips the test
    where mounting is not allowed."""
    target.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {result.stderr.decode().strip() or result.returncode}")
    try:
        if read_only:
            remount = ["mount", "-o", "remount,ro,bind", str(target)]
            result = subprocess.run(remount, capture_output=True, check=False)
            if result.returncode != 0:
                pytest.skip(f"cannot make a bind mount read-only here: {result.stderr.decode().strip()}")
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)
