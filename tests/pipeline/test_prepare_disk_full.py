"""``prepare`` on a full disk (ENOSPC) while scanning, writing shards, writing the plan or publishing:
one line (or a ``PrepareError``) naming the path, no partial temporary file left, and a rerun with
room gives the uninterrupted run's bytes. Real processes where it matters."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prepare_cli import assert_one_line_error, cli_prepare, finish, output_files
from prepare_configs import make_config

from freescale.pipeline.output import PrepareError
from freescale.pipeline.prepare import prepare


# --------------------------------------------------------------------------- disk full
@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(disk)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("phase", ["scan", "write"])
def test_disk_full_is_one_line_and_resumes(tiny_sources, clean_output, small_disk, tmp_path, phase) -> None:
    """The work directory on the full disk fills it while scanning; beside it on a roomy disk, only
    the shards fill it (a truncated shard is left). Either way: one line naming the path, and a rerun
    with room gives the uninterrupted run's bytes."""
    subprocess.run(["mount", "-o", "remount,size=96k", str(small_disk)], check=True)
    out = small_disk / "ds"
    options = ["--shard-size-limit", "64KB"]
    if phase == "write":
        options += ["--work-dir", str(tmp_path / "work")]
    code, err = finish(cli_prepare(tiny_sources, str(out), *options))
    expected = ".ds.freescale-staging-" if phase == "write" else ".ds.freescale-work"
    assert_one_line_error(code, err, "no space left", str(small_disk / expected))
    if phase == "write":
        assert list(small_disk.glob(".ds.freescale-staging-*/part-*/shard.*.mds"))
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    code, err = finish(cli_prepare(tiny_sources, str(out), *options))
    assert code == 0, err
    assert output_files(str(out)) == clean_output


def test_disk_full_in_process_names_the_path(tiny_sources, tmp_path, monkeypatch) -> None:
    """ENOSPC from any write of the job (here the plan) is a ``PrepareError`` naming the path."""
    from freescale.pipeline import prepare as prepare_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(prepare_module.np, "savez", full)
    with pytest.raises(PrepareError, match="no space left") as caught:
        prepare(make_config(tiny_sources, str(tmp_path / "ds")))
    assert str(tmp_path) in str(caught.value)
    monkeypatch.undo()
    assert prepare(make_config(tiny_sources, str(tmp_path / "ds")))["rows"]["samples"] > 0


# --------------------------------------------------------------------------- full while publishing
def test_a_full_disk_while_publishing_leaves_no_stray_file(tiny_sources, tmp_path, monkeypatch) -> None:
    """ENOSPC half-way through a publish file's temporary copy: the error names the path, the partial
    temporary file goes, and the rerun publishes exactly the reference's files."""
    from freescale import storage

    reference = prepare(make_config(tiny_sources, str(tmp_path / "reference")))

    class FillsUp:
        def __init__(self, handle) -> None:
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.handle.close()

        def write(self, data: bytes) -> int:
            self.handle.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.handle.name)

    def full_open(path, mode="r", *args, **kwargs):
        handle = open(path, mode, *args, **kwargs)  # noqa: SIM115
        return FillsUp(handle) if ".tmp-" in str(path) and Path(path).name.startswith("manifest.json") else handle

    monkeypatch.setattr(storage, "open", full_open, raising=False)
    out = tmp_path / "ds"
    with pytest.raises(PrepareError, match="no space left"):
        prepare(make_config(tiny_sources, str(out)))
    monkeypatch.undo()
    assert not list(tmp_path.rglob("*.tmp-*"))
    assert prepare(make_config(tiny_sources, str(out))) == reference
    assert output_files(str(out)) == output_files(str(tmp_path / "reference"))
