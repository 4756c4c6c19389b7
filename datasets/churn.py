"""Id churn for the synthetic generator: items and users that appear and retire over event time.

Production streams meet new ids every day, so a table sized on the first day's ids is wrong a week
later (docs/data.md#id-churn). Two options of ``GeneratorConfig`` plant that, both off (0) by default:

* ``item_lifetime_days`` L: the ``n_items`` items are *slots* of the catalogue; each slot's item is
  replaced by a successor with a new id every L days, at a phase of its own (uniform in [0, L)), so
  items are born at a steady ``n_items / L`` a day and exactly ``n_items`` ids are alive at any
  instant. The id of slot ``s`` in its generation ``g`` is ``g * n_items + s`` (generation 0 keeps the
  ids the generator writes without churn). Popularity, the Markov chain and sessions act on slots, so
  a successor inherits its predecessor's popularity and structure under a new id. Over a window of D
  days at most ``n_items * (1 + D / L)`` distinct item ids occur; over the whole stream at most
  ``n_items * (1 + window_days / L)``.
* ``user_lifetime_days`` U: each user is active over a span drawn uniformly in [U/2, 3U/2] days
  (capped at the window) instead of 5-80 % of the window, so about ``n_users * U / window_days``
  users are active at once.
"""

from __future__ import annotations

import numpy as np

DAY_S = 86_400


def item_phases(seed: int, n_items: int, lifetime_days: float) -> np.ndarray:
    """Each slot's phase in seconds: how far into its first lifetime the slot is at ``start_time``."""
    return np.random.default_rng([seed, 8]).uniform(0.0, lifetime_days * DAY_S, n_items)


def churned_items(
    slots: np.ndarray, ts: np.ndarray, phases: np.ndarray, start_time: int, lifetime_days: float
) -> np.ndarray:
    """The id each event's slot holds at its time: ``generation * n_items + slot``."""
    age = (ts - start_time).astype(np.float64) + phases[slots]
    generation = np.floor(age / (lifetime_days * DAY_S)).astype(np.int64)
    return generation * len(phases) + slots


def item_generations(window_days: float, lifetime_days: float, tail_s: int) -> int:
    """How many generations a slot can have inside the window (``tail_s``: how far events may pass its end)."""
    return int(np.floor((window_days * DAY_S + tail_s) / (lifetime_days * DAY_S))) + 2


def user_spans(rng: np.random.Generator, n_users: int, lifetime_days: float, window_s: float) -> np.ndarray:
    """Active span per user in seconds, uniform in [U/2, 3U/2] days and at most the window."""
    return np.minimum(rng.uniform(0.5, 1.5, n_users) * lifetime_days * DAY_S, window_s)


class DistinctIds:
    """Which item ids occurred (a bitmap over the id range), for ``generated.json``'s churn summary."""

    def __init__(self, id_range: int) -> None:
        self.seen = np.zeros(id_range, dtype=bool)

    def add(self, ids: np.ndarray) -> None:
        self.seen[ids] = True

    def count(self) -> int:
        return int(self.seen.sum())
