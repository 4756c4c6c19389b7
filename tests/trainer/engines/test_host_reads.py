"""Checks the engine runs every step read the device once, not once per tensor or per table: each host
read of a device value drains a CUDA stream (counted on CPU by ``sync_count``).

Whole steps (``step_syncs``: one rank, the PEC worker's tasks included, after warm-up): with the tables'
storage fused (``fused_tables.py``) and PEC's per-table row counts taken in one pass, the item/action
case costs 29 syncs a step synchronously and 49 with PEC, the four-table profile case 41 and 61; with
one tensor and optimizer per table and a boolean mask per table in every lookup and update they cost
40 / 93 and 62 / 140 (61 and 82 with PEC's row counts still two masks a table). Each routing read the
batch's latest event time from the device (the ttl clock, now taken at collation: ``Batch.latest_time``)
and the received entries' table ids sized their ``repeat_interleave`` on the device (now given the
size the counts already told the host): 31 / 55 and 43 / 68 before. Zero-collision tables run the
masked path a GPU runs (no CPU host shortcuts: ``kernels.zch.HOST_SHORTCUTS``).
"""

from __future__ import annotations

import pytest
import torch
from pec_check import OverlapCase, overlap_batches
from step_syncs import CASES, STEP_SYNCS, step_syncs
from sync_count import counting_ops

import freescale.kernels.zch as zch
from freescale.trainer.engines.engine import has_nonfinite
from freescale.trainer.runner import make_engine


@pytest.fixture(autouse=True)
def masked_zch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zch, "HOST_SHORTCUTS", False)


def test_the_nonfinite_check_reads_the_host_once_whatever_it_finds() -> None:
    loss = torch.tensor(2.5)
    grads = [torch.ones(4, 3), None, torch.zeros(2, 3), torch.ones(5, 3)]
    for poisoned, expected in ((None, False), (0, True), (2, True), ("loss", True)):
        case_grads = [g.clone() if g is not None else None for g in grads]
        case_loss = torch.tensor(float("nan")) if poisoned == "loss" else loss
        if isinstance(poisoned, int):
            case_grads[poisoned][1, 2] = float("inf")
        with counting_ops() as counts:
            found = has_nonfinite(case_loss, case_grads)
        assert found is expected, poisoned
        assert counts.syncs == 1, counts.summary()


def test_the_id_range_check_reads_each_table_once_and_names_it() -> None:
    from freescale.trainer.engines.input_dist import InputDistribution
    from freescale.trainer.engines.table_layout import TableSpec

    tables = InputDistribution.__new__(InputDistribution)  # only what the per-table dedup reads
    tables.specs = [TableSpec("item", 100, 4, ("item",)), TableSpec("action", 6, 4, ("action",))]
    tables.table_of, tables.device, tables.zch = {"item": 0, "action": 1}, torch.device("cpu"), [None, None]
    tables.world_size, tables.rows_per_rank = 1, [100, 6]
    with counting_ops() as counts:
        unique, _, _ = tables._unique_per_table({"item": torch.tensor([5, 99, 5]), "action": torch.tensor([0, 5])})
    assert [u.tolist() for u in unique] == [[5, 99], [0, 5]]
    assert counts.sync_ops["tolist"] == 2, counts.summary()  # the range check: one read per table
    for bad in (torch.tensor([3, 100]), torch.tensor([-1, 3])):
        with pytest.raises(ValueError, match=r"table item: ids must be in \[0, 100\)"):
            tables._unique_per_table({"item": bad, "action": torch.tensor([0])})


def test_table_stages_read_the_host_at_most_once_whatever_the_number_of_tables(gloo_world_of_one) -> None:
    """Lookups, updates and state reads of four tables (two zch) address one fused tensor: no read for a
    lookup, one for a mask, one for the update's duplicate sum (``unique``)."""
    case = OverlapCase(world_size=1, steps=1, profiles=True, zch_size=32)
    engine = make_engine(case.run_config("none"), 0, 1, torch.device("cpu"), "none")
    try:
        tables = engine.tables
        ctx = engine.start_routing(overlap_batches(case, 0)[0]).finish()
        size = ctx.recv_ids.numel()
        half, grads, keys = torch.arange(size) % 2 == 0, torch.ones(size, tables.dim), tables.row_keys(ctx)
        half_grads = grads[half]
        calls = {
            "lookup": (lambda: tables.lookup(ctx), 0),
            "masked lookup": (lambda: tables.lookup(ctx, half), 1),
            "state_rows": (lambda: tables.state_rows(ctx), 0),
            "masked state_rows": (lambda: tables.state_rows(ctx, half), 1),
            "sparse_update": (lambda: tables.sparse_update(ctx, grads), 1),
            "masked sparse_update": (lambda: tables.sparse_update(ctx, half_grads, half), 2),
            "sparse_update_keys": (lambda: tables.sparse_update_keys(keys, grads), 1),
        }
        assert len(tables.specs) == 4 and len(set(ctx.recv_table.tolist())) == 4
        for name, (call, most) in calls.items():
            with counting_ops() as counts:
                call()
            assert counts.syncs <= most, f"{name}: {counts.summary()}"
    finally:
        engine.close()


@pytest.mark.parametrize(("case", "overlap"), sorted(STEP_SYNCS))
def test_a_steady_engine_step_reads_the_host_a_bounded_number_of_times(
    gloo_world_of_one, case: str, overlap: str
) -> None:
    counts = step_syncs(OverlapCase(world_size=1, steps=4, **CASES[case]), overlap)
    steady = counts[1:-1]  # the first step routes its own batch, the last prefetches nothing
    assert max(c.syncs for c in steady) <= STEP_SYNCS[case, overlap], [c.summary() for c in steady]
