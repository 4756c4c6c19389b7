"""What every Triton kernel module here shares: optional import, interpreter detection, lazy jit.

Kernels are written as plain functions and jitted at first use (``jit_lazily``) because
``triton.jit`` decides at decoration time whether to build a GPU kernel or a CPU interpreter function
(``TRITON_INTERPRET=1``); deciding at first use lets tests switch the interpreter on after ``triton``
was imported. For the same reason kernels call the builtins ``tl.reduce``/``tl.associative_scan``
with ``tl.standard._sum_combine`` (what ``tl.sum``/``tl.cumsum`` expand to) and ``tl.full`` instead of
the jitted helpers ``tl.sum``/``tl.max``/``tl.sigmoid``/``tl.zeros``, which are jitted when
``triton.language`` is imported and cannot run in an interpreter enabled later.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

try:  # Triton is optional at import time: CPU-only installs still get the PyTorch paths.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton is in the pinned stack
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    HAS_TRITON = False


def interpreter_enabled() -> bool:
    """True when Triton runs kernels with its CPU interpreter (``TRITON_INTERPRET=1``)."""
    if not HAS_TRITON:
        return False
    from triton import knobs

    return bool(knobs.runtime.interpret)


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why a Triton kernel cannot run on ``device`` (None when it can)."""
    if not HAS_TRITON:
        return "triton is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and interpreter_enabled():
        return None
    return f"the Triton kernels need a CUDA tensor, or TRITON_INTERPRET=1 for CPU tensors; got device {device}"


_JITTED: dict[tuple[str, str, bool], Any] = {}


def jit_lazily(fn: Callable[..., None]) -> Any:
    """``triton.jit(fn)``, built at first use and cached per interpreter mode (module docstring)."""
    key = (fn.__module__, fn.__name__, interpreter_enabled())
    if key not in _JITTED:
        _JITTED[key] = triton.jit(fn)
    return _JITTED[key]


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1): Triton block shapes must be powers of two."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))
