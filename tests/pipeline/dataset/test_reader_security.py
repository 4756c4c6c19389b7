"""A reader that cannot be turned against its user: shard names from a crafted ``index.json`` (local
or on S3) never leave the dataset root or the cache, and the default cache directory is private."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import xxhash
from s3_upload import upload_tree

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.balance import BalanceConfig
from freescale.pipeline.config import PrepareConfig, SampleConfig
from freescale.pipeline.dataset.manifest import ManifestError
from freescale.pipeline.dataset.reader import CacheDirError, PreparedDataset, default_cache_dir
from freescale.pipeline.integrity import safe_relative_path
from freescale.pipeline.prepare import prepare

ESCAPE = "../../escape.mds"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> str:
    sources = tmp_path_factory.mktemp("tiny")
    generate(preset("tiny", seed=7), str(sources))
    out = str(tmp_path_factory.mktemp("security") / "ds")
    config = PrepareConfig(
        sources=str(sources / "sources.toml"),
        output=out,
        samples=SampleConfig(max_uih_len=256),
        balance=BalanceConfig(group_size=2, micro_batch_size=4, seed=1),
        workers=1,
        progress=False,
        memory_limit=512 * 2**20,
    )
    prepare(config)
    return out


def craft(root: Path, basename: str) -> None:
    """What an attacker who controls the dataset writes: the first shard renamed in ``index.json``
    (to a file that exists there), and a manifest whose file table agrees with the new index."""
    index = json.loads((root / "index.json").read_text())
    original = index["shards"][0]["raw_data"]["basename"]
    index["shards"][0]["raw_data"]["basename"] = basename
    data = json.dumps(index).encode()
    (root / "index.json").write_bytes(data)
    manifest = json.loads((root / "manifest.json").read_text())
    for entry in manifest.get("files", []):  # (none before file tables existed)
        if entry["path"] == "index.json":
            entry.update({"bytes": len(data), "xxh64": xxhash.xxh64(data).hexdigest()})
    (root / "manifest.json").write_text(json.dumps(manifest))
    target = (root / basename).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / original, target)


def read_all(dataset: PreparedDataset) -> None:
    for m in range(dataset.n_micro_batches):
        dataset.micro_batch(m)


@pytest.mark.parametrize(
    "name",
    ["../x.mds", "part-00000/../../x.mds", "/etc/passwd", "C:x.mds", "part\\x.mds", "", "./x.mds", "a//x.mds", None],
)
def test_unsafe_names_are_refused(name) -> None:
    with pytest.raises(ManifestError, match=r"index\.json: (unsafe )?file name"):
        safe_relative_path(name, "index.json")


def test_safe_names_pass() -> None:
    assert safe_relative_path("part-00000/shard.00000.mds", "index.json") == "part-00000/shard.00000.mds"


def test_crafted_local_index_is_refused(prepared, tmp_path) -> None:
    root = tmp_path / "a" / "b" / "ds"
    shutil.copytree(prepared, root)
    craft(root, ESCAPE)
    with pytest.raises(ManifestError, match=r"index\.json: shard 0 raw_data: unsafe file name '\.\./\.\./escape\.mds'"):
        read_all(PreparedDataset(str(root)))


def test_crafted_remote_index_is_refused_before_any_download(prepared, s3_bucket, tmp_path) -> None:
    import boto3

    staged = tmp_path / "staged" / "x" / "ds"
    shutil.copytree(prepared, staged)
    craft(staged, ESCAPE)  # also puts the shard at staged/../../escape.mds, uploaded as that key
    upload_tree(staged, s3_bucket, "prepared")
    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    client.upload_file(str(tmp_path / "staged" / "escape.mds"), s3_bucket, "prepared/../../escape.mds")
    client.upload_file(str(tmp_path / "staged" / "escape.mds"), s3_bucket, "escape.mds")
    home = tmp_path / "home"
    cache = home / "c" / "cache"
    with pytest.raises(ManifestError, match=r"unsafe file name '\.\./\.\./escape\.mds'"):
        read_all(PreparedDataset(f"s3://{s3_bucket}/prepared", cache_dir=str(cache)))
    written = [p for p in home.rglob("*") if p.is_file()]
    assert all(cache in p.parents for p in written), written
    assert not written  # refused before the index was even put into the cache


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_default_cache_dir_is_per_user_and_private(private_tmp) -> None:
    path = Path(default_cache_dir("s3://bucket/prepared"))
    assert path.is_dir() and path.parent == private_tmp / f"freescale-cache-{os.getuid()}"
    for directory in (path, path.parent):
        assert stat.S_IMODE(directory.stat().st_mode) & 0o077 == 0
        assert directory.stat().st_uid == os.getuid()
    assert default_cache_dir("s3://bucket/prepared") == str(path)  # the same place next time
    assert default_cache_dir("s3://bucket/other") != str(path)


def test_group_writable_cache_dir_is_refused(private_tmp) -> None:
    base = private_tmp / f"freescale-cache-{os.getuid()}"
    base.mkdir()
    base.chmod(0o777)
    with pytest.raises(CacheDirError, match=r"freescale-cache-\d+ is writable by other users \(mode 777\)"):
        default_cache_dir("s3://bucket/prepared")


def test_cache_dir_of_another_user_is_refused(private_tmp, monkeypatch) -> None:
    other = os.getuid() + 4242
    (private_tmp / f"freescale-cache-{other}").mkdir(mode=0o700)  # planted: owned by the real uid
    monkeypatch.setattr(os, "getuid", lambda: other)
    with pytest.raises(CacheDirError, match=rf"freescale-cache-{other} is owned by uid \d+, not by you"):
        default_cache_dir("s3://bucket/prepared")


def test_symlinked_cache_dir_is_refused(private_tmp) -> None:
    (private_tmp / "elsewhere").mkdir(mode=0o700)
    (private_tmp / f"freescale-cache-{os.getuid()}").symlink_to(private_tmp / "elsewhere")
    with pytest.raises(CacheDirError, match="is not a directory"):
        default_cache_dir("s3://bucket/prepared")
