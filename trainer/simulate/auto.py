"""``engine.overlap = "auto"`` and ``engine.balancer = "auto"`` decided by prediction (docs/training.md#auto-choices).

At start every rank predicts the step time of each candidate with ``freescale simulate``'s model
(docs/simulate.md) for this run: its W, the dataset's micro-batch size k, the sample lengths and the
``batch_overlap_rate`` of its first ``PROBE_STEPS`` steps (every rank's micro-batches, read from the
prepared dataset, so every rank computes the same prediction), the model's width, layers and
negatives, and the hardware profile ``engine.auto_profile`` (a calibrated ``engine.balancer_cost_model``
replaces the profile's per-sample cost). It picks the fastest candidate (the simpler one on a tie:
``none`` before ``pec``, no balancer before ``online``); the runner logs the prediction next to the
pick. An explicit ``pec``/``none``/``online`` is never predicted: it is what runs.

Why a prediction and not a rule: whether PEC pays depends on the compute it hides behind against
the latency of its extra exchanges, which changes with W, k, the model and the network
(benchmarks/bench_scale.py: the break-even step time per W); a fixed choice loses somewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import pairwise, product
from typing import Any

import numpy as np

from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.trainer.config import RunConfig
from freescale.trainer.simulate.sim_config import HardwareProfile, SimConfig, WorkloadConfig
from freescale.trainer.simulate.sim_inputs import LengthSource
from freescale.trainer.simulate.simulator import find, simulate

PROBE_STEPS = 4  # steps of every rank's micro-batches read to measure lengths and batch_overlap_rate
SIM_STEPS = 16


@dataclass
class Probe:
    """What the first steps of this run read: every sample's length, the item ids' overlap between
    consecutive global batches, k and the dataset's batching strategy."""

    lengths: np.ndarray
    batch_overlap_rate: float
    micro_batch_size: int
    strategy: str


def batch_overlap_rate(global_ids: list[np.ndarray]) -> float:
    """Mean over consecutive global batches of |ids(s) ∩ ids(s+1)| / |ids(s+1)| (distinct ids; 0 with
    fewer than two batches): the share of a step's rows the previous step updates (docs/definitions.md)."""
    rates = []
    for now, nxt in pairwise(global_ids):
        distinct = np.unique(nxt)
        if distinct.size:
            rates.append(float(np.isin(distinct, now).mean()))
    return float(np.mean(rates)) if rates else 0.0


def probe(dataset: PreparedDataset, world_size: int, seed: int) -> Probe:
    """Lengths and item-id overlap of the first ``PROBE_STEPS`` steps, every rank's micro-batch."""
    steps = min(PROBE_STEPS, dataset.steps_per_epoch(world_size))
    lengths, global_ids, batches = [], [], 0
    for step in range(steps):
        ids = []
        for rank in range(world_size):
            rows = dataset.micro_batch(dataset.micro_batch_index(step, rank, world_size, seed))
            lengths.extend(int(row["length"]) for row in rows)
            ids.extend(np.asarray(row["item_ids"], dtype=np.int64) for row in rows)
            batches += 1
        global_ids.append(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64))
    if not lengths:
        raise ValueError(f"{dataset.uri}: engine auto choices found no samples in the first {steps} steps")
    k = max(1, round(len(lengths) / batches))
    strategy = dataset.info.layout.strategy or "planned"
    return Probe(np.asarray(lengths, dtype=np.int64), batch_overlap_rate(global_ids), k, strategy)


@dataclass
class Prediction:
    """Predicted step milliseconds of every candidate (overlap, balancer) and the pick."""

    step_ms: dict[str, float]
    overlap: str
    balancer: str
    profile: str
    inputs: dict[str, Any] = field(default_factory=dict)
    all_to_all: str = "flat"

    def line(self) -> str:
        """One log line: the inputs, every candidate's predicted step, the pick."""
        shown = ", ".join(f"{name} {ms:.3f} ms" for name, ms in self.step_ms.items())
        facts = ", ".join(f"{k} {v}" for k, v in self.inputs.items())
        return (f"engine auto: predicted step {shown} on {self.profile} ({facts}) -> "
                f"overlap={self.overlap}, balancer={self.balancer}, all_to_all={self.all_to_all}")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"step_ms": self.step_ms, "overlap": self.overlap, "balancer": self.balancer,
                "all_to_all": self.all_to_all, "profile": self.profile, "inputs": self.inputs}  # fmt: skip


