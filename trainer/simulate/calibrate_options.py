"""The options of ``freescale calibrate`` (argparse only, no torch): the CLI and ``python -m`` share them."""

from __future__ import annotations

import argparse

HELP = "time micro-batches of a model here; write the cost model prepare --cost-model reads"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``calibrate``'s options on ``p`` (the ``freescale calibrate`` subparser or a stand-alone parser)."""
    p.add_argument("--config", required=True, help="run config or model TOML ([model], [model_extra], [engine])")
    p.add_argument("--out", required=True, help="cost-model JSON to write")
    p.add_argument("--micro-batch-size", type=int, default=8, help="samples per micro-batch (prepare's k)")
    p.add_argument("--mixed", type=int, default=24, help="mixed-length micro-batches to time")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (the minimum is kept)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: thread CPU time; cuda: wall time between device synchronisations")  # fmt: skip
