"""The source config: which files hold a dataset's events, in which format, with which column names.

One TOML file describes a dataset made of heterogeneous logs (Parquet click logs, JSONL purchase logs,
public benchmark files) so that ``prepare`` and ``stats`` read them the same way and the generator
can describe exactly what it wrote. Paths are resolved against the TOML's folder, so a dataset folder
can be moved or uploaded to object storage as a whole. Every mistake is a ``ValueError`` naming the
option and the TOML file, because these files are hand-written.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from freescale import storage

__all__ = [
    "CANONICAL_FIELDS",
    "FORMATS",
    "ID_TYPES",
    "TIMESTAMP_UNITS",
    "USER_FORMATS",
    "SourceError",
    "SourceSpec",
    "SourcesConfig",
    "UserTableSpec",
]

FORMATS = ("parquet", "csv", "tsv", "jsonl", "arrow", "movielens", "recbole", "amazon")
GENERIC_FORMATS = ("parquet", "csv", "tsv", "jsonl", "arrow")
USER_FORMATS = GENERIC_FORMATS
TIMESTAMP_UNITS = ("s", "ms", "us", "ns", "iso8601")
CANONICAL_FIELDS = ("user", "item", "timestamp", "action")
REQUIRED_FIELDS = ("user", "item", "timestamp")
ID_TYPES = ("auto", "int", "string")
MOVIELENS_VARIANTS = ("dat", "udata", "csv")
MAX_SOURCES = 127  # the canonical ``source`` column is int8
INT32_MAX = 2**31 - 1


class SourceError(ValueError):
    """A source cannot be read as configured (missing file or column, unreadable file).

    Unlike bad rows, which are counted and quarantined, these stop the job: nothing useful can come
    out of a source whose files are absent. The message names source, file and column.
    """

    def __init__(self, message: str, *, source: str = "", file: str = "", column: str = "") -> None:
        super().__init__(message)
        self.source = source
        self.file = file
        self.column = column


def _check_choice(where: str, key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{where}: option '{key}' must be one of {', '.join(choices)}; got {value!r}")


def _check_int(where: str, key: str, value: Any, low: int, high: int = 2**62) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{where}: option '{key}' must be an integer in [{low}, {high}]; got {value!r}")


def _check_text_options(where: str, fmt: str, header: Any, delimiter: Any) -> None:
    if header is not None and (fmt not in ("csv", "tsv") or not isinstance(header, bool)):
        raise ValueError(f"{where}: option 'header' is a boolean for csv/tsv sources only; got {header!r}")
    if delimiter is not None and (fmt not in ("csv", "tsv") or not isinstance(delimiter, str) or len(delimiter) != 1):
        raise ValueError(f"{where}: option 'delimiter' is one character for csv/tsv only; got {delimiter!r}")


@dataclass
class SourceSpec:
    """One event log: a set of files sharing a format and a column mapping.

    ``columns`` maps canonical fields (user, item, timestamp, action) to raw column names; public
    formats have defaults so it may be empty for them. ``id_types`` says how to read user/item ids:
    ``auto`` (integers stay integers, other strings are hashed with ``stable_id``), ``int`` (anything
    not an integer is ``bad_type``) or ``string`` (always hashed). ``rating_scale`` multiplies ratings
    before they become action ids, so half-star ratings (MovieLens 10M) can use ``rating_scale = 2``.
    """

    name: str
    format: str
    path: str
    timestamp_unit: str = "s"
    columns: dict[str, str] = field(default_factory=dict)
    action_map: dict[str, int] = field(default_factory=dict)
    default_action: int = 0
    variant: str | None = None
    header: bool | None = None
    delimiter: str | None = None
    id_types: dict[str, str] = field(default_factory=dict)
    rating_scale: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"sources: option 'name' must be a non-empty string; got {self.name!r}")
        where = f"source '{self.name}'"
        _check_choice(where, "format", self.format, FORMATS)
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"{where}: option 'path' must be a non-empty string; got {self.path!r}")
        _check_choice(where, "timestamp_unit", self.timestamp_unit, TIMESTAMP_UNITS)
        for key in ("columns", "action_map", "id_types"):
            if not isinstance(getattr(self, key), dict):
                raise ValueError(f"{where}: option '{key}' must be a table; got {getattr(self, key)!r}")
        self._check_columns(where)
        self._check_actions(where)
        if self.variant is not None:
            if self.format != "movielens":
                raise ValueError(f"{where}: option 'variant' applies to format 'movielens' only")
            _check_choice(where, "variant", self.variant, MOVIELENS_VARIANTS)
        _check_text_options(where, self.format, self.header, self.delimiter)
        for key, value in self.id_types.items():
            _check_choice(where, "id_types", key, ("user", "item"))
            _check_choice(where, f"id_types.{key}", value, ID_TYPES)
        _check_int(where, "rating_scale", self.rating_scale, 1, 1000)

    def _check_columns(self, where: str) -> None:
        for key, value in self.columns.items():
            _check_choice(where, "columns", key, CANONICAL_FIELDS)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}: option 'columns.{key}' must be a non-empty string; got {value!r}")
        if self.format in GENERIC_FORMATS:
            missing = [f for f in REQUIRED_FIELDS if f not in self.columns]
            if missing:
                raise ValueError(f"{where}: option 'columns' must name {', '.join(missing)} for format '{self.format}'")

    def _check_actions(self, where: str) -> None:
        for key, value in self.action_map.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"{where}: option 'action_map' keys must be non-empty strings; got {key!r}")
            _check_int(where, f"action_map.{key}", value, 0, INT32_MAX)
        _check_int(where, "default_action", self.default_action, 0, INT32_MAX)

    @classmethod
    def from_dict(cls, data: dict[str, Any], index: int = 0) -> SourceSpec:
        """Build from a ``[[sources]]`` table, rejecting keys this version does not know."""
        where = f"[[sources]] #{index} ({data.get('name', '?')!r})"
        _reject_unknown(where, data, {f.name for f in fields(cls)})
        for key in ("name", "format", "path"):
            if key not in data:
                raise ValueError(f"{where}: option '{key}' is required")
        return cls(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()})

    def to_dict(self) -> dict[str, Any]:
        """The TOML table; options left at their defaults are omitted to keep files short."""
        out: dict[str, Any] = {"name": self.name, "format": self.format, "path": self.path}
        out["timestamp_unit"] = self.timestamp_unit
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in out or value is None or value == {}:
                continue
            if f.name in ("default_action", "rating_scale") and value == f.default:
                continue
            out[f.name] = dict(value) if isinstance(value, dict) else value
        return out


@dataclass
class UserTableSpec:
    """An optional table of per-user integer features, joined to sequences by ``prepare``."""

    path: str
    format: str = "csv"
    user_column: str = "user_id"
    features: tuple[str, ...] = ()
    header: bool | None = None
    delimiter: str | None = None
    id_type: str = "auto"

    def __post_init__(self) -> None:
        where = "users"
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"{where}: option 'path' must be a non-empty string; got {self.path!r}")
        _check_choice(where, "format", self.format, USER_FORMATS)
        if not isinstance(self.user_column, str) or not self.user_column:
            raise ValueError(f"{where}: option 'columns.user' must be a non-empty string")
        self.features = tuple(self.features)
        if not all(isinstance(f, str) and f for f in self.features):
            raise ValueError(f"{where}: option 'columns.features' must be a list of column names")
        if self.user_column in self.features or len(set(self.features)) != len(self.features):
            raise ValueError(f"{where}: option 'columns.features' repeats a column")
        _check_text_options(where, self.format, self.header, self.delimiter)
        _check_choice(where, "id_type", self.id_type, ID_TYPES)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UserTableSpec:
        _reject_unknown("[users]", data, {"path", "format", "columns", "header", "delimiter", "id_type"})
        columns = _table("[users]: option 'columns'", data.get("columns", {}))
        _reject_unknown("[users.columns]", columns, {"user", "features"})
        if "path" not in data:
            raise ValueError("[users]: option 'path' is required")
        kwargs = {k: v for k, v in data.items() if k != "columns"}
        if "user" in columns:
            kwargs["user_column"] = columns["user"]
        if "features" in columns:
            if not isinstance(columns["features"], list):
                raise ValueError("[users.columns]: option 'features' must be a list of column names")
            kwargs["features"] = tuple(columns["features"])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "format": self.format}
        for key in ("header", "delimiter"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.id_type != "auto":
            out["id_type"] = self.id_type
        out["columns"] = {"user": self.user_column, "features": list(self.features)}
        return out


def _table(where: str, value: Any) -> dict[str, Any]:
    """A TOML table as a dict; any other value is a ``ValueError`` naming the option."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a table; got {value!r}")
    return dict(value)


