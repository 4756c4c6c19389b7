"""Per-rank, per-step timing of explicit stages and of every blocking collective wait.

Why this shape: ``straggler_pct`` (idle waiting for slower ranks) and ``exposed_comm_pct`` (blocked
on communication) both show up as time spent *inside* a collective call, and one rank cannot tell
the two apart alone. So each collective records when this rank *arrived* (launched it) and when it
waited for it; after the run (or every ``log_every`` steps) the records of all ranks are gathered
and ``bubbles.analyze`` splits each wait: the part before the slowest rank arrived is idle, the rest
is communication. No extra barrier sits on the critical path, and both engines (ours and TorchRec)
are measured by the same rule.

Timestamps are ``time.perf_counter()`` (CLOCK_MONOTONIC, shared by processes of one host); ranks on
other hosts are aligned with offsets measured once at start-up (``clock_offsets``). On CUDA the
timer synchronises the calling thread's current stream at stage boundaries (``engine.instrument``),
so stage times are device times of the step's own work. Not the whole device: PEC's communication
thread runs its kernels and copies on a stream of its own, and a device-wide synchronize would make
every stage of the main thread wait for them, serialising what PEC overlaps.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

KINDS = ("compute", "comm", "data")


@dataclass
class StageSpan:
    """A contiguous piece of a step: ``kind`` compute (incl. optimizer), comm or data."""

    name: str
    kind: str
    start: float
    end: float


@dataclass
class CommRecord:
    """One collective: launched at ``launch``; this rank blocked on it in ``[wait_start, wait_end]``."""

    name: str
    launch: float
    wait_start: float
    wait_end: float


@dataclass
class StepRecord:
    """Everything one rank measured in one step."""

    step: int
    rank: int
    start: float = 0.0
    end: float = 0.0
    stages: list[StageSpan] = field(default_factory=list)
    comms: list[CommRecord] = field(default_factory=list)
    loss: float = 0.0
    samples: int = 0
    positions: int = 0
    cost: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)  # engine-specific counters (PEC: overlap, prefetch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        data = dict(data)
        data["stages"] = [StageSpan(**s) for s in data["stages"]]
        data["comms"] = [CommRecord(**c) for c in data["comms"]]
        return cls(**data)


class StepTimer:
    """Stamps stage boundaries and collective waits for the current step of this rank."""

    def __init__(self, rank: int, device: torch.device, enabled: bool = True) -> None:
        self.rank = rank
        self.enabled = enabled
        self._sync: Callable[[], None] = (
            (lambda: torch.cuda.current_stream(device).synchronize())
            if device.type == "cuda" and enabled
            else (lambda: None)
        )
        self.current: StepRecord | None = None
        self._last_end = 0.0

    def now(self) -> float:
        self._sync()
        return time.perf_counter()

    def begin_step(self, step: int) -> None:
        self.current = StepRecord(step=step, rank=self.rank, start=self.now())
        self._last_end = self.current.start

    def end_step(self) -> StepRecord:
        """Close the step; the last stage is extended to the step's end (stages tile the step)."""
        record = self._require()
        record.end = self.now()
        own = [s for s in record.stages if s.end == self._last_end]
        if own:
            own[-1].end = record.end
        self.current = None
        return record

    def _require(self) -> StepRecord:
        if self.current is None:
            raise RuntimeError("StepTimer: no step in progress (call begin_step first)")
        return self.current

    @contextmanager
    def stage(self, name: str, kind: str, contiguous: bool = True) -> Iterator[None]:
        """Time a stage. By default it starts where the step's previous stage ended.

        Why contiguous: between two ``with`` blocks the main thread can lose the GIL to the prefetch
        thread for up to the interpreter's switch interval (5 ms); that time is spent on this rank's
        behalf and belongs to the step, so it is charged to the stage that follows instead of
        vanishing between stages. ``bubbles.analyze`` reports what no stage covers as ``untimed``.
        """
        if kind not in KINDS:
            raise ValueError(f"stage kind must be one of {KINDS}, got {kind!r}")
        if self.current is None:
            yield
            return
        start = self._last_end if contiguous else self.now()
        try:
            yield
        finally:
            end = self.now()
            self.current.stages.append(StageSpan(name, kind, start, end))
            self._last_end = end

    def record_comm(self, name: str, launch: float, wait_start: float, wait_end: float) -> None:
        if self.current is not None:
            self.current.comms.append(CommRecord(name, launch, wait_start, wait_end))


def clock_offsets(rounds: int = 5) -> list[float]:
    """Per-rank offset to add to this rank's ``perf_counter`` to get rank 0's clock.

    Ranks on one host share CLOCK_MONOTONIC: offsets are exactly zero. Across hosts, the median over
    ``rounds`` of (time after a barrier) - (rank 0's time after it) estimates the offset to within the
    barrier's exit skew.
    """
    world = dist.get_world_size()
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    if len(set(hosts)) == 1:
        return [0.0] * world
    samples = []
    for _ in range(rounds):
        dist.barrier()
        stamps: list[Any] = [None] * world
        dist.all_gather_object(stamps, time.perf_counter())
        samples.append([stamps[0] - s for s in stamps])
    return [sorted(column)[len(column) // 2] for column in zip(*samples)]


def gather_records(records: list[StepRecord], offset: float) -> list[list[StepRecord]] | None:
    """All ranks' records (shifted onto rank 0's clock) on rank 0; ``None`` elsewhere."""
    payload = [_shifted(r, offset).to_dict() for r in records]
    world, rank = dist.get_world_size(), dist.get_rank()
    gathered: list[Any] = [None] * world if rank == 0 else None  # type: ignore[assignment]
    dist.gather_object(payload, gathered, dst=0)
    if rank != 0:
        return None
    return [[StepRecord.from_dict(r) for r in rank_records] for rank_records in gathered]


def _shifted(record: StepRecord, offset: float) -> StepRecord:
    if offset == 0.0:
        return record
    return StepRecord(
        step=record.step,
        rank=record.rank,
        start=record.start + offset,
        end=record.end + offset,
        stages=[StageSpan(s.name, s.kind, s.start + offset, s.end + offset) for s in record.stages],
        comms=[CommRecord(c.name, c.launch + offset, c.wait_start + offset, c.wait_end + offset) for c in record.comms],
        loss=record.loss,
        samples=record.samples,
        positions=record.positions,
        cost=record.cost,
        extra=dict(record.extra),
    )
