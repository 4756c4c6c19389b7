"""The FreeScale engine: one training step as seven explicit, separately timed stages.

    input_dist → embedding_lookup → embedding_comm → forward → backward → gradient_comm
    → sparse_update → dense_update

Each stage is a method-sized piece so the next issues can move them: prioritized embedding
communication (docs/design.md#pec) splits ``input_dist``/``embedding_comm`` into overlapped and non-overlapped
ids and defers part of ``sparse_update``; the online balancer inserts dispatch/combine after
``embedding_comm`` and before ``gradient_comm``. Every all-to-all goes through one transport
(``comm.TimedTransport``, ``engine.transport``): torch.distributed collectives or SM-free copy engines.

``Engine`` declares what the runner calls; the FreeScale, PEC and TorchRec engines implement it.

Dense parameters are data parallel with DDP semantics (identical initial weights broadcast from
rank 0, gradients averaged over ranks before the update), but the all-reduce is an explicit stage —
one flat buffer after backward — instead of DDP's hooks inside backward, so it can be timed and
reordered. Embedding gradients are *summed* over ranks (each rank's loss is a mean over its own
positions), which is what TorchRec does; the single-process reference in the tests replays exactly
this rule.

Non-finite steps: a NaN or inf loss or gradient on any rank must not reach a parameter or optimizer
state. Each rank's verdict rides in the dense all-reduce as one extra element (no extra collective),
so every rank learns the same answer at the same point and all of them skip the sparse and dense
updates together (``self.nonfinite``); the runner then stops the run or counts a skip
(``engine.max_nonfinite_skips``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from freescale.kernels.zch_types import COUNTERS
from freescale.pipeline.dataset.kjt import ENGINE_KEYS
from freescale.trainer.checkpoint import FreeScaleCheckpointer
from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import Batch
from freescale.trainer.engines.comm import TimedHandle, TimedTransport, build_transport, ranks_per_node
from freescale.trainer.engines.input_dist import DistContext, PendingInputDist
from freescale.trainer.engines.jagged_ids import JaggedIds
from freescale.trainer.engines.sharded import RowWiseShardedTables
from freescale.trainer.engines.sparse_optim import make_dense_optimizer
from freescale.trainer.engines.table_layout import TableSpec
from freescale.trainer.engines.zch_shard import zch_config
from freescale.trainer.learning_config import ModelExtraConfig
from freescale.trainer.metrics.instrument import StepTimer
from freescale.trainer.model.transducer import SequentialTransducer, sampled_softmax_loss
from freescale.trainer.table_config import ZchOptions


class Checkpointer(Protocol):
    """Saves and restores an engine's whole training state (``checkpoint.py``, ``torchrec_engine.py``)."""

    def save(self, root: str, step: int) -> str: ...

    def load(self, path: str) -> int: ...


@dataclass(frozen=True)
class ItemShard:
    """This rank's shard of the item table for full-catalogue ranking: global row of its first row, the
    rows, and which rows stand for an item (None: all). A zero-collision table's empty slots and fallback
    row stand for no item: ranking a target against them would count phantom candidates."""

    first_row: int
    rows: torch.Tensor
    is_item: torch.Tensor | None = None


