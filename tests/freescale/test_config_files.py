"""Config files a user names on the command line: each unreadable kind is one line naming the file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from freescale.model_config import ModelConfig
from freescale.pipeline.cost import CostModel
from freescale.tools.cli import main
from freescale.trainer.config import RunConfig
from freescale.trainer.simulate.calibrate import read_config
from freescale.trainer.simulate.sim_config import HardwareProfile

READERS: dict[str, Callable[[str], object]] = {
    "run config": RunConfig.from_toml,
    "model config": ModelConfig.from_toml,
    "--cost-model": CostModel.from_file,
    "--config": read_config,
    "--profile": HardwareProfile.load,
}


def _bad_file(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A config path of the given kind and the reason the error must give."""
    if kind == "directory":
        (tmp_path / "conf.toml").mkdir()
        return tmp_path / "conf.toml", "is a directory"
    if kind == "latin-1":
        (tmp_path / "conf.toml").write_bytes(b"# caf\xe9\n[model]\nd_model = 8\n")
        return tmp_path / "conf.toml", "cannot read it: 'utf-8' codec"
    (tmp_path / "conf.toml").write_text("[model\nd_model = 8\n")
    return tmp_path / "conf.toml", "cannot parse|not valid TOML"


@pytest.mark.parametrize("kind", ["directory", "latin-1", "invalid toml"])
@pytest.mark.parametrize("what", sorted(READERS))
def test_an_unreadable_config_file_is_a_value_error_naming_it(tmp_path: Path, what: str, kind: str) -> None:
    """A directory (an IsADirectoryError or pyarrow OSError traceback before), a file that is not
    UTF-8 (a bare codec message naming no file) or invalid TOML (a bare parser message for the model
    and calibrate configs) is one ValueError naming the option and the file."""
    path, reason = _bad_file(tmp_path, kind)
    if what == "--profile" and kind == "directory":
        reason = "no such file or shipped profile"  # a profile is a shipped name or a file
    with pytest.raises(ValueError, match=reason) as info:
        READERS[what](str(path))
    assert str(path) in str(info.value) and what in str(info.value)
    assert "\n" not in str(info.value)


def test_train_with_a_directory_for_its_config_says_so_in_one_line(tmp_path: Path, capsys) -> None:
    assert main(["train", "--config", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"freescale train: error: run config {tmp_path}: cannot read it") and "Traceback" not in err
