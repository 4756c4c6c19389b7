"""Validation of ``freescale simulate`` against measured 2-rank CPU runs, then the paper's setting.

One run, on this host:

1. **Calibrate** (inputs the simulator is allowed to see): the data and cost model of
   ``bench_bubbles`` (heavy-tailed lognormal lengths, a cost model fitted here by
   ``freescale.trainer.simulate.calibrate``); gloo all-to-all and all-reduce times between two pinned
   processes at several sizes, fitted to latency + bytes / bandwidth; the *noise-floor* run (every
   rank trains rank 0's micro-batch, ``bench_bubbles``' ``identical`` variant): its
   ``straggler_pct`` sets the jitter, its forward+backward time against the cost model's prediction
   for the same micro-batches sets ``compute.scale``, and the rest of its busy time the per-step
   overhead; the data's ``batch_overlap_rate`` and distinct-id share (docs/design.md#definitions, on the run's own
   global batches).
2. **Measure** (the targets, never shown to the simulator): ``freescale train --nproc 2`` on the
   random and the planned dataset, ``engine.overlap = none`` and ``pec``, interleaved.
3. **Predict** each with ``simulate`` on the dataset's own layout at W = 2, over the same steps.
   Target: every predicted ``straggler_pct`` and ``exposed_comm_pct`` within 3 percentage points.
4. **Project** the paper's setting on the shipped H100 profile: 256 ranks (and 2…1024), UIH
   lengths lognormal(median 300, σ 1.2, cap 21,000) as in docs/design.md#balancing, the repository's default model
   (d_model 256, 4 layers, 128 negatives: the paper's production model is not public), an assumed
   ``batch_overlap_rate`` of 0.1. Random batching, online balancing and the offline plan side by side.

5. **2 hosts** (``sim_hosts.py``; needs root, else skipped with the reason): bench_network's workload
   on two network-namespace hosts over a veth capped by ``tc`` (``--hosts-caps``), calibrated on the
   uncapped ``none`` run, a link probe and a contention probe at each cap, predicted and compared the
   same way (``hosts_target_met``), and once more without the contention probe's slowdown (the
   same runs: what modelling it changes).

    flock /tmp/freescale-bench.lock python benchmarks/bench_simulate.py        # ~6 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from bench_bubbles import Settings, full_group_steps, make_data, one_run, pool
from bench_pec import steady_figures
from measure import Points

RESULTS = Path(__file__).resolve().parent / "results" / "bench_simulate.json"
TARGET_PP = 3.0
SKIP_STEPS = 2  # bench_bubbles' logging.skip_steps: warm-up steps left out of the measured figures
SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 19, 1 << 21)  # payload bytes per rank
REPS = 30
VALIDATED = ("random/none", "planned/none", "random/pec", "planned/pec")


# ------------------------------------------------------------------------------------------ gloo
def comm_rank(rank: int, port: int, queue: Any) -> None:
    """One of two pinned gloo processes timing all_to_all_single and all_reduce per payload size."""
    import torch
    import torch.distributed as dist

    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = {}
    for nbytes in SIZES:
        x = torch.ones(nbytes // 4)
        y = torch.empty_like(x)
        times = {"all_to_all": [], "all_reduce": []}
        for _ in range(REPS):
            dist.barrier()
            t = time.perf_counter()
            dist.all_to_all_single(y, x)
            times["all_to_all"].append(time.perf_counter() - t)
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            times["all_reduce"].append(time.perf_counter() - t)
        out[nbytes] = {k: float(np.median(v)) for k, v in times.items()}
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def measure_gloo() -> dict[str, Any]:
    """Median times per size and the latency + bytes/bandwidth fit the simulator's model uses:
    all-to-all ``α + (payload/2)/bw`` (half a rank's payload crosses to the other rank), all-reduce
    ``2α + bytes/bw``."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=comm_rank, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    times = queue.get(timeout=300)
    for p in procs:
        p.join()
    sizes = np.array(SIZES, dtype=np.float64)
    a2a = np.array([times[n]["all_to_all"] for n in SIZES])
    ar = np.array([times[n]["all_reduce"] for n in SIZES])
    (beta, alpha), *_ = np.linalg.lstsq(np.stack([sizes / 2, np.ones_like(sizes)], 1), a2a, rcond=None)
    (beta_ar, alpha_ar), *_ = np.linalg.lstsq(np.stack([sizes, 2 * np.ones_like(sizes)], 1), ar, rcond=None)
    return {
        "bytes": list(SIZES),
        "all_to_all_s": a2a.tolist(),
        "all_reduce_s": ar.tolist(),
        "all_to_all_fit": {"latency_us": 1e6 * max(alpha, 0.0), "bandwidth_gbytes_s": 1e-9 / beta},
        "all_reduce_fit": {"latency_us": 1e6 * max(alpha_ar, 0.0), "bandwidth_gbytes_s": 1e-9 / beta_ar},
    }


def insitu_network(
    bubbles: list[Path], payload: dict[str, float], gloo: dict[str, Any], skip: int = SKIP_STEPS
) -> dict[str, Any]:
    """Latency + bandwidth of the trainer's own collectives, fitted to the noise-floor run's exposed
    comm per collective name (``comm_by_name``, seconds per rank and step, warm-up left out) against
    the bytes each carries per rank. On this host a collective inside a training step costs several
    times what it costs between two idle processes (``measure_gloo``): scheduling on a shared core,
    not bytes. The all-reduce keeps its own latency (gloo's CPU ring)."""
    totals: dict[str, float] = {}
    n = 0
    rank_steps = [x for path in bubbles for x in json.loads(path.read_text())["rank_steps"]]
    for rank_step in rank_steps:
        if rank_step["step"] < skip:
            continue
        n += 1
        for name, seconds in rank_step["comm_by_name"].items():
            totals[name] = totals.get(name, 0.0) + seconds
    per = {name: totals.get(name, 0.0) / max(n, 1) for name in payload}
    a2a = [name for name in payload if name != "gradient_comm.dense"]
    x = np.array([payload[name] / 2 for name in a2a])  # half a rank's payload crosses at W = 2
    y = np.array([per[name] for name in a2a])
    (beta, alpha), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), y, rcond=None)
    if beta <= 0:  # the bytes do not show through the latency: keep the idle-process bandwidth
        if "all_to_all_fit" not in gloo:
            raise RuntimeError("the in-training fit needs the idle gloo bandwidth, whose measurement failed")
        beta = 1e-9 / gloo["all_to_all_fit"]["bandwidth_gbytes_s"]
        alpha = float(np.mean(y - beta * x))
    # the all-reduce: gloo's ring between idle processes for the bytes, the rest of what the
    # training step measured as its latency (one payload size cannot separate the two)
    ar_fit = gloo.get("all_reduce_fit")
    ar_bandwidth = ar_fit["bandwidth_gbytes_s"] if ar_fit else 1e-9 / float(beta)
    dense = per["gradient_comm.dense"] - payload["gradient_comm.dense"] / (ar_bandwidth * 1e9)
    return {
        "seconds_by_collective": per,
        "payload_bytes": payload,
        "latency_us": 1e6 * max(float(alpha), 0.0),
        "bandwidth_gbytes_s": 1e-9 / float(beta),
        "all_reduce_latency_us": 1e6 * max(float(dense), 0.0),
        "all_reduce_bandwidth_gbytes_s": ar_bandwidth,
    }


