"""``freescale evaluate``: score a saved checkpoint on the validation and test items, without training."""

from __future__ import annotations

import argparse
import json

from freescale.overrides import add_set_option


def add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="score a saved checkpoint on the validation and test items, without training",
        description="Load a FreeScale checkpoint (any --nproc: tables are resharded) and report HR@k / "
        "NDCG@k on validation and test under the run config's [eval] protocol; writes evaluation.json "
        "to logging.out_dir. With the run's --nproc the figures equal the run's exactly.",
    )
    p.add_argument("--config", required=True, help="the run config TOML the checkpoint was trained with")
    p.add_argument("--checkpoint", required=True, help="a step directory, e.g. runs/x/ckpt/best/step_00000200")
    p.add_argument(
        "--data",
        default="",
        help="score the users of this prepared dataset instead (eval.data_path: the next time window's)",
    )
    p.add_argument("--nproc", type=int, default=1, help="ranks on this machine (default 1)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="overrides engine.device")
    add_set_option(p, "override a config option with a TOML value, e.g. --set eval.max_users=500")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from freescale.trainer.launch import launch

    overrides = [*args.overrides, *([f"eval.data_path={json.dumps(args.data)}"] if args.data else [])]
    return launch(args.config, args.nproc, args.device, overrides, evaluate_checkpoint=args.checkpoint)
