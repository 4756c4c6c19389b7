"""Typed records that ``prepare``'s steps hand each other (and keep in the work directory).

A record that doubles as a completion marker is written whole or not at all (``save`` writes a
temporary file, then renames it), so a resumed job reads either a complete record or none.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from freescale.pipeline.steps.scan import save_json

PLAN_ARRAYS = "plan.npz"
PLAN_REPORT = "plan.json"


@dataclass
class PartitionRecord:
    """One partition's sample accounting (the samples step); its JSON file is the step's marker."""

    events_in: int
    events_used: int
    filtered: dict[str, int]  # events dropped, by reason (kcore, min_len, truncated_max_uih_len)
    users_in: int
    users_kept: int
    samples: int
    samples_without_profile: int = 0

    def save(self, path: Path) -> None:
        save_json(path, asdict(self))

    @classmethod
    def load_if_done(cls, path: Path) -> PartitionRecord | None:
        return cls(**json.loads(path.read_text())) if path.exists() else None


@dataclass(frozen=True)
class RowTotals:
    """Partition records summed: the ``rows`` accounting of the manifest and of ``stats``."""

    events_used: int
    filtered: dict[str, int]
    users: int
    samples: int
    samples_without_profile: int

    @classmethod
    def of(cls, records: list[PartitionRecord]) -> RowTotals:
        filtered: dict[str, int] = {}
        for record in records:
            for reason, count in record.filtered.items():
                filtered[reason] = filtered.get(reason, 0) + count
        return cls(
            events_used=sum(record.events_used for record in records),
            filtered=dict(sorted(filtered.items())),
            users=sum(record.users_kept for record in records),
            samples=sum(record.samples for record in records),
            samples_without_profile=sum(record.samples_without_profile for record in records),
        )


@dataclass(frozen=True)
class SamplePlan:
    """Every planned sample, costed and placed before any is built (the plan step's output).

    Per-sample arrays are in canonical (user_id, window) order; ``order[offsets[m]:offsets[m+1]]``
    are the samples of micro-batch m (``balance.BalancePlan``)."""

    users: np.ndarray  # every user with events, sorted: the samples step ranks them per partition
    partition: np.ndarray  # user partition of each sample
    length: np.ndarray  # events of each sample
    cost: np.ndarray  # predicted cost of each sample (``cost.CostModel``)
    order: np.ndarray  # plan position -> sample
    offsets: np.ndarray  # micro-batch boundaries in ``order``
    report: dict[str, Any]  # the balance report (``balance.report``, ``balance.windows``)

    @property
    def n_samples(self) -> int:
        return len(self.order)

    @property
    def n_micro_batches(self) -> int:
        return len(self.offsets) - 1

    @property
    def total_events(self) -> int:
        return int(self.length.sum())

    def positions(self) -> np.ndarray:
        """Plan position of every sample (the inverse of ``order``)."""
        position = np.empty(self.n_samples, np.int64)
        position[self.order] = np.arange(self.n_samples)
        return position

    def micro_batches(self) -> np.ndarray:
        """Micro-batch of every sample, canonical order."""
        return np.repeat(np.arange(self.n_micro_batches), np.diff(self.offsets))[self.positions()]

    def save(self, work: Path) -> None:
        """Arrays, then the report: the report's presence marks the plan complete."""
        arrays = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "report"}
        with open(work / f"{PLAN_ARRAYS}.tmp", "wb") as out:
            np.savez(out, **arrays)
        os.replace(work / f"{PLAN_ARRAYS}.tmp", work / PLAN_ARRAYS)
        save_json(work / PLAN_REPORT, self.report)

    @classmethod
    def load_if_done(cls, work: Path) -> SamplePlan | None:
        if not (work / PLAN_REPORT).exists() or not (work / PLAN_ARRAYS).exists():
            return None
        data = np.load(work / PLAN_ARRAYS)
        return cls(**{key: data[key] for key in data.files}, report=json.loads((work / PLAN_REPORT).read_text()))
