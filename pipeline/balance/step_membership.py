"""Step membership for the step-group planner: which samples share a step (docs/design.md#balancing).

``steps_equal`` / ``steps_free`` / ``steps_free_outliers`` decide which samples share a step (= step group
of G micro-batches); which micro-batch of its step each sample lands in is ``bin_assignment``'s. Membership
is shared by the three strategies so their reports compare like with like: ``random`` and ``within_step``
with the same seed have the same step membership.

Leftover samples (fewer than a whole step) form a last, shorter step group, or join the last step
when fewer than G (counts then differ by at most one). The planned equal-count strategy makes them
the cheapest samples of the random pool, so that short group stays balanced and cheap.

Steps are returned flat: ``items`` (sample indices, step after step) and ``offsets`` (``S + 1``).
Everything that orders samples reuses one global cost sort (``Ranked``) and radix grouping by step
(``stable_group``), both defined here and reused by ``bin_assignment`` and the planner, so a plan over
millions of samples costs a few O(n) passes per probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np


@dataclass
class Steps:
    """Step membership, flat. ``partial``: the last step did not fill (leftover samples)."""

    items: np.ndarray  # int64 sample indices, step after step
    offsets: np.ndarray  # int64 [S + 1]
    is_outlier: np.ndarray  # bool [S]: a cost-sorted (outlier) step
    partial: bool  # the last step holds the leftover samples
    leftover: int  # samples that did not fill a whole step
    absorbed: bool  # leftover joined the previous step (too few for a group of their own)
    is_free: np.ndarray | None = None  # bool [S]: free-count outlier step in an equal-count plan

    @property
    def n_steps(self) -> int:
        return int(self.offsets.size - 1)

    def free_mask(self) -> np.ndarray:
        """Steps whose counts are free although the plan's mode is equal_count."""
        return np.zeros(self.n_steps, dtype=bool) if self.is_free is None else self.is_free

    def subset(self, mask: np.ndarray) -> tuple[Steps, np.ndarray]:
        """The steps selected by ``mask`` as their own ``Steps`` and, for each of their positions,
        the position in ``self.items`` (so per-position results scatter back)."""
        sizes = np.diff(self.offsets)[mask]
        starts = self.offsets[:-1][mask]
        pos = np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(sizes.sum())
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        sub = Steps(self.items[pos], offsets, self.is_outlier[mask], False, 0, False)
        return sub, pos.astype(np.int64)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


@dataclass
class Ranked:
    """Orders of the samples computed once per plan and shared by every probe of the search:
    ascending cost (stable), descending (its reverse) and a seeded random permutation."""

    costs: np.ndarray
    asc: np.ndarray
    desc: np.ndarray
    perm: np.ndarray

    @classmethod
    def of(cls, costs: np.ndarray, seed: int) -> Ranked:
        asc = np.argsort(costs, kind="stable")
        return cls(costs, asc, asc[::-1].copy(), _rng(seed, 1).permutation(costs.size))


