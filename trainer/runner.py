"""The per-rank training loop that torchrun starts (``python -m freescale.trainer``).

It owns everything around the step: process group, dataset and loader, engine, resume, evaluation,
checkpoints and logs. Every ``logging.log_every`` steps (and before each checkpoint, so a resumed run
misses none) the ranks' step records are gathered on rank 0 (outside any step's timing) so the bubble
split can compare arrivals across ranks; rank 0 writes one JSONL line per step. At the end it writes
``bubbles.json`` (summary + per-step metrics), ``trace.json`` (Chrome/Perfetto), ``timeline.png`` and
``summary.txt``, and prints the bubble table.

Python's garbage collector is kept out of the timed steps. After start-up a rank holds ~380k
Python objects (torch, mosaicml-streaming, the model); a full collection scans them all — measured
up to 400–680 ms, 7 per 64-step run on rank 0, plus ~900 young collections of up to 10 ms — and
strikes one rank at a time, so every collection shows up as the other ranks' ``straggler_pct``. The
loop therefore freezes what exists at start (``gc.freeze``: never scanned again), disables automatic
collection and collects at each log flush instead: every rank at the same step, outside step timing,
followed by a barrier so rank 0's log writing is not charged to the next step as idle time either.

The rank's process (device, process group) is set up in ``rank_process.py``; what the run reads in
``run_data.py``; the engine's ``auto`` choices in ``engine_choices.py``; the loop's checkpoint,
evaluation and logging hooks in ``run_checkpoints.py``, ``run_eval.py`` and ``run_logs.py``.
"""

from __future__ import annotations

import gc
import os
import re
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

from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.trainer.checkpoint_record import DataIdentity, model_options, new_run_id
from freescale.trainer.config import RunConfig
from freescale.trainer.cpus import pin_to_cpus
from freescale.trainer.engine_choices import resolve_choices
from freescale.trainer.engines.registry import make_engine
from freescale.trainer.errors import TrainingError
from freescale.trainer.eval.catalogue import eval_catalogue
from freescale.trainer.eval.protocol import BestTracker
from freescale.trainer.metrics.instrument import StepRecord, clock_offsets
from freescale.trainer.peers import end_stopped_peers
from freescale.trainer.rank_process import device_for, process_group_options, release_process_groups, use_deterministic
from freescale.trainer.run_checkpoints import CheckpointHooks
from freescale.trainer.run_data import make_loader, run_tables, total_steps
from freescale.trainer.run_eval import EvaluationHooks
from freescale.trainer.run_logs import RunLogging, keep_metrics_before
from freescale.trainer.user_tables import describe_user_tables


def step_seed(seed: int, step: int, rank: int) -> int:
    """Seed of a step's torch RNG (dropout): a function of (seed, step, rank) so resume replays it."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


@dataclass
class RunState:
    """What the loop accumulates: pending records (this rank) and all gathered ones (rank 0)."""

    pending: list[StepRecord] = field(default_factory=list)
    gathered: list[list[StepRecord]] = field(default_factory=list)
    step_lines: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    nonfinite_skips: int = 0
    truncated_events: int = 0  # events beyond model.max_uih_len in the micro-batches this rank read, each once


class Trainer(CheckpointHooks, EvaluationHooks, RunLogging):
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
        evaluates = cfg.eval.max_users != 0
        self.catalogue = eval_catalogue(cfg.eval.catalogue, self.eval_dataset) if evaluates else None

    def run(self) -> dict[str, Any] | None:
        start, evals = self._resume()
        end = self.data_start + total_steps(self.cfg, self.dataset, self.world_size)  # data.max_steps: this dataset's
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "run.toml").write_text(self.cfg.to_toml())
            if unreadable := keep_metrics_before(self.metrics_file, start):
                print(f"{self.metrics_file}: dropped {unreadable} unreadable line(s) (a write cut short)", flush=True)
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
            # a checkpoint's steps are logged with it: a run killed after the save resumes with none missing
            flushed = done % self.cfg.logging.log_every == 0 or done == end or self._checkpoint_due(done, end)
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
        if self.cfg.user_tables:
            lines.append(describe_user_tables(self.cfg))
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


# what gloo says when the rank at the other end of a connection has exited (its own error, a kill)
PEER_GONE = ("closed by peer", "reset by peer", "Broken pipe")


def collective_failure(error: BaseException, stopped: list[str], timeout_s: float) -> TrainingError | None:
    """A collective's failure as one line: ranks that stopped answering (``peers.end_stopped_peers``), or a
    rank that ended while this one waited on it (its own error line, or the launcher's line on how it
    was killed, says why: this rank's traceback would only bury it). None: not a failure of the job's
    ranks."""
    first = re.sub(r"^\[[^\]]*\]\s*", "", (str(error).splitlines() or [""])[0])[:200]  # no gloo source location
    if stopped:
        return TrainingError(
            f"{', '.join(stopped)} stopped answering: a collective gave up after engine.collective_timeout_s = "
            f"{timeout_s:g} s ({first})"
        )
    if any(part in str(error) for part in PEER_GONE):
        return TrainingError(f"another rank ended while this one waited on it ({first}); its error says why")
    return None


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
        failure = collective_failure(error, end_stopped_peers(pids), cfg.engine.collective_timeout_s)
        if failure is None:
            raise
        raise failure from error
    finally:
        if finished:
            trainer = None  # the engine and everything it holds become garbage: see release_process_groups
            release_process_groups()
        else:  # a failed rank ends at once: its error line must reach the log before the launcher's SIGTERM
            dist.destroy_process_group()
    return result
