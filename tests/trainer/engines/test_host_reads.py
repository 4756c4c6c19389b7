"""Checks the engine runs every step read the device once, not once per tensor: each host read of a
device value drains a CUDA stream (counted on CPU by ``sync_count``; the whole step's count, about
40 on one rank today, is in the stop notes of 2026-11-28)."""

from __future__ import annotations

import pytest
import torch
from sync_count import counting_ops

from freescale.trainer.engines.engine import has_nonfinite


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
    with counting_ops() as counts:
        unique, _ = tables._unique_per_table({"item": torch.tensor([5, 99, 5]), "action": torch.tensor([0, 5])})
    assert [u.tolist() for u in unique] == [[5, 99], [0, 5]]
    assert counts.sync_ops["tolist"] == 2, counts.summary()  # the range check: one read per table
    for bad in (torch.tensor([3, 100]), torch.tensor([-1, 3])):
        with pytest.raises(ValueError, match=r"table item: ids must be in \[0, 100\)"):
            tables._unique_per_table({"item": bad, "action": torch.tensor([0])})
