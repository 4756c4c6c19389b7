"""``prepare`` under faults: two runs on one output, a kill at any point, ``--overwrite`` next to the
sources, a full disk, corrupt input, a shared work directory. Real processes where it matters."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from mounts import bind_mount
from prepare_configs import make_config

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.output import OutputLock, PrepareError, private_work_root
from freescale.pipeline.prepare import PrepareJob, prepare

FREESCALE = str(Path(sys.executable).parent / "freescale")
TINY_OPTIONS = ["--group-size", "4", "--micro-batch-size", "4", "--max-uih-len", "2048", "--seed", "1"]


@pytest.fixture(scope="module")
def tiny_sources(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tiny")
    generate(preset("tiny", seed=3), str(out))
    return str(out / "sources.toml")


def cli_prepare(sources: str, out: str, *options: str, workers: int = 1) -> subprocess.Popen:
    command = [FREESCALE, "prepare", "--sources", sources, "--output", out, "--workers", str(workers), "--quiet"]
    return subprocess.Popen(
        [*command, *TINY_OPTIONS, *options],
        cwd=tempfile.gettempdir(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def output_files(directory: str) -> dict[str, bytes]:
    """Every file of an output by relative path; the manifest without the fields naming the run's
    own output path (the only thing two outputs of the same job may differ in)."""
    root = Path(directory)
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest["config"].pop("output", None)
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


@pytest.fixture(scope="module")
def clean_output(tiny_sources, tmp_path_factory) -> dict[str, bytes]:
    out = str(tmp_path_factory.mktemp("clean") / "ds")
    code, err = finish(cli_prepare(tiny_sources, out, "--shard-size-limit", "64KB"))
    assert code == 0, err
    return output_files(out)


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


# --------------------------------------------------------------------------- quarantine option
def test_quarantine_examples_is_a_cli_option(tmp_path) -> None:
    generate(preset("tiny", seed=5, malformed_fraction=0.05), str(tmp_path / "src"))
    out = tmp_path / "ds"
    proc = cli_prepare(str(tmp_path / "src" / "sources.toml"), str(out), "--quarantine-examples", "1")
    code, err = finish(proc)
    assert code == 0, err
    reasons = [json.loads(line)["reason"] for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert reasons and len(reasons) == len(set(reasons))  # one example per reason
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["quarantine_examples"] == 1
    assert max(manifest["rows"]["events_rejected"]["by_reason"].values()) > 1  # more were rejected
    code, err = finish(cli_prepare(str(tmp_path / "src" / "sources.toml"), str(out), "--quarantine-examples", "-1"))
    assert_one_line_error(code, err, "--quarantine-examples")


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


# --------------------------------------------------------------------------- corrupt input
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_corrupt_parquet_page_is_one_line_naming_the_file(tmp_path, engine) -> None:
    """Also from a Ray task: the step's own error, not Ray's wrapper with a remote traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 20_000
    table = pa.table({"u": np.arange(n) % 300, "i": np.arange(n) * 7 % 1000, "t": 1_600_000_000 + np.arange(n)})
    path = tmp_path / "log.parquet"
    pq.write_table(table, path, row_group_size=5000)
    column = pq.ParquetFile(path).metadata.row_group(2).column(1)
    data = bytearray(path.read_bytes())
    for k in range(column.data_page_offset, column.data_page_offset + 8):  # a data page, not the footer
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))
    assert pq.ParquetFile(path).metadata.num_rows == n  # the footer still reads
    (tmp_path / "sources.toml").write_text(
        '[dataset]\nname = "x"\n[[sources]]\nname = "log"\nformat = "parquet"\npath = "log.parquet"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\n'
    )
    # Ray: a limit that holds the runtime started for the job, so no sizing warning stands beside the error
    roomy = ("--memory-limit", "8GB") if engine == "ray" else ()
    code, err = finish(cli_prepare(str(tmp_path / "sources.toml"), str(tmp_path / "out"), "--executor", engine, *roomy))
    assert_one_line_error(code, err, str(path), "source 'log'")


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


