"""A run owns its checkpoints (issue 30): run ids, data and model records, the best-model record kept
with the checkpoints, refusals in one line before any rank starts, whole-or-nothing saves.

One 2-rank run (6 steps, validation every 3 steps, checkpoints after steps 3 and 6) serves the tests;
none of them writes into its folders. Processes run with cwd = a temp dir (see train_cli.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_cli import FREESCALE, MODEL, prepare_tiny, run_toml, train

from freescale.trainer.checkpoint_record import RECORD_NAME, read_record

pytestmark = pytest.mark.slow

COMMON = {"data": {"max_steps": 6}, "eval": {"max_users": 50, "every": 3}, "logging": {"log_every": 3}}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, str]:
    """Two tiny datasets with the same table sizes in the run config (num_items 1000) but other ids."""
    root = tmp_path_factory.mktemp("runs-data")
    return {"one": prepare_tiny(root / "one", seed=3), "other": prepare_tiny(root / "other", seed=5)}


@pytest.fixture(scope="module")
def trained(datasets, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("runs-trained")
    ckpt = root / "ckpt"
    config = run_toml(
        root / "run.toml", datasets["one"], root / "out", checkpoint={"dir": str(ckpt), "steps": [3]}, **COMMON
    )
    train(config, root)
    return {"root": root, "out": root / "out", "ckpt": ckpt, "config": config}


def refusal(config: str, cwd: Path, *args: str, command: str = "train") -> str:
    """Run ``freescale <command>`` that must be refused before any rank starts; returns its one line."""
    started = time.monotonic()
    result = subprocess.run(
        [FREESCALE, command, "--config", config, *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-4000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-4000:]
    assert time.monotonic() - started < 30  # refused by the launcher, not by the ranks
    return lines[0]


def test_every_checkpoint_carries_its_run_and_another_run_cannot_take_the_folder(trained, tmp_path) -> None:
    ckpt = trained["ckpt"]
    checkpoints = [ckpt / "step_00000003", ckpt / "step_00000006", *sorted((ckpt / "best").iterdir())]
    records = [read_record(path) for path in checkpoints]
    assert all(record is not None and record.run is not None for record in records), checkpoints
    (run_id,) = {record.run.run_id for record in records}
    assert [record.step for record in records[:2]] == [3, 6] and {r.world_size for r in records} == {2}
    evals = [json.loads(line) for line in (trained["out"] / "metrics.jsonl").read_text().splitlines()]
    assert records[1].run.evals == [line for line in evals if "eval" in line]  # the final evaluation included

    fresh = run_toml(tmp_path / "fresh.toml", records[0].run.data.path, tmp_path / "out", checkpoint={"dir": str(ckpt)})
    line = refusal(fresh, tmp_path, "--nproc", "2")
    assert f"checkpoint.dir {ckpt} is not empty" in line and f"run {run_id}" in line, line
    assert sorted(p.name for p in ckpt.iterdir()) == ["best", "step_00000003", "step_00000006"]  # untouched


def test_resume_refuses_another_world_size_model_or_data_in_one_line(trained, datasets, tmp_path) -> None:
    ckpt = trained["ckpt"]
    resume = {"dir": str(ckpt), "resume": "latest"}
    cases = [
        ({}, ["--nproc", "1"], "step_00000006 was written by 2 ranks, this run has 1"),
        ({"model": {**MODEL, "d_model": 64}}, [], "was trained with model.d_model = 32, this run has 64"),
        ({"model_extra": {"architecture": "sasrec"}}, [], "model_extra.architecture = 'hstu', this run has 'sasrec'"),
        ({"model": {**MODEL, "num_heads": 4}}, [], "model.num_heads = 2, this run has 4: its attention splits"),
        ({"model_extra": {"ids": "hashed"}}, [], "model_extra.ids = 'exact', this run has 'hashed': its item rows"),
        ({"data": {"path": datasets["other"]}}, [], "(other item ids); set checkpoint.allow_other_data = true"),
    ]
    for number, (tables, args, message) in enumerate(cases):
        data = {"max_steps": 6, **tables.pop("data", {})}  # the old launcher trained none: nothing written
        config = run_toml(
            tmp_path / f"r{number}.toml", datasets["one"], tmp_path / "out", checkpoint=resume, data=data, **tables
        )
        line = refusal(config, tmp_path, *(args or ["--nproc", "2"]))
        assert message in line, line
    evaluate = run_toml(tmp_path / "e.toml", datasets["other"], tmp_path / "out", checkpoint={"dir": str(ckpt)})
    line = refusal(evaluate, tmp_path, "--checkpoint", str(ckpt / "step_00000006"), "--nproc", "2", command="evaluate")
    assert "was trained on" in line and "(other item ids)" in line, line
    heads = run_toml(tmp_path / "h.toml", datasets["one"], tmp_path / "out", model={**MODEL, "num_heads": 4})
    line = refusal(heads, tmp_path, "--checkpoint", str(ckpt / "step_00000006"), "--nproc", "2", command="evaluate")
    assert "model.num_heads = 2, this run has 4" in line, line


def test_a_record_from_before_the_meaning_options_still_loads(trained) -> None:
    from dataclasses import replace

    from freescale.trainer.checkpoint_record import MEANING_OPTIONS, check_model

    run = read_record(trained["ckpt"] / "step_00000006").run
    older = replace(run, model={k: v for k, v in run.model.items() if k not in MEANING_OPTIONS})
    check_model(older, run.model, "checkpoint")


def test_fine_tuning_on_other_data_is_an_explicit_option(trained, datasets, tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    config = run_toml(
        tmp_path / "tune.toml", datasets["other"], tmp_path / "out", data={"max_steps": 8}, eval={"max_users": 0},
        checkpoint={"dir": str(ckpt), "resume": str(trained["ckpt"] / "step_00000006"), "allow_other_data": True},
    )  # fmt: skip
    result = train(config, tmp_path, "--nproc", "2")
    assert "resumed from" in result.stdout
    before, after = read_record(trained["ckpt"] / "step_00000006"), read_record(ckpt / "step_00000008")
    assert after.run.run_id == before.run.run_id  # the same run, continued on other data
    assert after.run.data.path == datasets["other"] and after.run.data.vocabularies != before.run.data.vocabularies


def test_a_resume_into_another_out_dir_keeps_the_best_model_record(trained, datasets, tmp_path) -> None:
    """The best-model record travels with the checkpoints: the resumed run (other logging.out_dir, same
    checkpoint.dir) selects over every evaluation since step 0, like the uninterrupted run."""
    ckpt = tmp_path / "ckpt"
    first = run_toml(
        tmp_path / "a.toml", datasets["one"], tmp_path / "a", checkpoint={"dir": str(ckpt)},
        **{**COMMON, "data": {"max_steps": 3}},
    )  # fmt: skip
    train(first, tmp_path)
    resumed = run_toml(
        tmp_path / "b.toml",
        datasets["one"],
        tmp_path / "b",
        checkpoint={"dir": str(ckpt), "resume": "latest"},
        **COMMON,
    )
    train(resumed, tmp_path)
    expected = json.loads((trained["out"] / "bubbles.json").read_text())
    got = json.loads((tmp_path / "b" / "bubbles.json").read_text())
    assert [point["step"] for point in got["protocol"]["history"]] == [3, 6]
    assert got["protocol"]["evaluations"] == expected["protocol"]["evaluations"] == 2
    for key in ("best_step", "validation", "test"):
        assert _without_seconds(got["protocol"][key]) == _without_seconds(expected["protocol"][key]), key
    best = expected["protocol"]["best_step"]
    assert [p.name for p in (ckpt / "best").iterdir()] == [f"step_{best:08d}"]
    assert got["protocol"]["best_checkpoint"] == str(ckpt / "best" / f"step_{best:08d}")
    assert [line["step"] for line in got["evals"]] == [3, 6]


def _without_seconds(value):
    if isinstance(value, dict):
        return {k: _without_seconds(v) for k, v in value.items() if k != "seconds"}
    return value


def _mount_namespace() -> list[str] | None:
    """``unshare`` arguments that give a process its own mount namespace, or None where none can be had."""
    if shutil.which("unshare") is None:
        return None
    for args in (["unshare", "--mount"], ["unshare", "--user", "--map-root-user", "--mount"]):
        probe = subprocess.run([*args, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
        if probe.returncode == 0:
            return args
    return None


def test_a_full_disk_during_a_save_leaves_no_partial_checkpoint(trained, datasets, tmp_path) -> None:
    """checkpoint.dir on a tmpfs with room for one checkpoint (a mount namespace of the run's own): the
    second save fails with one line naming the folder, and only the first, complete, checkpoint is left."""
    namespace = _mount_namespace()
    if namespace is None:
        pytest.skip("no mount namespace here (unshare --mount, with or without a user namespace): no small tmpfs")
    one = sum(f.stat().st_size for f in (trained["ckpt"] / "step_00000003").iterdir())
    mount, listing = tmp_path / "small", tmp_path / "listing.json"
    mount.mkdir()
    config = run_toml(
        tmp_path / "full.toml", datasets["one"], tmp_path / "out", data={"max_steps": 6}, eval={"max_users": 0},
        checkpoint={"dir": str(mount / "ckpt"), "steps": [3]},
    )  # fmt: skip
    script = (
        f"mount -t tmpfs -o size={int(1.5 * one) // 1024}k tmpfs {mount} || exit 99\n"
        f"{FREESCALE} train --config {config} --nproc 2; status=$?\n"
        f"{sys.executable} -c 'import json, os, sys; root = sys.argv[1]; "
        "print(json.dumps({d: sorted(os.listdir(os.path.join(root, d))) for d in os.listdir(root)}))' "
        f"{mount / 'ckpt'} > {listing}\n"
        "exit $status\n"
    )
    result = subprocess.run([*namespace, "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode not in (0, 99), result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]  # said once, by rank 0
    assert f"checkpoint step 6: no space left on the device holding {mount / 'ckpt'}" in errors[0], errors
    assert f"the last complete checkpoint is {mount / 'ckpt' / 'step_00000003'}" in errors[0]
    left = json.loads(listing.read_text())
    assert sorted(left) == ["step_00000003"], left  # no step_00000006, no partial directory
    assert {".metadata", RECORD_NAME} <= set(left["step_00000003"])


def test_resume_from_a_checkpoint_without_a_record_is_refused(trained, datasets, tmp_path) -> None:
    """A step directory with DCP's files but no run record (an older FreeScale) cannot be checked."""
    old = tmp_path / "old" / "step_00000006"
    shutil.copytree(trained["ckpt"] / "step_00000006", old)
    (old / RECORD_NAME).unlink(missing_ok=True)
    config = run_toml(
        tmp_path / "old.toml",
        datasets["one"],
        tmp_path / "out",
        checkpoint={"dir": str(tmp_path / "c"), "resume": str(old)},
    )
    line = refusal(config, tmp_path, "--nproc", "2")
    assert f"checkpoint.resume: {old} has no run record" in line, line


def test_leftovers_of_a_save_that_died_are_not_checkpoints(trained, tmp_path) -> None:
    """``latest`` never picks a partial directory, and the claim removes it (the lock is held)."""
    from freescale.trainer.checkpoint_dirs import resolve_resume
    from freescale.trainer.run_dir import claim_checkpoint_dir

    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"] / "step_00000003", ckpt / "step_00000003")
    shutil.copytree(trained["ckpt"] / "step_00000006", ckpt / ".step_00000009.partial")
    assert resolve_resume(str(ckpt), "latest") == str(ckpt / "step_00000003")
    claim_checkpoint_dir(str(ckpt), read_record(ckpt / "step_00000003").run.run_id)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000003"]
    with pytest.raises(ValueError, match="is not empty"):
        claim_checkpoint_dir(str(ckpt), None)


def test_a_checkpoint_folder_that_cannot_be_written_is_refused_before_any_step(tmp_path) -> None:
    """Found by a fault hunt: a read-only checkpoint.dir trained until the first save, then lost it all."""
    from freescale.trainer.run_dir import claim_checkpoint_dir

    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match=r"checkpoint.dir .*/file/ckpt cannot be written \(") as error:
        claim_checkpoint_dir(str(tmp_path / "file" / "ckpt"), None)
    assert "\n" not in str(error.value)
    readonly = tmp_path / "ro"
    readonly.mkdir()
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(readonly), str(readonly)], capture_output=True)
    if mounted.returncode:
        chmod = readonly.stat().st_mode
        readonly.chmod(0o500)
    try:
        if mounted.returncode and os.access(readonly, os.W_OK):
            pytest.skip("neither a read-only bind mount nor file modes keep this user from writing")
        with pytest.raises(ValueError, match="cannot be written"):
            claim_checkpoint_dir(str(readonly / "ckpt"), None)
        with pytest.raises(ValueError, match="cannot be written"):
            claim_checkpoint_dir(str(readonly), None)
    finally:
        if mounted.returncode:
            readonly.chmod(chmod)
        else:
            subprocess.run(["umount", str(readonly)], check=True)
    claim_checkpoint_dir(str(tmp_path / "fresh" / "ckpt"), None)  # absent: created, left empty
    assert list((tmp_path / "fresh" / "ckpt").iterdir()) == []
    (tmp_path / "fresh" / "ckpt" / ".freescale-write-check-123").write_bytes(b"")  # a check that died
    claim_checkpoint_dir(str(tmp_path / "fresh" / "ckpt"), None)
    assert list((tmp_path / "fresh" / "ckpt").iterdir()) == []


