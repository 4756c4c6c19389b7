"""bench_prepare: throughput and peak memory of ``freescale prepare`` against a raw polars baseline.

Both run in one invocation on the same generated sources (the ``large`` preset by default, ≥ 20M
events). The baseline is what a user would write without FreeScale: polars reads every source, maps
the columns to a common schema and writes one Parquet file — no validation, no per-user sequences,
no cost model, no balancing. Peak RSS is the peak of the summed RSS of the whole process tree
(workers included), sampled every 50 ms.

Both are run ``--repeat`` times, interleaved (baseline, prepare, baseline, ...), so a slow spell of
the machine hits both sides; the medians are compared, and peak RSS is the largest of any run.

Target (issue 2): prepare ≥ 0.5× the baseline's events/s, and peak RSS under ``--memory-limit``.

The Ray arms (issue 19) run the same ``prepare`` with ``--executor ray`` in the same interleaved rounds,
two ways:

- ``ray (starts its own runtime)``: no ``--ray-address``; a Ray runtime is started for the job on
  this host with ``--workers`` CPUs, and its start-up is part of the wall time (what a laptop user
  sees). Its whole tree (the runtime's processes included) must stay under ``--memory-limit``.
- ``ray (attached to a running cluster)``: a one-node cluster (``ray start --head`` on 127.0.0.1
  with ``--workers`` CPUs and the object store a started runtime would get) is started before the
  run, untimed, and stopped after it (``tests/helpers/ray_cluster.py``: private ports, temp dir and token;
  teardown by process group); the job joins it with ``--ray-address``. This is what a cluster user
  sees: the cluster is up before the job. Peak RSS counts the cluster's processes with the driver,
  for information: with ``--ray-address`` the limit bounds the job's partitions and buckets only.

The 0.7x target (>= 0.7x the local executor's events/s) reads on the attached arm: a job's
throughput excludes the one-time start of a runtime that a cluster user never pays per job. The
started-runtime ratio is kept visible as its own field and target (``ray_cold_start_*``).

Peak RSS is reported for the whole tree and per process role (driver, pool/writer children, Ray
system processes, Ray workers). The tasks' per-node throughput is events / (task seconds / CPUs of a
node), from the task times the Ray executor records (``FREESCALE_TASK_TIMES``): what one node of a
cluster processes per second when its CPUs are kept busy, and what a cluster of N nodes multiplies
until the driver's serial steps (plan, index merge, manifest) dominate. ``wall_split`` splits a Ray
run's wall time into the runtime's start (or the join), the tasks, their warm-up (imports) and the
driver's serial steps and idle CPUs (``overhead_split``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from measure import FREESCALE, Points, ensure_preset, run_measured

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "helpers"))  # the attached arm's cluster: the Ray tests' helper
from ray_cluster import RayCluster, start_cluster  # noqa: E402

WORKERS = 2  # task processes of either executor (the Ray runtime's CPUs)
TASK_TIMES = "FREESCALE_TASK_TIMES"  # the Ray executor's task-time log (executors.ray_tasks.TASK_TIMES_ENV)
RUNTIME_START = "ray runtime start"  # that log's line for ray.init (executors.ray_tasks.RUNTIME_START)
CLUSTER_SETTLE_S = 3.0  # after the attached arm's cluster reports its node: its agents finish starting
ARMS = {"ray": "ray (starts its own runtime)", "ray_attached": "ray (attached to a running cluster)"}
RESULTS = REPO / "benchmarks" / "results"

BASELINE = r"""
import sys, polars as pl
from freescale.datasets.config import SourcesConfig
from freescale import storage
config = SourcesConfig.from_toml(sys.argv[1])
frames = []
for index, source in enumerate(config.sources):
    files = storage.expand(config.resolve(source.path))
    cols = source.columns
    if source.format == "parquet":
        frame = pl.scan_parquet(files)
    elif source.format == "jsonl":
        frame = pl.scan_ndjson(files, infer_schema_length=10000)
    else:
        frame = pl.scan_csv(files, separator="\t" if source.format == "tsv" else ",")
    frame = frame.select(
        pl.col(cols["user"]).cast(pl.Utf8).alias("user"),
        pl.col(cols["item"]).cast(pl.Int64, strict=False).alias("item_id"),
        pl.col(cols["timestamp"]).cast(pl.Int64, strict=False).alias("ts"),
        pl.lit(index, pl.Int8).alias("source"),
    )
    frames.append(frame)
