"""PEC against the synchronous schedule and TorchRec at cluster scale: a projection sweep (simulate only).

Everything here is a **projection** of ``freescale simulate``'s model (docs/simulate.md), never a
measurement: no run of 64 or more ranks has happened. The workload is the paper's as its authors
describe it (issue 34): UIH lengths lognormal with median 180 and p95 1,200 (σ 1.153), cap 21,000;
the shipped ``h100_nvlink_ib400`` profile, whose fixed costs per micro-batch, per layer and per step
come from the H200 calibration (benchmarks/results/gpu/nvidia-h200/, see the profile).

1. **Fixed-cost split**: the aten operations one forward + backward of the calibrated model (HSTU,
   d_model 256, 4 heads) dispatches at 1 and 2 layers, counted on this CPU: the profile splits the
   measured fixed cost per micro-batch over the layers in this proportion.
2. **Sweep**: W ∈ {8, 64, 256, 1024} × model (d_model, layers, k) × ``batch_overlap_rate`` ∈
   {0.02, 0.1, 0.4}; arms ``plan/none`` (the planner, synchronous engine), ``plan/pec`` (the
   planner, PEC) and ``torchrec`` (TorchRec's pipeline schedule on random batching: the paper's
   baseline). Step time, exposed communication and their ratios side by side; the cut of exposed
   *embedding* communication (exposed communication less the dense all-reduce, which both keep on
   the critical path) against TorchRec is the paper's measure (up to 90.3% on 256 H100s).
3. **Hierarchical all-to-all** (``network.all_to_all``, the trainer's ``engine.all_to_all``): for
   the issue's model at rate 0.1, ``plan/none`` and ``plan/pec`` with every all-to-all through the
   node first, against flat, at each W: where the fewer messages per exchange pay.
4. **Break-even**: for the issue's model (d_model 256, 4 layers, k = 8), the step time above which
   PEC's step is no slower than the synchronous one at each W and rate: compute per step is raised
   from none (no fixed costs) until it hides PEC's one-step-ahead exchanges; the term that decides it
   is the larger part of those exchanges (latency per collective × their count, or bytes over the
   link), next to the compute it has to hide behind.

Targets (``target_met``): at W = 256 on the issue's table (d_model 256, 4 layers, k = 8, rate 0.1)
``plan/pec`` step time ≤ ``plan/none``; the hierarchical all-to-all no slower than flat at W = 256
(both engines); PEC's collectives per step ≤ TorchRec pipeline's + 1 (the
simulator's ``COLLECTIVES_PER_STEP``, which tests/trainer/engines/test_collective_counts.py pins
to the engines); the whole sweep under 2 minutes.

    python benchmarks/bench_scale.py            # ~1 minute on 2 idle cores; --quick: W 8, 64, one model
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from measure import Points, machine

RESULTS = Path(__file__).resolve().parent / "results" / "bench_scale.json"
PROFILE = "h100_nvlink_ib400"
LENGTHS = "lognormal:median=180,sigma=1.153,cap=21000"  # the paper's workload as issue 34 states it
WORLD_SIZES = (8, 64, 256, 1024)
RATES = (0.02, 0.1, 0.4)
ARMS = {"plan/none": ("plan", "none"), "plan/pec": ("plan", "pec"), "torchrec": ("random", "none")}
STEPS = 16
RUNTIME_TARGET_S = 120.0
PAPER_CUT_PCT = 90.3  # the paper: up to 90.3% less exposed communication than TorchRec on 256 H100s


@dataclass(frozen=True)
class Model:
    """One model size of the sweep: d_model, layers, micro-batch size k (negatives fixed at 128)."""

    d_model: int
    layers: int
    k: int

    @property
    def name(self) -> str:
        return f"d{self.d_model}-L{self.layers}-k{self.k}"


WORKS: dict[tuple[Any, int], tuple[dict[str, Any], Any]] = {}  # (model, W) -> (arm works, sample cost)
ISSUE_MODEL = Model(256, 4, 8)  # issue 34's table: d_model 256, 4 layers, k = 8 (global batch 2,048 at 256)
MODELS = (Model(256, 2, 8), ISSUE_MODEL, Model(512, 8, 16), Model(1024, 16, 64))


# ------------------------------------------------------------------------------------------ 1. split
def fixed_cost_split() -> dict[str, Any]:
    """Aten operations of one forward + loss + backward of the calibrated model at 1 and 2 layers."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from freescale.model_config import ModelConfig
    from freescale.pipeline.dataset.samples import CollateConfig
    from freescale.trainer.data.batches import collate
    from freescale.trainer.learning_config import ModelExtraConfig
    from freescale.trainer.simulate.calibrate import MicroBatchTimer, synthetic_samples

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops += 1
            return func(*args, **(kwargs or {}))

    extra = ModelExtraConfig(num_items=1000, num_actions=8)
    collate_cfg = CollateConfig(num_items=1000, num_actions=8, max_len=2048, num_negatives=128,
                                inbatch_negatives=extra.inbatch_negatives)  # fmt: skip
    samples = synthetic_samples([50, 80, 120, 200, 30, 60, 90, 300], 1000, np.random.default_rng(0))
    batch = collate(samples, collate_cfg, 0, 0, holdout=False)
    ops = {}
    for layers in (1, 2):
        model = ModelConfig(d_model=256, num_layers=layers, num_heads=4, num_negatives=128, max_uih_len=2048)
        timer = MicroBatchTimer(model, extra)
        timer.run(batch)  # first call: lazy initialisation outside the count
        counter = Count()
        with counter:
            timer.run(batch)
        ops[layers] = counter.ops
    per_layer = ops[2] - ops[1]
    outside = ops[1] - per_layer
    calibrated_layers = 4
    share = per_layer / (outside + calibrated_layers * per_layer)
    return {"ops_outside_layers": outside, "ops_per_layer": per_layer,
            "per_layer_share_of_fixed_cost_at_4_layers": share}  # fmt: skip


