"""The typed manifest (``pipeline.dataset.manifest``): parsed once, version checked, errors in one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from freescale.pipeline.dataset.manifest import (
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    SampleSpec,
    load_manifest,
    parse_manifest,
)

WHERE = "ds/manifest.json"


def minimal() -> dict[str, Any]:
    """The smallest manifest a reader accepts: 4 micro-batches in 2 step groups of 2."""
    counts = {"total": 0, "by_reason": {}}
    return {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": "f" * 16,
        "dataset": "tiny",
        "sources": [{"source": "clicks", "uri": "a.parquet"}, {"source": "users", "uri": "u.parquet"}],
        "config": {"samples": {"max_uih_len": 64, "window_stride": 32}, "balance": {"group_size": 2, "seed": 5}},
        "rows": {
            "events_read": 10,
            "events_read_by_source": {"clicks": 10},
            "events_used": 10,
            "events_rejected": counts,
            "events_filtered": counts,
            "users": 3,
            "samples": 4,
            "micro_batches": 4,
            "step_groups": 2,
            "balanced": True,
        },
        "cost_model": {"a": 1.0, "b": 2.0},
        "lengths": {"mean": 2.5, "p99": 4.0, "max": 4.0},
        "balance": {
            "straggler_pct": {"random": 9.0, "within_step": 3.0, "plan": 1.0},
            "imbalance": {"max": 1.1, "mean": 1.0},
            "max_over_lower_bound": {"max": 1.0},
        },
        "layout": {
            "group_size": 2,
            "micro_batch_size": 2,
            "mode": "equal_count",
            "strategy": "planned",
            "offsets_file": "micro_batch_offsets.npy",
        },
        "tables": {"item": {"size": 7, "file": "vocab/item.npy"}},
    }


def test_a_manifest_is_parsed_into_typed_sections() -> None:
    manifest = parse_manifest(minimal(), WHERE)
    assert isinstance(manifest, Manifest) and manifest.where == WHERE
    assert manifest.samples == SampleSpec(max_uih_len=64, window_stride=32) and manifest.window_stride == 32
    assert (manifest.layout.group_size, manifest.layout.user_features) == (2, ())
    assert (manifest.rows.samples, manifest.rows.events_rejected.total, manifest.balance_seed) == (4, 0, 5)
    assert manifest.source_names == ("clicks", "users") and manifest.table_sizes() == {"item": 7}
    assert manifest.files is None and manifest.targets is None  # sections of later versions are optional
    assert manifest.balance.straggler_pct["plan"] == 1.0 and manifest.cost_model.c == 0.0


def test_without_sample_options_there_is_one_window() -> None:
    data = minimal()
    del data["config"]["samples"]
    assert parse_manifest(data, WHERE).samples == SampleSpec(max_uih_len=None, window_stride=0)


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, "2", None])
def test_an_unknown_schema_version_is_refused_in_one_line(tmp_path: Path, version: object) -> None:
    data = minimal()
    data["schema_version"] = version
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError) as raised:
        load_manifest(str(tmp_path))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'manifest.json'} has schema_version {version!r};")
    assert f"reads schema_version {SCHEMA_VERSION}" in message


@pytest.mark.parametrize("field", ["layout.offsets_file", "rows.balanced", "lengths.p99", "cost_model.a"])
def test_a_missing_field_is_one_line_naming_it(field: str) -> None:
    data = copy.deepcopy(minimal())
    *parents, last = field.split(".")
    node = data
    for part in parents:
        node = node[part]
    del node[last]
    with pytest.raises(ManifestError) as raised:
        parse_manifest(data, WHERE)
    assert str(raised.value) == f"{WHERE}: field '{field}' is missing"
