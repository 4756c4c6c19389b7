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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from freescale import storage

from .churn import DistinctIds, churned_items, item_generations, item_phases, user_spans
from .config import SourcesConfig, SourceSpec, UserTableSpec
from .convert import TS_MAX
from .corrupt import bad_csv_lines, bad_jsonl_lines, interleave
from .ids import stable_id
from .sessions import SessionParams, engaged_actions, plant_sessions

__all__ = ["ACTIONS", "GeneratorConfig", "generate", "sample_lengths", "user_names"]

ACTIONS = {"view": 0, "click": 1, "like": 2, "add_to_cart": 3, "purchase": 4, "review": 5}
CLICK_KINDS = ("view", "click", "like")
CLICK_P = (0.7, 0.25, 0.05)
PURCHASE_KINDS = ("add_to_cart", "purchase")
PURCHASE_P = (0.6, 0.4)
REVIEW_HEADER = b"reviewer,item,rating,time\n"
CLICK_SCHEMA = pa.schema(
    [("uid", pa.int64()), ("item", pa.int64()), ("event_type", pa.string()), ("ts_ms", pa.int64())]
)


def _positive(name: str, value: float, integer: bool = False) -> None:
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"GeneratorConfig: option '{name}' must be an integer; got {value!r}")
    if not value > 0:
        raise ValueError(f"GeneratorConfig: option '{name}' must be > 0; got {value!r}")


def _fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"GeneratorConfig: option '{name}' must be in [0, 1]; got {value!r}")