def _reject_unknown(where: str, data: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


@dataclass
class SourcesConfig:
    """A dataset: its name, its event sources (index = canonical ``source`` id) and a user table.

    ``base_dir`` is where relative paths resolve (the TOML's folder); ``origin`` is the TOML itself,
    kept only to name it in error messages.
    """

    name: str
    sources: list[SourceSpec]
    users: UserTableSpec | None = None
    base_dir: str = "."
    origin: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"dataset: option 'name' must be a non-empty string; got {self.name!r}")
        self.sources = list(self.sources)
        if not self.sources:
            raise ValueError("sources: at least one [[sources]] table is required")
        if len(self.sources) > MAX_SOURCES:
            raise ValueError(f"sources: at most {MAX_SOURCES} sources fit the int8 'source' column")
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"sources: option 'name' must be unique; repeated: {', '.join(dupes)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], base_dir: str = ".", origin: str | None = None) -> SourcesConfig:
        _reject_unknown("top level", data, {"dataset", "sources", "users"})
        dataset = _table("top level: option 'dataset'", data.get("dataset", {}))
        _reject_unknown("[dataset]", dataset, {"name"})
        raw_sources = data.get("sources", [])
        if not isinstance(raw_sources, list) or not all(isinstance(s, dict) for s in raw_sources):
            raise ValueError("sources: use [[sources]] tables (an array of tables)")
        sources = [SourceSpec.from_dict(dict(s), i) for i, s in enumerate(raw_sources)]
        users = UserTableSpec.from_dict(_table("top level: option 'users'", data["users"])) if "users" in data else None
        name = dataset.get("name", "dataset")
        return cls(name=name, sources=sources, users=users, base_dir=base_dir, origin=origin)

    @classmethod
    def from_toml(cls, path: str) -> SourcesConfig:
        """Read a source config from a local path or ``s3://`` URI; errors name the file."""
        try:
            text = storage.read_bytes(path).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: cannot read the source config: {exc}") from exc
        base_dir = path.rsplit("/", 1)[0] if storage.is_remote(path) else _local_dir(path)
        try:
            return cls.from_dict(tomllib.loads(text), base_dir=base_dir, origin=path)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: invalid TOML: {exc}") from exc
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dataset": {"name": self.name}, "sources": [s.to_dict() for s in self.sources]}
        if self.users is not None:
            out["users"] = self.users.to_dict()
        return out

    def to_toml(self) -> str:
        """TOML text that ``from_toml`` reads back to an equal config (paths stay as written)."""
        return dumps_toml(self.to_dict())

    def resolve(self, path: str) -> str:
        """A configured path made absolute against ``base_dir`` (URIs and absolute paths unchanged)."""
        return storage.resolve(path, self.base_dir)

    def source_index(self, name: str) -> int:
        for i, spec in enumerate(self.sources):
            if spec.name == name:
                return i
        raise KeyError(name)


