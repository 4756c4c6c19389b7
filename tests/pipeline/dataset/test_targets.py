"""``prepare --model-config`` builds samples for the model's window, and the manifest's ``targets``
section counts the events that no sample ever trains on (issue 30.1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.pipeline.steps.coverage import target_coverage
from freescale.pipeline.steps.sequences import planned_windows
from freescale.tools.cli import main as cli_main
from freescale.trainer.data.batches import collate

ITEMS_PER_USER = 1000  # event k of user u has item id u * 1000 + k


def trained_targets(counts: list[int], cfg: SampleConfig, model_len: int, holdout: int) -> set[int]:
    """Every event some sample trains on as a target: the samples ``prepare`` cuts, collated by the trainer."""
    keep, bounds = planned_windows(np.array(counts, np.int64), cfg)
    users = np.flatnonzero(keep)
    collate_cfg = CollateConfig(
        num_items=10**9, num_actions=1, max_len=model_len, num_negatives=1, inbatch_negatives=0,
        holdout_events=holdout, window_stride=cfg.window_stride,
    )  # fmt: skip
    samples = []
    for run, window, begin, end in zip(bounds["run"], bounds["window"], bounds["begin"], bounds["end"], strict=True):
        events = int(users[run]) * ITEMS_PER_USER + np.arange(begin, end, dtype=np.int64)
        user, length = int(users[run]), int(end - begin)
        samples.append({"item_ids": events, "actions": np.zeros(length, np.int64), "timestamps": events,
                        "length": length, "window": int(window), "cost": 1.0, "user_id": user})  # fmt: skip
    if not samples:
        return set()
    batch = collate(samples, collate_cfg, step=0, rank=0)
    return set(batch.item_ids[batch.target_index].tolist())


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    stride=st.integers(0, 6),
    max_len=st.integers(3, 14),  # above the held-out items (at 2, ``held_out`` cannot see a cut window's user)
    model_len=st.integers(2, 14),
    holdout=st.sampled_from([1, 2]),
    min_len=st.integers(1, 3),
)
def test_coverage_counts_exactly_the_events_the_trainer_never_targets(
    counts, stride, max_len, model_len, holdout, min_len
) -> None:
    cfg = SampleConfig(max_uih_len=max(max_len, min_len), window_stride=stride, min_len=min_len)
    coverage = target_coverage(np.array(counts), cfg, model_len, holdout)
    targets = trained_targets(counts, cfg, model_len, holdout)
    kept = [(u, n) for u, n in enumerate(counts) if n >= min_len]
    unavoidable = set()  # each user's first event and (evaluated users) the held-out items
    for user, n in kept:
        first = user * ITEMS_PER_USER
        unavoidable |= {first} | ({first + k for k in range(n - holdout, n)} if n >= holdout + 1 else set())
    never = {user * ITEMS_PER_USER + k for user, n in kept for k in range(n)} - targets - unavoidable
    assert coverage.targets == len(targets)
    assert coverage.events == sum(n for _, n in kept) and coverage.first_events == len(kept)
    assert coverage.held_out == sum(holdout for _, n in kept if n >= holdout + 1)
    assert coverage.never_target == len(never)
    assert coverage.events == coverage.targets + coverage.first_events + coverage.held_out + coverage.never_target


def test_half_window_strides_leave_nothing_out_and_one_long_sample_does() -> None:
    counts = np.array([3, 40, 500, 2001])
    windowed = target_coverage(counts, SampleConfig(max_uih_len=200, window_stride=100), 200)
    assert windowed.never_target == 0 and windowed.targets == counts.sum() - 4 - 2 * 4
    single = target_coverage(counts, SampleConfig(max_uih_len=21000), 200)
    # a user of n > 201 events trains on its 199 most recent targets before the held-out two
    assert single.never_target == (500 - 202) + (2001 - 202)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("targets-src")
    generate(preset("tiny", seed=4), str(out))
    return str(out / "sources.toml")


def prepare_cli(sources: str, output: Path, model: Path, *options: str) -> dict:
    args = ["prepare", "--sources", sources, "--output", str(output), "--model-config", str(model), "--quiet",
            "--workers", "1", "--group-size", "4", "--micro-batch-size", "8", "--memory-limit", "512MB"]  # fmt: skip
    assert cli_main([*args, *options]) == 0
    return json.loads((output / "manifest.json").read_text())


def test_prepare_builds_samples_for_the_models_window(sources, tmp_path, capsys) -> None:
    """``--model-config`` alone: samples of the model's ``max_uih_len``, windows every half window, no
    event left out; the manifest records what was applied and ``prepare`` prints it."""
    model = tmp_path / "model.toml"
    model.write_text("[model]\nd_model = 32\nnum_layers = 1\nnum_heads = 2\nnum_negatives = 8\nmax_uih_len = 16\n")
    manifest = prepare_cli(sources, tmp_path / "windowed", model)
    samples, targets = manifest["config"]["samples"], manifest["targets"]
    assert (samples["max_uih_len"], samples["window_stride"]) == (16, 8)
    assert manifest["lengths"]["max"] == 16 and manifest["rows"]["samples"] > manifest["rows"]["users"]
    assert targets["model_max_uih_len"] == 16 and targets["never_target"] == 0 and targets["targets"] > 0
    assert "0 never a target" in " ".join(capsys.readouterr().out.split())

    # samples longer than the model's window, one per user: the events the trainer never targets are
    # counted, and they are the ones the trainer's collation of this dataset leaves out
    manifest = prepare_cli(sources, tmp_path / "long", model, "--max-uih-len", "64", "--window-stride", "0")
    targets = manifest["targets"]
    assert (targets["max_uih_len"], targets["window_stride"]) == (64, 0) and targets["never_target"] > 0
    dataset = PreparedDataset(str(tmp_path / "long"))
    collate_cfg = CollateConfig(num_items=10**12, num_actions=10**6, max_len=16, num_negatives=1, inbatch_negatives=0)
    trained = sum(
        collate(dataset.micro_batch(m), collate_cfg, 0, 0).num_positions for m in range(dataset.n_micro_batches)
    )
    assert targets["targets"] == trained  # one sample per user: its targets are distinct events
    rows = manifest["rows"]
    assert targets["events"] == rows["events_used"] + rows["events_filtered"]["by_reason"]["truncated_max_uih_len"]
    out = " ".join(capsys.readouterr().out.split())
    assert f"{targets['never_target']:,} never a target" in out and "--window-stride 8" in out


def test_explicit_options_win_over_the_model(sources, tmp_path) -> None:
    model = tmp_path / "model.toml"
    model.write_text("[model]\nd_model = 32\nnum_layers = 1\nnum_heads = 2\nnum_negatives = 8\nmax_uih_len = 16\n")
    manifest = prepare_cli(sources, tmp_path / "out", model, "--window-stride", "0")
    assert (manifest["config"]["samples"]["max_uih_len"], manifest["config"]["samples"]["window_stride"]) == (16, 0)
