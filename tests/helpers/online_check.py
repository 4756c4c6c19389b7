"""Does the online balancer train the same model as no balancer? Runs both in one pool of gloo ranks.

``OnlineCase`` describes steps of heavy-tailed sample lengths (lognormal, or an explicit per-step,
per-rank schedule for the edge cases); ``case_batches`` turns them into each rank's micro-batches
with random item/action ids, uniform and in-batch negatives. ``train_online_modes`` is the task the
``pec_check.RankPool`` processes run: each task trains the case once per mode (``none``,
``online``, ``pec``, ``pec+online``) from the same seed, optionally stopping at ``resume_at``,
saving a checkpoint and continuing in a fresh engine. ``differences`` compares two modes within a
relative tolerance (the online balancer regroups samples, so sums are reassociated: not bitwise).

Learning rates: training amplifies float differences chaotically. Measured on 2 ranks, seed 11: at
dense 1e-2 / sparse 5e-2 the worst state tensor (Adam's first moment) differs by 1e-6 relative after
10 steps, 3e-5 after 25 and 6e-4 after 50, while losses stay within 2.3e-6; at dense 1e-3 / sparse
1e-2 everything stays within 9e-6 after 50 steps. The defaults are the latter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pec_check import training_state
from profile_cases import PROFILE_READS, USER_TABLES, profile_fields

from freescale.model_config import ModelConfig
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import Batch, collate
from freescale.trainer.engine_config import EngineConfig
from freescale.trainer.learning_config import ModelExtraConfig, OptimizerConfig
from freescale.trainer.loop_config import DataConfig


@dataclass
class OnlineCase:
    """Steps of samples per rank; ``schedule[step][rank]`` lists sample lengths (events) when given."""

    world_size: int = 2
    steps: int = 6
    samples_per_rank: int = 4
    median_length: int = 12
    sigma: float = 1.0
    max_length: int = 120
    schedule: list = field(default_factory=list)
    num_items: int = 512
    d_model: int = 16
    num_negatives: int = 4
    inbatch_negatives: int = 4
    architecture: str = "hstu"
    sparse: str = "rowwise_adagrad"
    dense: str = "adam"
    seed: int = 0
    dense_lr: float = 1e-3  # see the module docstring: larger rates amplify reassociation chaotically
    sparse_lr: float = 0.01
    resume_at: int = 0  # > 0: checkpoint after this many steps and continue in a new engine
    checkpoint_dir: str = ""
    min_gain: float = 0.0  # engine.balancer_min_gain: 0 so every move LPT finds is exercised (default 2%)
    zch_size: int = 0  # > 0: the item table is zero-collision (model_extra.ids = "zch"; raw ids = the item ids)
    zch_policy: str = "lru"
    profiles: bool = False  # user-profile tables (profile_cases.py): a hashed feature and a zch user-id table

    def run_config(self, mode: str) -> RunConfig:
        return RunConfig(
            model=ModelConfig(
                d_model=self.d_model, num_layers=1, num_heads=2, num_negatives=self.num_negatives, max_uih_len=256
            ),
            model_extra=self.model_extra(),
            data=DataConfig(path="unused"),
            optimizer=OptimizerConfig(
                dense=self.dense, sparse=self.sparse, sparse_lr=self.sparse_lr, dense_lr=self.dense_lr
            ),
            user_tables=USER_TABLES if self.profiles else {},
            engine=EngineConfig(
                seed=self.seed,
                overlap="pec" if "pec" in mode else "none",
                balancer="online" if "online" in mode else "none",
                balancer_min_gain=self.min_gain if "online" in mode else EngineConfig.balancer_min_gain,
            ),
        )

    def model_extra(self) -> ModelExtraConfig:
        common = {"architecture": self.architecture, "num_actions": 8, "inbatch_negatives": self.inbatch_negatives}
        if not self.zch_size:
            return ModelExtraConfig(num_items=self.num_items, **common)
        zch = {"zch_size": self.zch_size, "zch_bucket_size": 16, "zch_max_probe": 4, "zch_policy": self.zch_policy}
        return ModelExtraConfig(ids="zch", zch_ttl=20_000 if self.zch_policy == "ttl" else 0, **zch, **common)

    def lengths(self, step: int, rank: int) -> list[int]:
        if self.schedule:
            return list(self.schedule[step][rank])
        rng = np.random.default_rng([self.seed, step, rank, 1])
        raw = np.exp(rng.normal(np.log(self.median_length), self.sigma, self.samples_per_rank))
        return np.clip(raw.astype(np.int64), 2, self.max_length).tolist()


def case_batches(case: OnlineCase, rank: int) -> list[Batch]:
    """This rank's micro-batch of every step."""
    cfg = CollateConfig(
        num_items=case.num_items,
        num_actions=8,
        max_len=256,
        num_negatives=case.num_negatives,
        inbatch_negatives=case.inbatch_negatives,
        seed=case.seed,
        profiles=PROFILE_READS if case.profiles else (),
    )
    batches = []
    for step in range(case.steps):
        rng = np.random.default_rng([case.seed, step, rank, 2])
        samples = [
            {
                "item_ids": rng.integers(0, case.num_items, n),
                "actions": rng.integers(0, 8, n),
                "timestamps": np.cumsum(rng.integers(1, 5000, n)) + (10_000 * step if case.zch_size else 0),
                "cost": float(n),
                "user_id": i,
                **(profile_fields(rng) if case.profiles else {}),
            }
            for i, n in enumerate(case.lengths(step, rank))
        ]
        batches.append(collate(samples, cfg, step, rank, holdout=False))
    return batches