# ------------------------------------------------------------------------------------------ data facts
def data_facts(path: str, group_size: int, steps: int) -> dict[str, Any]:
    """``batch_overlap_rate`` (docs/definitions.md) of the item table over the run's consecutive global batches
    (W = 2), the share of a micro-batch's item ids that are distinct (what ``input_dist`` sends) and
    the mean events of rank 0's micro-batches (what every rank trains in the noise-floor run)."""
    from freescale.pipeline.dataset.reader import PreparedDataset

    ds = PreparedDataset(path)
    rates, unique, events = [], 0, 0
    rank0 = [sum(int(x["length"]) for x in ds.micro_batch(ds.micro_batch_index(s, 0, 2))) for s in range(steps)]
    previous: set[int] | None = None
    for s in range(steps):
        batch: set[int] = set()
        for rank in range(2):
            ids = [int(i) for sample in ds.micro_batch(ds.micro_batch_index(s, rank, 2)) for i in sample["item_ids"]]
            unique += len(set(ids))
            events += len(ids)
            batch |= set(ids)
        if previous is not None and batch:
            rates.append(len(batch & previous) / len(batch))
        previous = batch
    return {
        "batch_overlap_rate": float(np.mean(rates)),
        "unique_fraction": unique / max(events, 1),
        "rank0_events": float(np.mean(rank0[SKIP_STEPS:])),
    }


