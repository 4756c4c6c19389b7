"""Ranking metrics and the popularity baseline (trainer/eval/evaluate.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from freescale.trainer.eval.evaluate import metrics_from_ranks, popularity_metrics


def test_ranking_metrics_and_popularity_baseline() -> None:
    metrics = metrics_from_ranks(np.array([0, 1, 9, 10, 500]), k=10)
    assert metrics["hr@10"] == pytest.approx(3 / 5)
    assert metrics["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(11)) / 5)
    train = np.array([5, 5, 5, 7, 7, 1])
    popular = popularity_metrics(train, np.array([5, 7, 1, 2]), num_items=20, k=2)
    assert popular["hr@2"] == pytest.approx(0.5)  # 5 (rank 0) and 7 (rank 1) are hits
