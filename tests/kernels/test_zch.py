"""Zero-collision tables: the vectorised ``ZchTable`` equals the per-id reference call after call.

Rows, reassigned rows, per-call counts and every state tensor are compared after each call of random
id streams (repeats, ids crowding few buckets, time that moves on and sometimes back) under every
policy, in training and evaluation calls. Then bad input, checkpoint resume and the batch rules on small
hand-made cases. The hash is tested in test_zch_hash.py, the configuration in test_zch_types.py.
"""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zch_streams import (
    BIG,
    assert_overwritten_undoes,
    assert_same,
    configs,
    crowded_stream,
    run_both,
    streams,
)

import freescale.kernels.zch as zch
from freescale.kernels.zch import ZchTable
from freescale.kernels.zch_hash import bucket_and_home
from freescale.kernels.zch_reference import ReferenceZchTable
from freescale.kernels.zch_rounds import Rounds, first_true
from freescale.kernels.zch_types import COUNTERS, ZchConfig

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(configs(), streams(), st.booleans())
def test_vectorised_equals_reference(config: ZchConfig, calls: list, shortcuts: bool) -> None:
    table = run_both(config, calls, shortcuts=shortcuts)
    totals = table.counters_dict()
    assert totals["hits"] + totals["collisions"] <= totals["lookups"]
    assert totals["evictions"] <= totals["inserts"]
    assert int((table.identities >= 0).sum()) == totals["inserts"] - totals["evictions"]


@SETTINGS
@given(configs(), streams(), st.data())
def test_evaluation_reads_only(config: ZchConfig, calls: list, data: st.DataObject) -> None:
    table = run_both(config, calls)
    before = {k: v.clone() for k, v in table.state_dict().items()}
    ids = torch.tensor(data.draw(st.lists(st.integers(0, BIG), max_size=20)), dtype=torch.int64)
    result = table.lookup(ids, train=False)
    assert all(torch.equal(before[k], v) for k, v in table.state_dict().items())
    for raw_id, row in zip(ids.tolist(), result.rows.tolist(), strict=True):
        held = table.identities.tolist()
        assert row == (held.index(raw_id) if raw_id in held else config.fallback_row)
    assert result.reassigned.numel() == 0


@SETTINGS
@given(configs(), streams(), st.booleans())
def test_restoring_what_a_call_overwrote_undoes_it(config: ZchConfig, calls: list, shortcuts: bool) -> None:
    """A training call's ``overwritten`` entries, restored with the counters and step it began with, give
    back the table exactly as before the call (the trainer's checkpoints while a batch is looked up ahead)."""
    assert_overwritten_undoes(config, calls, shortcuts)


@SETTINGS
@given(st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=8))
def test_first_true_is_the_first_set_column(rows: list[list[bool]]) -> None:
    want = [row.index(True) if True in row else 0 for row in rows]
    assert first_true(torch.tensor(rows)).tolist() == want


def test_bad_input() -> None:
    table = ZchTable(ZchConfig(zch_size=8, bucket_size=4, max_probe=4, policy="ttl", ttl=5))
    with pytest.raises(ValueError, match=r"^times: policy 'ttl'"):
        table.lookup(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"^ids: raw ids must be >= 0"):
        table.lookup(torch.tensor([-1]), torch.tensor([0]))
    table.lookup(torch.tensor([1, 2]), train=False)  # evaluation needs no times


@pytest.mark.parametrize("policy", ["ttl", "lru", "lfu"])
def test_resume_continues_bit_for_bit(policy: str) -> None:
    config = ZchConfig(
        zch_size=32,
        bucket_size=8,
        max_probe=4,
        policy=policy,
        ttl=30 if policy == "ttl" else None,
        admission_threshold=2 if policy == "lfu" else 1,
        admission_slots=16,
    )
    generator = torch.Generator().manual_seed(7)
    calls = []
    for step in range(40):
        ids = torch.randint(0, 200, (48,), generator=generator) ** 2  # skewed: a few hot ids
        calls.append((ids, step * 10 + torch.randint(0, 10, (48,), generator=generator)))
    straight = ZchTable(config)
    for ids, times in calls[:20]:
        straight.lookup(ids, times)
    buffer = io.BytesIO()
    torch.save(straight.state_dict(), buffer)
    buffer.seek(0)
    resumed = ZchTable(config)
    resumed.load_state_dict(torch.load(buffer))
    for ids, times in calls[20:]:
        a, b = straight.lookup(ids, times), resumed.lookup(ids, times)
        assert torch.equal(a.rows, b.rows) and torch.equal(a.reassigned, b.reassigned)
        assert torch.equal(a.stats, b.stats)
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    assert straight.counters_dict()["evictions"] > 0


def test_checkpoint_of_another_layout_is_refused() -> None:
    state = ZchTable(ZchConfig(zch_size=32, bucket_size=8, max_probe=4)).state_dict()
    with pytest.raises(ValueError, match=r"^zch: checkpoint layout"):
        ZchTable(ZchConfig(zch_size=32, bucket_size=4, max_probe=4)).load_state_dict(state)