def dense_params(model_table: dict[str, Any], items: int) -> int:
    """Data-parallel parameters of the model (what the dense all-reduce carries)."""
    from freescale.model_config import ModelConfig
    from freescale.trainer.learning_config import ModelExtraConfig
    from freescale.trainer.model.transducer import SequentialTransducer

    model = SequentialTransducer(ModelConfig(**model_table), ModelExtraConfig(num_items=items, num_actions=8))
    return int(sum(p.numel() for p in model.parameters()))


# ------------------------------------------------------------------------------------------ simulate
def own_source(path: str, steps: int, skip: int = SKIP_STEPS):
    """The dataset's own layout over the measured window of a ``steps``-step run: ``steady_figures``'
    (warm-up and the run's last, drain step left out)."""
    from freescale.trainer.simulate.sim_inputs import OwnLayout, read_prepared

    source = read_prepared(path)
    layout = source.layout
    lo, hi = 2 * skip, 2 * (steps - 1)  # micro-batches of steps [skip, steps - 1) at W = 2
    offsets = layout.offsets[lo : hi + 1]
    lengths = layout.lengths[offsets[0] : offsets[-1]]
    source.layout = OwnLayout(lengths, offsets - offsets[0], layout.group_size, layout.strategy)
    source.values = lengths
    return source


def calibration(
    cost_path: str, data: str, run: dict[str, Any], steps: int, ranks: tuple[int, ...] = (0,), skip: int = SKIP_STEPS
) -> dict[str, Any]:
    """``compute.scale`` and ``step_overhead_s`` from a measured 2-rank run: its mean forward+backward
    against the cost model's prediction for the micro-batches of ``ranks`` it trained (the noise-floor
    run trains rank 0's on both ranks), the rest of its busy time as per-step overhead; its
    ``straggler_pct`` as the noise floor; its data, lookup and sparse-update stages as PEC's prefetch
    host work (``compute.prefetch_host_s``: the PEC worker starts after the data stage and runs the
    lookups and the cold update itself; a ``none`` run times the same operations)."""
    from freescale.pipeline.cost import CostModel
    from freescale.pipeline.dataset.reader import PreparedDataset

    cost = CostModel.from_file(cost_path)
    per_mb = float(cost.details.get("per_micro_batch_s", 0.0))
    ds = PreparedDataset(data)
    predicted = []
    for step in range(skip, steps):
        for rank in ranks:
            lengths = np.array([int(x["length"]) for x in ds.micro_batch(ds.micro_batch_index(step, rank, 2))])
            predicted.append(float(cost.cost(lengths).sum()) + per_mb)
    measured_fb = 1e-3 * (run["stage_ms"]["forward"] + run["stage_ms"]["backward"])
    busy = 1e-3 * run["step_ms"] * (run["compute_pct"] + run["data_pct"]) / 100.0
    host = sum(run["stage_ms"].get(k, 0.0) for k in ("data", "embedding_lookup", "sparse_update"))
    return {
        "scale": measured_fb / float(np.mean(predicted)),
        "step_overhead_s": max(0.0, busy - measured_fb),
        "predicted_forward_backward_s": float(np.mean(predicted)),
        "measured_forward_backward_s": measured_fb,
        "noise_floor_pct": run["straggler_pct"],
        "prefetch_host_s": 1e-3 * host,
        # the fit's mean |relative error| as a normal spread's cv (E|x| = cv·sqrt(2/π))
        "cost_error_cv": float(cost.details.get("fit_relative_error_mean", 0.0)) * float(np.sqrt(np.pi / 2)),
    }


def payload_bytes(facts: dict[str, Any], d_model: int, negatives: int, params: int) -> dict[str, float]:
    """Bytes per rank and step of each trainer collective (distinct ids of a micro-batch and its
    shared negatives; in-batch negatives are targets, no new ids)."""
    unique = facts["unique_fraction"] * (facts["rank0_events"] + negatives)
    return {
        "input_dist.counts": 2 * 8.0,
        "input_dist.ids": 8.0 * unique,
        "embedding_comm.rows": 4.0 * d_model * unique,
        "gradient_comm.embeddings": 4.0 * d_model * unique,
        "gradient_comm.dense": 4.0 * params,
    }


