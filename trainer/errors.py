"""The error a rank stops with when the run cannot go on: printed as one line, no traceback."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite steps, a checkpoint that cannot be saved or loaded, ...); the rank
    prints one line and exits non-zero. ``everywhere``: every rank raises this same error (a collective
    verdict), so only rank 0 prints it."""

    def __init__(self, message: str, everywhere: bool = False) -> None:
        super().__init__(message)
        self.everywhere = everywhere
