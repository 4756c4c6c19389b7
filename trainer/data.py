"""From prepared micro-batches to model-ready jagged batches, read ahead in a background thread.

The loader position is the step counter: ``RankReader`` maps (step, rank, world size) to a
micro-batch, so resuming is "start at step k" and nothing else needs saving. Random choices that
belong to a step (negatives) are drawn from ``numpy.random.default_rng([seed, step, rank])`` for
the same reason: a resumed run draws exactly what the uninterrupted run drew, and the single-process
reference can reproduce any rank's step.

Collation (CPU, in the prefetch thread so it stays off the critical path): ids are reduced modulo
the table sizes, sequences keep their most recent ``max_uih_len`` events, the user's last event is
held out for evaluation (``data.holdout_last``), and the jagged layout (length groups) is built.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from freescale.pipeline.reader import PreparedDataset, RankReader
from freescale.trainer.jagged import JaggedLayout, build_layout


@dataclass
class CollateConfig:
    """What collation needs from the run config (kept small so tests can build one directly)."""

    num_items: int
    num_actions: int
    max_len: int
    num_negatives: int
    inbatch_negatives: int
    length_group_ratio: float = 1.25
    holdout_last: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_len < 2:
            raise ValueError(f"model.max_uih_len must be >= 2 for next-item training, got {self.max_len}")

    @classmethod
    def for_model(cls, model: Any, extra: Any, holdout_last: bool = True, seed: int = 0) -> CollateConfig:
        """From the run config's ``[model]`` (``ModelConfig``) and ``[model_extra]`` tables: the trainer
        and ``calibrate`` collate the same way."""
        return cls(
            num_items=extra.num_items,
            num_actions=extra.num_actions,
            max_len=model.max_uih_len,
            num_negatives=model.num_negatives,
            inbatch_negatives=extra.inbatch_negatives,
            length_group_ratio=extra.length_group_ratio,
            holdout_last=holdout_last,
            seed=seed,
        )


@dataclass
class Batch:
    """One rank's micro-batch: jagged ids of every event, inputs = all but each sample's last event."""

    step: int
    item_ids: torch.Tensor  # [T] table rows of every event
    action_ids: torch.Tensor  # [T]
    timestamps: torch.Tensor  # [T] seconds
    lengths: torch.Tensor  # [B] events per sample (inputs + the final target)
    negative_ids: torch.Tensor  # [K] shared negatives
    input_index: torch.Tensor  # [M] rows of the inputs in the flat event tensors
    target_index: torch.Tensor  # [M] rows of each input's next event
    layout: JaggedLayout  # over the M inputs (lengths - 1 per sample)
    cost: float = 0.0  # planned cost (from prepare) of the samples
    user_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))

    @property
    def num_samples(self) -> int:
        return int(self.lengths.numel())

    @property
    def num_positions(self) -> int:
        return int(self.input_index.numel())

    def to(self, device: torch.device) -> Batch:
        tensors = {
            name: getattr(self, name).to(device)
            for name in (
                "item_ids",
                "action_ids",
                "timestamps",
                "lengths",
                "negative_ids",
                "input_index",
                "target_index",
                "user_ids",
            )
        }
        return replace(self, layout=self.layout.to(device), **tensors)

    def last_input_rows(self) -> torch.Tensor:
        """Row (within the M inputs) of each sample's last input: its query for evaluation."""
        return self.layout.offsets[1:] - 1


def sequence_arrays(sample: dict[str, Any], cfg: CollateConfig, holdout: bool) -> tuple[np.ndarray, ...]:
    """(items, actions, timestamps) of one sample after holdout and truncation."""
    items = np.asarray(sample["item_ids"], dtype=np.int64)
    actions = np.asarray(sample["actions"], dtype=np.int64)
    times = np.asarray(sample["timestamps"], dtype=np.int64)
    if holdout:
        items, actions, times = items[:-1], actions[:-1], times[:-1]
    keep = slice(max(0, len(items) - cfg.max_len), None)
    return items[keep] % cfg.num_items, actions[keep] % cfg.num_actions, times[keep]


def draw_negatives(targets: np.ndarray, cfg: CollateConfig, step: int, rank: int) -> np.ndarray:
    """``num_negatives`` uniform random rows plus ``inbatch_negatives`` targets of this micro-batch."""
    rng = np.random.default_rng([cfg.seed, step, rank])
    uniform = rng.integers(0, cfg.num_items, cfg.num_negatives, dtype=np.int64)
    if cfg.inbatch_negatives and len(targets):
        inbatch = targets[rng.integers(0, len(targets), cfg.inbatch_negatives)]
    else:
        inbatch = np.zeros(0, dtype=np.int64)
    return np.concatenate([uniform, inbatch])


