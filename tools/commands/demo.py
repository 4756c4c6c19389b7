"""``freescale demo``: generate demo data, prepare it, print the balance report, train 2 ranks."""

from __future__ import annotations

import argparse
from pathlib import Path

from freescale.tools.commands.generate import add_generate, cmd_generate
from freescale.tools.commands.prepare import add_prepare, cmd_prepare


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="generate demo data, prepare it, print the balance report, train 2 ranks")
    p.add_argument("--out", default="demo_out", help="working directory for the demo (default demo_out)")


def _parse(argv: list[str]) -> argparse.Namespace:
    """``generate`` / ``prepare`` arguments as the ``freescale`` parser reads them (same options, defaults)."""
    parser = argparse.ArgumentParser(prog="freescale")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate(sub)
    add_prepare(sub)
    return parser.parse_args(argv)


def cmd_demo(args: argparse.Namespace) -> int:
    from freescale.tools.demo import MARKOV_PROB, demo_train

    out = Path(args.out)
    data = out / "sources"
    dataset = out / "prepared"
    print("== 1/3 generate the demo sources")
    markov = f"markov_prob={MARKOV_PROB}"  # planted sequential structure: the model has something to learn
    cmd_generate(_parse(["generate", "--preset", "demo", "--out", str(data), "--set", markov]))
    print("== 2/3 prepare load-balanced shards (G = 8 ranks, k = 32 samples per micro-batch)")
    prepare_args = [
        "prepare",
        "--sources",
        str(data / "sources.toml"),
        "--output",
        str(dataset),
        "--group-size",
        "8",
        "--micro-batch-size",
        "32",
        "--max-uih-len",
        "4096",
        "--overwrite",
    ]
    status = cmd_prepare(_parse(prepare_args))
    if status:
        return status
    print("== 3/3 train on 2 CPU ranks for 240 steps (about 80 s idle); bubble table, HR@10 / NDCG@10 vs most popular")

    return demo_train(str(data / "sources.toml"), str(out / "train"))
