"""The vanilla TorchRec baseline (``engine.name = "torchrec"``): the comparison row of every benchmark.

Same model (``SequentialTransducer``, same loss), same data and dims, same initial table rows; only
the distribution machinery is TorchRec's: an ``EmbeddingCollection`` (item table read by features
``item`` and ``neg``, action table by ``action``) sharded row-wise by ``DistributedModelParallel``
(planner constrained to ``row_wise``, like our engine), fbgemm's fused sparse optimizer applied in
backward (``EXACT_ROWWISE_ADAGRAD`` or ``ADAM``), DDP for the dense part, and TorchRec's standard
train pipeline.

Which pipeline runs on CPU: ``TrainPipelineSparseDist`` itself. In TorchRec 1.9.2 it creates its
memcpy/data-dist CUDA streams only when ``device.type`` is cuda/mtia and otherwise runs the same
schedule on the current thread: batch i+1's ``input_dist`` (KJT all-to-alls) is started before
batch i's forward and waited after it, so the overlap structure is the one benchmarks compare
against on GPUs. Verified with fbgemm-gpu-cpu 1.9.0 on gloo (row-wise and table-wise sharding);
``engine.torchrec_pipeline = "base"`` selects ``TrainPipelineBase`` and ``"none"`` the plain
``DistributedModelParallel`` forward/backward/step, for comparison.

Instrumentation (the same rule as our engine, see ``instrument.py``): while this engine is alive,
``torch.distributed.all_to_all_single`` is wrapped so each all-to-all records its launch and the
interval the caller blocked in ``wait()``; a DDP communication hook times the dense all-reduce
(waited inside the hook: with one gradient bucket — our model sizes — DDP launches it at the end of
backward anyway). Stages: ``data`` (the pipeline pulling a batch), ``forward`` (our module's forward,
which includes the sharded lookup and embedding all-to-all waits), ``backward``, ``dense_update``
(optimizer step), and ``pipeline`` (everything else inside ``progress``: input-dist launches, batch
bookkeeping); waits inside any stage are split out as comm/idle by ``bubbles.analyze``.

This module imports TorchRec at the top: ``engines.registry.make_engine`` imports it only for
``engine.name = "torchrec"``, so the FreeScale engine never needs TorchRec or fbgemm.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from freescale.pipeline.dataset.kjt import KJTBatch, register_pipelineable
from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import Batch
from freescale.trainer.engines.engine import ItemShard, batch_loss, batch_queries, table_specs
from freescale.trainer.engines.kjt import batch_to_kjt
from freescale.trainer.engines.sparse_optim import make_dense_optimizer
from freescale.trainer.engines.table_layout import init_rows
from freescale.trainer.metrics.instrument import StageSpan, StepTimer
from freescale.trainer.model.transducer import SequentialTransducer


class DenseHead(nn.Module):
    """Everything after the embedding lookup; a leaf for TorchRec's FX tracer (it has control flow)."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.transducer = SequentialTransducer(cfg.model, cfg.model_extra)
        self.temperature = cfg.model_extra.temperature

    def forward(
        self, batch: Batch, items: torch.Tensor, actions: torch.Tensor, negatives: torch.Tensor, *profiles: torch.Tensor
    ) -> torch.Tensor:
        """``profiles``: the rows of ``batch.profile_tables``, in that order."""
        rows = {"item": items, "action": actions, "neg": negatives, **dict(zip(batch.profile_tables, profiles))}
        return batch_loss(self.transducer, batch, rows, self.temperature)


def ec_table_name(table: str) -> str:
    """A table's name inside TorchRec's ``EmbeddingCollection`` (a module key: no dots), ``user.x`` → ``user__x``."""
    return table.replace(".", "__")


