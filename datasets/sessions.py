"""Planted session structure for the synthetic generator (``GeneratorConfig.sessions``).

Why: a first-order Markov chain (``markov_prob``) is learned equally well by every sequence model, so
it cannot show what HSTU's design targets in real logs: the next item depends on *when* it happens
and on *what the user did*, not only on the previous item. With ``sessions = true`` each user's
history is a series of sessions:

* Each user has a long-term interest, a *home topic* (topics: item ``x`` is member ``x // topics`` of
  topic ``x % topics``; home topics are Zipf-popular with the generator's ``zipf``).
* A session starts at the user's first event and, afterwards, at each event with probability
  ``1 / session_len`` (geometric sessions: nothing in the sequence itself says when one ends). A new
  session follows a long gap (lognormal, median a day, at least half an hour); events inside a
  session follow short gaps (about a minute, at most ten).
* After a long gap the user returns to the long-term interest: the item is a member of the home
  topic, Zipf-popular within the topic (member ``m`` has weight ``1/(m+1)``).
* Inside a session the next item stays in the previous item's topic and depends on the previous
  event's action: after an engaged action (like, add to cart, purchase, review) the complement,
  member ``(m·markov_a + markov_b) mod M``; after a view or click one of the ``SIMILAR`` next members
  ``m+1 … m+SIMILAR`` (mod ``M``, the topic's size), uniformly.
* With probability ``session_noise`` an event is instead a global Zipf draw (exploration); the
  session continues from that item.

So predicting the next item needs the time gap to it (continue the session, or return home), the
previous action (complement or similar) and the history (which topic is home). Time gaps in seconds
are rescaled per user only when a history would leave the ``window_days`` window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIMILAR = 4  # members a view/click may lead to
SHORT_GAP_MEAN_S = 60.0  # inside a session
SHORT_GAP_MAX_S = 600
LONG_GAP_MEDIAN_S = 86_400.0  # between sessions
LONG_GAP_SIGMA = 1.0
LONG_GAP_MIN_S = 1_800


@dataclass(frozen=True)
class SessionParams:
    """What the session plant reads from ``GeneratorConfig`` (kept narrow so tests can build one)."""

    seed: int
    n_users: int
    n_items: int
    topics: int
    session_len: float
    session_noise: float
    zipf: float
    markov_a: int
    markov_b: int
    start_time: int
    window_days: float


@dataclass(frozen=True)
class Planted:
    """Items, timestamps and session starts of one chunk's events (user-contiguous, in time order)."""

    items: np.ndarray
    ts: np.ndarray
    starts: np.ndarray  # bool: the event opens a session (after a long gap)


def topic_sizes(n_items: int, topics: int) -> np.ndarray:
    """Members of each topic: topic ``t`` holds items ``t, t + topics, …`` below ``n_items``."""
    return (n_items - np.arange(topics) + topics - 1) // topics


def home_topics(p: SessionParams) -> np.ndarray:
    """Each user's long-term interest (one draw for all users, so chunking does not change it)."""
    weights = np.arange(1, p.topics + 1, dtype=np.float64) ** -p.zipf
    rng = np.random.default_rng([p.seed, 6])
    order = rng.permutation(p.topics)  # popular topics are not the small topic numbers
    return order[rng.choice(p.topics, size=p.n_users, p=weights / weights.sum())]


def engaged_actions(channel: np.ndarray, click_kind: np.ndarray) -> np.ndarray:
    """Events whose action is more than a view or click: like (clicks log), purchases log, reviews."""
    return (channel != 0) | (click_kind == 2)


def session_starts(rng: np.random.Generator, pos: np.ndarray, session_len: float) -> np.ndarray:
    return (pos == 0) | (rng.random(len(pos)) < 1.0 / session_len)


