"""The one ``--set KEY=VALUE`` parser of every command (train, simulate, generate).

A value is a TOML value (``20``, ``1e6``, ``true``, ``"s3://b/p"``, ``[1, 2]``) or, when it does not
parse as one, the bare text (a path, a name). Keys are dotted paths: ``data.max_steps`` sets option
``max_steps`` of table ``data``; deeper paths (``a.b.c``) set nested tables. Where the target's
types are known (``typed_overrides``), a value must fit its field: a bool is ``true``/``false``
(or ``1``/``0``/``yes``/``no``), an integer may be written as an integral float (``1e6``) but never
loses a fraction, a float takes any number, a string keeps the text as typed. Every error is one
line that names the ``--set`` item and its key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


@dataclass(frozen=True)
class Override:
    """One parsed ``--set`` item: its dotted key split into parts, its value and the item as typed."""

    keys: tuple[str, ...]
    value: Any
    text: str  # the value as typed (before TOML parsing)
    item: str  # the whole ``KEY=VALUE`` item, for error messages

    @property
    def key(self) -> str:
        return ".".join(self.keys)


def add_set_option(parser: Any, help: str, metavar: str = "TABLE.OPTION=VALUE") -> None:
    """The ``--set`` option of a command's ``argparse`` parser: repeatable, collected in ``overrides``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar=metavar, help=help)


def parse_value(text: str) -> Any:
    """``text`` as a TOML value, or the bare text when it is not one."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_override(item: str, min_depth: int = 1, example: str = "key=value") -> Override:
    """``KEY=VALUE`` → ``Override``; the key must have at least ``min_depth`` dotted parts."""
    key, sep, text = item.partition("=")
    keys = tuple(part.strip() for part in key.split("."))
    if not sep or len(keys) < min_depth or not all(keys):
        raise ValueError(f"--set {item!r}: expected {_shape(min_depth)} (e.g. {example})")
    return Override(keys, parse_value(text), text, item)


def apply_overrides(
    tables: dict[str, Any],
    items: Iterable[str],
    known: Collection[str] | None = None,
    example: str = "data.max_steps=20",
) -> None:
    """``table.option=value`` items into ``tables`` in place; ``known``: the tables allowed (all if None)."""
    for item in items:
        override = parse_override(item, min_depth=2, example=example)
        table = override.keys[0]
        if known is not None and table not in known:
            raise ValueError(f"--set {item!r}: unknown table {table!r}; known: {sorted(known)}")
        node = tables
        for part in override.keys[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {part!r} is an option, not a table")
        node[override.keys[-1]] = override.value


def typed_overrides(items: Iterable[str], types: Mapping[str, type]) -> dict[str, Any]:
    """``key=value`` items → ``{key: value}`` with each value checked against ``types[key]``."""
    out: dict[str, Any] = {}
    for item in items:
        override = parse_override(item, example=f"{next(iter(types), 'key')}=1")
        if override.key not in types:
            raise ValueError(f"--set {item!r}: unknown key {override.key!r}; known: {sorted(types)}")
        out[override.key] = coerce(override, types[override.key])
    return out


def coerce(override: Override, kind: type) -> Any:
    """``override``'s value as ``kind`` (bool, int, float or str); one-line error naming the key."""
    value = override.value
    if kind is bool:
        if isinstance(value, bool):
            return value
        if override.text.strip().lower() in _TRUE + _FALSE:
            return override.text.strip().lower() in _TRUE
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        return value if isinstance(value, str) else override.text.strip()
    else:
        return value
    raise ValueError(f"--set {override.item!r}: {override.key} expects {kind.__name__}, got {override.text.strip()!r}")


def _shape(min_depth: int) -> str:
    return "KEY=VALUE" if min_depth <= 1 else "table.option=value"
