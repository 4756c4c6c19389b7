"""The torch construction of ``JaggedLayout`` that ``jagged.build_layout`` replaced (numpy since the
loader-data work): kept as the reference its tensors are compared with, bit for bit."""

from __future__ import annotations

import torch

from freescale.trainer.jagged import GROUP_OVERHEAD_ELEMENTS, JaggedLayout, LengthGroup, group_by_length


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