pl.concat(frames).sink_parquet(sys.argv[2])
print(pl.scan_parquet(sys.argv[2]).select(pl.len()).collect().item())
"""


def run_baseline(sources: Path, work: Path) -> dict:
    out = work / "all.parquet"
    result = run_measured([sys.executable, "-c", BASELINE, str(sources), str(out)], "baseline")
    out.unlink(missing_ok=True)
    return {**result, "events": int(result["stdout"].strip().splitlines()[-1])}


def run_prepare(
    sources: Path, work: Path, memory_limit: str, engine: str = "local", cluster: RayCluster | None = None
) -> dict:
    """One ``prepare`` run; with ``cluster``, joined to it (``--ray-address``), its processes measured too."""
    output = work / f"prepared-{engine}"
    shutil.rmtree(output, ignore_errors=True)
    command = [*FREESCALE, "prepare", "--sources", str(sources), "--output", str(output), "--executor", engine]
    options = ["--memory-limit", memory_limit, "--group-size", "64", "--micro-batch-size", "32", "--quiet"]
    options += ["--workers", str(WORKERS)] + (["--ray-address", cluster.address] if cluster else [])
    times = work / "task_times.jsonl"
    times.unlink(missing_ok=True)
    env = cluster.driver_env() if cluster else {**os.environ}
    nodes = tuple(node.pid for node in cluster.nodes) if cluster else ()
    label = f"prepare --executor {engine}" + (" --ray-address" if cluster else "")
    result = run_measured([*command, *options], label, env={**env, TASK_TIMES: str(times)}, also=nodes)
    manifest = json.loads((output / "manifest.json").read_text())
    shutil.rmtree(output, ignore_errors=True)
    tasks = [json.loads(line) for line in times.read_text().splitlines()] if times.exists() else []
    return {**result, "manifest": manifest, "tasks": tasks}


def run_attached(sources: Path, work: Path, memory_limit: str) -> dict:
    """``prepare --executor ray --ray-address`` on a one-node cluster of ``WORKERS`` CPUs, started
    (untimed, then left to settle) before the run and stopped after it, whatever happens."""
    from freescale.pipeline.config import parse_size
    from freescale.pipeline.memory import ray_object_store_bytes

    store = ray_object_store_bytes(parse_size(memory_limit, "--memory-limit"))
    cluster = start_cluster(worker_nodes=0, node_cpus=WORKERS, object_store_bytes=store)
    try:
        time.sleep(CLUSTER_SETTLE_S)
        return run_prepare(sources, work, memory_limit, "ray", cluster)
    finally:
        cluster.stop()


def task_throughput(tasks: list[dict], events: int, cpus_per_node: int) -> dict:
    """Task seconds by step and node, and events / (task seconds / CPUs of a node). The calls the
    driver ran while the runtime started count as task seconds (the same work), not as a node."""
    by_step: dict[str, float] = {}
    for task in tasks:
        if task["step"] != RUNTIME_START:
            by_step[task["step"]] = by_step.get(task["step"], 0.0) + task["seconds"]
    total = sum(by_step.values())
    return {
        "task_seconds_by_step": {step: round(value, 2) for step, value in by_step.items()},
        "task_seconds": round(total, 2),
        "nodes": len({task["node"] for task in tasks if task["step"] != RUNTIME_START and task["node"] != "driver"}),
        "cpus_per_node": cpus_per_node,
        "per_node_events_per_s": events / (total / cpus_per_node) if total else None,
    }


def overhead_split(tasks: list[dict], wall_s: float, cpus: int) -> dict:
    """Where the Ray run's wall time went, in wall seconds: the runtime's start (``ray.init`` in the
    driver; attached: the join, ``import ray`` included; a started runtime: the driver runs the
    scan's first calls meanwhile: ``driver_calls_during_start_s``, CPU
    seconds that add no wall time), the Ray tasks at full parallelism (task seconds / CPUs) less their
    warm-up, the warm-up (a process's first call of a step beyond the step's median call: the
    imports it pays), and the rest: the driver's serial steps (plan, index merge, manifest, publish,
    shutdown), scheduling gaps and idle CPUs, and the imports a worker pays before a call starts."""
    startup = sum(task["seconds"] for task in tasks if task["step"] == RUNTIME_START)
    in_driver = sum(task["seconds"] for task in tasks if task["step"] != RUNTIME_START and task["node"] == "driver")
    calls = [task for task in tasks if task["step"] != RUNTIME_START and task["node"] != "driver"]
    warmup = 0.0
    for step in {task["step"] for task in calls}:
        seconds = [task["seconds"] for task in calls if task["step"] == step]
        typical = statistics.median(seconds)
        warmup += sum(max(t["seconds"] - typical, 0.0) for t in calls if t["step"] == step and t["first_in_process"])
    parallel = sum(task["seconds"] for task in calls) / cpus
    return {
        "runtime_start_s": round(startup, 2),
        "driver_calls_during_start_s": round(in_driver, 2),
        "tasks_s": round(parallel - warmup / cpus, 2),
        "task_warmup_imports_s": round(warmup / cpus, 2),
        "driver_serial_and_idle_s": round(wall_s - startup - parallel, 2),
    }


def arm(runs: list[dict], name: str, events: int) -> dict:
    wall = statistics.median(run[name]["wall_s"] for run in runs)
    peak = max(runs, key=lambda run: run[name]["peak_rss_bytes"])[name]
    return {
        "wall_s": wall,
        "events_per_s": events / wall,
        "peak_rss_bytes": peak["peak_rss_bytes"],
        "peak_rss_by_role": peak["peak_rss_by_role"],
        "runs_wall_s": [run[name]["wall_s"] for run in runs],
        "runs_peak_rss_bytes": [run[name]["peak_rss_bytes"] for run in runs],
    }


def ray_arm(runs: list[dict], name: str, local: dict, events: int) -> dict:
    """One Ray arm against the local executor: medians, ratio, the tasks' throughput, the wall split."""
    ray = arm(runs, name, events)
    identical = all(
        {**run[name]["manifest"], "engine": None} == {**run["prepare"]["manifest"], "engine": None} for run in runs
    )
    ray["tasks"] = task_throughput(runs[-1][name]["tasks"], events, WORKERS)
    ray["wall_split"] = overhead_split(runs[-1][name]["tasks"], runs[-1][name]["wall_s"], WORKERS)
    ratio = ray["events_per_s"] / local["events_per_s"]
    return {"arm": ARMS[name], **ray, "throughput_ratio_vs_local": ratio, "manifest_identical_but_engine": identical}


