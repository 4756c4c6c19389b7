"""The training loop's logs: step records gathered on rank 0 at each flush into ``metrics.jsonl``, and
the end-of-run report (``bubbles.json``, ``trace.json``, ``timeline.png``, ``summary.txt`` and the
bubble table) after the final evaluation and checkpoint.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from freescale.trainer.config import RunConfig
from freescale.trainer.metrics import bubbles
from freescale.trainer.metrics.instrument import StepRecord, gather_records
from freescale.trainer.metrics.trace import plot_timeline, write_trace
from freescale.trainer.metrics.zch import zch_lines


def keep_metrics_before(path: Path, start: int) -> int:
    """Drop what a run starting at ``start`` writes again: step lines from ``start`` on, evals after it.
    Returns how many lines were unreadable (also dropped).

    Why: a run resumed into the same ``out_dir`` replays steps from its checkpoint; their lines from
    the interrupted run would otherwise appear twice. ``start = 0`` empties the file. A run killed while
    appending leaves a torn last line (written after its latest checkpoint, so replayed anyway).
    """
    if not path.exists():
        return 0
    kept, unreadable = [], 0
    for line in path.read_text(errors="replace").splitlines():
        record = _record(line)
        if record is None:
            unreadable += bool(line.strip())
            continue
        step = int(record.get("step", 0))
        if step < start or ("eval" in record and step <= start):
            kept.append(line + "\n")
    path.write_text("".join(kept))
    return unreadable


def _record(line: str) -> dict[str, Any] | None:
    """A ``metrics.jsonl`` line's record, None if it is not one (torn by a kill, edited)."""
    try:
        record = json.loads(line)
        int(record.get("step", 0))
    except (ValueError, TypeError, AttributeError):
        return None
    return record


class RunLogging:
    """``runner.Trainer``'s logging and report methods (a mixin: the attributes are the trainer's)."""

    cfg: RunConfig
    rank: int
    world_size: int
    out: Path
    metrics_file: Path
    offset: float

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
            "user_tables": {
                t.table: {"ids": t.ids, "rows": t.rows, "zch_size": t.zch_size} for t in self.cfg.user_tables.values()
            },
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
                    ranked = f"{figures['protocol']} ranking over {figures.get('catalogue', 'rows')}"
                    lines.append(f"{split}: {metrics} ({users}, {ranked})")
        return lines