# ------------------------------------------------------------------------------------------ 2. sweep
def base_config(model: Model, w: int, rate: float) -> Any:
    from freescale.trainer.simulate.sim_config import HardwareProfile, SimConfig, WorkloadConfig

    profile = HardwareProfile.load(PROFILE)
    workload = WorkloadConfig(micro_batch_size=model.k, steps=STEPS, embedding_dim=model.d_model,
                              num_layers=model.layers, negatives=128, batch_overlap_rate=rate)  # fmt: skip
    return SimConfig(world_sizes=(w,), arms=("random", "plan"), compute=profile.compute, network=profile.network,
                     jitter=profile.jitter, workload=workload)  # fmt: skip


def without_fixed_costs(cfg: Any, extra_s: float = 0.0) -> Any:
    """``cfg`` with no fixed cost per micro-batch or layer and ``extra_s`` of compute per step."""
    return replace(cfg, compute=replace(cfg.compute, per_micro_batch_s=0.0, per_layer_s=0.0, step_overhead_s=extra_s))


def arm_works(model: Model, w: int, source: Any, fixed_costs: bool = True) -> dict[str, Any]:
    """Per-rank work of the random and the planned arm at ``w`` (independent of the overlap rate;
    ``fixed_costs`` False: per-sample compute only). Cached: planning 1,024 ranks takes seconds."""
    from freescale.trainer.simulate.sample_cost import sample_cost
    from freescale.trainer.simulate.simulator import build_arm

    key = (model, w)
    if key not in WORKS:
        cfg = base_config(model, w, RATES[0])
        cost = sample_cost(cfg.compute, cfg.workload)
        WORKS[key] = ({base: build_arm(base, w, source, cfg, cost)[0] for base in ("random", "plan")}, cost)
    works, cost = WORKS[key]
    if fixed_costs:
        return works
    # the plan places samples by their own cost, which fixed costs do not change: only compute differs
    return {base: replace(work, compute=work.compute - cost.per_micro_batch_s * (work.samples > 0))
            for base, work in works.items()}  # fmt: skip


def time_arm(work: Any, overlap: str, cfg: Any) -> dict[str, Any]:
    """The simulator's figures of one arm, with ``simulate``'s own jitter draws at this W."""
    from freescale.trainer.simulate.network_model import NetworkModel
    from freescale.trainer.simulate.simulator import jitter_sigma, time_steps

    w = work.compute.shape[1]
    sigma, _ = jitter_sigma(cfg.jitter, cfg.seed)
    return time_steps(work, overlap, cfg, NetworkModel(cfg.network, w), sigma, np.random.default_rng([cfg.seed, w, 5]))