def home_of(config: ZchConfig, raw_id: int) -> tuple[int, int]:
    bucket, home = bucket_and_home(torch.tensor([raw_id]), config.num_buckets, config.bucket_size)
    return int(bucket), int(home)


def ids_with_home(config: ZchConfig, bucket: int, home: int, count: int) -> list[int]:
    found, raw_id = [], 0
    while len(found) < count:
        if home_of(config, raw_id) == (bucket, home):
            found.append(raw_id)
        raw_id += 1
    return found


def test_batch_rules_by_hand() -> None:
    """Three ids with one home slot in a 2-slot bucket: the first two (by first occurrence) take the
    home slot and the next; the third is a collision. Repeats count per occurrence; an id already held
    is protected from eviction in the call that sees it."""
    config = ZchConfig(zch_size=2, bucket_size=2, max_probe=2, policy="lru")
    a, b, c = ids_with_home(config, 0, 0, 3)
    table = ZchTable(config)
    result = table.lookup(torch.tensor([b, a, b, c]))
    assert result.rows.tolist() == [0, 1, 0, config.fallback_row]
    assert result.reassigned.tolist() == [0, 1]
    assert result.stats_dict() == dict(zip(COUNTERS, [4, 0, 2, 0, 1, 0, 0], strict=True))
    result = table.lookup(torch.tensor([c, a]))  # a is held: c evicts b (least recent), not a
    assert result.rows.tolist() == [0, 1]
    assert result.stats_dict()["evictions"] == 1 and result.stats_dict()["evicted_age_sum"] == 1
    assert table.identities.tolist() == [c, a]


def test_ttl_waits_for_expiry_and_lfu_admits_after_threshold() -> None:
    config = ZchConfig(zch_size=1, bucket_size=1, max_probe=1, policy="ttl", ttl=10)
    table = ZchTable(config)
    table.lookup(torch.tensor([5]), torch.tensor([100]))
    assert table.lookup(torch.tensor([6]), torch.tensor([110])).rows.tolist() == [1]  # 10 s: not yet
    result = table.lookup(torch.tensor([6]), torch.tensor([111]))
    assert result.rows.tolist() == [0] and result.stats_dict()["evicted_age_sum"] == 11

    config = ZchConfig(zch_size=4, bucket_size=4, max_probe=4, policy="lfu", admission_threshold=3)
    table = ZchTable(config)
    assert table.lookup(torch.tensor([9, 9])).rows.tolist() == [4, 4]
    assert table.lookup(torch.tensor([9])).stats_dict()["inserts"] == 1
    assert table.counts[table.identities == 9].tolist() == [3] and table.pending_ids.tolist().count(9) == 0


@pytest.mark.parametrize("shortcuts", [True, False], ids=["host-shortcuts", "masked"])
@pytest.mark.parametrize("policy", ["ttl", "lru", "lfu"])
@pytest.mark.parametrize("seed", range(6))
def test_crowded_streams_equal_reference(policy: str, seed: int, shortcuts: bool) -> None:
    """``crowded_stream``: full windows, evictions and lost proposals in most calls."""
    config, calls = crowded_stream(policy, seed)
    totals = run_both(config, calls, shortcuts=shortcuts).counters_dict()
    assert totals["evictions"] > 0 and totals["inserts"] > totals["evictions"]


def test_host_scratch_is_clean_after_every_call_even_a_failed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proposal rounds' table-sized buffers outlive a CPU call (so a call does not pay for the table's
    size); a call that stops halfway must leave them as clean as one that finishes."""
    config = ZchConfig(zch_size=32, bucket_size=8, max_probe=4, policy="lru")
    table, reference = ZchTable(config), ReferenceZchTable(config)
    pool = torch.randint(0, 2**62, (96,), generator=torch.Generator().manual_seed(3))

    def clean() -> bool:
        claimed, winner = table._host_scratch()
        return bool((claimed == 0).all()) and bool((winner == torch.iinfo(torch.int64).max).all())

    for start in range(0, 96, 24):
        ids = pool[start : start + 24]
        assert torch.equal(table.lookup(ids).rows, reference.lookup(ids).rows)
        assert clean()
    original = Rounds.play

    def fail_after_one_round(self: Rounds, slots: int) -> None:
        original(self, slots)
        raise RuntimeError("stopped")

    monkeypatch.setattr(Rounds, "play", fail_after_one_round)
    with pytest.raises(RuntimeError, match="stopped"):
        table.lookup(torch.randint(0, 2**62, (24,), generator=torch.Generator().manual_seed(4)))
    assert clean()


@pytest.mark.parametrize("halflife", [0, 2])
def test_lfu_halflife_lets_an_id_that_stopped_appearing_give_its_slot_up(halflife: int) -> None:
    """One bucket of two slots: a popular id (10 sightings) stops appearing and a new id comes every call.
    Without decay its count wins every eviction, so the new ids evict one another and it keeps its slot
    for good; with a halflife of 2 calls its count halves every 2 calls unseen, and once it is down to the
    new ids' the older of the two (it) gives its slot up."""
    config = ZchConfig(zch_size=2, bucket_size=2, max_probe=2, policy="lfu", lfu_halflife=halflife)
    table, reference = ZchTable(config), ReferenceZchTable(config)
    for ids in [torch.tensor([7] * 10), *(torch.tensor([new_id]) for new_id in range(100, 112))]:
        assert torch.equal(table.lookup(ids).rows, reference.lookup(ids).rows)
        assert_same(table, reference)
    assert (7 in table.identities.tolist()) == (halflife == 0)


