"""Does PEC train exactly like the synchronous engine? Runs both on batches with a chosen overlap rate.

``overlap_batches`` builds, for every step, a global set of distinct item ids of which a chosen share
(``overlap``) also occurred in the previous step's set — the ``batch_overlap_rate`` — spread over the
ranks with duplicates inside each micro-batch. Action ids equal item ids (the action table is as big
as the item table), so both tables see the same overlap and ``overlap = 0`` / ``1`` give empty OL /
empty NOL partitions in every table. Negatives are in-batch only, so no random id leaks in.

``RankPool`` keeps ``world_size`` gloo processes alive across many cases (the property tests draw
dozens): each case trains ``overlap = "none"`` and ``"pec"`` from the same seed in the same processes
and returns per-step losses and every piece of training state, which the caller compares bitwise.
"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from profile_cases import PROFILE_READS, USER_TABLES, profile_fields

from freescale.model_config import ModelConfig
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import Batch, collate
from freescale.trainer.engine_config import EngineConfig
from freescale.trainer.learning_config import ModelExtraConfig, OptimizerConfig
from freescale.trainer.loop_config import DataConfig


@dataclass
class OverlapCase:
    """One comparison: the batches' shape and overlap, the model and optimizer."""

    world_size: int = 2
    steps: int = 6
    samples_per_rank: int = 3
    ids_per_rank: int = 16  # distinct item ids each rank reads per step
    duplicates: int = 4  # extra repeated ids per rank and step
    overlap: float = 0.5  # batch_overlap_rate between consecutive global batches
    num_items: int = 2048
    d_model: int = 16
    sparse: str = "rowwise_adagrad"
    seed: int = 0
    stop_early: bool = False  # the loader holds one more batch than is trained (a time limit stopped the run)
    settle_every: int = 0  # > 0: settle() every that many steps, as evaluation and checkpoints do
    all_to_all: str = "flat"  # engine.all_to_all
    ranks_per_node: int = 0  # engine.ranks_per_node (emulated nodes of a hierarchical all-to-all)
    zch_size: int = 0  # > 0: the item table is zero-collision (model_extra.ids = "zch"), raw ids = the item ids
    zch_bucket_size: int = 8
    zch_max_probe: int = 4
    zch_policy: str = "lru"
    profiles: bool = False  # user-profile tables (profile_cases.py): a hashed feature and a zch user-id table

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap}")
        if self.ids_per_rank < 2 * self.samples_per_rank:
            raise ValueError("ids_per_rank must be >= 2 * samples_per_rank (two events per sample)")
        if 2 * self.world_size * self.ids_per_rank > self.num_items:
            raise ValueError("num_items must be >= 2 * world_size * ids_per_rank (room for fresh ids)")

    def run_config(self, overlap: str) -> RunConfig:
        return RunConfig(
            model=ModelConfig(d_model=self.d_model, num_layers=1, num_heads=2, num_negatives=0, max_uih_len=256),
            model_extra=self.model_extra(),
            data=DataConfig(path="unused"),
            user_tables=USER_TABLES if self.profiles else {},
            optimizer=OptimizerConfig(sparse=self.sparse, sparse_lr=0.1, dense_lr=0.01),
            engine=EngineConfig(
                seed=self.seed, overlap=overlap, all_to_all=self.all_to_all, ranks_per_node=self.ranks_per_node
            ),
        )

    def model_extra(self) -> ModelExtraConfig:
        if not self.zch_size:
            return ModelExtraConfig(num_items=self.num_items, num_actions=self.num_items, inbatch_negatives=4)
        ttl = 120 if self.zch_policy == "ttl" else 0
        return ModelExtraConfig(
            num_actions=self.num_items, inbatch_negatives=4, ids="zch", zch_size=self.zch_size,
            zch_bucket_size=self.zch_bucket_size, zch_max_probe=self.zch_max_probe, zch_policy=self.zch_policy,
            zch_ttl=ttl,
        )  # fmt: skip


def global_id_sets(case: OverlapCase) -> list[np.ndarray]:
    """Per step, the distinct ids of the global batch: ``overlap`` of them from the previous step's."""
    rng = np.random.default_rng([case.seed, 17])
    size = case.world_size * case.ids_per_rank
    sets = [rng.choice(case.num_items, size, replace=False)]
    for _ in range(case.steps - 1 + int(case.stop_early)):
        previous = sets[-1]
        kept = rng.choice(previous, round(case.overlap * size), replace=False)
        fresh_pool = np.setdiff1d(np.arange(case.num_items), previous)
        fresh = rng.choice(fresh_pool, size - kept.size, replace=False)
        sets.append(rng.permutation(np.concatenate([kept, fresh])))
    return sets


def overlap_batches(case: OverlapCase, rank: int) -> list[Batch]:
    """This rank's micro-batch of every step (its slice of the global set, plus duplicates)."""
    cfg = CollateConfig(
        num_items=case.num_items, num_actions=case.num_items, max_len=256, num_negatives=0, inbatch_negatives=4,
        profiles=PROFILE_READS if case.profiles else (),
    )  # fmt: skip
    batches = []
    for step, ids in enumerate(global_id_sets(case)):
        rng = np.random.default_rng([case.seed, step, rank])
        clock = 10 * step if case.zch_size else 0  # event time advances with the steps (zch ttl)
        mine = ids[rank * case.ids_per_rank : (rank + 1) * case.ids_per_rank]
        events = np.concatenate([mine, rng.choice(mine, case.duplicates)])
        cuts = np.sort(rng.choice(np.arange(2, events.size - 1, 2), case.samples_per_rank - 1, replace=False))
        samples = [
            {
                "item_ids": part,
                "actions": part,
                "timestamps": (np.arange(part.size) + clock) * 60,
                "cost": 1.0,
                "user_id": i,
                **(profile_fields(rng) if case.profiles else {}),
            }
            for i, part in enumerate(np.split(events, cuts))
        ]
        batches.append(collate(samples, cfg, step, rank, holdout=False))
    return batches