def session_gaps(rng: np.random.Generator, starts: np.ndarray) -> np.ndarray:
    """Seconds before each event: long before a session start, short inside a session."""
    short = np.minimum(1 + np.floor(rng.exponential(SHORT_GAP_MEAN_S, len(starts))), SHORT_GAP_MAX_S)
    long = np.maximum(np.floor(rng.lognormal(np.log(LONG_GAP_MEDIAN_S), LONG_GAP_SIGMA, len(starts))), LONG_GAP_MIN_S)
    return np.where(starts, long, short).astype(np.int64)


def fit_window(gaps: np.ndarray, lens: np.ndarray, window_s: float) -> np.ndarray:
    """Gaps (first event of each user excluded) shrunk per user, if needed, to fit ``window_s``."""
    first = np.cumsum(lens) - lens
    gaps = gaps.copy()
    gaps[first] = 0
    totals = np.add.reduceat(gaps, first).astype(np.float64)
    scale = np.minimum(1.0, window_s / np.maximum(totals, 1.0))
    shrunk = np.floor(gaps * np.repeat(scale, lens)).astype(np.int64)
    return np.where(gaps > 0, np.maximum(shrunk, 1), 0)


def session_times(rng: np.random.Generator, lens: np.ndarray, starts: np.ndarray, p: SessionParams) -> np.ndarray:
    """Strictly increasing seconds per user inside ``[start_time, start_time + window]``."""
    window = p.window_days * 86_400.0
    gaps = fit_window(session_gaps(rng, starts), lens, window)
    first = np.cumsum(lens) - lens
    within = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[first], lens)
    span = within[np.cumsum(lens) - 1]
    offset = np.floor(rng.random(len(lens)) * np.maximum(window - span, 0.0)).astype(np.int64)
    return p.start_time + np.repeat(offset, lens) + within


def home_items(rng: np.random.Generator, homes: np.ndarray, p: SessionParams) -> np.ndarray:
    """A Zipf-popular member (weight 1/(m+1)) of each given home topic."""
    members = int(topic_sizes(p.n_items, p.topics).min())
    cdf = np.cumsum(1.0 / np.arange(1, members + 1))
    m = np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(len(homes)), side="right"), members - 1)
    return homes + m * p.topics


def successors(prev: np.ndarray, engaged: np.ndarray, similar: np.ndarray, p: SessionParams) -> np.ndarray:
    """The in-session next item of ``prev``: its complement after an engaged action, else a similar one."""
    topic, member = prev % p.topics, prev // p.topics
    size = topic_sizes(p.n_items, p.topics)[topic]
    complement = (member * p.markov_a + p.markov_b) % size
    near = (member + 1 + similar) % size
    return topic + np.where(engaged, complement, near) * p.topics


def plant_sessions(
    rng: np.random.Generator,
    lens: np.ndarray,
    users: np.ndarray,
    engaged: np.ndarray,
    noise_items: np.ndarray,
    p: SessionParams,
) -> Planted:
    """Items and timestamps of a chunk's events (see the module docstring).

    ``users``: each user's index (for the home topic), ``engaged``: per event, ``noise_items``: per
    event, a global Zipf draw used where the event explores. Vectorised over users, one pass per
    position (an item depends on its predecessor's).
    """
    first = np.cumsum(lens) - lens
    pos = np.arange(int(lens.sum())) - np.repeat(first, lens)
    starts = session_starts(rng, pos, p.session_len)
    ts = session_times(rng, lens, starts, p)
    home = home_items(rng, np.repeat(home_topics(p)[users], lens), p)
    explore = rng.random(len(pos)) < p.session_noise
    similar = rng.integers(0, SIMILAR, len(pos))
    items = np.where(explore, noise_items, home)
    for position in range(1, int(lens.max(initial=0))):
        index = first[lens > position] + position
        inside = index[~starts[index] & ~explore[index]]
        items[inside] = successors(items[inside - 1], engaged[inside - 1], similar[inside], p)
    return Planted(items=items, ts=ts, starts=starts)
