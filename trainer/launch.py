"""``freescale train``: validate the run config, then start torchrun with one process per rank.

The config is validated in the launching process first, so a typo fails in a second with a message
naming the option instead of after N ranks have imported torch. Children get ``PYTHONSAFEPATH=1``
(the working directory is not put on ``sys.path``: from the repository root the ``datasets/`` folder
would shadow Hugging Face's package) and ``OMP_NUM_THREADS`` = ``engine.threads``.

Several machines: run the same command on each with ``--nnodes N --node-rank R --rdzv-endpoint
HOST:PORT`` (``Nodes``): torchrun's c10d rendezvous, hosted by node 0's agent (``is_host``), so the
endpoint must be an address of node 0 that every node reaches (``rendezvous.py`` checks it first).
Ranks are numbered by the rendezvous; which machine holds rank 0 does not change the training (data
and table shards follow the rank).

Before torchrun starts, ``freescale train`` locks the run's folders and claims its checkpoint folder
(``run_dir.py``), and checks the checkpoint it will load against the config and the data
(``checkpoint_record.py``): what every rank would trip over, refused once in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from freescale.endpoints import host_port
from freescale.trainer.checkpoint_record import CheckpointRecord
from freescale.trainer.config import RunConfig
from freescale.trainer.lifetime import die_with_parent, run_group
from freescale.trainer.rendezvous import check_endpoint
from freescale.trainer.run_dir import RunFolders, claim_checkpoint_dir

if TYPE_CHECKING:
    from freescale.pipeline.dataset.manifest import Manifest


def rank_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m freescale.trainer", description="One rank of a FreeScale training run (started by torchrun)."
    )
    parser.add_argument("--config", required=True, help="run config TOML")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="TABLE.OPTION=VALUE",
        help="override a config option (TOML value), e.g. --set data.max_steps=20",
    )
    parser.add_argument("--evaluate-checkpoint", default="", help="score this checkpoint instead of training")
    return parser


def rank_main(argv: list[str] | None = None) -> int:
    """Run this process as one rank; config errors exit with status 2 and one line."""
    die_with_parent(signal.SIGKILL)  # torchrun's agent gone: this rank goes too
    # Ctrl-C reaches every rank (the launcher forwards it to the job): end at once as SIGTERM does, with no
    # KeyboardInterrupt traceback per rank and no clean-up collective waiting for ranks already gone
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    args = rank_parser().parse_args(argv)
    try:
        cfg = RunConfig.from_toml(args.config, args.overrides)
    except ValueError as error:
        print(f"freescale train: error: {error}", file=sys.stderr)
        return 2
    from freescale.pipeline.dataset.manifest import ManifestError
    from freescale.trainer.runner import TrainingError, main

    try:
        main(cfg, args.evaluate_checkpoint or None)
    except (TrainingError, ManifestError) as error:  # ManifestError: the dataset damaged or replaced mid-run
        rank = os.environ.get("RANK", "0")
        if not getattr(error, "everywhere", False) or rank == "0":  # the same verdict on every rank: said once
            print(f"freescale train: error: rank {rank}: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


@dataclass(frozen=True)
class Nodes:
    """Where the job's machines meet: ``nnodes`` machines, this one ``node_rank``, c10d at ``rdzv_endpoint``."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""  # HOST:PORT of node 0, needed with nnodes > 1
    rdzv_id: str = "freescale"
    local_addr: str = ""  # this node's address for its ranks' connections (default: from its hostname)

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and host_port(self.rdzv_endpoint) is None:
            raise ValueError(
                f"--rdzv-endpoint must be HOST:PORT of node 0 with --nnodes {self.nnodes}, got {self.rdzv_endpoint!r}"
            )
        if not self.rdzv_id or not self.rdzv_id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"--rdzv-id must be letters, digits, '-' or '_', got {self.rdzv_id!r}")

    def torchrun_args(self) -> list[str]:
        if self.nnodes == 1:
            return ["--standalone"]
        host = "1" if self.node_rank == 0 else "0"
        return [
            f"--nnodes={self.nnodes}",
            f"--node-rank={self.node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.rdzv_endpoint}",
            f"--rdzv-id={self.rdzv_id}",
            f"--rdzv-conf=is_host={host}",  # node 0 hosts the store; the others only connect
            *([f"--local-addr={self.local_addr}"] if self.local_addr else []),
        ]


