"""``torchrun … -m freescale.trainer --config run.toml [--set table.option=value …]``: one rank."""

from __future__ import annotations

import sys
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent
# `python -m` puts the working directory first on sys.path; from the repository root the root folder
# `datasets/` would shadow Hugging Face's `datasets` (imported by mosaicml-streaming's dependencies).
# The project is installed through an import finder, so dropping that entry loses nothing.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _REPO_ROOT]


def main(argv: list[str] | None = None) -> int:
    from freescale.trainer.launch import rank_main

    return rank_main(argv)


if __name__ == "__main__":
    from freescale.trainer.lifetime import exit_process

    exit_process(main())  # sys.exit without the shutdown collections (lifetime.exit_process)