def predict(s: Any, cost_path: str, calib: dict, net: dict, facts: dict, params: int, source: Any,
            arm: str, overlap: str, ranks_per_node: int = 2) -> dict[str, Any]:  # fmt: skip
    """The simulator's figures for one measured 2-rank run (``net``: latency, bandwidth and all-reduce
    latency of the link between the ranks; ``source``: the run's own layout, ``own_source``)."""
    from freescale.trainer.simulate.sim_config import (
        ComputeConfig,
        JitterConfig,
        NetworkConfig,
        SimConfig,
        WorkloadConfig,
    )
    from freescale.trainer.simulate.simulator import find, simulate

    lat, bw = net["latency_us"], net["bandwidth_gbytes_s"]
    cfg = SimConfig(
        world_sizes=(2,),
        arms=(arm,),
        overlaps=(overlap,),
        compute=ComputeConfig(
            cost_model=cost_path,
            scale=calib["scale"],
            step_overhead_s=calib["step_overhead_s"],
            cost_error_cv=calib["cost_error_cv"],
            prefetch_host_s=calib["prefetch_host_s"],
        ),
        network=NetworkConfig(
            ranks_per_node=ranks_per_node,
            intra_latency_us=lat,
            intra_bandwidth_gbytes_s=bw,
            inter_latency_us=lat,
            inter_bandwidth_gbytes_s=bw,
            all_reduce_latency_us=net["all_reduce_latency_us"],
            all_reduce_bandwidth_gbytes_s=net.get("all_reduce_bandwidth_gbytes_s"),
            completion_spread=net.get("completion_spread", 0.0),
            # Measured where a probe timed compute beside a running exchange (the 2-host contention
            # probe: there each host's network work shares its one core with its rank); else 0: on
            # one host the in-training collective time is waiting, not CPU work that slows compute.
            overlap_slowdown_s_per_mbyte=net.get("overlap_slowdown_s_per_mbyte", 0.0),
            overlap_slowdown_spread=net.get("overlap_slowdown_spread", 0.0),
        ),
        jitter=JitterConfig(noise_floor_pct=calib["noise_floor_pct"], noise_floor_world_size=2),
        workload=WorkloadConfig(
            micro_batch_size=s.micro_batch_size,
            embedding_dim=s.d_model,
            num_layers=s.num_layers,
            negatives=s.num_negatives,  # in-batch negatives are targets: no new ids
            unique_fraction=facts["unique_fraction"],
            dense_params=params,
            batch_overlap_rate=facts["batch_overlap_rate"],
        ),
    )
    return find(simulate(cfg, source), 2, arm, overlap)


def project(rate: float) -> dict[str, Any]:
    """The paper's setting on the shipped H100 profile (see the module docstring)."""
    from freescale.trainer.simulate.sim_config import HardwareProfile, SimConfig, WorkloadConfig
    from freescale.trainer.simulate.sim_inputs import parse_distribution
    from freescale.trainer.simulate.simulator import simulate

    profile = HardwareProfile.load("h100_nvlink_ib400")  # the default profile, named to say so
    cfg = SimConfig(
        compute=profile.compute,
        network=profile.network,
        jitter=profile.jitter,
        workload=WorkloadConfig(micro_batch_size=32, steps=16, batch_overlap_rate=rate),
    )
    report = simulate(cfg, parse_distribution("lognormal:median=300,sigma=1.2,cap=21000"))
    report["profile"] = {"name": profile.name, "path": profile.path, "description": profile.description}
    return report


def compare(name: str, m: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """One validation row: measured and predicted figures and the error in percentage points."""
    row: dict[str, Any] = {"run": name, "measured": {}, "predicted": {}, "error_pp": {}}
    for key in ("straggler_pct", "exposed_comm_pct", "bubble_pct"):
        row["measured"][key], row["predicted"][key] = m[key], p[key]
        row["error_pp"][key] = p[key] - m[key]
    row["measured"]["step_ms"], row["predicted"]["step_ms"] = m["step_ms"], 1e3 * p["step_s"]
    row["measured"]["samples_per_s"], row["predicted"]["samples_per_s"] = m["samples_per_s"], p["samples_per_s"]
    return row


def worst_error(rows: list[dict[str, Any]]) -> float:
    return max(abs(r["error_pp"][k]) for r in rows for k in ("straggler_pct", "exposed_comm_pct"))


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'run':26} {'straggler% meas/pred':>22} {'exp_comm% meas/pred':>22} {'ms/step meas/pred':>20}")
    for r in rows:
        m, p = r["measured"], r["predicted"]
        print(
            f"{r['run']:26} {m['straggler_pct']:10.2f} / {p['straggler_pct']:8.2f} "
            f"{m['exposed_comm_pct']:10.2f} / {p['exposed_comm_pct']:8.2f} {m['step_ms']:9.1f} / {p['step_ms']:7.1f}"
        )