def _damage(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size // 2)
    else:  # a flipped bit in the middle: DCP would load the damaged value without a word
        with open(path, "r+b") as handle:
            handle.seek(path.stat().st_size // 2)
            byte = handle.read(1)[0]
            handle.seek(-1, 1)
            handle.write(bytes([byte ^ 0x10]))


def _damaged_copy(trained: dict, root: Path, name: str, how: str) -> Path:
    """``trained``'s checkpoints copied under ``root``, the latest one with file ``name`` damaged."""
    for step in ("step_00000003", "step_00000006"):
        shutil.copytree(trained["ckpt"] / step, root / step)
    _damage(root / "step_00000006" / name, how)
    return root / "step_00000006" / name


@pytest.mark.parametrize(("name", "how"), [("__1_0.distcp", "flipped"), ("__0_0.distcp", "truncated"),
                                           (".metadata", "truncated"), ("__1_0.distcp", "deleted")])  # fmt: skip
def test_a_damaged_checkpoint_file_is_refused_naming_it(trained, datasets, tmp_path, name: str, how: str) -> None:
    ckpt = tmp_path / "ckpt"
    damaged = _damaged_copy(trained, ckpt, name, how)
    config = run_toml(
        tmp_path / "r.toml", datasets["one"], tmp_path / "out", checkpoint={"dir": str(ckpt), "resume": "latest"}
    )
    line = refusal(config, tmp_path, "--nproc", "2")
    assert f"checkpoint.resume: {damaged} " in line and "the checkpoint is damaged" in line, line
    assert f'checkpoint.resume = "{ckpt / "step_00000003"}"' in line, line  # where to go on from
    line = refusal(config, tmp_path, "--checkpoint", str(ckpt / "step_00000006"), "--nproc", "2", command="evaluate")
    assert f"--checkpoint: {damaged} " in line, line


def test_a_damaged_checkpoint_without_file_hashes_fails_in_one_line(trained, datasets, tmp_path) -> None:
    """A record without ``files`` (written before they existed): the ranks' load fails in one line."""
    ckpt = tmp_path / "ckpt"
    _damaged_copy(trained, ckpt, "__0_0.distcp", "truncated")
    record = json.loads((ckpt / "step_00000006" / RECORD_NAME).read_text())
    del record["files"]
    (ckpt / "step_00000006" / RECORD_NAME).write_text(json.dumps(record))
    config = run_toml(
        tmp_path / "r.toml", datasets["one"], tmp_path / "out", checkpoint={"dir": str(ckpt), "resume": "latest"}
    )
    result = subprocess.run(
        [FREESCALE, "train", "--config", config, "--nproc", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"checkpoint {ckpt / 'step_00000006'} could not be read" in errors[0], errors