class TorchRecModel(nn.Module):
    """``EmbeddingCollection`` + ``DenseHead``; ``forward`` returns (loss, detached loss) as pipelines expect."""

    def __init__(self, cfg: RunConfig, timer: StepTimer) -> None:
        super().__init__()
        from torchrec import EmbeddingCollection, EmbeddingConfig

        tables = [
            EmbeddingConfig(
                name=ec_table_name(spec.name),
                embedding_dim=spec.dim,
                num_embeddings=spec.rows,
                feature_names=list(spec.features),
            )
            for spec in table_specs(cfg)
        ]
        self.profile_tables = tuple(table.table for table in cfg.user_tables.values())
        self.ec = EmbeddingCollection(tables=tables, device=torch.device("meta"))
        torch.manual_seed(cfg.engine.seed)
        self.head = DenseHead(cfg)
        self.timer = timer

    def forward(self, batch: KJTBatch) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.timer.now()
        jagged = self.ec(batch.features)
        keys = ("item", "action", "neg", *self.profile_tables)
        loss = self.head(batch.dense, *(jagged[key].values() for key in keys))
        record = self.timer.current
        if record is not None:
            record.stages.append(StageSpan("forward", "compute", start, self.timer.now()))
            record.samples, record.positions = batch.dense.num_samples, batch.dense.num_positions
            record.cost = batch.dense.cost
        return loss, loss.detach()


class _TimedWork(dist.Work):
    """A ``dist.Work`` whose ``wait()`` records the blocking interval in the timer.

    It must *be* a ``dist.Work``: TorchRec checks ``isinstance(…, dist.Work)`` before waiting on the
    KJT splits all-to-all and would otherwise read an unfinished buffer.
    """

    def __init__(self, work: Any, launch: float, timer: StepTimer) -> None:
        super().__init__()
        self._work, self._launch, self._timer = work, launch, timer

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        start = self._timer.now()
        result = self._work.wait(*args, **kwargs)
        self._timer.record_comm("torchrec.all_to_all", self._launch, start, self._timer.now())
        return result

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._work.result()

    def synchronize(self) -> None:
        self._work.synchronize()

    def get_future(self) -> torch.futures.Future:
        return self._work.get_future()


