"""The generator's planted session structure (``sessions = true``, ``datasets/sessions.py``): determinism,
and that the next item really depends on the time gap, the previous action and the user's home topic."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from freescale.datasets.generator_config import GeneratorConfig
from freescale.datasets.ids import stable_id
from freescale.datasets.log_vocabulary import ACTIONS, user_names
from freescale.datasets.presets import preset
from freescale.datasets.sessions import LONG_GAP_MIN_S, SIMILAR, home_topics, session_times, topic_sizes
from freescale.datasets.sources import iter_events
from freescale.datasets.synthetic import generate

ENGAGED = {ACTIONS[name] for name in ("like", "add_to_cart", "purchase", "review")}


def session_config(**overrides: object) -> GeneratorConfig:
    options = {"n_users": 300, "n_items": 600, "topics": 20, "median": 30.0, "sigma": 0.6, "sessions": True}
    return preset("tiny", **(options | overrides))


@dataclass
class Transitions:
    """Consecutive event pairs of every user, in time order (from the written logs, after reading)."""

    user: np.ndarray  # user index of the pair
    prev: np.ndarray
    next: np.ndarray
    gap: np.ndarray  # seconds
    prev_action: np.ndarray
    first_items: np.ndarray  # each user's first item
    first_users: np.ndarray


def transitions(cfg: GeneratorConfig, out: Path) -> Transitions:
    config = generate(cfg, str(out))
    events = pa.concat_tables([chunk.events for chunk in iter_events(config, target_rows=5_000)])
    ids = stable_id(user_names(np.arange(cfg.n_users), cfg.n_users).to_arrow())
    index_of = {int(raw): index for index, raw in enumerate(ids)}
    users = np.array([index_of[int(u)] for u in events["user_id"].to_numpy()])
    ts, items, actions = (events[name].to_numpy() for name in ("ts", "item_id", "action"))
    order = np.lexsort((ts, users))
    users, ts, items, actions = users[order], ts[order], items[order], actions[order]
    same = users[1:] == users[:-1]
    first = np.concatenate([[True], ~same])
    return Transitions(
        user=users[1:][same],
        prev=items[:-1][same],
        next=items[1:][same],
        gap=(ts[1:] - ts[:-1])[same],
        prev_action=actions[:-1][same],
        first_items=items[first],
        first_users=users[first],
    )


def follows_action(t: Transitions, cfg: GeneratorConfig) -> np.ndarray:
    """Whether each pair follows the in-session rule for its previous action."""
    topic, member = t.prev % cfg.topics, t.prev // cfg.topics
    size = topic_sizes(cfg.n_items, cfg.topics)[topic]
    same_topic = t.next % cfg.topics == topic
    complement = t.next // cfg.topics == (member * cfg.markov_a + cfg.markov_b) % size
    similar = (t.next // cfg.topics - member - 1) % size < SIMILAR
    engaged = np.isin(t.prev_action, list(ENGAGED))
    return same_topic & np.where(engaged, complement, similar)


def digest(root: Path) -> str:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    cfg = session_config(n_users=60)
    for name, config in (("a", cfg), ("b", cfg), ("c", replace(cfg, seed=1))):
        generate(config, str(tmp_path / name))
    assert digest(tmp_path / "a") == digest(tmp_path / "b") != digest(tmp_path / "c")


def test_next_item_depends_on_gap_action_and_home_topic(tmp_path: Path) -> None:
    cfg = session_config()
    t = transitions(cfg, tmp_path)
    home = home_topics(cfg.session_params())
    long_gap = t.gap >= LONG_GAP_MIN_S
    assert 1 / cfg.session_len - 0.05 < long_gap.mean() < 1 / cfg.session_len + 0.05
    # after a long gap: back to the home topic (all but the exploring share); after a short gap, the
    # item follows the previous one by its action. Neither rule holds on the other side of the gap.
    at_home = t.next % cfg.topics == home[t.user]
    rule = follows_action(t, cfg)
    assert at_home[long_gap].mean() > 0.85 and rule[~long_gap].mean() > 0.85
    assert rule[long_gap].mean() < 0.3
    assert (home[t.first_users] == t.first_items % cfg.topics).mean() > 0.85
    # the previous action matters: the complement rule alone fails after views and clicks
    engaged = np.isin(t.prev_action, list(ENGAGED))
    assert 0.05 < engaged.mean() < 0.5
    viewed_rule = follows_action(replace(t, prev_action=np.full_like(t.prev_action, ACTIONS["like"])), cfg)
    assert viewed_rule[~long_gap & ~engaged].mean() < 0.3


def test_without_sessions_the_gap_says_nothing(tmp_path: Path) -> None:
    """The statistic above needs the option: plain Zipf data has no home-topic return after long gaps."""
    cfg = session_config(sessions=False)
    t = transitions(cfg, tmp_path)
    home = home_topics(cfg.session_params())
    long_gap = t.gap >= LONG_GAP_MIN_S
    assert (t.next % cfg.topics == home[t.user])[long_gap].mean() < 0.2
    assert follows_action(t, cfg)[~long_gap].mean() < 0.2


def test_long_histories_fit_the_window_and_keep_time_order() -> None:
    cfg = session_config(session_len=1.0, window_days=3.0)  # every event after a long gap
    lens = np.array([1, 5, 3_000])
    starts = np.ones(int(lens.sum()), dtype=bool)
    ts = session_times(np.random.default_rng(0), lens, starts, cfg.session_params())
    for user in np.split(ts, np.cumsum(lens)[:-1]):
        assert (np.diff(user) > 0).all()
        assert user.min() >= cfg.start_time and user.max() <= cfg.start_time + cfg.window_days * 86_400


@pytest.mark.parametrize(
    ("bad", "option"),
    [
        ({"markov_prob": 0.5}, "markov_prob"),
        ({"session_len": 0.5}, "session_len"),
        ({"topics": 601}, "topics"),
        ({"session_noise": 1.5}, "session_noise"),
    ],
)
def test_bad_session_options_name_the_option(bad: dict[str, object], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        session_config(**bad)
