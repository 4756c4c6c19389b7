"""Manifests and cost models of the wrong JSON shape: one line naming the file and the field.

``manifest.json`` and cost-model files are edited by hand and truncated by full disks; each case here
used to be a traceback (``AttributeError``, ``KeyError``, ``TypeError``) or, worse, was accepted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from prepare_configs import make_config

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.cost import CostModel
from freescale.pipeline.dataset.manifest import ManifestError
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.prepare import prepare
from freescale.tools.cli import main as cli_main


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("shape-src")
    generate(preset("tiny", seed=11), str(out))
    return str(out / "sources.toml")


@pytest.fixture(scope="module")
def prepared(sources, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("shape") / "ds")
    prepare(make_config(sources, out))
    return out


@pytest.fixture
def copy(prepared, tmp_path) -> Path:
    target = tmp_path / "ds"
    shutil.copytree(prepared, target)
    return target


def edit(root: Path, change: Callable[[dict], object]) -> None:
    """Apply ``change`` to the manifest's JSON object (its return value, if any, replaces the whole)."""
    path = root / "manifest.json"
    manifest = json.loads(path.read_text())
    replaced = change(manifest)
    path.write_text(json.dumps(manifest if replaced is None else replaced))


def _set(path: str, value: object) -> Callable[[dict], None]:
    def change(manifest: dict) -> None:
        *parents, last = path.split(".")
        node = manifest
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


def _delete(path: str) -> Callable[[dict], None]:
    def change(manifest: dict) -> None:
        *parents, last = path.split(".")
        node = manifest
        for part in parents:
            node = node[part]
        del node[last]

    return change


CASES = [
    ("a list", lambda m: [m], r"the file must be a JSON object, got a list"),
    ("missing field", _delete("layout.group_size"), r"field 'layout\.group_size' is missing"),
    ("wrong type", _set("layout.group_size", "8"), r"field 'layout\.group_size' must be an integer >= 1, got \"8\""),
    ("section a list", _set("layout", []), r"field 'layout' must be a JSON object, got a list"),
    ("files an object", _set("files", {}), r"field 'files' must be a list, got an object"),
    ("file size a string", _set("files.0.bytes", "12"), r"field 'files\[0\]\.bytes' must be an integer >= 0"),
    ("table not an object", _set("tables.item", 5), r"field 'tables\.item' must be a JSON object, got 5"),
    ("cost coefficient", _set("cost_model.a", "x"), r"field 'cost_model\.a' must be a number >= 0"),
    ("negative stride", _set("config.samples.window_stride", -1), r"field 'config\.samples\.window_stride'"),
    ("rows a list", _set("rows", []), r"field 'rows' must be a JSON object"),
    ("count a float", _set("rows.events_read_by_source.clicks", 1.5), r"field 'rows\.events_read_by_source\.clicks'"),
    ("report figure", _set("balance.straggler_pct.plan", None), r"field 'balance\.straggler_pct\.plan'"),
]


@pytest.mark.parametrize(("name", "change", "message"), CASES, ids=[case[0] for case in CASES])
def test_a_manifest_of_the_wrong_shape_is_one_line_naming_file_and_field(copy, capsys, name, change, message) -> None:
    edit(copy, change)
    where = str(copy / "manifest.json")
    with pytest.raises(ManifestError, match=rf"^{where}: {message}"):
        PreparedDataset(str(copy))
    capsys.readouterr()
    assert cli_main(["inspect", str(copy)]) == 2  # not a traceback, and not accepted either
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"freescale inspect: error: {where}: ")


