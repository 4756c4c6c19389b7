"""Micro-batch assignment for the step-group planner: which micro-batch of its step each sample lands in.

``assign_bins`` splits every step of a flat ``Steps`` membership (``step_membership``) into G micro-batches
(docs/design.md#balancing): without balancing, consecutive chunks of the random step order (equal counts)
or sequential packing by cost (free counts); with it, batched LPT and/or KK (``algos``), the better one per
step, then swap refinement of the steps whose max/mean stays above a threshold. Bins are relabelled
heaviest first, so every W-aligned slice of a group holds bins of similar cost.

Steps are cut into padded ``[steps, width]`` blocks of similar size (at most ``_BLOCK_ELEMENTS`` elements,
so memory stays flat on huge inputs), costs descending within each row; ``desc_positions`` gets that
order from one radix grouping of the global cost sort (``Ranked``, ``stable_group``) instead of a sort per
step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .algos import KK_HEAD_PER_BIN, kk_equal, kk_free, lpt_equal, lpt_free, refine_swaps
from .step_membership import stable_group

if TYPE_CHECKING:
    from .step_membership import Ranked, Steps

# Bound on padded elements handled by one vectorised call (keeps memory flat on huge inputs).
_BLOCK_ELEMENTS = 1 << 22


def _step_ids(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(offsets.size - 1), np.diff(offsets))


def _random_bins_equal(sizes: np.ndarray, group_size: int) -> np.ndarray:
    """Consecutive chunks of the (random) step order; counts differ by at most 1."""
    step = np.repeat(np.arange(sizes.size), sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    j = np.arange(step.size) - starts[step]
    q, rem = sizes[step] // group_size, sizes[step] % group_size
    big = rem * (q + 1)
    return np.where(j < big, j // (q + 1), rem + (j - big) // np.maximum(q, 1)).astype(np.int64)


def _random_bins_free(c: np.ndarray, group_size: int) -> np.ndarray:
    """Sequential packing of one step by cost (dynamic batching): micro-batch m takes the items
    whose cumulative cost falls in [m, m+1)·total/G, bent so every micro-batch gets ≥ 1 item."""
    m = c.size
    total = c.sum()
    j = np.arange(m)
    if total > 0:
        base = np.floor((np.cumsum(c) - c) * group_size / total).astype(np.int64)
    else:
        base = j * group_size // max(m, 1)
    b1 = np.maximum(np.minimum(base, group_size - 1), j - m + group_size)
    return j + np.minimum.accumulate(b1 - j)


def desc_positions(ranked: Ranked, steps: Steps) -> np.ndarray:
    """Positions of ``steps.items`` grouped by step (segment s = ``offsets[s]:offsets[s+1]``) and
    sorted by descending cost within each step: one radix grouping of the global order instead
    of a sort per step."""
    n = steps.items.size
    step_of = np.empty(ranked.costs.size, dtype=np.int64)
    step_of[steps.items] = _step_ids(steps.offsets)
    pos_of = np.empty(ranked.costs.size, dtype=np.int64)
    pos_of[steps.items] = np.arange(n)
    seq = ranked.desc
    if n < ranked.costs.size:  # a subset of the samples (free-count steps of an equal-count plan)
        inside = np.zeros(ranked.costs.size, dtype=bool)
        inside[steps.items] = True
        seq = seq[inside[seq]]
    return pos_of[seq[stable_group(step_of[seq])]]


def _padded(costs, items, offsets, sorted_pos, steps: np.ndarray, width: int):
    """Rows = steps, costs descending, padded with zero-cost dummies: (x, position or -1)."""
    sizes = offsets[steps + 1] - offsets[steps]
    col = np.arange(width)
    valid = col < sizes[:, None]
    cell = np.where(valid, offsets[steps][:, None] + col, 0)
    pos = np.where(valid, sorted_pos[np.minimum(cell, sorted_pos.size - 1)], -1)
    x = np.where(valid, costs[items[np.maximum(pos, 0)]], 0.0)
    return x, pos


def _buckets(sizes: np.ndarray, multiple: int, equal: bool) -> list[tuple[np.ndarray, int]]:
    """Group steps of similar size so padding stays small; each with its padded width."""
    order = np.argsort(sizes, kind="stable")
    out: list[tuple[np.ndarray, int]] = []
    i = 0
    while i < order.size:
        first = sizes[order[i]]
        limit = first if equal else max(int(first * 1.25), first + multiple)
        j = i
        while j < order.size and sizes[order[j]] <= limit:
            j += 1
        width = int(-(-sizes[order[j - 1]] // multiple) * multiple) if equal else int(sizes[order[j - 1]])
        rows = max(1, _BLOCK_ELEMENTS // max(width, 1))
        for lo in range(i, j, rows):
            out.append((order[lo : min(j, lo + rows)], width))
        i = j
    return out


def _max_load(x: np.ndarray, bins: np.ndarray, group_size: int) -> np.ndarray:
    n = x.shape[0]
    key = np.arange(n)[:, None] * group_size + bins
    return np.bincount(key.ravel(), weights=x.ravel(), minlength=n * group_size).reshape(n, -1).max(1)


def assign_bins(
    ranked: Ranked,
    steps: Steps,
    group_size: int,
    equal: bool,
    balance: bool,
    algorithms: tuple[str, ...],
    refine: int,
    refine_above: float = 1.0,
    probe: bool = False,
) -> tuple[np.ndarray, dict]:
    """Micro-batch (0..G-1) of every position of ``steps.items``; bins sorted by load, heaviest
    first, so every W-aligned slice of a group holds bins of similar cost. Swap refinement runs
    on steps whose max/mean exceeds ``refine_above``. A ``probe`` (outlier search) only needs the
    loads: it skips the empty-bin fix and the relabelling."""
    costs = ranked.costs
    items, offsets = steps.items, steps.offsets
    sizes = np.diff(offsets)
    bins = np.zeros(items.size, dtype=np.int64)
    stats = {"lpt": 0, "kk": 0, "swaps": 0}
    if not balance:
        if equal:
            bins = _random_bins_equal(sizes, group_size)
        else:
            for s in range(sizes.size):
                lo, hi = offsets[s], offsets[s + 1]
                bins[lo:hi] = _random_bins_free(costs[items[lo:hi]], group_size)
        return bins, stats
    sorted_pos = desc_positions(ranked, steps)
    for rows, width in _buckets(sizes, group_size, equal):
        x, pos = _padded(costs, items, offsets, sorted_pos, rows, width)
        results = []
        if "lpt" in algorithms:
            lpt = lpt_equal if equal else lpt_free
            results.append(("lpt", lpt(x, group_size, sizes=sizes[rows])))
        if "kk" in algorithms:
            if equal:
                results.append(("kk", kk_equal(x, group_size)))
            else:
                h = KK_HEAD_PER_BIN * group_size
                head_bins, loads = kk_free(x, group_size, h)
                head = np.zeros_like(pos)
                head[:, : head_bins.shape[1]] = head_bins
                if h < width:
                    tail = np.maximum(sizes[rows] - h, 0)
                    head[:, h:] = lpt_free(x[:, h:], group_size, loads, tail)
                results.append(("kk", head))
        best = results[0][1]
        if len(results) == 2:
            kk_better = _max_load(x, results[1][1], group_size) < _max_load(x, best, group_size)
            best = np.where(kk_better[:, None], results[1][1], best)
            stats["kk"] += int(kk_better.sum())
            stats["lpt"] += int((~kk_better).sum())
        else:
            stats[results[0][0]] += rows.size
        ok = pos >= 0
        bins[pos[ok]] = best[ok]
    if not equal and not probe:
        _fill_empty(costs, items, offsets, bins, group_size)
    if refine > 0:
        stats["swaps"] = _refine(costs, items, offsets, bins, group_size, refine, refine_above)
    if not probe:
        _sort_bins_by_load(costs, items, offsets, bins, group_size)
    return bins, stats


def _fill_empty(costs, items, offsets, bins, group_size) -> None:
    """Free-count: move the cheapest item of the fullest bin into any empty bin (zero costs can
    leave LPT/KK with empty micro-batches). Never raises the step's max bin."""
    step = _step_ids(offsets)
    counts = np.bincount(step * group_size + bins, minlength=(offsets.size - 1) * group_size)
    counts = counts.reshape(-1, group_size)
    for s in np.flatnonzero((counts == 0).any(axis=1) & (np.diff(offsets) >= group_size)):
        lo, hi = offsets[s], offsets[s + 1]
        b, c = bins[lo:hi], costs[items[lo:hi]]
        for empty in np.flatnonzero(counts[s] == 0):
            full = int(np.argmax(counts[s]))
            cand = np.flatnonzero(b == full)
            move = cand[np.argmin(c[cand])]
            b[move] = empty
            counts[s, full] -= 1
            counts[s, empty] += 1
        bins[lo:hi] = b


