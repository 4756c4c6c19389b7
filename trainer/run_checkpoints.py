"""The training loop's checkpoint hooks: when a step saves, resume from a checkpoint (and its run record),
the record a save writes, and the best model's checkpoint (``checkpoint.dir/best``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from freescale.trainer.checkpoint_dirs import resolve_resume
from freescale.trainer.checkpoint_record import DataIdentity, RunRecord, read_record
from freescale.trainer.config import RunConfig
from freescale.trainer.continuation import continues, data_start


class CheckpointHooks:
    """``runner.Trainer``'s checkpoint methods (a mixin: the attributes are the trainer's)."""

    cfg: RunConfig
    rank: int
    checkpointer: Any
    run_id: str
    data_identity: DataIdentity

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

    def _save_best(self, step: int, evals: list[dict[str, Any]]) -> str:
        """The model of the best validation so far, as ``checkpoint.dir/best/step_N`` (older ones removed)."""
        root = Path(self.cfg.checkpoint.dir) / "best"
        path = self._save(str(root), step, evals)
        if self.rank == 0:
            for old in root.glob("step_*"):
                if str(old) != path:
                    shutil.rmtree(old, ignore_errors=True)
        return path