def figures(row: dict[str, Any]) -> dict[str, float]:
    step_ms = 1e3 * row["step_s"]
    exposed_ms = step_ms * row["exposed_comm_pct"] / 100.0
    return {
        "step_ms": step_ms,
        "exposed_comm_ms": exposed_ms,
        "exposed_comm_pct": row["exposed_comm_pct"],
        "straggler_pct": row["straggler_pct"],
        "bubble_pct": row["bubble_pct"],
        # the embedding communication's share (the paper's measure): without the dense all-reduce
        "embedding_exposed_ms": max(0.0, exposed_ms - row["comm_ms"]["dense_all_reduce"]),
        "prefetch_ms": row["comm_ms"]["prefetch"],
        "prefetch_latency_ms": row["comm_ms"]["prefetch_latency"],
    }


def sweep_model(model: Model, world_sizes: tuple[int, ...], source: Any) -> list[dict[str, Any]]:
    """Every (W, rate, arm) of one model: figures and the ratios the README quotes."""
    rows = []
    for w in world_sizes:
        works = arm_works(model, w, source)
        for rate in RATES:
            cfg = base_config(model, w, rate)
            arms = {name: figures(time_arm(works[base], overlap, cfg)) for name, (base, overlap) in ARMS.items()}
            pec, none, torchrec = arms["plan/pec"], arms["plan/none"], arms["torchrec"]
            cut = 100.0 * (1.0 - pec["exposed_comm_ms"] / torchrec["exposed_comm_ms"])
            embedding_cut = 100.0 * (1.0 - pec["embedding_exposed_ms"] / torchrec["embedding_exposed_ms"])
            rows.append({
                "model": model.name, "d_model": model.d_model, "layers": model.layers, "k": model.k,
                "world_size": w, "batch_overlap_rate": rate, "arms": arms,
                "pec_over_none_step": pec["step_ms"] / none["step_ms"],
                "pec_over_torchrec_step": pec["step_ms"] / torchrec["step_ms"],
                "exposed_comm_cut_vs_torchrec_pct": cut,
                "embedding_exposed_cut_vs_torchrec_pct": embedding_cut,
                "paper_cut_reached": embedding_cut >= PAPER_CUT_PCT,
            })  # fmt: skip
    return rows


# ------------------------------------------------------------------------------------------ 3. hierarchical
def hierarchical_rows(world_sizes: tuple[int, ...], source: Any, rate: float = 0.1) -> list[dict[str, Any]]:
    """The issue's model at ``rate``: step time of plan/none and plan/pec with a flat and a
    hierarchical all-to-all, at each W."""
    rows = []
    for w in world_sizes:
        work = arm_works(ISSUE_MODEL, w, source)["plan"]
        flat = base_config(ISSUE_MODEL, w, rate)
        hier = replace(flat, network=replace(flat.network, all_to_all="hierarchical"))
        row: dict[str, Any] = {"world_size": w, "batch_overlap_rate": rate}
        for overlap in ("none", "pec"):
            flat_ms = figures(time_arm(work, overlap, flat))["step_ms"]
            hier_ms = figures(time_arm(work, overlap, hier))["step_ms"]
            row[overlap] = {"flat_step_ms": flat_ms, "hierarchical_step_ms": hier_ms,
                            "hierarchical_over_flat": hier_ms / flat_ms}  # fmt: skip
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ 4. break-even
def step_gap(work: Any, cfg: Any, extra_s: float) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """(pec − none step seconds, pec row, none row) of ``work`` (built without fixed costs) with
    ``extra_s`` of compute per step."""
    cfg = without_fixed_costs(cfg, extra_s)
    pec, none = time_arm(work, "pec", cfg), time_arm(work, "none", cfg)
    return pec["step_s"] - none["step_s"], pec, none