def torchrun_command(
    config: str, nproc: int, overrides: list[str], nodes: Nodes | None = None, evaluate_checkpoint: str = ""
) -> list[str]:
    """The torchrun command line that starts ``nproc`` ranks on this machine (of ``nodes``)."""
    command = [
        sys.executable,
        "-m",
        "freescale.trainer.lifetime",  # torch.distributed.run tied to this process (lifetime.py)
        *(nodes or Nodes()).torchrun_args(),
        f"--nproc-per-node={nproc}",
        "-m",
        "freescale.trainer",
        "--config",
        str(Path(config).absolute()),
    ]
    for override in overrides:
        command += ["--set", override]
    if evaluate_checkpoint:
        command += ["--evaluate-checkpoint", str(Path(evaluate_checkpoint).absolute())]
    return command


def check_before_start(cfg: RunConfig, world_size: int, evaluate_checkpoint: str = "") -> CheckpointRecord | None:
    """What every rank would trip over, checked once here: a one-line error instead of N tracebacks.
    Returns the record of the checkpoint the ranks will load (resume or ``evaluate_checkpoint``), if any."""
    from freescale.optional import torchrec_unavailable
    from freescale.pipeline.dataset.manifest import load_manifest
    from freescale.trainer.user_tables import resolve_user_tables

    if cfg.engine.name == "torchrec" and (reason := torchrec_unavailable("engine.name 'torchrec'")):
        raise ValueError(f"{reason}; engine.name = 'freescale' needs neither")
    cfg.check_world(world_size)
    manifest = load_manifest(cfg.data.path)  # a missing or unfinished dataset names itself
    group = manifest.layout.group_size
    if group % world_size:
        divisors = [w for w in range(1, group + 1) if group % w == 0]
        raise ValueError(
            f"the world size {world_size} (--nproc x --nnodes) does not divide the group size {group} of "
            f"{cfg.data.path} (balanced world sizes: {divisors}; or prepare again with --group-size)"
        )
    check_table_sizes(cfg, manifest.table_sizes())
    cfg = resolve_user_tables(cfg, manifest.layout.user_features, manifest.table_sizes(), cfg.data.path)
    check_eval_path(cfg, manifest)
    return check_checkpoint(cfg, manifest, world_size, evaluate_checkpoint)


def check_checkpoint(
    cfg: RunConfig, manifest: Manifest, world_size: int, evaluate_checkpoint: str = ""
) -> CheckpointRecord | None:
    """The checkpoint the ranks will load, from its record: finished and trusted, of this model's shapes,
    of this data (unless ``checkpoint.allow_other_data``) and, for a resume (or any zch table), of this
    world size."""
    from freescale.trainer.checkpoint_dirs import resolve_resume
    from freescale.trainer.checkpoint_record import (
        DataIdentity,
        check_data,
        check_files,
        check_model,
        check_user_table_set,
        check_world_size,
        model_options,
        run_record_of,
        vocabulary_tables,
    )
    from freescale.trainer.continuation import check_continuation, continues
    from freescale.trainer.eval.protocol import table_rows

    if evaluate_checkpoint:
        if cfg.engine.name != "freescale":
            raise ValueError("freescale evaluate loads FreeScale engine checkpoints: leave engine.name = 'freescale'")
        path = resolve_resume(cfg.checkpoint.dir, evaluate_checkpoint)  # a finished checkpoint this user trusts
    else:
        path = resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume) if cfg.checkpoint.dir else None
    if path is None:
        return None
    record, run = run_record_of(path, "--checkpoint" if evaluate_checkpoint else "checkpoint.resume")
    where = f"checkpoint {path}"
    check_files(path, record, "--checkpoint" if evaluate_checkpoint else "checkpoint.resume")
    if not evaluate_checkpoint:
        check_world_size(record, world_size, where)
    elif cfg.zch_tables() and record.world_size != world_size:  # buckets and rows follow the ranks
        option = cfg.zch_tables()[0][0]
        raise ValueError(
            f"{where} was written by {record.world_size} ranks: a {option}.ids 'zch' table (one fallback row "
            f"per rank, each rank's buckets) does not reshard; evaluate it with --nproc {record.world_size}"
        )
    data = DataIdentity.of(cfg.data.path, manifest)
    rows = table_rows(cfg.model_extra, manifest.table_sizes())
    if not evaluate_checkpoint and continues(run, data, cfg):  # the next window: docs/training.md#streaming-windows
        check_continuation(run, data, cfg, rows, where)
    else:
        tables = vocabulary_tables(cfg)
        check_data(run, data, where, cfg.checkpoint.allow_other_data, not evaluate_checkpoint, tables)
        check_user_table_set(run, cfg, where)
    check_model(run, model_options(cfg, rows), where)
    return record


