"""Id churn in the generator (datasets/churn.py): off by default with the events unchanged, and with it
on, the advertised ids alive at once, distinct ids over the stream and user activity spans."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from freescale.datasets.config import SourcesConfig
from freescale.datasets.presets import preset
from freescale.datasets.sources import iter_events
from freescale.datasets.synthetic import generate

DAY = 86_400
# Digests of the valid events (user, item, ts, action, source in file order) the generator wrote
# before churn existed: churn off must not move a single draw.
EVENTS_BEFORE_CHURN = {
    "plain": "197f060a1a9a891edce473dcc31eb8ad65674962e0cd270403f4ce04a0f52a3e",
    "markov_malformed": "31400955a6fc3cfb94f96ed01b977fc1d9e9806bf4f982903e6eb45f3c309a38",
    "sessions": "cf0ee3f4458830cb7ab08105c1845730bf5e3d7379806340e7598fd096b7a549",
}
OPTIONS = {
    "plain": {},
    "markov_malformed": {"malformed_fraction": 0.03, "markov_prob": 0.5},
    "sessions": {"sessions": True},
}


def events_of(config: SourcesConfig) -> pa.Table:
    table = pa.concat_tables([chunk.events for chunk in iter_events(config)])
    return table.sort_by([(name, "ascending") for name in ("source", "file_index", "row")])


def digest(events: pa.Table) -> str:
    h = hashlib.sha256()
    for name in ("user_id", "item_id", "ts", "action", "source"):
        h.update(np.ascontiguousarray(events.column(name).to_numpy()).astype(np.int64).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_churn_off_keeps_every_event(tmp_path: Path, case: str):
    events = events_of(generate(preset("tiny", **OPTIONS[case]), str(tmp_path)))
    assert events.num_rows == 4644
    assert digest(events) == EVENTS_BEFORE_CHURN[case]
    churn = json.loads((tmp_path / "generated.json").read_text())["churn"]
    assert churn["item_ids_possible"] == 1_000 and churn["distinct_items"] is None


@pytest.fixture(scope="module")
def churned(tmp_path_factory) -> tuple[pa.Table, dict]:
    out = tmp_path_factory.mktemp("churn")
    cfg = preset("tiny", n_users=400, n_items=300, window_days=20.0, item_lifetime_days=4.0, user_lifetime_days=5.0)
    events = events_of(generate(cfg, str(out)))
    return events, json.loads((out / "generated.json").read_text())


def test_item_slots_hold_one_id_at_a_time_and_later_days_bring_new_ids(churned):
    events, summary = churned
    items, ts = events.column("item_id").to_numpy(), events.column("ts").to_numpy()
    n_items, start = 300, summary["config"]["start_time"]
    slot, generation = items % n_items, items // n_items
    assert items.max() < summary["churn"]["item_ids_possible"]
    order = np.lexsort((ts, slot))  # per slot by time: generations never go back
    same_slot = slot[order][1:] == slot[order][:-1]
    assert (np.diff(generation[order])[same_slot] >= 0).all()
    # an id lives at most one lifetime: first to last event of an id within 4 days
    spans = {}
    for item, t in zip(items.tolist(), ts.tolist(), strict=True):
        low, high = spans.get(item, (t, t))
        spans[item] = (min(low, t), max(high, t))
    assert max(high - low for low, high in spans.values()) <= 4 * DAY
    day = (ts - start) // DAY
    first, last = set(items[day == day.min()].tolist()), set(items[day == day.max()].tolist())
    assert len(last - first) > 0.9 * len(last)
    assert len(np.unique(items)) == summary["churn"]["distinct_items"] > 3 * n_items
    per_day = [len(np.unique(items[day == d])) for d in np.unique(day)]
    assert max(per_day) <= n_items * (1 + 1 / 4)  # a one-day window: at most n_items (1 + D/L) ids


def test_users_are_active_for_about_their_lifetime(churned):
    events, _ = churned
    users, ts = events.column("user_id").to_numpy(), events.column("ts").to_numpy()
    order = np.lexsort((ts, users))
    users, ts = users[order], ts[order]
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    ends = np.r_[starts[1:], len(users)] - 1
    spans = (ts[ends] - ts[starts]) / DAY
    assert spans.max() <= 1.5 * 5 + 1e-9
    assert 2.0 < np.median(spans[ends - starts >= 10]) < 7.5  # long histories fill most of their span


def test_the_documented_stream_setting_reaches_its_figures(tmp_path: Path):
    """docs/data.md#id-churn: >= 200k distinct items over the stream, <= 60k alive at once."""
    cfg = preset("demo", n_items=50_000, window_days=10.0, item_lifetime_days=2.0, zipf=0.8)
    generate(cfg, str(tmp_path))
    churn = json.loads((tmp_path / "generated.json").read_text())["churn"]
    assert churn["items_alive_at_once"] == 50_000
    assert churn["distinct_items"] >= 200_000


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"item_lifetime_days": -1.0}, "option 'item_lifetime_days' must be a number of days >= 0"),
        ({"user_lifetime_days": "2"}, "option 'user_lifetime_days' must be a number of days >= 0"),
        ({"user_lifetime_days": 2.0, "sessions": True}, "option 'user_lifetime_days' needs sessions = false"),
        ({"n_items": 2**28, "item_lifetime_days": 1.0}, "option 'item_lifetime_days' (1.0) gives"),
    ],
)
def test_bad_churn_options_name_the_option(options: dict, needle: str):
    with pytest.raises(ValueError, match="GeneratorConfig") as error:
        preset("tiny", **options)
    assert needle in str(error.value) and "\n" not in str(error.value)
