"""Cost model: docs/design.md#cost-model coefficients, fitted-coefficient files, and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from freescale.model_config import ModelConfig
from freescale.pipeline.cost import CostModel
from freescale.trainer.learning_config import ModelExtraConfig
from freescale.trainer.simulate.calibrate import calibrate, fit
from freescale.trainer.simulate.calibrate import main as calibrate_main


def test_analytic_coefficients_follow_design_formulas() -> None:
    model = ModelConfig(d_model=256, num_layers=2, num_heads=4, num_negatives=0)
    cost = CostModel.from_model(model)
    # attention: 2·d·L² forward, ×(1 + 2.5) with backward; projections: 10·d²·L, ×3; loss: 2·d·L, ×3
    assert cost.a == pytest.approx(2 * 256 * 3.5 * 2)
    assert cost.b == pytest.approx(10 * 256**2 * 3 * 2 + 2 * 256 * 3)
    lengths = np.array([1, 100, 5 * 256, 21000])
    np.testing.assert_allclose(cost.cost(lengths), cost.a * lengths**2 + cost.b * lengths)


def test_attention_dominates_above_about_five_d() -> None:
    cost = CostModel.from_model(ModelConfig(d_model=256, num_layers=4, num_heads=4, num_negatives=0))
    crossover = cost.b / cost.a  # a·L² = b·L
    assert 2 * 256 < crossover < 8 * 256


def test_cost_model_from_file(tmp_path) -> None:
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps({"a": 1e-9, "b": 2e-6, "c": 1e-4}))
    cost = CostModel.from_file(str(path))
    assert cost.units == "seconds" and cost.origin == "file:fitted.json"
    assert cost.cost(np.array([1000]))[0] == pytest.approx(1e-3 + 2e-3 + 1e-4)


@pytest.mark.parametrize(
    ("content", "message"),
    [({"b": 1.0}, "missing coefficient"), ({"a": 1, "b": 1, "x": 2}, "unknown key"), ({"a": -1, "b": 1}, ">= 0")],
)
def test_cost_model_file_errors(tmp_path, content, message) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        CostModel.from_file(str(path))


def test_model_config_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match=r"model\.d_model"):
        ModelConfig(d_model=100, num_heads=3)
    with pytest.raises(ValueError, match="unknown option"):
        ModelConfig.from_dict({"d_model": 64, "dim": 3})


def test_calibration_fit_recovers_micro_batch_coefficients() -> None:
    """NNLS on micro-batch totals finds a, b, c and the per-micro-batch constant from exact data."""
    rng = np.random.default_rng(0)
    lengths = [rng.integers(3, 500, (4, 8, 16)[i % 3]).astype(float) for i in range(20)]
    truth = np.array([2e-7, 3e-5, 4e-4, 2e-3])
    features = np.array([[(s * s).sum(), s.sum(), len(s), 1.0] for s in lengths])
    np.testing.assert_allclose(fit(features, features @ truth), truth, rtol=1e-6)
    with pytest.raises(ValueError, match="non-negative"):
        flat = features.copy()
        flat[:, :2] = 0.0  # no length dependence at all: neither a nor b can be positive
        fit(flat, flat @ truth)


def test_calibrate_times_trainer_micro_batches_and_writes_a_cost_file(tmp_path) -> None:
    model = ModelConfig(d_model=8, num_layers=1, num_heads=2, num_negatives=4, max_uih_len=128)
    extra = ModelExtraConfig(num_items=100, num_actions=4, inbatch_negatives=2)
    path = tmp_path / "cost.json"
    cost = calibrate(model, extra, 128, str(path), micro_batch_size=4, mixed=6, points=3, rounds=3)
    assert cost.units == "seconds" and cost.a >= 0 and cost.b >= 0 and (cost.a > 0 or cost.b > 0)
    assert len(cost.details["seconds"]) == len(cost.details["lengths"]) == 9
    assert {len(ls) for ls in cost.details["lengths"]} == {2, 4, 8}  # c and d identifiable
    loaded = CostModel.from_file(str(path))
    assert (loaded.a, loaded.b, loaded.c) == (cost.a, cost.b, cost.c) and loaded.details["micro_batch_size"] == 4


def test_calibrate_command_validates_and_writes(tmp_path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(
        "[model]\nd_model = 8\nnum_layers = 1\nnum_heads = 2\nnum_negatives = 4\nmax_uih_len = 128\n"
        "[model_extra]\nnum_items = 100\nnum_actions = 4\ninbatch_negatives = 2\n"
    )
    out = tmp_path / "cost.json"
    assert calibrate_main(["--config", str(config), "--out", str(out), "--mixed", "3", "--rounds", "3"]) == 0
    assert CostModel.from_file(str(out)).origin == "calibrated"
    assert calibrate_main(["--config", str(config), "--out", str(out), "--rounds", "0"]) == 2


def test_calibrate_names_what_cannot_run_here(tmp_path, capsys, monkeypatch) -> None:
    """``--device cuda`` without a GPU, or the Triton attention on CPU without the interpreter: one line."""
    import pytest
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    config = tmp_path / "run.toml"
    config.write_text("[model]\nd_model = 8\nnum_layers = 1\nnum_heads = 2\nmax_uih_len = 64\n"
                      "[model_extra]\nnum_items = 50\nattention = 'triton'\n")  # fmt: skip
    out = str(tmp_path / "cost.json")
    assert calibrate_main(["--config", str(config), "--out", out]) == 2
    assert "model_extra.attention 'triton' cannot run here" in capsys.readouterr().err
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: --device cuda is valid here")
    assert calibrate_main(["--config", str(config), "--out", out, "--device", "cuda"]) == 2
    assert "--device cuda: no CUDA device is visible" in capsys.readouterr().err
