"""``freescale generate``: deterministic synthetic UIH sources and their source config.

The ``--set KEY=VALUE`` generator options are typed from ``GeneratorConfig``'s fields.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from freescale.overrides import add_set_option


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="write synthetic heterogeneous UIH sources + sources.toml",
        description="Write deterministic synthetic UIH sources (Parquet clicks, JSONL purchases, "
        "CSV users) and the source config that `prepare` reads.",
    )
    p.add_argument("--preset", default="demo", help="tiny | demo | large (default: demo)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, help="random seed (default: the preset's)")
    add_set_option(
        p,
        "override a generator option, e.g. --set n_users=1000 --set zipf=1.2 (see `freescale generate --list-options`)",
        "KEY=VALUE",
    )
    p.add_argument("--list-options", action="store_true", help="print the generator options and exit")


def generator_overrides(pairs: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings → typed generator options (types from ``GeneratorConfig``'s fields)."""
    from typing import get_type_hints

    from freescale.datasets.generator_config import GeneratorConfig
    from freescale.overrides import typed_overrides

    return typed_overrides(pairs, get_type_hints(GeneratorConfig))


def describe_generator_options(preset_name: str) -> str:
    from dataclasses import asdict

    from freescale.datasets.presets import preset

    values = asdict(preset(preset_name))
    return "\n".join(f"{key:20} {value!r}" for key, value in values.items())


def cmd_generate(args: argparse.Namespace) -> int:
    from freescale.datasets.presets import preset
    from freescale.datasets.synthetic import generate

    if args.list_options:
        print(f"generator options (values of the {args.preset} preset):")
        print(describe_generator_options(args.preset))
        return 0
    overrides = generator_overrides(args.overrides)
    if args.seed is not None:
        overrides["seed"] = args.seed
    config = preset(args.preset, **overrides)
    generate(config, args.out)
    print(f"wrote {args.preset} sources to {args.out} (source config: {Path(args.out) / 'sources.toml'})")
    return 0
