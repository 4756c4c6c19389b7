"""``prepare`` interrupted and run again: killed (SIGKILL or Ctrl-C) while writing, at an exact point
of publishing or between parts, an ``s3://`` output left without its manifest, a job resumed on the
other engine. The rerun gives the uninterrupted run's bytes, re-checks what its markers describe, and
removes what the killed job left (work directories, lock files, temporary files) but not other
outputs' work. Real processes where it matters."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from prepare_cli import FREESCALE, TINY_OPTIONS, clean_prepare_files, cli_prepare, finish, output_files, wait_for
from prepare_configs import make_config

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.output import PrepareError
from freescale.pipeline.prepare import prepare


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
    return clean_prepare_files(kill_sources, str(tmp_path_factory.mktemp("kill-clean") / "ds"))


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


# --------------------------------------------------------------------------- stopped before the swap or between parts
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


# --------------------------------------------------------------------------- resumed on the other engine
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