def check_eval_path(cfg: RunConfig, manifest: Manifest) -> None:
    """``eval.data_path``: a finished dataset whose ids mean this run's rows (``continuation.check_eval_data``)."""
    from freescale.pipeline.dataset.manifest import load_manifest
    from freescale.trainer.checkpoint_record import DataIdentity
    from freescale.trainer.continuation import check_eval_data

    if not cfg.eval.data_path:
        return
    try:
        evaluated = load_manifest(cfg.eval.data_path)
    except (OSError, ValueError) as error:
        raise ValueError(f"eval.data_path: {error}") from None
    trained = DataIdentity.of(cfg.data.path, manifest)
    check_eval_data(cfg, trained, DataIdentity.of(cfg.eval.data_path, evaluated))


def check_cuda_devices(cfg: RunConfig, nproc: int, visible: int) -> None:
    """Enough GPUs for ``nproc`` ranks on this machine, or ``engine.share_gpus`` to put several on one."""
    if visible == 0:
        raise ValueError("engine.device is 'cuda' but no CUDA device is visible (torch.cuda.device_count() is 0)")
    if nproc > visible and not cfg.engine.share_gpus:
        raise ValueError(
            f"--nproc {nproc} needs {nproc} CUDA devices, {visible} visible (NCCL takes one GPU per rank); "
            "set engine.share_gpus = true to run several ranks per GPU (gloo collectives, copy-engine "
            "all-to-alls through CUDA IPC: for checks, not for speed)"
        )


def check_table_sizes(cfg: RunConfig, table_sizes: dict[str, int]) -> None:
    """A configured table smaller than the dataset's vocabulary (``table_sizes``: the manifest's rows
    per table; ``protocol.resolve_tables`` on every rank says the same; this says it once, before any
    rank starts)."""
    if cfg.model_extra.ids != "exact":
        return
    for table, option in (("item", "num_items"), ("action", "num_actions")):
        size, configured = table_sizes.get(table), getattr(cfg.model_extra, option)
        if size is not None and configured and configured < size:
            raise ValueError(
                f"model_extra.{option} = {configured} is smaller than the {size} {table} ids of {cfg.data.path}; "
                f"leave it at 0 to use the vocabulary size or set it >= {size}"
            )


def launch(
    config: str,
    nproc: int = 1,
    device: str | None = None,
    overrides: list[str] | None = None,
    nodes: Nodes | None = None,
    evaluate_checkpoint: str = "",
) -> int:
    """Validate ``config`` (+ overrides), then run torchrun (this machine's part of ``nodes``) and
    return its exit status. ``evaluate_checkpoint``: score that checkpoint instead of training."""
    nodes = nodes or Nodes()
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    overrides = list(overrides or [])
    if device is not None:
        overrides.append(f'engine.device="{device}"')
    cfg = RunConfig.from_toml(config, overrides)
    if cfg.engine.device == "cuda":
        import torch

        check_cuda_devices(cfg, nproc, torch.cuda.device_count())
    owner = nodes.node_rank == 0 and not evaluate_checkpoint  # the node that locks and claims the folders
    with RunFolders(cfg) if owner else contextlib.nullcontext():
        record = check_before_start(cfg, nproc * nodes.nnodes, evaluate_checkpoint)
        cfg.engine.nodes_of(nproc * nodes.nnodes, nproc)  # a hierarchical all-to-all needs whole nodes
        if owner and cfg.checkpoint.dir:
            claim_checkpoint_dir(cfg.checkpoint.dir, record.run.run_id if record and record.run else None)
        if nodes.nnodes > 1:
            check_endpoint(nodes.rdzv_endpoint, hosting=nodes.node_rank == 0)
        env = dict(os.environ, PYTHONSAFEPATH="1", OMP_NUM_THREADS=str(cfg.engine.threads))
        return run_group(torchrun_command(config, nproc, overrides, nodes, evaluate_checkpoint), env)
