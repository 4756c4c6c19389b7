"""``prepare`` given a place it must not write to, refused in one line before any work: an output
that is, contains or reaches (through a bind mount) the sources or the work directory; an output that
is a file, in a read-only folder, or on a mount of its own; a work root other users can write to; an
output another run holds (the output lock). Real processes where it matters."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
from mounts import bind_mount
from prepare_cli import assert_one_line_error, cli_prepare, finish, wait_for
from prepare_configs import make_config

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.output import OutputLock, PrepareError, private_work_root
from freescale.pipeline.prepare import PrepareJob, prepare


# --------------------------------------------------------------------------- private work dir
def test_remote_output_work_dir_is_private_to_the_user(tiny_sources, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    root = private_work_root()
    assert root == tmp_path / f"freescale-prepare-{os.getuid()}"
    assert (root.stat().st_mode & 0o777) == 0o700
    job = PrepareJob(make_config(tiny_sources, "s3://bucket/prepared"))
    assert job.work.parent == root
    root.chmod(0o777)
    with pytest.raises(PrepareError, match="writable by other users"):
        PrepareJob(make_config(tiny_sources, "s3://bucket/prepared"))
    root.chmod(0o700)
    os.chown(root, 12345, 12345)
    with pytest.raises(PrepareError, match="belongs to uid 12345"):
        PrepareJob(make_config(tiny_sources, "s3://bucket/prepared"))


# --------------------------------------------------------------------------- overlap with the sources
@pytest.mark.parametrize("where", ["sources_dir", "parent", "config_file"])
def test_output_overlapping_the_sources_is_refused(tmp_path, where) -> None:
    src = tmp_path / "data" / "src"
    generate(preset("tiny", seed=3), str(src))
    before = sorted(p.name for p in src.rglob("*"))
    output = {"sources_dir": src, "parent": tmp_path / "data", "config_file": src / "sources.toml"}[where]
    code, err = finish(cli_prepare(str(src / "sources.toml"), str(output), "--overwrite"))
    assert_one_line_error(code, err, "--output", "contains the input")
    assert sorted(p.name for p in src.rglob("*")) == before


@pytest.mark.parametrize("alias", ["sources", "output"])
def test_output_reaching_the_sources_through_a_bind_mount_is_refused(tmp_path, alias) -> None:
    """A second path to the same directory (a bind mount, a second mount of the same export) is not
    told apart by path strings: the guard compares the output with every ancestor of every input by
    (st_dev, st_ino). ``alias``: which side names the files through the mount."""
    data = tmp_path / "data"
    generate(preset("tiny", seed=3), str(data / "src"))
    before = {p.name: p.stat().st_size for p in (data / "src").rglob("*")}
    with bind_mount(data, tmp_path / "mnt" / "alias") as mounted:
        inputs, outputs = (mounted, data) if alias == "sources" else (data, mounted)
        sources = str(inputs / "src" / "sources.toml")
        for output in (outputs / "src", outputs):  # the sources' folder, or a folder above it
            code, err = finish(cli_prepare(sources, str(output), "--overwrite"))
            assert_one_line_error(code, err, "--output", "contains the input")
        (outputs / "out").mkdir()
        work = str(inputs / "out" / "work")  # the work directory inside the output, named through the other path
        code, err = finish(cli_prepare(sources, str(outputs / "out"), "--overwrite", "--work-dir", work))
        assert_one_line_error(code, err, "--output", "contains the work directory")
    assert {p.name: p.stat().st_size for p in (data / "src").rglob("*")} == before


def test_an_output_beside_the_sources_on_the_same_file_system_is_accepted(tmp_path) -> None:
    """No mount and no link, so no second path: a sibling of the sources on the same device, whose path
    starts like theirs, is not mistaken for them (the identity check compares inodes, not devices)."""
    generate(preset("tiny", seed=3), str(tmp_path / "src"))
    output = tmp_path / "src-prepared"
    code, err = finish(cli_prepare(str(tmp_path / "src" / "sources.toml"), str(output), "--overwrite"))
    assert code == 0, err
    assert (output / "manifest.json").exists() and (tmp_path / "src" / "sources.toml").exists()


# --------------------------------------------------------------------------- work dir inside the output
def test_work_dir_inside_the_output_is_refused(tiny_sources, tmp_path) -> None:
    out = tmp_path / "ds"
    with pytest.raises(PrepareError, match="contains the work directory"):
        prepare(make_config(tiny_sources, str(out), work_dir=str(out / "work")))
    assert not out.exists()


# --------------------------------------------------------------------------- an output that is a file
def test_an_output_that_is_a_file_is_refused_before_any_work(tiny_sources, tmp_path) -> None:
    out = tmp_path / "ds"
    out.write_text("somebody's file")
    for options in ((), ("--overwrite",)):
        code, err = finish(cli_prepare(tiny_sources, str(out), *options))
        assert_one_line_error(code, err, str(out), "not a directory")
    assert out.read_text() == "somebody's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no work directory, staging or lock


# --------------------------------------------------------------------------- read-only places
def test_a_read_only_output_folder_is_one_line_naming_it(tiny_sources, tmp_path) -> None:
    """The lock, staging and work directories go beside the output: a read-only folder there is one
    line naming it, before any work (it was a traceback from the lock file)."""
    (tmp_path / "rw").mkdir()
    with bind_mount(tmp_path / "rw", tmp_path / "ro", read_only=True) as folder:
        code, err = finish(cli_prepare(tiny_sources, str(folder / "ds")))
        assert_one_line_error(code, err, "--output", str(folder), "Read-only file system")


@pytest.mark.parametrize("read_only", [True, False])
def test_an_output_that_cannot_be_replaced_is_refused_before_any_work(tiny_sources, tmp_path, read_only) -> None:
    """A dataset on a mount of its own (read-only or not) cannot be swapped out by a rename, nor a
    read-only one emptied: refused in one line before any work (the whole job used to run first, then
    end in a traceback). The dataset there still reads as up to date."""
    code, err = finish(cli_prepare(tiny_sources, str(tmp_path / "rw" / "ds")))
    assert code == 0, err
    with bind_mount(tmp_path / "rw" / "ds", tmp_path / "mnt" / "ds", read_only=read_only) as out:
        code, err = finish(cli_prepare(tiny_sources, str(out), "--micro-batch-size", "2", "--overwrite"))
        assert_one_line_error(code, err, f"--output {out}", "Read-only file system" if read_only else "mount point")
        assert sorted(p.name for p in out.parent.iterdir()) == ["ds"]  # no work was done
        code, err = finish(cli_prepare(tiny_sources, str(out)))
        assert code == 0, err


# --------------------------------------------------------------------------- two runs, one output
@contextlib.contextmanager
def stopped(proc: subprocess.Popen) -> Iterator[None]:
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_second_prepare_on_the_same_output_fails_at_once_naming_the_holder(tiny_sources, tmp_path) -> None:
    out = tmp_path / "ds"
    first = cli_prepare(tiny_sources, str(out), "--shard-size-limit", "64KB")
    wait_for(lambda: any(tmp_path.glob(".ds.freescale-work/*/scan")), first)  # it holds the lock by now
    with stopped(first):
        started = time.time()
        code, err = finish(cli_prepare(tiny_sources, str(out), "--overwrite"), timeout=60)
        assert time.time() - started < 30
        assert_one_line_error(code, err, "another run", f"pid {first.pid}")
    code, err = finish(first)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    index = json.loads((out / "index.json").read_text())
    assert all((out / shard["raw_data"]["basename"]).exists() for shard in index["shards"])
    assert manifest["rows"]["samples"] == sum(shard["samples"] for shard in index["shards"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no lock, staging or work left


def test_lock_is_exclusive_and_released(tmp_path) -> None:
    lock = OutputLock(tmp_path / "x.lock", "out")
    lock.acquire()
    with pytest.raises(PrepareError, match=f"pid {os.getpid()}"):
        OutputLock(tmp_path / "x.lock", "out").acquire()
    lock.release()
    assert not (tmp_path / "x.lock").exists()
    again = OutputLock(tmp_path / "x.lock", "out")
    again.acquire()
    again.release()
