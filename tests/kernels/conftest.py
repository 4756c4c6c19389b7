"""Fixtures of the kernel tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def triton_interpreter() -> Iterator[None]:
    """Triton's CPU interpreter for a module's tests (``TRITON_INTERPRET=1``; kernels are jitted at first
    use, so the mode is picked up after import: kernels/triton_support.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        yield
