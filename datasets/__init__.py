"""freescale.datasets: source configs, readers for heterogeneous UIH logs, and a synthetic generator.

Names are imported lazily so ``import freescale.datasets`` stays cheap for tools that only need one
part (the CLI imports this package on every invocation).

* ``ids.stable_id``: deterministic 63-bit ids for string user/item ids;
* ``sources``: ``SourcesConfig`` (TOML), ``plan_read_tasks``, ``read_task`` -> ``EventChunk``,
  ``read_user_table``;
* ``synthetic`` / ``presets``: ``GeneratorConfig``, ``generate``, ``PRESETS``, ``preset``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "stable_id": "ids",
    "SourceError": "config",
    "SourceSpec": "config",
    "SourcesConfig": "config",
    "UserTableSpec": "config",
    "EventChunk": "sources",
    "ReadTask": "sources",
    "EVENT_SCHEMA": "sources",
    "REJECT_SCHEMA": "sources",
    "iter_events": "sources",
    "plan_read_tasks": "sources",
    "read_task": "sources",
    "read_user_table": "sources",
    "GeneratorConfig": "synthetic",
    "generate": "synthetic",
    "PRESETS": "presets",
    "preset": "presets",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'freescale.datasets' has no attribute {name!r}")
    module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
    return getattr(module, name)
