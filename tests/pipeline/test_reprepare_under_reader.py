"""A dataset prepared again (``freescale prepare --overwrite``, another process) while a reader and a
loader have it open (issue 30.2). They kept the old manifest and offsets but reopened shard files by
path and hashed a shard only on first read, so they read the new rows under the old plan without any
error. Now what a reader already opened it keeps reading (held open), and a shard it opens later
stops it with one line naming the dataset."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from train_cli import FREESCALE

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.dataset.loader import Config, Loader
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.shard_files import DatasetChangedError

OPTIONS = ["--group-size", "4", "--micro-batch-size", "4", "--workers", "1", "--memory-limit", "512MB",
           "--shard-size-limit", "64KB", "--quiet"]  # fmt: skip


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[str, str]:
    """Two different source sets (other seeds: other users, items and lengths)."""
    root = tmp_path_factory.mktemp("reprepare-src")
    for name, seed in (("a", 21), ("b", 22)):
        generate(preset("tiny", seed=seed, n_users=800), str(root / name))  # ~4 shards of 64 KB
    return str(root / "a" / "sources.toml"), str(root / "b" / "sources.toml")


def prepare(sources: str, output: str, *extra: str) -> None:
    """``freescale prepare`` in its own process, as a user re-preparing the dataset would run it."""
    result = subprocess.run(
        [FREESCALE, "prepare", "--sources", sources, "--output", output, *OPTIONS, *extra],
        capture_output=True, text=True, timeout=300, cwd=Path(sources).parent, env=dict(os.environ),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def rows(samples: list[dict]) -> list[tuple]:
    return [(int(s["user_id"]), int(s["window"]), tuple(np.asarray(s["item_ids"]).tolist())) for s in samples]


def keep_reading(dataset: PreparedDataset, reference: PreparedDataset) -> tuple[int, list[str]]:
    """Read every micro-batch: each must be the opened dataset's or a one-line ``DatasetChangedError``."""
    same, errors = 0, []
    for m in range(reference.n_micro_batches):
        try:
            got = dataset.micro_batch(m)
        except DatasetChangedError as error:
            errors.append(str(error))
            continue
        assert rows(got) == rows(reference.micro_batch(m)), f"micro-batch {m}: another dataset's rows"
        same += 1
    return same, errors


def test_a_reader_and_a_loader_open_while_the_dataset_is_prepared_again(sources, tmp_path) -> None:
    first, second = sources
    out = str(tmp_path / "prepared")
    prepare(first, out)
    reference = PreparedDataset(str(shutil.copytree(out, tmp_path / "reference")))
    assert len(reference.shards) >= 4  # small shards: some are opened before the overwrite, some after

    dataset = PreparedDataset(out)
    opened = [0, 1]
    for m in opened:
        assert rows(dataset.micro_batch(m)) == rows(reference.micro_batch(m))
    config = Config(path=out, output="samples", num_workers=1, prefetch_factor=1)
    loader = Loader(config)
    batches = iter(loader)
    head = [next(batches) for _ in range(2)]
    fingerprint = json.loads(Path(out, "manifest.json").read_text())["fingerprint"]

    prepare(second, out, "--overwrite")
    assert json.loads(Path(out, "manifest.json").read_text())["fingerprint"] != fingerprint

    # the reader: what it opened still reads as the dataset it opened; the rest stops it in one line
    same, errors = keep_reading(dataset, reference)
    assert same >= len(opened) and errors, (same, errors)
    for message in errors:
        assert "\n" not in message and message.startswith(f"{out} was replaced (prepared again?)")
    with pytest.raises(DatasetChangedError):
        dataset.vocabulary("item")  # later metadata reads too

    # the loader (a worker process reading ahead): the batches it yields are the opened dataset's,
    # until one whose shard was not open yet stops it with the same one line
    expected = list(Loader(Config(path=str(tmp_path / "reference"), output="samples", num_workers=0)))
    got = head
    with pytest.raises(DatasetChangedError) as stopped:
        for batch in batches:
            got.append(batch)
    assert "\n" not in str(stopped.value) and str(stopped.value).startswith(f"{out} was replaced")
    assert [rows(b.samples) for b in got] == [rows(b.samples) for b in expected[: len(got)]]
    loader.close()

    # a reader opened now reads the new dataset
    fresh = PreparedDataset(out)
    assert fresh.info.fingerprint != fingerprint and len(fresh.micro_batch(0)) > 0


def test_a_remote_reader_open_while_the_dataset_is_prepared_again(sources, s3_bucket, tmp_path) -> None:
    """The same on ``s3://``: ``--overwrite`` deletes and rewrites objects in place, and the shards a
    reader had cached (or a new reader re-caches) may be the new dataset's."""
    first, second = sources
    out = f"s3://{s3_bucket}/prepared"
    prepare(first, out, "--work-dir", str(tmp_path / "work"))
    cache = str(tmp_path / "cache")
    reference = PreparedDataset(out, cache_dir=str(tmp_path / "ref-cache"))
    reference_rows = [rows(reference.micro_batch(m)) for m in range(reference.n_micro_batches)]
    dataset = PreparedDataset(out, cache_dir=cache)
    assert rows(dataset.micro_batch(0)) == reference_rows[0]

    prepare(second, out, "--overwrite", "--work-dir", str(tmp_path / "work"))
    PreparedDataset(out, cache_dir=cache).micro_batch(0)  # a new reader re-caches the new shards

    same, errors = 0, []
    for m in range(len(reference_rows)):
        try:
            got = rows(dataset.micro_batch(m))
        except DatasetChangedError as error:
            errors.append(str(error))
            continue
        assert got == reference_rows[m], f"micro-batch {m}: another dataset's rows"
        same += 1
    assert same >= 1 and errors and all(e.startswith(f"{out} was replaced") for e in errors)


def test_a_rank_whose_dataset_changed_stops_with_one_line(tmp_path, monkeypatch, capsys) -> None:
    """The trainer reads through the loader: a rank that meets a replaced (or damaged) dataset mid-run
    prints one line and exits 1, as for any other error that ends a run, not a traceback."""
    from freescale.trainer import launch, runner
    from freescale.trainer.config_toml import write_run_toml

    data = str(tmp_path / "prepared")
    config = write_run_toml(tmp_path / "run.toml", {"data": {"path": data}})
    message = f"{data} was replaced (prepared again?) while this reader had it open"

    def replaced(cfg, evaluate_checkpoint=None):
        raise DatasetChangedError(message)

    monkeypatch.setattr(runner, "main", replaced)
    monkeypatch.setattr(launch, "die_with_parent", lambda signal: None)  # not in the test process
    monkeypatch.setenv("RANK", "1")
    assert launch.rank_main(["--config", config]) == 1
    assert capsys.readouterr().err == f"freescale train: error: rank 1: {message}\n"
