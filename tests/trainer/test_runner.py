"""The runner's choices (trainer/engine_choices.py): ``overlap_choice``."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("requested", "device", "cores", "threads", "expected"),
    [
        ("auto", "cpu", 1, 1, "none"),  # the comm thread would take the compute's only core
        ("auto", "cpu", 2, 1, "pec"),
        ("auto", "cpu", 4, 4, "none"),
        ("auto", "cuda", 1, 1, "pec"),  # communication runs on its own stream
        ("pec", "cpu", 1, 1, "pec"),  # an explicit choice is kept
        ("none", "cuda", 8, 1, "none"),
    ],
)
def test_auto_overlap_is_pec_where_its_thread_has_room(
    requested: str, device: str, cores: int, threads: int, expected: str
) -> None:
    from freescale.trainer.engine_choices import overlap_choice

    assert overlap_choice(requested, device, cores, threads) == expected
