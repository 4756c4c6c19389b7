"""The generator's output: the click, purchase and review logs (``Writers``: every file of a run, written
chunk by chunk), ``users.csv``, the ``sources.toml`` that reads them back and the ``generated.json``
summary. Kept apart from the simulation so the events' spelling (formats, user ids, malformed rows)
changes without touching what is drawn.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from freescale import storage

from .churn import DistinctIds
from .config import SourcesConfig, SourceSpec, UserTableSpec
from .corrupt import bad_csv_lines, bad_jsonl_lines, interleave
from .generator_config import GeneratorConfig
from .ids import stable_id
from .log_vocabulary import ACTIONS, CLICK_KINDS, PURCHASE_KINDS, user_names

REVIEW_HEADER = b"reviewer,item,rating,time\n"
CLICK_SCHEMA = pa.schema(
    [("uid", pa.int64()), ("item", pa.int64()), ("event_type", pa.string()), ("ts_ms", pa.int64())]
)


class Writers:
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


def new_stats(fmt: str, path: str) -> dict:
    return {"format": fmt, "path": path, "events": 0, "rows": 0, "rejects": {}}


def _add_rejects(stats: dict, counts: dict[str, int]) -> None:
    for kind, n in counts.items():
        if n:
            stats["rejects"][kind] = stats["rejects"].get(kind, 0) + n
            stats["rows"] += n


def write_clicks(writers: Writers, ev: dict, cfg: GeneratorConfig, u0: int, u1: int, stats: dict) -> None:
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


def write_purchases(writers: Writers, ev: dict, cfg: GeneratorConfig, chunk: int, stats: dict) -> None:
    part = _sorted_channel(ev, 1)
    rng = np.random.default_rng([cfg.seed, 3, chunk])
    # numpy strings, not objects: an empty object array (a chunk without this file's purchases) is no String
    kinds = pc.take(pa.array(PURCHASE_KINDS), pa.array(part["purchase_kind"])).to_numpy(zero_copy_only=False)
    kinds = kinds.astype(str) if len(kinds) else np.zeros(0, dtype="<U1")
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


def write_reviews(writers: Writers, ev: dict, cfg: GeneratorConfig, chunk: int, stats: dict) -> None:
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


def write_users(cfg: GeneratorConfig, out_dir: str) -> None:
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


def sources_config(cfg: GeneratorConfig, writers: Writers) -> SourcesConfig:
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


def churn_summary(cfg: GeneratorConfig, distinct: DistinctIds | None) -> dict:
    """What churn planted: items alive at once, distinct item ids that occurred, ids possible."""
    return {
        "item_lifetime_days": cfg.item_lifetime_days,
        "user_lifetime_days": cfg.user_lifetime_days,
        "items_alive_at_once": cfg.n_items,
        "item_ids_possible": cfg.n_items * cfg.item_generations(),
        "distinct_items": None if distinct is None else distinct.count(),
    }


def generation_summary(cfg: GeneratorConfig, lengths: np.ndarray, stats: dict[str, dict], churn: dict) -> dict:
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
