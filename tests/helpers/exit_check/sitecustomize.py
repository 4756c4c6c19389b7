"""Put this folder first on ``PYTHONPATH`` and every rank process records, at interpreter exit, the
threads it still has: ``$FREESCALE_EXIT_CHECK/rank<RANK>.json`` (``os_threads``: every thread's name
from ``/proc/self/task``; ``python_threads``: ``threading``'s threads other than the main one).

Registered first, the hook runs last among the ``atexit`` handlers, right before the interpreter's
finalization. What is alive then is destroyed by finalization in an unspecified order, with the
interpreter half torn down (a thread that then needs the GIL is ended mid-C++): a process group's
gloo threads found here are what a TorchRec rank once aborted on ("terminate called without an active
exception") after its run had finished.
"""

from __future__ import annotations

import atexit
import json
import os
import threading


def _record(folder: str, rank: str) -> None:
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{task}/comm") as handle:
                names.append(handle.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    python = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as handle:
        json.dump({"os_threads": names, "python_threads": python}, handle)


if os.environ.get("FREESCALE_EXIT_CHECK") and os.environ.get("RANK") is not None:
    atexit.register(_record, os.environ["FREESCALE_EXIT_CHECK"], os.environ["RANK"])
