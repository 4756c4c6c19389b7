"""Options shared by the ``freescale stats`` tests: one process, no progress bars, nothing written."""

from __future__ import annotations

FAST = {"workers": 1, "progress": False, "output": None}
