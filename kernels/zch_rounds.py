"""The masked machinery of ``ZchTable``'s training calls (``kernels/zch.py``): a call's ids sorted with
fixed-size stand-ins for ``torch.unique`` (``SortedCalls``), the proposal rounds that place its missing
ids (``Rounds``), and the fixed-shape primitives both use (``take``, ``first_true``, ``best_slot``,
``masked_put``). Fixed shapes because each data-dependent size is a host sync on CUDA; the rules the
rounds implement are in docs/design.md#open-id-spaces-mpzch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT64_MAX = torch.iinfo(torch.int64).max
INT64_MIN = torch.iinfo(torch.int64).min


def take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` for a 1-d ``values``: ``index_select`` is much faster than advanced indexing on CPU."""
    return values.index_select(0, index.reshape(-1)).view(index.shape)


def first_true(mask: torch.Tensor) -> torch.Tensor:
    """Column of the first True per row (0 where none): ``argmax`` returns the first of equal maxima (documented)."""
    return mask.to(torch.uint8).argmax(dim=1)


def best_slot(open_: torch.Tensor, empty: torch.Tensor, keys: list[torch.Tensor]) -> torch.Tensor:
    """Column each row proposes: its nearest open empty slot, else the open slot with the smallest keys."""
    free = open_ & empty
    victims = open_ ^ free  # open and occupied
    for key in keys:
        masked = torch.where(victims, key, INT64_MAX)
        victims &= masked == masked.min(dim=1, keepdim=True).values
    return first_true(torch.where(free.any(dim=1, keepdim=True), free, victims))


def masked_put(
    dsts: tuple[torch.Tensor, ...],
    index: torch.Tensor,
    values: tuple[torch.Tensor, ...],
    mask: torch.Tensor,
    *,
    compact: bool = False,
) -> None:
    """``dst[index[mask]] = value[mask]`` for each (dst, value). The masked entries' indices must differ.

    ``compact``: exactly that (a data-dependent size: a host sync on CUDA, free on CPU). Otherwise without
    compacting by the mask: every other entry writes, to the first masked entry's index, that entry's
    value (none masked: index[-1]'s own value), so every index written gets one value whatever the order
    of the writes: deterministic."""
    if mask.numel() == 0:
        return
    if compact:
        keep = mask.nonzero().squeeze(1)
        target = index.index_select(0, keep)
        for dst, value in zip(dsts, values, strict=True):
            dst.index_copy_(0, target, value.index_select(0, keep))
        return
    anchor = first_true(mask[None])  # [1]
    some = mask.any()
    at = index.index_select(0, anchor)
    target = torch.where(mask, index, at)
    for dst, value in zip(dsts, values, strict=True):
        fill = torch.where(some, value.index_select(0, anchor), dst.index_select(0, at))
        dst.index_put_((target,), torch.where(mask, value, fill))


@dataclass
class SortedCalls:
    """A training call's ids sorted stably, equal ids adjacent: fixed-size stand-ins for ``torch.unique``'s
    outputs (whose length is a host sync). Per-id values are meaningful at each id's lead position."""

    ids: torch.Tensor  # [n] raw ids, ascending
    order: torch.Tensor  # [n] each one's position in the call: at a lead, the id's first occurrence
    lead: torch.Tensor  # [n] bool: the first of equal ids (one lead per distinct id)
    start: torch.Tensor  # [n] position of each one's lead
    occurrences: torch.Tensor  # [n] at a lead: the id's occurrences in the call
    clock: torch.Tensor  # [n] at a lead: the policy clock (ttl: the id's latest event time; else the step)
    in_call_order: bool = False  # ``order`` is the identity: the call's ids were distinct and ascending