def _local_dir(path: str) -> str:
    from pathlib import Path

    return str(Path(path).expanduser().absolute().parent)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_table(header: str, table: dict[str, Any]) -> list[str]:
    lines = [header] if header else []
    subtables = []
    for key, value in table.items():
        if isinstance(value, dict):
            subtables.append((key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    prefix = header.strip("[]") if header else ""
    for key, value in subtables:
        lines.append("")
        lines.extend(_toml_table(f"[{prefix}.{_toml_key(key)}]", value))
    return lines


def dumps_toml(data: dict[str, Any]) -> str:
    """A small TOML writer for the source-config shape (tables, arrays of tables, scalars, lists).

    The standard library reads TOML but does not write it, and the shape here is simple enough that
    a dependency is not worth it.
    """
    lines: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.extend(_toml_table(f"[{_toml_key(key)}]", value))
            lines.append("")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                lines.extend(_toml_array_item(key, item))
                lines.append("")
        else:
            lines.insert(0, f"{_toml_key(key)} = {_toml_value(value)}")
    return "\n".join(lines).rstrip() + "\n"


def _toml_array_item(key: str, item: dict[str, Any]) -> list[str]:
    lines = [f"[[{_toml_key(key)}]]"]
    subtables = []
    for sub, value in item.items():
        if isinstance(value, dict):
            subtables.append((sub, value))
        else:
            lines.append(f"{_toml_key(sub)} = {_toml_value(value)}")
    for sub, value in subtables:
        lines.append(f"[{_toml_key(key)}.{_toml_key(sub)}]")
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
    return lines
