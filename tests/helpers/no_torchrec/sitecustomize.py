"""Put this folder first on ``PYTHONPATH`` and ``torchrec`` / ``fbgemm_gpu`` cannot be imported.

What a GPU host without TorchRec looks like to Python, in every process of a job (torchrun's ranks
and loader workers inherit the environment and run this at start-up). Each attempt is appended to
the file ``FREESCALE_BLOCKED_IMPORT_LOG`` names, so a test can also require that nothing tried.
"""

from __future__ import annotations

import os
import sys

BLOCKED = ("torchrec", "fbgemm_gpu")


class BlockedImports:
    """A meta-path finder that refuses the blocked top-level packages and their submodules."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] not in BLOCKED:
            return None
        log = os.environ.get("FREESCALE_BLOCKED_IMPORT_LOG")
        if log:
            with open(log, "a") as handle:
                handle.write(f"pid {os.getpid()} ({' '.join(sys.argv[:2])}): {name}\n")
        raise ModuleNotFoundError(f"No module named {name!r} (blocked by tests/helpers/no_torchrec)", name=name)


sys.meta_path.insert(0, BlockedImports())