def test_lfu_breaks_count_ties_by_age_then_distance() -> None:
    config = ZchConfig(zch_size=2, bucket_size=2, max_probe=2, policy="lfu")
    (p,), (q, r) = ids_with_home(config, 0, 1, 1), ids_with_home(config, 0, 0, 2)
    table = ZchTable(config)
    table.lookup(torch.tensor([p]))  # slot 1, count 1, seen at call 1
    table.lookup(torch.tensor([q]))  # slot 0, count 1, seen at call 2
    assert table.lookup(torch.tensor([r])).reassigned.tolist() == [1]  # equal counts: the older goes
    table.lookup(torch.tensor([q, q]))  # q: count 3
    assert table.lookup(torch.tensor([p])).reassigned.tolist() == [1]  # r (count 1) goes, not q


@pytest.mark.parametrize("policy", ["ttl", "lru", "lfu"])
def test_large_calls_compacting_on_cpu_equal_masked_rounds(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU the proposal rounds of a call of at least ``COMPACT_MIN_ROWS`` ids shrink to the ids still
    live, and a read-only call probes only the ids not in their home slot; the slots, rows, counters and
    state must be those of the masked path (a GPU's)."""
    lfu = policy == "lfu"
    config = ZchConfig(zch_size=2048, bucket_size=16, max_probe=8, policy=policy, ttl=3 if policy == "ttl" else None,
                       admission_threshold=2 if lfu else 1, admission_slots=512 if lfu else 0)  # fmt: skip
    generator = torch.Generator().manual_seed(7)
    pool = torch.randint(0, 2**62, (12_000,), generator=generator)
    calls = [(pool[(torch.rand(6_000, generator=generator) ** 2 * pool.numel()).long()], torch.full((6_000,), t))
             for t in range(6)]  # fmt: skip
    results = []
    for threshold, shortcuts in ((1_000, True), (10**9, False)):  # compacting, masked throughout
        monkeypatch.setattr(zch, "COMPACT_MIN_ROWS", threshold)
        monkeypatch.setattr(zch, "HOST_SHORTCUTS", shortcuts)
        table = ZchTable(config)
        looked = [table.lookup(ids, times) for ids, times in calls]
        looked.append(table.lookup(pool[:6_000], train=False))  # held and unknown ids, read only
        results.append((looked, table.state_dict()))
    (compact, compact_state), (masked, masked_state) = results
    for a, b in zip(compact, masked, strict=True):
        assert torch.equal(a.rows, b.rows) and torch.equal(a.reassigned, b.reassigned) and torch.equal(a.stats, b.stats)
    assert all(torch.equal(compact_state[k], masked_state[k]) for k in masked_state)
    assert int(compact[-2].stats[COUNTERS.index("evictions")]) > 0  # crowded: rounds with lost proposals


def held_past_an_empty_slot(table: ZchTable) -> list[int]:
    """Held ids with an empty slot between their home slot and their own (none may be: reads stop there)."""
    held = table.identities.tolist()
    bad = []
    for slot, raw_id in enumerate(held):
        if raw_id < 0:
            continue
        window = table.window(torch.tensor([raw_id])).squeeze(0).tolist()
        if any(held[s] < 0 for s in window[: window.index(slot)]):
            bad.append(raw_id)
    return bad


@SETTINGS
@given(configs(), streams(), st.data())
def test_home_first_reads_equal_the_reference(config: ZchConfig, calls: list, data: st.DataObject) -> None:
    """Large CPU reads stop at a home slot that is empty: right only because no id is ever held past an
    empty slot of its window. Both are checked on every stream, with the large-call path forced."""
    import freescale.kernels.zch as zch

    table = run_both(config, calls)
    assert held_past_an_empty_slot(table) == []
    held = [raw_id for raw_id in table.identities.tolist() if raw_id >= 0]
    ids = data.draw(st.lists(st.sampled_from([*held, 0, 7, BIG]), max_size=30))
    query = torch.tensor(ids, dtype=torch.int64)
    masked = table.lookup(query, train=False)
    previous = zch.COMPACT_MIN_ROWS
    zch.COMPACT_MIN_ROWS = 0
    try:
        home_first = table.lookup(query, train=False)
    finally:
        zch.COMPACT_MIN_ROWS = previous
    assert torch.equal(home_first.rows, masked.rows) and torch.equal(home_first.stats, masked.stats)
