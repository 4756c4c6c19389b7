"""Integrity of prepared data: the manifest's file table, damaged/missing files named on read,
``verify=False``, byte-identical outputs, ``freescale inspect --verify``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from prepare_configs import make_config
from s3_upload import upload_tree

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.config import PrepareConfig, SampleConfig
from freescale.pipeline.dataset.manifest import ManifestError
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.integrity import IntegrityError
from freescale.pipeline.prepare import prepare
from freescale.tools.cli import main as cli_main


def small_shards_config(sources: str, output: str) -> PrepareConfig:
    # a small shard size limit: several shards per part, so "the shard" in an error is a real choice
    return make_config(sources, output, samples=SampleConfig(max_uih_len=512), shard_size_limit=2**16)


@pytest.fixture(scope="module")
def tiny_sources(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tiny")
    generate(preset("tiny", seed=5), str(out))
    return str(out / "sources.toml")


@pytest.fixture(scope="module")
def prepared(tiny_sources, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("integrity") / "ds")
    prepare(small_shards_config(tiny_sources, out))
    return out


@pytest.fixture
def copy(prepared, tmp_path) -> Path:
    """A private copy of the prepared dataset that a test may damage."""
    target = tmp_path / "ds"
    shutil.copytree(prepared, target)
    return target


def read_all(dataset: PreparedDataset) -> list[dict]:
    return [sample for m in range(dataset.n_micro_batches) for sample in dataset.micro_batch(m)]


def shards(root: Path) -> list[Path]:
    return sorted(root.glob("part-*/shard.*.mds"))


def all_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_manifest_lists_every_published_file_with_size_and_hash(prepared) -> None:
    import xxhash

    root = Path(prepared)
    manifest = json.loads((root / "manifest.json").read_text())
    listed = {entry["path"]: entry for entry in manifest["files"]}
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(listed) == on_disk
    assert {"index.json", "micro_batch_offsets.npy", "quarantine.jsonl"} <= set(listed)
    assert len(shards(root)) >= 2
    for path, entry in listed.items():
        data = (root / path).read_bytes()
        assert entry["bytes"] == len(data) and entry["xxh64"] == xxhash.xxh64(data).hexdigest(), path


def test_identical_runs_give_byte_identical_outputs_manifest_included(tiny_sources, prepared, tmp_path) -> None:
    prepare(small_shards_config(tiny_sources, str(tmp_path / "again")))
    assert all_digests(tmp_path / "again") == all_digests(Path(prepared))


def test_flipped_byte_in_a_shard_is_named_and_verify_false_reads_it(copy) -> None:
    shard = shards(copy)[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x40  # the last sample's last scalar: still decodable
    shard.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=rf"{shard.parent.name}/{shard.name}: xxh64 hash mismatch"):
        read_all(PreparedDataset(str(copy)))
    assert (
        len(read_all(PreparedDataset(str(copy), verify=False)))
        == json.loads((copy / "manifest.json").read_text())["rows"]["samples"]
    )


def test_truncated_shard_is_named_on_open(copy) -> None:
    shard = shards(copy)[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    for verify in (True, False):
        with pytest.raises(ManifestError, match=rf"{shard.parent.name}/{shard.name}: size \d+ != \d+"):
            PreparedDataset(str(copy), verify=verify)


def test_damaged_shard_header_is_named_even_without_verify(copy) -> None:
    shard = shards(copy)[0]
    data = bytearray(shard.read_bytes())
    data[8:12] = b"\xff\xff\xff\x7f"  # the second sample's start offset
    shard.write_bytes(bytes(data))
    for verify in (True, False):
        with pytest.raises(ManifestError, match=rf"{shard.parent.name}/{shard.name}: damaged shard header"):
            read_all(PreparedDataset(str(copy), verify=verify))


def test_deleted_shard_is_named_as_missing(copy) -> None:
    shard = shards(copy)[1]
    shard.unlink()
    with pytest.raises(ManifestError, match=rf"{shard.parent.name}/{shard.name}: missing"):
        PreparedDataset(str(copy))


def test_edited_offsets_file_is_refused(copy) -> None:
    path = copy / "micro_batch_offsets.npy"
    offsets = np.load(path)
    offsets[1] += 1  # still a valid, same-size offsets array
    buffer = io.BytesIO()
    np.save(buffer, offsets)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(ManifestError, match=r"micro_batch_offsets.npy: xxh64 hash mismatch"):
        PreparedDataset(str(copy))


def test_edited_index_is_refused(copy) -> None:
    path = copy / "index.json"
    path.write_bytes(path.read_bytes().replace(b'"samples": ', b'"samples":  ', 1))
    with pytest.raises(ManifestError, match=r"index.json: size"):
        PreparedDataset(str(copy))


def test_dataset_without_file_table_reads_with_a_warning(copy) -> None:
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["files"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="no file table"):
        dataset = PreparedDataset(str(copy))
    assert len(read_all(dataset)) == manifest["rows"]["samples"]


def test_inspect_verify_checks_every_file(copy, capsys) -> None:
    assert cli_main(["inspect", str(copy), "--verify"]) == 0
    assert "verified" in capsys.readouterr().out
    quarantine = copy / "quarantine.jsonl"
    data = bytearray(quarantine.read_bytes() or b"\n")
    data[0] ^= 1
    quarantine.write_bytes(bytes(data))
    assert cli_main(["inspect", str(copy)]) == 0  # without --verify: the manifest only
    assert cli_main(["inspect", str(copy), "--verify"]) == 2
    error = capsys.readouterr().err
    assert "quarantine.jsonl" in error and error.count("\n") == 1


def test_verify_false_is_offered_where_datasets_are_opened() -> None:
    from freescale.pipeline.stats import StatsConfig
    from freescale.tools.cli import build_parser
    from freescale.trainer.loop_config import DataConfig

    assert build_parser().parse_args(["stats", "x", "--no-verify"]).no_verify
    assert StatsConfig(input="x", verify=False).verify is False
    assert DataConfig(path="x", verify=False).verify is False
    with pytest.raises(ValueError, match=r"data\.verify"):
        DataConfig(path="x", verify="no")


def test_damaged_cached_shard_of_a_remote_dataset_is_fetched_again_once(prepared, s3_bucket, tmp_path, monkeypatch):
    """Issue 30.5: a damaged cached copy of an ``s3://`` shard failed every rerun the same way. Now it
    is removed and downloaded once more; a copy damaged in object storage fails after that one retry,
    naming the cache path."""
    import boto3

    from freescale import storage

    uri, cache = upload_tree(prepared, s3_bucket, "prepared"), tmp_path / "cache"
    expected = read_all(PreparedDataset(uri, cache_dir=str(cache)))
    shard = shards(cache)[-1]
    good = shard.read_bytes()
    data = bytearray(good)
    data[-1] ^= 0x40
    shard.write_bytes(bytes(data))
    again = read_all(PreparedDataset(uri, cache_dir=str(cache)))  # the damaged copy is fetched again
    assert [s["user_id"] for s in again] == [s["user_id"] for s in expected] and shard.read_bytes() == good

    name = str(shard.relative_to(cache))
    boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"]).put_object(
        Bucket=s3_bucket, Key=f"prepared/{name}", Body=bytes(data)
    )  # the object itself damaged (same size, so the listing on open passes)
    shard.unlink()
    downloads: list[str] = []
    real = storage.download
    monkeypatch.setattr(storage, "download", lambda src, dst: (downloads.append(src), real(src, dst)))
    with pytest.raises(ManifestError, match=rf"{shard.name} \(cached as {shard}\): xxh64 hash mismatch.*also after "
                       r"the damaged cached copy was removed and downloaded again") as error:  # fmt: skip
        read_all(PreparedDataset(uri, cache_dir=str(cache)))
    assert "\n" not in str(error.value) and downloads.count(f"{uri}/{name}") == 2  # one retry, not a loop

    stale = json.loads((cache / "index.json").read_text())
    (cache / "index.json").write_text(json.dumps({**stale, "stale": True}))  # an older preparation's index
    boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"]).put_object(
        Bucket=s3_bucket, Key=f"prepared/{name}", Body=good
    )
    again = read_all(PreparedDataset(uri, cache_dir=str(cache)))  # stale index: its shards fetched again
    assert [s["user_id"] for s in again] == [s["user_id"] for s in expected]


def test_micro_batches_read_as_their_rows_across_shard_boundaries(prepared) -> None:
    """``micro_batch`` reads each shard's part of a micro-batch at once (``row_range``): its samples
    are the ones ``row`` decodes one by one, including micro-batches that span two shards."""
    dataset = PreparedDataset(prepared)
    spanning = 0
    for m in range(dataset.n_micro_batches):
        start, end = int(dataset.offsets[m]), int(dataset.offsets[m + 1])
        spanning += len(dataset.shards_of(m)) > 1
        for got, want in zip(dataset.micro_batch(m), [dataset.row(i) for i in range(start, end)], strict=True):
            assert got.keys() == want.keys()
            for key in got:
                assert type(got[key]) is type(want[key]) and np.array_equal(got[key], want[key])
    assert spanning  # the small shard size limit makes some micro-batches span two shards


def test_undecodable_sample_names_the_file_and_rows(copy) -> None:
    shard = shards(copy)[0]
    data = bytearray(shard.read_bytes())
    first = int.from_bytes(data[4:8], "little")  # where the shard's first sample starts
    data[first : first + 4] = (2**31).to_bytes(4, "little")  # its first column's size: past the sample
    shard.write_bytes(bytes(data))
    dataset = PreparedDataset(str(copy), verify=False)
    with pytest.raises(IntegrityError, match=rf"{shard.parent.name}/{shard.name}: cannot read rows 0\.\.\d+"):
        read_all(dataset)