def _refine(costs, items, offsets, bins, group_size, iterations, above: float) -> int:
    """Swap refinement over [S, G, C] layouts of the steps whose max/mean exceeds ``above``,
    a block of steps at a time (bounded memory); other steps are not touched."""
    n_steps = offsets.size - 1
    step = _step_ids(offsets)
    key = step * group_size + bins
    loads = np.bincount(key, weights=costs[items], minlength=n_steps * group_size)
    loads = loads.reshape(n_steps, group_size)
    sel = np.flatnonzero(loads.max(axis=1) > above * loads.mean(axis=1) + 1e-300)
    swaps = 0
    i = 0
    while i < sel.size:
        j, size = i + 1, int(offsets[sel[i] + 1] - offsets[sel[i]])
        while j < sel.size and size + int(offsets[sel[j] + 1] - offsets[sel[j]]) <= _BLOCK_ELEMENTS // 4:
            size += int(offsets[sel[j] + 1] - offsets[sel[j]])
            j += 1
        block = sel[i:j]
        lens = offsets[block + 1] - offsets[block]
        local_step = np.repeat(np.arange(block.size), lens)
        positions = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens) + offsets[block][local_step]
        cell = local_step * group_size + bins[positions]
        order = stable_group(cell)
        positions, cell = positions[order], cell[order]
        counts = np.bincount(cell, minlength=block.size * group_size)
        width = max(1, int(counts.max()))
        slot = np.arange(cell.size) - (np.cumsum(counts) - counts)[cell]
        idx = np.full(block.size * group_size * width, -1, dtype=np.int64)
        idx[cell * width + slot] = positions
        idx = idx.reshape(block.size, group_size, width)
        vals = np.where(idx >= 0, costs[items[np.maximum(idx, 0)]], np.nan)
        _, idx, n = refine_swaps(vals, idx, iterations, stop_below=above)
        swaps += n
        g_of = np.broadcast_to(np.arange(group_size)[None, :, None], idx.shape)
        ok = idx >= 0
        bins[idx[ok]] = g_of[ok]
        i = j
    return swaps


def _sort_bins_by_load(costs, items, offsets, bins, group_size) -> None:
    n_steps = offsets.size - 1
    step = _step_ids(offsets)
    loads = np.bincount(step * group_size + bins, weights=costs[items], minlength=n_steps * group_size)
    rank = np.argsort(-loads.reshape(n_steps, group_size), axis=1, kind="stable")
    relabel = np.empty_like(rank)
    np.put_along_axis(relabel, rank, np.arange(group_size)[None, :].repeat(n_steps, 0), axis=1)
    bins[:] = relabel[step, bins]
