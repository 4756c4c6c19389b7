"""``prepare --time-window`` / ``--time-range`` (pipeline/time_windows.py): windows partition the events
with balanced accounting, each window is a dataset the public loader reads, and an interrupted run
resumes to the same datasets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from prepare_configs import make_config

from freescale.datasets.presets import preset
from freescale.datasets.sources import iter_events
from freescale.datasets.synthetic import generate
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.dataset import Config, Loader
from freescale.pipeline.dataset.manifest import load_manifest
from freescale.pipeline.output import PrepareError
from freescale.pipeline.prepare import PrepareJob, prepare
from freescale.pipeline.time_windows import (
    load_windows,
    parse_duration,
    parse_time_range,
    prepare_windows,
)
from freescale.tools.cli import main

DAY = 86_400


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> tuple[str, np.ndarray]:
    """Tiny over 3 days with item churn; returns the source config and every valid event's time."""
    out = tmp_path_factory.mktemp("stream")
    sources = generate(preset("tiny", window_days=3.0, item_lifetime_days=1.0, malformed_fraction=0.02), str(out))
    ts = pa.concat_tables([chunk.events for chunk in iter_events(sources)]).column("ts").to_numpy()
    return str(out / "sources.toml"), ts


def window_config(sources: str, output: Path, **options):
    return make_config(sources, str(output), samples=SampleConfig(max_uih_len=2048, min_len=1), **options)


def loaded_timestamps(dataset: str) -> np.ndarray:
    batches = Loader(Config(path=dataset, output="samples", num_workers=0))
    return np.concatenate([sample["timestamps"] for batch in batches for sample in batch.samples])


def test_windows_partition_the_events_and_each_loads(stream, tmp_path: Path):
    sources, ts = stream
    index = prepare_windows(window_config(sources, tmp_path / "out"), DAY)
    first_day = ts.min() // DAY
    assert [w.start for w in index.windows] == [(first_day + k) * DAY for k in range(len(index.windows))]
    assert index.balanced and index.events_outside_windows == 0
    assert index.events_valid == index.events_in_windows == ts.size
    for window in index.windows:
        inside = (ts >= window.start) & (ts < window.end)
        assert window.events == inside.sum() > 0
        manifest = load_manifest(str(tmp_path / "out" / window.path))
        rows = manifest.rows
        assert rows.balanced
        assert rows.events_filtered.by_reason["outside_time_range"] == ts.size - window.events
        assert rows.events_used + rows.events_filtered.total + rows.events_rejected.total == rows.events_read
        seen = loaded_timestamps(str(tmp_path / "out" / window.path))
        assert seen.min() >= window.start and seen.max() < window.end  # histories stay in the window
    assert load_windows(str(tmp_path / "out")) == index


