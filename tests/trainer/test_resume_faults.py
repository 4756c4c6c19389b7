"""Resuming after a fault: checkpoint trust (folders others can write), metrics on resume (each step
once; none missing after a kill; a line torn by a kill).

Multi-rank cases start ``freescale train`` with 2 gloo ranks on the ``tiny`` preset (``train_cli``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest


def fake_checkpoint(root: Path, step: int) -> Path:
    path = root / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"not really")
    (path / "__0_0.distcp").write_bytes(b"")
    for entry in (root, path, path / ".metadata", path / "__0_0.distcp"):
        entry.chmod(0o755 if entry.is_dir() else 0o644)
    return path


def test_resume_refuses_checkpoints_others_can_write(tmp_path) -> None:
    from freescale.trainer.checkpoint_dirs import resolve_resume

    path = fake_checkpoint(tmp_path / "ckpt", 3)
    assert resolve_resume(str(tmp_path / "ckpt"), "latest") == str(path)
    (path / ".metadata").chmod(0o666)
    with pytest.raises(ValueError, match=r"\.metadata is writable by group/other \(mode 666\)"):
        resolve_resume(str(tmp_path / "ckpt"), "latest")
    (path / ".metadata").chmod(0o644)
    path.chmod(0o775)
    with pytest.raises(ValueError, match=r"step_00000003 is writable by group/other"):
        resolve_resume(str(tmp_path / "ckpt"), str(path))
    path.chmod(0o755)
    if os.getuid() == 0:  # root can hand the file to another user
        os.chown(path / "__0_0.distcp", 65534, 65534)
        with pytest.raises(ValueError, match=r"__0_0\.distcp is owned by uid 65534, not by this user"):
            resolve_resume(str(tmp_path / "ckpt"), str(path))


@pytest.mark.slow
def test_resume_into_the_same_out_dir_writes_each_step_once(tiny_dataset, tmp_path) -> None:
    from train_cli import run_toml, train

    ckpt = tmp_path / "ckpt"
    tables = {"data": {"max_steps": 6}, "eval": {"max_users": 0}, "logging": {"log_every": 2}}
    first = run_toml(
        tmp_path / "a.toml",
        tiny_dataset,
        tmp_path / "out",
        checkpoint={"dir": str(ckpt), "steps": [3], "at_end": False},
        **tables,
    )
    train(first, tmp_path)
    second = run_toml(
        tmp_path / "b.toml",
        tiny_dataset,
        tmp_path / "out",
        checkpoint={"dir": str(ckpt), "resume": "latest", "at_end": False},
        **tables,
    )
    train(second, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == list(range(6))


@pytest.mark.slow
def test_no_step_before_a_checkpoint_is_missing_from_metrics_after_a_kill(tiny_dataset, tmp_path) -> None:
    """A run killed between log flushes, resumed from its latest checkpoint: the steps before that
    checkpoint were logged with it, so every step is in ``metrics.jsonl`` once."""
    from train_cli import FREESCALE, run_toml, train

    from freescale.trainer.checkpoint_dirs import finished_steps

    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    tables = {"eval": {"max_users": 0}, "logging": {"log_every": 1000}}
    config = run_toml(
        tmp_path / "run.toml",
        tiny_dataset,
        out,
        data={"max_steps": 1_000_000},
        checkpoint={"dir": str(ckpt), "every": 2},
        **tables,
    )
    launcher = subprocess.Popen([FREESCALE, "train", "--config", config, "--nproc", "2"], cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not (ckpt / "step_00000004").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, "no checkpoint of step 4"
        time.sleep(0.1)
    launcher.kill()
    launcher.wait(timeout=30)
    time.sleep(2)  # the ranks end with the launcher (test_ranks_end_with_the_launcher)
    latest = finished_steps(str(ckpt))[-1]
    resumed = ["--set", "checkpoint.resume='latest'", "--set", f"data.max_steps={latest + 2}"]
    train(config, tmp_path, *resumed)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == list(range(latest + 2))


def test_resume_drops_a_metrics_line_torn_by_a_kill(tmp_path) -> None:
    from freescale.trainer.run_logs import keep_metrics_before

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": step, "loss": 1.0}) for step in range(4)]
    path.write_text("\n".join([*lines, lines[0][:9]]))  # the killed run's last append, cut short
    assert keep_metrics_before(path, 2) == 1
    assert path.read_text().splitlines() == lines[:2]
