"""``manifest.json`` parsed once into a typed ``Manifest``: the contract between ``prepare`` and its readers.

A prepared dataset travels between ``prepare`` (which writes it) and everything that reads it (the
loader, the trainer, evaluation, ``stats``, ``simulate``, ``freescale inspect``) as this one typed
object. A hand-edited or damaged manifest (a list instead of an object, a missing field, ``"8"``
where an integer belongs) fails here with one line naming the file and the field, instead of a
traceback in whichever reader first touched it; a manifest of an unknown (future) schema version is
refused in one line naming the file and the version. What is checked: every field a reader relies on
(layout, sample options, file and id tables, cost model) and the accounting and balance figures
``freescale inspect`` prints. Sections added by later versions (``files``, ``tables``, ``targets``)
are optional, as readers treat them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from freescale import __version__, storage
from freescale.pipeline.cost import CostModel
from freescale.pipeline.dataset.targets import TargetCoverage
from freescale.pipeline.jsonfields import Fields

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
OFFSETS_NAME = "micro_batch_offsets.npy"
INDEX_NAME = "index.json"


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
    """How the shards are laid out: step groups of ``group_size`` micro-batches (``layout``)."""

    group_size: int
    micro_batch_size: int
    mode: str
    strategy: str
    offsets_file: str
    user_features: tuple[str, ...]


@dataclass(frozen=True)
class SampleSpec:
    """How prepare cut the samples (``config.samples``): what a reader needs to interpret them."""

    max_uih_len: int | None  # prepare's --max-uih-len (None: not recorded)
    window_stride: int  # prepare's --window-stride: window w ends w·stride events before the last (0: one window)


@dataclass(frozen=True)
class EventCount:
    """Events rejected or filtered: the total and the count of each reason."""

    total: int
    by_reason: dict[str, int]


@dataclass(frozen=True)
class Rows:
    """The row accounting (``rows``): events in, events used, samples and micro-batches out."""

    events_read: int
    events_read_by_source: dict[str, int]
    events_used: int
    events_rejected: EventCount
    events_filtered: EventCount
    users: int
    users_table_rows_read: int
    users_table_rejected: dict[str, int]
    samples_without_profile: int
    samples: int
    micro_batches: int
    step_groups: int
    balanced: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BalanceReport:
    """The planner's predictions (``balance``) that readers print or compare against."""

    straggler_pct: dict[str, float]  # predicted per batching: random, within_step, plan
    straggler_pct_by_world_size: dict[str, Any]
    imbalance_max: float
    imbalance_mean: float
    max_over_lower_bound_max: float
    group_size: int | None  # the planner's own record of G
    n_step_groups: int | None
    n_micro_batches: int | None


@dataclass(frozen=True)
class Lengths:
    """UIH lengths of the samples (``lengths``)."""

    mean: float
    p99: float
    max: float


