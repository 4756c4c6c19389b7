"""A run config TOML file written from tables, for the config and launch tests."""

from __future__ import annotations

from pathlib import Path


def write_config(path: Path, **tables: dict) -> str:
    base = {"data": {"path": "/tmp/x"}}
    base.update(tables)
    lines = []
    for table, values in base.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {value!r}".replace("'", '"') for key, value in values.items())
    path.write_text("\n".join(lines) + "\n")
    return str(path)
