"""From prepared micro-batches to model-ready jagged batches (the trainer's collation).

The public loader (``pipeline/dataset/loader.py``) calls ``collate`` (its ``collate_fn``) in its worker
processes, so it stays off the critical path. The loader position is the step counter:
``PreparedDataset.micro_batch_index`` maps (step, rank, world size) to a micro-batch, so resuming
is "start at step k" and nothing else needs saving. Random choices that belong to a step (negatives) are drawn from
``numpy.random.default_rng([seed, step, rank])`` for the same reason: a resumed run draws exactly
what the uninterrupted run drew, and the single-process reference can reproduce any rank's step.

Collation: the samples are read as the dataset defines them (``pipeline.dataset.samples``: raw ids
to table rows, the user's evaluation items held out, the most recent ``max_uih_len`` events kept, the
count of events this drops kept per batch for the run summary), then the negatives are drawn and the
jagged layout (length groups) is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from freescale.pipeline.dataset.profiles import profile_rows
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import CollateConfig, sequence_arrays
from freescale.trainer.data.jagged import JaggedLayout, build_layout


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
    truncated: int = 0  # events dropped because a sample was longer than model.max_uih_len
    user_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    # user-profile tables (``[user_tables]``): their names and [tables, B] rows, one per sample each
    profile_tables: tuple[str, ...] = ()
    profile_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.int64))
    # the latest event time of the batch (0: none), taken on the host at collation: a ttl zch table's
    # clock, read without reading the device (a device read would drain the CUDA stream every step)
    latest_time: int = 0
    # [B] raw item id of each sample's last event, as the catalogue names it (item_ids hold rows): which
    # sampled candidate *is* the target under a hashed table, where other items share its row
    last_items: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))

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
                "profile_ids",
                "last_items",
            )
        }
        return replace(self, layout=self.layout.to(device), **tensors)

    def attention_times(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(time of each input, time of the event it predicts): what the model's time bias reads."""
        return self.timestamps[self.input_index], self.timestamps[self.target_index]

    def input_samples(self) -> torch.Tensor:
        """Sample (0..B-1) of each of the M inputs: where a per-sample value (the profile) applies."""
        samples = torch.arange(self.num_samples, device=self.lengths.device)
        return torch.repeat_interleave(samples, self.lengths - 1)

    def last_input_rows(self) -> torch.Tensor:
        """Row (within the M inputs) of each sample's last input: its query for evaluation."""
        return self.layout.offsets[1:] - 1


def draw_negatives(targets: np.ndarray, cfg: CollateConfig, step: int, rank: int) -> np.ndarray:
    """``num_negatives`` uniform random rows plus ``inbatch_negatives`` targets of this micro-batch; with
    ``full_softmax`` every item row (the loss then scores each target against the whole catalogue:
    the shared-negatives loss with all rows, the target's own row masked, is the full softmax)."""
    if cfg.full_softmax:
        return np.arange(cfg.num_items, dtype=np.int64)
    rng = np.random.default_rng([cfg.seed, step, rank])
    if cfg.item_pool is not None:  # raw ids (model_extra.ids = "zch"): items of the dataset's vocabulary
        uniform = cfg.item_pool[rng.integers(0, len(cfg.item_pool), cfg.num_negatives)]
    else:
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
    seq = sequence_arrays(samples, cfg, holdout)
    input_index = seq.input_rows()
    target_index = input_index + 1
    negatives = draw_negatives(seq.items[target_index], cfg, step, rank)
    as_tensor = torch.from_numpy
    return Batch(
        step=step,
        item_ids=as_tensor(seq.items),
        action_ids=as_tensor(seq.actions),
        timestamps=as_tensor(seq.times),
        lengths=as_tensor(seq.lengths),
        negative_ids=as_tensor(negatives),
        input_index=as_tensor(input_index),
        target_index=as_tensor(target_index),
        layout=build_layout(as_tensor(seq.lengths - 1), cfg.length_group_ratio),
        cost=float(sum(float(samples[i]["cost"]) for i in seq.kept)),
        truncated=int(seq.truncated),
        user_ids=torch.tensor([int(samples[i]["user_id"]) for i in seq.kept], dtype=torch.int64),
        profile_tables=tuple(read.table for read in cfg.profiles),
        profile_ids=as_tensor(profile_rows(cfg.profiles, samples, seq.kept)),
        latest_time=int(seq.times.max()) if len(seq.times) else 0,
        last_items=as_tensor(seq.last_items),
    )


def eval_samples(
    dataset: PreparedDataset, world_size: int, rank: int, max_users: int, holdout_events: int = 2
) -> list[dict[str, Any]]:
    """This rank's share of the evaluated users: their window-0 samples (each user's most recent events)
    long enough to hold a history before the held-out items, from micro-batches ``rank, rank+W, …``.
    ``max_users < 0``: every such user; else about ``max_users`` over all ranks."""
    share = -(-max_users // world_size) if max_users >= 0 else None
    chosen: list[dict[str, Any]] = []
    for index in range(rank, dataset.n_micro_batches, world_size):
        for sample in dataset.micro_batch(index):
            if int(sample["window"]) == 0 and int(sample["length"]) >= holdout_events + 1:
                chosen.append(sample)
                if share is not None and len(chosen) >= share:
                    return chosen
    return chosen


def split_query(sample: dict[str, Any], split: str) -> dict[str, Any]:
    """The evaluation query of a window-0 sample: its events up to the split's target (the target
    last). ``test``: the whole sample (history includes the validation item); ``validation``: all but
    the last event (the target is the second-to-last event)."""
    if split == "test":
        return sample
    if split != "validation":
        raise ValueError(f"split must be 'validation' or 'test', got {split!r}")
    cut = {name: sample[name][:-1] for name in ("item_ids", "actions", "timestamps")}
    return {**sample, **cut, "length": int(sample["length"]) - 1}
