"""``bench_zch``'s kernel point: ``ZchTable.lookup`` (``freescale.kernels.zch``) against TorchRec's
``HashZchManagedCollisionModule.remap`` on CPU, in read-only mode (the only mode TorchRec's CPU kernel
runs; its training mode is tried and the error recorded), on the same ids and table shape: empty
tables, tables full of other ids (every probe runs ``max_probe`` slots and falls back), ours also on a
table holding the queried ids (hits) and inserting (training mode). Then a steady training step's
lookup (a few hundred distinct ids, a few new, on a table kept full by lru eviction) with the CPU's
host shortcuts and without them (``kernels.zch.HOST_SHORTCUTS``: the masked path a GPU runs), on the
same calls; with ``--device cuda`` also on a CUDA table, its proposal rounds as masked torch ops and in
the Triton rounds kernel. ``s``: ``bench_zch.Settings`` (``kernel_*``, ``bucket_size``, ``max_probe``, ``seed``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from measure import describe


def time_call(fn: Any, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_inserts(config: Any, ids: Any, repeats: int) -> float:
    """Median seconds of a training lookup of ``ids`` into a fresh empty table (every id inserts)."""
    from freescale.kernels.zch import ZchTable

    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        table = ZchTable(config)
        t0 = time.perf_counter()
        table.lookup(ids, train=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


@dataclass(frozen=True)
class SteadySpec:
    """A steady training lookup: ``ids`` distinct ids a call, ``new`` of them new, the rest drawn from the
    ids alive (0.9x the ``slots``, the oldest retiring as new ones arrive), ``calls`` warm-up calls then as
    many timed; the table's ``bucket_size`` / ``max_probe`` (lru)."""

    slots: int
    ids: int
    new: int
    calls: int
    bucket_size: int
    max_probe: int
    seed: int = 0

    @staticmethod
    def of(s: Any, slots: int | None = None) -> SteadySpec:
        """``bench_zch.Settings``' steady step (``kernel_step_*``), on ``slots`` slots if given."""
        return SteadySpec(slots or s.kernel_step_slots, s.kernel_step_ids, s.kernel_step_new, s.kernel_step_calls,
                          s.bucket_size, s.max_probe, s.seed)  # fmt: skip


