"""``freescale train`` (trainer/launch.py ``launch``) refuses a bad config or --nproc with status 2."""

from __future__ import annotations

from pathlib import Path

from run_toml import write_config

from freescale.tools.cli import main as cli_main


def test_cli_train_reports_config_errors_with_status_2(tmp_path: Path, capsys) -> None:
    path = write_config(tmp_path / "run.toml", engine={"threads": 0})
    assert cli_main(["train", "--config", path, "--nproc", "2"]) == 2
    assert "engine.threads" in capsys.readouterr().err
    assert cli_main(["train", "--config", path, "--nproc", "0", "--set", "engine.threads=1"]) == 2
    assert "--nproc" in capsys.readouterr().err


def test_zch_buckets_that_do_not_split_among_the_ranks_are_refused_before_any_rank(tmp_path: Path, capsys) -> None:
    zch = {"ids": "zch", "zch_size": 192}  # 3 buckets of 64 rows
    logging = {"out_dir": str(tmp_path / "out")}
    path = write_config(tmp_path / "run.toml", model_extra=zch, logging=logging)
    assert cli_main(["train", "--config", path, "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_extra.zch_size 192 gives 3 buckets of 64 rows, not a multiple of the 2" in err[0]