def validate_hosts(args: argparse.Namespace, work: Path, points: Points) -> dict[str, Any]:
    """The 2-host capped-link part (``sim_hosts.py``); skipped, with the reason, where hosts cannot be built."""
    from bench_network import network_settings, parse_caps
    from sim_hosts import validate

    from freescale.tools.hosts import unavailable_reason

    if not args.hosts_caps:
        return {"skipped": "--hosts-caps ''"}
    reason = unavailable_reason()
    if reason:
        print(f"== 2-host validation skipped: {reason}")
        return {"skipped": reason}
    print("== 2 emulated hosts over a capped link: calibrate, probe, measure, predict")
    caps = parse_caps(args.hosts_caps)
    s = network_settings(args.quick)
    return validate(s, work / "hosts", caps if not args.quick else caps[:2], points)


def measured_run(s: Settings, work: Path, data: dict[str, Any], name: str, repeat: int, steps: int) -> dict[str, Any]:
    """One measured 2-rank run (``variant/overlap``) with its steady-state figures (no drain step)."""
    variant, overlap = name.split("/")
    sub = work / overlap
    sub.mkdir(exist_ok=True)
    row = one_run(replace(s, overlap=overlap), sub, data, "freescale", variant, repeat, steps)
    report = json.loads(Path(row["report"]).read_text())
    return row | steady_figures(report, SKIP_STEPS)


