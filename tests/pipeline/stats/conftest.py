"""Module-scoped inputs for the ``freescale stats`` tests: the tiny synthetic sources and the dataset
prepare builds from them (G = 4, k = 4); each test module that asks for them builds its own copy."""

from __future__ import annotations

import pytest

from freescale.pipeline.balance import BalanceConfig
from freescale.pipeline.config import PrepareConfig, SampleConfig
from freescale.pipeline.prepare import prepare


@pytest.fixture(scope="module")
def tiny(tiny_sources: str) -> str:
    """The tiny sources of ``tests/pipeline/conftest.py`` (one definition, this folder's name for it)."""
    return tiny_sources


@pytest.fixture(scope="module")
def prepared(tiny, tmp_path_factory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("prepared") / "ds")
    manifest = prepare(
        PrepareConfig(
            sources=tiny,
            output=out,
            samples=SampleConfig(max_uih_len=2048),
            balance=BalanceConfig(group_size=4, micro_batch_size=4, seed=1),
            workers=1,
            progress=False,
            memory_limit=512 * 2**20,
        )
    )
    return out, manifest
