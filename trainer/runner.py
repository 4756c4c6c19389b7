"""The per-rank training loop that torchrun starts (``python -m freescale.trainer``).

It owns everything around the step: process group, dataset and loader, engine, resume, evaluation,
checkpoints and logs. Every ``logging.log_every`` steps the ranks' step records are gathered on
rank 0 (outside any step's timing) so the bubble split can compare arrivals across ranks; rank 0
writes one JSONL line per step. At the end it writes ``bubbles.json`` (summary + per-step metrics),
``trace.json`` (Chrome/Perfetto), ``timeline.png`` and ``summary.txt``, and prints the bubble table.

Python's garbage collector is kept out of the timed steps. After start-up a rank holds ~380k
Python objects (torch, mosaicml-streaming, the model); a full collection scans them all — measured
up to 400–680 ms, 7 per 64-step run on rank 0, plus ~900 young collections of up to 10 ms — and
strikes one rank at a time, so every collection shows up as the other ranks' ``straggler_pct``. The
loop therefore freezes what exists at start (``gc.freeze``: never scanned again), disables automatic
collection and collects at each log flush instead: every rank at the same step, outside step timing,
followed by a barrier so rank 0's log writing is not charged to the next step as idle time either.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from freescale.pipeline.dataset import loader
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.trainer.checkpoint_dirs import resolve_resume, step_dir
from freescale.trainer.checkpoint_record import DataIdentity, RunRecord, model_options, new_run_id, read_record
from freescale.trainer.config import RunConfig
from freescale.trainer.continuation import continues, data_start
from freescale.trainer.cpus import cores_per_rank, pin_to_cpus
from freescale.trainer.data.batches import collate, eval_samples, split_query
from freescale.trainer.engines.registry import make_engine
from freescale.trainer.errors import TrainingError
from freescale.trainer.eval.evaluate import evaluate
from freescale.trainer.eval.protocol import BestTracker, IdTables, resolve_tables, sized_config
from freescale.trainer.metrics import bubbles
from freescale.trainer.metrics.instrument import StepRecord, clock_offsets, gather_records
from freescale.trainer.metrics.trace import plot_timeline, write_trace
from freescale.trainer.metrics.zch import zch_lines
from freescale.trainer.peers import end_stopped_peers


def collate_config(cfg: RunConfig, tables: IdTables | None = None, window_stride: int = 0) -> CollateConfig:
    """How this run collates: table sizes and vocabularies (``tables``, from the dataset), held-out
    events (2 with ``eval.validation``: validation + test) and prepare's window stride."""
    vocabularies = {"item_vocab": tables.item_vocab, "action_vocab": tables.action_vocab} if tables else {}
    if tables is not None and tables.mode == "zch":
        vocabularies["item_pool"] = tables.item_pool
    return CollateConfig.for_model(
        cfg.model,
        cfg.model_extra,
        holdout_last=cfg.data.holdout_last,
        seed=cfg.data.seed,
        holdout_events=2 if cfg.eval.validation else 1,
        window_stride=window_stride,
        **vocabularies,
    )


def run_tables(cfg: RunConfig, dataset: PreparedDataset) -> tuple[RunConfig, IdTables, CollateConfig]:
    """``cfg`` with its tables sized from ``dataset``, the id tables, and how the run collates: what
    every rank (and a reference that replays a rank's step) derives from the config and the data."""
    tables = resolve_tables(cfg, dataset)
    cfg = sized_config(cfg, tables)  # engines size their tables from model_extra
    return cfg, tables, collate_config(cfg, tables, dataset.info.window_stride)


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


