"""Streaming windows (trainer/continuation.py, docs/training.md#streaming-windows): a run trained on window 0
of a churned stream continues onto window 1 from its checkpoint, keeping the zch item table, its identity
table and the optimizers; evaluation scores the next window's users; what cannot carry over is refused in
one line before any rank starts.

The stream: the ``tiny`` preset over 2 days with items renewed every day, prepared with ``--time-window 1d``
(3 windows: the first and last are part days). One rank throughout. Processes run with cwd = a temp dir
(see train_cli.py).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from train_cli import FREESCALE, prepare_tiny_windows, run_toml, run_train

from freescale.pipeline.dataset import loader
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.trainer.checkpoint_record import DataIdentity, RunRecord, check_model, model_options, read_record
from freescale.trainer.config import RunConfig
from freescale.trainer.continuation import check_continuation, check_eval_data
from freescale.trainer.learning_config import ModelExtraConfig
from freescale.trainer.loop_config import DataConfig
from freescale.trainer.table_config import UserTableConfig

ZCH = {"num_items": 0, "ids": "zch", "zch_size": 128, "zch_bucket_size": 16, "zch_max_probe": 8}
COMMON = {"model_extra": ZCH, "logging": {"log_every": 2}}


def step_lines(out: Path) -> dict[int, dict]:
    every = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return {line["step"]: line for line in every if "loss" in line}


def eval_lines(out: Path) -> list[dict]:
    return [line for line in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval" in line]


def train_one_rank(config: str, cwd: Path) -> subprocess.CompletedProcess:
    result = run_train(config, cwd, nproc=1)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def refusal(config: str, cwd: Path) -> str:
    """``freescale train`` refused by the launcher: its one line."""
    result = run_train(config, cwd, nproc=1, timeout=60)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-4000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-4000:]
    return lines[0]


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> dict:
    """Window 0 trained 4 steps (zch, evaluated on window 1's users), then continued onto window 1 for 4."""
    root = tmp_path_factory.mktemp("zch-windows")
    windows = prepare_tiny_windows(root)
    ckpt = root / "ckpt"
    first = run_toml(
        root / "w0.toml", windows[0], root / "out0", data={"max_steps": 4}, checkpoint={"dir": str(ckpt)},
        eval={"max_users": 40, "data_path": windows[1]}, **COMMON,
    )  # fmt: skip
    train_one_rank(first, root)
    resume = {"dir": str(ckpt), "resume": "latest", "continue_on_new_data": True, "steps": [6]}
    second = run_toml(
        root / "w1.toml", windows[1], root / "out1", data={"max_steps": 4}, checkpoint=resume,
        eval={"max_users": 40}, **COMMON,
    )  # fmt: skip
    result = train_one_rank(second, root)
    return {"root": root, "windows": windows, "ckpt": ckpt, "second": second, "stdout": result.stdout}


@pytest.mark.slow
def test_a_run_continues_onto_the_next_window_with_its_tables(stream) -> None:
    first, second = step_lines(stream["root"] / "out0"), step_lines(stream["root"] / "out1")
    assert sorted(first) == [0, 1, 2, 3] and sorted(second) == [4, 5, 6, 7]  # the step counter goes on
    assert f"continuing onto {stream['windows'][1]} from its first step" in stream["stdout"]
    assert first[3]["zch"]["item"]["occupancy"] == 1.0
    item = second[4]["zch"]["item"]
    # a fresh table holds at most the step's own lookups; the carried one is still full and still hits
    assert item["lookups"] < 128 and item["occupancy"] == 1.0, item
    assert item["hit_rate"] > 0 and item["eviction_rate"] > 0, item
    record = read_record(stream["ckpt"] / "step_00000008")
    before = read_record(stream["ckpt"] / "step_00000004")
    assert record.run.run_id == before.run.run_id and record.run.data.path == stream["windows"][1]
    assert (before.run.data_start, record.run.data_start) == (0, 4)
    assert [line["step"] for line in record.run.evals] == [8]  # best-model selection: this window's evaluations


@pytest.mark.slow
def test_a_continued_run_resumes_inside_its_window_bit_for_bit(stream, tmp_path) -> None:
    """Interrupted at step 6 (its window's step 2), the continued run resumes with the same config and
    reads the same batches: the window's position comes from the checkpoint's ``data_start``."""
    config = run_toml(
        tmp_path / "again.toml", stream["windows"][1], tmp_path / "out", data={"max_steps": 4},
        checkpoint={"dir": str(stream["ckpt"]), "resume": str(stream["ckpt"] / "step_00000006"),
                    "continue_on_new_data": True, "at_end": False},
        eval={"max_users": 0}, **COMMON,
    )  # fmt: skip
    result = train_one_rank(config, tmp_path)
    assert "continuing onto" not in result.stdout
    straight, resumed = step_lines(stream["root"] / "out1"), step_lines(tmp_path / "out")
    assert sorted(resumed) == [6, 7]
    for step in resumed:
        assert resumed[step]["loss"] == straight[step]["loss"] and resumed[step]["zch"] == straight[step]["zch"], step


@pytest.mark.slow
def test_a_continued_window_trains_its_whole_dataset(stream, tmp_path) -> None:
    """``data.epochs`` counts the new window's steps: the continuation reads it from its first step."""
    window = stream["windows"][2]
    config = run_toml(
        tmp_path / "epoch.toml", window, tmp_path / "out", data={"max_steps": 0, "epochs": 1.0},
        checkpoint={"dir": str(tmp_path / "ckpt"), "resume": str(stream["ckpt"] / "step_00000008"),
                    "continue_on_new_data": True, "at_end": False},
        eval={"max_users": 0}, **COMMON,
    )  # fmt: skip
    train_one_rank(config, tmp_path)
    steps = loader.total_steps(PreparedDataset(window), 1, 1.0, 0)
    assert sorted(step_lines(tmp_path / "out")) == list(range(8, 8 + steps))


@pytest.mark.slow
def test_next_window_evaluation_names_its_users(stream, tmp_path) -> None:
    root, windows = stream["root"], stream["windows"]
    (line,) = eval_lines(root / "out0")
    assert line["eval"]["data"] == line["test_of_best"]["data"] == windows[1] and line["eval"]["users"] > 0
    summary = (root / "out0" / "summary.txt").read_text()
    assert f"users of {windows[1]}, full ranking over items" in summary
    checkpoint = str(stream["ckpt"] / "step_00000004")
    command = [FREESCALE, "evaluate", "--config", str(root / "w0.toml"), "--checkpoint", checkpoint, "--nproc", "1"]
    result = subprocess.run(
        [*command, "--data", windows[2], "--set", f'logging.out_dir="{tmp_path / "ev"}"'],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    assert report["test"]["data"] == windows[2] and report["test"]["users"] > 0 and report["step"] == 4


@pytest.mark.slow
def test_a_changed_table_set_is_refused_in_one_line(stream, tmp_path) -> None:
    resume = {"dir": str(stream["ckpt"]), "resume": str(stream["ckpt"] / "step_00000004"), "continue_on_new_data": True}
    cases = [
        ({**ZCH, "zch_size": 256}, "table 'item' of checkpoint", "model_extra.zch_size = 128, this run's has 256"),
        ({**ZCH, "zch_size": 256, "zch_bucket_size": 32}, "table 'item'", "zch_size = 128"),
        ({"ids": "hashed", "num_items": 128}, "table 'item' of checkpoint", "is a zch table, this run's is not a zch"),
        ({**ZCH, "num_actions": 16}, "table 'action' of checkpoint", "model_extra.num_actions = 8, this run's has 16"),
    ]
    for number, (extra, *expected) in enumerate(cases):
        config = run_toml(
            tmp_path / f"t{number}.toml", stream["windows"][1], tmp_path / "out", checkpoint=resume,
            model_extra=extra, logging={"log_every": 2},
        )  # fmt: skip
        line = refusal(config, tmp_path)
        assert "error: checkpoint.continue_on_new_data: " in line and all(part in line for part in expected), line


@pytest.mark.slow
def test_exact_ids_cannot_continue_onto_other_vocabularies(stream, tmp_path) -> None:
    windows, ckpt = stream["windows"], tmp_path / "ckpt"
    first = run_toml(
        tmp_path / "e0.toml", windows[0], tmp_path / "out", data={"max_steps": 2}, eval={"max_users": 0},
        checkpoint={"dir": str(ckpt)}, logging={"log_every": 2},
    )  # fmt: skip
    train_one_rank(first, tmp_path)
    resume = {"dir": str(ckpt), "resume": "latest", "continue_on_new_data": True}
    config = run_toml(tmp_path / "e1.toml", windows[1], tmp_path / "out", checkpoint=resume, logging={"log_every": 2})
    line = refusal(config, tmp_path)
    assert "error: checkpoint.continue_on_new_data: table 'item': " in line and "model_extra.ids = 'exact'" in line
    assert "model_extra.ids = 'zch' (or 'hashed')" in line, line
    plain = {**resume, "continue_on_new_data": False}
    line = refusal(run_toml(tmp_path / "e2.toml", windows[1], tmp_path / "out", checkpoint=plain), tmp_path)
    assert "checkpoint.continue_on_new_data = true to continue the run onto it" in line, line


def _record(data: DataIdentity, **model: object) -> RunRecord:
    options = {"model_extra.num_items": 128, "model_extra.num_actions": 8, **model}
    return RunRecord("r", data, {k: v for k, v in options.items() if v is not None})


def test_check_continuation_names_the_table_that_cannot_carry_over() -> None:
    """The checks themselves, without training: vocabulary-keyed tables need the same vocabulary."""
    old = DataIdentity("w0", "f0", {"item": "a", "action": "x"})
    new = DataIdentity("w1", "f1", {"item": "b", "action": "x"})
    zch = _cfg(ModelExtraConfig(num_items=0, num_actions=8, ids="zch", zch_size=128, zch_bucket_size=16,
                                zch_max_probe=8))  # fmt: skip
    zch_record = _record(old, **{"model_extra.zch_bucket_size": 16})
    check_continuation(zch_record, new, zch, (128, 8), "c")  # other item ids: fine, rows are keyed by raw ids
    hashed = _cfg(ModelExtraConfig(num_items=128, num_actions=8, ids="hashed"))
    check_continuation(_record(old), new, hashed, (128, 8), "c")
    exact = _cfg(ModelExtraConfig(num_items=128, num_actions=8))
    with pytest.raises(ValueError, match=r"^checkpoint.continue_on_new_data: table 'item': w1 has other item ids"):
        check_continuation(_record(old), new, exact, (128, 8), "c")
    other_actions = DataIdentity("w1", "f1", {"item": "a", "action": "y"})
    with pytest.raises(ValueError, match=r"table 'action': w1 has other action ids"):
        check_continuation(zch_record, other_actions, zch, (128, 8), "c")
    with pytest.raises(ValueError, match=r"table 'item' of c has model_extra.zch_bucket_size = 32, this run's has 16"):
        check_continuation(_record(old, **{"model_extra.zch_bucket_size": 32}), new, zch, (128, 8), "c")


def _cfg(extra: ModelExtraConfig, **user_tables: UserTableConfig) -> RunConfig:
    return RunConfig(data=DataConfig(path="x"), model_extra=extra, user_tables=user_tables)


def test_continuation_names_a_user_table_that_cannot_carry_over() -> None:
    """User-profile tables: the set must be the checkpoint's, and an exact one needs the same vocabulary."""
    old = DataIdentity("w0", "f0", {"item": "a", "action": "x", "user.country": "c0"})
    new = DataIdentity("w1", "f1", {"item": "a", "action": "x", "user.country": "c1"})
    extra = ModelExtraConfig(num_items=128, num_actions=8, ids="hashed")
    country = UserTableConfig(feature="country", rows=50)
    users = UserTableConfig(feature="user_id", ids="zch", zch_size=64, zch_bucket_size=16)
    both = _cfg(extra, country=country, user_id=users)
    record = RunRecord("r", old, model_options(both, (128, 8)))
    with pytest.raises(ValueError, match=r"table 'user.country': w1 has other user.country ids .* user_tables.country"):
        check_continuation(record, new, both, (128, 8), "c")
    hashed = _cfg(extra, country=replace(country, ids="hashed"), user_id=users)
    with pytest.raises(
        ValueError, match=r"c was trained with user_tables.country.ids = 'exact', this run has 'hashed'"
    ):
        check_model(record, model_options(hashed, (128, 8)), "c")
    without = _cfg(extra, country=country)
    with pytest.raises(ValueError, match=r"^table 'user.user_id': c has it \(\[user_tables.user_id\]\), this run does"):
        check_continuation(record, old, without, (128, 8), "c")
    added = _cfg(extra, country=country, user_id=users, age=UserTableConfig(feature="age", rows=7))
    with pytest.raises(ValueError, match=r"^table 'user.age': this run has it .* c does not"):
        check_continuation(record, old, added, (128, 8), "c")
    check_continuation(record, old, both, (128, 8), "c")  # the same tables on the same vocabulary


def test_eval_data_path_needs_ids_that_mean_this_runs_rows() -> None:
    trained = DataIdentity("w0", "f0", {"item": "a", "action": "x"})
    evaluated = DataIdentity("w1", "f1", {"item": "b", "action": "x"})
    zch = ModelExtraConfig(num_items=0, num_actions=8, ids="zch", zch_size=128, zch_bucket_size=16, zch_max_probe=8)
    check_eval_data(RunConfig(model_extra=zch), trained, evaluated)  # raw item ids: read-only lookups
    with pytest.raises(ValueError, match=r"^eval.data_path: table 'item': w1 has other item ids than data.path w0"):
        check_eval_data(RunConfig(), trained, evaluated)