def validation(s: Settings, work: Path, data: dict[str, Any], runs: dict[str, list[dict[str, Any]]],
               gloo: dict[str, Any], facts: dict[str, Any], params: int, steps: int) -> dict[str, Any]:  # fmt: skip
    """Calibrate on the noise-floor runs, predict every measured run; a run whose every repeat failed
    has no row, and without a noise-floor run there is nothing to calibrate on."""
    measured = {name: pool(rows) for name, rows in runs.items() if rows}
    floor = measured.pop("identical/none", None)
    if floor is None:
        return {"validation": [], "validation_skipped": "every noise-floor run failed: nothing to calibrate on"}
    planned = data["datasets"]["planned"]["path"]
    calib = calibration(data["cost_path"], planned, floor, steps)
    payload = payload_bytes(facts, s.d_model, s.num_negatives, params)
    floors = [Path(row["report"]) for row in runs["identical/none"]]
    net = insitu_network(floors, payload, gloo)
    rows = []
    for name, m in measured.items():
        variant, overlap = name.split("/")
        arm = "random" if variant == "random" else "plan"
        source = own_source(data["datasets"][variant]["path"], steps)
        rows.append(compare(name, m, predict(s, data["cost_path"], calib, net, facts, params, source, arm, overlap)))
    return {"validation": rows, "calib": calib, "net": net}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (figures mean nothing)")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/bench_simulate.json; none with --quick)")
    parser.add_argument("--work", help="working directory (default: a temp dir)")
    parser.add_argument("--projection-overlap-rate", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every run (default 2)")
    parser.add_argument("--hosts-caps", default="none,1000,200,50",
                        help="link caps (Mbit/s or none) of the 2-host validation; '' skips it")  # fmt: skip
    args = parser.parse_args(argv)
    s = Settings(users=200, items=2_000, cap=300, median=40.0) if args.quick else Settings()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    repeats = 1 if args.quick else max(1, args.repeats)
    out = Path(args.out) if args.out else (None if args.quick else RESULTS)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ("identical/none", *VALIDATED)}
    gloo: dict[str, Any] = {}
    final: dict[str, Any] = {}

    def report() -> dict[str, Any]:  # the final report once there is one; before, what has been measured
        return final or {
            "settings": asdict(s),
            "repeats": repeats,
            "measured_by_repeat": by_repeat(runs),
            "calibration": {"gloo_idle": gloo},
            "target_met": False,
            "machine": machine(),
        }

    recorder = Points("bench_simulate", out, report)
    with tempfile.TemporaryDirectory(prefix="bench_simulate-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        print("== calibrate: data, cost model, gloo collectives")
        data = make_data(s, work)
        data["cost_path"] = str(work / "cost.json")
        recorder.run("gloo collectives", measure_gloo, keep=gloo.update)
        from freescale.pipeline.dataset.reader import PreparedDataset

        steps = min(full_group_steps(PreparedDataset(d["path"]), s.group_size) for d in data["datasets"].values())
        if args.quick:
            steps = min(steps, 8)
        s = replace(s, steps=steps)
        facts = data_facts(data["datasets"]["planned"]["path"], s.group_size, steps)
        params = dense_params(s.model_table(), s.items)
        print(f"== measure: noise floor and random/planned x none/pec, {repeats} interleaved repeat(s)")
        for repeat in range(repeats):  # interleaved: load drift on a shared host hits every run alike
            for name in runs:
                recorder.run(f"{name} repeat {repeat}", measured_run, s, work, data, name, repeat, steps,
                             keep=runs[name].append)  # fmt: skip
        print("== predict")
        checked = validation(s, work, data, runs, gloo, facts, params, steps)
        rows = checked["validation"]
        worst = worst_error(rows) if rows else None
        hosts = validate_hosts(args, work, recorder)
        hosts_worst = worst_error(hosts["validation"]) if hosts.get("validation") else None
        hosts_plain = worst_error(hosts["validation_without_contention"]) if hosts.get("validation") else None
        print("== project: the paper's setting on h100_nvlink_ib400")
        projection = project(args.projection_overlap_rate)
        at256 = {
            f"{r['arm']}/{r['overlap']}": {k: r[k] for k in ("straggler_pct", "exposed_comm_pct", "bubble_pct")}
            | {"step_ms": 1e3 * r["step_s"], "samples_per_s": r["samples_per_s"]}
            for r in projection["rows"]
            if r["world_size"] == 256
        }
        # every run validated: a run whose every repeat failed has no row, so the target is not met
        validated_all = len(rows) == len(VALIDATED)
        final.update({
            "settings": asdict(s),
            "steps_per_run": steps,
            "repeats": repeats,
            "measured_by_repeat": by_repeat(runs),
            "calibration": {
                "gloo_idle": gloo,
                "network_in_training": checked.get("net"),
                "data": facts,
                "dense_params": params,
                **checked.get("calib", {}),
            },
            "validation": rows,
            **({"validation_skipped": checked["validation_skipped"]} if "validation_skipped" in checked else {}),
            "worst_error_pp": worst,
            "target": f"every predicted straggler_pct and exposed_comm_pct within {TARGET_PP:g} pp of measured",
            "target_met": validated_all and worst is not None and worst <= TARGET_PP,
            "hosts": hosts,
            "hosts_worst_error_pp": hosts_worst,
            "hosts_worst_error_pp_without_contention": hosts_plain,
            "hosts_target": f"2 hosts over a tc-capped veth: every predicted straggler_pct and exposed_comm_pct "
            f"within {TARGET_PP:g} pp of measured",
            "hosts_target_met": None if hosts_worst is None else hosts_worst <= TARGET_PP,
            "projection": {
                "setting": "h100_nvlink_ib400, lognormal(300, 1.2, cap 21000), d_model 256 x 4 layers, "
                f"k = 32, batch_overlap_rate {args.projection_overlap_rate} (assumed)",
                "at_256_ranks": at256,
                "rows": projection["rows"],
            },
            "runtime_s": round(time.perf_counter() - started, 1),
            "machine": machine(),
        })  # fmt: skip
        recorder.save(final=True)
    print_rows(rows)
    shown = "-" if worst is None else f"{worst:.2f}"
    print(f"worst error {shown} pp; target (<= {TARGET_PP:g} pp) met: {final['target_met']}")
    if hosts_worst is not None:
        print_rows(hosts["validation"])
        print(f"2 hosts: worst error {hosts_worst:.2f} pp; target met: {final['hosts_target_met']}")
        print_rows(hosts["validation_without_contention"])
        print(f"2 hosts without the contention probe's slowdown: worst error {hosts_plain:.2f} pp")
    print("projection at 256 ranks:")
    for name, v in at256.items():
        print(f"  {name:18} straggler {v['straggler_pct']:6.2f}%  exposed comm {v['exposed_comm_pct']:6.2f}%  "
              f"bubble {v['bubble_pct']:6.2f}%  {v['samples_per_s']:12.0f} samples/s")  # fmt: skip
    if out is not None:
        from freescale.trainer.simulate.sim_report import write_plot

        write_plot(projection, out.with_suffix(".png"))  # the projection: bubbles against W per arm
        print(f"wrote {out} and {out.with_suffix('.png')}")
    return recorder.exit_code()


def by_repeat(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[float]]]:
    return {name: {k: [r[k] for r in rows] for k in ("straggler_pct", "exposed_comm_pct", "step_ms")}
            for name, rows in runs.items()}  # fmt: skip


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]}


if __name__ == "__main__":
    sys.exit(main())
