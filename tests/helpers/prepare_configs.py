"""Small, fast ``PrepareConfig``s for the tests that run ``prepare`` in process."""

from __future__ import annotations

from freescale.pipeline.balance import BalanceConfig
from freescale.pipeline.config import PrepareConfig, SampleConfig


def make_config(sources: str, output: str, **overrides) -> PrepareConfig:
    """G = 4, k = 4, one process, 512 MiB, no progress bars; ``overrides`` replace any option."""
    options = {
        "samples": SampleConfig(max_uih_len=2048),
        "balance": BalanceConfig(group_size=4, micro_batch_size=4, seed=1),
        "workers": 1,
        "progress": False,
        "memory_limit": 512 * 2**20,
    }
    options.update(overrides)
    return PrepareConfig(sources=sources, output=output, **options)