def candidates(
    overlaps: tuple[str, ...], balancers: tuple[str, ...], all_to_alls: tuple[str, ...] = ("flat",)
) -> list[tuple[str, str, str]]:
    """(overlap, balancer, all_to_all) triples in tie-break order: the simpler first."""
    return list(product(overlaps, balancers, all_to_alls))


def candidate_name(overlap: str, balancer: str, all_to_all: str, all_to_alls: tuple[str, ...]) -> str:
    """``overlap/balancer``, and ``/all_to_all`` where that is a choice too."""
    return f"{overlap}/{balancer}" + (f"/{all_to_all}" if len(all_to_alls) > 1 else "")


def predict(
    cfg: RunConfig,
    seen: Probe,
    world_size: int,
    overlaps: tuple[str, ...],
    balancers: tuple[str, ...],
    all_to_alls: tuple[str, ...] = ("flat",),
    ranks_per_node: int = 0,
) -> Prediction:
    """The simulator's step time of every (overlap, balancer, all_to_all) candidate for this run; the
    fastest wins. ``ranks_per_node``: the run's nodes (else the profile's), what a hierarchical
    all-to-all groups by."""
    profile = HardwareProfile.load(cfg.engine.auto_profile)
    compute = profile.compute
    if cfg.engine.balancer_cost_model:
        compute = replace(compute, cost_model=cfg.engine.balancer_cost_model)
    base = "random" if seen.strategy == "random" else "plan"
    arms = {"none": base, "online": "online" if base == "random" else "plan_online"}
    workload = WorkloadConfig(
        micro_batch_size=seen.micro_batch_size, steps=SIM_STEPS, embedding_dim=cfg.model.d_model,
        num_layers=cfg.model.num_layers, negatives=cfg.model.num_negatives,
        batch_overlap_rate=seen.batch_overlap_rate, balancer_min_gain=cfg.engine.balancer_min_gain,
    )  # fmt: skip
    network = profile.network if not ranks_per_node else replace(profile.network, ranks_per_node=ranks_per_node)
    lengths = LengthSource(origin="the run's first steps", kind="data", values=seen.lengths)
    step_ms = {}
    for all_to_all in all_to_alls:
        sim = SimConfig(
            world_sizes=(world_size,), arms=tuple(dict.fromkeys(arms[b] for b in balancers)), overlaps=overlaps,
            seed=cfg.engine.seed, compute=compute, network=replace(network, all_to_all=all_to_all),
            jitter=profile.jitter, workload=workload,
        )  # fmt: skip
        report = simulate(sim, lengths)
        for overlap, balancer in product(overlaps, balancers):
            name = candidate_name(overlap, balancer, all_to_all, all_to_alls)
            step_ms[name] = 1e3 * find(report, world_size, arms[balancer], overlap)["step_s"]
    order = [candidate_name(*c, all_to_alls) for c in candidates(overlaps, balancers, all_to_alls)]
    step_ms = {name: step_ms[name] for name in order}  # tie-break order: the simpler first
    best = min(step_ms, key=lambda name: step_ms[name])  # first of equals: the simpler candidate
    overlap, balancer, *rest = best.split("/")
    all_to_all = rest[0] if rest else all_to_alls[0]
    inputs = {"W": world_size, "k": seen.micro_batch_size, "batch_overlap_rate": round(seen.batch_overlap_rate, 4),
              "samples": int(seen.lengths.size), "median_length": float(np.median(seen.lengths))}  # fmt: skip
    return Prediction(step_ms, overlap, balancer, profile.name, inputs, all_to_all)
