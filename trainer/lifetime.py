"""Process lifetime of a training job: nothing outlives ``freescale train``, failures in one line.

The process tree is ``freescale train`` (launcher) → ``python -m freescale.trainer.lifetime`` (torchrun's
agent, in its own session) → one process per rank. Why each link is tied to the one above:

- the launcher forwards SIGTERM/SIGINT to the agent's process group and kills the group when it
  exits for any reason (an exception, Ctrl-C: the terminal's SIGINT does not reach a new session);
- a launcher killed with SIGKILL runs no code, so the agent asks the kernel for SIGTERM when its
  parent dies (``PR_SET_PDEATHSIG``); torchrun's agent handles SIGTERM by terminating its workers;
- every rank asks for SIGKILL when the agent dies, in case the agent itself is killed hard.

A parent that died before ``prctl`` ran is caught by comparing ``getppid()`` with the pid the
parent left in the environment. The agent wrapper also turns torchrun's ``ChildFailedError``
traceback into one line per failed rank (the ranks print their own one-line errors above it), and its
``SignalException`` traceback (the launcher told to stop) into one line; the job then exits with the
conventional status 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), as a process the
signal had killed would.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import subprocess
import sys
from typing import Any

PR_SET_PDEATHSIG = 1
PARENT_ENV = "FREESCALE_PARENT_PID"


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux; a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    expected = os.environ.get(PARENT_ENV)
    if expected and os.getppid() != int(expected):  # the parent is already gone
        os.kill(os.getpid(), sig)


def describe_failures(error: Any) -> list[str]:
    """One line per failed rank of a torchrun ``ChildFailedError``."""
    lines = []
    for rank, failure in sorted(error.failures.items()):
        code = failure.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        lines.append(f"freescale train: rank {rank} (pid {failure.pid}) {how}")
    return lines


def stopped_line(sig: int) -> str:
    return f"freescale train: stopped by {signal.Signals(sig).name}; every rank of the job was ended"


# torchrun's log lines about a job's end that our own lines say already: a signal received, the
# ranks sent SIGTERM, a rank's exit status (``describe_failures``)
REPORTED_MESSAGES = ("death signal", "closing signal", "failed (exitcode")
REPORTING_LOGGERS = ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api")


class _AlreadyReported(logging.Filter):
    """Drops torchrun's log lines of ``REPORTED_MESSAGES``: the job's end is said in one line of ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(part in str(record.msg) for part in REPORTED_MESSAGES)


def agent_main(argv: list[str]) -> int:
    """torchrun's ``main`` tied to the launcher, its failure traceback replaced by one line per rank."""
    die_with_parent(signal.SIGTERM)
    os.environ[PARENT_ENV] = str(os.getpid())  # the ranks' parent
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    for name in REPORTING_LOGGERS:
        logging.getLogger(name).addFilter(_AlreadyReported())
    try:
        torchrun_main(argv)
    except ChildFailedError as error:
        print("\n".join(describe_failures(error)), file=sys.stderr, flush=True)
        return 1
    except SignalException as error:  # torchrun ended the ranks before raising it
        print(stopped_line(int(error.sigval)), file=sys.stderr, flush=True)
        return 128 + int(error.sigval)
    return 0


def exit_process(status: int) -> None:
    """``sys.exit(status)`` for a process that imported torch (the agent, a rank), without the
    interpreter's garbage collections over every object at shutdown.

    With torch loaded a process holds ~400k objects; the collections during finalization took 0.5-2 s
    per process on a 2-core machine, after the run's work was done, and the agent's came after its
    ranks', so every ``freescale train`` ended seconds after its last rank. ``gc.freeze`` leaves the
    objects alive now out of those collections: what is freed by reference counting still is, atexit
    handlers and the flush of stdout/stderr still run, only cycles still alive at exit are left to the
    OS. Called from the ``__main__`` blocks only, never in a process that goes on (e.g. pytest's)."""
    gc.freeze()
    sys.exit(status)


def run_group(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` in its own session; forward SIGTERM/SIGINT to it and kill it when we exit.
    Returns its exit status, 128 + the signal's number when a signal ended it."""
    env = dict(env, **{PARENT_ENV: str(os.getpid())})
    process = subprocess.Popen(command, env=env, start_new_session=True)

    def forward(sig: int, _frame: Any) -> None:
        _signal_group(process.pid, sig)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        status = _wait(process)
        if status < 0:  # killed before torchrun could handle the signal: nothing said it yet
            print(stopped_line(-status), file=sys.stderr, flush=True)
            return 128 - status
        return status
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _signal_group(process.pid, signal.SIGKILL)  # whatever is left of the job ends with us


def _wait(process: subprocess.Popen) -> int:
    while True:
        try:
            return process.wait()
        except KeyboardInterrupt:  # a handler replaced by a caller: keep waiting, the group was told
            continue


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


if __name__ == "__main__":
    exit_process(agent_main(sys.argv[1:]))
