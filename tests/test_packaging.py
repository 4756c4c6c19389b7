"""A non-editable install (``pip install .``) ships what the package reads at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def source_copy(target: Path) -> Path:
    """The checkout's tracked and unignored files in ``target``: the build writes ``build/`` and
    ``*.egg-info`` beside the sources, which must not land in the checkout the tests import from."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip(f"the checkout's files cannot be listed with git: {listed.stderr.decode().strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_a_built_wheel_ships_the_hardware_profiles_without_a_packaging_warning(tmp_path: Path) -> None:
    src = source_copy(tmp_path / "src")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", str(src)]
    build = subprocess.run(
        [*command, "-w", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    log = build.stdout + build.stderr
    assert "absent from the `packages` configuration" not in log, log[-3000:]
    (wheel,) = (tmp_path / "w").glob("freescale-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    profiles = sorted(
        p.name for p in (REPO / "trainer" / "simulate" / "profiles").iterdir() if p.suffix in (".toml", ".json")
    )
    assert profiles, "no profiles in trainer/simulate/profiles"
    for name in profiles:
        assert f"freescale/trainer/simulate/profiles/{name}" in names, sorted(n for n in names if "trainer/" in n)