def break_even(work: Any, cfg: Any) -> dict[str, Any]:
    """The smallest compute per step at which PEC's step is no slower than the synchronous one."""
    grid = np.concatenate([[0.0], np.geomspace(1e-5, 1.0, 26)])
    gaps = [step_gap(work, cfg, x)[0] for x in grid]
    paying = [i for i, gap in enumerate(gaps) if gap <= 0]
    if not paying:
        return {"break_even_step_ms": None, "note": "PEC never pays up to 1 s of compute per step"}
    first = paying[0]
    lo, hi = (grid[first - 1], grid[first]) if first else (0.0, 0.0)
    for _ in range(30 if first else 0):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if step_gap(work, cfg, mid)[0] <= 0 else (mid, hi)
    _, pec, none = step_gap(work, cfg, hi)
    latency, total = pec["comm_ms"]["prefetch_latency"], pec["comm_ms"]["prefetch"]
    terms = {"latency per collective": latency, "bytes": total - latency, "compute to hide behind": 1e3 * hi}
    deciding = "latency per collective" if latency >= total - latency else "bytes"
    return {
        "break_even_step_ms": 1e3 * none["step_s"],
        "compute_added_ms": 1e3 * hi,
        "pec_prefetch_ms": total,
        "terms_ms": terms,
        "deciding_term": deciding,
        "pec_critical_ms": pec["comm_ms"]["critical"],
        "none_critical_ms": none["comm_ms"]["critical"],
    }


def break_evens(world_sizes: tuple[int, ...], source: Any) -> list[dict[str, Any]]:
    rows = []
    for w in world_sizes:
        work = arm_works(ISSUE_MODEL, w, source, fixed_costs=False)["plan"]
        with_fixed = arm_works(ISSUE_MODEL, w, source)["plan"]
        for rate in RATES:
            cfg = base_config(ISSUE_MODEL, w, rate)
            projected = figures(time_arm(with_fixed, "none", cfg))["step_ms"]
            found = break_even(work, cfg)
            pays = found["break_even_step_ms"] is not None and projected >= found["break_even_step_ms"]
            rows.append({"world_size": w, "batch_overlap_rate": rate, "projected_none_step_ms": projected,
                         "pec_pays_at_projected_step": pays} | found)  # fmt: skip
    return rows


# ------------------------------------------------------------------------------------------ report
def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'model':16} {'W':>5} {'rate':>5} {'none ms':>9} {'pec ms':>9} {'torchrec ms':>11} "
             f"{'pec/none':>8} {'pec/trec':>8} {'exposed cut':>11} {'emb. cut':>8}"]  # fmt: skip
    for r in rows:
        a = r["arms"]
        lines.append(
            f"{r['model']:16} {r['world_size']:5d} {r['batch_overlap_rate']:5.2f} {a['plan/none']['step_ms']:9.2f} "
            f"{a['plan/pec']['step_ms']:9.2f} {a['torchrec']['step_ms']:11.2f} {r['pec_over_none_step']:8.3f} "
            f"{r['pec_over_torchrec_step']:8.3f} {r['exposed_comm_cut_vs_torchrec_pct']:10.1f}% "
            f"{r['embedding_exposed_cut_vs_torchrec_pct']:7.1f}%"
        )
    return "\n".join(lines)


