"""``freescale prepare`` run as a real process, for the tests that fault it (``tests/pipeline/``
``test_prepare_bad_input.py``, ``_bad_places``, ``_interrupts``, ``_disk_full``): start it, wait for
it or for a condition while it runs, compare outputs byte for byte, check a refusal is one line."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FREESCALE = str(Path(sys.executable).parent / "freescale")
TINY_OPTIONS = ["--group-size", "4", "--micro-batch-size", "4", "--max-uih-len", "2048", "--seed", "1"]


def cli_prepare(sources: str, out: str, *options: str, workers: int = 1) -> subprocess.Popen:
    command = [FREESCALE, "prepare", "--sources", sources, "--output", out, "--workers", str(workers), "--quiet"]
    return subprocess.Popen(
        [*command, *TINY_OPTIONS, *options],
        cwd=tempfile.gettempdir(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def output_files(directory: str) -> dict[str, bytes]:
    """Every file of an output by relative path; the manifest without the fields naming the run's
    own output path (the only thing two outputs of the same job may differ in)."""
    root = Path(directory)
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest["config"].pop("output", None)
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


def clean_prepare_files(sources: str, out: str) -> dict[str, bytes]:
    """The bytes of an uninterrupted CLI prepare of ``sources`` into ``out`` (64 KB shards): what a
    faulted-then-rerun output must equal."""
    code, err = finish(cli_prepare(sources, out, "--shard-size-limit", "64KB"))
    assert code == 0, err
    return output_files(out)


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"condition not reached; process ended with {proc.poll()}: {proc.stderr.read()[-2000:]}")