def test_time_range_counts_the_events_outside_every_window(stream, tmp_path: Path):
    sources, ts = stream
    start = int(ts.min() // DAY + 1) * DAY
    time_range = (start, start + DAY + DAY // 2)  # a day and a half: the second window is half a day
    index = prepare_windows(window_config(sources, tmp_path / "out", time_range=time_range), DAY)
    assert [(w.start, w.end) for w in index.windows] == [(start, start + DAY), (start + DAY, time_range[1])]
    outside = ((ts < time_range[0]) | (ts >= time_range[1])).sum()
    assert index.events_outside_windows == outside > 0
    assert index.events_in_windows + outside == index.events_valid == ts.size and index.balanced


def test_one_time_range_is_one_filtered_dataset(stream, tmp_path: Path):
    sources, ts = stream
    start = int(ts.min() // DAY + 1) * DAY
    manifest = prepare(window_config(sources, tmp_path / "out", time_range=(start, start + DAY)))
    inside = ((ts >= start) & (ts < start + DAY)).sum()
    assert manifest["rows"]["events_filtered"]["by_reason"]["outside_time_range"] == ts.size - inside
    assert manifest["config"]["time_range"] == [start, start + DAY]
    seen = loaded_timestamps(str(tmp_path / "out"))
    assert seen.min() >= start and seen.max() < start + DAY


def test_an_interrupted_windowed_prepare_resumes(stream, tmp_path: Path, monkeypatch):
    sources, _ = stream
    reference = prepare_windows(window_config(sources, tmp_path / "reference"), DAY)
    publish = PrepareJob._publish
    calls = {"n": 0}

    def killed_in_the_second_window(job, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # killed after the second window's shards, before its manifest
        return publish(job, *args, **kwargs)

    monkeypatch.setattr(PrepareJob, "_publish", killed_in_the_second_window)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare_windows(window_config(sources, out), DAY)
    assert not (out / "windows.json").exists() and (out / "window=0000" / "manifest.json").exists()
    first = (out / "window=0000" / "manifest.json").stat().st_mtime_ns
    resumed = prepare_windows(window_config(sources, out), DAY)
    assert calls["n"] == 1 + len(reference.windows)  # window 0 up to date: its job published nothing again
    assert (out / "window=0000" / "manifest.json").stat().st_mtime_ns == first
    assert resumed == reference  # same fingerprints and manifest hashes, window by window


def test_bad_window_options_are_one_line(stream, tmp_path: Path):
    for text in ("0d", "1x", "-1h"):
        with pytest.raises(ValueError, match=r"^--time-window: expected a duration"):
            parse_duration(text)
    assert parse_duration("6h") == 6 * 3600 and parse_duration("90") == 90
    assert parse_time_range("2020-09-14:1600214400") == (1600041600, 1600214400)
    assert parse_time_range("2020-09-14T12:00:00..2020-09-15") == (1600084800, 1600128000)
    with pytest.raises(ValueError, match=r"^--time-range: START must be >= 0 and before END"):
        window_config(stream[0], tmp_path / "x", time_range=(5, 3))
    with pytest.raises(ValueError, match=r"^--time-range: 'yesterday' is neither"):
        parse_time_range("yesterday:2020-09-15")
    sources, _ = stream
    prepare(window_config(sources, tmp_path / "plain"))
    with pytest.raises(PrepareError, match="holds a prepared dataset"):
        prepare_windows(window_config(sources, tmp_path / "plain"), DAY)


def test_windows_of_another_run_need_overwrite(stream, tmp_path: Path):
    sources, _ = stream
    out = tmp_path / "out"
    days = prepare_windows(window_config(sources, out), DAY)
    assert len(days.windows) == 4
    with pytest.raises(PrepareError, match="holds window=0002, window=0003 that this run does not write"):
        prepare_windows(window_config(sources, out), 3 * DAY)
    assert json.loads((out / "windows.json").read_text())["window_s"] == DAY  # the old index stays
    three_days = prepare_windows(window_config(sources, out, overwrite=True), 3 * DAY)
    assert [p.name for p in sorted(out.iterdir()) if p.name.startswith("window=")] == ["window=0000", "window=0001"]
    assert load_windows(str(out)) == three_days


def test_cli_writes_the_windows_and_refuses_a_bad_duration(stream, tmp_path: Path, capsys):
    sources, ts = stream
    command = ["prepare", "--sources", sources, "--output", str(tmp_path / "out"), "--workers", "1", "--quiet"]
    command += ["--group-size", "2", "--micro-batch-size", "2", "--min-len", "1"]
    assert main([*command, "--time-window", "1x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--time-window: expected a duration" in err
    assert main([*command, "--time-window", "1d"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("window=0000 [") and f"{ts.size:,} valid events: {ts.size:,} in windows" in lines[-1]
    assert len(load_windows(str(tmp_path / "out")).datasets(str(tmp_path / "out"))) == len(lines) - 1


def test_census_on_early_workers_gives_the_same_windows(stream, tmp_path: Path):
    """The CLI hands its early workers over: the census runs on them, then the first window's job owns them."""
    from freescale.pipeline.executors.processes import start_pool

    sources, _ = stream
    alone = prepare_windows(window_config(sources, tmp_path / "alone"), DAY)
    pool = start_pool(1)
    pooled = prepare_windows(window_config(sources, tmp_path / "pooled", workers=2), DAY, pool)
    same = [(w.name, w.start, w.end, w.events, w.samples, w.fingerprint) for w in alone.windows]
    assert [(w.name, w.start, w.end, w.events, w.samples, w.fingerprint) for w in pooled.windows] == same
    assert (pooled.events_valid, pooled.events_in_windows) == (alone.events_valid, alone.events_in_windows)
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(int)  # stopped with the job


def test_windows_without_events_are_listed_not_written(stream, tmp_path: Path):
    sources, ts = stream
    last_day = int(ts.max() // DAY)
    out = tmp_path / "out"
    index = prepare_windows(window_config(sources, out, time_range=(last_day * DAY, (last_day + 3) * DAY)), DAY)
    assert [w.events > 0 for w in index.windows] == [True, False, False]
    assert [w.path for w in index.windows] == ["window=0000", None, None]
    assert index.datasets(str(out)) == [str(out / "window=0000")] and not (out / "window=0001").exists()
    with pytest.raises(PrepareError, match="no valid events inside --time-range"):
        prepare_windows(window_config(sources, tmp_path / "none", time_range=(0, DAY)), DAY)


# --------------------------------------------------------------------------- windows the filters empty
START = 1_600_041_600  # 2020-09-14 00:00 UTC


def csv_stream(root: Path, days: list[list[tuple[int, int]]]) -> str:
    """A CSV source whose day ``d`` holds the (user, item) events of ``days[d]``, a minute apart."""
    rows = [
        f"{user},{item},{START + d * DAY + 60 * k}\n"
        for d, events in enumerate(days)
        for k, (user, item) in enumerate(events)
    ]
    (root / "log.csv").write_text("u,i,t\n" + "".join(rows))
    (root / "sources.toml").write_text(
        '[[sources]]\nname = "log"\nformat = "csv"\nheader = true\npath = "log.csv"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\n'
    )
    return str(root / "sources.toml")


def short_middle_day(root: Path) -> str:
    """Three days; on the second each of 4 users has one event (below the default --min-len 2)."""
    full = [(user, user * 10 + k) for user in range(1, 5) for k in range(3)]
    return csv_stream(root, [full, [(user, user * 10) for user in range(1, 5)], full])


def filters_config(sources: str, output: Path, overwrite: bool = False, **options):
    samples = SampleConfig(max_uih_len=2048, **options)
    return make_config(sources, str(output), samples=samples, overwrite=overwrite)


def test_a_window_the_filters_empty_has_no_dataset_and_its_events_are_counted(tmp_path: Path, monkeypatch):
    """A last partial day where each user had one event failed the whole run ("window=0001 ...: no
    samples left after filtering") after the earlier windows were written."""
    out = tmp_path / "out"
    index = prepare_windows(filters_config(short_middle_day(tmp_path), out), DAY)
    assert [(w.events, w.samples, w.path) for w in index.windows] == [
        (12, 4, "window=0000"),
        (4, 0, None),
        (12, 4, "window=0002"),
    ]
    skipped = index.windows[1]
    assert skipped.filtered == {"min_len": 4} and index.filtered_out() == [skipped]
    assert skipped.skipped.startswith("no samples left after filtering: each of the 4 users has fewer than --min-len 2")
    assert index.balanced and index.events_in_windows == index.events_valid == 28
    assert index.datasets(str(out)) == [str(out / "window=0000"), str(out / "window=0002")]
    assert sorted(p.name for p in out.iterdir()) == ["window=0000", "window=0002", "windows.json"]  # no work left
    assert not list(tmp_path.glob(".out*")) and load_windows(str(out)) == index
    runs = {"n": 0}
    run = PrepareJob.run

    def counted(job):
        runs["n"] += 1
        return run(job)

    monkeypatch.setattr(PrepareJob, "run", counted)
    before = (out / "windows.json").read_bytes()
    assert prepare_windows(filters_config(str(tmp_path / "sources.toml"), out), DAY) == index
    assert runs["n"] == 2 and (out / "windows.json").read_bytes() == before  # the skipped window is not read again


def test_k_core_and_min_len_are_counted_apart_in_a_window_without_samples(tmp_path: Path):
    shared = [(user, k + 1) for user in range(1, 5) for k in range(3)] + [(5, 100), (5, 101)]  # 5: unique items
    sources = csv_stream(tmp_path, [shared, [(user, k + 1) for user in range(1, 5) for k in range(5)]])
    index = prepare_windows(filters_config(sources, tmp_path / "out", kcore=2, min_len=4), DAY)
    assert [w.path for w in index.windows] == [None, "window=0001"]
    assert index.windows[0].filtered == {"kcore": 2, "min_len": 12} and index.windows[0].events == 14
    assert "after --kcore 2" in index.windows[0].skipped


def test_a_dataset_of_a_window_now_filtered_out_is_replaced_only_with_overwrite(tmp_path: Path):
    sources, out = short_middle_day(tmp_path), tmp_path / "out"
    prepare_windows(filters_config(sources, out, min_len=1), DAY)
    assert (out / "window=0001" / "manifest.json").exists()
    with pytest.raises(PrepareError, match="already holds a different prepared dataset"):
        prepare_windows(filters_config(sources, out), DAY)
    overwritten = prepare_windows(filters_config(sources, out, overwrite=True), DAY)
    assert overwritten.windows[1].path is None and not (out / "window=0001").exists()
    assert load_windows(str(out)) == overwritten


def test_a_run_where_no_window_keeps_a_sample_fails_in_one_line(tmp_path: Path, capsys):
    sources = short_middle_day(tmp_path)
    out = tmp_path / "out"
    command = ["prepare", "--sources", sources, "--output", str(out), "--workers", "1", "--quiet"]
    command += ["--group-size", "2", "--micro-batch-size", "2", "--time-window", "1d"]
    assert main([*command, "--min-len", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no window has a sample: the filters dropped every event of the 3 windows" in err
    assert "window=0000: no samples left after filtering: each of the 4 users has fewer than --min-len 4" in err
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    assert main(command) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("window=0001 [") and "no dataset: no samples left after filtering" in lines[1]
    assert "no dataset for window=0001: the filters dropped all 4 of their events" in lines[-1]


def test_an_index_of_the_first_version_still_loads(stream, tmp_path: Path):
    sources, _ = stream
    index = prepare_windows(window_config(sources, tmp_path / "out"), DAY)
    data = json.loads((tmp_path / "out" / "windows.json").read_text())
    data["schema_version"] = 1
    for entry in data["windows"]:
        del entry["skipped"], entry["filtered"]
    (tmp_path / "out" / "windows.json").write_text(json.dumps(data))
    assert load_windows(str(tmp_path / "out")).datasets("x") == index.datasets("x")
