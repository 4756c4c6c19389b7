"""Identity-table figures in the run's metrics (trainer/metrics/zch.py)."""

from __future__ import annotations

import pytest

from freescale.trainer.metrics.zch import summarize_zch, zch_lines, zch_step_metrics


def _extra(table: str, lookups: float, hits: float, inserts: float, occupied: float) -> dict[str, float]:
    counts = {"lookups": lookups, "hits": hits, "inserts": inserts, "evictions": 0.0, "collisions": 0.0,
              "admission_waits": 0.0, "evicted_age_sum": 0.0, "occupied": occupied, "slots": 16.0}  # fmt: skip
    return {f"zch.{table}.{name}": value for name, value in counts.items()}


def test_tables_with_dots_in_their_names_keep_their_own_figures() -> None:
    """``user.user_id`` is one table: its counters must not merge into a table called ``user``."""
    ranks = [_extra("item", 10, 6, 4, 8) | _extra("user.user_id", 4, 1, 3, 5), _extra("user.user_id", 6, 6, 0, 7)]
    step = zch_step_metrics(ranks)["zch"]
    assert sorted(step) == ["item", "user.user_id"]
    assert step["user.user_id"]["lookups"] == 10 and step["user.user_id"]["hit_rate"] == pytest.approx(0.7)
    assert step["user.user_id"]["occupancy"] == pytest.approx(12 / 32)
    summary = summarize_zch([ranks, ranks])
    assert summary["zch"]["user.user_id"]["insert_rate"] == pytest.approx(0.3)
    assert any(line.startswith("zch user.user_id: 20 lookups") for line in zch_lines(summary))
