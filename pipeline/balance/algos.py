"""Partition kernels of the step-group planner (docs/design.md#balancing), vectorised across steps.

Every kernel works on a *bucket* of steps at once: a 2-D array ``x[S, M]`` holding each step's item
costs sorted in descending order, padded on the right with dummy items (``valid == False``, cost 0).
Steps are independent, so the loops below run over rounds or items *within* a step and the numpy
work inside each iteration spans all steps of the bucket: a planner over 10⁶ samples runs a few
hundred numpy calls instead of 10⁶ Python iterations.

Kernels return, for every (step, position), the bin (micro-batch) 0..G-1 it goes to.

* ``lpt_equal``: greedy LPT with a cardinality constraint (each item, largest first, to the
  least-loaded bin with a free slot); vectorised across steps, one item position per iteration.
* ``kk_equal``: balanced Karmarkar–Karp differencing (BLDM, Michiels et al.): each round is a
  G-tuple; repeatedly merge the two tuples with the largest spread, pairing the largest sums of one
  with the smallest of the other. Respects cardinality the same way; spread ≤ the largest item.
* ``lpt_free``: classic LPT (each item to the least-loaded bin), the G largest items seeding the
  G bins so no micro-batch stays empty.
* ``kk_free``: multiway largest differencing on the head of each step (the items where
  differencing beats greedy), completed by LPT on the small tail.
* ``refine_swaps``: swap one pair between the max and the min bin of a step when that lowers the
  pair's max; counts never change, max never rises, min never falls.
"""

from __future__ import annotations

import numpy as np

# Largest differencing runs on the first KK_HEAD_PER_BIN * G items of a free-count step; the tail is
# many small items, where LPT is within one small item of optimal and differencing would cost a
# Python-level merge per item.
KK_HEAD_PER_BIN = 4
# Bins up to this many slots search swap pairs exhaustively (C² per step); wider ones sort.
_PAIRWISE_MAX = 48
# Elements of the pairwise (step, a, b) difference tensor built per block in refine_swaps.
_SWAP_BLOCK_ELEMENTS = 1 << 22


def lpt_equal(x: np.ndarray, group_size: int, sizes: np.ndarray | None = None) -> np.ndarray:
    """Greedy LPT with a cardinality constraint: ``x[S, M]`` descending per row → bins ``[S, M]``.

    Items in descending order go to the least-loaded bin that still has a free slot. A step of
    ``m`` real items (``sizes``; the rest of the row is padding) gives ``m // G`` slots to every bin
    and one more to the first ``m % G`` bins that ask, so counts differ by at most one (exactly k
    when ``m = G·k``). Unlike a round-by-round assignment, a bin holding a huge item takes no further
    item until the others have caught up, which is what heavy tails need.
    """
    return _lpt(x, group_size, sizes, True)


def lpt_free(
    x: np.ndarray, group_size: int, loads: np.ndarray | None = None, sizes: np.ndarray | None = None
) -> np.ndarray:
    """Unconstrained LPT: each item, largest first, to the least-loaded bin; ``x[S, M]`` → bins.

    From empty bins the G largest items land in G distinct bins (ties go to the next empty bin),
    so a step with ≥ G items leaves no micro-batch empty. ``loads`` continues from given loads
    (the KK head). Padding beyond ``sizes`` is left at bin 0; callers drop it.
    """
    if x.shape[0] == 1 and loads is None and sizes is None:  # one step (the online balancer's case)
        return np.array([_lpt_free_row(x[0].tolist(), group_size)], dtype=np.int64)
    return _lpt(x, group_size, sizes, False, loads)


def _lpt_free_row(x: list[float], g: int) -> list[int]:
    """``_lpt`` unconstrained on a single step, in plain Python: the same batches, the same ties.

    Why: the trainer's online balancer places one small step (tens of samples) per training step,
    where ``_lpt``'s ~20 numpy calls per batch cost ~0.5 ms; this runs the identical rule (free bins
    sorted by (load, index); the next items take bins 0, 1, … of that order while every bin served
    stays at or above the next one) in ~20 µs. tests/pipeline/balance/test_algos.py checks it equals ``_lpt``.
    """
    loads, bins, nxt, n = [0.0] * g, [0] * len(x), 0, len(x)
    while nxt < n:
        order = sorted(range(g), key=lambda b: (loads[b], b))
        served, take = loads[order[0]] + x[nxt], 1
        while take < g and nxt + take < n and served >= loads[order[take]]:
            served = min(served, loads[order[take]] + x[nxt + take])
            take += 1
        for i in range(take):
            bins[nxt + i] = order[i]
            loads[order[i]] += x[nxt + i]
        nxt += take
    return bins


