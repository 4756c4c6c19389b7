"""Reader API for prepared datasets: which micro-batch rank ``r`` of ``W`` reads at step ``s``.

A prepared dataset is a sequence of step groups of ``G`` cost-balanced micro-batches. A run with
``W`` ranks (``W`` divides ``G``) spends ``G / W`` steps on a group and at each step rank ``r`` reads
micro-batch ``group·G + (s mod G/W)·W + r``. Any ``W`` dividing ``G`` therefore stays balanced, the
schedule is a pure function of the step counter (deterministic, resumable), and each rank reads only
its own rows — the loader, not mosaicml-streaming's shuffle, decides placement (DESIGN §8).

Rows are read by index through ``streaming.StreamingDataset`` (``shuffle=False``), which downloads
the shards a rank touches from ``s3://`` into a local cache.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from freescale import storage
from freescale.pipeline.manifest import ManifestError, read_manifest
from freescale.pipeline.streaming_modules import streaming_dataset_class


def default_cache_dir(dataset: str) -> str:
    digest = hashlib.sha256(dataset.encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / "freescale-cache" / digest)


class PreparedDataset:
    """A finished ``freescale prepare`` output (local directory or ``s3://`` prefix)."""

    def __init__(self, uri: str, cache_dir: str | None = None) -> None:
        self.uri = uri
        self.manifest = read_manifest(uri)
        layout = self.manifest["layout"]
        self.group_size: int = int(layout["group_size"])
        self.offsets = np.load(io.BytesIO(storage.read_bytes(storage.join(uri, layout["offsets_file"]))))
        self.n_micro_batches = len(self.offsets) - 1
        if self.n_micro_batches % self.group_size:
            raise ManifestError(
                f"{uri}: {self.n_micro_batches} micro-batches is not a multiple of group_size {self.group_size}"
            )
        self.n_step_groups = self.n_micro_batches // self.group_size
        self.cache_dir = cache_dir or default_cache_dir(uri)
        self._rows: Any = None

    @property
    def rows(self) -> Any:
        """The MDS rows (``StreamingDataset``), opened lazily: the import is heavy.

        Under torch.distributed, opening it is collective (streaming synchronises the ranks), so every
        rank must open it at the same point, not lazily in a prefetch thread. ``size`` is the
        dataset's total row count (``len()`` would be this rank's share of streaming's own split)."""
        if self._rows is None:
            StreamingDataset = streaming_dataset_class()

            remote = self.uri if storage.is_remote(self.uri) else None
            local = self.cache_dir if remote else self.uri
            self._rows = StreamingDataset(
                remote=remote, local=local, shuffle=False, batch_size=1, allow_unsafe_types=False
            )
            if self._rows.size != int(self.offsets[-1]):
                raise ManifestError(
                    f"{self.uri}: {self._rows.size} rows in the shards but the plan covers {int(self.offsets[-1])}"
                )
        return self._rows

    def check_world_size(self, world_size: int) -> None:
        if world_size < 1 or self.group_size % world_size:
            divisors = [w for w in range(1, self.group_size + 1) if self.group_size % w == 0]
            raise ValueError(
                f"world size {world_size} does not divide the dataset's group size "
                f"{self.group_size}; balanced world sizes: {divisors}"
            )

    def steps_per_epoch(self, world_size: int) -> int:
        self.check_world_size(world_size)
        return self.n_step_groups * (self.group_size // world_size)

    def micro_batch_index(self, step: int, rank: int, world_size: int) -> int:
        """The micro-batch rank ``rank`` of ``world_size`` reads at ``step`` (epochs wrap around)."""
        self.check_world_size(world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside [0, {world_size})")
        steps_per_group = self.group_size // world_size
        step %= self.steps_per_epoch(world_size)
        group, sub = divmod(step, steps_per_group)
        return group * self.group_size + sub * world_size + rank

    def micro_batch(self, index: int) -> list[dict[str, Any]]:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return [self.rows[i] for i in range(start, end)]

    def micro_batch_cost(self, index: int) -> float:
        return float(sum(sample["cost"] for sample in self.micro_batch(index)))


@dataclass
class RankReader:
    """Iterates one rank's micro-batches step by step; resumable from ``state_dict()``."""

    dataset: PreparedDataset
    world_size: int
    rank: int
    step: int = 0
    num_steps: int | None = None  # None: one epoch from the current step

    def __post_init__(self) -> None:
        self.dataset.check_world_size(self.world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside [0, {self.world_size})")

    def __iter__(self) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        end = self.step + (
            self.num_steps if self.num_steps is not None else self.dataset.steps_per_epoch(self.world_size) - self.step
        )
        while self.step < end:
            index = self.dataset.micro_batch_index(self.step, self.rank, self.world_size)
            batch = self.dataset.micro_batch(index)
            step = self.step
            self.step += 1
            yield step, batch

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "world_size": self.world_size, "rank": self.rank}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["world_size"] != self.world_size:
            raise ValueError(
                f"checkpoint was taken with world size {state['world_size']}, resuming with {self.world_size}"
            )
        self.step = int(state["step"])
