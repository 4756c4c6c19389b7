"""``freescale simulate``: the trace-driven bubble simulator (docs/design.md#scale-model)."""

from __future__ import annotations

import argparse


def add_simulate(sub: argparse._SubParsersAction) -> None:
    from freescale.trainer.simulate.sim_report import add_arguments

    add_arguments(
        sub.add_parser(
            "simulate",
            help="predict straggler / exposed-comm bubbles at W ranks from sample lengths (no cluster needed)",
            description="Trace-driven bubble simulator (docs/design.md#scale-model): sample lengths + per-sample "
            "cost + network model + jitter -> predicted straggler_pct, exposed_comm_pct, bubble_pct, step time "
            "and samples/s per world size for random batching, online balancing, the offline plan and "
            "plan + online, with overlap none or pec. Writes simulate.json and simulate.png to --out.",
        )
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    from freescale.trainer.simulate.sim_report import run

    return run(args)
