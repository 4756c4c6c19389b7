"""The zero-collision rounds kernel (``kernels/zch_triton.py``) through the Triton interpreter:
a table placing ids with it equals the per-id reference call after call, and the masked torch rounds on
calls as large as a training step's (buckets of 64, a full table, tiles of many ids)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from zch_streams import (
    assert_overwritten_undoes,
    configs,
    crowded_stream,
    host_shortcuts,
    kernel_equals_masked_rounds,
    owner_of,
    run_both,
    step_size_config,
    streams,
)

import freescale.kernels.zch as zch
from freescale.kernels.zch import ZchTable
from freescale.kernels.zch_types import ZchConfig

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


pytestmark = pytest.mark.usefixtures("triton_interpreter")


@SETTINGS
@given(configs(), streams())
def test_kernel_rounds_equal_the_reference(config: ZchConfig, calls: list) -> None:
    run_both(config, calls, shortcuts=False, triton_kernel=True)


@SETTINGS
@given(configs(), streams())
def test_restoring_what_a_kernel_call_overwrote_undoes_it(config: ZchConfig, calls: list) -> None:
    assert_overwritten_undoes(config, calls, shortcuts=False, triton_kernel=True)


@pytest.mark.parametrize("policy", ["ttl", "lru", "lfu"])
@pytest.mark.parametrize("seed", range(4))
def test_kernel_rounds_on_crowded_streams_equal_the_reference(policy: str, seed: int) -> None:
    config, calls = crowded_stream(policy, seed)
    totals = run_both(config, calls, shortcuts=False, triton_kernel=True).counters_dict()
    assert totals["evictions"] > 0 and totals["inserts"] > totals["evictions"]


@pytest.mark.parametrize(
    ("policy", "halflife", "world_size"), [("ttl", 0, 1), ("lru", 0, 2), ("lfu", 0, 1), ("lfu", 3, 2)]
)
def test_kernel_rounds_equal_the_masked_rounds_at_a_steps_size(policy: str, halflife: int, world_size: int) -> None:
    """Buckets of 64 probed 16 deep, 1,500 ids a call: tiles of up to 64 ids against the masked torch
    rounds (rows, reassigned rows, counts and state), on a whole table and on a rank's shard."""
    kernel_equals_masked_rounds(step_size_config(policy, halflife, world_size), device="cpu")


def test_tables_pick_the_kernel_only_on_cuda() -> None:
    config = ZchConfig(zch_size=8, bucket_size=4, max_probe=2)
    assert ZchTable(config).triton_kernel is False  # CPU: the host path or the masked torch rounds
    with host_shortcuts(False, triton_kernel=True):
        assert ZchTable(config).triton_kernel is True
    assert zch.TRITON_KERNEL is None


@pytest.mark.parametrize(("threshold", "in_kernel"), [(1, True), (2, False)])
def test_only_admission_keeps_the_torch_hits_and_writes(
    threshold: int, in_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without admission the kernel reads the hits and writes the metadata too (``_find`` and ``_apply``
    never run); with it, the admission counters sit between the hits and the rounds, so only the
    rounds are in the kernel."""
    called: list[str] = []
    for name in ("_find", "_apply", "_place_with_kernel"):
        original = getattr(ZchTable, name)
        monkeypatch.setattr(
            ZchTable, name, lambda self, *a, _o=original, _n=name, **k: called.append(_n) or _o(self, *a, **k)
        )
    config = ZchConfig(zch_size=16, bucket_size=4, max_probe=2, policy="lfu", admission_threshold=threshold)
    table = ZchTable(config)
    with host_shortcuts(False, triton_kernel=True):
        table.lookup(torch.tensor([5, 6, 5, 7]))
        table.lookup(torch.tensor([5, 8]))
    assert (called == []) == in_kernel, called


def test_environment_overrides_are_read_once_and_checked() -> None:
    """``FREESCALE_ZCH_KERNEL`` / ``FREESCALE_ZCH_HOST_SHORTCUTS``: 0 / 1 / unset, anything else refused
    naming the variable."""
    env = {"FREESCALE_ZCH_KERNEL": "1", "FREESCALE_ZCH_HOST_SHORTCUTS": "0"}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        assert zch.env_flag("FREESCALE_ZCH_KERNEL") is True
        assert zch.env_flag("FREESCALE_ZCH_HOST_SHORTCUTS") is False
        mp.setenv("FREESCALE_ZCH_KERNEL", "yes")
        with pytest.raises(ValueError, match="FREESCALE_ZCH_KERNEL: must be 0 or 1"):
            zch.env_flag("FREESCALE_ZCH_KERNEL")
        mp.delenv("FREESCALE_ZCH_KERNEL")
        assert zch.env_flag("FREESCALE_ZCH_KERNEL") is None


def test_bad_ids_in_a_kernel_call_are_refused_before_anything_changes() -> None:
    """The kernel path checks the ids in the host read that sizes its tile: a negative id, or one of
    another rank's buckets, gives the masked path's one-line error and leaves the table as it was."""
    config = ZchConfig(zch_size=16, bucket_size=4, max_probe=2, world_size=2)
    table = ZchTable(config, rank=0)
    mine = [raw for raw in range(200) if int(owner_of(config, torch.tensor([raw]))) == 0][:3]
    theirs = next(raw for raw in range(200) if int(owner_of(config, torch.tensor([raw]))) == 1)
    with host_shortcuts(False, triton_kernel=True):
        table.lookup(torch.tensor(mine))
        before = {k: v.clone() for k, v in table.state_dict().items()}
        with pytest.raises(ValueError, match=r"^ids: raw ids must be >= 0"):
            table.lookup(torch.tensor([mine[0], -5]))
        with pytest.raises(ValueError, match=r"^zch: ids of rank 1's buckets looked up on rank 0"):
            table.lookup(torch.tensor([mine[1], theirs]))
    assert all(torch.equal(before[k], v) for k, v in table.state_dict().items())