def test_a_truncated_manifest_is_named(copy, capsys) -> None:
    path = copy / "manifest.json"
    path.write_bytes(path.read_bytes()[:100])
    assert cli_main(["inspect", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} is not valid JSON" in err


def test_prepare_onto_a_damaged_manifest_says_so_and_overwrite_replaces_it(sources, copy, capsys) -> None:
    (copy / "manifest.json").write_text("[1, 2")
    args = ["prepare", "--sources", sources, "--output", str(copy), "--workers", "1", "--quiet",
            "--group-size", "4", "--micro-batch-size", "4", "--memory-limit", "512MB"]  # fmt: skip
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json is not valid JSON" in err and "pass --overwrite" in err
    assert cli_main([*args, "--overwrite"]) == 0
    assert PreparedDataset(str(copy)).group_size == 4


COST_CASES = [
    ("[1, 2]", r"the file must be a JSON object, got a list"),
    ('{"a": "1e-9", "b": 1}', r"field 'a' must be a number, got \"1e-9\""),
    ('{"a": 1, "b": true}', r"field 'b' must be a number, got true"),
    ('{"cost_model": [1]}', r"field 'cost_model' must be a JSON object, got a list"),
    ('{"a": 1, "b": 1, "units": 3}', r"field 'units' must be a string, got 3"),
    ('{"a": 1, "b": 1, "details": "x"}', r"field 'details' must be a JSON object"),
    ('{"a": 1, "b":', r"cannot parse"),
    ('{"a": 1, "b": 1, "units": "hours"}', r"cost_model\.units must be 'flops' or 'seconds'"),
]


@pytest.mark.parametrize(("content", "message"), COST_CASES)
def test_a_cost_model_of_the_wrong_shape_names_file_and_field(tmp_path, content, message) -> None:
    path = tmp_path / "cost.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"^--cost-model {path}: {message}"):
        CostModel.from_file(str(path))


def test_a_group_size_that_disagrees_with_the_plan_is_refused(copy, capsys) -> None:
    """Issue 30.4: ``layout.group_size`` decides which micro-batches share a step; edited alone, every
    step would mix micro-batches of two groups (unbalanced) without any other error."""
    manifest = json.loads((copy / "manifest.json").read_text())
    g, n = manifest["layout"]["group_size"], manifest["rows"]["micro_batches"]
    assert g == 4 and n % 2 == 0
    edit(copy, _set("layout.group_size", 2))
    where = copy / "manifest.json"
    with pytest.raises(ManifestError, match=rf"^{where}: layout.group_size 2 disagrees with the plan \("
                       r"config\.balance\.group_size is 4, expected 2"):  # fmt: skip
        PreparedDataset(str(copy))
    capsys.readouterr()
    assert cli_main(["inspect", str(copy)]) == 2
    assert "layout.group_size 2 disagrees with the plan" in capsys.readouterr().err
    # every record of G edited alike: the step-group count of the offsets file still tells
    for field in ("config.balance.group_size", "balance.group_size"):
        edit(copy, _set(field, 2))
    with pytest.raises(ManifestError, match=rf"rows\.step_groups is {n // 4}, expected {n // 2}"):
        PreparedDataset(str(copy))


def test_offsets_that_disagree_with_the_shards_micro_batch_column_are_refused(copy) -> None:
    """The shards record each row's micro-batch; offsets re-cut (and re-hashed in the manifest) so that
    rows move between micro-batches are named when read, not trained on as another plan."""
    import io

    import numpy as np
    import xxhash

    path = copy / "micro_batch_offsets.npy"
    offsets = np.load(path)
    offsets[1] += 1  # micro-batch 0 takes micro-batch 1's first row
    buffer = io.BytesIO()
    np.save(buffer, offsets)
    path.write_bytes(buffer.getvalue())

    def rehash(manifest: dict) -> None:
        entry = next(e for e in manifest["files"] if e["path"] == path.name)
        entry["bytes"], entry["xxh64"] = len(buffer.getvalue()), xxhash.xxh64(buffer.getvalue()).hexdigest()

    edit(copy, rehash)
    dataset = PreparedDataset(str(copy))
    with pytest.raises(ManifestError, match=rf"row {offsets[1] - 1} belongs to micro-batch 1 in the shards, but "
                       rf"{path.name} places it in micro-batch 0"):  # fmt: skip
        dataset.micro_batch(0)
