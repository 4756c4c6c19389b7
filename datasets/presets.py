"""Named generator configs: ``tiny`` for tests, ``demo`` for the quick start, ``large`` for scale runs.

Sizes are chosen against wall-clock budgets on a 2-core machine: tiny (~5k events) well under a second,
demo (~1.2M events) a few seconds, large (~25M events) within about two minutes at bounded memory.
"""

from __future__ import annotations

from dataclasses import replace

from .generator_config import GeneratorConfig

__all__ = ["PRESETS", "preset"]

PRESETS: dict[str, GeneratorConfig] = {
    "tiny": GeneratorConfig(
        name="tiny",
        n_users=200,
        n_items=1_000,
        median=15.0,
        sigma=1.0,
        max_len=400,
        click_files=2,
        row_group_rows=1_000,
        chunk_events=4_000,
    ),
    "demo": GeneratorConfig(
        name="demo",
        n_users=5_000,
        n_items=50_000,
        median=120.0,
        sigma=1.2,
        max_len=21_000,
        click_files=4,
        purchase_files=2,
        row_group_rows=65_536,
    ),
    "large": GeneratorConfig(
        name="large",
        n_users=100_000,
        n_items=1_000_000,
        median=120.0,
        sigma=1.2,
        max_len=21_000,
        click_files=8,
        purchase_files=4,
        review_files=2,
        row_group_rows=131_072,
        chunk_events=2_000_000,
    ),
}


def preset(name: str, **overrides: object) -> GeneratorConfig:
    """A preset with options replaced (``preset("demo", n_users=1000, zipf=1.3)``); validated again."""
    if name not in PRESETS:
        raise ValueError(f"option 'preset' must be one of {', '.join(PRESETS)}; got {name!r}")
    unknown = sorted(set(overrides) - set(GeneratorConfig.option_names()))
    if unknown:
        raise ValueError(f"unknown generator option(s): {', '.join(unknown)}")
    return replace(PRESETS[name], **overrides)