class Engine(Protocol):
    """What the runner (and evaluation) call on an engine; every method is collective across ranks."""

    name: str  # engine.name
    transport: str  # what moves the all-to-alls' bytes: torch | copy_engine | torchrec
    timer: StepTimer

    def step(self, batches: Iterator[Batch]) -> None:
        """Read this rank's next micro-batch from ``batches`` and train on it (one step)."""

    def describe(self) -> str:
        """One line naming how the step communicates (run summary, plots)."""

    def checkpointer(self) -> Checkpointer:
        """The object that saves and restores this engine's state."""

    def settle(self) -> None:
        """Apply every pending (deferred) update, so tables are final for evaluation or a checkpoint."""

    def finish_training(self) -> None:
        """End of training: finish the work in flight (a read-ahead routing, deferred updates,
        background threads). Evaluation still runs afterwards; idempotent."""

    def close(self) -> None:
        """Release the transport and its buffers (collective); the engine's last call."""

    def encode(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Evaluation: each sample's query, its target's row and target id (no update)."""

    def lookup_items(self, ids: torch.Tensor) -> torch.Tensor:
        """Evaluation: rows of arbitrary item ids (sampled candidates)."""

    def catalogue_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Evaluation: the item table's global row of each item id as batches hold it (-1: a zero-collision
        table does not hold the id; every rank calls it as many times: ``eval/catalogue.py``)."""

    def local_item_rows(self) -> ItemShard:
        """Evaluation: this rank's item-table shard."""


def table_specs(cfg: RunConfig, world_size: int = 1) -> list[TableSpec]:
    """The item table (history, targets and negatives read it), the action table and one table per
    user-profile feature (``[user_tables]``, feature ``user.<name>``). A table with ``ids = "zch"`` is
    zero-collision: ``zch_size`` slots and one fallback row per rank (``zch_shard.py``)."""
    d, extra = cfg.model.d_model, cfg.model_extra
    item = _spec("item", extra.num_items, d, ("item", "neg"), extra, world_size)
    profiles = [_spec(t.table, t.rows, d, (t.table,), t, world_size) for t in cfg.user_tables.values()]
    specs = [item, TableSpec("action", extra.num_actions, d, ("action",)), *profiles]
    return [replace(spec, init_bound=init_bound(spec, extra)) for spec in specs]


def init_bound(spec: TableSpec, extra: ModelExtraConfig) -> float:
    """``model_extra.embedding_init``: the larger of sqrt(1/rows) and gain·sqrt(1/d) ("floor"), gain·sqrt(1/rows)
    ("rows", TorchRec's) or gain·sqrt(1/d) ("dim")."""
    gain = extra.init_gain
    by_rows, by_dim = (1.0 / spec.rows) ** 0.5, gain * (1.0 / spec.dim) ** 0.5
    if extra.embedding_init == "floor":
        return max(by_rows, by_dim)
    return gain * by_rows if extra.embedding_init == "rows" else by_dim


def _spec(name: str, rows: int, d: int, features: tuple[str, ...], ids: ZchOptions, world_size: int) -> TableSpec:
    if ids.ids == "zch":
        return TableSpec(name, ids.zch_size + world_size, d, features, zch_config(ids, world_size))
    return TableSpec(name, rows, d, features)


def batch_features(batch: Batch) -> JaggedIds:
    """The batch's sparse features, keyed like the TorchRec ``KeyedJaggedTensor`` of ``kjt.py``, then one
    id per sample of each user-profile table (``batch.profile_tables``)."""
    profiles = batch.profile_ids.reshape(-1)
    values = torch.cat([batch.item_ids, batch.action_ids, batch.negative_ids, profiles])
    counts = [batch.item_ids.numel(), batch.action_ids.numel(), batch.negative_ids.numel()]
    return JaggedIds(
        [*ENGINE_KEYS, *batch.profile_tables], values, counts + [batch.num_samples] * len(batch.profile_tables)
    )


def profile_rows(batch: Batch, rows: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """[B, d]: the sum of each sample's user-profile rows (None without profile tables)."""
    if not batch.profile_tables:
        return None
    return torch.stack([rows[table] for table in batch.profile_tables]).sum(0)


def input_context(batch: Batch, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """[M, d]: what the model adds to each input's item row: its action row and, with user-profile
    tables, its sample's profile rows (docs/training.md#user-profile-tables)."""
    context = rows["action"][batch.input_index]
    profile = profile_rows(batch, rows)
    return context if profile is None else context + profile[batch.input_samples()]


def batch_loss(
    model: SequentialTransducer, batch: Batch, rows: dict[str, torch.Tensor], temperature: float
) -> torch.Tensor:
    """Autoregressive sampled-softmax loss of one micro-batch given its features' embedding rows."""
    items, inputs = rows["item"], batch.input_index
    outputs = model(items[inputs], input_context(batch, rows), batch.layout, *batch.attention_times())
    targets = batch.target_index
    return sampled_softmax_loss(
        outputs, items[targets], rows["neg"], batch.item_ids[targets], batch.negative_ids, temperature
    )


def batch_queries(
    model: SequentialTransducer, batch: Batch, rows: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each sample's query (output at its last input), its target's row and target id (evaluation)."""
    items, inputs = rows["item"], batch.input_index
    outputs = model(items[inputs], input_context(batch, rows), batch.layout, *batch.attention_times())
    last = batch.last_input_rows()
    target_rows = batch.target_index[last]
    return outputs[last], items[target_rows], batch.item_ids[target_rows]


def zch_extra(specs: list[TableSpec], ctx: DistContext) -> dict[str, float]:
    """The owner's identity-table counts of one batch, ``zch.<table>.<counter>`` (metrics/zch.py)."""
    extra: dict[str, float] = {}
    for step in ctx.zch or []:
        prefix = f"zch.{specs[step.table].name}."
        *counts, occupied = torch.cat([step.stats, step.occupied.reshape(1)]).tolist()  # one host read
        extra.update({prefix + name: float(value) for name, value in zip(COUNTERS, counts, strict=True)})
        extra[prefix + "occupied"], extra[prefix + "slots"] = float(occupied), float(step.slots)
    return extra


def has_nonfinite(loss: torch.Tensor, grads: list[torch.Tensor | None]) -> bool:
    """Whether this rank's loss or any of its embedding-row gradients is NaN or infinite (one host read:
    each read of a device value drains a CUDA stream)."""
    finite = [torch.isfinite(loss.detach()).all(), *(torch.isfinite(g).all() for g in grads if g is not None)]
    return not bool(torch.stack(finite).all())


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Rank 0's initial dense weights everywhere (what DDP does at construction)."""
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=0)


class FreeScaleEngine:
    """Row-wise sharded tables + data-parallel dense model, every step stage explicit."""

    name = "freescale"

    def __init__(self, cfg: RunConfig, rank: int, world_size: int, device: torch.device) -> None:
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        self.timer = StepTimer(rank, device, cfg.engine.instrument)
        per_node = ranks_per_node(cfg.engine, world_size)
        timeout = timedelta(seconds=cfg.engine.collective_timeout_s)
        self.comm = build_transport(cfg.engine.transport, self.timer, device, per_node=per_node, timeout=timeout)
        self.transport = self.comm.kind
        torch.manual_seed(cfg.engine.seed)
        self.model = SequentialTransducer(cfg.model, cfg.model_extra).to(device)
        broadcast_parameters(self.model)
        self.tables = RowWiseShardedTables(
            table_specs(cfg, world_size), rank, world_size, device, cfg.engine.seed, cfg.optimizer, self.comm
        )
        self.dense_optimizer = make_dense_optimizer(cfg.optimizer, list(self.model.parameters()))
        self.nonfinite = False  # the last step had a NaN/inf loss or gradient on some rank: nothing was updated
        self._routing: tuple[Batch, PendingInputDist] | None = None  # next micro-batch, its routing in flight

    # the step ----------------------------------------------------------------------------------
    def step(self, batches: Iterator[Batch]) -> None:
        """Read this rank's next micro-batch (the ``data`` stage) and train on it.

        TorchRec's pipeline schedule (``TrainPipelineSparseDist``), where the transport allows two
        exchanges in flight: the following micro-batch is read now, its ids counts all-to-all runs
        during this step's forward and backward and its ids all-to-all during this step's gradient
        communication, so the next step starts with its routing done. Routing is pure bookkeeping
        of ids: the math is the synchronous step's, bit for bit.
        """
        with self.timer.stage("data", "data"):
            if self._routing is None:
                batch, pending = next(batches).to(self.device), None
            else:
                (batch, pending), self._routing = self._routing, None
            following = next(batches, None) if self.comm.concurrent else None
            following = following.to(self.device) if following is not None else None
        self.train_step(batch, pending, following)

    def describe(self) -> str:
        return "row-wise sharded tables, explicit all-to-alls, flat dense all-reduce"

    def checkpointer(self) -> FreeScaleCheckpointer:
        return FreeScaleCheckpointer(self)

    def train_step(
        self, batch: Batch, pending: PendingInputDist | None = None, following: Batch | None = None
    ) -> float:
        """One step on this rank's micro-batch (already on the device); returns the local loss.

        ``pending``: this batch's input distribution, started during the previous step; ``following``:
        the next micro-batch, whose input distribution this step starts (see ``step``).
        """
        stage = self.timer.stage
        with stage("input_dist", "comm"):
            ctx = (pending or self.start_routing(batch)).finish()
        with stage("embedding_lookup", "compute"):
            self.tables.apply_resets(ctx)
            owned_rows = self.tables.lookup(ctx)
        with stage("embedding_comm", "comm"):
            unique_rows = self.tables.output_dist(ctx, owned_rows, keys=False)
        if following is not None:
            with stage("input_dist", "comm"):
                ahead = self.start_routing(following)
            self._routing = (following, ahead)
        loss, unique_grads = self.forward_backward(batch, ctx, unique_rows)
        local_bad = has_nonfinite(loss, unique_grads)
        with stage("gradient_comm", "comm"):
            if following is not None:
                ahead.route()
            in_flight = self.tables.start_grad_dist(ctx, unique_grads)
            reduced = self._start_dense_all_reduce(local_bad)
            owner_grads = in_flight.wait()
            self._finish_dense_all_reduce(*reduced)
        if self.nonfinite:
            self.dense_optimizer.zero_grad(set_to_none=True)
            return self.finish_record(batch, loss, ctx)
        with stage("sparse_update", "compute"):
            self.tables.sparse_update(ctx, owner_grads)
        with stage("dense_update", "compute"):
            self.dense_update()
        return self.finish_record(batch, loss, ctx)

    def start_routing(self, batch: Batch, comm: TimedTransport | None = None) -> PendingInputDist:
        """Start ``batch``'s input distribution (on ``comm``, default the engine's transport), with
        the note ``routing_note`` gives riding along. A training routing: zero-collision tables insert."""
        note = self.routing_note(batch)
        return self.tables.start_input_dist(batch_features(batch), comm, note, True, batch.latest_time)

    def routing_note(self, batch: Batch) -> torch.Tensor | None:
        """What every rank should learn about ``batch`` with its routing (the online balancer's lengths)."""
        return None

    def forward_backward(
        self, batch: Batch, ctx: DistContext, unique_rows: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The ``forward`` and ``backward`` stages; returns the loss and each unique row's gradient."""
        self.model.train()
        leaves = [rows.requires_grad_() for rows in unique_rows]
        with self.timer.stage("forward", "compute"):
            rows = self.tables.feature_rows(ctx, leaves)
            loss = batch_loss(self.model, batch, rows, self.cfg.model_extra.temperature)
        with self.timer.stage("backward", "compute"):
            loss.backward()
        return loss, [leaf.grad for leaf in leaves]

    def dense_update(self) -> None:
        self.dense_optimizer.step()
        self.dense_optimizer.zero_grad(set_to_none=True)

    def finish_record(self, batch: Batch, loss: torch.Tensor, ctx: DistContext | None = None) -> float:
        """Put the step's loss and sizes (and ``ctx``'s identity-table counts) in the timer's record;
        returns the loss."""
        value = float(loss.detach())
        if self.timer.current is not None:
            record = self.timer.current
            record.loss, record.samples, record.positions = value, batch.num_samples, batch.num_positions
            record.cost = batch.cost
            if self.nonfinite:
                record.extra["nonfinite"] = 1.0
            if ctx is not None:
                record.extra.update(zch_extra(self.tables.specs, ctx))
        return value

    def settle(self) -> None:
        """Apply every pending update (synchronous engine: none are ever pending)."""

    def finish_training(self) -> None:
        """Finish a routing still in flight (the read-ahead of a batch that will not be trained)."""
        if self._routing is not None:
            self._routing[1].finish()
            self._routing = None

    def close(self) -> None:
        """``finish_training``, then release the transport (collective for copy engines)."""
        self.finish_training()
        self.comm.close()

    def _all_reduce_dense_grads(self, local_bad: bool = False) -> None:
        """Average dense gradients over ranks in one flat buffer (missing grads count as zero).

        The last element carries this rank's non-finite verdict; afterwards every rank sets the same
        ``self.nonfinite`` (some rank said so, or a summed dense gradient is NaN/inf).
        """
        self._finish_dense_all_reduce(*self._start_dense_all_reduce(local_bad))

    def _start_dense_all_reduce(self, local_bad: bool) -> tuple[TimedHandle, list[torch.nn.Parameter]]:
        params = list(self.model.parameters())
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        # filled on the device: torch.tensor(host value, device=cuda) is a blocking copy (a stream sync)
        verdict = torch.full((1,), 1.0 if local_bad else 0.0, dtype=grads[0].dtype, device=grads[0].device)
        flat = torch.cat([*grads, verdict])
        return self.comm.start_all_reduce("gradient_comm.dense", flat), params

    def _finish_dense_all_reduce(self, handle: TimedHandle, params: list[torch.nn.Parameter]) -> None:
        flat = handle.wait()
        self.nonfinite = bool((flat[-1] > 0) | ~torch.isfinite(flat[:-1]).all())  # one host read
        flat = flat[:-1] / self.world_size
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    # evaluation hooks (collective: every rank calls them the same number of times) ---------------
    @torch.no_grad()
    def encode(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, target rows and target ids of ``batch`` (no timing, no update)."""
        self.settle()
        batch = batch.to(self.device)
        self.model.eval()
        ctx = self.tables.input_dist(batch_features(batch))
        unique_rows = self.tables.output_dist(ctx, self.tables.lookup(ctx))
        queries, targets, target_ids = batch_queries(self.model, batch, self.tables.feature_rows(ctx, unique_rows))
        if self.tables.has_zch:  # full ranking scores table rows: a target is its row
            target_ids = self._item_rows(ctx)[batch.target_index[batch.last_input_rows()]]
        return queries, targets, target_ids

    def _item_rows(self, ctx: DistContext) -> torch.Tensor:
        """Global item-table row of every item id routed in ``ctx`` (after its rows arrived); an id a
        zero-collision table does not hold has no row of its own: -1 (its fallback row stands for none)."""
        rows = self.tables.feature_keys(ctx)["item"]
        items = self.tables.zch[0]
        return rows if items is None else torch.where(items.is_fallback(rows), -1, rows)

    @torch.no_grad()
    def catalogue_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of catalogue item ids (evaluation, read-only): the ids themselves unless the item table
        is zero-collision, whose read-only lookup routes the raw ids to their buckets' owners."""
        if self.tables.zch[0] is None:
            return ids.to(self.device)
        self.settle()
        ctx = self.tables.input_dist(JaggedIds(["item"], ids.to(self.device), [ids.numel()]))
        self.tables.output_dist(ctx, self.tables.lookup(ctx))
        return self._item_rows(ctx)

    @torch.no_grad()
    def lookup_items(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of arbitrary item ids through the sharded lookup (sampled evaluation)."""
        self.settle()
        features = JaggedIds(["item"], ids.to(self.device), [ids.numel()])
        ctx = self.tables.input_dist(features)
        unique_rows = self.tables.output_dist(ctx, self.tables.lookup(ctx))
        return self.tables.feature_rows(ctx, unique_rows)["item"]

    def local_item_rows(self) -> ItemShard:
        """This rank's item-table shard (full-catalogue ranking); zch: only slots holding an id are items."""
        self.settle()
        zch = self.tables.zch[0]
        is_item = None if zch is None else zch.item_rows()
        return ItemShard(self.tables.bounds[0][0], self.tables.weights[0], is_item)
