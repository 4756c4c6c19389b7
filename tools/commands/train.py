"""``freescale train``: validate the run config and start torchrun (on one node or several)."""

from __future__ import annotations

import argparse

from freescale.overrides import add_set_option


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train on a prepared dataset with torchrun (FreeScale or TorchRec engine)",
        description="Validate the run config, then start torchrun with --nproc ranks of "
        "`python -m freescale.trainer` (gloo on CPU, NCCL on CUDA). Writes metrics.jsonl, "
        "bubbles.json, trace.json, timeline.png and summary.txt to logging.out_dir.",
    )
    p.add_argument("--config", required=True, help="run config TOML ([model], [data], [optimizer], [engine], ...)")
    p.add_argument("--nproc", type=int, default=1, help="ranks on this machine (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="machines in the job (default 1); run the command on each")
    p.add_argument("--node-rank", type=int, default=0, help="this machine's index in [0, nnodes) (default 0)")
    p.add_argument(
        "--rdzv-endpoint",
        default="",
        metavar="HOST:PORT",
        help="with --nnodes > 1: the c10d rendezvous on node 0, an address every node reaches",
    )
    p.add_argument("--rdzv-id", default="freescale", help="job id shared by the nodes (default freescale)")
    p.add_argument(
        "--local-addr",
        default="",
        help="this node's address the other nodes reach (default: what its hostname resolves to)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], help="overrides engine.device")
    p.add_argument("--engine", choices=["freescale", "torchrec"], help="overrides engine.name")
    add_set_option(p, "override a config option with a TOML value, e.g. --set data.max_steps=50")


def cmd_train(args: argparse.Namespace) -> int:
    from freescale.trainer.launch import Nodes, launch

    overrides = list(args.overrides)
    if args.engine:
        overrides.append(f'engine.name="{args.engine}"')
    nodes = Nodes(args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_id, args.local_addr)
    return launch(args.config, nproc=args.nproc, device=args.device, overrides=overrides, nodes=nodes)