def print_row(label: str, cells: list[str]) -> None:
    print(f"{label:24}{cells[0]:>16}{cells[1]:>24}{cells[2]:>24}")


def vs_local(ratio: float, side: dict) -> str:
    return f" ({ratio:.2f}x)" if "arm" in side else ""


def ray_result(result: dict, runs: list[dict], events: int) -> None:
    """Both Ray arms against the local executor: medians, ratios, per-role RSS, tasks' throughput."""
    local = arm(runs, "prepare", events)
    cold, attached = ray_arm(runs, "ray", local, events), ray_arm(runs, "ray_attached", local, events)
    result["local_engine"], result["ray"], result["ray_attached"] = local, cold, attached
    result["ray_target_reads_on"] = (
        "ray_attached: a job's throughput on a running cluster; the start of a runtime is paid once per "
        "cluster, not per job. ray (a runtime started for the job) is kept as ray_cold_start_*."
    )
    limit = result["prepare"]["memory_limit_bytes"]
    targets = result["targets"]
    targets["ray_throughput_ratio_ge_0.7"] = attached["throughput_ratio_vs_local"] >= 0.7
    targets["ray_cold_start_throughput_ratio_ge_0.7"] = cold["throughput_ratio_vs_local"] >= 0.7
    targets["ray_peak_rss_under_limit"] = cold["peak_rss_bytes"] < limit


