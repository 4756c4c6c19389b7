"""The paper's online load balancer inside the FreeScale engine (DESIGN §4 "Online"): ``engine.balancer = "online"``.

It replaces the engine's ``forward_backward`` (the only part of the step that changes), so it
composes with ``engine.overlap = "none"`` (``OnlineEngine``) and ``"pec"`` (``OnlinePECEngine``,
whose step calls the same method) and with any ``engine.transport``: every exchange below is a
``TimedTransport.all_to_all``. The three stages, after the embedding communication:

1. *Costs and placement* (``balance_exchange``, ``balance_place``): two small all-to-alls tell every
   rank each rank's (samples, negatives) counts and every sample's length; the cost is the model
   ``prepare`` plans with (``CostModel.from_model(cfg.model)``, or the calibrated file named by
   ``engine.balancer_cost_model``) of the sample's length as trained (after holdout and truncation).
   ``balancer.place_samples`` (the planner's ``lpt_free``) then gives every rank the same placement;
   a rank computes what it will receive from it, so no count is exchanged twice.
2. *Dispatch* (``dispatch``): a sample moves as one unit of ``kernels.dispatch_jagged`` rows, one row
   per position: its input item row, input action row and target row (``3d`` floats, the
   differentiable part) and the input timestamp and target id (int64 bits carried as two float32
   each). Each home also sends its negatives (rows and ids) once to every rank that received at least
   one of its samples. The destination makes the received floats leaves, runs the model and the loss.
3. *Combine* (``combine``): the leaves' gradients go back through the transport and
   ``combine_jagged`` into home order; the negatives' gradients and each home's partial loss ride
   back in one more all-to-all and are summed at home in source-rank order. ``torch.autograd.backward``
   from the home unit tensors reaches the unique-row leaves, and the step continues as usual
   (``grad_dist``, dense all-reduce, sparse and dense updates).

Placement-invariant math (why ``online`` and ``none`` train the same model up to float
reassociation, and why ``none``'s numbers are untouched):

* A sample's positions are weighted by ``1 / positions of its home micro-batch`` wherever they are
  computed, so a rank's computed loss is ``Σ_home (Σ its positions here ℓ) / P_home`` and the sum
  over ranks is ``Σ_home mean_home``: exactly what ``none`` all-reduces. Dense gradients are still
  summed and divided by ``W`` and embedding gradients summed, so nothing after the step changes.
  The loss a rank reports is its home micro-batch's mean (the partials sent back home).
* Negatives are per *home* micro-batch (``draw_negatives`` seeds them with (seed, step, home rank)
  and takes in-batch negatives from the home's targets); a sample is scored against its home's
  negatives on whatever rank computes it, in one loss group per home on the destination. So
  in-batch negatives stay those of the micro-batch the sample came from.
* The dense model treats samples independently (HSTU divides by the sample's own length; the jagged
  layout pads nothing into a sample), so regrouping samples changes only summation order.
  Dropout draws from the destination's RNG: with ``model_extra.dropout > 0`` the two modes train
  equally well but not the same bits.

Per step, ``StepRecord.extra`` gets the balancer's own overhead in ms (``balancer.exchange_ms``,
``placement_ms``, ``dispatch_ms``, ``combine_ms``), ``balancer.imbalance_before`` / ``_after``
(max / mean rank cost under the cost model, home vs balanced placement) and ``balancer.moved``
(samples this rank sent away). On CUDA ``dispatch_jagged``/``combine_jagged`` pick their Triton
kernels by default (same interface); nothing here needs a GPU to import or run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from freescale.kernels.dispatch import DispatchPlan, JaggedRows, combine_jagged, dispatch_jagged
from freescale.pipeline.cost import CostModel
from freescale.trainer.balancer import imbalance, place_samples, rank_loads
from freescale.trainer.config import RunConfig
from freescale.trainer.data import Batch
from freescale.trainer.engine import FreeScaleEngine
from freescale.trainer.jagged import build_layout
from freescale.trainer.model import sampled_softmax_terms
from freescale.trainer.pec import PECEngine
from freescale.trainer.sharded import DistContext


@dataclass
class StepPlan:
    """The step's global view (identical on every rank) and this rank's part of it."""

    samples: np.ndarray  # [W] samples per home rank
    negatives: np.ndarray  # [W] negatives per home rank
    positions: np.ndarray  # [N] positions (inputs) per sample, global order (rank-major)
    homes: np.ndarray  # [N] home rank per sample
    dest: np.ndarray  # [N] rank that computes each sample
    rank: int

    @property
    def world_size(self) -> int:
        return int(self.samples.size)

    def mine(self) -> slice:
        start = int(self.samples[: self.rank].sum())
        return slice(start, start + int(self.samples[self.rank]))

    def received(self) -> np.ndarray:
        """Global indices of the samples this rank computes (source-major, home order within)."""
        return np.flatnonzero(self.dest == self.rank)

    def value_counts_from(self) -> list[int]:
        """Positions this rank receives from each source."""
        got = self.received()
        return np.bincount(self.homes[got], weights=self.positions[got], minlength=self.world_size).astype(int).tolist()

    def sources(self) -> np.ndarray:
        """Whether each home rank sends at least one sample here."""
        return np.bincount(self.homes[self.received()], minlength=self.world_size) > 0

    def targets(self) -> np.ndarray:
        """Whether this rank sends at least one sample to each rank."""
        return np.bincount(self.dest[self.mine()], minlength=self.world_size) > 0

    def home_positions(self) -> np.ndarray:
        """[W] positions of each home micro-batch (the loss weight's denominator)."""
        return np.bincount(self.homes, weights=self.positions, minlength=self.world_size)


@dataclass
class Received:
    """What this rank computes: leaves of the units and of each source's negatives."""

    units: torch.Tensor  # [P, 3d] leaf: input item, input action, target rows
    timestamps: torch.Tensor  # [P]
    target_ids: torch.Tensor  # [P]
    negatives: torch.Tensor  # [ΣK_s, d] leaf
    negative_ids: torch.Tensor  # [ΣK_s]


def bits(values: torch.Tensor) -> torch.Tensor:
    """int64 ``[n]`` as float32 ``[n, 2]`` (exact: the bits ride along, as PEC does with row keys)."""
    return values.to(torch.int64).contiguous().view(torch.float32).view(-1, 2)


def unbits(values: torch.Tensor) -> torch.Tensor:
    return values.contiguous().view(torch.int64).view(-1)


def balancer_cost_model(cfg: RunConfig) -> CostModel:
    """The cost model ``prepare`` plans with: ``engine.balancer_cost_model`` (a calibrated file, as
    passed to ``prepare --cost-model``) or, by default, the analytic model of ``[model]``."""
    path = cfg.engine.balancer_cost_model
    return CostModel.from_file(path) if path else CostModel.from_model(cfg.model)


class OnlineBalancing:
    """Mixin over ``FreeScaleEngine``/``PECEngine``: ``forward_backward`` on the balanced placement."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int, device: torch.device) -> None:
        super().__init__(cfg, rank, world_size, device)  # type: ignore[call-arg]
        self.cost_model = balancer_cost_model(cfg)
        self._overhead: dict[str, float] = {}

    def describe(self) -> str:
        return super().describe() + "; online balancer (samples dispatched per step by cost)"  # type: ignore[misc]

    # the step's replacement of forward + backward ------------------------------------------------
    def forward_backward(
        self, batch: Batch, ctx: DistContext, unique_rows: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Balance, compute the placed samples, send gradients home; returns (home loss, row grads)."""
        self.model.train()
        leaves = [rows.requires_grad_() for rows in unique_rows]
        plan = self._timed("exchange", "balance_exchange", "comm", self._exchange, batch)
        plan = self._timed("placement", "balance_place", "compute", self._place, plan)
        with self.timer.stage("forward", "compute"):
            rows = self.tables.feature_rows(ctx, leaves)
            units = torch.cat([rows["item"][batch.input_index], rows["action"][batch.input_index],
                               rows["item"][batch.target_index]], dim=1)  # fmt: skip
            negatives = rows["neg"]
        received, dispatch_plan = self._timed(
            "dispatch", "dispatch", "comm", self._dispatch, batch, units, negatives, plan
        )
        with self.timer.stage("forward", "compute"):
            local_loss, partials = self._placed_loss(received, plan)
        with self.timer.stage("backward", "compute"):
            local_loss.backward()
        unit_grads, negative_grads, loss = self._timed(
            "combine", "combine", "comm", self._combine, received, partials, plan, dispatch_plan, negatives.shape[0]
        )
        with self.timer.stage("backward", "compute"):
            torch.autograd.backward([units, negatives], [unit_grads, negative_grads])
        self._record_balance(plan)
        return loss, [leaf.grad for leaf in leaves]

    def _timed(self, key: str, stage: str, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` as a timed stage and keep its milliseconds for the step's record."""
        start = self.timer.now()
        with self.timer.stage(stage, kind):
            result = fn(*args)
        self._overhead[key] = self._overhead.get(key, 0.0) + (self.timer.now() - start) * 1e3
        return result

    # 1. costs and placement ------------------------------------------------------------------------
    def _exchange(self, batch: Batch) -> StepPlan:
        """Every rank's (samples, negatives) counts, then every sample's positions (two all-to-alls)."""
        w = self.world_size
        mine = torch.tensor([batch.num_samples, int(batch.negative_ids.numel())], dtype=torch.int64)
        counts = self.comm.all_to_all("balancer.counts", mine.to(self.device).repeat(w), [2] * w, [2] * w)
        counts = counts.view(w, 2).cpu().numpy()
        positions = (batch.lengths - 1).to(torch.int64)
        n = batch.num_samples
        got = self.comm.all_to_all("balancer.lengths", positions.repeat(w), [n] * w, counts[:, 0].tolist())
        positions_all = got.cpu().numpy()
        homes = np.repeat(np.arange(w), counts[:, 0])
        return StepPlan(counts[:, 0], counts[:, 1], positions_all, homes, homes.copy(), self.rank)

    def _place(self, plan: StepPlan) -> StepPlan:
        """The same placement on every rank (``balancer.place_samples`` on the sample costs)."""
        plan.dest = place_samples(self.sample_costs(plan.positions), plan.homes, self.world_size)
        return plan

    def sample_costs(self, positions: np.ndarray) -> np.ndarray:
        """Cost of each sample: the planner's cost model of its length as trained (inputs + target)."""
        return self.cost_model.cost(positions + 1)

    # 2. dispatch -------------------------------------------------------------------------------------
    def _dispatch(
        self, batch: Batch, units: torch.Tensor, negatives: torch.Tensor, plan: StepPlan
    ) -> tuple[Received, DispatchPlan]:
        """Send each sample's unit rows to its rank and each home's negatives to its samples' ranks."""
        w, d = self.world_size, self.tables.dim
        dest = torch.from_numpy(plan.dest[plan.mine()]).to(self.device)
        payload = torch.cat(
            [units.detach(), bits(batch.timestamps[batch.input_index]), bits(batch.item_ids[batch.target_index])], dim=1
        )
        sent = dispatch_jagged(JaggedRows(payload, (batch.lengths - 1).to(self.device)), dest, w)
        route = sent.plan
        values = self.comm.all_to_all(
            "balancer.dispatch", sent.buffer.values, route.value_counts.tolist(), plan.value_counts_from()
        )
        targets, sources = plan.targets(), plan.sources()
        own = torch.cat([negatives.detach(), bits(batch.negative_ids)], dim=1)
        k = int(plan.negatives[self.rank])
        negs = self.comm.all_to_all(
            "balancer.negatives",
            own.repeat(int(targets.sum()), 1),
            [k if t else 0 for t in targets],
            [int(n) if s else 0 for n, s in zip(plan.negatives, sources)],
        )
        received = Received(
            units=values[:, : 3 * d].clone().requires_grad_(),
            timestamps=unbits(values[:, 3 * d : 3 * d + 2]),
            target_ids=unbits(values[:, 3 * d + 2 :]),
            negatives=negs[:, :d].clone().requires_grad_(),
            negative_ids=unbits(negs[:, d:]),
        )
        return received, route

    def _placed_loss(self, got: Received, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of the samples placed here, one group per home: (sum of partials, each home's partial).

        A home's partial is ``Σ its positions here ℓ / P_home`` against the home's own negatives.
        """
        d, w = self.tables.dim, self.world_size
        lengths = torch.from_numpy(plan.positions[plan.received()])
        layout = build_layout(lengths, self.cfg.model_extra.length_group_ratio).to(self.device)
        units = got.units
        outputs = self.model(units[:, :d], units[:, d : 2 * d], layout, got.timestamps)
        loss = outputs.sum() * 0.0 + got.negatives.sum() * 0.0  # every parameter in the graph, even when empty
        home_positions, from_source, sources = plan.home_positions(), plan.value_counts_from(), plan.sources()
        partials, p0, k0 = [], 0, 0
        for s in range(w):
            if not sources[s]:
                continue
            p1, k1 = p0 + from_source[s], k0 + int(plan.negatives[s])
            terms = sampled_softmax_terms(
                outputs[p0:p1],
                units[p0:p1, 2 * d :],
                got.negatives[k0:k1],
                got.target_ids[p0:p1],
                got.negative_ids[k0:k1],
                self.cfg.model_extra.temperature,
            )
            partial = terms.sum() / float(home_positions[s])
            partials.append(partial)
            loss = loss + partial
            p0, k0 = p1, k1
        stacked = torch.stack(partials).detach() if partials else torch.zeros(0, device=self.device)
        return loss, stacked

    # 3. combine ------------------------------------------------------------------------------------------
    def _combine(
        self, got: Received, partials: torch.Tensor, plan: StepPlan, route: DispatchPlan, k_home: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients of the units (home order), of the home's negatives, and the home's loss."""
        grads = got.units.grad if got.units.grad is not None else torch.zeros_like(got.units)
        back = self.comm.all_to_all("balancer.combine", grads, plan.value_counts_from(), route.value_counts.tolist())
        unit_grads = combine_jagged(JaggedRows(back, route.send_lengths), route).values
        negative_grads, loss = self._combine_negatives(got, partials, plan, k_home)
        return unit_grads, negative_grads, loss

    def _combine_negatives(
        self, got: Received, partials: torch.Tensor, plan: StepPlan, k_home: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each home's negative gradients plus one row carrying its partial loss, summed at home in rank order."""
        d = self.tables.dim
        grads = got.negatives.grad if got.negatives.grad is not None else torch.zeros_like(got.negatives)
        pieces, send_counts, k0, i = [], [], 0, 0
        for s, present in enumerate(plan.sources()):
            if not present:
                send_counts.append(0)
                continue
            k = int(plan.negatives[s])
            loss_row = torch.zeros(1, d, device=self.device)
            loss_row[0, 0] = partials[i]
            pieces += [grads[k0 : k0 + k], loss_row]
            send_counts.append(k + 1)
            k0, i = k0 + k, i + 1
        send = torch.cat(pieces) if pieces else torch.zeros(0, d, device=self.device)
        recv_counts = [k_home + 1 if t else 0 for t in plan.targets()]
        blocks = self.comm.all_to_all("balancer.combine_negatives", send, send_counts, recv_counts)
        negative_grads = torch.zeros(k_home, d, device=self.device)
        loss = torch.zeros((), device=self.device)
        for block in blocks.view(-1, k_home + 1, d):
            negative_grads = negative_grads + block[:k_home]
            loss = loss + block[k_home, 0]
        return negative_grads, loss

    # instrumentation ---------------------------------------------------------------------------------
    def _record_balance(self, plan: StepPlan) -> None:
        """The balancer's overhead (ms) and the imbalance before/after into the step's record."""
        overhead, self._overhead = self._overhead, {}
        record = self.timer.current
        if record is None:
            return
        costs = self.sample_costs(plan.positions)
        for key, ms in overhead.items():
            record.extra[f"balancer.{key}_ms"] = ms
        record.extra["balancer.imbalance_before"] = imbalance(rank_loads(costs, plan.homes, self.world_size))
        record.extra["balancer.imbalance_after"] = imbalance(rank_loads(costs, plan.dest, self.world_size))
        record.extra["balancer.moved"] = float((plan.dest[plan.mine()] != self.rank).sum())


class OnlineEngine(OnlineBalancing, FreeScaleEngine):
    """``engine.balancer = "online"``, ``engine.overlap = "none"``."""


class OnlinePECEngine(OnlineBalancing, PECEngine):
    """``engine.balancer = "online"``, ``engine.overlap = "pec"`` (PEC's step calls ``forward_backward``)."""
