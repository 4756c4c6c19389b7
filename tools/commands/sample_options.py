"""Options shared by ``prepare`` and ``stats``: sample construction, cost model and resources (same meaning
in both), and the worker pool both start before they import the pipeline.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from freescale.tools.deprecation import DeprecatedAlias


def add_sample_options(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--max-reject-fraction",
        type=float,
        default=0.05,
        help="share of rows that may be rejected, over the event rows and over the users table's own rows, "
        "before the job fails (default 0.05)",
    )
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


def sample_options(args: argparse.Namespace) -> dict:
    """The config fields ``add_sample_options`` sets, for ``PrepareConfig`` and ``StatsConfig``."""
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
        "max_reject_fraction": args.max_reject_fraction,
    }


def early_pool(args: argparse.Namespace, writer: bool) -> Any:
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