@dataclass(frozen=True)
class Manifest:
    """The typed fields of a prepared dataset's ``manifest.json`` (``where``: its URI)."""

    where: str
    schema_version: int
    fingerprint: str | None
    dataset: str  # the sources config's name
    source_names: tuple[str, ...]  # the source of each source file, in the manifest's order
    layout: Layout
    samples: SampleSpec
    balance_seed: int  # config.balance.seed: the plan's random choices
    planned_group_size: int | None  # config.balance.group_size: what the plan was made for
    rows: Rows
    balance: BalanceReport
    lengths: Lengths
    cost_model: CostModel
    tables: dict[str, TableEntry]
    files: tuple[FileEntry, ...] | None  # None: prepared before file tables existed
    targets: TargetCoverage | None  # what the model's window trains on (None: prepared before it was counted)

    @property
    def window_stride(self) -> int:
        """Prepare's window stride: window ``w`` of a user ends ``w·window_stride`` events before the
        last one (0: one window per user). The one place readers take it from."""
        return self.samples.window_stride

    def table_sizes(self) -> dict[str, int]:
        """Rows of each exact id table (``{}`` for a dataset prepared before vocabularies existed)."""
        return {table: entry.size for table, entry in self.tables.items()}

    def check_plan(self, n_micro_batches: int) -> None:
        """``layout.group_size`` (what readers schedule by) against the plan's own records of G and the
        micro-batch count of the offsets file: a hand-edited G would put micro-batches of different
        step groups into one step, unbalanced, without any other error. One line if they disagree."""
        g = self.layout.group_size
        records = {
            "config.balance.group_size": (self.planned_group_size, g),
            "balance.group_size": (self.balance.group_size, g),
            "rows.micro_batches": (self.rows.micro_batches, n_micro_batches),
            "rows.step_groups": (self.rows.step_groups, n_micro_batches // g),
            "balance.n_step_groups": (self.balance.n_step_groups, n_micro_batches // g),
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


def decode_manifest(uri: str, data: bytes) -> dict[str, Any]:
    """The JSON object in ``data`` (read from ``uri``); anything else is one line naming the file."""
    try:
        manifest = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ManifestError(f"{uri} is not valid JSON ({error}); truncated or edited?") from error
    return Fields(uri, manifest, ManifestError).data


def load_manifest(dataset: str) -> Manifest:
    """The manifest of the prepared dataset ``dataset`` (a directory or ``s3://`` prefix), parsed once;
    errors say what is wrong and where, in one line."""
    uri = storage.join(dataset, MANIFEST_NAME)
    if not storage.exists(dataset):
        raise ManifestError(f"prepared dataset {dataset} does not exist")
    if not storage.exists(uri):
        raise ManifestError(
            f"{uri} is missing: {dataset} is not a finished `freescale prepare` output "
            "(an interrupted job resumes when run again with the same options)"
        )
    return parse_manifest(decode_manifest(uri, storage.read_bytes(uri)), uri)


def check_schema_version(data: dict[str, Any], where: str) -> int:
    """The manifest's schema version, if this FreeScale reads it; else one line naming file and version."""
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{where} has schema_version {version!r}; this FreeScale ({__version__}) reads schema_version "
            f"{SCHEMA_VERSION}: re-run `freescale prepare` with this version"
        )
    return version


def parse_manifest(data: Any, where: str) -> Manifest:
    """``data`` (the decoded JSON of ``where``) as a ``Manifest``; a ``ManifestError`` names the field."""
    root = Fields(where, data, ManifestError)
    version = check_schema_version(data, where)
    config = root.child("config")
    balance = config.child("balance", default=None)
    manifest = Manifest(
        where=where,
        schema_version=version,
        fingerprint=root.value("fingerprint", "string", default=None),
        dataset=root.value("dataset", "string", default=""),
        source_names=_source_names(root),
        layout=_layout(root),
        samples=_samples(config),
        balance_seed=balance.value("seed", "integer", default=0) if balance else 0,
        planned_group_size=balance.value("group_size", "integer", minimum=1, default=None) if balance else None,
        rows=_rows(root),
        balance=_balance(root),
        lengths=Lengths(**{name: root.value(f"lengths.{name}", "number") for name in ("mean", "p99", "max")}),
        cost_model=_cost_model(root),
        tables=_tables(root),
        files=_files(root),
        targets=_targets(root),
    )
    manifest.check_plan(manifest.rows.micro_batches)  # the readers check again with the offsets file's count
    return manifest


def _layout(root: Fields) -> Layout:
    layout = root.child("layout")
    features = layout.value("user_features", "list", default=[])
    if not all(isinstance(name, str) for name in features):
        raise ManifestError(f"{root.where}: field 'layout.user_features' must be a list of strings")
    return Layout(
        group_size=layout.value("group_size", "integer", minimum=1),
        micro_batch_size=layout.value("micro_batch_size", "integer", minimum=1),
        mode=layout.value("mode", "string"),
        strategy=layout.value("strategy", "string"),
        offsets_file=layout.value("offsets_file", "string"),
        user_features=tuple(features),
    )


def _samples(config: Fields) -> SampleSpec:
    samples = config.child("samples", default=None)
    if samples is None:
        return SampleSpec(max_uih_len=None, window_stride=0)
    return SampleSpec(
        max_uih_len=samples.value("max_uih_len", "integer", minimum=2, default=None),
        window_stride=samples.value("window_stride", "integer", minimum=0, default=0),
    )


def _source_names(root: Fields) -> tuple[str, ...]:
    if "sources" not in root.data:
        return ()
    return tuple(entry.value("source", "string") for entry in root.items("sources"))


def _event_count(rows: Fields, name: str) -> EventCount:
    return EventCount(
        total=rows.value(f"{name}.total", "integer", minimum=0), by_reason=rows.counts(f"{name}.by_reason")
    )


def _rows(root: Fields) -> Rows:
    rows = root.child("rows")
    count = {
        name: rows.value(name, "integer", minimum=0) for name in ("events_read", "events_used", "users", "samples")
    }
    return Rows(
        **count,
        events_read_by_source=rows.counts("events_read_by_source"),
        events_rejected=_event_count(rows, "events_rejected"),
        events_filtered=_event_count(rows, "events_filtered"),
        users_table_rows_read=rows.value("users_table_rows_read", "integer", minimum=0, default=0),
        users_table_rejected=rows.counts("users_table_rejected") if "users_table_rejected" in rows.data else {},
        samples_without_profile=rows.value("samples_without_profile", "integer", minimum=0, default=0),
        micro_batches=rows.value("micro_batches", "integer", minimum=0),
        step_groups=rows.value("step_groups", "integer", minimum=0),
        balanced=rows.value("balanced", "boolean"),
    )


def _balance(root: Fields) -> BalanceReport:
    balance = root.child("balance")
    predicted = {name: balance.value(f"straggler_pct.{name}", "number") for name in ("random", "within_step", "plan")}
    return BalanceReport(
        straggler_pct={**balance.value("straggler_pct", "object"), **predicted},
        straggler_pct_by_world_size=balance.value("straggler_pct_by_world_size", "object", default={}),
        imbalance_max=balance.value("imbalance.max", "number"),
        imbalance_mean=balance.value("imbalance.mean", "number"),
        max_over_lower_bound_max=balance.value("max_over_lower_bound.max", "number"),
        group_size=balance.value("group_size", "integer", minimum=1, default=None),
        n_step_groups=balance.value("n_step_groups", "integer", minimum=0, default=None),
        n_micro_batches=balance.value("n_micro_batches", "integer", minimum=0, default=None),
    )


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