def _run_steps(engine: Any, cfg: RunConfig, batches: Any, steps: range, rank: int) -> tuple[list, list]:
    from freescale.trainer.runner import step_seed

    losses, extras = [], []
    for step in steps:
        torch.manual_seed(step_seed(cfg.engine.seed, step, rank))
        engine.timer.begin_step(step)
        engine.step(batches)
        record = engine.timer.end_step()
        losses.append(record.loss)
        extras.append(record.extra)
    return losses, extras


def train_online_case(case: OnlineCase, mode: str, rank: int) -> dict[str, Any]:
    """Train ``case`` in ``mode`` on this rank (with a checkpoint/resume at ``resume_at``)."""
    from freescale.trainer.runner import make_engine

    cfg = case.run_config(mode)
    device = torch.device("cpu")
    batches = iter(case_batches(case, rank))
    engine = make_engine(cfg, rank, case.world_size, device, cfg.engine.overlap)
    cut = case.resume_at or case.steps
    try:
        losses, extras = _run_steps(engine, cfg, batches, range(cut), rank)
        if case.resume_at:
            path = engine.checkpointer().save(os.path.join(case.checkpoint_dir, mode), cut)
            engine.close()
            engine = make_engine(cfg, rank, case.world_size, device, cfg.engine.overlap)
            assert engine.checkpointer().load(path) == cut
            more = _run_steps(engine, cfg, iter(case_batches(case, rank)[cut:]), range(cut, case.steps), rank)
            losses, extras = losses + more[0], extras + more[1]
        return {"losses": losses, "state": training_state(engine), "extras": extras}
    finally:
        engine.close()


def train_online_modes(case: dict[str, Any], modes: tuple[str, ...], rank: int) -> dict[str, Any]:
    """One task of ``pec_check.RankPool(train=train_online_modes)``: ``case`` in each mode on this rank."""
    return {mode: train_online_case(OnlineCase(**case), mode, rank) for mode in modes}


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |a| (0 when both are zero): a tensor's error relative to its own scale."""
    scale = float(a.abs().max()) if a.numel() else 0.0
    diff = float((a - b).abs().max()) if a.numel() else 0.0
    return diff / scale if scale > 0 else diff


def differences(results: list[dict], base: str, other: str, rtol: float = 1e-5) -> list[str]:
    """Where ``other`` differs from ``base`` by more than ``rtol``: per-step losses and every state tensor."""
    problems = []
    for rank, result in enumerate(results):
        a, b = result[base], result[other]
        for step, (x, y) in enumerate(zip(a["losses"], b["losses"], strict=True)):
            if abs(x - y) > rtol * max(abs(x), 1e-30) and x != y:
                problems.append(f"rank {rank} step {step} loss {x!r} vs {y!r}")
        for key, tensor in a["state"].items():
            rel = relative_difference(tensor, b["state"][key])
            if rel > rtol:
                problems.append(f"rank {rank} {key} differs by {rel:.3g} relative")
    return problems