def step_seed(seed: int, step: int, rank: int) -> int:
    """Seed of a step's torch RNG (dropout): a function of (seed, step, rank) so resume replays it."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def total_steps(cfg: RunConfig, dataset: PreparedDataset, world_size: int) -> int:
    return loader.total_steps(dataset, world_size, cfg.data.epochs, cfg.data.max_steps)


def make_loader(
    cfg: RunConfig,
    dataset: PreparedDataset,
    collate_cfg: CollateConfig,
    rank: int,
    world_size: int,
    start: int,
    end: int,
) -> loader.Loader:
    """The public loader reading this rank's ``Batch`` of steps ``[start, end)``: the trainer reads the
    way any user's model does. A resumed run starts at its checkpoint's step, which is all the loader
    state a run needs (the schedule is a function of the step)."""
    config = loader.Config(
        path=cfg.data.path,
        world_size=world_size,
        rank=rank,
        output="batch",
        start_step=start,
        num_steps=end - start,
        seed=cfg.data.seed,
        num_workers=cfg.data.workers,
        prefetch_factor=cfg.data.prefetch,
        collate=collate_cfg,
        collate_fn=collate,
    )
    return loader.Loader(config, dataset)


def keep_metrics_before(path: Path, start: int) -> None:
    """Drop what a run starting at ``start`` writes again: step lines from ``start`` on, evals after it.

    Why: a run resumed into the same ``out_dir`` replays steps from its checkpoint; their lines from
    the interrupted run would otherwise appear twice. ``start = 0`` empties the file.
    """
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        step = int(record.get("step", 0))
        if step < start or ("eval" in record and step <= start):
            kept.append(line + "\n")
    path.write_text("".join(kept))


@dataclass
class RunState:
    """What the loop accumulates: pending records (this rank) and all gathered ones (rank 0)."""

    pending: list[StepRecord] = field(default_factory=list)
    gathered: list[list[StepRecord]] = field(default_factory=list)
    step_lines: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    nonfinite_skips: int = 0
    truncated_events: int = 0  # events beyond model.max_uih_len in the micro-batches this rank read, each once


class Trainer:
    """One rank of a training run."""

    def __init__(self, cfg: RunConfig, rank: int, world_size: int, device: torch.device) -> None:
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        self.out = Path(cfg.logging.out_dir)
        self.dataset = PreparedDataset(cfg.data.path, cache_dir=cfg.data.cache_dir or None, verify=cfg.data.verify)
        self.dataset.check_world_size(world_size)
        cfg, self.tables, self.collate_cfg = run_tables(cfg, self.dataset)
        self.cfg = cfg
        metric = f"{cfg.eval.metric}@{cfg.eval.k}"
        self.tracker = BestTracker(metric, cfg.eval.patience)
        self.choices = resolve_choices(cfg, device, self.dataset, world_size)
        self.overlap = self.choices.overlap
        built = replace(cfg, engine=cfg.engine.resolved(self.choices.balancer, self.choices.all_to_all))
        self.engine = make_engine(built, rank, world_size, device, self.overlap)
        self.checkpointer = self.engine.checkpointer() if cfg.checkpoint.dir else None
        self.offset = clock_offsets()[rank]
        self.state = RunState()
        self._eval_samples: list[dict[str, Any]] | None = None
        self.metrics_file = self.out / "metrics.jsonl"
        self.run_id = new_run_id()  # a resumed run takes its checkpoint's (``_resume``)
        self.data_identity = DataIdentity.of(cfg.data.path, self.dataset.info)
        self.model_options = model_options(cfg, (self.tables.num_items, self.tables.num_actions))
        self.data_start = 0  # the run's step at which it began reading data.path (``continuation.py``)
        self.eval_dataset = self.dataset
        if cfg.eval.data_path:  # another window's users (the launcher checked their ids mean this run's rows)
            self.eval_dataset = PreparedDataset(
                cfg.eval.data_path, cache_dir=cfg.data.cache_dir or None, verify=cfg.data.verify
            )

    # the loop ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any] | None:
        start, evals = self._resume()
        end = self.data_start + total_steps(self.cfg, self.dataset, self.world_size)  # data.max_steps: this dataset's
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "run.toml").write_text(self.cfg.to_toml())
            keep_metrics_before(self.metrics_file, start)
        self._restore_tracker(evals)
        first, last = start - self.data_start, end - self.data_start  # the dataset's own steps
        batches = make_loader(self.cfg, self.dataset, self.collate_cfg, self.rank, self.world_size, first, last)
        progress = self._progress(start, end)
        if self.rank == 0:
            self._announce()
        gc.collect()
        gc.freeze()  # start-up objects are never scanned again (see the module docstring)
        gc.disable()  # collections run at flushes, outside step timing
        try:
            try:
                end = self._loop(self._counted(iter(batches)), start, end, progress)
            finally:
                gc.enable()
                gc.unfreeze()
                batches.close()
                self.engine.finish_training()
                if progress is not None:
                    progress.close()
            return self._finish(start, end)  # the final evaluation still exchanges rows over the transport
        finally:
            self.engine.close()

    def _loop(self, batches: Any, start: int, end: int, progress: Any) -> int:
        """Train steps ``[start, end)``; returns the step count reached (``data.max_seconds`` may stop early)."""
        timer = self.engine.timer
        started = time.perf_counter()
        for step in range(start, end):
            torch.manual_seed(step_seed(self.cfg.engine.seed, step, self.rank))
            timer.begin_step(step)
            self.engine.step(batches)
            self.state.pending.append(timer.end_step())
            if getattr(self.engine, "nonfinite", False):
                self._skip_nonfinite(step)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{self.state.pending[-1].loss:.4f}")
            done = step + 1
            flushed = done % self.cfg.logging.log_every == 0 or done == end
            if flushed:
                self._flush()
            stop = flushed and done != end and self._out_of_time(started)
            if stop:
                end = done
            if self.cfg.eval.every and self.cfg.eval.max_users and done % self.cfg.eval.every == 0 and done != end:
                self._evaluate(done)
                if self.tracker.should_stop:  # eval.patience: every rank saw the same metrics
                    stop, end = True, done
            if done != end and self._checkpoint_due(done, end):  # the last step's: after the final evaluation
                self._save(self.cfg.checkpoint.dir, done)
            if stop:
                break
        return end

    def _counted(self, batches: Any) -> Any:
        """The loader's batches, counting the events ``model.max_uih_len`` cuts off (run summary): each
        micro-batch once, so a run of several epochs counts each event once, not once per epoch."""
        counted = np.zeros(self.dataset.n_micro_batches, bool)
        for batch in batches:
            index = self.dataset.micro_batch_index(batch.step, self.rank, self.world_size, self.cfg.data.seed)
            if not counted[index]:
                counted[index] = True
                self.state.truncated_events += batch.truncated
            yield batch

    def _announce(self) -> None:
        """What a reader of the log needs before the first step: id tables, loss, sequence length."""
        lines = [self.tables.describe(), f"loss {self.cfg.model_extra.loss}"]
        prepared = self.dataset.info.samples.max_uih_len
        if prepared is not None and prepared > self.cfg.model.max_uih_len:
            lines.append(
                f"model.max_uih_len {self.cfg.model.max_uih_len} < prepare --max-uih-len {prepared}: samples keep "
                "their most recent model.max_uih_len events; the summary counts the events dropped"
            )
        print("; ".join(lines), flush=True)

    def _skip_nonfinite(self, step: int) -> None:
        """Count a skipped non-finite step (every rank does: the verdict is global); stop past the limit."""
        self.state.nonfinite_skips += 1
        allowed = self.cfg.engine.max_nonfinite_skips
        loss = self.state.pending[-1].loss
        if self.state.nonfinite_skips > allowed:
            raise TrainingError(
                f"step {step}: non-finite loss or gradient (rank {self.rank} loss = {loss}); stopping the run "
                f"(engine.max_nonfinite_skips = {allowed}; check optimizer.*_lr, model_extra.temperature, the data)"
            )
        if self.rank == 0:
            print(f"step {step}: non-finite loss or gradient, step skipped (no update)", flush=True)

    def _out_of_time(self, started: float) -> bool:
        """All ranks agree (one all-reduce at a flush) whether ``data.max_seconds`` is used up."""
        if not self.cfg.data.max_seconds:
            return False
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=self.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed) >= self.cfg.data.max_seconds

    def _progress(self, start: int, end: int) -> Any:
        if self.rank != 0 or not self.cfg.logging.progress or not sys.stderr.isatty():
            return None  # a bar redrawn into a log file floods it: bars only on a terminal
        from tqdm import tqdm

        return tqdm(total=end - start, initial=0, desc=f"train {self.engine.name}", unit="step", leave=False)

    def _checkpoint_due(self, done: int, end: int) -> bool:
        ck = self.cfg.checkpoint
        if self.checkpointer is None:
            return False
        return bool((ck.every and done % ck.every == 0) or done in ck.steps or (ck.at_end and done == end))

    def _resume(self) -> tuple[int, list[dict[str, Any]]]:
        """The step to start at and the evaluations before it (the checkpoint's best-model record); a
        resumed run goes on under its checkpoint's run id."""
        ck = self.cfg.checkpoint
        path = resolve_resume(ck.dir, ck.resume) if self.checkpointer is not None else None
        if path is None:
            return 0, []
        step = self.checkpointer.load(path)
        record = read_record(path)
        evals: list[dict[str, Any]] = []
        onto = ""
        if record is not None and record.run is not None:
            self.run_id, evals = record.run.run_id, record.run.evals
            self.data_start = data_start(record, self.data_identity, self.cfg)
            if continues(record.run, self.data_identity, self.cfg):  # best-model selection: this window's evaluations
                evals = []
                onto = f", continuing onto {self.cfg.data.path} from its first step"
        if self.rank == 0:
            print(f"resumed from {path} at step {step}{onto}", flush=True)
        return step, evals

    def _run_record(self, evals: list[dict[str, Any]]) -> RunRecord:
        return RunRecord(self.run_id, self.data_identity, self.model_options, evals, self.data_start)

    def _save(self, root: str, step: int, evals: list[dict[str, Any]] | None = None) -> str:
        """A checkpoint of the current state; its record holds the evaluations so far (rank 0's)."""
        record = self._run_record(self.state.evals if evals is None else evals)
        return self.checkpointer.save(root, step, record)

    # logging ---------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Gather pending step records on rank 0, append their JSONL lines, collect garbage, realign ranks."""
        gathered = gather_records(self.state.pending, self.offset)
        self.state.pending = []
        self._write_records(gathered)
        gc.collect()
        dist.barrier()

    def _write_records(self, gathered: list[list[StepRecord]] | None) -> None:
        if gathered is None:
            return
        for rank, records in enumerate(gathered):
            if len(self.state.gathered) <= rank:
                self.state.gathered.append([])
            self.state.gathered[rank].extend(records)
        tags = {"engine": self.engine.name, "overlap": self.overlap, "transport": self.engine.transport}
        lines = [{**tags, **bubbles.step_metrics(ranks)} for ranks in bubbles.analyze(gathered)]
        self.state.step_lines.extend(lines)
        with self.metrics_file.open("a") as handle:
            for line in lines:
                handle.write(json.dumps(line) + "\n")

    def _eval_users(self) -> list[dict[str, Any]]:
        if self._eval_samples is None:
            holdout = self.collate_cfg.holdout_events
            self._eval_samples = eval_samples(
                self.eval_dataset, self.world_size, self.rank, self.cfg.eval.max_users, holdout
            )
        return self._eval_samples

    def score(self, split: str) -> dict[str, Any]:
        """HR@k / NDCG@k of ``split`` (validation | test) on the current model (collective)."""
        started = time.perf_counter()
        queries = [split_query(sample, split) for sample in self._eval_users()]
        ev = self.cfg.eval
        result = evaluate(
            self.engine,
            queries,
            self.collate_cfg,
            ev.num_candidates,
            ev.k,
            seed=self.cfg.data.seed,
            exclude_history=ev.exclude_history,
        )
        data = self.cfg.eval.data_path or self.cfg.data.path  # which users: the run's or another window's
        return {"split": split, **result, "data": data, "seconds": time.perf_counter() - started}

    def _evaluate(self, step: int) -> None:
        """Score validation (test when eval.validation is off); a new best also scores test on this
        model and, with checkpoint.dir, saves it as the best checkpoint (``protocol.BestTracker``)."""
        result = self.score("validation" if self.cfg.eval.validation else "test")
        improved = self.tracker.offer(step, result)
        line = {"step": step, "eval": result, "best": improved}
        if improved:
            self.tracker.best_test = self.score("test") if self.cfg.eval.validation else result
            if self.checkpointer is not None:
                self.tracker.best_checkpoint = step_dir(str(Path(self.cfg.checkpoint.dir) / "best"), step)
            if self.cfg.eval.validation:  # kept for the final report and for resume
                line["test_of_best"] = self.tracker.best_test
                line["best_checkpoint"] = self.tracker.best_checkpoint
            if self.checkpointer is not None:
                self._save_best(step, [*self.state.evals, line])
        if self.rank == 0:
            self.state.evals.append(line)
            with self.metrics_file.open("a") as handle:
                handle.write(json.dumps(line) + "\n")

    def _restore_tracker(self, evals: list[dict[str, Any]]) -> None:
        """A resumed run continues the best-validation selection from its checkpoint's record (the same
        file on every rank, so every rank decides alike), whatever ``logging.out_dir`` it writes to."""
        for line in evals:
            if self.tracker.offer(line["step"], line["eval"]):
                self.tracker.best_test = line.get("test_of_best", line["eval"])
                self.tracker.best_checkpoint = line.get("best_checkpoint")
        if self.rank == 0:
            self.state.evals.extend(evals)

    def _save_best(self, step: int, evals: list[dict[str, Any]]) -> str:
        """The model of the best validation so far, as ``checkpoint.dir/best/step_N`` (older ones removed)."""
        root = Path(self.cfg.checkpoint.dir) / "best"
        path = self._save(str(root), step, evals)
        if self.rank == 0:
            for old in root.glob("step_*"):
                if str(old) != path:
                    shutil.rmtree(old, ignore_errors=True)
        return path

    def evaluate_checkpoint(self, path: str) -> dict[str, Any]:
        """``freescale evaluate``: load ``path``'s model (any world size: DCP reshards) and score
        validation and test without training; rank 0 writes ``evaluation.json`` to ``logging.out_dir``."""
        if self.checkpointer is None:
            from freescale.trainer.checkpoint import FreeScaleCheckpointer

            self.checkpointer = FreeScaleCheckpointer(self.engine)
        step = self.checkpointer.load(path, check_world_size=False)
        splits = ("validation", "test") if self.cfg.eval.validation else ("test",)
        report = {"checkpoint": path, "step": step, **{split: self.score(split) for split in splits}}
        report["ids"] = self.tables.summary()
        self.engine.close()
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "evaluation.json").write_text(json.dumps(report, indent=1))
            for split in splits:
                print(f"{split} @ step {step}: {json.dumps(report[split])}", flush=True)
        return report

    def _finish(self, start: int, end: int) -> dict[str, Any] | None:
        evaluated = self.tracker.history and self.tracker.history[-1].step == end  # e.g. stopped early
        if self.cfg.eval.at_end and self.cfg.eval.max_users and not evaluated:
            self._evaluate(end)
        if end > start and self._checkpoint_due(end, end):  # after the final evaluation: its record holds it
            self._save(self.cfg.checkpoint.dir, end)
        truncated = torch.tensor([self.state.truncated_events], dtype=torch.int64, device=self.device)
        dist.all_reduce(truncated)
        if self.rank != 0:
            return None
        records = self.state.gathered
        steps = bubbles.analyze(records)
        summary = bubbles.summarize(steps, self.cfg.logging.skip_steps)
        title = (
            f"bubbles: engine={self.engine.name} ({self.engine.describe()}), "
            f"overlap={self.overlap}, transport={self.engine.transport}, data={self.cfg.data.path}"
        )
        table = bubbles.summary_table(summary, title)
        report = {
            "engine": self.engine.name,
            "pipeline": self.engine.describe(),
            "overlap": self.overlap,
            "balancer": self.choices.balancer,
            "auto_prediction": self.choices.prediction,
            "transport": self.engine.transport,
            "world_size": self.world_size,
            "config": self.cfg.to_dict(),
            "summary": summary,
            "training": self._training_summary(int(truncated.item()), end),
            "protocol": self.tracker.report(),
            "evals": self.state.evals,
            "steps": self.state.step_lines,
            "rank_steps": [r.parts() for ranks in steps for r in ranks],
        }
        (self.out / "bubbles.json").write_text(json.dumps(report, indent=1, default=str))
        write_trace(self.out / "trace.json", records, self.cfg.logging.trace_steps)
        first = steps[min(self.cfg.logging.skip_steps, len(steps) - 1)][0].step if steps else 0
        plot_timeline(self.out / "timeline.png", records, first, self.cfg.logging.timeline_steps, title)
        text = "\n".join([table, *self._result_lines(report)])
        (self.out / "summary.txt").write_text(text + "\n")
        print(text, flush=True)
        return report

    def _training_summary(self, truncated: int, end: int) -> dict[str, Any]:
        return {
            "steps": end,
            "loss": self.cfg.model_extra.loss,
            **self.tables.summary(),
            "max_uih_len": self.cfg.model.max_uih_len,
            "events_truncated_by_model_max_uih_len": truncated,
            "holdout": "validation+test" if self.collate_cfg.holdout_events == 2 else "test",
        }

    def _result_lines(self, report: dict[str, Any]) -> list[str]:
        """The summary's closing lines: training facts, then validation and test of the best model."""
        training, best = report["training"], report["protocol"]
        lines = [
            f"loss {training['loss']}, ids {training['ids']} ({training['num_items']} item rows), "
            f"{training['events_truncated_by_model_max_uih_len']} events cut by model.max_uih_len "
            f"{training['max_uih_len']}",
            *zch_lines(report["summary"]),
        ]
        if best:
            where = best["best_checkpoint"] or "not saved (set checkpoint.dir to keep it)"
            stopped = f", stopped early after {best['evaluations']} evaluations" if best["stopped_early"] else ""
            lines.append(f"best {best['metric']} at step {best['best_step']}{stopped}; best checkpoint: {where}")
            for split in ("validation", "test"):
                figures = best["validation"] if split == "validation" and self.cfg.eval.validation else None
                figures = best["test"] if split == "test" else figures
                if figures:
                    metrics = ", ".join(f"{k} {v:.4f}" for k, v in figures.items() if "@" in k)
                    users = f"{figures['users']} users of {figures.get('data', self.cfg.data.path)}"
                    lines.append(f"{split}: {metrics} ({users}, {figures['protocol']} ranking)")
        return lines


