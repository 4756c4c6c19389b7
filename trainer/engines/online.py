"""The paper's online load balancer inside the FreeScale engine: ``engine.balancer = "online"``
(docs/design.md#online-balancer).

It replaces the engine's ``forward_backward`` (the only part of the step that changes), so it
composes with ``engine.overlap = "none"`` (``OnlineEngine``) and ``"pec"`` (``OnlinePECEngine``,
whose step calls the same method) and with any ``engine.transport``: every exchange below is a
``TimedTransport.all_to_all``. The three stages, after the embedding communication:

1. *Costs and placement* (``balance_exchange``, ``balance_place``): every rank's (samples,
   negatives) counts and every sample's length reach every rank as the *note* of its routing
   (``routing_note``, carried by the input distribution's own two all-to-alls: no collective of
   the balancer's own, and with the engine's pipelined routing it arrives during the previous step);
   the cost is the model ``prepare`` plans with (``CostModel.from_model(cfg.model)``, or the
   calibrated file named by ``engine.balancer_cost_model``) of the sample's length as trained
   (after holdout and truncation). ``balancer.place_samples`` (the planner's ``lpt_free``) then
   gives every rank the same placement; a rank computes what it will receive from it, so no count
   is exchanged twice. A step whose placement moves nothing (already balanced, e.g. planned data)
   runs the engine's ordinary forward/backward: no dispatch, no combine.
2. *Dispatch* (``dispatch``, one all-to-all): a sample moves as one unit of
   ``kernels.dispatch_jagged`` rows, one row per *event*: its item row and action row (``2d``
   floats, the differentiable part) and its timestamp and item id (int64 bits carried as two float32
   each). A position's target is the next event, so inputs and targets share the rows: each item row
   crosses once, not once as an input and again as a target (``P + 1`` rows of ``2d + 4`` floats
   for ``P`` positions, about two thirds of ``P`` rows of ``3d + 6``). After a destination's units,
   each home sends its negatives (rows and ids, padded to the units' width) once to every rank that
   received one of its samples. The destination makes the received floats leaves, reads inputs and
   targets out of them (``input_event_rows``), runs the model and the loss.
3. *Combine* (``combine``, one all-to-all): the leaves' gradients (an event's input and target
   gradients already summed) go back through the transport and ``combine_jagged`` into home order;
   each source's negatives' gradients and its partial loss ride in the same message and are summed
   at home in source-rank order. ``torch.autograd.backward``
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from freescale.kernels.dispatch import DispatchPlan, JaggedRows, combine_jagged, dispatch_jagged
from freescale.pipeline.cost import CostModel
from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import Batch
from freescale.trainer.data.jagged import build_layout
from freescale.trainer.engines.balancer import imbalance, place_samples, rank_loads
from freescale.trainer.engines.engine import FreeScaleEngine, profile_rows
from freescale.trainer.engines.input_dist import DistContext
from freescale.trainer.engines.pec import PECEngine
from freescale.trainer.model.transducer import sampled_softmax_terms


@dataclass
class StepPlan:
    """The step's global view (identical on every rank) and this rank's part of it."""

    samples: np.ndarray  # [W] samples per home rank
    negatives: np.ndarray  # [W] negatives per home rank
    positions: np.ndarray  # [N] positions (inputs) per sample, global order (rank-major)
    homes: np.ndarray  # [N] home rank per sample
    dest: np.ndarray  # [N] rank that computes each sample
    rank: int
    costs: np.ndarray | None = None  # [N] cost of each sample under the balancer's cost model

    @property
    def world_size(self) -> int:
        return int(self.samples.size)

    def moves(self) -> bool:
        """Whether any sample of the step is computed away from home."""
        return bool((self.dest != self.homes).any())

    def mine(self) -> slice:
        start = int(self.samples[: self.rank].sum())
        return slice(start, start + int(self.samples[self.rank]))

    def received(self) -> np.ndarray:
        """Global indices of the samples this rank computes (source-major, home order within)."""
        return np.flatnonzero(self.dest == self.rank)

    def positions_from(self) -> list[int]:
        """Positions (inputs) this rank computes of each source's samples."""
        got = self.received()
        return np.bincount(self.homes[got], weights=self.positions[got], minlength=self.world_size).astype(int).tolist()

    def events_from(self) -> list[int]:
        """Events (unit rows: the positions and each sample's final target) this rank receives from each source."""
        got = self.received()
        events = self.positions[got] + 1
        return np.bincount(self.homes[got], weights=events, minlength=self.world_size).astype(int).tolist()

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
    """What this rank computes: leaves of the units (one row per event) and of each source's negatives."""

    units: torch.Tensor  # [E, 2d] leaf: item row, action row of every event of the samples placed here
    timestamps: torch.Tensor  # [E] event times (the HSTU time bias reads inputs' and targets')
    item_ids: torch.Tensor  # [E] (targets' ids score the sampled softmax)
    negatives: torch.Tensor  # [ΣK_s, d] leaf
    negative_ids: torch.Tensor  # [ΣK_s]