def _install_a2a_timing(timer: StepTimer, in_flight: list[Any]) -> Any:
    """Wrap ``dist.all_to_all_single`` (TorchRec looks it up at call time); returns the original.

    Async works still running are kept in ``in_flight`` (finished ones are dropped at each launch)
    so that ``close`` can wait for the exchanges of the batch the pipeline read ahead.
    """
    original = dist.all_to_all_single

    def timed(
        output: Any,
        input: Any,
        output_split_sizes: Any = None,
        input_split_sizes: Any = None,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        launch = timer.now()
        work = original(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
        if async_op:
            in_flight[:] = [w for w in in_flight if not w.is_completed()]
            in_flight.append(work)
            return _TimedWork(work, launch, timer)
        timer.record_comm("torchrec.all_to_all", launch, launch, timer.now())
        return work

    dist.all_to_all_single = timed
    return original


def _ddp_timing_hook(timer: StepTimer, world_size: int) -> Any:
    # No annotations: DDP inspects them and, with postponed evaluation, would see strings.
    def hook(state, bucket):
        buffer = bucket.buffer()
        launch = timer.now()
        work = dist.all_reduce(buffer, async_op=True)
        start = timer.now()
        work.wait()
        timer.record_comm("gradient_comm.dense", launch, start, timer.now())
        buffer.div_(world_size)
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(buffer)
        return future

    return hook


class _TimedOptimizer:
    """The dense optimizer as the pipeline sees it: ``step`` is timed; backward ends where it starts."""

    def __init__(self, optimizer: torch.optim.Optimizer, timer: StepTimer) -> None:
        self.optimizer, self.timer = optimizer, timer

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> None:
        start = self.timer.now()
        record = self.timer.current
        if record is not None:
            forward_end = max((s.end for s in record.stages if s.name == "forward"), default=start)
            record.stages.append(StageSpan("backward", "compute", forward_end, start))
        self.optimizer.step()
        if record is not None:
            record.stages.append(StageSpan("dense_update", "compute", start, self.timer.now()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def _sharded_model(cfg: RunConfig, model: TorchRecModel, world_size: int, device: torch.device) -> Any:
    """``DistributedModelParallel`` with row-wise sharded tables and fbgemm's fused sparse optimizer."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    opt = cfg.optimizer
    if opt.sparse == "rowwise_adagrad":
        fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": opt.sparse_lr, "eps": opt.eps}
    else:
        fused = {
            "optimizer": EmbOptimType.ADAM,
            "learning_rate": opt.sparse_lr,
            "eps": opt.eps,
            "beta1": opt.betas[0],
            "beta2": opt.betas[1],
        }
    sharder = EmbeddingCollectionSharder(fused_params=fused)
    constraints = {
        ec_table_name(spec.name): ParameterConstraints(sharding_types=["row_wise"]) for spec in table_specs(cfg)
    }
    topology = Topology(world_size=world_size, compute_device=device.type)
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    return DistributedModelParallel(model, device=device, sharders=[sharder], plan=plan)


def _table_shards(dmp: Any) -> dict[str, tuple[int, torch.Tensor]]:
    """table name → (first global row, local rows) of this rank's row-wise shard."""
    shards = {}
    for key, value in dmp.state_dict().items():
        if key.endswith(".weight") and ".embeddings." in key and hasattr(value, "local_shards"):
            name = key.split(".embeddings.")[1].removesuffix(".weight")
            for shard in value.local_shards():
                shards[name] = (int(shard.metadata.shard_offsets[0]), shard.tensor)
    return shards


class TorchRecEngine:
    """TorchRec ``DistributedModelParallel`` + a standard TorchRec train pipeline."""

    name = "torchrec"
    transport = "torch"  # TorchRec's own all-to-alls on torch.distributed (engine.transport does not apply)

    def __init__(self, cfg: RunConfig, rank: int, world_size: int, device: torch.device) -> None:
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        self.timer = StepTimer(rank, device, cfg.engine.instrument)
        self.nonfinite = False  # some rank's last loss was NaN/inf (its update already ran: the run stops)
        self._in_flight: list[Any] = []
        self._original_a2a = _install_a2a_timing(self.timer, self._in_flight)
        self.model = TorchRecModel(cfg, self.timer)
        self.dmp = _sharded_model(cfg, self.model, world_size, device)
        self._copy_initial_rows()
        self._hook_ddp()
        from torchrec.optim.optimizers import in_backward_optimizer_filter

        dense_params = [p for _, p in in_backward_optimizer_filter(self.dmp.named_parameters())]
        self.optimizer = _TimedOptimizer(make_dense_optimizer(cfg.optimizer, dense_params), self.timer)
        register_pipelineable()  # the pipelines move ``KJTBatch`` to the device themselves
        self.pipeline, self.pipeline_name = self._make_pipeline()
        self._batches: Iterator[KJTBatch] | None = None

    def _copy_initial_rows(self) -> None:
        """Start from the same rows as ``FreeScaleEngine`` (same per-chunk generators)."""
        specs = {ec_table_name(spec.name): (t, spec) for t, spec in enumerate(table_specs(self.cfg))}
        with torch.no_grad():
            for name, (offset, rows) in _table_shards(self.dmp).items():
                t, spec = specs[name]
                rows.copy_(init_rows(self.cfg.engine.seed, t, spec, offset, offset + rows.shape[0]))

    def _hook_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        for module in self.dmp.modules():
            if isinstance(module, DistributedDataParallel):
                module.register_comm_hook(None, _ddp_timing_hook(self.timer, self.world_size))

    def _make_pipeline(self) -> tuple[Any, str]:
        from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist

        choice = self.cfg.engine.torchrec_pipeline
        if choice in ("auto", "sparse_dist"):
            return TrainPipelineSparseDist(self.dmp, self.optimizer, self.device), "TrainPipelineSparseDist"
        if choice == "base":
            return TrainPipelineBase(self.dmp, self.optimizer, self.device), "TrainPipelineBase"
        return None, "DistributedModelParallel forward/backward (no pipeline)"

    def describe(self) -> str:
        return f"TorchRec {self.pipeline_name}, row-wise EmbeddingCollection, fused {self.cfg.optimizer.sparse}"

    def settle(self) -> None:
        """Nothing is deferred outside TorchRec's pipeline, which finishes each step's updates itself."""

    def checkpointer(self) -> Any:
        """Never reached: ``RunConfig`` rejects ``checkpoint.dir`` with this engine."""
        raise ValueError("checkpoint.dir must be empty with engine.name 'torchrec'")

    # the step ----------------------------------------------------------------------------------
    def _timed_batches(self, batches: Iterator[Batch]) -> Iterator[KJTBatch]:
        for _ in iter(int, 1):  # until the loader is exhausted
            start = self.timer.now()
            try:
                batch = next(batches)
            except StopIteration:
                return
            item = KJTBatch(batch.step, batch_to_kjt(batch), dense=batch)
            if self.timer.current is not None:
                self.timer.current.stages.append(StageSpan("data", "data", start, self.timer.now()))
            yield item

    def step(self, batches: Iterator[Batch]) -> None:
        """One ``progress`` of the pipeline (it reads ahead from ``batches`` itself)."""
        if self._batches is None:
            self._batches = self._timed_batches(batches)
        record = self.timer.current
        if self.pipeline is not None:
            loss = self.pipeline.progress(self._batches)
        else:
            loss = self._plain_step()
        self.nonfinite = self._any_rank_nonfinite(float(loss))
        if record is not None:
            record.loss = float(loss)
            if self.nonfinite:
                record.extra["nonfinite"] = 1.0
            _fill_gaps(record, self.timer.now())

    def _any_rank_nonfinite(self, loss: float) -> bool:
        """All ranks agree whether some rank's loss is NaN/inf, so all of them stop at the same step."""
        flag = torch.tensor([0.0 if math.isfinite(loss) else 1.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag > 0)

    def _plain_step(self) -> torch.Tensor:
        batch = next(self._batches).to(self.device)
        self.optimizer.zero_grad()
        loss, detached = self.dmp(batch)
        loss.backward()
        self.optimizer.step()
        return detached

    # evaluation hooks --------------------------------------------------------------------------
    def _lookup(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.pipeline is not None and hasattr(self.pipeline, "detach"):
            self.pipeline.detach()  # restore the sharded modules' own forward; progress() re-attaches
        jagged = self.model.ec(batch_to_kjt(batch).to(self.device))
        return {name: jagged[name].values() for name in ("item", "action", "neg", *batch.profile_tables)}

    @torch.no_grad()
    def encode(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = batch.to(self.device)
        self.model.eval()
        try:
            return batch_queries(self.model.head.transducer, batch, self._lookup(batch))
        finally:
            self.model.train()

    @torch.no_grad()
    def lookup_items(self, ids: torch.Tensor) -> torch.Tensor:
        empty = torch.zeros(0, dtype=torch.int64)
        probe = Batch(
            step=0,
            item_ids=empty,
            action_ids=empty,
            timestamps=empty,
            lengths=empty,
            negative_ids=ids.to(torch.int64).cpu(),
            input_index=empty,
            target_index=empty,
            layout=_empty_layout(),
        )
        return self._lookup(probe)["neg"]

    def catalogue_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Batches hold item rows already (the baseline has no identity table)."""
        return ids.to(self.device)

    def local_item_rows(self) -> ItemShard:
        return ItemShard(*_table_shards(self.dmp)["item"])

    def close(self) -> None:
        """Nothing left to release after ``finish_training``. The sharded modules keep the default
        process group in reference cycles: ``rank_process.release_process_groups`` collects them before it
        destroys the groups, so no gloo thread is left to interpreter exit."""
        self.finish_training()

    def finish_training(self) -> None:
        """Wait for the all-to-alls of the batch the pipeline read ahead, then drop the pipeline
        (evaluation and checkpoints after training use the sharded model directly).

        Why: the run ends with that batch's input distribution in flight. Left to interpreter exit,
        its gloo works (holding tensors) outlive the destroyed process group, and a rank aborted
        with "terminate called without an active exception" after a 2-host run had finished (seen
        in 1 of ~12 TorchRec runs at 200 Mbit/s). Every rank launched the same works, so waiting is
        safe.
        """
        for work in self._in_flight:
            work.wait()
        self._in_flight.clear()
        if self.pipeline is not None and hasattr(self.pipeline, "detach"):
            self.pipeline.detach()  # the sharded modules' own forward back, for evaluation after training
        self.pipeline, self._batches = None, None
        dist.all_to_all_single = self._original_a2a


def _empty_layout() -> Any:
    from freescale.trainer.data.jagged import build_layout

    return build_layout(torch.zeros(0, dtype=torch.int64))


def _fill_gaps(record: Any, end: float) -> None:
    """Label time inside ``progress`` that no stage covers as ``pipeline`` (TorchRec's own work)."""
    spans = sorted(record.stages, key=lambda s: s.start)
    cursor, gaps = record.start, []
    for span in spans:
        if span.start > cursor:
            gaps.append(StageSpan("pipeline", "compute", cursor, span.start))
        cursor = max(cursor, span.end)
    if end > cursor:
        gaps.append(StageSpan("pipeline", "compute", cursor, end))
    record.stages.extend(gaps)
