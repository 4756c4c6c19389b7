"""The training loop's evaluation: HR@k / NDCG@k of validation or test on the current model, the
best-validation selection (``eval/protocol.BestTracker``) with its best checkpoint, and ``freescale
evaluate``'s scoring of a saved checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from freescale.trainer.checkpoint_dirs import step_dir
from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import eval_samples, split_query
from freescale.trainer.eval.evaluate import evaluate
from freescale.trainer.eval.protocol import BestTracker


class EvaluationHooks:
    """``runner.Trainer``'s evaluation methods (a mixin: the attributes are the trainer's)."""

    cfg: RunConfig
    rank: int
    world_size: int
    tracker: BestTracker
    checkpointer: Any
    _eval_samples: list[dict[str, Any]] | None
    catalogue: np.ndarray | None  # eval.catalogue's raw item ids (None: rank rows)

    def _eval_users(self) -> list[dict[str, Any]]:
        if self._eval_samples is None:
            holdout = self.collate_cfg.holdout_events
            self._eval_samples = eval_samples(
                self.eval_dataset, self.world_size, self.rank, self.cfg.eval.max_users, holdout
            )
        return self._eval_samples

    def score(self, split: str, step: int) -> dict[str, Any]:
        """HR@k / NDCG@k of ``split`` (validation | test) on the current model at ``step`` (collective);
        with ``eval.write_ranks`` rank 0 also writes every user's rank (``ranks_file`` in the result)."""
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
            keep_ranks=ev.write_ranks,
            catalogue=self.catalogue,
        )
        per_user = result.pop("ranks", None)
        if per_user is not None:
            path = self.out / "eval_ranks" / f"{split}_step{step:08d}.csv"
            if self.rank == 0:
                per_user.write_csv(path)
            result["ranks_file"] = str(path)
        data = self.cfg.eval.data_path or self.cfg.data.path  # which users: the run's or another window's
        return {"split": split, **result, "data": data, "seconds": time.perf_counter() - started}

    def _evaluate(self, step: int) -> None:
        """Score validation (test when eval.validation is off); a new best also scores test on this
        model and, with checkpoint.dir, saves it as the best checkpoint (``protocol.BestTracker``)."""
        result = self.score("validation" if self.cfg.eval.validation else "test", step)
        improved = self.tracker.offer(step, result)
        line = {"step": step, "eval": result, "best": improved}
        if improved:
            self.tracker.best_test = self.score("test", step) if self.cfg.eval.validation else result
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

    def evaluate_checkpoint(self, path: str) -> dict[str, Any]:
        """``freescale evaluate``: load ``path``'s model (any world size: DCP reshards) and score
        validation and test without training; rank 0 writes ``evaluation.json`` to ``logging.out_dir``."""
        if self.checkpointer is None:
            from freescale.trainer.checkpoint import FreeScaleCheckpointer

            self.checkpointer = FreeScaleCheckpointer(self.engine)
        step = self.checkpointer.load(path, check_world_size=False)
        splits = ("validation", "test") if self.cfg.eval.validation else ("test",)
        report = {"checkpoint": path, "step": step, **{split: self.score(split, step) for split in splits}}
        report["ids"] = self.tables.summary()
        self.engine.close()
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "evaluation.json").write_text(json.dumps(report, indent=1))
            for split in splits:
                print(f"{split} @ step {step}: {json.dumps(report[split])}", flush=True)
        return report
