"""Run one command of the GPU check so that it can neither hang the check nor outlive it.

Standard library only (``tools/gpu_check.py`` runs before FreeScale is installed). A command runs in
a session of its own with its output in a log file; past its timeout its leader gets SIGINT first
(pytest then stops like after Ctrl-C and still writes its JUnit XML, so the tests that ran are
counted), then the whole process group SIGTERM, then SIGKILL. Processes that left the group on
purpose (``freescale train`` starts torchrun in a new session, torchrun its ranks, ranks their
loader workers) still carry the part's token in their environment (``TOKEN_ENV``), so they are
found in ``/proc`` and killed too: every process the check started, and no other.

Also here: reading a command's results back (``target_met`` entries of a JSON, a pytest JUnit XML).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN_ENV = "FREESCALE_GPU_CHECK_TOKEN"
GRACE_S = 4.0  # between SIGINT, SIGTERM and SIGKILL


@dataclass
class Outcome:
    """How a command ended: ``status`` ok | failed | timeout, its exit code, seconds, and the log."""

    status: str
    returncode: int | None
    seconds: float
    log: Path

    def tail(self, lines: int = 40, chars: int = 4000) -> str:
        """The end of the log (what a failure's JSON carries)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])[-chars:]


def run_command(
    argv: list[str], log: Path, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Outcome:
    """Run ``argv`` to its end or ``timeout`` seconds, output appended to ``log``; never raises for the
    command's own failures (a missing program is ``failed`` with the reason in the log)."""
    token = uuid.uuid4().hex
    environment = dict(os.environ if env is None else env, **{TOKEN_ENV: token})
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(argv)}\n")
        handle.flush()
        try:
            process = subprocess.Popen(
                argv, cwd=cwd, env=environment, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as error:
            handle.write(f"cannot start: {error}\n")
            return Outcome("failed", None, time.monotonic() - started, log)
        try:
            code = process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            stop_part(process, token)
            handle.write(f"\n[gpu_check: killed after the part's timeout of {timeout:.0f} s]\n")
            return Outcome("timeout", None, time.monotonic() - started, log)
        finally:
            stop_part(process, token, quiet=True)  # whatever it left running (a torchrun it started)
    return Outcome("ok" if code == 0 else "failed", code, time.monotonic() - started, log)


def stop_part(process: subprocess.Popen, token: str, quiet: bool = False) -> None:
    """SIGINT the command, SIGTERM its group, SIGKILL it (``GRACE_S`` apart, skipping what already
    ended), then SIGKILL every process that still carries ``token``. ``quiet``: after a normal exit,
    only the token sweep."""
    if not quiet:
        for sig, send in ((signal.SIGINT, os.kill), (signal.SIGTERM, os.killpg), (signal.SIGKILL, os.killpg)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=GRACE_S)
                break
    kill_token_holders(token)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=GRACE_S)


def kill_token_holders(token: str, quiet_scans: int = 3, interval: float = 0.05) -> None:
    """SIGKILL every process carrying ``token`` until ``quiet_scans`` scans in a row, ``interval``
    apart, find none (at most ``GRACE_S``). One scan is not enough: a process caught inside ``exec``
    shows an empty environment for that moment (a part's ``setsid sleep &`` outlived a single sweep
    under load), and a process may fork between the scan and the kill."""
    deadline, quiet = time.monotonic() + GRACE_S, 0
    while quiet < quiet_scans and time.monotonic() < deadline:
        found = processes_with_token(token)
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        quiet = 0 if found else quiet + 1
        time.sleep(interval)


def processes_with_token(token: str) -> list[int]:
    """Pids whose environment holds ``TOKEN_ENV=token`` (this user's processes; others are unreadable)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def targets_in(value: Any, path: str = "") -> dict[str, bool]:
    """Every ``target_met`` entry of a result JSON, keyed by where it sits (``targets.speedup``, ...).

    Benchmarks write ``"target_met": true`` beside each target's figures, or a dict of them; either
    way each boolean comes out under its own path, so the summary can list what was missed.
    """
    found: dict[str, bool] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "target_met" and isinstance(item, bool):
                found[path or key] = item
            elif key == "target_met" and isinstance(item, dict):
                found.update({f"{where}.{k}" if path else str(k): bool(v) for k, v in item.items()})
            else:
                found.update(targets_in(item, where))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.update(targets_in(item, f"{path}[{index}]"))
    return found


def read_json(path: Path) -> Any:
    """A result file, or None when absent or unreadable (the part then failed to write it)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def junit_counts(path: Path) -> dict[str, Any]:
    """passed / failed / errors / skipped / interrupted and the names of the tests that did not pass.

    A test stopped by SIGINT (the part's timeout) is written as a ``testcase`` without a name."""
    root = ET.parse(path).getroot()
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "interrupted": 0, "not_passed": []}
    for case in root.iter("testcase"):
        if case.get("name") is None:
            counts["interrupted"] += 1
            continue
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
            continue
        key = {"failure": "failed", "error": "errors", "skipped": "skipped"}[outcome.tag]
        counts[key] += 1
        message = (outcome.get("message") or "").splitlines()
        counts["not_passed"].append({"test": name, "outcome": key, "message": message[0][:300] if message else ""})
    return counts
