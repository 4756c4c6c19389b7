"""CPU placement of a rank's process: its own slice of the host's cores, and how many it has."""

from __future__ import annotations

import os


def pin_to_cpus(local_rank: int, local_world_size: int) -> list[int]:
    """Give each rank of this host its own slice of the allowed CPUs (threads started later inherit it).

    Why: ranks that migrate between cores, or share one, finish identical work at different times;
    on a small CPU host that jitter is most of the straggling left after balancing.
    """
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // max(1, local_world_size))
    mine = cpus[local_rank * share : (local_rank + 1) * share] or cpus
    os.sched_setaffinity(0, mine)
    return mine


def cores_per_rank(pinned: bool) -> int:
    """CPUs this rank can run on: its own slice when pinned, else a share of the host's with the local ranks."""
    cpus = len(os.sched_getaffinity(0))
    return cpus if pinned else max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
