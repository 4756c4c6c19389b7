"""Synchronizing CUDA operations, as torch's sync debug mode reports them: host reads of device values
and blocking host-to-device copies alike (``torch.tensor(values, device="cuda")`` synchronizes the
stream first). ``sync_count`` counts only the first kind, on any device; these need a GPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch


def cuda_sync_sites(fn: Callable[[], object]) -> list[str]:
    """``file:line`` of the Python call behind every synchronizing CUDA operation ``fn`` ran."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]


def cuda_syncs(fn: Callable[[], object]) -> int:
    """How many synchronizing CUDA operations ``fn`` ran."""
    return len(cuda_sync_sites(fn))
