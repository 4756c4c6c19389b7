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