# --------------------------------------------------------------------------- two runs, one output
def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"condition not reached; process ended with {proc.poll()}: {proc.stderr.read()[-2000:]}")


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


# --------------------------------------------------------------------------- killed while writing
def shard_files(root: Path) -> dict[Path, tuple[int, int]]:
    """Every shard under ``root`` (the output, staging directories) with its inode and mtime."""
    return {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in root.rglob("shard.*.mds")}


def kill_when_shards_appear(sources: str, out: Path, *options: str) -> None:
    """SIGKILL a CLI prepare as soon as it has written a shard (one not there before it started)."""
    before = shard_files(out.parent)

    def new_shard() -> bool:
        with contextlib.suppress(FileNotFoundError):  # a shard can vanish while listed
            return any(before.get(path) != ident for path, ident in shard_files(out.parent).items())
        return False

    proc = cli_prepare(sources, str(out), "--shard-size-limit", "64KB", *options)
    wait_for(new_shard, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def kill_sources(tmp_path_factory) -> str:
    """Tiny with 4,000 users: ~40 shards of 64KB, so a write phase lasts long enough to be killed in."""
    out = tmp_path_factory.mktemp("kill")
    generate(preset("tiny", seed=3, n_users=4000), str(out))
    return str(out / "sources.toml")


@pytest.fixture(scope="module")
def kill_clean_output(kill_sources, tmp_path_factory) -> dict[str, bytes]:
    out = str(tmp_path_factory.mktemp("kill-clean") / "ds")
    code, err = finish(cli_prepare(kill_sources, out, "--shard-size-limit", "64KB"))
    assert code == 0, err
    return output_files(out)


def test_killed_while_writing_resumes_to_identical_output(kill_sources, kill_clean_output, tmp_path) -> None:
    out = tmp_path / "ds"
    kill_when_shards_appear(kill_sources, out)
    assert not out.exists()  # written into a staging directory, published whole
    code, err = finish(cli_prepare(kill_sources, str(out), "--shard-size-limit", "64KB"))
    assert code == 0, err
    assert output_files(str(out)) == kill_clean_output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_overwrite_after_a_kill_while_writing(kill_sources, kill_clean_output, tmp_path) -> None:
    out = tmp_path / "ds"
    code, err = finish(cli_prepare(kill_sources, str(out), "--micro-batch-size", "2"))  # an older dataset
    assert code == 0, err
    kill_when_shards_appear(kill_sources, out, "--overwrite")
    assert json.loads((out / "manifest.json").read_text())["layout"]["micro_batch_size"] == 2  # still whole
    code, err = finish(cli_prepare(kill_sources, str(out), "--shard-size-limit", "64KB", "--overwrite"))
    assert code == 0, err
    assert output_files(str(out)) == kill_clean_output


# --------------------------------------------------------------------------- interrupted publish
KILLED_PREPARE = str(Path(__file__).resolve().parents[1] / "helpers" / "killed_prepare.py")


def killed_prepare(point: str, sig: str, sources: str, out: Path, *options: str) -> tuple[int, str]:
    """``cli_prepare`` in the harness that sends ``sig`` at ``point`` of publishing (``killed_prepare.py``)."""
    command = [sys.executable, KILLED_PREPARE, point, sig, "prepare", "--sources", sources, "--output", str(out)]
    proc = subprocess.Popen(
        [*command, "--workers", "1", "--quiet", *TINY_OPTIONS, *options],
        cwd=tempfile.gettempdir(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return finish(proc)


def verify(out: Path) -> None:
    check = subprocess.run([FREESCALE, "inspect", "--verify", str(out)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize(
    ("point", "sig"),
    [("after-publish", "KILL"), ("after-publish", "INT"), ("deleting-old", "KILL"), ("deleting-old", "INT")],
)
def test_an_interrupted_overwrite_run_again_publishes_the_new_dataset(
    tiny_sources, clean_output, tmp_path, point, sig
) -> None:
    """Killed (or Ctrl-C) right after the new dataset replaced the old one, or while the old one was
    being deleted: the same command again must publish the new dataset's own shards, whole. The old
    dataset once waited for deletion under the new job's staging name, and the rerun trusted its
    write markers and republished the old shards (or what was left of them) under the new manifest."""
    out = tmp_path / "ds"
    options = ("--shard-size-limit", "64KB")
    code, err = finish(cli_prepare(tiny_sources, str(out), *options, "--micro-batch-size", "2"))  # the old dataset
    assert code == 0, err
    code, err = killed_prepare(point, sig, tiny_sources, out, *options, "--overwrite")
    assert code != 0, f"{point} was never reached: {err[-2000:]}"
    assert json.loads((out / "manifest.json").read_text())["layout"]["micro_batch_size"] == 4  # swapped in
    assert not list(tmp_path.glob(".ds.freescale-staging-*"))  # the old dataset is not under the staging name
    code, err = finish(cli_prepare(tiny_sources, str(out), *options, "--overwrite"))
    assert code == 0, err
    assert output_files(str(out)) == clean_output
    verify(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


@pytest.mark.parametrize("found", ["another_dataset", "a_shard_missing", "a_shard_changed"])
def test_a_resumed_job_republishes_only_parts_its_markers_describe(tiny_sources, tmp_path, monkeypatch, found) -> None:
    """A job stopped just before its swap finds, when run again, other files in its staging directory
    than it wrote there: another dataset (what an interrupted ``--overwrite`` of an older release left
    under the staging name), a part with a shard gone (a deletion cut short) or a shard's bytes changed.
    Every part marked written is checked against its marker (index hash, shard sizes and hashes): the
    job starts over instead of publishing them under its own manifest."""
    from freescale.pipeline import output as places
    from freescale.pipeline.balance import BalanceConfig

    options = {"shard_size_limit": 64 * 1024}
    reference = prepare(make_config(tiny_sources, str(tmp_path / "reference"), **options))
    other = BalanceConfig(group_size=4, micro_batch_size=2, seed=1)
    prepare(make_config(tiny_sources, str(tmp_path / "other"), balance=other, **options))

    def stop(staging: Path, output: Path) -> None:
        raise KeyboardInterrupt  # killed just before the swap

    monkeypatch.setattr(places, "publish_local", stop)
    out = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        prepare(make_config(tiny_sources, str(out), **options))
    monkeypatch.undo()
    (staging,) = tmp_path.glob(".ds.freescale-staging-*")
    shards = sorted(staging.glob("part-00000/shard.*.mds"))
    assert len(shards) >= 2
    if found == "another_dataset":
        import shutil

        shutil.rmtree(staging)
        shutil.copytree(tmp_path / "other", staging)
    elif found == "a_shard_missing":
        shards[1].unlink()
    else:
        data = bytearray(shards[1].read_bytes())
        data[-1] ^= 0xFF  # same size, other bytes
        shards[1].write_bytes(bytes(data))
    assert prepare(make_config(tiny_sources, str(out), **options)) == reference
    assert output_files(str(out)) == output_files(str(tmp_path / "reference"))


# --------------------------------------------------------------------------- leftovers
def test_a_kill_before_the_manifest_rename_leaves_no_stray_file_in_the_resumed_dataset(
    tiny_sources, clean_output, tmp_path
) -> None:
    """The manifest's temporary file (``manifest.json.tmp-<pid>``) of a job killed just before renaming
    it stays in the staging directory; the resumed job publishes exactly the files its manifest lists."""
    out = tmp_path / "ds"
    code, err = killed_prepare("before-manifest", "KILL", tiny_sources, out, "--shard-size-limit", "64KB")
    assert code != 0, f"never reached: {err[-2000:]}"
    assert list(tmp_path.glob(".ds.freescale-staging-*/manifest.json.tmp-*"))
    code, err = finish(cli_prepare(tiny_sources, str(out), "--shard-size-limit", "64KB"))
    assert code == 0, err
    assert output_files(str(out)) == clean_output
    verify(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


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


def test_a_rerun_on_an_up_to_date_output_removes_the_killed_jobs_work(tiny_sources, tmp_path) -> None:
    """Killed right after its dataset was published, before it removed its work directory: the next
    run finds the output up to date and removes that work directory and its lock file too."""
    out = tmp_path / "ds"
    code, err = killed_prepare("after-publish", "KILL", tiny_sources, out)
    assert code != 0, f"never reached: {err[-2000:]}"
    assert (out / "manifest.json").exists() and (tmp_path / ".ds.freescale-work").exists()
    code, err = finish(cli_prepare(tiny_sources, str(out)))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_work_of_an_earlier_fingerprint_is_removed_after_a_source_edit(tmp_path) -> None:
    """A job killed before its swap, then a source edited: the fingerprint changed, so the new run has
    its own work directory; the old one (and its lock file, staging directory and output lock) goes."""
    generate(preset("tiny", seed=3), str(tmp_path / "src"))
    sources = str(tmp_path / "src" / "sources.toml")
    out = tmp_path / "out" / "ds"
    out.parent.mkdir()
    code, err = killed_prepare("before-manifest", "KILL", sources, out)
    assert code != 0, f"never reached: {err[-2000:]}"
    (work,) = (out.parent / ".ds.freescale-work").glob("*-w*[0-9]")
    edited = next(p for p in (tmp_path / "src").iterdir() if p.suffix != ".toml")
    os.utime(edited, ns=(edited.stat().st_atime_ns, edited.stat().st_mtime_ns + 10**9))
    code, err = finish(cli_prepare(sources, str(out)))
    assert code == 0, err
    assert not work.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["ds"]


def test_work_of_another_output_in_a_shared_work_dir_is_kept(tmp_path) -> None:
    """Only this output's stale work goes: a shared ``--work-dir`` holds other outputs' jobs too."""
    generate(preset("tiny", seed=3), str(tmp_path / "src"))
    sources = str(tmp_path / "src" / "sources.toml")
    shared = tmp_path / "work"
    code, err = killed_prepare("before-manifest", "KILL", sources, tmp_path / "a", "--work-dir", str(shared))
    assert code != 0, f"never reached: {err[-2000:]}"
    kept = sorted(p.name for p in shared.iterdir())
    code, err = finish(cli_prepare(sources, str(tmp_path / "b"), "--work-dir", str(shared), "--micro-batch-size", "2"))
    assert code == 0, err
    assert sorted(p.name for p in shared.iterdir()) == kept  # a's work, waiting for a's rerun


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


def test_work_dir_inside_the_output_is_refused(tiny_sources, tmp_path) -> None:
    out = tmp_path / "ds"
    with pytest.raises(PrepareError, match="contains the work directory"):
        prepare(make_config(tiny_sources, str(out), work_dir=str(out / "work")))
    assert not out.exists()


def test_parts_marked_written_but_gone_are_rebuilt(tiny_sources, tmp_path, monkeypatch) -> None:
    """A job stopped after writing its parts, whose staging directory was then removed: the markers
    say "written", the buckets are gone; the next run starts over instead of publishing a broken index."""
    from freescale.pipeline import output as places

    reference = prepare(make_config(tiny_sources, str(tmp_path / "reference")))

    def stop(staging: Path, output: Path) -> None:
        raise KeyboardInterrupt  # killed just before the swap

    monkeypatch.setattr(places, "publish_local", stop)
    out = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        prepare(make_config(tiny_sources, str(out)))
    monkeypatch.undo()
    staging = list(tmp_path.glob(".ds.freescale-staging-*"))
    assert len(staging) == 1 and list(tmp_path.glob(".ds.freescale-work/*/buckets/write.part-*.done"))
    import shutil

    shutil.rmtree(staging[0])
    assert prepare(make_config(tiny_sources, str(out))) == reference
    assert output_files(str(out)) == output_files(str(tmp_path / "reference"))


def test_s3_output_left_by_a_killed_job_is_resumed_not_refused(tiny_sources, s3_bucket, tmp_path) -> None:
    """An s3:// output is written in place: a killed job leaves parts without a manifest. The next run
    (with or without --overwrite) resumes into them instead of calling them somebody else's files."""
    import boto3

    out = f"s3://{s3_bucket}/prepared"
    first = prepare(make_config(tiny_sources, out, work_dir=str(tmp_path / "work")))
    client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    client.delete_object(Bucket=s3_bucket, Key="prepared/manifest.json")  # as if killed before publishing
    assert prepare(make_config(tiny_sources, out, work_dir=str(tmp_path / "work"))) == first
    client.delete_object(Bucket=s3_bucket, Key="prepared/manifest.json")
    again = prepare(make_config(tiny_sources, out, work_dir=str(tmp_path / "work"), overwrite=True))
    assert again == first
    client.put_object(Bucket=s3_bucket, Key="prepared/notes.txt", Body=b"somebody's file")
    client.delete_object(Bucket=s3_bucket, Key="prepared/manifest.json")
    with pytest.raises(PrepareError, match="no FreeScale manifest"):
        prepare(make_config(tiny_sources, out, work_dir=str(tmp_path / "work")))


def test_overwrite_after_a_kill_between_parts(tiny_sources, tmp_path, monkeypatch) -> None:
    """A job stopped after its first part was written (marker set), re-run with --overwrite: the
    first part's marker must not make the rerun skip a part it no longer has."""
    from freescale.pipeline import prepare_phases
    from freescale.pipeline.steps import writer

    monkeypatch.setattr(writer, "PART_SIZE", 7)
    monkeypatch.setattr(prepare_phases, "PART_SIZE", 7)
    reference = prepare(make_config(tiny_sources, str(tmp_path / "reference")))
    real_write_part = prepare_phases.write_part

    def write_one_part_then_die(*args):
        written = real_write_part(*args)
        if args[3] == 1:
            raise KeyboardInterrupt  # killed right after part 1 was marked written
        return written

    monkeypatch.setattr(prepare_phases, "write_part", write_one_part_then_die)
    out = str(tmp_path / "ds")
    with pytest.raises(KeyboardInterrupt):
        prepare(make_config(tiny_sources, out, overwrite=True))
    monkeypatch.setattr(prepare_phases, "write_part", real_write_part)
    assert prepare(make_config(tiny_sources, out, overwrite=True)) == reference
    assert output_files(out) == output_files(str(tmp_path / "reference"))


@pytest.fixture(scope="module")
def bucketed_sources(tmp_path_factory) -> str:
    """Tiny with 60,000 users (~1.5M events): at a 256MB limit the local executor's one writer gets
    ~0.7M events a bucket (3 buckets), a Ray runtime's writers ~5.6M (1 bucket)."""
    out = tmp_path_factory.mktemp("bucketed")
    generate(preset("tiny", seed=3, n_users=60_000), str(out))
    return str(out / "sources.toml")


def test_a_job_resumed_on_the_other_engine_keeps_its_write_buckets(bucketed_sources, tmp_path) -> None:
    """The engines size write buckets from different budgets (one local writer; every Ray CPU
    writing at once), and bucket files are numbered by that size: a job killed while writing on the
    local executor and resumed on Ray must read the buckets it has, not renumbered ones."""
    options = ("--memory-limit", "256MB", "--workers", "2")
    clean = tmp_path / "clean"
    code, err = finish(cli_prepare(bucketed_sources, str(clean), "--shard-size-limit", "64KB", *options))
    assert code == 0, err
    out = tmp_path / "killed" / "ds"  # its own parent: the shard watch lists this job's files, not clean's
    out.parent.mkdir()
    kill_when_shards_appear(bucketed_sources, out, *options)
    resumed = cli_prepare(bucketed_sources, str(out), "--shard-size-limit", "64KB", *options, "--executor", "ray")
    code, err = finish(resumed)
    assert code == 0, err
    resumed, expected = output_files(str(out)), output_files(str(clean))
    assert b'"engine": "ray"' in resumed.pop("manifest.json")  # the one field the executors differ in
    expected.pop("manifest.json")
    assert resumed == expected
