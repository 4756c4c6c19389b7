"""``manifest.json`` parsed once into a typed ``Manifest``: shape and types checked at the boundary.

A hand-edited or damaged manifest (a list instead of an object, a missing field, ``"8"`` where an
integer belongs) fails here with one line naming the file and the field, instead of a traceback in
whichever reader first touched it. What is checked: every field a reader of the dataset relies on
(layout, sample options, file and id tables, cost model) and the accounting ``freescale inspect``
prints. Sections added by later versions (``files``, ``tables``) are optional, as readers treat them.
``Manifest.raw`` keeps the JSON object for the readers of the report's other figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freescale.pipeline.cost import CostModel
from freescale.pipeline.jsonfields import Fields
from freescale.pipeline.targets import TargetCoverage


class ManifestError(ValueError):
    """A prepared dataset that cannot be read: missing manifest, unknown schema, broken layout."""


@dataclass(frozen=True)
class FileEntry:
    """One published file: path relative to the dataset, size and xxh64 (``integrity``)."""

    path: str
    bytes: int
    xxh64: str


@dataclass(frozen=True)
class TableEntry:
    """An exact id table: its row count and vocabulary file."""

    size: int
    file: str


@dataclass(frozen=True)
class Layout:
    group_size: int
    micro_batch_size: int
    mode: str
    strategy: str
    offsets_file: str
    user_features: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """The typed fields of a prepared dataset's ``manifest.json`` (``where``: its URI)."""

    where: str
    raw: dict[str, Any]
    schema_version: int
    fingerprint: str | None
    layout: Layout
    max_uih_len: int | None  # prepare's --max-uih-len (None: not recorded)
    window_stride: int
    planned_group_size: int | None  # config.balance.group_size: what the plan was made for
    micro_batches: int  # rows.micro_batches
    step_groups: int  # rows.step_groups
    cost_model: CostModel
    tables: dict[str, TableEntry]
    files: tuple[FileEntry, ...] | None  # None: prepared before file tables existed
    targets: TargetCoverage | None  # what the model's window trains on (None: prepared before it was counted)
    report_group_size: int | None = None  # balance.group_size: the planner's own record
    report_step_groups: int | None = None  # balance.n_step_groups

    def check_plan(self, n_micro_batches: int) -> None:
        """``layout.group_size`` (what readers schedule by) against the plan's own records of G and the
        micro-batch count of the offsets file: a hand-edited G would put micro-batches of different
        step groups into one step, unbalanced, without any other error. One line if they disagree."""
        g = self.layout.group_size
        records = {
            "config.balance.group_size": (self.planned_group_size, g),
            "balance.group_size": (self.report_group_size, g),
            "rows.micro_batches": (self.micro_batches, n_micro_batches),
            "rows.step_groups": (self.step_groups, n_micro_batches // g),
            "balance.n_step_groups": (self.report_step_groups, n_micro_batches // g),
        }
        if n_micro_batches % g:
            raise ManifestError(
                f"{self.where}: layout.group_size {g} does not divide the {n_micro_batches} micro-batches of "
                "the offsets file (hand-edited?); re-run `freescale prepare --overwrite`"
            )
        for name, (recorded, expected) in records.items():
            if recorded is not None and recorded != expected:
                raise ManifestError(
                    f"{self.where}: layout.group_size {g} disagrees with the plan ({name} is {recorded}, "
                    f"expected {expected} for {n_micro_batches} micro-batches in step groups of {g}; "
                    "hand-edited?); re-run `freescale prepare --overwrite` for another group size"
                )


def parse_manifest(data: Any, where: str) -> Manifest:
    """``data`` (the decoded JSON of ``where``) as a ``Manifest``; a ``ManifestError`` names the field."""
    root = Fields(where, data, ManifestError)
    layout = root.child("layout")
    features = layout.value("user_features", "list", default=[])
    if not all(isinstance(name, str) for name in features):
        raise ManifestError(f"{where}: field 'layout.user_features' must be a list of strings")
    samples = root.child("config").child("samples", default=None)
    balance = root.child("config").child("balance", default=None)
    _check_report(root)
    manifest = Manifest(
        where=where,
        raw=data,
        schema_version=root.value("schema_version", "integer"),
        fingerprint=root.value("fingerprint", "string", default=None),
        layout=Layout(
            group_size=layout.value("group_size", "integer", minimum=1),
            micro_batch_size=layout.value("micro_batch_size", "integer", minimum=1),
            mode=layout.value("mode", "string"),
            strategy=layout.value("strategy", "string"),
            offsets_file=layout.value("offsets_file", "string"),
            user_features=tuple(features),
        ),
        max_uih_len=samples.value("max_uih_len", "integer", minimum=2, default=None) if samples else None,
        window_stride=samples.value("window_stride", "integer", minimum=0, default=0) if samples else 0,
        planned_group_size=balance.value("group_size", "integer", minimum=1, default=None) if balance else None,
        micro_batches=root.value("rows.micro_batches", "integer", minimum=0),
        step_groups=root.value("rows.step_groups", "integer", minimum=0),
        cost_model=_cost_model(root),
        tables=_tables(root),
        files=_files(root),
        targets=_targets(root),
        report_group_size=root.value("balance.group_size", "integer", minimum=1, default=None),
        report_step_groups=root.value("balance.n_step_groups", "integer", minimum=0, default=None),
    )
    manifest.check_plan(manifest.micro_batches)  # the readers check again with the offsets file's count
    return manifest


def _check_report(root: Fields) -> None:
    """The accounting and balance figures ``freescale inspect`` (``tools.report``) prints."""
    rows = root.child("rows")
    for name in ("events_read", "events_used", "users", "samples"):
        rows.value(name, "integer", minimum=0)
    rows.counts("events_read_by_source")
    for section in ("events_rejected", "events_filtered"):
        rows.value(f"{section}.total", "integer", minimum=0)
        rows.counts(f"{section}.by_reason")
    rows.value("balanced", "boolean")
    for name in ("straggler_pct.random", "straggler_pct.within_step", "straggler_pct.plan", "imbalance.max",
                 "imbalance.mean", "max_over_lower_bound.max"):  # fmt: skip
        root.value(f"balance.{name}", "number")
    for name in ("mean", "p99", "max"):
        root.value(f"lengths.{name}", "number")


def _cost_model(root: Fields) -> CostModel:
    cost = root.child("cost_model")
    values = {name: cost.value(name, "number", minimum=0) for name in ("a", "b")}
    values["c"] = cost.value("c", "number", minimum=0, default=0.0)
    values["units"] = cost.value("units", "string", default="flops")
    values["origin"] = cost.value("origin", "string", default="analytic")
    values["details"] = cost.value("details", "object", default={})
    try:
        return CostModel(**values)
    except ValueError as error:
        raise ManifestError(f"{root.where}: field 'cost_model': {error}") from error


def _tables(root: Fields) -> dict[str, TableEntry]:
    tables = root.child("tables", default=None)
    if tables is None:
        return {}
    return {
        name: TableEntry(size=entry.value("size", "integer", minimum=0), file=entry.value("file", "string"))
        for name, entry in tables.entries().items()
    }


def _files(root: Fields) -> tuple[FileEntry, ...] | None:
    if "files" not in root.data:
        return None
    return tuple(
        FileEntry(
            path=entry.value("path", "string"),
            bytes=entry.value("bytes", "integer", minimum=0),
            xxh64=entry.value("xxh64", "string"),
        )
        for entry in root.items("files")
    )


def _targets(root: Fields) -> TargetCoverage | None:
    targets = root.child("targets", default=None)
    if targets is None:
        return None
    names = TargetCoverage.__dataclass_fields__
    return TargetCoverage(**{name: targets.value(name, "integer", minimum=0) for name in names})