def stable_group(keys: np.ndarray) -> np.ndarray:
    """Stable argsort of non-negative integer keys: LSD radix passes on 16-bit digits (numpy's
    stable sort is a radix sort for ≤ 16-bit types), O(n) per pass instead of O(n log n)."""
    keys = np.asarray(keys)
    if keys.size == 0:
        return np.empty(0, dtype=np.int64)
    top = int(keys.max())
    if top >= 1 << 48:
        return np.argsort(keys, kind="stable")
    order = np.arange(keys.size)
    shift = 0
    while True:
        digit = ((keys[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += 16
        if top >> shift == 0:
            return order


def _finish(
    chunks: list[np.ndarray],
    outlier: list[bool],
    left: np.ndarray,
    group_size: int,
    seed: int,
    shuffle_steps: bool,
    absorb: bool = False,
    free: list[bool] | None = None,
) -> Steps:
    """Order the steps (outlier steps spread among random ones), then place the leftover samples:
    a final step group of their own, or joined to the last step when they are fewer than G (or
    ``absorb``: free-count leftovers that could not be balanced alone)."""
    free = [False] * len(chunks) if free is None else free
    if shuffle_steps and len(chunks) > 1:
        perm = _rng(seed, 2).permutation(len(chunks))
        chunks = [chunks[i] for i in perm]
        outlier = [outlier[i] for i in perm]
        free = [free[i] for i in perm]
    partial, absorbed = False, False
    if left.size:
        partial = True
        if not chunks or (left.size >= group_size and not absorb):
            chunks.append(left)
            outlier.append(False)
            free.append(False)
        else:  # too few for G non-empty micro-batches: join the last step (counts differ by ≤ 1)
            ordinary = [i for i, o in enumerate(outlier) if not o]
            if ordinary and ordinary[-1] != len(chunks) - 1:  # keep outlier steps within their bound
                j = ordinary[-1]
                for seq in (chunks, outlier, free):
                    seq.append(seq.pop(j))
            chunks[-1] = np.concatenate([chunks[-1], left])
            absorbed = True
    sizes = np.array([c.size for c in chunks], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    items = np.concatenate(chunks).astype(np.int64) if chunks else np.empty(0, dtype=np.int64)
    is_free = np.array(free, dtype=bool) if any(free) else None
    return Steps(items, offsets, np.array(outlier, dtype=bool), partial, int(left.size), absorbed, is_free)


def _not_in(ranked: Ranked, taken: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``order`` without the samples in ``taken``."""
    mask = np.ones(ranked.costs.size, dtype=bool)
    mask[taken] = False
    return order[mask[order]]


def steps_equal(
    ranked: Ranked, group_size: int, k: int, n_outlier_steps: int, seed: int, cheap_leftover: bool
) -> Steps:
    """Equal-count steps of G·k samples: ``n_outlier_steps`` cost-sorted chunks, the rest random.

    With ``cheap_leftover`` (planned) the samples that do not fill a whole step are the cheapest of
    the random pool: near-equal small costs keep the short last group balanced and cheap."""
    unit = group_size * k
    out = ranked.desc[: n_outlier_steps * unit]
    chunks = [out[i * unit : (i + 1) * unit] for i in range(n_outlier_steps)]
    rest, left = _random_equal(ranked, out, unit, cheap_leftover)
    outlier = [True] * n_outlier_steps + [False] * len(rest)
    return _finish(chunks + rest, outlier, left, group_size, seed, n_outlier_steps > 0)


def _random_equal(
    ranked: Ranked, out: np.ndarray, unit: int, cheap_leftover: bool
) -> tuple[list[np.ndarray], np.ndarray]:
    """Random steps of ``unit`` samples over the samples not in ``out``, and the leftover (the
    cheapest of them with ``cheap_leftover``, else the random tail)."""
    rest = _not_in(ranked, out, ranked.perm)
    n_full = rest.size // unit
    n_left = rest.size - n_full * unit
    if cheap_leftover and n_left:
        left = _not_in(ranked, out, ranked.desc)[rest.size - n_left :]
        rest = _not_in(ranked, left, rest)
    else:
        left = rest[n_full * unit :]
    return [rest[i * unit : (i + 1) * unit] for i in range(n_full)], left


def _cut_free(c: np.ndarray, group_size: int, budget: float, target: float) -> tuple[list[int], int]:
    """Cut a sequence into steps holding ≥ G·max(budget, largest item / target) of cost.

    Returns the step ends and where the unfilled tail starts. Raising the budget to the step's
    largest item is what lets a step with a huge sample hold enough others to balance it (its
    largest / mean micro-batch cost ≤ ``target``); in a cost-sorted run of near-equal items the
    ``/ target`` slack closes a step at G items, one per micro-batch, instead of G + 1.
    """
    m = c.size
    cum = np.concatenate([[0.0], np.cumsum(c)])
    ends: list[int] = []
    i = 0
    while i < m:
        cap = group_size * budget
        while True:
            e = int(np.searchsorted(cum, cum[i] + cap * (1 - 1e-12), side="left"))
            e = max(e, i + group_size)
            if e > m:
                return ends, i
            top = float(c[i:e].max())
            if group_size * top / target <= cap * (1 + 1e-12):
                break
            cap = group_size * top / target
        ends.append(e)
        i = e
    return ends, i


def steps_free(
    ranked: Ranked, group_size: int, k: int, budget: float, n_outlier_steps: int, seed: int, target: float
) -> Steps:
    """Free-count steps filled to ≈ G × budget (budget raised to the step's largest item).

    Outlier steps are cost-sorted chunks of G·k samples as in equal-count mode (a chunk spans a range
    of costs, which free counts balance finely; a cost rule would close a run of near-equal
    outliers at G + 1 items and leave one micro-batch with two). The unfilled tail joins the last
    step when its largest item exceeds ``target`` × its mean micro-batch cost (alone it could not be
    balanced; the last step's raised budget absorbs it)."""
    costs = ranked.costs
    if budget <= 0:  # all costs zero: no cost signal, fall back to counts
        budget = 1.0
        costs = np.ones_like(costs)
    unit = group_size * k
    out = ranked.desc[: n_outlier_steps * unit]
    chunks = [out[i * unit : (i + 1) * unit] for i in range(n_outlier_steps)]
    rest, left, absorb = _random_free(ranked, costs, out, group_size, budget, target)
    outlier = [True] * n_outlier_steps + [False] * len(rest)
    return _finish(chunks + rest, outlier, left, group_size, seed, n_outlier_steps > 0, absorb)


def _random_free(
    ranked: Ranked, costs: np.ndarray, out: np.ndarray, group_size: int, budget: float, target: float
) -> tuple[list[np.ndarray], np.ndarray, bool]:
    """Random free-count steps over the samples not in ``out``; the unfilled tail and whether it
    must join the last step (its largest item exceeds ``target`` × its mean micro-batch cost)."""
    rest = _not_in(ranked, out, ranked.perm)
    ends, tail = _cut_free(costs[rest], group_size, budget, target)
    chunks = [rest[s:e] for s, e in zip([0, *ends[:-1]], ends)]
    left = rest[tail:]
    lc = costs[left]
    absorb = bool(left.size) and group_size * float(lc.max()) > target * float(lc.sum())
    return chunks, left, absorb


def cut_heaviest(desc_costs: np.ndarray, group_size: int, budget: float, target: float, limit: int) -> list[int]:
    """Ends of free-count outlier steps cut from the ``limit`` heaviest samples (costs descending).

    Each step starts at its largest sample c and takes the next heaviest until it holds ≥ G ×
    max(budget, c / target): then c is at most ``target`` × the step's mean micro-batch cost, the
    one condition under which a sample costlier than a rank's share of an ordinary step can be
    balanced at all (its micro-batch holds it alone; the others hold many lighter samples).
    Heaviest-first needs the fewest samples to reach that cost, which keeps the outlier share (the
    composition bias) small. A step that would pass ``limit`` is not cut."""
    cum = np.concatenate([[0.0], np.cumsum(desc_costs[:limit])])
    ends: list[int] = []
    i = 0
    while i < limit:
        cap = group_size * max(budget, float(desc_costs[i]) / target)
        e = max(int(np.searchsorted(cum, cum[i] + cap * (1 - 1e-12), side="left")), i + group_size)
        if e > limit:
            break
        ends.append(e)
        i = e
    return ends


def steps_free_outliers(
    ranked: Ranked,
    group_size: int,
    k: int,
    ends: list[int],
    n_free: int,
    equal: bool,
    budget: float,
    seed: int,
    target: float,
) -> Steps:
    """The ``n_free`` heaviest samples in free-count outlier steps ending at ``ends`` (plus one
    unfilled step up to ``n_free`` when it passes the last end); the rest random steps of the
    plan's mode (equal: G·k samples, the cheapest as leftover; free: filled to ≈ G × budget)."""
    out = ranked.desc[:n_free]
    bounds = [0, *[e for e in ends if e < n_free], n_free]
    chunks = [out[a:b] for a, b in pairwise(bounds) if b > a]
    if len(chunks) > 1 and chunks[-1].size < group_size:  # too few for G non-empty micro-batches
        chunks[-2:] = [np.concatenate(chunks[-2:])]
    n_out = len(chunks)
    if equal:
        rest, left = _random_equal(ranked, out, group_size * k, cheap_leftover=True)
        absorb = False
    else:
        costs = ranked.costs if budget > 0 else np.ones_like(ranked.costs)
        rest, left, absorb = _random_free(ranked, costs, out, group_size, budget if budget > 0 else 1.0, target)
    outlier = [True] * n_out + [False] * len(rest)
    free = list(outlier) if equal else None
    return _finish(chunks + rest, outlier, left, group_size, seed, n_out > 0, absorb, free)