@dataclass
class GeneratorConfig:
    """What to generate. Lengths are total events per user over all logs (valid events only).

    ``length_dist`` ``lognormal`` uses ``median``/``sigma``; ``pareto`` uses ``pareto_alpha``/``pareto_min``.
    ``zipf`` is the item-popularity exponent (higher: more repeated ids, more batch overlap).
    ``malformed_fraction`` adds that share of bad rows to each text log (on top of the valid ones).
    ``sessions`` plants the session structure of ``sessions.py`` (items and timestamps; the actions
    stay as drawn): ``session_len`` mean events per session, ``topics`` interest topics,
    ``session_noise`` share of exploring events. It replaces the Markov chain (``markov_prob`` = 0).
    ``item_lifetime_days`` > 0: each of the ``n_items`` item slots gets a new id every that many days
    (``churn.py``: ``n_items`` alive at once); ``user_lifetime_days`` > 0: users are active for about
    that many days each. 0 (the default) turns either off.
    """

    name: str = "synthetic"
    seed: int = 0
    n_users: int = 200
    n_items: int = 1_000
    length_dist: str = "lognormal"
    median: float = 15.0
    sigma: float = 1.0
    pareto_alpha: float = 1.5
    pareto_min: int = 5
    min_len: int = 1
    max_len: int = 21_000
    zipf: float = 1.1
    markov_prob: float = 0.0
    markov_a: int = 31
    markov_b: int = 7
    sessions: bool = False
    session_len: float = 3.0
    topics: int = 50
    session_noise: float = 0.1
    purchase_fraction: float = 0.1
    review_fraction: float = 0.05
    click_files: int = 2
    purchase_files: int = 1
    review_files: int = 1
    row_group_rows: int = 65_536
    start_time: int = 1_600_000_000
    window_days: float = 365.0
    malformed_fraction: float = 0.0
    chunk_events: int = 2_000_000
    user_table: bool = True
    item_lifetime_days: float = 0.0
    user_lifetime_days: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("GeneratorConfig: option 'name' must be a non-empty string")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"GeneratorConfig: option 'seed' must be an integer >= 0; got {self.seed!r}")
        for key in (
            "n_users",
            "n_items",
            "pareto_min",
            "min_len",
            "max_len",
            "markov_a",
            "topics",
            "click_files",
            "purchase_files",
            "review_files",
            "row_group_rows",
            "chunk_events",
        ):
            _positive(key, getattr(self, key), integer=True)
        for key in ("median", "sigma", "pareto_alpha", "zipf", "window_days"):
            _positive(key, getattr(self, key))
        for key in ("markov_prob", "purchase_fraction", "review_fraction", "malformed_fraction", "session_noise"):
            _fraction(key, getattr(self, key))
        if self.length_dist not in ("lognormal", "pareto"):
            raise ValueError(
                f"GeneratorConfig: option 'length_dist' must be lognormal or pareto; got {self.length_dist!r}"
            )
        self._check_sessions()
        self._check_churn()
        if self.min_len > self.max_len:
            raise ValueError(f"GeneratorConfig: option 'min_len' ({self.min_len}) exceeds 'max_len'")
        if self.n_items > 2**31 or self.markov_a >= 2**31 or not 0 <= self.markov_b < 2**31:
            raise ValueError("GeneratorConfig: options 'n_items', 'markov_a', 'markov_b' must be < 2**31")
        if self.purchase_fraction + self.review_fraction > 1.0:
            raise ValueError("GeneratorConfig: options 'purchase_fraction' + 'review_fraction' exceed 1")
        if not 0 <= self.start_time + self.window_days * 86_400 + self.max_len < TS_MAX:
            raise ValueError("GeneratorConfig: options 'start_time' + 'window_days' must end before 2100")

    def _check_sessions(self) -> None:
        if not isinstance(self.sessions, bool):
            raise ValueError(f"GeneratorConfig: option 'sessions' must be true or false; got {self.sessions!r}")
        if not self.session_len >= 1.0:
            raise ValueError(f"GeneratorConfig: option 'session_len' must be >= 1; got {self.session_len!r}")
        if self.topics > self.n_items:
            raise ValueError(f"GeneratorConfig: option 'topics' ({self.topics}) exceeds 'n_items'")
        if self.sessions and self.markov_prob > 0:
            raise ValueError(
                "GeneratorConfig: options 'sessions' and 'markov_prob' are two planted structures; use one"
            )

    def _check_churn(self) -> None:
        for key in ("item_lifetime_days", "user_lifetime_days"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(
                    f"GeneratorConfig: option '{key}' must be a number of days >= 0 (0: off); got {value!r}"
                )
        if self.user_lifetime_days and self.sessions:
            raise ValueError(
                "GeneratorConfig: option 'user_lifetime_days' needs sessions = false (sessions set their own times)"
            )
        if self.item_lifetime_days and self.n_items * self.item_generations() >= 2**31:
            raise ValueError(
                f"GeneratorConfig: option 'item_lifetime_days' ({self.item_lifetime_days}) gives "
                f"{self.item_generations()} generations of {self.n_items} items: ids must stay < 2**31"
            )

    def item_generations(self) -> int:
        """Generations an item slot can have (1 without item churn): item ids are < n_items times this."""
        if not self.item_lifetime_days:
            return 1
        return item_generations(self.window_days, self.item_lifetime_days, self.max_len)

    def session_params(self) -> SessionParams:
        return SessionParams(**{f.name: getattr(self, f.name) for f in fields(SessionParams)})

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def sample_lengths(config: GeneratorConfig) -> np.ndarray:
    """Events per user: heavy-tailed, rounded, clipped to ``[min_len, max_len]``."""
    rng = np.random.default_rng([config.seed, 0])
    if config.length_dist == "lognormal":
        raw = rng.lognormal(np.log(config.median), config.sigma, config.n_users)
    else:
        raw = config.pareto_min * (1.0 + rng.pareto(config.pareto_alpha, config.n_users))
    return np.clip(np.rint(raw), config.min_len, config.max_len).astype(np.int64)


def user_names(indices: np.ndarray | pl.Series, n_users: int) -> pl.Series:
    """``u`` + zero-padded index: the spelling text logs use for user ``k``."""
    width = max(6, len(str(max(n_users - 1, 0))))
    series = indices if isinstance(indices, pl.Series) else pl.Series(np.asarray(indices, dtype=np.int64))
    return "u" + series.cast(pl.String).str.zfill(width)


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


class _Writers:
    """Output files of one generation run (local or ``s3://``), all closed together at the end.

    Every file is created up front, so a source's glob matches all its files even when a small
    config leaves one of them without rows.
    """

    def __init__(self, cfg: GeneratorConfig, out_dir: str) -> None:
        self.out_dir = out_dir
        self.streams: list = []
        self._remove_stale()
        self.clicks = [self._parquet(f"clicks/part-{i:05d}.parquet") for i in range(cfg.click_files)]
        n_purchase = cfg.purchase_files if cfg.purchase_fraction > 0 else 0
        n_review = cfg.review_files if cfg.review_fraction > 0 else 0
        self.purchases = [self._open(f"purchases/part-{i:05d}.jsonl") for i in range(n_purchase)]
        self.reviews = [self._open(f"reviews/part-{i:05d}.csv") for i in range(n_review)]
        for stream in self.reviews:
            stream.write(REVIEW_HEADER)

    def _remove_stale(self) -> None:
        """Delete part files of an earlier run, which the new ``sources.toml`` globs would pick up."""
        for pattern in ("clicks/part-*.parquet", "purchases/part-*.jsonl", "reviews/part-*.csv"):
            for uri in storage.expand(storage.join(self.out_dir, pattern)):
                fs, path = storage.filesystem(uri)
                fs.delete_file(path)

    def _open(self, rel: str):
        uri = storage.join(self.out_dir, rel)
        fs, path = storage.filesystem(uri)
        if not storage.is_remote(uri):
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        stream = fs.open_output_stream(path)
        self.streams.append(stream)
        return stream

    def _parquet(self, rel: str) -> pq.ParquetWriter:
        return pq.ParquetWriter(self._open(rel), CLICK_SCHEMA, compression="zstd")

    def close(self) -> None:
        for writer in self.clicks:
            writer.close()
        for stream in self.streams:
            if not stream.closed:
                stream.close()


def _sorted_channel(ev: dict[str, np.ndarray], channel: int, key: np.ndarray | None = None) -> dict:
    """The events of one log, ordered by time (logs are time-ordered, not user-ordered)."""
    mask = ev["channel"] == channel
    sort_key = (ev["ts"] if key is None else key)[mask]
    order = np.argsort(sort_key, kind="stable")
    return {name: values[mask][order] for name, values in ev.items()}


def _new_stats(fmt: str, path: str) -> dict:
    return {"format": fmt, "path": path, "events": 0, "rows": 0, "rejects": {}}


def _add_rejects(stats: dict, counts: dict[str, int]) -> None:
    for kind, n in counts.items():
        if n:
            stats["rejects"][kind] = stats["rejects"].get(kind, 0) + n
            stats["rows"] += n


def _write_clicks(writers: _Writers, ev: dict, cfg: GeneratorConfig, u0: int, u1: int, stats: dict) -> None:
    part = _sorted_channel(ev, 0, ev["ts"] * 1000 + ev["ms"])
    hashed = stable_id(user_names(np.arange(u0, u1), cfg.n_users).to_arrow())
    uid = hashed[part["user"] - u0]
    event_type = pc.take(pa.array(CLICK_KINDS), pa.array(part["click_kind"]))
    ts_ms = part["ts"] * 1000 + part["ms"]
    for f, writer in enumerate(writers.clicks):
        sel = part["user"] % len(writers.clicks) == f
        table = pa.table(
            [uid[sel], part["item"][sel], event_type.filter(pa.array(sel)), ts_ms[sel]], schema=CLICK_SCHEMA
        )
        writer.write_table(table, row_group_size=cfg.row_group_rows)
        stats["events"] += table.num_rows
        stats["rows"] += table.num_rows


class _Rows:
    """Row ``t`` of parallel columns as a tuple: the template a malformed row is built from."""

    def __init__(self, *columns) -> None:
        self.columns = columns

    def __call__(self, t: int) -> tuple:
        return tuple(column[t] for column in self.columns)


def _write_lines(stream, lines: pl.Series) -> None:
    if len(lines):
        stream.write((lines.str.join("\n").item() + "\n").encode("utf-8"))


def _write_purchases(writers: _Writers, ev: dict, cfg: GeneratorConfig, chunk: int, stats: dict) -> None:
    part = _sorted_channel(ev, 1)
    rng = np.random.default_rng([cfg.seed, 3, chunk])
    kinds = pc.take(pa.array(PURCHASE_KINDS), pa.array(part["purchase_kind"])).to_numpy(zero_copy_only=False)
    for f, stream in enumerate(writers.purchases):
        sel = part["user"] % len(writers.purchases) == f
        names = user_names(part["user"][sel], cfg.n_users)
        items, kind, ts = part["item"][sel], kinds[sel], part["ts"][sel]
        valid = pl.select(
            pl.concat_str(
                [
                    pl.lit('{"customer":"'),
                    pl.lit(names),
                    pl.lit('","product_id":'),
                    pl.lit(items),
                    pl.lit(',"kind":"'),
                    pl.lit(kind),
                    pl.lit('","event_time":'),
                    pl.lit(ts),
                    pl.lit("}"),
                ]
            )
        ).to_series()
        template = _Rows(names, items, kind, ts)
        bad, counts = bad_jsonl_lines(rng, len(valid), cfg.malformed_fraction, template)
        _write_lines(stream, interleave(rng, valid, bad))
        stats["events"] += len(valid)
        stats["rows"] += len(valid)
        _add_rejects(stats, counts)


def _write_reviews(writers: _Writers, ev: dict, cfg: GeneratorConfig, chunk: int, stats: dict) -> None:
    part = _sorted_channel(ev, 2)
    rng = np.random.default_rng([cfg.seed, 4, chunk])
    for f, stream in enumerate(writers.reviews):
        sel = part["user"] % len(writers.reviews) == f
        names = user_names(part["user"][sel], cfg.n_users)
        items, ratings, ts = part["item"][sel], part["rating"][sel], part["ts"][sel]
        valid = pl.select(
            pl.concat_str([pl.lit(names), pl.lit(items), pl.lit(ratings), pl.lit(ts)], separator=",")
        ).to_series()
        template = _Rows(names, items, ratings, ts)
        bad, counts = bad_csv_lines(rng, len(valid), cfg.malformed_fraction, template)
        _write_lines(stream, interleave(rng, valid, bad))
        stats["events"] += len(valid)
        stats["rows"] += len(valid)
        _add_rejects(stats, counts)


def _write_users(cfg: GeneratorConfig, out_dir: str) -> None:
    rng = np.random.default_rng([cfg.seed, 5])
    country_p = 1.0 / np.arange(1, 51) ** 1.2
    frame = pl.DataFrame(
        {
            "user_id": user_names(np.arange(cfg.n_users), cfg.n_users),
            "age_bucket": rng.integers(0, 7, cfg.n_users),
            "country_id": rng.choice(50, size=cfg.n_users, p=country_p / country_p.sum()),
        }
    )
    storage.write_bytes(storage.join(out_dir, "users.csv"), frame.write_csv().encode("utf-8"))


def _sources_config(cfg: GeneratorConfig, writers: _Writers) -> SourcesConfig:
    sources = [
        SourceSpec(
            name="clicks",
            format="parquet",
            path="clicks/*.parquet",
            timestamp_unit="ms",
            columns={"user": "uid", "item": "item", "timestamp": "ts_ms", "action": "event_type"},
            action_map={k: ACTIONS[k] for k in CLICK_KINDS},
        )
    ]
    if writers.purchases:
        sources.append(
            SourceSpec(
                name="purchases",
                format="jsonl",
                path="purchases/*.jsonl",
                timestamp_unit="s",
                columns={"user": "customer", "item": "product_id", "timestamp": "event_time", "action": "kind"},
                action_map={k: ACTIONS[k] for k in PURCHASE_KINDS},
            )
        )
    if writers.reviews:
        sources.append(
            SourceSpec(
                name="reviews",
                format="csv",
                path="reviews/*.csv",
                timestamp_unit="s",
                columns={"user": "reviewer", "item": "item", "timestamp": "time"},
                default_action=ACTIONS["review"],
            )
        )
    users = None
    if cfg.user_table:
        users = UserTableSpec(
            path="users.csv", format="csv", user_column="user_id", features=("age_bucket", "country_id")
        )
    return SourcesConfig(name=cfg.name, sources=sources, users=users)


def _churn_summary(cfg: GeneratorConfig, distinct: DistinctIds | None) -> dict:
    """What churn planted: items alive at once, distinct item ids that occurred, ids possible."""
    return {
        "item_lifetime_days": cfg.item_lifetime_days,
        "user_lifetime_days": cfg.user_lifetime_days,
        "items_alive_at_once": cfg.n_items,
        "item_ids_possible": cfg.n_items * cfg.item_generations(),
        "distinct_items": None if distinct is None else distinct.count(),
    }


def _summary(cfg: GeneratorConfig, lengths: np.ndarray, stats: dict[str, dict], churn: dict) -> dict:
    totals: dict[str, int] = {}
    for source in stats.values():
        for kind, n in source["rejects"].items():
            totals[kind] = totals.get(kind, 0) + n
    return {
        "name": cfg.name,
        "config": asdict(cfg),
        "users": cfg.n_users,
        "events": int(sum(s["events"] for s in stats.values())),
        "rows": int(sum(s["rows"] for s in stats.values())),
        "rejects": dict(sorted(totals.items())),
        "sources": stats,
        "actions": ACTIONS,
        "user_id": "text logs: 'u' + zero-padded index (width >= 6); clicks.uid: stable_id of that string",
        "markov": {"prob": cfg.markov_prob, "a": cfg.markov_a, "b": cfg.markov_b, "n_items": cfg.n_items},
        "sessions": {"on": cfg.sessions, "session_len": cfg.session_len, "topics": cfg.topics},
        "churn": churn,
        "lengths": {
            "min": int(lengths.min()),
            "median": float(np.median(lengths)),
            "mean": float(lengths.mean()),
            "p99": float(np.percentile(lengths, 99)),
            "max": int(lengths.max()),
        },
    }


def generate(config: GeneratorConfig, out_dir: str) -> SourcesConfig:
    """Write the logs, ``users.csv``, ``sources.toml`` and ``generated.json`` under ``out_dir``.

    Returns the source config read back from the written ``sources.toml``, so callers use exactly
    what a later ``prepare --sources`` run will see. ``generated.json`` records, per source, the rows
    written, the valid events and the bad rows per reject reason, so accounting can be checked exactly.
    """
    lengths = sample_lengths(config)
    sampler = ItemSampler(config)
    writers = _Writers(config, out_dir)
    stats = {"clicks": _new_stats("parquet", "clicks/*.parquet")}
    phases = item_phases(config.seed, config.n_items, config.item_lifetime_days) if config.item_lifetime_days else None
    distinct = DistinctIds(config.n_items * config.item_generations()) if phases is not None else None
    if writers.purchases:
        stats["purchases"] = _new_stats("jsonl", "purchases/*.jsonl")
    if writers.reviews:
        stats["reviews"] = _new_stats("csv", "reviews/*.csv")
    try:
        for chunk, (u0, u1) in enumerate(chunk_bounds(lengths, config.chunk_events)):
            ev = _chunk_events(config, sampler, lengths, u0, u1, chunk, phases)
            if distinct is not None:
                distinct.add(ev["item"])
            _write_clicks(writers, ev, config, u0, u1, stats["clicks"])
            if writers.purchases:
                _write_purchases(writers, ev, config, chunk, stats["purchases"])
            if writers.reviews:
                _write_reviews(writers, ev, config, chunk, stats["reviews"])
            del ev
    finally:
        writers.close()
    if config.user_table:
        _write_users(config, out_dir)
    sources = _sources_config(config, writers)
    toml_path = storage.join(out_dir, "sources.toml")
    storage.write_bytes(toml_path, sources.to_toml().encode("utf-8"))
    summary = _summary(config, lengths, stats, _churn_summary(config, distinct))
    summary = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    storage.write_bytes(storage.join(out_dir, "generated.json"), summary.encode("utf-8"))
    return SourcesConfig.from_toml(toml_path)
