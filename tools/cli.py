"""The ``freescale`` command line: ``generate``, ``prepare``, ``inspect``, ``bench``, ``demo``, ``simulate``.

Each subcommand is a thin layer over a library call, so everything the CLI does can be scripted.
Errors a user can fix (bad options, bad input, an existing dataset) print one clear line and exit
with status 2 instead of a traceback. This module builds the parser and dispatches; each command's
options and run are in ``freescale.tools.commands``, one module per command.
"""

from __future__ import annotations

import argparse
import sys

from freescale import __version__
from freescale.tools.commands.bench import add_bench, cmd_bench
from freescale.tools.commands.calibrate import add_calibrate, cmd_calibrate
from freescale.tools.commands.demo import add_demo, cmd_demo
from freescale.tools.commands.evaluate import add_evaluate, cmd_evaluate
from freescale.tools.commands.generate import add_generate, cmd_generate
from freescale.tools.commands.inspect_dataset import add_inspect, cmd_inspect
from freescale.tools.commands.prepare import add_prepare, cmd_prepare
from freescale.tools.commands.simulate import add_simulate, cmd_simulate
from freescale.tools.commands.stats import add_stats, cmd_stats
from freescale.tools.commands.train import add_train, cmd_train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="freescale", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"freescale {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = (add_generate, add_prepare, add_inspect, add_bench, add_demo, add_stats, add_train)
    for add in (*commands, add_evaluate, add_calibrate, add_simulate):
        add(sub)
    return parser


COMMANDS = {
    "generate": cmd_generate,
    "prepare": cmd_prepare,
    "inspect": cmd_inspect,
    "bench": cmd_bench,
    "demo": cmd_demo,
    "calibrate": cmd_calibrate,
    "stats": cmd_stats,
    "train": cmd_train,
    "simulate": cmd_simulate,
    "evaluate": cmd_evaluate,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except Exception as error:
        if not is_user_error(error):
            raise
        print(f"freescale {args.command}: error: {error}", file=sys.stderr)
        return 2


def is_user_error(error: Exception) -> bool:
    """Errors a user can fix: bad options or input (``SourceError``, ``ManifestError``: ``ValueError``s),
    a missing file, a job that refuses to go on (``PrepareError``: prepare, and a folder another run
    holds locked). Checked without importing the pipeline up front: ``cmd_prepare`` starts its workers
    before that import (~0.7 s) so both run at once, and a ``PrepareError`` implies its module is loaded.
    """
    if isinstance(error, ValueError | FileNotFoundError):
        return True
    output = sys.modules.get("freescale.pipeline.output")
    return output is not None and isinstance(error, output.PrepareError)


if __name__ == "__main__":
    sys.exit(main())
