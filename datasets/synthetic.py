"""A deterministic generator of heterogeneous user-interaction logs with realistic shape.

Real UIH data cannot ship with the repository, yet every part of FreeScale depends on its shape: the
heavy-tailed history lengths drive load imbalance (the balancer), Zipf item popularity drives
``batch_overlap_rate`` (prioritized embedding communication), and mixed formats/units/id spellings drive
the readers. The generator writes the same user's history across three logs that disagree on almost
everything, as production logs do:

* ``clicks/part-*.parquet``: ``uid`` (int64, already hashed), ``item``, ``event_type`` (view/click/like),
  ``ts_ms`` (milliseconds), several files of bounded row groups;
* ``purchases/part-*.jsonl``: ``customer`` ("u000123"), ``product_id``, ``kind`` (add_to_cart/purchase),
  ``event_time`` (seconds);
* ``reviews/part-*.csv``: ``reviewer``, ``item``, ``rating``, ``time`` (seconds; action is the default);
* ``users.csv``: ``user_id``, ``age_bucket``, ``country_id``.

User ``k`` is ``"u%06d" % k`` in text logs and ``stable_id`` of that string in the click log, so all
sources agree after reading. Two optional planted structures give models something to learn: a Markov
chain (``markov_prob``) makes the next item a deterministic function of the previous one; sessions
(``sessions``, ``sessions.py``) make it depend on the time gap to it, the previous action and the
user's long-term interest, as real logs do (the quality benchmark uses them). Id churn
(``item_lifetime_days``, ``user_lifetime_days``; ``churn.py``) makes items and users appear and retire
over event time, so later days hold ids the first day never had. Output is
byte-identical for equal configs: every random draw comes from generators seeded by (seed, purpose,
chunk), and chunks are cut by a deterministic event budget so memory stays bounded for large presets.

This module draws the events (lengths, items, times, planted structure) and drives a run; what to
generate is ``generator_config.py``, the logs' vocabulary ``log_vocabulary.py`` and the files'
spelling ``source_writers.py``.
"""

from __future__ import annotations

import json

import numpy as np

from freescale import storage

from .churn import DistinctIds, churned_items, item_phases, user_spans
from .config import SourcesConfig
from .generator_config import GeneratorConfig
from .log_vocabulary import CLICK_P, PURCHASE_P
from .sessions import engaged_actions, plant_sessions
from .source_writers import (
    Writers,
    churn_summary,
    generation_summary,
    new_stats,
    sources_config,
    write_clicks,
    write_purchases,
    write_reviews,
    write_users,
)

__all__ = ["ItemSampler", "chunk_bounds", "generate", "sample_lengths"]


def sample_lengths(config: GeneratorConfig) -> np.ndarray:
    """Events per user: heavy-tailed, rounded, clipped to ``[min_len, max_len]``."""
    rng = np.random.default_rng([config.seed, 0])
    if config.length_dist == "lognormal":
        raw = rng.lognormal(np.log(config.median), config.sigma, config.n_users)
    else:
        raw = config.pareto_min * (1.0 + rng.pareto(config.pareto_alpha, config.n_users))
    return np.clip(np.rint(raw), config.min_len, config.max_len).astype(np.int64)


class ItemSampler:
    """Zipf popularity over ``n_items``: rank r has weight (r+1)^-zipf; ranks map to ids by a fixed shuffle.

    The shuffle keeps popular items from being the small ids, so hashing/modding ids into tables does
    not concentrate the head in the first rows.
    """

    def __init__(self, config: GeneratorConfig) -> None:
        weights = np.arange(1, config.n_items + 1, dtype=np.float64) ** -config.zipf
        self.cdf = np.cumsum(weights)
        self.cdf /= self.cdf[-1]
        self.ids = np.random.default_rng([config.seed, 2]).permutation(config.n_items).astype(np.int64)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        ranks = np.searchsorted(self.cdf, rng.random(n), side="right")
        return self.ids[np.minimum(ranks, len(self.ids) - 1)]


def _apply_markov(items: np.ndarray, pos: np.ndarray, rng: np.random.Generator, cfg: GeneratorConfig):
    """With probability ``markov_prob`` item t = (item[t-1]·a + b) mod n_items, vectorised.

    A run of k chained steps from the last free draw x is the affine map a^k·x + b·(a^{k-1}+…+1), so
    every event is computed from its run start without a Python loop over events.
    """
    if cfg.markov_prob <= 0:
        return items
    n = len(items)
    chained = (rng.random(n) < cfg.markov_prob) & (pos > 0)
    if not chained.any():
        return items
    index = np.arange(n)
    last_free = np.maximum.accumulate(np.where(chained, 0, index))
    steps = index - last_free
    mult = np.ones(steps.max() + 1, dtype=np.int64)
    add = np.zeros(steps.max() + 1, dtype=np.int64)
    for k in range(1, len(mult)):
        mult[k] = (mult[k - 1] * cfg.markov_a) % cfg.n_items
        add[k] = (add[k - 1] * cfg.markov_a + cfg.markov_b) % cfg.n_items
    return (mult[steps] * items[last_free] + add[steps]) % cfg.n_items