def _lpt(
    x: np.ndarray, group_size: int, sizes: np.ndarray | None, constrained: bool, loads: np.ndarray | None = None
) -> np.ndarray:
    """Greedy LPT, ``x[S, M]`` descending per row → bins ``[S, M]``; see ``lpt_equal``/``lpt_free``.

    Batched: with the free bins sorted by load l₀ ≤ l₁ ≤ …, the next items x₀ ≥ x₁ ≥ … go to bins
    0, 1, … exactly as the one-at-a-time greedy would as long as every bin already served stays at
    or above the next one (min_{p<i}(l_p + x_p) ≥ l_i; > with a cardinality constraint). Each
    iteration assigns that whole prefix, per step, so a step of G·k items takes a few·k iterations
    instead of G·k.
    """
    n_steps, width = x.shape
    g = group_size
    sizes = np.full(n_steps, width) if sizes is None else np.asarray(sizes, dtype=np.int64)
    q = (sizes // g)[:, None]
    rem = sizes % g
    loads = np.zeros((n_steps, g)) if loads is None else loads.astype(np.float64, copy=True)
    counts = np.zeros((n_steps, g), dtype=np.int64)
    n_big = np.zeros(n_steps, dtype=np.int64)  # bins that took their (q+1)-th item
    bins = np.zeros((n_steps, width), dtype=np.int64)
    nxt = np.zeros(n_steps, dtype=np.int64)  # next item position per step
    lane = np.arange(g)
    xp = np.concatenate([x, np.zeros((n_steps, g))], axis=1)  # room to gather past the end
    rows = np.flatnonzero(nxt < sizes)
    while rows.size:
        r2 = np.arange(rows.size)[:, None]
        cnt, qq = counts[rows], q[rows]
        at_q = cnt == qq
        room = rem[rows] - n_big[rows]
        free = (cnt < qq) | (at_q & (room > 0)[:, None]) if constrained else np.ones_like(at_q)
        key = np.where(free, loads[rows], np.inf)
        asc = np.argsort(key, axis=1, kind="stable")
        l_sorted = key[r2, asc]
        pos = nxt[rows][:, None] + lane
        items = xp[rows[:, None], pos]
        served = np.minimum.accumulate(l_sorted + items, axis=1)
        ok = np.empty(free.shape, dtype=bool)
        ok[:, 0] = True  # the least-loaded free bin always takes the next item
        # With a cardinality constraint, strictly above: on a tie the one-at-a-time greedy picks the
        # lower bin index, which may be a bin served in this batch, so the batch stops and the next
        # sort decides. Unconstrained, a tie goes to the next unserved bin (no micro-batch empty).
        (np.greater if constrained else np.greater_equal)(served[:, :-1], l_sorted[:, 1:], out=ok[:, 1:])
        ok &= l_sorted < np.inf
        ok &= pos < sizes[rows][:, None]
        # bins that reach q+1 within the batch must not exceed the remaining big slots
        big = at_q[r2, asc] if constrained else np.zeros_like(at_q)
        if constrained and big.any():
            ok &= np.cumsum(big, axis=1) <= room[:, None]
        n_take = np.argmin(ok, axis=1)  # first invalid position = length of the valid prefix
        n_take[ok.all(axis=1)] = g
        take = lane < n_take[:, None]
        r_idx, i_idx = np.nonzero(take)
        step = rows[r_idx]
        b = asc[r_idx, i_idx]
        bins[step, pos[r_idx, i_idx]] = b
        n_big[rows] += (big & take).sum(axis=1)
        loads[step, b] += items[r_idx, i_idx]
        counts[step, b] += 1
        nxt[rows] += n_take
        rows = rows[nxt[rows] < sizes[rows]]
    return bins


def _kk_merge(sums: np.ndarray, spread: np.ndarray, rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One differencing step per row: tuple ``a`` absorbs ``b`` (largest bin with smallest), stays
    sorted descending, ``b`` is retired; returns the inverse sort map to unwind assignments later."""
    g = sums.shape[2]
    merged = sums[rows, a] + sums[rows, b][:, ::-1]
    perm = np.argsort(-merged, axis=1, kind="stable")
    new = np.take_along_axis(merged, perm, axis=1)
    sums[rows, a] = new
    spread[rows, a] = new[:, 0] - new[:, -1]
    spread[rows, b] = -np.inf
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(g), perm.shape), axis=1)
    return inv


def kk_equal(x: np.ndarray, group_size: int) -> np.ndarray:
    """Balanced (cardinality-respecting) multiway Karmarkar–Karp: ``x[S, R*G]`` → bins ``[S, R*G]``.

    Tuple t of a step starts as round t (its G items, descending). A merge of tuples a and b adds
    b reversed to a (largest of one with smallest of the other), re-sorts, and keeps the result
    under a's id. The merges are recorded and replayed backwards at the end to map every round's
    slot to its final bin, so each iteration costs O(S·G), not O(S·R·G).
    """
    n_steps, width = x.shape
    rounds = width // group_size
    g = group_size
    sums = x.reshape(n_steps, rounds, g).copy()  # each tuple sorted descending
    spread = sums[:, :, 0] - sums[:, :, -1]
    rows = np.arange(n_steps)
    history: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for _ in range(rounds - 1):
        # two largest spreads per step (ties → lowest tuple id, deterministic)
        pick = np.argsort(-spread, axis=1, kind="stable")[:, :2]
        a, b = pick[:, 0], pick[:, 1]
        history.append((a, b, _kk_merge(sums, spread, rows, a, b)))
    maps = np.zeros((n_steps, rounds, g), dtype=np.int64)
    root = np.argmax(spread, axis=1) if rounds > 1 else np.zeros(n_steps, dtype=np.int64)
    maps[rows, root] = np.arange(g)
    for a, b, inv in reversed(history):
        out = maps[rows, a]
        maps[rows, a] = np.take_along_axis(out, inv, axis=1)
        maps[rows, b] = np.take_along_axis(out, inv[:, ::-1], axis=1)
    return maps.reshape(n_steps, width)


def kk_free(x: np.ndarray, group_size: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    """Multiway largest differencing (unconstrained) on the first ``head`` columns of ``x[S, M]``
    (descending rows), all steps of the bucket in lockstep.

    Item i starts as the tuple (x_i, 0, …, 0); each iteration merges, per step, the two tuples with
    the largest spread (max − min), adding one reversed to the other and re-sorting. Returns
    ``(bins[S, head], loads[S, G])``; the caller completes the tail with ``lpt_free``. Padding
    items cost 0 and merge harmlessly.
    """
    n_steps = x.shape[0]
    g = group_size
    head = min(head, x.shape[1])
    rows = np.arange(n_steps)
    if head == 0:
        return np.zeros((n_steps, 0), dtype=np.int64), np.zeros((n_steps, g))
    sums = np.zeros((n_steps, head, g))
    sums[:, :, 0] = x[:, :head]
    spread = x[:, :head].astype(np.float64, copy=True)
    history: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for _ in range(head - 1):
        a = np.argmax(spread, axis=1)
        spread[rows, a] = -np.inf
        b = np.argmax(spread, axis=1)
        history.append((a, b, _kk_merge(sums, spread, rows, a, b)))
    root = np.argmax(spread, axis=1)
    loads = sums[rows, root]
    maps = np.zeros((n_steps, head, g), dtype=np.int64)
    maps[rows, root] = np.arange(g)
    for a, b, inv in reversed(history):
        out = maps[rows, a]
        maps[rows, a] = np.take_along_axis(out, inv, axis=1)
        maps[rows, b] = np.take_along_axis(out, inv[:, ::-1], axis=1)
    return maps[:, :, 0], loads


def _nearest_pairs(va: np.ndarray, vb: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the pair (i, j) minimising |va[i] − vb[j] − delta| (−inf/+inf pads never win)
    and that score. Sort-based, O(C log C) per row: for each a, the b's on either side of a − δ."""
    n, c = va.shape
    order_b = np.argsort(vb, axis=1, kind="stable")
    bs = np.take_along_axis(vb, order_b, axis=1)
    t = va - delta[:, None]
    t = np.where(np.isfinite(t), t, np.inf)
    comb = np.concatenate([bs, t], axis=1)
    o = np.argsort(comb, axis=1, kind="stable")
    is_b = o < c
    before = np.cumsum(is_b, axis=1)  # b's at or before each sorted position
    r2 = np.arange(n)[:, None]
    ins = np.empty((n, c), dtype=np.int64)
    qi = np.nonzero(~is_b)
    ins[qi[0], o[qi] - c] = before[qi]  # b's ≤ query
    best_score = np.full(n, np.inf)
    best_flat = np.zeros(n, dtype=np.int64)
    for j in (np.clip(ins - 1, 0, c - 1), np.clip(ins, 0, c - 1)):
        with np.errstate(invalid="ignore"):
            score = np.abs(va - bs[r2, j] - delta[:, None])
        score = np.where(np.isnan(score), np.inf, score)
        i = np.argmin(score, axis=1)
        sc = score[np.arange(n), i]
        better = sc < best_score
        best_score = np.where(better, sc, best_score)
        best_flat = np.where(better, i * c + order_b[np.arange(n), j[np.arange(n), i]], best_flat)
    return best_flat, best_score


def refine_swaps(
    vals: np.ndarray, idx: np.ndarray, max_iterations: int, stop_below: float = 1.0, rel_tol: float = 1e-12
) -> tuple[np.ndarray, np.ndarray, int]:
    """Swap refinement on a bin layout ``vals[S, G, C]`` (NaN = empty slot), ``idx`` alongside.

    Each iteration, per step: take the max bin A and the min bin B. Swapping a ∈ A with b ∈ B
    (d = a − b) leaves ``max(load_A − d, load_B + d) = (load_A + load_B)/2 + |d − δ|`` with
    δ = (load_A − load_B)/2, so the best pair minimises |d − δ|; swap if that lowers load_A. Pads
    never move, so counts stay. A step leaves the loop when no swap helps or its max/mean is at or
    below ``stop_below``. Returns the updated arrays and the number of swaps applied.
    """
    vals = vals.copy()
    idx = idx.copy()
    n_steps, g, c = vals.shape
    if g < 2 or c == 0 or max_iterations <= 0:
        return vals, idx, 0
    active = np.arange(n_steps)
    swaps = 0
    block = max(1, _SWAP_BLOCK_ELEMENTS // max(1, c * c))
    for _ in range(max_iterations):
        if active.size == 0:
            break
        kept: list[np.ndarray] = []
        for lo in range(0, active.size, block):
            steps = active[lo : lo + block]
            sub = vals[steps]
            loads = np.nansum(sub, axis=2)
            bin_a = np.argmax(loads, axis=1)
            bin_b = np.argmin(loads, axis=1)
            r = np.arange(steps.size)
            load_a, load_b = loads[r, bin_a], loads[r, bin_b]
            delta = 0.5 * (load_a - load_b)
            va = np.nan_to_num(sub[r, bin_a], nan=-np.inf)
            vb = np.nan_to_num(sub[r, bin_b], nan=np.inf)
            if c <= _PAIRWISE_MAX:
                score = np.abs(va[:, :, None] - vb[:, None, :] - delta[:, None, None]).reshape(steps.size, -1)
                best = np.argmin(score, axis=1)
                best_score = score[r, best]
            else:
                best, best_score = _nearest_pairs(va, vb, delta)
            ok = best_score < delta * (1.0 - 2 * rel_tol) - rel_tol * load_a
            ok &= load_a > stop_below * loads.mean(axis=1)
            if not ok.any():
                continue
            s_ok, best = steps[ok], best[ok]
            ia, ib = best // c, best % c
            ga, gb = bin_a[ok], bin_b[ok]
            tmp_v = vals[s_ok, ga, ia].copy()
            vals[s_ok, ga, ia] = vals[s_ok, gb, ib]
            vals[s_ok, gb, ib] = tmp_v
            tmp_i = idx[s_ok, ga, ia].copy()
            idx[s_ok, ga, ia] = idx[s_ok, gb, ib]
            idx[s_ok, gb, ib] = tmp_i
            swaps += int(s_ok.size)
            kept.append(s_ok)
        active = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
    return vals, idx, swaps
