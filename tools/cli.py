"""The ``freescale`` command line: ``generate``, ``prepare``, ``inspect``, ``bench``, ``demo``, ``simulate``.

Each subcommand is a thin layer over a library call, so everything the CLI does can be scripted.
Errors a user can fix (bad options, bad input, an existing dataset) print one clear line and exit
with status 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from freescale import __version__
from freescale.tools.deprecation import DeprecatedAlias

REPO_ROOT = Path(__file__).resolve().parent.parent


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="write synthetic heterogeneous UIH sources + sources.toml",
        description="Write deterministic synthetic UIH sources (Parquet clicks, JSONL purchases, "
        "CSV users) and the source config that `prepare` reads.",
    )
    p.add_argument("--preset", default="demo", help="tiny | demo | large (default: demo)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, help="random seed (default: the preset's)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a generator option, e.g. --set n_users=1000 --set zipf=1.2 "
        "(see `freescale generate --list-options`)",
    )
    p.add_argument("--list-options", action="store_true", help="print the generator options and exit")


def _add_sample_options(p: argparse.ArgumentParser) -> None:
    """Sample construction, cost model and resources: shared by ``prepare`` and ``stats`` (same meaning)."""
    p.add_argument(
        "--max-uih-len",
        type=int,
        help="keep the most recent N events per sample (default: the --model-config's max_uih_len, else 21000)",
    )
    p.add_argument(
        "--window-stride",
        type=int,
        help="sliding windows every N events (0: off; default: half the window when the length comes from "
        "--model-config, else 0)",
    )
    p.add_argument("--min-len", type=int, default=2, help="drop users with fewer events")
    p.add_argument("--kcore", type=int, default=0, help="k-core filter over users and items (0: off)")
    p.add_argument("--model-config", help="TOML with a [model] table (d_model, num_layers, num_heads, ...)")
    p.add_argument("--cost-model", help="JSON/TOML with fitted coefficients a, b, c (overrides the model)")
    p.add_argument("--memory-limit", default="2GB", help="memory the job may use (default 2GB)")
    p.add_argument(
        "--workers", type=int, default=2, help="processes running tasks, this one included (default 2: one spawned)"
    )
    p.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="where the steps run: local (this host's process pool, default) or ray (Ray tasks; byte-identical output)",
    )
    p.add_argument(
        "--engine", dest="executor", choices=["local", "ray"], action=DeprecatedAlias, new="--executor",
        help=argparse.SUPPRESS,
    )  # fmt: skip
    p.add_argument(
        "--ray-address",
        help="--executor ray: a running cluster (auto or HOST:PORT); default: start a Ray runtime on this host "
        "with --workers CPUs for the job",
    )


def _sample_options(args: argparse.Namespace) -> dict:
    """The config fields ``_add_sample_options`` sets, for ``PrepareConfig`` and ``StatsConfig``."""
    from freescale.model_config import ModelConfig
    from freescale.pipeline.config import parse_size, sample_config

    model = ModelConfig.from_toml(args.model_config) if args.model_config else None
    return {
        "samples": sample_config(model, args.max_uih_len, args.window_stride, min_len=args.min_len, kcore=args.kcore),
        "model": model or ModelConfig(),
        "cost_model_file": args.cost_model,
        "memory_limit": parse_size(args.memory_limit, "--memory-limit"),
        "workers": args.workers,
        "executor": args.executor,
        "ray_address": args.ray_address,
    }


def _add_prepare(sub: argparse._SubParsersAction) -> None:
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
    _add_sample_options(p)
    p.add_argument("--max-reject-fraction", type=float, default=0.05)
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


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print a prepared dataset's accounting and balance report")
    p.add_argument("dataset", help="prepared dataset directory or s3:// prefix")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also read every file the manifest lists and check its size and xxh64 hash",
    )


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/")
    p.add_argument("name", help="balance | prepare | stats | bubbles | pec | quality | dispatch | sm_contention")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    from freescale.trainer.simulate.calibrate_options import HELP, add_arguments

    add_arguments(sub.add_parser("calibrate", help=HELP))


def cmd_calibrate(args: argparse.Namespace) -> int:
    from freescale.trainer.simulate.calibrate import run

    return run(args)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="generate demo data, prepare it, print the balance report, train 2 ranks")
    p.add_argument("--out", default="demo_out", help="working directory for the demo (default demo_out)")


def _add_stats(sub: argparse._SubParsersAction) -> None:
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
    _add_sample_options(p)
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
    "zch_max_probe": 16,
    "zch_bucket_size": 64,
    "zch_policy": "lru",
    "zch_ttl": None,
    "zch_admission": 1,
    "zch_lookup_events": 65_536,
}


def _add_zch_options(p: argparse.ArgumentParser) -> None:
    """``stats``' ZCH replay (docs/stats.md#zch-replay): off unless ``--zch-size`` is given."""
    p.add_argument(
        "--zch-size",
        type=int,
        help="replay the item ids in event-time order through a zero-collision table of this many rows "
        "(raw sources); reports hit/insert/collision/eviction rates and occupancy",
    )
    p.add_argument("--zch-max-probe", type=int, help="slots probed per id (default 16)")
    p.add_argument("--zch-bucket-size", type=int, help="rows per bucket (default 64)")
    p.add_argument("--zch-policy", help="eviction policy: lru (default), lfu or ttl")
    p.add_argument("--zch-ttl", type=int, help="policy ttl: seconds of event time an id may stay unseen")
    p.add_argument("--zch-admission", type=int, help="policy lfu: sightings before an id takes a slot (default 1)")
    p.add_argument(
        "--zch-lookup-events", type=int, help="events per lookup call (a training step's ids; default 65,536)"
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
        zch_size=args.zch_size,
        bucket_size=value["zch_bucket_size"],
        max_probe=value["zch_max_probe"],
        policy=value["zch_policy"],
        ttl=value["zch_ttl"],
        admission_threshold=value["zch_admission"],
    )


