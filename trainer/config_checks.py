"""Checks of run-config options, shared by every section: one error line that names ``table.option``
and the value given, and the type of each option against its dataclass field (TOML reads ``inf``, ``nan``
and ``1.5`` where an integer is meant, and a comparison in ``__post_init__`` would let them through).
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any


def check(condition: bool, option: str, message: str, value: Any) -> None:
    """``ValueError("<option> <message>, got <value>")`` unless ``condition``."""
    if not condition:
        raise ValueError(f"{option} {message}, got {value!r}")


def choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    check(value in choices, option, f"must be one of {list(choices)}", value)


def _type_name(kind: Any) -> str:
    """A field's annotation as text (``from __future__ import annotations`` modules give strings)."""
    return kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))


def _check_value(option: str, kind: str, value: Any) -> None:
    """One option against its annotation. Why: TOML reads ``inf``/``nan`` and ``1.5`` happily, and a
    comparison in ``__post_init__`` lets ``inf`` through (``inf > 0``) and ``1.5`` too (``1.5 >= 0``)."""
    if kind == "int":
        check(isinstance(value, int) and not isinstance(value, bool), option, "must be an integer", value)
    elif kind == "float":
        check(isinstance(value, int | float) and not isinstance(value, bool), option, "must be a number", value)
        check(math.isfinite(value), option, "must be finite", value)
    elif kind == "bool":
        check(isinstance(value, bool), option, "must be true or false", value)
    elif kind == "str":
        check(isinstance(value, str), option, "must be a string", value)
    elif kind.startswith(("tuple[", "list[")):
        check(isinstance(value, list | tuple), option, "must be a list", value)
        inner = kind[kind.index("[") + 1 : -1].split(",")[0].strip()
        for item in value:
            _check_value(option, inner, item)


def check_types(cls: type, values: dict[str, Any], table: str) -> None:
    """Every known option in ``values`` has its field's type; floats are finite (ValueError names it)."""
    kinds = {f.name: _type_name(f.type) for f in fields(cls)}
    for option, value in values.items():
        if option in kinds:
            _check_value(f"{table}.{option}", kinds[option], value)
