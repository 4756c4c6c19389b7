"""Zero-collision table checks shared by the CPU, interpreter and GPU tests: random configurations and
id streams (hypothesis), crowded streams, and ``run_both``, which holds a ``ZchTable`` to the per-id
reference call after call (rows, reassigned rows, per-call counts, every state tensor)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from hypothesis import strategies as st

import freescale.kernels.zch as zch
from freescale.kernels.zch import ZchTable
from freescale.kernels.zch_hash import bucket_and_home
from freescale.kernels.zch_reference import ReferenceZchTable
from freescale.kernels.zch_types import ZchConfig

BIG = 2**63 - 1
Calls = list[tuple[list[int], list[int], bool]]


@st.composite
def configs(draw: st.DrawFn) -> ZchConfig:
    bucket_size = draw(st.integers(1, 5))
    world_size = draw(st.sampled_from([1, 2]))
    num_buckets = world_size * draw(st.integers(1, 2))
    policy = draw(st.sampled_from(["ttl", "lru", "lfu"]))
    return ZchConfig(
        zch_size=num_buckets * bucket_size,
        bucket_size=bucket_size,
        max_probe=draw(st.integers(1, bucket_size)),
        policy=policy,
        ttl=draw(st.integers(1, 12)) if policy == "ttl" else None,
        admission_threshold=draw(st.integers(1, 3)) if policy == "lfu" else 1,
        admission_slots=draw(st.integers(0, 4)),
        lfu_halflife=draw(st.integers(0, 3)) if policy == "lfu" else 0,
        world_size=world_size,
    )


@st.composite
def streams(draw: st.DrawFn) -> list[tuple[list[int], list[int], bool]]:
    """Calls of (ids, event times, train): ids from a small pool so they repeat and crowd the buckets."""
    pool = draw(st.lists(st.integers(0, BIG), min_size=1, max_size=40, unique=True))
    calls, now = [], 0
    for _ in range(draw(st.integers(1, 10))):
        ids = draw(st.lists(st.sampled_from(pool), min_size=0, max_size=25))
        if draw(st.booleans()):  # distinct and ascending: what an owner gets from one requester
            ids = sorted(set(ids))
        now += draw(st.integers(-3, 15))
        times = [now + draw(st.integers(-2, 2)) for _ in ids] if ids else []
        calls.append((ids, times, draw(st.booleans()) or not calls))
    return calls


@contextmanager
def host_shortcuts(on: bool, triton_kernel: bool | None = None) -> Iterator[None]:
    """``kernels.zch.HOST_SHORTCUTS`` set for a block: off, a CPU table runs the masked path a GPU runs;
    ``triton_kernel`` sets ``TRITON_KERNEL`` too (True: the rounds kernel, on CPU through the interpreter)."""
    previous = zch.HOST_SHORTCUTS, zch.TRITON_KERNEL
    zch.HOST_SHORTCUTS, zch.TRITON_KERNEL = on, triton_kernel
    try:
        yield
    finally:
        zch.HOST_SHORTCUTS, zch.TRITON_KERNEL = previous


def assert_same(table: ZchTable, reference: ReferenceZchTable) -> None:
    ours, theirs = table.state_dict(), reference.state_dict()
    for name in theirs:
        assert torch.equal(ours[name].cpu(), theirs[name]), name


def run_both(
    config: ZchConfig, calls: Calls, device: str = "cpu", shortcuts: bool = True, triton_kernel: bool | None = None
) -> ZchTable:
    """The table (``shortcuts``: with CPU's host shortcuts, else masked; ``triton_kernel``: ``host_shortcuts``)
    and the reference, call after call."""
    table, reference = ZchTable(config, device), ReferenceZchTable(config)
    for ids, times, train in calls:
        id_tensor, time_tensor = torch.tensor(ids, dtype=torch.int64), torch.tensor(times, dtype=torch.int64)
        with host_shortcuts(shortcuts, triton_kernel):
            got = table.lookup(id_tensor.to(device), time_tensor.to(device), train=train)
        want = reference.lookup(id_tensor, time_tensor, train=train)
        assert torch.equal(got.rows.cpu(), want.rows), (ids, train)
        assert torch.equal(got.reassigned.cpu(), want.reassigned)
        assert got.stats_dict() == want.stats_dict()
        assert_same(table, reference)
    return table


def crowded_stream(policy: str, seed: int) -> tuple[ZchConfig, Calls]:
    """Pools of 2-4x the table's rows and skewed draws: full windows, evictions and lost proposals in
    most calls (hypothesis' small examples reach them less often)."""
    generator = torch.Generator().manual_seed(seed)
    bucket_size = 1 + seed % 4
    config = ZchConfig(
        zch_size=2 * bucket_size * (1 + seed % 2),
        bucket_size=bucket_size,
        max_probe=1 + seed % bucket_size,
        policy=policy,
        ttl=2 + seed % 4 if policy == "ttl" else None,
        admission_threshold=1 + seed % 3 if policy == "lfu" else 1,
        admission_slots=(seed % 3) * 4,
        lfu_halflife=seed % 3 if policy == "lfu" else 0,
        world_size=2,
    )
    pool = torch.randint(0, 2**62, ((2 + seed % 3) * config.zch_size,), generator=generator)
    calls, now = [], 0
    for _ in range(30):
        size = int(torch.randint(1, 2 * config.zch_size, (), generator=generator))
        picks = (torch.rand(size, generator=generator) ** 2 * pool.numel()).long()
        now += int(torch.randint(-1, 7, (), generator=generator))
        ids = pool[picks].unique() if len(calls) % 2 else pool[picks]  # every other call distinct and ascending
        calls.append((ids.tolist(), [now] * ids.numel(), bool(torch.rand((), generator=generator) < 0.85)))
    return config, calls


def step_size_config(
    policy: str, halflife: int = 0, world_size: int = 1, zch_size: int = 1024, admission: bool = True
) -> ZchConfig:
    """Buckets of 64 probed 16 deep, as a training run's (the benchmark's), ``zch_size`` rows: crowded by
    ``steady_calls``; lfu with ``admission`` admits ids seen twice."""
    lfu_admits = policy == "lfu" and admission
    return ZchConfig(zch_size=zch_size, bucket_size=64, max_probe=16, policy=policy, world_size=world_size,
                     ttl=2 if policy == "ttl" else None, lfu_halflife=halflife,
                     admission_threshold=2 if lfu_admits else 1,
                     admission_slots=zch_size // 4 if lfu_admits else 0)  # fmt: skip


def steady_calls(config: ZchConfig, calls: int, size: int, seed: int) -> list[torch.Tensor]:
    """Skewed draws from a pool of 3x the table's rows: the table fills, then most calls evict."""
    generator = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, 2**62, (3 * config.zch_size,), generator=generator)
    return [pool[(torch.rand(size, generator=generator) ** 2 * pool.numel()).long()] for _ in range(calls)]


def owner_of(config: ZchConfig, ids: torch.Tensor) -> torch.Tensor:
    """The rank owning each id's bucket."""
    bucket, _ = bucket_and_home(ids, config.num_buckets, config.bucket_size)
    return bucket // (config.num_buckets // config.world_size)


def kernel_equals_masked_rounds(config: ZchConfig, device: str, calls: int = 8, size: int = 1_500) -> None:
    """A table placing ids with the Triton rounds kernel and one with the masked torch rounds, on the last
    rank's shard (``world_size`` > 1) or the whole table: the same rows, reassigned rows, counts and state
    after every call of ``steady_calls``, with evictions."""
    rank = config.world_size - 1 if config.world_size > 1 else None
    tables = {kernel: ZchTable(config, device, rank=rank) for kernel in (True, False)}
    for step, ids in enumerate(steady_calls(config, calls, size, seed=5)):
        owned = (ids[owner_of(config, ids) == rank] if rank is not None else ids).to(device)
        times = torch.full_like(owned, 3 * step)
        results = {}
        for kernel, table in tables.items():
            with host_shortcuts(False, triton_kernel=kernel):
                results[kernel] = table.lookup(owned, times)
        a, b = results[True], results[False]
        assert torch.equal(a.rows, b.rows) and torch.equal(a.reassigned, b.reassigned), step
        assert torch.equal(a.stats, b.stats), step
    state = {kernel: table.state_dict() for kernel, table in tables.items()}
    assert all(torch.equal(state[True][k], state[False][k]) for k in state[False])
    assert tables[True].counters_dict()["evictions"] > 0


def assert_overwritten_undoes(
    config: ZchConfig, calls: Calls, shortcuts: bool, triton_kernel: bool | None = None
) -> None:
    """Each training call's ``overwritten`` entries, restored with the counters and step it began with,
    give back the table exactly as before the call."""
    table = ZchTable(config)
    for ids, times, train in calls:
        before = {k: v.clone() for k, v in table.state_dict().items()}
        with host_shortcuts(shortcuts, triton_kernel):
            result = table.lookup(torch.tensor(ids, dtype=torch.int64), torch.tensor(times), train=train)
        if not train:
            continue
        assert result.overwritten is not None
        undone, old = {k: v.clone() for k, v in table.state_dict().items()}, result.overwritten
        for name in ("identities", "last_seen", "counts"):
            undone[name][old.slots] = getattr(old, name)
        undone["pending_ids"][old.pending] = old.pending_ids
        undone["pending_counts"][old.pending] = old.pending_counts
        undone["counters"], undone["step"] = before["counters"], before["step"]
        assert [k for k in before if not torch.equal(before[k], undone[k])] == []
