"""``freescale stats --zch-size`` (pipeline/stats/zch_replay.py): the replay equals a direct
``ZchTable`` replay of the item ids in time order, its collisions vanish when the table is large, and
bad options or a prepared input are one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from prepare_configs import make_config

from freescale.datasets.config import SourcesConfig
from freescale.datasets.presets import preset
from freescale.datasets.sources import iter_events
from freescale.datasets.synthetic import generate
from freescale.kernels.zch import ZchTable
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.prepare import prepare
from freescale.pipeline.stats import StatsConfig, StatsError, compute_stats
from freescale.pipeline.stats.zch_replay import replay_config, replay_sources
from freescale.tools.cli import main

FAST = {"workers": 1, "progress": False, "output": None, "plots": False}
TEN_DAYS = 10 * 86_400


@pytest.fixture(scope="module")
def churn(tmp_path_factory) -> str:
    """Tiny over 6 days with a new id per item slot every day: ~5k events, ~4k distinct items."""
    out = tmp_path_factory.mktemp("churn")
    generate(preset("tiny", window_days=6.0, item_lifetime_days=1.0), str(out))
    return str(out / "sources.toml")


def direct_replay(toml: str, table: ZchTable, lookup_events: int) -> None:
    """The item ids sorted by time (ties in read order), looked up ``lookup_events`` at a time."""
    events = pa.concat_tables([chunk.events for chunk in iter_events(SourcesConfig.from_toml(toml))])
    ts, items = events.column("ts").to_numpy(), events.column("item_id").to_numpy()
    order = np.argsort(ts, kind="stable")
    ts, items = ts[order], items[order]
    for start in range(0, ts.size, lookup_events):
        end = start + lookup_events
        table.lookup(torch.from_numpy(items[start:end].copy()), torch.from_numpy(ts[start:end].copy()))


@pytest.mark.parametrize(
    "table",
    [
        {"zch_size": 640, "max_probe": 8, "policy": "lru"},
        {"zch_size": 1280, "max_probe": 4, "policy": "ttl", "ttl": 86_400},
        {"zch_size": 640, "max_probe": 16, "policy": "lfu", "admission_threshold": 2},
        {"zch_size": 640, "max_probe": 16, "policy": "lfu", "lfu_halflife": 3},
    ],
    ids=lambda t: t["policy"] + ("-halflife" if t.get("lfu_halflife") else ""),
)
def test_stats_replay_equals_a_direct_table_replay(churn, tmp_path: Path, table: dict):
    config = replay_config(lookup_events=700, **table)
    got = replay_sources(SourcesConfig.from_toml(churn), tmp_path / "spill", config)
    reference = ZchTable(config.table)
    direct_replay(churn, reference, 700)
    assert got["counters"] == reference.counters_dict()
    assert got["occupancy"] == reference.occupancy()
    counters = got["counters"]
    assert counters["lookups"] == 4644 and counters["collisions"] + counters["hits"] < counters["lookups"]
    assert got["collision_rate"] == counters["collisions"] / counters["lookups"]
    assert sum(day["lookups"] for day in got["by_day"]) == 4644
    assert list(tmp_path.joinpath("spill").iterdir()) == []  # each day's spill goes once replayed


def test_collisions_vanish_in_a_large_table_and_modulo_sits_beside(churn):
    small, large = (
        compute_stats(
            StatsConfig(
                input=churn,
                table_sizes=(100_000,),
                zch=replay_config(zch_size=size, max_probe=16, policy="ttl", ttl=TEN_DAYS),
                **FAST,
            )
        )
        for size in (256, 64 * 1024)
    )
    assert small["zch"]["collision_rate"] > 0.3  # nothing may be evicted within ten days: the table fills
    assert large["zch"]["collision_rate"] < 0.005 and large["zch"]["eviction_rate"] == 0
    assert large["zch"]["occupancy"] == pytest.approx(large["ids"]["tables"]["item"]["unique_ids"] / (64 * 1024))
    for report, size in ((small, 256), (large, 64 * 1024)):
        assert report["ids"]["table_sizes"] == sorted({100_000, size})  # modulo at the ZCH table's rows too
        modulo = report["ids"]["tables"]["item"]["hash_collision_rate"][str(size)]
        assert report["zch"]["modulo_hash_collision_rate"] == modulo
    assert small["zch"]["modulo_hash_collision_rate"] > 0.9  # ~4k ids in 256 rows


def test_bad_zch_options_and_a_windowed_prepared_input_are_one_line(churn, tmp_path: Path):
    cases = [
        ({"zch_size": 100}, "--zch-size: 100 is not a multiple of bucket_size 64"),
        ({"zch_size": 640, "max_probe": 0}, "--zch-max-probe: must be in [1, bucket_size 64]"),
        ({"zch_size": 640, "policy": "fifo"}, "--zch-policy: unknown policy 'fifo'"),
        ({"zch_size": 640, "policy": "ttl"}, "--zch-ttl: policy 'ttl' needs ttl > 0"),
        ({"zch_size": 640, "admission_threshold": 3}, "--zch-admission: applies to policy 'lfu' only"),
        ({"zch_size": 640, "lfu_halflife": 10}, "--zch-lfu-halflife: applies to policy 'lfu' only"),
    ]
    for options, needle in cases:
        with pytest.raises(ValueError) as error:
            replay_config(**options)
        assert str(error.value).startswith(needle) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="--zch-lookup-events must be an integer >= 1"):
        replay_config(0, zch_size=640)
    windowed = str(tmp_path / "windowed")
    prepare(make_config(churn, windowed, samples=SampleConfig(max_uih_len=64, window_stride=32)))
    with pytest.raises(StatsError, match=r"windowed samples .* repeat events; pass its source config"):
        compute_stats(StatsConfig(input=windowed, zch=replay_config(zch_size=640), **FAST))


def test_a_prepared_dataset_replays_its_samples_events_once(churn, tmp_path: Path):
    out = str(tmp_path / "ds")
    manifest = prepare(make_config(churn, out))
    report = compute_stats(StatsConfig(input=out, zch=replay_config(zch_size=640, lookup_events=500), **FAST))
    assert report["zch"]["counters"]["lookups"] == manifest["rows"]["events_used"]
    dataset = PreparedDataset(out)
    rows = [dataset.row(i) for i in range(int(dataset.offsets[-1]))]
    ts = np.concatenate([row["timestamps"] for row in rows]).astype(np.int64)
    items = np.concatenate([row["item_ids"] for row in rows]).astype(np.int64)
    order = np.argsort(ts, kind="stable")
    reference = ZchTable(replay_config(zch_size=640).table)
    for start in range(0, ts.size, 500):
        window = order[start : start + 500]
        reference.lookup(torch.from_numpy(items[window]), torch.from_numpy(ts[window]))
    assert report["zch"]["counters"] == reference.counters_dict()
    assert report["zch"]["events"].startswith("every event of the prepared samples")


def test_cli_prints_the_replay_beside_modulo_and_refuses_a_bad_size(churn, tmp_path: Path, capsys):
    command = ["stats", churn, "--out", str(tmp_path / "stats"), "--workers", "1", "--no-plots", "--quiet"]
    assert main([*command, "--zch-size", "100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--zch-size: 100 is not a multiple" in err
    assert main([*command, "--zch-max-probe", "4"]) == 2  # was ignored without --zch-size
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--zch-max-probe applies to the ZCH replay, which runs only with --zch-size" in err
    assert main([*command, "--zch-size", "1024", "--zch-policy", "lfu"]) == 0
    out = capsys.readouterr().out
    assert "ZCH replay" in out and "collide" in out and "id % T" in out
    written = json.loads((tmp_path / "stats" / "stats.json").read_text())
    assert written["zch"]["counters"]["lookups"] == 4644 and written["zch"]["table"]["policy"] == "lfu"
    assert "1024" in written["ids"]["tables"]["item"]["hash_collision_rate"]


def test_user_ids_replay_one_lookup_per_event_beside_the_user_table_modulo(churn, tmp_path: Path):
    """``--zch-ids user``: every event looks up its user's id (a ``[user_tables.user_id]`` table); a
    table larger than the users never collides, and modulo hashing at its rows is the user table's."""
    out = str(tmp_path / "ds")
    manifest = prepare(make_config(churn, out))
    size = 64 * 64
    report = compute_stats(StatsConfig(input=out, zch=replay_config(zch_size=size, ids="user"), **FAST))
    zch = report["zch"]
    assert zch["ids"] == "user" and zch["counters"]["lookups"] == manifest["rows"]["events_used"]
    assert zch["counters"]["inserts"] == manifest["rows"]["users"] and zch["collision_rate"] == 0
    assert zch["modulo_hash_collision_rate"] == report["ids"]["tables"]["user"]["hash_collision_rate"][str(size)]
    raw = compute_stats(StatsConfig(input=churn, zch=replay_config(zch_size=size, ids="user"), **FAST))
    events = pa.concat_tables([chunk.events for chunk in iter_events(SourcesConfig.from_toml(churn))])
    users = len(np.unique(events.column("user_id").to_numpy()))  # every valid event's user, before --min-len
    assert raw["zch"]["counters"]["inserts"] == users and raw["zch"]["counters"]["lookups"] == events.num_rows
    with pytest.raises(ValueError, match=r"--zch-ids must be one of \['item', 'user'\], got 'users'"):
        replay_config(zch_size=640, ids="users")
