"""Cost model: DESIGN §3 coefficients, fitted-coefficient files, and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from freescale.pipeline.cost import CostModel, ModelConfig


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