def steady_calls(spec: SteadySpec) -> list[Any]:
    """``spec.calls`` warm-up calls, then as many timed (``SteadySpec``)."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed)
    alive = torch.randint(0, 2**62, (int(0.9 * spec.slots),), dtype=torch.int64, generator=gen)
    calls = []
    for _ in range(2 * spec.calls):
        new = torch.randint(0, 2**62, (spec.new,), dtype=torch.int64, generator=gen)
        old = alive[torch.randperm(len(alive), generator=gen)[: spec.ids - spec.new]]
        calls.append(torch.cat([old, new]).unique())
        alive = torch.cat([alive[spec.new :], new])
    return calls


def time_steady(
    spec: SteadySpec, calls: list[Any], shortcuts: bool, device: str = "cpu", triton_kernel: bool | None = None
) -> dict[str, Any]:
    """Median seconds per call over five chunks of the timed calls, after the warm-up calls (``device``:
    where the table lives, the ids moved there first; ``triton_kernel``: ``kernels.zch.TRITON_KERNEL``)."""
    import torch

    import freescale.kernels.zch as zch
    from freescale.kernels.zch_types import ZchConfig

    config = ZchConfig(zch_size=spec.slots, bucket_size=spec.bucket_size, max_probe=spec.max_probe)
    table, previous = zch.ZchTable(config, device), (zch.HOST_SHORTCUTS, zch.TRITON_KERNEL)
    zch.HOST_SHORTCUTS, zch.TRITON_KERNEL = shortcuts, triton_kernel
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    calls = [ids.to(device) for ids in calls]
    try:
        warm, timed = calls[: spec.calls], calls[spec.calls :]
        for ids in warm:
            table.lookup(ids, train=True)
        chunks = [timed[i::5] for i in range(5)]
        per_call = []
        for chunk in chunks:
            sync()
            t0 = time.perf_counter()
            for ids in chunk:
                table.lookup(ids, train=True)
            sync()
            per_call.append((time.perf_counter() - t0) / len(chunk))
    finally:
        zch.HOST_SHORTCUTS, zch.TRITON_KERNEL = previous
    return {"median_s": statistics.median(per_call), "occupancy": table.occupancy(),
            "counters": table.counters_dict()}  # fmt: skip


PATHS = {"cuda": ("masked", "kernel"), "cpu": ("masked", "host_shortcuts")}  # (baseline, ours) per device


def compare_paths(spec: SteadySpec, device: str, calls: list[Any] | None = None) -> dict[str, Any]:
    """``PATHS[device]`` on the same steady calls, the baseline first: on CUDA the masked torch path against
    the Triton kernel (``kernels/zch_triton.py``, a CUDA table's default), on CPU against the host
    shortcuts. Both must decide the same (counters). ``<path>_ms`` per call and ``speedup`` (baseline
    over ours). ``calls``: ``steady_calls(spec)`` if the caller made them already."""
    calls = steady_calls(spec) if calls is None else calls
    timed = {}
    for path in PATHS[device]:
        kernel = (path == "kernel") if device == "cuda" else None
        timed[path] = time_steady(spec, calls, path == "host_shortcuts", device, triton_kernel=kernel)
    baseline, ours = (timed[path] for path in PATHS[device])
    if baseline["counters"] != ours["counters"]:
        raise AssertionError(f"the two paths decided differently: {baseline['counters']} vs {ours['counters']}")
    return {"slots": spec.slots, "ids": spec.ids, "new_ids": spec.new, "occupancy": ours["occupancy"],
            "evictions": ours["counters"]["evictions"],
            **{f"{path}_ms": 1e3 * timed[path]["median_s"] for path in PATHS[device]},
            "speedup": baseline["median_s"] / ours["median_s"]}  # fmt: skip


def steady_step(s: Any) -> dict[str, Any]:
    """A steady training step's lookup with and without the CPU's host shortcuts (the same calls), and with
    them on a ``kernel_step_large_slots`` table (the same calls again: what a larger table adds per call)."""
    spec = SteadySpec.of(s)
    calls = steady_calls(spec)
    paths = compare_paths(spec, "cpu", calls)
    large = time_steady(SteadySpec.of(s, s.kernel_step_large_slots), calls, True)
    ours_s, masked_s = paths["host_shortcuts_ms"] / 1e3, paths["masked_ms"] / 1e3
    return {"slots": s.kernel_step_slots, "ids": s.kernel_step_ids, "new_ids": s.kernel_step_new,
            "calls_timed": s.kernel_step_calls, "occupancy": paths["occupancy"],
            "shortcuts_s": ours_s, "masked_s": masked_s, "masked_over_shortcuts": paths["speedup"],
            "large_slots": s.kernel_step_large_slots, "large_table_shortcuts_s": large["median_s"],
            "large_over_small": large["median_s"] / ours_s}  # fmt: skip


def kernel_point(s: Any) -> dict[str, Any]:
    """``ZchTable.lookup`` against TorchRec's ``HashZchManagedCollisionModule.remap`` on CPU."""
    import torch

    torch.manual_seed(s.seed)
    # one thread for both: TorchRec's CPU probe is a sequential loop, and torch ops run with several
    # threads on a busy 2-core host slow down many times over (160 ms against 12 ms, measured)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        point = {**_kernel_point(s), "steady_training": steady_step(s)}
        if s.device == "cuda":
            point["steady_training_cuda"] = compare_paths(SteadySpec.of(s), "cuda")
        return point
    finally:
        torch.set_num_threads(threads)


def _kernel_point(s: Any) -> dict[str, Any]:
    import torch

    from freescale.kernels.zch import ZchTable
    from freescale.kernels.zch_types import ZchConfig

    slots, buckets = s.kernel_slots, s.kernel_slots // s.bucket_size
    config = ZchConfig(zch_size=slots, bucket_size=s.bucket_size, max_probe=s.max_probe, policy="lru")
    gen = torch.Generator().manual_seed(s.seed)

    def random_ids(n: int) -> torch.Tensor:
        return torch.randint(0, 2**62, (n,), dtype=torch.int64, generator=gen)

    empty = ZchTable(config)
    full = ZchTable(config)
    for _ in range(4):  # fill with other ids: every slot held (lru evicts once a probe window is full)
        full.lookup(random_ids(slots), train=True)
    holding = ZchTable(config)
    held = random_ids(int(0.75 * slots))
    holding.lookup(held, train=True)
    result: dict[str, Any] = {"slots": slots, "bucket_size": s.bucket_size, "max_probe": s.max_probe,
                              "threads": torch.get_num_threads(), "occupancy_full": full.occupancy(),
                              "occupancy_holding": holding.occupancy(), "rows": []}  # fmt: skip
    try:
        from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
        from torchrec.sparse.jagged_tensor import JaggedTensor

        def torchrec_module(fill: bool) -> Any:
            module = HashZchManagedCollisionModule(zch_size=slots, device=torch.device("cpu"),
                                                   total_num_buckets=buckets, max_probe=s.max_probe)  # fmt: skip
            if fill:
                module._hash_zch_identities.data.copy_(random_ids(slots).view(-1, 1))
            return module.eval()

        tr_empty, tr_full = torchrec_module(False), torchrec_module(True)
        probe = tr_empty.train()
        try:
            probe.remap({"item": JaggedTensor(values=random_ids(16), lengths=torch.tensor([16]))})
            result["torchrec_train_mode_cpu"] = "ran"
        except Exception as error:  # the CPU kernel is read-only
            result["torchrec_train_mode_cpu"] = describe(error, 400)
        tr_empty.eval()
        result["torchrec_error"] = None
    except Exception as error:
        tr_empty = tr_full = None
        result["torchrec_error"] = describe(error, 1000)
    for n in s.kernel_batches:
        queries = random_ids(n)
        hits = held[torch.randint(0, len(held), (n,), generator=gen)]
        row: dict[str, Any] = {"ids": n}
        row["ours_empty_s"] = time_call(lambda q=queries: empty.lookup(q, train=False), s.kernel_repeats)
        row["ours_full_miss_s"] = time_call(lambda q=queries: full.lookup(q, train=False), s.kernel_repeats)
        row["ours_hits_s"] = time_call(lambda q=hits: holding.lookup(q, train=False), s.kernel_repeats)
        row["ours_insert_s"] = time_inserts(config, queries, s.kernel_repeats)
        if tr_empty is not None:
            feature = {"item": JaggedTensor(values=queries, lengths=torch.tensor([n]))}
            row["torchrec_empty_s"] = time_call(lambda f=feature: tr_empty.remap(f), s.kernel_repeats)
            row["torchrec_full_miss_s"] = time_call(lambda f=feature: tr_full.remap(f), s.kernel_repeats)
            row["ours_over_torchrec_empty"] = row["ours_empty_s"] / row["torchrec_empty_s"]
            row["ours_over_torchrec_full_miss"] = row["ours_full_miss_s"] / row["torchrec_full_miss_s"]
        row["million_ids_per_s"] = {k[:-2]: n / v / 1e6 for k, v in row.items() if k.endswith("_s")}
        result["rows"].append(row)
    return result
