"""``freescale calibrate``: the simulator's calibration run (options and driver in ``trainer.simulate``)."""

from __future__ import annotations

import argparse


def add_calibrate(sub: argparse._SubParsersAction) -> None:
    from freescale.trainer.simulate.calibrate_options import HELP, add_arguments

    add_arguments(sub.add_parser("calibrate", help=HELP))


def cmd_calibrate(args: argparse.Namespace) -> int:
    from freescale.trainer.simulate.calibrate import run

    return run(args)
