"""Run configs as TOML text: what ``RunConfig.to_toml`` writes next to a run's logs, and the (partial)
configs tests and benchmarks write for ``freescale train --config``. Nested tables
(``[user_tables.country_id]``) follow their parent's options."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tables_to_toml(tables: dict[str, dict[str, Any]]) -> str:
    """``{table: {option: value}}`` as TOML text (run configs written by benchmarks and tests too)."""
    lines: list[str] = []
    for name, section in tables.items():
        _toml_table(lines, name, section)
    return "\n".join(lines)


def _toml_table(lines: list[str], name: str, section: dict[str, Any]) -> None:
    """``[name]`` with its options, then its nested tables (``[user_tables.country_id]``)."""
    lines.append(f"[{name}]")
    lines.extend(f"{key} = {_toml_value(value)}" for key, value in section.items() if not isinstance(value, dict))
    lines.append("")
    for key, value in section.items():
        if isinstance(value, dict):
            _toml_table(lines, f"{name}.{_toml_key(key)}", value)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


def write_run_toml(path: Path | str, tables: dict[str, dict[str, Any]]) -> str:
    """Write a (partial) run config; returns the path as a string, ready for ``--config``."""
    Path(path).write_text(tables_to_toml(tables))
    return str(path)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)