def _add_simulate(sub: argparse._SubParsersAction) -> None:
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


def _add_train(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="TABLE.OPTION=VALUE",
        help="override a config option with a TOML value, e.g. --set data.max_steps=50",
    )


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="TABLE.OPTION=VALUE")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="freescale", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"freescale {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = (_add_generate, _add_prepare, _add_inspect, _add_bench, _add_demo, _add_stats, _add_train)
    for add in (*commands, _add_evaluate, _add_calibrate, _add_simulate):
        add(sub)
    return parser


def generator_overrides(pairs: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings → typed generator options (types from ``GeneratorConfig``'s fields)."""
    from typing import get_type_hints

    from freescale.datasets.synthetic import GeneratorConfig
    from freescale.overrides import typed_overrides

    return typed_overrides(pairs, get_type_hints(GeneratorConfig))


def describe_generator_options(preset_name: str) -> str:
    from dataclasses import asdict

    from freescale.datasets.presets import preset

    values = asdict(preset(preset_name))
    return "\n".join(f"{key:20} {value!r}" for key, value in values.items())


def cmd_generate(args: argparse.Namespace) -> int:
    from freescale.datasets.presets import preset
    from freescale.datasets.synthetic import generate

    if args.list_options:
        print(f"generator options (values of the {args.preset} preset):")
        print(describe_generator_options(args.preset))
        return 0
    overrides = generator_overrides(args.overrides)
    if args.seed is not None:
        overrides["seed"] = args.seed
    config = preset(args.preset, **overrides)
    generate(config, args.out)
    print(f"wrote {args.preset} sources to {args.out} (source config: {Path(args.out) / 'sources.toml'})")
    return 0


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
        **_sample_options(args),
        balance=BalanceConfig(**balance_options),
        max_reject_fraction=args.max_reject_fraction,
        quarantine_examples=args.quarantine_examples,
        shard_size_limit=parse_size(args.shard_size_limit, "--shard-size-limit"),
        plan_memory=parse_size(args.plan_memory, "--plan-memory"),
        work_dir=args.work_dir,
        overwrite=args.overwrite,
        progress=not args.quiet,
        time_range=parse_time_range(args.time_range),
    )


def _early_pool(args: argparse.Namespace, writer: bool) -> Any:
    """Workers started before this process imports the pipeline, so both imports run at once; this
    process runs tasks too (one worker fewer), with the workers' settings. As many as the job's
    executor will use: ``--workers`` within ``--memory-limit`` (``memory.local_sizing``; ``writer``:
    the job reserves the writer process's memory). None: one process, or Ray."""
    from freescale.pipeline.executors.processes import (
        PREPARE_WORKER_MODULES,
        configure_task_process,
        no_transparent_huge_pages,
        start_pool,
    )
    from freescale.pipeline.memory import (  # no polars/pyarrow import
        allocator_purge_delay_ms,
        local_sizing,
        parse_size,
        preload_writer,
    )

    no_transparent_huge_pages()  # before any process starts: they all inherit it (Ray's included)
    pool = None
    if args.executor == "local":
        limit = parse_size(args.memory_limit, "--memory-limit")
        reserved = writer and preload_writer(limit)
        # before any process loads pyarrow: the workers inherit it (a user's own setting wins)
        os.environ.setdefault("MIMALLOC_PURGE_DELAY", str(allocator_purge_delay_ms(limit, args.workers, reserved)))
        processes = local_sizing(limit, args.workers, reserved).processes
        pool = start_pool(processes - 1, PREPARE_WORKER_MODULES) if processes > 1 else None
    configure_task_process()
    return pool


def cmd_prepare(args: argparse.Namespace) -> int:
    from freescale.pipeline.executors.processes import imports_without_gc

    pool = _early_pool(args, writer=True)
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
        where = entry.path or "(no events: not written)"
        print(f"{entry.name} [{entry.start}, {entry.end}): {entry.events:,} events, {entry.samples:,} samples  {where}")
    print(
        f"windows: {config.output} ({len(index.datasets(config.output))} datasets, windows.json); "
        f"{index.events_valid:,} valid events: {index.events_in_windows:,} in windows, "
        f"{index.events_outside_windows:,} outside every window"
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from freescale.pipeline.dataset.manifest import load_manifest
    from freescale.tools.report import print_prepare_summary

    manifest = load_manifest(args.dataset)
    print_prepare_summary(manifest)
    if args.verify:
        from freescale.pipeline.integrity import files_by_path, verify_all

        files = files_by_path(manifest)
        if files is None:
            raise ValueError(
                f"{args.dataset}: the manifest has no file table (prepared by an older FreeScale); "
                "re-run `freescale prepare --overwrite` to add it"
            )
        checked = verify_all(args.dataset, files)
        print(f"verified {len(files)} files ({checked:,} bytes): sizes and xxh64 hashes match the manifest")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    script = REPO_ROOT / "benchmarks" / f"bench_{args.name}.py"
    if not script.exists():
        available = sorted(p.stem.removeprefix("bench_") for p in (REPO_ROOT / "benchmarks").glob("bench_*.py"))
        raise ValueError(f"unknown benchmark {args.name!r}; available: {available}")
    return subprocess.call([sys.executable, str(script), *args.args])


def cmd_demo(args: argparse.Namespace) -> int:
    from freescale.tools.demo import MARKOV_PROB, demo_train

    out = Path(args.out)
    data = out / "sources"
    dataset = out / "prepared"
    print("== 1/3 generate the demo sources")
    markov = f"markov_prob={MARKOV_PROB}"  # planted sequential structure: the model has something to learn
    cmd_generate(build_parser().parse_args(["generate", "--preset", "demo", "--out", str(data), "--set", markov]))
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
    status = cmd_prepare(build_parser().parse_args(prepare_args))
    if status:
        return status
    print("== 3/3 train on 2 CPU ranks for about a minute; bubble table, then HR@10 / NDCG@10 vs most popular")

    return demo_train(str(data / "sources.toml"), str(out / "train"), seconds=60.0)


def cmd_stats(args: argparse.Namespace) -> int:
    from freescale.pipeline.executors.processes import imports_without_gc

    # the scan's workers, as prepare's (a prepared dataset hands them back unused)
    pool = _early_pool(args, writer=False)
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
            **_sample_options(args),
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


def cmd_train(args: argparse.Namespace) -> int:
    from freescale.trainer.launch import Nodes, launch

    overrides = list(args.overrides)
    if args.engine:
        overrides.append(f'engine.name="{args.engine}"')
    nodes = Nodes(args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_id, args.local_addr)
    return launch(args.config, nproc=args.nproc, device=args.device, overrides=overrides, nodes=nodes)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from freescale.trainer.launch import launch

    overrides = [*args.overrides, *([f"eval.data_path={json.dumps(args.data)}"] if args.data else [])]
    return launch(args.config, args.nproc, args.device, overrides, evaluate_checkpoint=args.checkpoint)


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
