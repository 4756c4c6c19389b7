"""Zero-collision lookups cost a CUDA stream few host syncs and a bounded number of launches.

On CUDA a step's lookup of a few hundred ids is bound by per-call overhead: every host read of a device
value (``.item()``, ``bool()``, ``.tolist()``, an output sized by the data: ``nonzero``, ``unique``,
boolean-mask indexing) drains the stream. ``sync_count.counting_ops`` counts them (and the ops that
launch kernels) at the aten dispatch seam on CPU, so the bounds hold on machines without a GPU; the
CPU's own shortcuts (``kernels.zch.HOST_SHORTCUTS``: data-dependent sizes, free there) are off here.

The bounds: a read-only lookup reads the host once (the id check); a training lookup once for the id
check and once per run of proposal rounds (``FIRST_ROUNDS``, then twice as many each run: at most
four runs for 16 probes), usually once. Before the rounds ran masked over fixed shapes, a training
lookup of 720 ids cost 39 syncs on the table of the benchmark's shape and 77 through ``ZchShard``.
"""

from __future__ import annotations

import math

import pytest
import torch
from sync_count import OpCounts, counting_ops

import freescale.kernels.zch as zch
from freescale.kernels.zch import FIRST_ROUNDS, ZchTable
from freescale.kernels.zch_types import ZchConfig
from freescale.trainer.engines.zch_shard import ZchShard

IDS = 720  # ids of one bench_zch step (d_model 128, micro batch 32)
BENCH = {"zch_size": 75_008, "bucket_size": 64, "max_probe": 16}  # bench_zch's zch arm (75k rows)
POLICIES = {"lru": {}, "ttl": {"ttl": 500}, "lfu": {"admission_threshold": 2}}
# Launches of a training lookup of the benchmark's shape settled in the first run of rounds (today about 190,
# 200 and 320: lfu has a second victim key and the admission table).
TRAIN_LAUNCHES = {"lru": 240, "ttl": 250, "lfu": 380}
READ_LAUNCHES = 60  # read-only lookup (about 45 today)


@pytest.fixture(autouse=True)
def masked_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path a GPU runs: no host shortcuts."""
    monkeypatch.setattr(zch, "HOST_SHORTCUTS", False)


def settle_reads(max_probe: int) -> int:
    """Host reads of ``ZchTable._place`` at most: runs of FIRST_ROUNDS, 2·FIRST_ROUNDS, ... rounds."""
    return math.ceil(math.log2((max_probe + 1) / FIRST_ROUNDS + 1))


def only_host_reads(counts: OpCounts) -> bool:
    """No op sized by the data: every sync is one deliberate host read."""
    return set(counts.sync_ops) <= {"tolist"}


def stream(pool: int, calls: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, pool, (IDS,), generator=generator) for _ in range(calls)]


def train(table: ZchTable, ids: torch.Tensor, call: int) -> OpCounts:
    times = torch.full_like(ids, 100 * call) if table.config.policy == "ttl" else None
    with counting_ops() as counts:
        table.lookup(ids, times)
    return counts


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_training_lookup_of_the_benchmarks_shape_syncs_two_or_three_times(policy: str) -> None:
    table = ZchTable(ZchConfig(**BENCH, policy=policy, **POLICIES[policy]))
    counts = [train(table, ids, call) for call, ids in enumerate(stream(10**6, 12))]
    assert all(only_host_reads(c) for c in counts), [c.summary() for c in counts]
    assert max(c.syncs for c in counts) <= 3, [c.summary() for c in counts]
    assert sum(c.syncs for c in counts) <= 2.5 * len(counts), [c.summary() for c in counts]
    assert min(c.launches for c in counts) <= TRAIN_LAUNCHES[policy], [c.summary() for c in counts]
    assert int(table.counters[2]) > 0  # it inserted


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_crowded_evicting_table_syncs_once_per_run_of_rounds(policy: str) -> None:
    config = ZchConfig(zch_size=1024, bucket_size=64, max_probe=16, policy=policy, **POLICIES[policy])
    table = ZchTable(config)
    counts = [train(table, ids, call) for call, ids in enumerate(stream(3000, 15))]
    assert all(only_host_reads(c) for c in counts), [c.summary() for c in counts]
    assert max(c.syncs for c in counts) <= 1 + settle_reads(config.max_probe), [c.summary() for c in counts]
    assert int(table.counters[3]) > 0  # it evicted


def test_a_read_only_lookup_syncs_once() -> None:
    table = ZchTable(ZchConfig(**BENCH))
    ids = stream(10**6, 2)
    table.lookup(ids[0])
    with counting_ops() as counts:
        table.lookup(torch.cat([ids[0][:360], ids[1][:360]]), train=False)
    assert counts.syncs == 1 and only_host_reads(counts), counts.summary()
    assert counts.launches <= READ_LAUNCHES, counts.summary()


def test_the_trainers_shard_lookup_adds_no_sync_to_the_tables() -> None:
    shard = ZchShard(ZchConfig(**BENCH), 0, torch.device("cpu"), table=0, seed=0, bound=0.01)
    calls = stream(10**6, 6)
    for ids in calls[:-1]:
        shard.lookup(ids, None, True)
        shard.trained()
    with counting_ops() as counts:
        _, step = shard.lookup(calls[-1], None, True)
    assert step is not None and int(shard.table.step) == len(calls)
    assert torch.equal(step.reassigned_ids, shard.table.identities[step.reassigned - shard.first_row])
    assert counts.syncs <= 3 and only_host_reads(counts), counts.summary()
    assert counts.launches <= TRAIN_LAUNCHES["lru"] + 30, counts.summary()
    with counting_ops() as counts:
        shard.lookup(calls[0], None, False)  # evaluation while the last batch is ahead: from the trained state
    assert counts.syncs == 1 and only_host_reads(counts), counts.summary()
