"""Rank processes of this host that stopped answering (``/proc`` state), named and ended.

The runner calls ``end_stopped_peers`` when a collective gave up, so the run ends with a line naming
the stopped rank instead of torchrun waiting on a process that never handles SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path


def process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` ('R', 'S', 'T' stopped, ...), '' when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def end_stopped_peers(pids: list[tuple[str, int]]) -> list[str]:
    """Ranks of this host whose process is stopped (SIGSTOP, a debugger): named, then killed.

    Why kill: torchrun ends the other ranks with SIGTERM and waits 30 s for them, and a stopped
    process never handles SIGTERM; these are this job's own rank processes, and the job is ending.
    """
    host, named = socket.gethostname(), []
    for rank, (rank_host, pid) in enumerate(pids):
        if rank_host == host and pid != os.getpid() and process_state(pid) in ("T", "t"):
            named.append(f"rank {rank} (pid {pid}, stopped)")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return named
