"""``engine.overlap = "auto"`` / ``engine.balancer = "auto"`` decided by the simulator's prediction
(trainer/simulate/auto.py, ``engine_choices.resolve_choices``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from train_cli import prepare_tiny, run_toml, train

from freescale.model_config import ModelConfig
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.trainer.config import RunConfig
from freescale.trainer.engine_choices import Choices, resolve_choices
from freescale.trainer.engine_config import EngineConfig
from freescale.trainer.loop_config import DataConfig
from freescale.trainer.simulate.auto import Probe, batch_overlap_rate, predict, probe
from freescale.trainer.simulate.sim_config import HardwareProfile

ISSUE_MODEL = ModelConfig(d_model=256, num_layers=4, num_heads=4, num_negatives=128)


def run_config(profile: str = "h100_nvlink_ib400", **engine: object) -> RunConfig:
    return RunConfig(
        model=ISSUE_MODEL, data=DataConfig(path="unused"), engine=EngineConfig(auto_profile=profile, **engine)
    )


def issue_probe(seed: int = 0) -> Probe:
    """The paper's lengths as issue 34 states them (lognormal, median 180, σ 1.153, cap 21,000), k = 8."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(np.log(180) + 1.153 * rng.standard_normal(4096)), 2, 21_000).astype(np.int64)
    return Probe(lengths, 0.1, 8, "planned")


def without_fixed_costs(tmp_path: Path) -> str:
    """The default profile with no fixed cost per micro-batch, layer or step: a step of ~1 ms at W = 256."""
    text = HardwareProfile.load("h100_nvlink_ib400").path
    body = Path(text).read_text()
    for key in ("per_micro_batch_s", "per_layer_s", "step_overhead_s"):
        body = "\n".join(f"{key} = 0.0" if line.startswith(f"{key} =") else line for line in body.splitlines())
    path = tmp_path / "no_fixed.toml"
    path.write_text(body + "\n")
    return str(path)


def test_batch_overlap_rate_is_the_share_of_a_steps_distinct_ids_the_previous_step_read() -> None:
    steps = [np.array([1, 2, 3, 3]), np.array([3, 4, 4, 5]), np.array([4, 5, 6, 7])]
    assert batch_overlap_rate(steps) == pytest.approx((1 / 3 + 2 / 4) / 2)
    assert batch_overlap_rate(steps[:1]) == 0.0


def test_auto_picks_pec_where_the_compute_hides_its_exchanges_and_none_where_it_cannot(tmp_path: Path) -> None:
    """Issue 34's table at W = 256: with the profile's measured fixed costs (a step of ~16 ms) PEC's
    one-step-ahead exchanges hide and it is faster; without them (a ~1 ms step) it is slower."""
    with_fixed = predict(run_config(), issue_probe(), 256, ("none", "pec"), ("none",))
    bare = predict(run_config(without_fixed_costs(tmp_path)), issue_probe(), 256, ("none", "pec"), ("none",))
    assert with_fixed.overlap == "pec" and with_fixed.step_ms["pec/none"] < with_fixed.step_ms["none/none"]
    assert bare.overlap == "none" and bare.step_ms["none/none"] < bare.step_ms["pec/none"]
    assert "pec/none" in with_fixed.line() and "-> overlap=pec" in with_fixed.line()
    assert with_fixed.inputs["W"] == 256 and with_fixed.inputs["batch_overlap_rate"] == 0.1


def test_auto_balancer_compares_the_online_arm_and_picks_the_fastest(tmp_path: Path) -> None:
    seen = issue_probe()
    seen.strategy = "random"  # random batching: the balancer has imbalance to remove
    both = predict(run_config(), seen, 64, ("none", "pec"), ("none", "online"))
    assert set(both.step_ms) == {"none/none", "none/online", "pec/none", "pec/online"}
    assert both.step_ms[f"{both.overlap}/{both.balancer}"] == min(both.step_ms.values())


def test_auto_all_to_all_goes_hierarchical_where_per_peer_latency_dominates() -> None:
    """Issue 34's table on 128 nodes of 8 (W = 1,024): routing through the node first is predicted
    faster for both engines (bench_scale: 0.964x); the prediction names the choice."""
    both = predict(run_config(), issue_probe(), 1024, ("none", "pec"), ("none",), ("flat", "hierarchical"), 8)
    assert set(both.step_ms) == {f"{o}/none/{a}" for o in ("none", "pec") for a in ("flat", "hierarchical")}
    for overlap in ("none", "pec"):
        assert both.step_ms[f"{overlap}/none/hierarchical"] < both.step_ms[f"{overlap}/none/flat"]
    assert both.all_to_all == "hierarchical" and "all_to_all=hierarchical" in both.line()
    assert both.to_dict()["all_to_all"] == "hierarchical"


def test_explicit_choices_are_never_predicted() -> None:
    cfg = run_config(overlap="pec", balancer="online")
    choices = resolve_choices(cfg, torch.device("cpu"), None, 4)  # no dataset read, no collective
    assert (choices.overlap, choices.balancer, choices.prediction) == ("pec", "online", None)


def test_resolve_choices_predicts_on_rank_zero_from_the_runs_own_data(tmp_path: Path) -> None:
    dataset = PreparedDataset(prepare_tiny(tmp_path))
    seen = probe(dataset, 2, seed=0)
    assert seen.micro_batch_size == 8 and 0.0 < seen.batch_overlap_rate <= 1.0 and seen.strategy == "planned"
    cfg = run_config(overlap="none", balancer="auto")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        choices = resolve_choices(cfg, torch.device("cpu"), dataset, 2)
    finally:
        dist.destroy_process_group()
    assert choices.overlap == "none" and choices.prediction is not None
    assert choices.balancer == choices.prediction["balancer"]
    assert set(choices.prediction["step_ms"]) == {"none/none", "none/online"}


def test_resolve_choices_predicts_the_all_to_all_over_whole_nodes(tmp_path: Path, monkeypatch) -> None:
    """``engine.all_to_all = "auto"`` on 2 nodes of 1 rank (the launcher's LOCAL_WORLD_SIZE): flat and
    hierarchical are both predicted and the pick is the prediction's; on one node nothing is predicted."""
    dataset = PreparedDataset(prepare_tiny(tmp_path))
    cfg = run_config(overlap="none", all_to_all="auto")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert resolve_choices(cfg, torch.device("cpu"), dataset, 2) == Choices("none", "none", None, "flat")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        choices = resolve_choices(cfg, torch.device("cpu"), dataset, 2)
    finally:
        dist.destroy_process_group()
    assert set(choices.prediction["step_ms"]) == {"none/none/flat", "none/none/hierarchical"}
    assert choices.all_to_all == choices.prediction["all_to_all"]


@pytest.mark.slow
def test_cli_auto_balancer_logs_the_prediction_next_to_the_pick(tmp_path: Path) -> None:
    prepared = prepare_tiny(tmp_path, seed=4)
    out = tmp_path / "run"
    config = run_toml(tmp_path / "auto.toml", prepared, out, data={"max_steps": 4}, eval={"max_users": 0},
                      engine={"balancer": "auto"})  # fmt: skip
    result = train(config, tmp_path)
    assert "engine auto: predicted step none/none" in result.stdout + result.stderr
    report = json.loads((out / "bubbles.json").read_text())
    assert report["auto_prediction"]["balancer"] == report["balancer"]