def write_plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for rate in RATES:
        mine = [r for r in rows if r["batch_overlap_rate"] == rate and r["break_even_step_ms"] is not None]
        ws = [r["world_size"] for r in mine]
        ax.plot(ws, [r["break_even_step_ms"] for r in mine], marker="o", label=f"break-even, rate {rate}")
        for r in mine:
            short = "latency" if r["deciding_term"].startswith("latency") else "bytes"
            ax.annotate(short, (r["world_size"], r["break_even_step_ms"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))  # fmt: skip
    middle = [r for r in rows if r["batch_overlap_rate"] == RATES[1]]
    projected = sorted({(r["world_size"], r["projected_none_step_ms"]) for r in middle})
    ax.plot([w for w, _ in projected], [s for _, s in projected], "k--", label="projected step (plan/none, rate 0.1)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (W)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"PEC pays above the break-even step time ({ISSUE_MODEL.name}, {PROFILE}; projection)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="W 8 and 64, the issue's model only (figures partial)")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/bench_scale.json; none with --quick)")
    args = parser.parse_args(argv)
    from freescale.trainer.simulate.sim_inputs import parse_distribution
    from freescale.trainer.simulate.simulator import COLLECTIVES_PER_STEP

    started, cpu_started = time.perf_counter(), time.process_time()
    world_sizes = (8, 64) if args.quick else WORLD_SIZES
    models = (ISSUE_MODEL,) if args.quick else MODELS
    out = Path(args.out) if args.out else (None if args.quick else RESULTS)
    source = parse_distribution(LENGTHS)
    split: dict[str, Any] = {}
    sweep: list[dict[str, Any]] = []
    even: list[dict[str, Any]] = []
    hierarchical: list[dict[str, Any]] = []
    done = {"final": False}

    collectives_ok = COLLECTIVES_PER_STEP["pec"] <= COLLECTIVES_PER_STEP["none"] + 1

    def report() -> dict[str, Any]:
        issue = [r for r in sweep if r["model"] == ISSUE_MODEL.name and r["world_size"] == 256
                 and r["batch_overlap_rate"] == 0.1]  # fmt: skip
        hier_256 = [r for r in hierarchical if r["world_size"] == 256]
        runtime = time.perf_counter() - started
        return {
            "benchmark": "bench_scale",
            "projection": True,
            "note": "freescale simulate's model, not a measurement: no run of 64+ ranks has happened",
            "settings": {
                "profile": PROFILE,
                "lengths": LENGTHS,
                "world_sizes": list(world_sizes),
                "models": [asdict(m) for m in models],
                "rates": list(RATES),
                "steps": STEPS,
                "arms": {k: list(v) for k, v in ARMS.items()},
                "quick": args.quick,
            },
            "collectives_per_step": COLLECTIVES_PER_STEP,
            "fixed_cost_split": split,
            "sweep": sweep,
            "break_even": even,
            "hierarchical_all_to_all": hierarchical,
            "issue_table_at_256": issue[0] if issue else None,
            "target_met": {
                "pec_not_slower_than_none_at_256": bool(issue) and issue[0]["pec_over_none_step"] <= 1.0,
                "pec_collectives_at_most_torchrec_plus_1": collectives_ok,
                "hierarchical_no_slower_than_flat_at_256": bool(hier_256)
                and all(hier_256[0][o]["hierarchical_over_flat"] <= 1.0 for o in ("none", "pec")),
                "runtime_under_2_min": done["final"] and runtime < RUNTIME_TARGET_S,
            },
            "runtime_s": round(runtime, 1),
            "cpu_s": round(time.process_time() - cpu_started, 1),  # the host may be shared: wall > CPU
            "machine": machine(),
        }

    recorder = Points("bench_scale", out, report)
    recorder.run("fixed-cost split", fixed_cost_split, keep=split.update)
    for model in models:
        recorder.run(f"sweep {model.name}", sweep_model, model, world_sizes, source, keep=sweep.extend)
    recorder.run("hierarchical all-to-all", hierarchical_rows, world_sizes, source, keep=hierarchical.extend)
    recorder.run("break-even", break_evens, world_sizes, source, keep=even.extend)
    done["final"] = True
    final = recorder.save(final=True)
    print(table(sweep))
    print("break-even step time (plan/pec no slower than plan/none), " + ISSUE_MODEL.name)
    for r in even:
        shown = "-" if r["break_even_step_ms"] is None else f"{r['break_even_step_ms']:8.3f} ms"
        print(f"  W {r['world_size']:5d} rate {r['batch_overlap_rate']:.2f}: {shown}  decided by "
              f"{r.get('deciding_term', '-')}; projected step {r['projected_none_step_ms']:.2f} ms, "
              f"PEC pays: {r['pec_pays_at_projected_step']}")  # fmt: skip
    print(f"hierarchical all-to-all vs flat, {ISSUE_MODEL.name}, rate 0.1 (step ms, flat -> hierarchical)")
    for r in hierarchical:
        parts = [f"{o} {r[o]['flat_step_ms']:.2f} -> {r[o]['hierarchical_step_ms']:.2f} "
                 f"({r[o]['hierarchical_over_flat']:.3f}x)" for o in ("none", "pec")]  # fmt: skip
        print(f"  W {r['world_size']:5d}: " + "; ".join(parts))
    print(f"collectives per step {COLLECTIVES_PER_STEP}; targets {final['target_met']}; {final['runtime_s']} s")
    if out is not None:
        write_plot(even, out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}")
    return recorder.exit_code()


if __name__ == "__main__":
    sys.exit(main())
