"""Typed lookups into a JSON object read from a file, each error one line naming the file and the field.

``manifest.json`` and cost-model files are edited by hand, truncated by full disks and copied between
versions; a wrong shape there used to surface as a ``KeyError`` or ``TypeError`` traceback far from the
file. Parsing them through ``Fields`` at the boundary turns every such case into a ``ValueError`` (the
caller's subclass) such as ``prepared/manifest.json: field 'layout.group_size' must be an integer >= 1,
got "8"``.
"""

from __future__ import annotations

import json
import math
from typing import Any

_KINDS = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
}
_WANTED = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "a boolean",
           "object": "a JSON object", "list": "a list"}  # fmt: skip
_MISSING = object()


class Fields:
    """One JSON object (``data``) of the file ``where``; ``error`` is the exception type raised.

    ``path`` arguments are dotted (``layout.group_size``); ``prefix`` names where ``data`` sits in the
    file when it is a nested object (``files[3]``), so errors always give the full field name."""

    def __init__(self, where: str, data: Any, error: type[ValueError] = ValueError, prefix: str = "") -> None:
        self.where, self.data, self.error, self.prefix = where, data, error, prefix
        if not isinstance(data, dict):
            what = f"field '{prefix}'" if prefix else "the file"
            raise error(f"{where}: {what} must be a JSON object, got {_describe(data)}")

    def _name(self, path: str) -> str:
        return f"{self.prefix}.{path}" if self.prefix else path

    def value(self, path: str, kind: str, minimum: float | None = None, default: Any = _MISSING) -> Any:
        """The field at ``path``, of JSON type ``kind`` (and >= ``minimum``); ``default`` when absent
        (a field that is present must still have the type)."""
        node: Any = self.data
        for depth, part in enumerate(path.split(".")):
            if not isinstance(node, dict):
                parent = ".".join(path.split(".")[:depth])
                raise self.error(
                    f"{self.where}: field '{self._name(parent)}' must be a JSON object, got {_describe(node)}"
                )
            if part not in node:
                if default is not _MISSING:
                    return default
                raise self.error(f"{self.where}: field '{self._name(path)}' is missing")
            node = node[part]
        if not _KINDS[kind](node) or (minimum is not None and node < minimum):
            wanted = _WANTED[kind] + (f" >= {minimum:g}" if minimum is not None else "")
            raise self.error(f"{self.where}: field '{self._name(path)}' must be {wanted}, got {_describe(node)}")
        return node

    def child(self, path: str, default: Any = _MISSING) -> Fields | None:
        """The object at ``path`` as ``Fields`` (``None`` when absent and ``default`` is given)."""
        node = self.value(path, "object", default=default)
        return None if node is None else Fields(self.where, node, self.error, self._name(path))

    def entries(self) -> dict[str, Fields]:
        """Every member of this object as ``Fields`` (keys taken whole: ``user.age_bucket`` is one key)."""
        return {key: Fields(self.where, value, self.error, self._name(key)) for key, value in self.data.items()}

    def items(self, path: str) -> list[Fields]:
        """The list at ``path``, each element an object as ``Fields`` (``path[i]``)."""
        return [
            Fields(self.where, item, self.error, f"{self._name(path)}[{i}]")
            for i, item in enumerate(self.value(path, "list"))
        ]

    def counts(self, path: str) -> dict[str, int]:
        """An object of non-negative integer counts (``by_reason``, ``events_read_by_source``)."""
        node = self.value(path, "object")
        for key, count in node.items():
            if not _KINDS["integer"](count) or count < 0:
                name = self._name(f"{path}.{key}")
                raise self.error(f"{self.where}: field '{name}' must be an integer >= 0, got {_describe(count)}")
        return dict(node)


def _describe(value: Any) -> str:
    """``value`` as JSON would show it (an object or a list by its kind), cut to 40 characters."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."