def training_state(engine: Any) -> dict[str, torch.Tensor]:
    """Every tensor training changes: table shards, sparse and dense optimizer state, dense weights."""
    engine.settle()
    state = {key: t.detach().cpu().clone() for key, t in engine.tables.local_state().items()}
    state |= {f"model.{k}": v.detach().cpu().clone() for k, v in engine.model.state_dict().items()}
    for index, param_state in engine.dense_optimizer.state_dict()["state"].items():
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor):
                state[f"dense_optimizer.{index}.{key}"] = value.detach().cpu().clone()
    return state


def train_case(case: OverlapCase, overlap: str, rank: int) -> dict[str, Any]:
    """Train ``case`` with one engine on this rank; losses per step and the final state."""
    from freescale.trainer.runner import make_engine, step_seed

    cfg = case.run_config(overlap)
    engine = make_engine(cfg, rank, case.world_size, torch.device("cpu"), cfg.engine.overlap)
    batches = iter(overlap_batches(case, rank))
    losses, extras = [], []
    try:
        for step in range(case.steps):
            torch.manual_seed(step_seed(cfg.engine.seed, step, rank))
            engine.timer.begin_step(step)
            engine.step(batches)
            record = engine.timer.end_step()
            losses.append(record.loss)
            extras.append(record.extra)
            if case.settle_every and (step + 1) % case.settle_every == 0:
                engine.settle()
        return {"losses": losses, "state": training_state(engine), "extras": extras}
    finally:
        engine.close()


def train_modes(case: dict[str, Any], overlaps: tuple[str, ...], rank: int) -> dict[str, Any]:
    """One task of ``RankPool``: ``case`` trained with each overlap on this rank."""
    return {overlap: train_case(OverlapCase(**case), overlap, rank) for overlap in overlaps}


def serve(rank: int, world_size: int, port: int, tasks: Any, results: Any) -> None:
    """A ``RankPool`` process: join the gloo group, then ``train(case, modes, rank)`` each task until ``None``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        while (task := tasks.get()) is not None:
            train, case, modes = task
            try:
                results.put((rank, train(case, modes, rank)))
            except BaseException as error:  # reported to the caller, which fails the comparison
                results.put((rank, error))
                raise
    finally:
        dist.destroy_process_group()
        gc.freeze()  # the process exits next: without finalization's collections (trainer/lifetime.exit_process)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RankPool:
    """``world_size`` long-lived gloo processes that train cases on request.

    The processes outlive a test module (``rank_pool`` in tests/trainer/engines/conftest.py: one pool
    per world size for the whole session, each start-up being 2-4 interpreters importing torch):
    each task names its own ``train`` function, and a task that fails ends the pool's processes (the
    conftest then starts a fresh pool)."""

    def __init__(self, world_size: int, train: Callable[..., dict] = train_modes) -> None:
        """``train(case, modes, rank)``: what each process runs per task unless ``run`` names another
        (``online_check`` passes its own); a module-level function, as a task pickles it by name."""
        context = mp.get_context("spawn")
        self.world_size = world_size
        self.train = train
        self.results = context.Queue()
        self.tasks = [context.Queue() for _ in range(world_size)]
        port = _free_port()
        self.processes = [
            context.Process(target=serve, args=(rank, world_size, port, self.tasks[rank], self.results), daemon=True)
            for rank in range(world_size)
        ]
        for process in self.processes:
            process.start()

    def alive(self) -> bool:
        return all(process.is_alive() for process in self.processes)

    def run(
        self,
        case: OverlapCase,
        overlaps: tuple[str, ...] = ("none", "pec"),
        timeout: float = 300,
        train: Callable[..., dict] | None = None,
    ) -> list[dict]:
        """Per rank: ``{overlap: {"losses", "state", "extras"}}`` (``train``: this pool's unless given)."""
        if case.world_size != self.world_size:
            raise ValueError(f"case.world_size {case.world_size} != pool world_size {self.world_size}")
        if not self.alive():
            raise RuntimeError(f"a process of this {self.world_size}-rank pool has exited (an earlier task failed)")
        for queue in self.tasks:
            queue.put((train or self.train, asdict(case), overlaps))
        by_rank: dict[int, Any] = {}
        try:
            for _ in range(self.world_size):
                rank, result = self.results.get(timeout=timeout)
                if isinstance(result, BaseException):
                    raise RuntimeError(f"rank {rank} failed on {case}") from result
                by_rank[rank] = result
        except BaseException:  # a failed or timed-out task: no later task may read its leftovers
            for process in self.processes:
                process.kill()
            raise
        return [by_rank[rank] for rank in range(self.world_size)]

    def close(self) -> None:
        """Kill the processes: every result is read, nothing is left to flush (a graceful exit of 6
        processes took 10 s at the end of the engines' tests on a loaded 2-core host)."""
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.join()


def mismatches(results: list[dict]) -> list[str]:
    """Where ``pec`` differs from ``none`` (losses or any state tensor), bitwise; empty when exact."""
    problems = []
    for rank, result in enumerate(results):
        none, pec = result["none"], result["pec"]
        if none["losses"] != pec["losses"]:
            problems.append(f"rank {rank} losses {none['losses']} != {pec['losses']}")
        for key, tensor in none["state"].items():
            if not torch.equal(tensor, pec["state"][key]):
                diff = (tensor - pec["state"][key]).abs().max().item()
                problems.append(f"rank {rank} {key} differs (max abs {diff:.3g})")
    return problems
