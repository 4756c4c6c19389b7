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
   global batches). The inputs are read by ``sim_calibration.py``, the network figures by ``sim_network.py``.
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
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench_bubbles import Settings, full_group_steps, make_data, one_run, pool
from bench_pec import steady_figures
from measure import Points, machine
from sim_calibration import SKIP_STEPS, calibration, data_facts, dense_params, own_source, payload_bytes
from sim_network import insitu_network, measure_gloo

RESULTS = Path(__file__).resolve().parent / "results" / "bench_simulate.json"
TARGET_PP = 3.0
VALIDATED = ("random/none", "planned/none", "random/pec", "planned/pec")


# ------------------------------------------------------------------------------------------ simulate
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


if __name__ == "__main__":
    sys.exit(main())
