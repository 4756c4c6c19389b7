"""``model_extra.ids = "zch"`` end to end through ``freescale train`` (one rank, the tiny preset).

One 8-step run with a zero-collision item table far smaller than the catalogue (evictions every step),
user-profile tables (``[user_tables]``: an exact and a hashed profile feature, and a zero-collision
table of user ids smaller than the users) and a checkpoint after step 4; a second run resumes from
that checkpoint and must log the same losses and identity-table figures for its 4 steps, bit for bit
(with PEC, which ``overlap = auto`` picks on one rank with a spare core, the checkpoint is taken while
the next batch's lookup is already done).
Processes run with cwd = a temp dir (see train_cli.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from train_cli import FREESCALE, prepare_tiny, run_toml, run_train

pytestmark = pytest.mark.slow

ZCH = {"num_items": 0, "ids": "zch", "zch_size": 128, "zch_bucket_size": 16, "zch_max_probe": 8}
USER_TABLES = {
    "age_bucket": {},
    "country_id": {"ids": "hashed", "rows": 16},
    "user_id": {"ids": "zch", "zch_size": 64, "zch_bucket_size": 16, "zch_max_probe": 4},
}
COMMON = {
    "model_extra": ZCH,
    "user_tables": USER_TABLES,
    "eval": {"max_users": 40},
    "logging": {"log_every": 4},
    "engine": {"overlap": "pec"},
}


def lines(out: Path) -> dict[int, dict]:
    """The training steps' metrics lines (not the evaluation's), by step."""
    every = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return {line["step"]: line for line in every if "loss" in line}


def train_one_rank(config: str, cwd: Path) -> None:
    result = run_train(config, cwd, nproc=1)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("zch-run")
    data = prepare_tiny(root)
    ckpt = root / "ckpt"
    config = run_toml(
        root / "run.toml", data, root / "out", data={"max_steps": 8}, checkpoint={"dir": str(ckpt), "steps": [4]},
        **COMMON,
    )  # fmt: skip
    train_one_rank(config, root)
    return {"root": root, "data": data, "out": root / "out", "ckpt": ckpt, "config": config}


def test_zch_training_logs_the_identity_table_per_step_and_in_the_summary(straight) -> None:
    metrics = lines(straight["out"])
    assert sorted(metrics) == list(range(8))
    for step, line in metrics.items():
        item = line["zch"]["item"]
        assert item["lookups"] > 0 and 0 < item["occupancy"] <= 1, step
        total = item["hit_rate"] + item["insert_rate"] + item["collision_rate"]
        assert total == pytest.approx(1.0), step  # every lookup hits, takes a slot or falls back
    assert metrics[7]["zch"]["item"]["occupancy"] == 1.0
    users = [line["zch"]["user.user_id"] for line in metrics.values()]
    assert sum(u["insert_rate"] for u in users) > 0 and users[-1]["occupancy"] > 0  # its own identity table
    assert sum(line["zch"]["item"]["eviction_rate"] for line in metrics.values()) > 0
    report = json.loads((straight["out"] / "bubbles.json").read_text())
    assert report["training"]["ids"] == "zch" and report["summary"]["zch"]["item"]["evicted_mean_age"] > 0
    assert report["training"]["user_tables"]["user.age_bucket"] == {"ids": "exact", "rows": 7, "zch_size": 0}
    assert "zch user.user_id: " in (straight["out"] / "summary.txt").read_text()
    summary = (straight["out"] / "summary.txt").read_text()
    assert "zch item: " in summary and "ids zch (128 item rows)" in summary
    assert report["protocol"]["validation"]["users"] > 0  # full ranking over the items the table holds, read-only


def test_a_resumed_zch_run_continues_bit_for_bit(straight, tmp_path) -> None:
    config = run_toml(
        tmp_path / "resume.toml", straight["data"], tmp_path / "out", data={"max_steps": 8},
        checkpoint={"dir": str(straight["ckpt"]), "resume": str(straight["ckpt"] / "step_00000004"), "at_end": False},
        **{**COMMON, "eval": {"max_users": 0}},
    )  # fmt: skip
    train_one_rank(config, tmp_path)
    first, resumed = lines(straight["out"]), lines(tmp_path / "out")
    assert sorted(resumed) == [4, 5, 6, 7]
    for step in resumed:
        assert resumed[step]["loss"] == first[step]["loss"], step
        assert resumed[step]["zch"] == first[step]["zch"], step


def test_the_same_run_with_every_lookup_in_the_triton_kernel_logs_the_same_bits(
    straight, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA table's path (``FREESCALE_ZCH_KERNEL=1``: the whole call in the Triton kernel for the tables
    without admission) run on CPU through the interpreter: the 8 steps' losses and identity-table figures
    equal the straight run's (CPU host shortcuts) bit for bit, PEC's prefetched lookups included; and its
    step-4 checkpoint (taken while the next batch's lookup is done: the kernel's undo record) resumes on
    the CPU path into the straight run's last 4 steps."""
    for name, value in {
        "FREESCALE_ZCH_KERNEL": "1",
        "FREESCALE_ZCH_HOST_SHORTCUTS": "0",
        "TRITON_INTERPRET": "1",
    }.items():
        monkeypatch.setenv(name, value)
    config = run_toml(
        tmp_path / "kernel.toml", straight["data"], tmp_path / "out", data={"max_steps": 8},
        checkpoint={"dir": str(tmp_path / "ckpt"), "steps": [4], "at_end": False},
        **{**COMMON, "eval": {"max_users": 0}},
    )  # fmt: skip
    train_one_rank(config, tmp_path)
    for name in ("FREESCALE_ZCH_KERNEL", "FREESCALE_ZCH_HOST_SHORTCUTS", "TRITON_INTERPRET"):
        monkeypatch.delenv(name)
    resume = run_toml(
        tmp_path / "resume.toml", straight["data"], tmp_path / "resumed", data={"max_steps": 8},
        checkpoint={"dir": str(tmp_path / "ckpt"), "resume": str(tmp_path / "ckpt" / "step_00000004"), "at_end": False},
        **{**COMMON, "eval": {"max_users": 0}},
    )  # fmt: skip
    train_one_rank(resume, tmp_path)
    first, kernel, resumed = lines(straight["out"]), lines(tmp_path / "out"), lines(tmp_path / "resumed")
    assert sorted(kernel) == list(range(8)) and sorted(resumed) == [4, 5, 6, 7]
    for step, line in [*kernel.items(), *resumed.items()]:
        assert line["loss"] == first[step]["loss"], step
        assert line["zch"] == first[step]["zch"], step


