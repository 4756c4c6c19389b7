"""2-rank gloo training runs on tiny generated data, through ``freescale train`` (torchrun).

One uninterrupted FreeScale run (checkpoints after steps 1 and 24 and at the end) serves several
tests: loss decreases, outputs and instrumentation, the sharded step equals a single-process
reference, and a second run resumed from step 24 (mid-epoch; the next epoch starts at step 28) must
reproduce its loss curve bit for bit. The TorchRec baseline and an ``s3://`` run train on the same
data and must match its losses. Every run reads two user-profile tables (``USER_TABLES``: the exact
``age_bucket`` and a hashed ``country_id``), so each of these comparisons covers them too.
Processes run with cwd = a temp dir so the repository's ``datasets/`` cannot shadow Hugging Face's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from s3_upload import upload_tree
from train_cli import STEPS, losses, prepare_tiny, run_toml, train

from freescale.pipeline.dataset.reader import PreparedDataset, RankReader

pytestmark = pytest.mark.slow
USER_TABLES = {"age_bucket": {}, "country_id": {"ids": "hashed", "rows": 16}}


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> str:
    return prepare_tiny(tmp_path_factory.mktemp("trainer-data"))


@pytest.fixture(scope="module")
def run_a(tiny_dataset, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("run-a")
    config = run_toml(
        root / "run.toml",
        tiny_dataset,
        root / "out",
        checkpoint={"dir": str(root / "ckpt"), "steps": [1, 24]},
        engine={"overlap": "pec"},  # auto would pick none here: 2 ranks share 2 cores
        user_tables=USER_TABLES,
    )
    result = train(config, root)
    return {"root": root, "out": root / "out", "ckpt": root / "ckpt", "config": config, "stdout": result.stdout}


def test_loss_decreases_and_eval_runs(run_a) -> None:
    curve = losses(run_a["out"])
    assert sorted(curve) == list(range(STEPS))
    trained = [curve[s] for s in range(STEPS) if curve[s] is not None]  # empty steps log loss null
    first, last = np.mean(trained[:5]), np.mean(trained[-5:])
    assert last < 0.7 * first, (first, last)
    report = json.loads((run_a["out"] / "bubbles.json").read_text())
    evaluation = report["evals"][-1]["eval"]
    assert evaluation["protocol"] == "full" and evaluation["users"] > 100
    assert 0.0 <= evaluation["ndcg@10"] <= evaluation["hr@10"] <= 1.0
    assert "straggler%" in run_a["stdout"]  # the bubble table printed on rank 0
    assert report["transport"] == "torch" and "transport=torch" in run_a["stdout"]  # auto on CPU: torch
    assert report["overlap"] == "pec" and "overlap=pec" in run_a["stdout"]
    steps = [json.loads(line) for line in (run_a["out"] / "metrics.jsonl").read_text().splitlines() if "loss" in line]
    assert steps and all(line["transport"] == "torch" for line in steps)


def test_instrumentation_parts_add_up_to_wall_time(run_a) -> None:
    out = run_a["out"]
    report = json.loads((out / "bubbles.json").read_text())
    rank_steps = report["rank_steps"]
    assert len(rank_steps) == 2 * STEPS
    for part in rank_steps:
        measured = part["compute"] + part["data"] + part["comm"] + part["idle"]
        assert abs(measured - part["wall"]) <= 0.05 * part["wall"], part
        assert min(part["compute"], part["data"], part["comm"], part["idle"]) >= 0, part
        # PEC: routing and NOL lookups of later steps run on the worker thread
        later = {"forward", "backward", "gradient_comm", "sparse_update", "dense_update", "data"}
        first = later | {"input_dist", "embedding_lookup", "embedding_comm"}
        assert set(part["stages"]) >= (first if part["step"] == 0 else later), part
    summary = report["summary"]
    assert summary["bubble_pct"] == pytest.approx(summary["straggler_pct"] + summary["exposed_comm_pct"])
    assert 0 <= summary["straggler_pct"] <= 100 and summary["samples_per_s"] > 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "loss" in line]
    assert {"straggler_pct", "exposed_comm_pct", "bubble_pct", "samples_per_s"} <= set(steps[0])
    assert {"embedding_comm_ms", "embedding_comm_ol_ms", "embedding_comm_nol_ms"} <= set(steps[0])
    assert 0.0 <= steps[0]["batch_overlap_rate"]["item"] <= 1.0 and "batch_overlap_rate" not in steps[-1]
    assert 0.0 <= summary["embedding_comm"]["nol_hidden_pct"] <= 100.0
    trace = json.loads((out / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}
    assert (out / "timeline.png").stat().st_size > 10_000 and (out / "summary.txt").exists()


def test_sharded_step_equals_single_process_reference(run_a, tiny_dataset) -> None:
    import torch.distributed.checkpoint as dcp
    from reference import ReferenceTrainer

    from freescale.trainer.config import RunConfig
    from freescale.trainer.data.batches import collate
    from freescale.trainer.run_data import run_tables
    from freescale.trainer.runner import step_seed

    dataset = PreparedDataset(tiny_dataset)
    cfg, _, collate_cfg = run_tables(RunConfig.from_toml(run_a["config"]), dataset)  # tables sized as the run's
    reference = ReferenceTrainer(cfg)
    batches = [
        collate(next(iter(RankReader(dataset, 2, rank, step=0, num_steps=1)))[1], collate_cfg, 0, rank)
        for rank in range(2)
    ]
    rank_losses = reference.step(batches, [step_seed(cfg.engine.seed, 0, rank) for rank in range(2)])
    assert losses(run_a["out"])[0] == pytest.approx(np.mean(rank_losses), rel=1e-6)
    state = {
        "model": {k: torch.zeros_like(v) for k, v in reference.model.state_dict().items()},
        "tables": {
            f"tables.{spec.name}.weight": torch.zeros_like(t) for spec, t in zip(reference.specs, reference.tables)
        },
    }
    dcp.load(state, checkpoint_id=str(run_a["ckpt"] / "step_00000001"))
    for name, value in reference.model.state_dict().items():
        torch.testing.assert_close(state["model"][name], value, atol=1e-6, rtol=1e-5, msg=name)
    for spec, table in zip(reference.specs, reference.tables):
        torch.testing.assert_close(state["tables"][f"tables.{spec.name}.weight"], table, atol=1e-6, rtol=1e-5)
    initial = ReferenceTrainer(cfg).tables
    assert [spec.name for spec in reference.specs[2:]] == ["user.age_bucket", "user.country_id"]
    for t in (0, 2, 3):  # the step did change rows: items and both profile tables
        assert not torch.equal(initial[t], reference.tables[t]), reference.specs[t].name


def test_resume_reproduces_the_uninterrupted_loss_curve(run_a, tmp_path) -> None:
    import torch.distributed.checkpoint as dcp

    config = run_toml(
        tmp_path / "resume.toml",
        json.loads((run_a["out"] / "bubbles.json").read_text())["config"]["data"]["path"],
        tmp_path / "out",
        checkpoint={"dir": str(tmp_path / "ckpt"), "resume": str(run_a["ckpt"] / "step_00000024")},
        eval={"max_users": 0},
        user_tables=USER_TABLES,
    )
    train(config, tmp_path)
    full, resumed = losses(run_a["out"]), losses(tmp_path / "out")
    assert sorted(resumed) == list(range(24, STEPS))
    assert [resumed[s] for s in resumed] == [full[s] for s in resumed]  # exactly
    shapes = {"tables.item.weight": (1000, 32), "tables.item.momentum": (1000,), "tables.action.weight": (8, 32),
              "tables.user.age_bucket.weight": (7, 32), "tables.user.country_id.weight": (16, 32)}  # fmt: skip
    finals = []
    for ckpt in (run_a["ckpt"], tmp_path / "ckpt"):
        state = {"tables": {key: torch.zeros(shape) for key, shape in shapes.items()}}
        dcp.load(state, checkpoint_id=str(ckpt / f"step_{STEPS:08d}"))
        finals.append(state["tables"])
    for key in shapes:
        assert torch.equal(finals[0][key], finals[1][key]), key


def test_torchrec_engine_learns_the_same_curve(run_a, tiny_dataset, tmp_path) -> None:
    config = run_toml(
        tmp_path / "torchrec.toml", tiny_dataset, tmp_path / "out", eval={"max_users": 0}, user_tables=USER_TABLES
    )
    train(config, tmp_path, "--engine", "torchrec")
    report = json.loads((tmp_path / "out" / "bubbles.json").read_text())
    assert report["engine"] == "torchrec" and "TrainPipelineSparseDist" in report["pipeline"]
    ours, theirs = losses(run_a["out"]), losses(tmp_path / "out")
    assert sorted(theirs) == list(range(STEPS))
    trained = [s for s in range(STEPS) if ours[s] is not None]
    assert [s for s in range(STEPS) if theirs[s] is not None] == trained
    np.testing.assert_allclose([theirs[s] for s in trained], [ours[s] for s in trained], rtol=2e-3)
    assert np.mean([theirs[s] for s in trained[-5:]]) < 0.7 * np.mean([theirs[s] for s in trained[:5]])
    assert report["summary"]["world_size"] == 2 and report["summary"]["samples_per_s"] > 0


def test_trains_streaming_from_s3(run_a, tiny_dataset, s3_bucket, tmp_path) -> None:
    uri = upload_tree(tiny_dataset, s3_bucket, "prepared")
    config = run_toml(
        tmp_path / "s3.toml",
        uri,
        tmp_path / "out",
        data={"max_steps": 6, "cache_dir": str(tmp_path / "cache")},
        eval={"max_users": 0},
        user_tables=USER_TABLES,
    )
    train(config, tmp_path)
    streamed, local = losses(tmp_path / "out"), losses(run_a["out"])
    assert [streamed[s] for s in range(6)] == [local[s] for s in range(6)]
    assert list((tmp_path / "cache").rglob("shard.*.mds"))  # shards came through the local cache
