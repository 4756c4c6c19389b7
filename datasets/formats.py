"""How each source format lays out its files: container kind, delimiter, header, default columns.

Public benchmark formats (MovieLens, RecBole atomic files, Amazon reviews) have fixed layouts, so
their column mapping is built in and ``[sources.columns]`` only overrides it. Generic formats take
everything from the config. Keeping the table here lets readers treat every text format as
"delimited lines" or "JSON lines" and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import SourceSpec, UserTableSpec

__all__ = ["Layout", "layout_for", "movielens_variant", "user_layout"]

ML_NAMES = ("userId", "movieId", "rating", "timestamp")
ML_COLUMNS = {"user": "userId", "item": "movieId", "action": "rating", "timestamp": "timestamp"}
RECBOLE_COLUMNS = {"user": "user_id", "item": "item_id", "action": "rating", "timestamp": "timestamp"}
AMAZON_COLUMNS = {"user": "reviewerID", "item": "asin", "action": "overall", "timestamp": "unixReviewTime"}
#: ``delimiter`` stands for the multi-character MovieLens separator once lines are rewritten.
UNIT_SEPARATOR = "\x1f"


@dataclass(frozen=True)
class Layout:
    """Everything a reader needs about one file, resolved from the source spec and the file name.

    ``columns`` maps canonical keys to raw names; keys in ``optional`` fall back to defaults when
    the file lacks the column (a RecBole file without ratings), while any other absent column is a
    ``SourceError``. ``names`` gives positional names for files without a header line.
    """

    kind: str  # parquet | arrow | csv | json
    columns: dict[str, str]
    optional: frozenset[str] = frozenset()
    delimiter: str = ","
    header: bool = True
    typed_header: bool = False
    quoting: bool = True
    names: tuple[str, ...] | None = None
    id_types: dict[str, str] = field(default_factory=dict)
    action_mode: str = "default"  # map | number | default
    timestamp_unit: str = "s"
    typed_time_ok: bool = True  # typed temporal columns carry their own unit (Parquet/Arrow)

    @property
    def header_lines(self) -> int:
        return 1 if self.kind == "csv" and self.header else 0


def movielens_variant(spec: SourceSpec, file_name: str) -> str:
    """``dat`` (ratings.dat, ``::``), ``udata`` (u.data, tabs) or ``csv`` (ratings.csv with header)."""
    if spec.variant:
        return spec.variant
    lower = file_name.lower()
    if lower.endswith(".dat"):
        return "dat"
    if lower.endswith(".csv"):
        return "csv"
    return "udata"


def _movielens(spec: SourceSpec, file_name: str) -> dict:
    variant = movielens_variant(spec, file_name)
    if variant == "dat":
        return {"kind": "csv", "delimiter": "::", "header": False, "names": ML_NAMES, "quoting": False}
    if variant == "udata":
        return {"kind": "csv", "delimiter": "\t", "header": False, "names": ML_NAMES, "quoting": False}
    return {"kind": "csv", "delimiter": ",", "header": True}


def _generic(fmt: str, delimiter: str | None, header: bool | None) -> dict:
    if fmt in ("parquet", "arrow"):
        return {"kind": fmt}
    if fmt == "jsonl":
        return {"kind": "json"}
    tsv = fmt == "tsv"
    return {
        "kind": "csv",
        "delimiter": delimiter or ("\t" if tsv else ","),
        "header": True if header is None else header,
        "quoting": not tsv,
    }


def _defaults(spec: SourceSpec) -> tuple[dict[str, str], dict[str, str]]:
    """Default column mapping and id types of public formats (empty for generic ones)."""
    if spec.format == "movielens":
        return dict(ML_COLUMNS), {}
    if spec.format == "recbole":
        return dict(RECBOLE_COLUMNS), {}
    if spec.format == "amazon":
        return dict(AMAZON_COLUMNS), {"user": "string", "item": "string"}
    return {}, {}


def layout_for(spec: SourceSpec, file_name: str) -> Layout:
    """Resolve a source spec and one of its files into a reading layout."""
    if spec.format == "movielens":
        base = _movielens(spec, file_name)
    elif spec.format == "recbole":
        base = {"kind": "csv", "delimiter": "\t", "header": True, "typed_header": True, "quoting": False}
    elif spec.format == "amazon":
        base = {"kind": "json"}
    else:
        base = _generic(spec.format, spec.delimiter, spec.header)
    columns, id_types = _defaults(spec)
    optional = {"action"} if "action" in columns and "action" not in spec.columns else set()
    columns.update(spec.columns)
    id_types.update(spec.id_types)
    if spec.action_map and "action" in columns:
        action_mode = "map"
    elif "action" in columns:
        action_mode = "number"
    else:
        action_mode = "default"
    return Layout(
        columns=columns,
        optional=frozenset(optional),
        id_types=id_types,
        action_mode=action_mode,
        timestamp_unit=spec.timestamp_unit,
        typed_time_ok=base["kind"] in ("parquet", "arrow"),
        **base,
    )


def user_layout(spec: UserTableSpec) -> Layout:
    """The layout of a user table: the user column plus integer feature columns keyed by name."""
    columns = {"user": spec.user_column, **{name: name for name in spec.features}}
    base = _generic(spec.format, spec.delimiter, spec.header)
    return Layout(columns=columns, id_types={"user": spec.id_type}, **base)