def device_for(cfg: RunConfig, local_rank: int) -> torch.device:
    """This rank's device: ``cuda:<local rank>`` (``engine.share_gpus``: modulo the GPUs visible), or the CPU."""
    if cfg.engine.device != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", cuda_index(local_rank, torch.cuda.device_count(), cfg.engine.share_gpus))
    torch.cuda.set_device(device)
    return device


def cuda_index(local_rank: int, visible: int, share: bool) -> int:
    """The GPU of local rank ``local_rank`` among ``visible`` ones; with ``share`` ranks wrap around."""
    if visible == 0:
        raise TrainingError("engine.device is 'cuda' but no CUDA device is visible")
    if local_rank < visible:
        return local_rank
    if share:
        return local_rank % visible
    raise TrainingError(
        f"local rank {local_rank} has no GPU of its own ({visible} visible); set engine.share_gpus = true "
        "to run several ranks per GPU"
    )


def process_group_options(backend: str, device: torch.device) -> dict[str, Any]:
    """``init_process_group`` keywords: NCCL binds its communicator to the rank's GPU (``device_id``);
    gloo, the backend of ranks sharing a GPU, takes CUDA tensors without one."""
    return {"device_id": device} if backend == "nccl" and device.type == "cuda" else {}


def use_deterministic(enabled: bool) -> None:
    """``engine.deterministic``: kernels that give the same bits on every run (cuBLAS needs a fixed
    workspace, set before its first use); an op without such a kernel raises instead of varying."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def main(cfg: RunConfig, evaluate_checkpoint: str | None = None) -> dict[str, Any] | None:
    """Entry point of one rank (environment from torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*);
    with ``evaluate_checkpoint`` the rank scores that checkpoint instead of training."""
    torch.set_num_threads(cfg.engine.threads)
    use_deterministic(cfg.engine.deterministic)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cfg.engine.pin_cpus:
        pin_to_cpus(local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    device = device_for(cfg, local_rank)
    if not dist.is_initialized():
        backend = cfg.engine.resolved_backend()
        timeout = timedelta(seconds=cfg.engine.collective_timeout_s)
        dist.init_process_group(backend, timeout=timeout, **process_group_options(backend, device))
    pids: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pids, (socket.gethostname(), os.getpid()))
    trainer: Trainer | None = None
    finished = False
    try:
        trainer = Trainer(cfg, dist.get_rank(), dist.get_world_size(), device)
        result = trainer.evaluate_checkpoint(evaluate_checkpoint) if evaluate_checkpoint else trainer.run()
        finished = True
    except (RuntimeError, dist.DistError) as error:
        if isinstance(error, TrainingError):
            raise
        stopped = end_stopped_peers(pids)
        if not stopped:
            raise
        raise TrainingError(
            f"{', '.join(stopped)} stopped answering: a collective gave up after engine.collective_timeout_s = "
            f"{cfg.engine.collective_timeout_s:g} s ({str(error).splitlines()[0][:200]})"
        ) from error
    finally:
        if finished:
            trainer = None  # the engine and everything it holds become garbage: see release_process_groups
            release_process_groups()
        else:  # a failed rank ends at once: its error line must reach the log before the launcher's SIGTERM
            dist.destroy_process_group()
    return result


def release_process_groups() -> None:
    """Destroy every process group now, with nothing else still holding one, so that the groups'
    threads are joined while the interpreter is whole.

    Why: TorchRec's sharded modules (sharding env, KJT all-to-alls, device mesh) hold the default
    group in reference cycles. ``destroy_process_group`` alone only unregistered it: its gloo worker
    and transport threads, connections and the works holding tensors lived on until the interpreter's
    finalization destroyed them, in an unspecified order with the interpreter half torn down, and a
    TorchRec rank aborted there after its run had finished ("terminate called without an active
    exception", about 1 bench_pec run in 12). With the cycles collected first, the last reference
    goes with the registry's and the group is destroyed inside ``destroy_process_group``
    (``tests/trainer/test_rank_exit.py`` checks that no gloo thread reaches interpreter exit).
    """
    gc.collect()
    dist.destroy_process_group()
    gc.collect()  # anything that held a group only through the registry's cycles