def print_ray(result: dict) -> None:
    """The side-by-side table of the local executor and both Ray arms (``ray_result``'s figures)."""
    local, cold, attached = result["local_engine"], result["ray"], result["ray_attached"]
    sides = (local, cold, attached)
    print_row("engine on this host", ["local", "ray, own runtime", "ray, attached"])
    print_row("wall time (s)", [f"{s['wall_s']:.1f}" + vs_local(s["wall_s"] / local["wall_s"], s) for s in sides])
    ratios = [f"{s['events_per_s']:,.0f}" + vs_local(s["events_per_s"] / local["events_per_s"], s) for s in sides]
    print_row("events/s (vs local)", ratios)
    print_row("peak RSS, tree (MB)", [f"{s['peak_rss_bytes'] / 2**20:,.0f}" for s in sides])
    for role in sorted({role for side in sides for role in side["peak_rss_by_role"]}):
        entries = [side["peak_rss_by_role"].get(role) for side in sides]
        cells = [f"{e['max_peak_rss_bytes'] / 2**20:,.0f} x{e['processes']}" if e else "-" for e in entries]
        print_row(f"  max {role} (MB)", cells)
    print("(attached: the tree counts the cluster's processes; --ray-address bounds only the job's data)")
    for side in (cold, attached):
        tasks, split = side["tasks"], side["wall_split"]
        print(
            f"{side['arm']}: tasks {tasks['task_seconds']} task-s by step {tasks['task_seconds_by_step']}, "
            f"{tasks['per_node_events_per_s']:,.0f} events/s per {tasks['cpus_per_node']}-CPU node"
        )
        print("  wall split (s, last run): " + ", ".join(f"{key} {value}" for key, value in split.items()))
        print(f"  same manifest as local apart from the engine field: {side['manifest_identical_but_engine']}")


def one_round(sources: Path, work: Path, memory_limit: str, ray: bool) -> dict:
    """One interleaved round: the baseline, prepare, and (with ``ray``) both Ray arms."""
    base = run_baseline(sources, work)
    ours = run_prepare(sources, work, memory_limit)
    cold = run_prepare(sources, work, memory_limit, "ray") if ray else None
    attached = run_attached(sources, work, memory_limit) if ray else None
    return {"baseline": base, "prepare": ours, "ray": cold, "ray_attached": attached}