def collate(
    samples: list[dict[str, Any]], cfg: CollateConfig, step: int, rank: int, holdout: bool | None = None
) -> Batch:
    """Prepared samples (dicts of numpy arrays) → ``Batch``; samples under two events are skipped."""
    holdout = cfg.holdout_last if holdout is None else holdout
    parts = [sequence_arrays(s, cfg, holdout) for s in samples]
    kept = [i for i, p in enumerate(parts) if len(p[0]) >= 2]
    parts = [parts[i] for i in kept]
    lengths = np.array([len(p[0]) for p in parts], dtype=np.int64)
    items, actions, times = (
        np.concatenate([p[j] for p in parts]) if parts else np.zeros(0, np.int64) for j in range(3)
    )
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if parts else np.zeros(0, np.int64)
    input_index = np.concatenate([s + np.arange(n - 1) for s, n in zip(starts, lengths)]) if parts else starts
    target_index = input_index + 1
    negatives = draw_negatives(items[target_index], cfg, step, rank)
    as_tensor = torch.from_numpy
    return Batch(
        step=step,
        item_ids=as_tensor(items),
        action_ids=as_tensor(actions),
        timestamps=as_tensor(times),
        lengths=as_tensor(lengths),
        negative_ids=as_tensor(negatives),
        input_index=as_tensor(input_index),
        target_index=as_tensor(target_index),
        layout=build_layout(as_tensor(lengths - 1), cfg.length_group_ratio),
        cost=float(sum(float(samples[i]["cost"]) for i in kept)),
        user_ids=torch.tensor([int(samples[i]["user_id"]) for i in kept], dtype=torch.int64),
    )


def open_dataset(uri: str, cache_dir: str | None, verify: bool = True) -> PreparedDataset:
    """A ``PreparedDataset`` whose MDS rows are opened now, on every rank together.

    Under torchrun mosaicml-streaming calls ``dist.barrier()`` while registering its shared memory,
    so the first access must happen on all ranks at the same point of the main thread — not lazily
    inside the prefetch thread. Rows are read map-style by global index, so the per-rank partition
    streaming computes is never used.
    """
    dataset = PreparedDataset(uri, cache_dir=cache_dir, verify=verify)
    _ = dataset.rows  # collective open (and the row-count check) here, see above
    return dataset


class StepLoader:
    """``(step, Batch)`` for steps ``[start, end)`` of one rank, read ahead by a daemon thread.

    The thread only reads and collates (numpy, the GIL is released in MDS decoding and numpy
    kernels); ``prefetch=0`` reads inline, which the benchmarks use to keep timings single-threaded.
    """

    def __init__(
        self,
        dataset: PreparedDataset,
        world_size: int,
        rank: int,
        start: int,
        end: int,
        cfg: CollateConfig,
        prefetch: int = 2,
    ) -> None:
        self.reader = RankReader(dataset, world_size=world_size, rank=rank, step=start, num_steps=end - start)
        self.cfg, self.rank, self.prefetch = cfg, rank, prefetch
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _batches(self) -> Iterator[Batch]:
        for step, samples in self.reader:
            yield collate(samples, self.cfg, step, self.rank)

    def _produce(self) -> None:
        try:
            for batch in self._batches():
                while not self._stop.is_set():
                    try:
                        self._queue.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(StopIteration())
        except BaseException as error:  # surfaced in the training thread
            self._queue.put(error)

    def __iter__(self) -> Iterator[Batch]:
        if self.prefetch == 0:
            yield from self._batches()
            return
        self._thread = threading.Thread(target=self._produce, name="freescale-prefetch", daemon=True)
        self._thread.start()
        while True:
            item = self._queue.get()
            if isinstance(item, StopIteration):
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def eval_samples(dataset: PreparedDataset, world_size: int, rank: int, max_users: int) -> list[dict[str, Any]]:
    """This rank's share of leave-last-out users: window-0 samples of micro-batches ``rank, rank+W, …``."""
    share = -(-max_users // world_size)
    chosen: list[dict[str, Any]] = []
    for index in range(rank, dataset.n_micro_batches, world_size):
        for sample in dataset.micro_batch(index):
            if int(sample["window"]) == 0 and int(sample["length"]) >= 3:
                chosen.append(sample)
                if len(chosen) >= share:
                    return chosen
    return chosen
