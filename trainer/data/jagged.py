"""Jagged sequences without padding every sample to the batch max (docs/design.md#cost-model).

A micro-batch is a flat tensor of all samples' positions plus per-sample lengths. Projections run
on the flat ``[N, d]`` values (cost ∝ Σ L_i). Attention needs a square per sample; padding the whole
batch to ``max L`` would cost ``B · max L²`` — exactly the waste ``sparsity`` measures. Instead the
samples are sorted by length and cut into *length groups*, each padded only to its own max. Padded
keys are masked and padded queries are dropped, so the result equals per-sample attention exactly
(up to float summation order) and does not depend on which other samples share the micro-batch.

How to cut: every group is one batched attention per layer — about 25 framework ops forward and
backward, ~1.2 ms per group on one CPU core at d=64, two layers, as much as ~8k padded score
entries. Cutting only by a length ratio put 1 to 8 groups into an 8-sample micro-batch, so two
micro-batches of equal Σ cost(L_i) differed by up to ~9 ms (measured: 8 short samples 13.4 ms in 8
groups vs 4.8 ms in one), a straggler bubble no per-sample cost model can see. ``group_by_length``
therefore picks the cut that minimises ``Σ_g (B_g · L_max,g² + overhead)`` (dynamic programming over
the sorted lengths), with each group's padding bounded by ``ratio² · Σ L_i²`` plus the overhead it
saves. Short samples then share one group, long ones stay exact, and a micro-batch's time is close
to a sum of per-sample costs again (what the planner balances). On CUDA the HSTU model runs the
jagged Triton kernel instead (``model_extra.attention``; docs/kernels.md), which reads only the
layout's offsets: no padding and no groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class LengthGroup:
    """Samples padded together: ``index[b, t]`` is the flat position (``N`` = the zero pad row)."""

    samples: torch.Tensor  # [B_g] sample numbers
    index: torch.Tensor  # [B_g, L_max] into the flat values, N where padded
    valid: torch.Tensor  # [B_g, L_max] bool
    lengths: torch.Tensor  # [B_g]

    @property
    def max_len(self) -> int:
        return int(self.index.shape[1])


@dataclass
class JaggedLayout:
    """Where each sample's positions live in the flat tensor, and its length groups.

    The attention's view of one micro-batch: per-sample ``lengths``/``offsets`` and what is derived
    from them (length groups, per-position sample and position). It holds no values: the flat
    ``[N, d]`` tensors travel beside it. Two other jagged containers differ in meaning and stay
    separate: ``kernels.dispatch.JaggedRows`` is a payload of per-sample rows that moves between
    ranks as units (values, lengths, optional dense/labels), and ``jagged_ids.JaggedIds`` holds ids
    keyed by feature with lengths per *key* (TorchRec's ``KeyedJaggedTensor`` subset the tables read).
    """

    lengths: torch.Tensor  # [B] int64, positions per sample
    offsets: torch.Tensor  # [B + 1] int64
    groups: list[LengthGroup]
    inverse: torch.Tensor  # [N]: row of the concatenated valid group outputs holding flat position n
    positions: torch.Tensor  # [N] int64: position of each flat row within its sample
    sample_of: torch.Tensor  # [N] int64: sample of each flat row

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_samples(self) -> int:
        return int(self.lengths.numel())

    def to(self, device: torch.device) -> JaggedLayout:
        groups = [LengthGroup(*(t.to(device) for t in (g.samples, g.index, g.valid, g.lengths))) for g in self.groups]
        return JaggedLayout(
            self.lengths.to(device),
            self.offsets.to(device),
            groups,
            self.inverse.to(device),
            self.positions.to(device),
            self.sample_of.to(device),
        )


MAX_GROUP_ELEMENTS = 2**24  # B_g · L_max² per group: bounds one attention score tensor per head
# What one more length group costs, in padded score entries (B·L² units): measured on one CPU core
# (d_model 64, 2 HSTU layers, forward + backward) as ~1.2 ms per group over ~1.6e-7 s per entry.
# ``freescale.trainer.simulate.calibrate`` reports the value measured on the target hardware.
GROUP_OVERHEAD_ELEMENTS = 8192
DP_WINDOW = 1024  # a group never spans more samples than this (keeps the cut O(n · window))


def group_by_length(
    lengths: list[int],
    ratio: float,
    max_elements: int = MAX_GROUP_ELEMENTS,
    overhead: float = GROUP_OVERHEAD_ELEMENTS,
) -> list[list[int]]:
    """Sample numbers in groups (longest first) minimising padded attention work plus per-group overhead.

    The samples (length > 0) are sorted longest first and cut into contiguous groups; the cut
    minimises ``Σ_g (B_g · L_max,g² + overhead)``. A group is admissible when its padded work
    ``B_g · L_max²`` is at most ``ratio² · Σ L_i² + (B_g - 1) · overhead`` (with ``overhead=0``
    nothing is padded beyond ``ratio²``) and at most ``max_elements`` unless it is one sample, so a
    step full of long outliers runs as several moderate batches instead of one that does not fit.
    """
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    n = len(order)
    if n == 0:
        return []
    sizes = np.array([lengths[i] for i in order], dtype=np.float64)
    squares = sizes * sizes
    prefix = np.concatenate([[0.0], np.cumsum(squares)])
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, dtype=np.int64)
    slack = ratio * ratio
    for j in range(1, n + 1):
        first = max(0, j - DP_WINDOW)
        starts = np.arange(first, j)
        count = j - starts
        padded = count * squares[starts]
        admissible = padded <= slack * (prefix[j] - prefix[starts]) + (count - 1) * overhead + 1e-9
        admissible &= (padded <= max_elements) | (count == 1)
        total = np.where(admissible, best[starts] + padded + overhead, np.inf)
        k = int(np.argmin(total))  # the first minimum: deterministic
        best[j], cut[j] = total[k], first + k
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = int(cut[j])
    return groups[::-1]


def build_layout(lengths: torch.Tensor, ratio: float = 1.25, overhead: float = GROUP_OVERHEAD_ELEMENTS) -> JaggedLayout:
    """A ``JaggedLayout`` for per-sample ``lengths`` (CPU int64; move it with ``.to``); see ``group_by_length``.

    Built with numpy and wrapped with ``torch.from_numpy``: it runs once per micro-batch in the
    loader's worker, which shares the rank's core (``engine.pin_cpus``), and a numpy call on arrays
    this small costs a fraction of a torch op's dispatch (a bench_bubbles micro-batch: 0.52 -> 0.27 ms
    warm on the 2-core host). Same tensors bit for bit: ``tests/trainer/data/test_jagged.py`` compares them
    with the torch construction (``tests/helpers/collate_reference.py``).
    """
    lengths = lengths.to(torch.int64).cpu()
    sizes = lengths.numpy()
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    groups, rows = [], []
    for members in group_by_length(sizes.tolist(), ratio, overhead=overhead):
        samples = np.array(members, dtype=np.int64)
        group_lengths = sizes[samples]
        steps = np.arange(int(group_lengths.max()), dtype=np.int64)
        valid = steps[None, :] < group_lengths[:, None]
        index = np.where(valid, offsets[samples][:, None] + steps[None, :], np.int64(total))
        rows.append(index[valid])
        groups.append(LengthGroup(*(torch.from_numpy(a) for a in (samples, index, valid, group_lengths))))
    order = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    inverse = np.empty(total, dtype=np.int64)
    inverse[order] = np.arange(total, dtype=np.int64)
    sample_of = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    positions = np.arange(total, dtype=np.int64) - offsets[:-1][sample_of]
    as_tensor = torch.from_numpy
    return JaggedLayout(
        lengths, as_tensor(offsets), groups, as_tensor(inverse), as_tensor(positions), as_tensor(sample_of)
    )


def pad_source(values: torch.Tensor) -> torch.Tensor:
    """``values`` with one zero row appended: the row padded slots read."""
    return torch.cat([values, values.new_zeros((1, *values.shape[1:]))])


def to_padded(source: torch.Tensor, group: LengthGroup) -> torch.Tensor:
    """``[B_g, L_max, ...]`` rows of ``pad_source(values)`` for one group."""
    return source[group.index]


def from_groups(outputs: list[torch.Tensor], layout: JaggedLayout) -> torch.Tensor:
    """Flat ``[N, ...]`` from per-group padded outputs (padded rows dropped), in sample order."""
    if not outputs:
        raise ValueError("from_groups needs at least one group")
    valid_rows = torch.cat([out[group.valid] for out, group in zip(outputs, layout.groups)])
    return valid_rows[layout.inverse]


def padded_sum_of_squares(layout: JaggedLayout) -> tuple[int, int]:
    """(Σ over groups of B_g·L_max², Σ L_i²): the attention work done vs the jagged ideal."""
    done = sum(int(g.index.shape[0]) * g.max_len**2 for g in layout.groups)
    ideal = int((layout.lengths.to(torch.float64) ** 2).sum())
    return done, ideal
