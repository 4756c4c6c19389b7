"""``freescale stats``: dataset statistics of raw sources or a prepared dataset, with the optional ZCH
replay (docs/stats.md#zch-replay).
"""

from __future__ import annotations

import argparse
from typing import Any

from freescale.tools.commands.sample_options import add_sample_options, early_pool, sample_options


def add_stats(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stats",
        help="dataset statistics: sparsity, batch overlap, hash collisions, stragglers",
        description="Describe raw sources (a source config TOML, or a folder holding "
        "sources.toml) or a prepared dataset (local or s3://): UIH lengths, sparsity "
        "(paper Eq. 1), predicted straggler_pct at W ranks x k samples, "
        "batch_overlap_rate per table, item popularity (Zipf fit) and "
        "hash_collision_rate. Writes stats.json and PNG plots to --out.",
    )
    p.add_argument("input", help="source config TOML (or its folder) or prepared dataset (local or s3://)")
    p.add_argument(
        "--out",
        "--output",
        dest="output",
        default="freescale-stats",
        help="directory (or s3:// prefix) for stats.json and the plots (default freescale-stats)",
    )
    p.add_argument("--world-sizes", help="W values, comma-separated (default 8,64,256; plus a prepared dataset's G)")
    p.add_argument(
        "--micro-batch-size",
        "-k",
        type=int,
        help="k: samples per rank per step (default 32, or the prepared dataset's)",
    )
    p.add_argument("--batch-size", type=int, help="batch size for sparsity (default k)")
    p.add_argument(
        "--global-batch-size",
        type=int,
        help="headline batch_overlap_rate batch (default: largest "
        "W*k with 2 full batches; a prepared dataset's step group)",
    )
    p.add_argument(
        "--global-batch-sizes",
        help="curve of batch_overlap_rate, comma-separated (default k*4^j up to half the samples, and every W*k)",
    )
    p.add_argument(
        "--table-sizes",
        default="100000,1000000,10000000",
        help="embedding table sizes T for hash_collision_rate, comma-separated",
    )
    p.add_argument(
        "--length-thresholds",
        default="256,1024,4096,16384",
        help="report the share of samples longer than each of these",
    )
    p.add_argument(
        "--sample-fraction",
        type=float,
        default=1.0,
        help="describe this share of users (selected by a hash of the user id); figures are "
        "then estimates with standard errors",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random batching")
    _add_zch_options(p)
    add_sample_options(p)
    p.add_argument(
        "--work-dir",
        help="raw sources: keep prepare's scan/samples here; a re-run with the same options and sources skips them",
    )
    p.add_argument("--cache-dir", help="prepared dataset on s3://: local shard cache")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="prepared dataset: skip the shards' hash check (sizes, headers and metadata are still checked)",
    )
    p.add_argument("--no-plots", action="store_true", help="write stats.json only")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


# --zch-* options other than --zch-size, with their defaults (None on the parser: a value given
# without --zch-size is refused rather than ignored)
ZCH_DEFAULTS = {
    "zch_max_probe": 0,  # the whole bucket
    "zch_bucket_size": 64,
    "zch_policy": "lru",
    "zch_ttl": None,
    "zch_admission": 1,
    "zch_lfu_halflife": 0,
    "zch_lookup_events": 65_536,
    "zch_ids": "item",
}


def _add_zch_options(p: argparse.ArgumentParser) -> None:
    """``stats``' ZCH replay (docs/stats.md#zch-replay): off unless ``--zch-size`` is given."""
    p.add_argument(
        "--zch-size",
        type=int,
        help="replay the item ids in event-time order through a zero-collision table of this many rows "
        "(raw sources); reports hit/insert/collision/eviction rates and occupancy",
    )
    p.add_argument("--zch-max-probe", type=int, help="slots probed per id (default 0: the whole bucket)")
    p.add_argument("--zch-bucket-size", type=int, help="rows per bucket (default 64)")
    p.add_argument("--zch-policy", help="eviction policy: lru (default), lfu or ttl")
    p.add_argument("--zch-ttl", type=int, help="policy ttl: seconds of event time an id may stay unseen")
    p.add_argument("--zch-admission", type=int, help="policy lfu: sightings before an id takes a slot (default 1)")
    p.add_argument(
        "--zch-lfu-halflife", type=int, help="policy lfu: lookup calls an unseen id's count takes to halve (0: never)"
    )
    p.add_argument(
        "--zch-lookup-events", type=int, help="events per lookup call (a training step's ids; default 65,536)"
    )
    p.add_argument(
        "--zch-ids", choices=("item", "user"), help="replay the events' item ids (default) or their user ids"
    )


def _zch_options(args: argparse.Namespace) -> Any:
    given = [name for name in ZCH_DEFAULTS if getattr(args, name) is not None]
    if args.zch_size is None:
        if given:
            option = "--" + given[0].replace("_", "-")
            raise ValueError(f"{option} applies to the ZCH replay, which runs only with --zch-size")
        return None
    from freescale.pipeline.stats.zch_replay import replay_config

    value = {name: default if getattr(args, name) is None else getattr(args, name)
             for name, default in ZCH_DEFAULTS.items()}  # fmt: skip
    return replay_config(
        value["zch_lookup_events"],
        value["zch_ids"],
        zch_size=args.zch_size,
        bucket_size=value["zch_bucket_size"],
        max_probe=value["zch_max_probe"] or value["zch_bucket_size"],
        policy=value["zch_policy"],
        ttl=value["zch_ttl"],
        admission_threshold=value["zch_admission"],
        lfu_halflife=value["zch_lfu_halflife"],
    )


def cmd_stats(args: argparse.Namespace) -> int:
    from freescale.pipeline.executors.processes import imports_without_gc

    # the scan's workers, as prepare's (a prepared dataset hands them back unused)
    pool = early_pool(args, writer=False)
    try:
        with imports_without_gc():
            from freescale.pipeline.config import parse_int_list as ints
            from freescale.pipeline.stats import StatsConfig, run_stats
            from freescale.pipeline.stats.report import print_stats_summary
        config = StatsConfig(
            input=args.input,
            output=args.output,
            world_sizes=ints(args.world_sizes, "--world-sizes"),
            micro_batch_size=args.micro_batch_size,
            batch_size=args.batch_size,
            global_batch_size=args.global_batch_size,
            global_batch_sizes=ints(args.global_batch_sizes, "--global-batch-sizes"),
            table_sizes=ints(args.table_sizes, "--table-sizes"),
            length_thresholds=ints(args.length_thresholds, "--length-thresholds"),
            sample_fraction=args.sample_fraction,
            seed=args.seed,
            **sample_options(args),
            work_dir=args.work_dir,
            cache_dir=args.cache_dir,
            verify=not args.no_verify,
            plots=not args.no_plots,
            progress=not args.quiet,
            zch=_zch_options(args),
        )
        report = run_stats(config, pool)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    print_stats_summary(report)
    files = ", ".join(["stats.json", *report["plots"].values()])
    print(f"wrote {files} to {args.output} ({report['runtime_s']:.1f} s)")
    return 0