def input_event_rows(positions: np.ndarray) -> np.ndarray:
    """Rows of every input among the events of samples with ``positions`` inputs each (``positions + 1``
    events: the inputs, then the final target), in order; an input's target is the next row."""
    events = positions + 1
    first_event = np.repeat(np.cumsum(events) - events, positions)
    first_position = np.repeat(np.cumsum(positions) - positions, positions)
    return first_event + np.arange(int(positions.sum())) - first_position


def bits(values: torch.Tensor) -> torch.Tensor:
    """int64 ``[n]`` as float32 ``[n, 2]`` (exact: the bits ride along, as PEC does with row keys)."""
    flat = values.to(torch.int64).reshape(-1)
    if not flat.numel():  # an empty batch's tensors may have stride 0, which a dtype view refuses
        return torch.zeros(0, 2, dtype=torch.float32, device=flat.device)
    return flat.contiguous().view(torch.float32).view(-1, 2)


def unbits(values: torch.Tensor) -> torch.Tensor:
    return values.contiguous().view(torch.int64).view(-1)


def interleave(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> torch.Tensor:
    """``first[0], second[0], first[1], second[1], …`` as one buffer (two payloads per peer, one collective)."""
    return torch.cat([part for pair in zip(first, second) for part in pair])


def deinterleave(buffer: torch.Tensor, first: list[int], second: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``interleave`` given the row counts of each part: (all first parts, all second parts)."""
    pieces = torch.split(buffer, [n for pair in zip(first, second) for n in pair])
    return torch.cat(pieces[0::2]), torch.cat(pieces[1::2])


def event_context(batch: Batch, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """[T, d] per event: its action row plus its sample's user-profile rows (``engine.input_context``
    of every event, so a dispatched unit carries what the model adds to the item row)."""
    profile = profile_rows(batch, rows)
    if profile is None:
        return rows["action"]
    return rows["action"] + torch.repeat_interleave(profile, batch.lengths, dim=0)


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
        plan = self._timed("exchange", "balance_exchange", "compute", self._exchange, ctx)
        plan = self._timed("placement", "balance_place", "compute", self._place, plan)
        if not plan.moves():  # every rank sees the same plan: all keep their samples, nothing is sent
            self._record_balance(plan)
            return super().forward_backward(batch, ctx, unique_rows)  # type: ignore[misc]
        self.model.train()
        leaves = [rows.requires_grad_() for rows in unique_rows]
        with self.timer.stage("forward", "compute"):
            rows = self.tables.feature_rows(ctx, leaves)
            units = torch.cat([rows["item"], event_context(batch, rows)], dim=1)  # inputs and targets share it
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
    def routing_note(self, batch: Batch) -> torch.Tensor:
        """(samples, negatives, positions of each sample): every rank learns them with the routing,
        so the balancer's exchange costs no collective of its own (and, with the engine's pipelined
        routing, arrives during the previous step)."""
        head = torch.tensor([batch.num_samples, int(batch.negative_ids.numel())], dtype=torch.int64)
        return torch.cat([head, (batch.lengths.cpu() - 1).to(torch.int64)])

    def _exchange(self, ctx: DistContext) -> StepPlan:
        """The step's global view from the notes every rank sent with its routing."""
        if ctx.notes is None:
            raise RuntimeError("online balancer: the routing carried no notes (start_routing was bypassed)")
        notes = [note.cpu().numpy() for note in ctx.notes]
        samples = np.array([note[0] for note in notes], dtype=np.int64)
        negatives = np.array([note[1] for note in notes], dtype=np.int64)
        positions_all = np.concatenate([note[2:] for note in notes]).astype(np.int64)
        homes = np.repeat(np.arange(self.world_size), samples)
        return StepPlan(samples, negatives, positions_all, homes, homes.copy(), self.rank)

    def _place(self, plan: StepPlan) -> StepPlan:
        """The same placement on every rank (``balancer.place_samples`` on the sample costs)."""
        plan.costs = self.sample_costs(plan.positions)
        plan.dest = place_samples(plan.costs, plan.homes, self.world_size, self.cfg.engine.balancer_min_gain)
        return plan

    def sample_costs(self, positions: np.ndarray) -> np.ndarray:
        """Cost of each sample: the planner's cost model of its length as trained (inputs + target)."""
        return self.cost_model.cost(positions + 1)

    # 2. dispatch -------------------------------------------------------------------------------------
    def _dispatch(
        self, batch: Batch, units: torch.Tensor, negatives: torch.Tensor, plan: StepPlan
    ) -> tuple[Received, DispatchPlan]:
        """One all-to-all: each sample's unit rows (one per event) to its rank, then (to every rank
        that got one of them) this home's negatives, padded to the unit rows' width."""
        w, d = self.world_size, self.tables.dim
        dest = torch.from_numpy(plan.dest[plan.mine()]).to(self.device)
        payload = torch.cat([units.detach(), bits(batch.timestamps), bits(batch.item_ids)], dim=1)
        sent = dispatch_jagged(JaggedRows(payload, batch.lengths.to(self.device)), dest, w)
        route = sent.plan
        own = torch.cat([negatives.detach(), bits(batch.negative_ids)], dim=1)
        own = torch.nn.functional.pad(own, (0, payload.shape[1] - own.shape[1]))
        unit_counts = route.value_counts.tolist()
        k = int(plan.negatives[self.rank])
        negative_counts = [k if t else 0 for t in plan.targets()]
        send = interleave(torch.split(sent.buffer.values, unit_counts), [own[:n] for n in negative_counts])
        from_units = plan.events_from()
        from_negatives = [int(n) if got else 0 for n, got in zip(plan.negatives, plan.sources())]
        received = self.comm.all_to_all(
            "balancer.dispatch",
            send,
            [a + b for a, b in zip(unit_counts, negative_counts)],
            [a + b for a, b in zip(from_units, from_negatives)],
        )
        values, negs = deinterleave(received, from_units, from_negatives)
        received_rows = Received(
            units=values[:, : 2 * d].clone().requires_grad_(),
            timestamps=unbits(values[:, 2 * d : 2 * d + 2]),
            item_ids=unbits(values[:, 2 * d + 2 :]),
            negatives=negs[:, :d].clone().requires_grad_(),
            negative_ids=unbits(negs[:, d : d + 2]),
        )
        return received_rows, route

    def _placed_loss(self, got: Received, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of the samples placed here, one group per home: (sum of partials, each home's partial).

        A home's partial is ``Σ its positions here ℓ / P_home`` against the home's own negatives.
        """
        d, w = self.tables.dim, self.world_size
        positions = plan.positions[plan.received()]
        layout = build_layout(torch.from_numpy(positions), self.cfg.model_extra.length_group_ratio).to(self.device)
        inputs = torch.from_numpy(input_event_rows(positions)).to(self.device)
        targets = inputs + 1
        events = got.units
        outputs = self.model(events[inputs, :d], events[inputs, d:], layout, got.timestamps[inputs],
                             got.timestamps[targets])  # fmt: skip
        target_rows, target_ids = events[targets, :d], got.item_ids[targets]
        loss = outputs.sum() * 0.0 + got.negatives.sum() * 0.0  # every parameter in the graph, even when empty
        home_positions, from_source, sources = plan.home_positions(), plan.positions_from(), plan.sources()
        partials, p0, k0 = [], 0, 0
        for s in range(w):
            if not sources[s]:
                continue
            p1, k1 = p0 + from_source[s], k0 + int(plan.negatives[s])
            terms = sampled_softmax_terms(
                outputs[p0:p1],
                target_rows[p0:p1],
                got.negatives[k0:k1],
                target_ids[p0:p1],
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
        """Gradients of the units (home order), of the home's negatives, and the home's loss.

        One all-to-all back: to each source, the gradients of its units, then of its negatives and
        one row carrying its partial loss (padded to the units' width); summed at home in source
        rank order, so every rank adds the same terms in the same order.
        """
        d = self.tables.dim
        unit_grads = got.units.grad if got.units.grad is not None else torch.zeros_like(got.units)
        neg_grads = got.negatives.grad if got.negatives.grad is not None else torch.zeros_like(got.negatives)
        from_units = plan.events_from()
        sources = plan.sources()
        negative_blocks, k0, i = [], 0, 0
        for s, present in enumerate(sources):
            if not present:
                negative_blocks.append(neg_grads.new_zeros(0, 2 * d))
                continue
            k = int(plan.negatives[s])
            loss_row = neg_grads.new_zeros(1, d)
            loss_row[0, 0] = partials[i]
            block = torch.cat([neg_grads[k0 : k0 + k], loss_row])
            negative_blocks.append(torch.nn.functional.pad(block, (0, d)))
            k0, i = k0 + k, i + 1
        send = interleave(torch.split(unit_grads, from_units), negative_blocks)
        send_counts = [a + b.shape[0] for a, b in zip(from_units, negative_blocks)]
        to_units = route.value_counts.tolist()
        to_negatives = [k_home + 1 if t else 0 for t in plan.targets()]
        back = self.comm.all_to_all(
            "balancer.combine", send, send_counts, [a + b for a, b in zip(to_units, to_negatives)]
        )
        values, blocks = deinterleave(back, to_units, to_negatives)
        home_unit_grads = combine_jagged(JaggedRows(values, route.send_lengths), route).values
        negative_grads = torch.zeros(k_home, d, device=self.device)
        loss = torch.zeros((), device=self.device)
        for block in blocks.view(-1, k_home + 1, 2 * d):
            negative_grads = negative_grads + block[:k_home, :d]
            loss = loss + block[k_home, 0]
        return home_unit_grads, negative_grads, loss

    # instrumentation ---------------------------------------------------------------------------------
    def _record_balance(self, plan: StepPlan) -> None:
        """The balancer's overhead (ms) and the imbalance before/after into the step's record."""
        overhead, self._overhead = self._overhead, {}
        record = self.timer.current
        if record is None:
            return
        costs = plan.costs if plan.costs is not None else self.sample_costs(plan.positions)
        for key in ("exchange", "placement", "dispatch", "combine"):  # 0 ms: the step did not need it
            record.extra[f"balancer.{key}_ms"] = overhead.get(key, 0.0)
        record.extra["balancer.imbalance_before"] = imbalance(rank_loads(costs, plan.homes, self.world_size))
        record.extra["balancer.imbalance_after"] = imbalance(rank_loads(costs, plan.dest, self.world_size))
        record.extra["balancer.moved"] = float((plan.dest[plan.mine()] != self.rank).sum())


class OnlineEngine(OnlineBalancing, FreeScaleEngine):
    """``engine.balancer = "online"``, ``engine.overlap = "none"``."""


class OnlinePECEngine(OnlineBalancing, PECEngine):
    """``engine.balancer = "online"``, ``engine.overlap = "pec"`` (PEC's step calls ``forward_backward``)."""
