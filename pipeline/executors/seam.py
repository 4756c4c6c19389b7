"""The executor seam: what a step's calls look like (``Call``), what runs them (``Executor``), and the
progress bar and log line every executor shares (``Progress``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from tqdm import tqdm

Call = tuple[Callable[..., Any], tuple]


class Executor(Protocol):
    """Runs a step's calls; results come back in call order, and the first failed call's error (in
    call order) is raised once every call has run."""

    name: str

    def map(self, calls: list[Call], desc: str, unit: str) -> list[Any]:
        """``[fn(*args) for fn, args in calls]``, in parallel."""
        ...

    def write(self, calls: list[Call], desc: str) -> None:
        """The write step's calls (one per part): each holds a part's buckets and an ``MDSWriter``."""
        ...

    def release(self) -> None:
        """Free what idle task processes hold before the write step's peak."""
        ...

    def close(self) -> None: ...


class Progress:
    """A progress bar and a log line per step, shared by the executors."""

    def __init__(self, enabled: bool, log: Callable[[str], None]) -> None:
        self.enabled = enabled
        self.log = log

    def bar(self, total: int, desc: str, unit: str) -> tqdm:
        return tqdm(total=total, desc=desc, unit=unit, disable=not self.enabled, leave=False)

    def warn(self, message: str) -> None:
        """One line on stderr, shown even with ``--quiet``: what the job cannot do as asked."""
        tqdm.write(message, file=sys.stderr)

    def done(self, n: int, desc: str, unit: str, started: float) -> None:
        if n:
            self.log(f"{desc}: {n} {unit}s in {time.perf_counter() - started:.1f}s")
