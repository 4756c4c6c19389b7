"""``freescale prepare``: load-balanced MDS shards from UIH sources (one dataset, or one per time window
with ``--time-window``, docs/data.md#time-windows).
"""

from __future__ import annotations

import argparse
from typing import Any

from freescale.tools.commands.sample_options import add_sample_options, early_pool, sample_options


def add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="build load-balanced MDS shards from UIH sources",
        description="Stream the sources in the source config, merge per-user sequences, cost "
        "every sample and write step groups of cost-balanced micro-batches as MDS "
        "shards plus manifest.json.",
    )
    p.add_argument("--sources", required=True, help="source config TOML (local or s3://)")
    p.add_argument("--output", "--out", dest="output", required=True, help="output directory or s3:// prefix")
    p.add_argument("--group-size", type=int, default=8, help="G: the largest world size planned (default 8)")
    p.add_argument("--micro-batch-size", type=int, default=32, help="k: samples per micro-batch (default 32)")
    p.add_argument("--mode", choices=["equal_count", "free_count"], default="equal_count")
    p.add_argument(
        "--strategy",
        choices=["planned", "within_step", "random"],
        default="planned",
        help="planned (ours), within_step, or random batching (the baseline)",
    )
    p.add_argument(
        "--max-outlier-fraction",
        type=float,
        default=None,
        help="bound on the share of samples grouped by cost into outlier steps",
    )
    p.add_argument("--target-imbalance", type=float, default=None, help="max/mean goal per group")
    p.add_argument(
        "--free-outliers",
        choices=["auto", "off"],
        default=None,
        help="auto (default): where outlier steps of G*k samples cannot balance, the heaviest samples "
        "form free-count outlier steps (counts reported); off: every outlier step keeps G*k samples",
    )
    p.add_argument("--refine-swaps", type=int, default=None, help="swap-refinement iterations per step")
    p.add_argument("--seed", type=int, default=0)
    add_sample_options(p)
    p.add_argument(
        "--quarantine-examples",
        type=int,
        default=20,
        metavar="N",
        help="rejected rows kept as examples in quarantine.jsonl, per reason (default 20)",
    )
    p.add_argument("--shard-size-limit", default="64MB")
    p.add_argument(
        "--plan-memory",
        default="4GB",
        help="memory the planner may hold (~400 bytes a sample); past it, samples are planned in windows of step "
        "groups and the balance report's windowing section says how many (default 4GB: ~10M samples a window)",
    )
    p.add_argument(
        "--work-dir",
        help="where intermediate files go (default: .<output name>.freescale-work beside a local output; "
        "<tmp>/freescale-prepare-<uid> for s3://)",
    )
    p.add_argument(
        "--time-range",
        metavar="START:END",
        help="keep the events with START <= event time < END (seconds since the epoch or ISO dates, UTC; "
        "START..END when the times hold colons); the others are counted as filtered (outside_time_range)",
    )
    p.add_argument(
        "--time-window",
        metavar="DURATION",
        help="write one dataset per window of event time (1d, 6h, 30m, 3600) under --output/window=NNNN, "
        "plus windows.json (docs/data.md#time-windows)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a different existing dataset")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def prepare_config_from_args(args: argparse.Namespace):
    from freescale.pipeline.balance import BalanceConfig
    from freescale.pipeline.config import PrepareConfig, parse_size
    from freescale.pipeline.time_windows import parse_time_range

    balance_options = {
        "group_size": args.group_size,
        "micro_batch_size": args.micro_batch_size,
        "mode": args.mode,
        "strategy": args.strategy,
        "seed": args.seed,
    }
    for option in ("max_outlier_fraction", "target_imbalance", "refine_swaps", "free_outliers"):
        if getattr(args, option) is not None:
            balance_options[option] = getattr(args, option)
    return PrepareConfig(
        sources=args.sources,
        output=args.output,
        **sample_options(args),
        balance=BalanceConfig(**balance_options),
        quarantine_examples=args.quarantine_examples,
        shard_size_limit=parse_size(args.shard_size_limit, "--shard-size-limit"),
        plan_memory=parse_size(args.plan_memory, "--plan-memory"),
        work_dir=args.work_dir,
        overwrite=args.overwrite,
        progress=not args.quiet,
        time_range=parse_time_range(args.time_range),
    )


def cmd_prepare(args: argparse.Namespace) -> int:
    from freescale.pipeline.executors.processes import imports_without_gc

    pool = early_pool(args, writer=True)
    try:
        with imports_without_gc():
            from freescale import storage
            from freescale.pipeline.dataset.manifest import MANIFEST_NAME, parse_manifest
            from freescale.pipeline.prepare import prepare
            from freescale.tools.report import print_prepare_summary

        config = prepare_config_from_args(args)
        if args.time_window is not None:
            return _prepare_windows(config, args.time_window, pool)
        manifest = parse_manifest(prepare(config, pool), storage.join(config.output, MANIFEST_NAME))
    finally:
        # Also when the options or the sources are refused before the job owns the pool: a pool left
        # to interpreter exit can race its own wake-up pipe there (CPython 3.11: "Bad file descriptor").
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    print_prepare_summary(manifest)
    print(f"dataset: {args.output} (manifest.json, {manifest.rows.samples:,} samples)")
    return 0


def _prepare_windows(config: Any, window: str, pool: Any) -> int:
    """``prepare --time-window``: one dataset per window (``pipeline.time_windows``); a line per window."""
    from freescale.pipeline.time_windows import parse_duration, prepare_windows

    index = prepare_windows(config, parse_duration(window), pool)
    for entry in index.windows:
        where = entry.path or f"no dataset: {entry.skipped or 'no events'}"
        print(f"{entry.name} [{entry.start}, {entry.end}): {entry.events:,} events, {entry.samples:,} samples  {where}")
    filtered_out = index.filtered_out()
    without = ""
    if filtered_out:
        events = sum(entry.events for entry in filtered_out)
        names = ", ".join(entry.name for entry in filtered_out)
        without = f"; no dataset for {names}: the filters dropped all {events:,} of their events"
    print(
        f"windows: {config.output} ({len(index.datasets(config.output))} datasets, windows.json){without}; "
        f"{index.events_valid:,} valid events: {index.events_in_windows:,} in windows, "
        f"{index.events_outside_windows:,} outside every window"
    )
    return 0
