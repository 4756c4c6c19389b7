"""Fixtures shared by the ``prepare`` tests (``test_prepare.py`` and the fault tests
``test_prepare_bad_places.py``, ``test_prepare_interrupts.py``, ``test_prepare_disk_full.py``): tiny
sources, and the bytes of an uninterrupted CLI run on them to compare a faulted-then-rerun output
with. Module-scoped: each test module generates its own. A test module that defines its own
``tiny_sources`` uses that one (``test_integrity.py``: another seed)."""

from __future__ import annotations

import pytest
from prepare_cli import clean_prepare_files

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate


@pytest.fixture(scope="module")
def tiny_sources(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tiny")
    generate(preset("tiny", seed=3), str(out))
    return str(out / "sources.toml")


@pytest.fixture(scope="module")
def clean_output(tiny_sources, tmp_path_factory) -> dict[str, bytes]:
    return clean_prepare_files(tiny_sources, str(tmp_path_factory.mktemp("clean") / "ds"))