def summarize(args: argparse.Namespace, runs: list[dict], limit: int) -> dict:
    """The report of the rounds run so far (medians, peaks, ratios, targets); no round: targets not met."""
    if not runs:
        return {"preset": args.preset, "repeat": args.repeat, "rounds": 0, "target_met": False}
    manifest = runs[-1]["prepare"]["manifest"]
    events = manifest["rows"]["events_read"]
    base_wall = statistics.median(run["baseline"]["wall_s"] for run in runs)
    ours_wall = statistics.median(run["prepare"]["wall_s"] for run in runs)
    base_rss = max(run["baseline"]["peak_rss_bytes"] for run in runs)
    ours_rss = max(run["prepare"]["peak_rss_bytes"] for run in runs)
    events_baseline = runs[-1]["baseline"]["events"]
    result = {
        "preset": args.preset,
        "environment": {"cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0]},
        "events": events,
        "repeat": args.repeat,
        "rounds": len(runs),
        "baseline": {
            "wall_s": base_wall,
            "events_per_s": events_baseline / base_wall,
            "peak_rss_bytes": base_rss,
            "events": events_baseline,
            "runs_wall_s": [run["baseline"]["wall_s"] for run in runs],
        },
        "prepare": {
            "wall_s": ours_wall,
            "events_per_s": events / ours_wall,
            "peak_rss_bytes": ours_rss,
            "memory_limit_bytes": limit,
            "samples": manifest["rows"]["samples"],
            "straggler_pct": manifest["balance"]["straggler_pct"],
            "runs_wall_s": [run["prepare"]["wall_s"] for run in runs],
            "runs_peak_rss_bytes": [run["prepare"]["peak_rss_bytes"] for run in runs],
        },
        "runs_throughput_ratio": [run["baseline"]["wall_s"] / run["prepare"]["wall_s"] for run in runs],
    }
    ratio = result["prepare"]["events_per_s"] / result["baseline"]["events_per_s"]
    result["throughput_ratio"] = ratio
    result["targets"] = {
        "throughput_ratio_ge_0.5": ratio >= 0.5,
        "peak_rss_under_limit": ours_rss < limit,
    }
    if args.ray:
        ray_result(result, runs, events)
    result["target_met"] = result["targets"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="large")
    parser.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "freescale-bench-data"))
    parser.add_argument("--memory-limit", default="2GB")
    parser.add_argument(
        "--repeat", type=int, default=3, help="interleaved runs of each (default 3); medians are compared"
    )
    parser.add_argument("--out", default=str(RESULTS / "bench_prepare.json"))
    parser.add_argument("--no-ray", dest="ray", action="store_false", help="skip the --executor ray arms")
    args = parser.parse_args()
    if args.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    from freescale.pipeline.config import parse_size

    limit = parse_size(args.memory_limit, "--memory-limit")
    data = ensure_preset(args.preset, args.data_dir)
    sources = data / "sources.toml"
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    runs: list[dict] = []
    recorder = Points("bench_prepare", Path(args.out), lambda: summarize(args, runs, limit))
    try:
        for i in range(args.repeat):  # interleaved, so a slow spell of the machine hits every side
            one = recorder.run(
                f"round {i + 1}", one_round, sources, work, args.memory_limit, args.ray, keep=runs.append
            )
            if one is None:
                continue
            base, ours, ray, attached = one["baseline"], one["prepare"], one["ray"], one["ray_attached"]
            print(
                f"run {i + 1}/{args.repeat}: baseline {base['wall_s']:.1f} s, prepare {ours['wall_s']:.1f} s "
                f"(ratio {base['wall_s'] / ours['wall_s']:.2f}), prepare peak RSS "
                f"{ours['peak_rss_bytes'] / 2**20:,.0f} MB"
                + (f"; ray {ray['wall_s']:.1f} s, attached {attached['wall_s']:.1f} s" if ray and attached else "")
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = recorder.save(final=True)
    print(f"wrote {args.out}")
    if not runs:
        print("every round failed: see failures in the JSON")
        return 1
    base_wall, ours_wall = result["baseline"]["wall_s"], result["prepare"]["wall_s"]
    base_rss, ours_rss = result["baseline"]["peak_rss_bytes"], result["prepare"]["peak_rss_bytes"]
    print(f"\nmedian of {len(runs)} interleaved runs; peak RSS is the largest of any run")
    print(f"{'':24}{'baseline (polars)':>20}{'freescale prepare':>20}{'ratio':>10}")
    print(f"{'wall time (s)':24}{base_wall:>20.1f}{ours_wall:>20.1f}{ours_wall / base_wall:>10.2f}")
    print(
        f"{'events/s':24}{result['baseline']['events_per_s']:>20,.0f}{result['prepare']['events_per_s']:>20,.0f}"
        f"{result['throughput_ratio']:>10.2f}"
    )
    rss_ratio = ours_rss / max(base_rss, 1)
    print(f"{'peak RSS (MB)':24}{base_rss / 2**20:>20,.0f}{ours_rss / 2**20:>20,.0f}{rss_ratio:>10.2f}")
    if args.ray:
        print_ray(result)
    print(f"memory limit {limit / 2**20:,.0f} MB; targets: {result['targets']}")
    return recorder.exit_code()


if __name__ == "__main__":
    sys.exit(main())
