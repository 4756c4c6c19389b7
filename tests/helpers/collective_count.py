"""How many collectives each FreeScale engine issues per step, counted at the one communication seam.

``counting(...)`` wraps ``TimedTransport.start`` (every all-to-all: routing, rows, gradients, PEC's
prefetch, the balancer's dispatch and combine) and ``TimedTransport.start_all_reduce`` (the dense
all-reduce) in this process and counts launches by collective name, from any thread (PEC's worker
included). ``count_modes`` is a ``pec_check.RankPool`` task: it trains an ``online_check.OnlineCase``
for two run lengths in each mode and returns the per-name counts of both, so a caller takes the
difference per extra step: the steady state, without the first step's own routing or the last
step's synchronous gradient exchange.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from online_check import OnlineCase, train_online_case

from freescale.trainer.engines.comm import TimedTransport


@contextmanager
def counting() -> Iterator[Counter]:
    """Count every collective launched through ``TimedTransport`` while the block runs (by name)."""
    counts: Counter = Counter()
    lock = threading.Lock()
    start, start_all_reduce = TimedTransport.start, TimedTransport.start_all_reduce

    def counted(method: Any) -> Any:
        def launch(self: TimedTransport, name: str, *args: Any) -> Any:
            with lock:
                counts[name] += 1
            return method(self, name, *args)

        return launch

    TimedTransport.start, TimedTransport.start_all_reduce = counted(start), counted(start_all_reduce)
    try:
        yield counts
    finally:
        TimedTransport.start, TimedTransport.start_all_reduce = start, start_all_reduce


def count_modes(case: dict[str, Any], modes: tuple[str, ...], rank: int) -> dict[str, Any]:
    """Per mode: ``{"short": counts, "long": counts, "moved": samples moved per step}`` of ``case``
    trained for ``case["steps"]`` and for two steps more (its schedule, if any, must cover both)."""
    base = OnlineCase(**case)
    out: dict[str, Any] = {}
    for mode in modes:
        out[mode] = {}
        for label, steps in (("short", base.steps), ("long", base.steps + 2)):
            longer = replace(base, steps=steps)
            with counting() as counts:
                result = train_online_case(longer, mode, rank)
            out[mode][label] = dict(counts)
            out[mode]["moved"] = [extra.get("balancer.moved", 0.0) for extra in result["extras"]]
    return out
