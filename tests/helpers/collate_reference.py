"""Collation as it was built before the loader-data work, kept as the reference the faster code is
compared with bit for bit: the torch construction of ``JaggedLayout`` (``jagged.build_layout`` is
numpy now) and per-sample id mapping (``data.sequence_arrays`` maps a micro-batch at once)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from freescale.pipeline.dataset.samples import CollateConfig
from freescale.pipeline.dataset.targets import held_out
from freescale.trainer.data.jagged import GROUP_OVERHEAD_ELEMENTS, JaggedLayout, LengthGroup, group_by_length


def torch_build_layout(
    lengths: torch.Tensor, ratio: float = 1.25, overhead: float = GROUP_OVERHEAD_ELEMENTS
) -> JaggedLayout:
    """A ``JaggedLayout`` for per-sample ``lengths`` (CPU int64; move it with ``.to``); see ``group_by_length``."""
    lengths = lengths.to(torch.int64).cpu()
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    groups = []
    for members in group_by_length(lengths.tolist(), ratio, overhead=overhead):
        group_lengths = lengths[members]
        width = int(group_lengths.max())
        steps = torch.arange(width)
        valid = steps[None, :] < group_lengths[:, None]
        index = torch.where(
            valid, offsets[members][:, None] + steps[None, :], torch.full_like(valid, total, dtype=torch.int64)
        )
        groups.append(LengthGroup(torch.tensor(members, dtype=torch.int64), index, valid, group_lengths))
    order = torch.cat([g.index[g.valid] for g in groups]) if groups else torch.zeros(0, dtype=torch.int64)
    inverse = torch.empty(total, dtype=torch.int64)
    inverse[order] = torch.arange(total)
    sample_of = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    positions = torch.arange(total) - offsets[:-1][sample_of]
    return JaggedLayout(lengths, offsets, groups, inverse, positions, sample_of)


def per_sample_arrays(
    samples: list[dict[str, Any]], cfg: CollateConfig, holdout: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[int], int, np.ndarray]:
    """(items, actions, times, lengths, kept, truncated, input rows) the way collate built them."""
    parts = []
    for sample in samples:
        items = np.asarray(sample["item_ids"], dtype=np.int64)
        actions = np.asarray(sample["actions"], dtype=np.int64)
        times = np.asarray(sample["timestamps"], dtype=np.int64)
        if holdout:
            drop = held_out(sample, cfg.holdout_events, cfg.window_stride)
            if drop:
                items, actions, times = items[:-drop], actions[:-drop], times[:-drop]
        cut = max(0, len(items) - cfg.max_len)
        items, actions, times = items[cut:], actions[cut:], times[cut:]
        parts.append((cfg.item_rows(items), cfg.action_rows(actions), times, cut))
    kept = [i for i, p in enumerate(parts) if len(p[0]) >= 2]
    parts = [parts[i] for i in kept]
    lengths = np.array([len(p[0]) for p in parts], dtype=np.int64)
    columns = [np.concatenate([p[j] for p in parts]) if parts else np.zeros(0, np.int64) for j in range(3)]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if parts else np.zeros(0, np.int64)
    inputs = np.concatenate([s + np.arange(n - 1) for s, n in zip(starts, lengths)]) if parts else starts
    return (*columns, lengths, kept, sum(p[3] for p in parts), inputs)
