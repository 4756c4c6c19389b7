"""CPU pinning (trainer/cpus.py)."""

from __future__ import annotations


def test_pin_to_cpus_gives_each_local_rank_its_own_cores() -> None:
    import os

    from freescale.trainer.cpus import pin_to_cpus

    allowed = os.sched_getaffinity(0)
    try:
        slices = []
        for rank in range(2):
            os.sched_setaffinity(0, allowed)
            slices.append(pin_to_cpus(rank, 2))
            assert os.sched_getaffinity(0) == set(slices[-1])
        if len(allowed) >= 2:
            assert not set(slices[0]) & set(slices[1])
        assert set(slices[0]) | set(slices[1]) <= allowed
    finally:
        os.sched_setaffinity(0, allowed)