def test_a_zch_tables_items_and_rows_rank_alike_on_its_own_dataset(straight, tmp_path) -> None:
    """Zero collisions: on the trained dataset every held slot is one catalogue item, so ranking the
    items (``eval.catalogue = "items"``, each routed through the read-only lookup) is ranking the rows."""
    checkpoint = str(straight["ckpt"] / "step_00000008")
    reports = {}
    for catalogue in ("items", "rows"):
        out = tmp_path / catalogue
        command = [FREESCALE, "evaluate", "--config", straight["config"], "--checkpoint", checkpoint, "--nproc", "1",
                   "--set", f'logging.out_dir="{out}"', "--set", f'eval.catalogue="{catalogue}"']  # fmt: skip
        result = subprocess.run(command, cwd=straight["root"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
        reports[catalogue] = json.loads((out / "evaluation.json").read_text())["test"]
    items, rows = reports["items"], reports["rows"]
    assert items["catalogue"] == "items" and rows["catalogue"] == "rows" and items["users"] > 0
    assert (items["hr@10"], items["ndcg@10"]) == (rows["hr@10"], rows["ndcg@10"])


def test_tables_that_evict_nothing_train_the_same_bits_whatever_their_layout(straight, tmp_path) -> None:
    """An id's first row is keyed by the id, not by the slot its table gave it: two item tables of other
    sizes and bucket layouts that both hold every id (no eviction) place ids in other rows and train the
    same losses, bit for bit, through PEC's prefetched resets."""
    runs = {}
    for name, layout in {"small": {"zch_size": 4096, "zch_bucket_size": 64, "zch_max_probe": 64},
                         "large": {"zch_size": 8192, "zch_bucket_size": 128, "zch_max_probe": 32}}.items():  # fmt: skip
        config = run_toml(
            tmp_path / f"{name}.toml", straight["data"], tmp_path / name, data={"max_steps": 6},
            **{**COMMON, "model_extra": {**ZCH, **layout}, "user_tables": {}, "eval": {"max_users": 0}},
        )  # fmt: skip
        train_one_rank(config, tmp_path)
        runs[name] = lines(tmp_path / name)
    small, large = runs["small"], runs["large"]
    assert sorted(small) == sorted(large) == list(range(6))
    for step in small:
        assert small[step]["zch"]["item"]["eviction_rate"] == large[step]["zch"]["item"]["eviction_rate"] == 0
        assert small[step]["loss"] == large[step]["loss"], step


def test_evaluating_a_zch_checkpoint_on_other_ranks_is_refused_in_one_line(straight) -> None:
    checkpoint = str(straight["ckpt"] / "step_00000008")
    command = [FREESCALE, "evaluate", "--config", straight["config"], "--checkpoint", checkpoint, "--nproc", "2"]
    result = subprocess.run(command, cwd=straight["root"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert "was written by 1 ranks: a model_extra.ids 'zch' table" in line and "--nproc 1" in line


def test_a_user_table_the_dataset_cannot_feed_is_refused_in_one_line(straight, tmp_path) -> None:
    config = run_toml(
        tmp_path / "bad.toml", straight["data"], tmp_path / "out", user_tables={"income": {}}, data={"max_steps": 2}
    )
    result = run_train(config, tmp_path, nproc=1)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("freescale train: error: user_tables.income: ")
    assert "no user-profile feature 'income'" in line
    assert "['age_bucket', 'country_id']" in line