def _timestamps(rng: np.random.Generator, lengths: np.ndarray, cfg: GeneratorConfig) -> np.ndarray:
    """Strictly increasing seconds per user (gaps >= 1 s) inside ``[start_time, start_time + window]``.

    Each user is active over a random span of the window (5-80 % of it, or ``user_lifetime_days``
    ± 50 %); exponential gaps are rescaled per user to fill exactly that span (so bursts and lulls
    vary, but no history leaves the window).
    """
    window = cfg.window_days * 86_400.0
    if cfg.user_lifetime_days:
        active = user_spans(rng, len(lengths), cfg.user_lifetime_days, window)
    else:
        active = rng.uniform(0.05, 0.8, len(lengths)) * window
    span = np.maximum(lengths.astype(np.float64), active)
    starts = np.cumsum(lengths) - lengths
    raw = rng.exponential(1.0, int(lengths.sum()))
    per_user = np.add.reduceat(raw, starts)
    budget = np.repeat((span - lengths) / per_user, lengths)  # seconds beyond the 1 s minimum gaps
    gaps = 1 + np.floor(raw * budget).astype(np.int64)
    total = np.cumsum(gaps)
    within = total - np.repeat(total[starts] - gaps[starts], lengths)
    first = cfg.start_time + np.floor(rng.random(len(lengths)) * np.maximum(window - span, 0.0))
    return np.repeat(first.astype(np.int64), lengths) + within


def chunk_bounds(lengths: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """User ranges holding about ``budget`` events each (at least one user per chunk)."""
    cum = np.cumsum(lengths)
    bounds, start = [], 0
    while start < len(lengths):
        before = cum[start - 1] if start else 0
        end = max(int(np.searchsorted(cum, before + budget, side="right")), start + 1)
        bounds.append((start, min(end, len(lengths))))
        start = end
    return bounds


def _chunk_events(
    cfg: GeneratorConfig,
    sampler: ItemSampler,
    lengths: np.ndarray,
    u0: int,
    u1: int,
    chunk: int,
    phases: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Users ``[u0, u1)``'s events (channel, kind, time, item...); ``phases``: the item slots' churn phases."""
    rng = np.random.default_rng([cfg.seed, 1, chunk])
    lens = lengths[u0:u1]
    n = int(lens.sum())
    pos = np.arange(n) - np.repeat(np.cumsum(lens) - lens, lens)
    items = _apply_markov(sampler.draw(rng, n), pos, rng, cfg)
    p_click = 1.0 - cfg.purchase_fraction - cfg.review_fraction
    channel = rng.choice(3, size=n, p=[max(p_click, 0.0), cfg.purchase_fraction, cfg.review_fraction])
    ev = {
        "user": np.repeat(np.arange(u0, u1, dtype=np.int64), lens),
        "item": items,
        "ts": _timestamps(rng, lens, cfg),
        "channel": channel,
        "click_kind": rng.choice(3, size=n, p=CLICK_P),
        "purchase_kind": rng.choice(2, size=n, p=PURCHASE_P),
        "ms": rng.integers(0, 1000, n),
        "rating": rng.integers(1, 6, n),
    }
    if cfg.sessions:  # after every other draw, so configs without sessions keep their bytes
        engaged = engaged_actions(ev["channel"], ev["click_kind"])
        session_rng = np.random.default_rng([cfg.seed, 7, chunk])
        planted = plant_sessions(session_rng, lens, np.arange(u0, u1), engaged, items, cfg.session_params())
        ev["item"], ev["ts"] = planted.items, planted.ts
    if cfg.item_lifetime_days:  # on slots, after every draw: the ids change, nothing else does
        ev["item"] = churned_items(ev["item"], ev["ts"], phases, cfg.start_time, cfg.item_lifetime_days)
    return ev


def generate(config: GeneratorConfig, out_dir: str) -> SourcesConfig:
    """Write the logs, ``users.csv``, ``sources.toml`` and ``generated.json`` under ``out_dir``.

    Returns the source config read back from the written ``sources.toml``, so callers use exactly
    what a later ``prepare --sources`` run will see. ``generated.json`` records, per source, the rows
    written, the valid events and the bad rows per reject reason, so accounting can be checked exactly.
    """
    lengths = sample_lengths(config)
    sampler = ItemSampler(config)
    writers = Writers(config, out_dir)
    stats = {"clicks": new_stats("parquet", "clicks/*.parquet")}
    phases = item_phases(config.seed, config.n_items, config.item_lifetime_days) if config.item_lifetime_days else None
    distinct = DistinctIds(config.n_items * config.item_generations()) if phases is not None else None
    if writers.purchases:
        stats["purchases"] = new_stats("jsonl", "purchases/*.jsonl")
    if writers.reviews:
        stats["reviews"] = new_stats("csv", "reviews/*.csv")
    try:
        for chunk, (u0, u1) in enumerate(chunk_bounds(lengths, config.chunk_events)):
            ev = _chunk_events(config, sampler, lengths, u0, u1, chunk, phases)
            if distinct is not None:
                distinct.add(ev["item"])
            write_clicks(writers, ev, config, u0, u1, stats["clicks"])
            if writers.purchases:
                write_purchases(writers, ev, config, chunk, stats["purchases"])
            if writers.reviews:
                write_reviews(writers, ev, config, chunk, stats["reviews"])
            del ev
    finally:
        writers.close()
    if config.user_table:
        write_users(config, out_dir)
    sources = sources_config(config, writers)
    toml_path = storage.join(out_dir, "sources.toml")
    storage.write_bytes(toml_path, sources.to_toml().encode("utf-8"))
    summary = generation_summary(config, lengths, stats, churn_summary(config, distinct))
    summary = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    storage.write_bytes(storage.join(out_dir, "generated.json"), summary.encode("utf-8"))
    return SourcesConfig.from_toml(toml_path)
