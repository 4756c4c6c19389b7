"""The engine a run builds where its config says ``auto``: ``engine.overlap``, ``engine.balancer`` and
``engine.all_to_all``, agreed by every rank. The one training module that imports ``simulate/``
(tests/test_layout.py): ``auto`` is decided by the simulator's prediction (trainer/simulate/auto.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.trainer.config import RunConfig
from freescale.trainer.cpus import cores_per_rank


def overlap_choice(requested: str, device_type: str, cores_per_rank: int, threads: int) -> str:
    """``engine.overlap`` on this rank: ``auto`` is PEC where its communication thread can run beside the
    compute — on CUDA (the communication runs on a stream of its own) or when the rank has a core
    beyond its ``engine.threads`` compute threads — and synchronous otherwise.

    Why: on a CPU rank with one core, PEC's thread and gloo's collectives take the compute's own core,
    so nothing is hidden and PEC's extra work (masks, OL state, split gradients) is paid in full
    (bench_bubbles on 2 cores, one pinned core per rank: forward 30.7 -> 34.3 ms/step with PEC,
    74.5 vs 77.8 ms per step overall)."""
    if requested != "auto":
        return requested
    return "pec" if device_type == "cuda" or cores_per_rank > threads else "none"


def resolve_overlap(cfg: RunConfig, device: torch.device) -> str:
    """``overlap_choice`` agreed by every rank (collective): ranks must build the same engine."""
    mine = overlap_choice(cfg.engine.overlap, device.type, cores_per_rank(cfg.engine.pin_cpus), cfg.engine.threads)
    if cfg.engine.overlap != "auto" or cfg.engine.name == "torchrec":
        return mine
    vote = torch.tensor([1 if mine == "pec" else 0], device=device)
    dist.all_reduce(vote, op=dist.ReduceOp.MIN)
    return "pec" if int(vote.item()) else "none"


@dataclass
class Choices:
    """What this run builds: the resolved ``engine.overlap``, ``engine.balancer`` and
    ``engine.all_to_all``, and the prediction that decided them where any was ``auto`` (rank 0
    only; None otherwise)."""

    overlap: str
    balancer: str
    prediction: dict[str, Any] | None = None
    all_to_all: str = "flat"


def resolve_choices(cfg: RunConfig, device: torch.device, dataset: PreparedDataset, world_size: int) -> Choices:
    """``engine.overlap``, ``engine.balancer`` and ``engine.all_to_all`` for this run (collective:
    every rank builds the same).

    Explicit values run as given. ``auto`` is decided by the simulator's prediction for this run
    (trainer/simulate/auto.py) among what can run here: PEC only where ``overlap_choice`` gives its
    thread room; a hierarchical all-to-all only over two or more whole nodes. Rank 0 predicts and
    logs the prediction next to the pick; the others receive the pick.
    """
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    all_to_alls = cfg.engine.all_to_all_candidates(world_size, local)
    if cfg.engine.name == "torchrec":
        return Choices("torchrec", cfg.engine.balancer, None, all_to_alls[0])
    runnable = resolve_overlap(cfg, device)
    overlaps = ("none", "pec") if cfg.engine.overlap == "auto" and runnable == "pec" else (runnable,)
    balancers = ("none", "online") if cfg.engine.balancer == "auto" else (cfg.engine.balancer,)
    if len(overlaps) == 1 and len(balancers) == 1 and len(all_to_alls) == 1:
        return Choices(overlaps[0], balancers[0], None, all_to_alls[0])
    prediction = None
    pick = torch.zeros(3, dtype=torch.int64, device=device)
    if dist.get_rank() == 0:
        from freescale.trainer.simulate.auto import predict, probe

        seen = probe(dataset, world_size, cfg.data.seed)
        per_node = cfg.engine.nodes_of(world_size, local) if len(all_to_alls) > 1 else 0
        predicted = predict(cfg, seen, world_size, overlaps, balancers, all_to_alls, per_node)
        print(predicted.line(), flush=True)
        prediction = predicted.to_dict()
        pick[0], pick[1] = overlaps.index(predicted.overlap), balancers.index(predicted.balancer)
        pick[2] = all_to_alls.index(predicted.all_to_all)
    dist.broadcast(pick, src=0)
    return Choices(overlaps[int(pick[0])], balancers[int(pick[1])], prediction, all_to_alls[int(pick[2])])
