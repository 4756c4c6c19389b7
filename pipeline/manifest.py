"""Writing ``manifest.json`` of a prepared dataset: identity, accounting, cost model and balance report.

The manifest is written last, so its presence means the dataset is complete. Readers parse it once into
the typed ``pipeline.dataset.manifest.Manifest`` (which also refuses a missing manifest or an unknown
schema version); this module is prepare's side: building it and checking an existing output's.
Nothing in it depends on wall-clock time, so identical inputs give an identical manifest.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from freescale import __version__, storage
from freescale.pipeline.dataset.manifest import (
    INDEX_NAME,
    MANIFEST_NAME,
    OFFSETS_NAME,
    SCHEMA_VERSION,
    ManifestError,
    decode_manifest,
)
from freescale.pipeline.integrity import check_index, file_table
from freescale.pipeline.jsonfields import Fields
from freescale.pipeline.steps.mds_encode import mds_columns

if TYPE_CHECKING:
    from freescale.datasets.config import SourcesConfig
    from freescale.pipeline.config import PrepareConfig
    from freescale.pipeline.cost import CostModel
    from freescale.pipeline.records import PartitionRecord, RowTotals, SamplePlan
    from freescale.pipeline.steps.scan import ScanSummary

QUARANTINE_NAME = "quarantine.jsonl"
RUNTIME_KEYS = ("runtime_s",)  # wall-clock figures: logged by prepare, never in the manifest
RUN_ONLY_OPTIONS = ("output", "work_dir", "progress", "overwrite", "executor", "ray_address")  # null in the manifest


def read_manifest_if_any(output: str, damaged_ok: bool = False) -> dict[str, Any] | None:
    """An existing output's manifest as a JSON object (None: there is none), for ``prepare`` to compare
    fingerprints. A damaged one is an error naming it, or ``{}`` with ``damaged_ok`` (``prepare
    --overwrite`` replaces it anyway)."""
    uri = storage.join(output, MANIFEST_NAME)
    if not storage.exists(uri):
        return None
    try:
        manifest = decode_manifest(uri, storage.read_bytes(uri))
        Fields(uri, manifest, ManifestError).value("fingerprint", "string")
    except ManifestError as error:
        if damaged_ok:
            return {}
        raise ManifestError(f"{error}; pass --overwrite to replace that dataset") from error
    return manifest


def published_files(output: str, extra: list[str] | tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The ``files`` table for a finished output (every file but the manifest): the root and part
    indexes, the offsets and quarantine files and ``extra`` (the vocabularies) hashed here, the shards
    from their index entries."""
    where = storage.join(output, INDEX_NAME)
    shards = check_index(storage.read_bytes(where), where)
    parts = sorted(
        {shard["raw_data"]["basename"].split("/")[0] for shard in shards if "/" in shard["raw_data"]["basename"]}
    )
    names = [INDEX_NAME, OFFSETS_NAME, QUARANTINE_NAME, *extra, *(f"{part}/{INDEX_NAME}" for part in parts)]
    return file_table(output, names, shards)


def _length_summary(lengths: np.ndarray) -> dict[str, float]:
    if len(lengths) == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return {
        "mean": float(lengths.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(lengths.max()),
    }


def _rows(
    summary: ScanSummary, users: dict[str, Any], samples: list[PartitionRecord], plan: SamplePlan, group_size: int
) -> dict[str, Any]:
    from freescale.pipeline.records import RowTotals

    rows = _event_rows(summary, users, RowTotals.of(samples))
    rows.update(
        samples=plan.n_samples,
        micro_batches=plan.n_micro_batches,
        step_groups=plan.n_micro_batches // group_size,
    )
    return rows


def no_sample_rows(summary: ScanSummary, users: dict[str, Any], filtered: dict[str, int]) -> dict[str, Any]:
    """The ``rows`` of a job left without samples (``output.NoSamplesError``): every valid event
    under a filter reason (``filtered``: kcore, min_len, ...), so the accounting balances all the same."""
    from freescale.pipeline.records import RowTotals

    rows = _event_rows(summary, users, RowTotals(0, filtered, 0, 0, 0))
    rows.update(samples=0, micro_batches=0, step_groups=0)
    return rows


def _event_rows(summary: ScanSummary, users: dict[str, Any], totals: RowTotals) -> dict[str, Any]:
    """The events' and the users table's accounting; ``balanced``: every event read is used,
    rejected or filtered (an error if not)."""
    filtered, used = dict(totals.filtered), totals.events_used
    if summary.outside_time_range:  # --time-range / --time-window: valid events of other times
        filtered["outside_time_range"] = summary.outside_time_range
    rows = {
        "events_read": summary.rows_read,
        "events_read_by_source": dict(sorted(summary.rows_read_by_source.items())),
        "events_used": used,
        "events_rejected": {"total": summary.rejected_total, "by_reason": dict(sorted(summary.rejected.items()))},
        "events_filtered": {"total": sum(filtered.values()), "by_reason": dict(sorted(filtered.items()))},
        "users": totals.users,
        "users_table_rows_read": users.get("rows_read", 0),
        "users_table_rejected": dict(sorted(users.get("rejected", {}).items())),
        "samples_without_profile": totals.samples_without_profile,
    }
    rows["balanced"] = rows["events_read"] == used + rows["events_rejected"]["total"] + rows["events_filtered"]["total"]
    if not rows["balanced"]:
        raise AssertionError(f"row accounting does not balance: {json.dumps(rows)}")
    return rows


class ManifestJob(Protocol):
    """What ``build_manifest`` reads of a prepare run (``prepare.PrepareJob`` has it): the manifest
    sits below the job that writes it, so it names the fields it needs instead of importing the job."""

    config: PrepareConfig
    sources: SourcesConfig
    cost_model: CostModel
    fingerprint: str
    source_files: list[dict[str, Any]]


def build_manifest(
    job: ManifestJob, summary: ScanSummary, users: dict[str, Any], samples: list[PartitionRecord], plan: SamplePlan
) -> dict[str, Any]:
    config = job.config
    return {
        "schema_version": SCHEMA_VERSION,
        "freescale_version": __version__,
        "created_by": "freescale prepare",
        "fingerprint": job.fingerprint,
        "dataset": job.sources.name,
        "sources": job.source_files,
        # where and how this run wrote are not the dataset's identity: identical runs, identical bytes
        "config": {**config.to_dict(), **dict.fromkeys(RUN_ONLY_OPTIONS)},
        "engine": config.executor,  # the executor (field name kept for readers): the only field the outputs differ in
        "rows": _rows(summary, users, samples, plan, config.balance.group_size),
        "cost_model": job.cost_model.to_dict(),
        "lengths": _length_summary(plan.length),
        "balance": {key: value for key, value in plan.report.items() if key not in RUNTIME_KEYS},
        "layout": {
            "group_size": config.balance.group_size,
            "micro_batch_size": config.balance.micro_batch_size,
            "mode": config.balance.mode,
            "strategy": config.balance.strategy,
            "offsets_file": OFFSETS_NAME,
            "columns": mds_columns(bool(users.get("features"))),
            "user_features": users.get("features", []),
            "row_order": "plan: micro-batch m holds rows [offsets[m], offsets[m+1]); group = m // group_size",
        },
    }