def sort_calls(
    flat: torch.Tensor, times: torch.Tensor | None, step: torch.Tensor, device: torch.device, *, host_read: bool = False
) -> SortedCalls:
    """``SortedCalls`` of a call's flat ids (``times``: their event times under ttl, else None).

    ``host_read`` (CPU, where a host read costs nothing): a call of distinct ascending ids, what an owner
    gets from one requester (its sorted unique ids), is recognised with one read and not sorted."""
    if host_read and bool((flat[1:] > flat[:-1]).all()):
        positions = torch.arange(flat.numel(), device=device)
        clock = step.expand(flat.numel()) if times is None else times.reshape(-1).to(device=device, dtype=torch.int64)
        lead = torch.ones(flat.numel(), dtype=torch.bool, device=device)
        return SortedCalls(flat, positions, lead, positions, torch.ones_like(flat), clock, in_call_order=True)
    ids, order = torch.sort(flat, stable=True)
    n = ids.numel()
    positions = torch.arange(n, device=device)
    lead = torch.ones(n, dtype=torch.bool, device=device)
    lead[1:] = ids[1:] != ids[:-1]
    start = torch.where(lead, positions, 0).cummax(0).values
    next_lead = torch.where(lead, positions, n).flip(0).cummin(0).values.flip(0)
    occurrences = torch.cat([next_lead[1:], positions.new_full((1,), n)]) - positions
    if times is None:
        clock = step.expand(n)
    else:
        sorted_times = times.reshape(-1).to(device=device, dtype=torch.int64).index_select(0, order)
        clock = torch.full_like(ids, INT64_MIN).scatter_reduce(0, start, sorted_times, "amax")
    return SortedCalls(ids, order, lead, start, occurrences, clock)


@dataclass
class Rounds:
    """``ZchTable._place``'s proposal rounds over a sorted call, masked: [n] or [n, max_probe] throughout."""

    window: torch.Tensor  # [n, P] slots probed
    empty: torch.Tensor  # [n, P] slot empty when the call began
    usable: torch.Tensor  # [n, P] the id may take the slot (admitted, and the slot empty or evictable)
    keys: list[torch.Tensor]  # [n, P] victim keys, most significant first
    prio: torch.Tensor  # [n] first occurrence: the lower wins a contested slot
    claimed: torch.Tensor  # [slots] int64, 1: held by a hit of the call or taken in a round
    placed: torch.Tensor  # [n] slot taken, -1: none
    live: torch.Tensor  # [n] bool: still unplaced
    # compacted (``compact``, or built from some of a call's ids): the call positions of the rows above,
    # and every position's slot taken so far
    index: torch.Tensor | None = None
    out: torch.Tensor | None = None
    winner: torch.Tensor | None = None  # [slots] the lowest bid per slot in a round (INT64_MAX between rounds)

    def compact(self) -> None:
        """Keep only the rows of ids still live (a data-dependent size: a host sync, used on CPU only).
        The rounds give the same slots: a row that is not live neither proposes nor bids."""
        if self.index is None:
            self.index = torch.arange(self.prio.numel(), device=self.prio.device)
            self.out = self.placed.clone()
        assert self.out is not None
        self.out.index_copy_(0, self.index, self.placed)
        keep = self.live.nonzero().squeeze(1)
        self.index = self.index.index_select(0, keep)
        for name in ("window", "empty", "usable", "prio", "placed", "live"):
            setattr(self, name, getattr(self, name).index_select(0, keep))
        self.keys = [key.index_select(0, keep) for key in self.keys]

    def result(self) -> torch.Tensor:
        """Every call position's slot taken, -1: none."""
        if self.index is None:
            return self.placed
        assert self.out is not None
        return self.out.index_copy(0, self.index, self.placed)

    def open_slots(self) -> torch.Tensor:
        return self.usable & self.live[:, None] & (take(self.claimed, self.window) == 0)

    def proposing(self) -> torch.Tensor:
        """Ids the next round would let propose (unplaced, with an open slot)."""
        return self.open_slots().any(dim=1)

    def play(self, slots: int) -> None:
        """One round: an id with nothing open drops out (fallback row), the others propose, the first wins."""
        open_ = self.open_slots()
        self.live = self.live & open_.any(dim=1)
        choice = best_slot(open_, self.empty, self.keys)
        slot = self.window.gather(1, choice[:, None]).squeeze(1)
        bids = torch.where(self.live, self.prio, INT64_MAX)
        if self.winner is None:  # a table-sized buffer (per call, or the table's host scratch), reset where written
            self.winner = torch.full((slots,), INT64_MAX, dtype=torch.int64, device=slot.device)
        won = self.live & (take(self.winner.scatter_reduce_(0, slot, bids, "amin"), slot) == self.prio)
        self.winner.index_fill_(0, slot, INT64_MAX)
        self.placed = torch.where(won, slot, self.placed)
        self.claimed.scatter_reduce_(0, slot, won.to(torch.int64), "amax")
        self.live = self.live & ~won
