"""bench_stats: wall time and peak memory of ``freescale stats`` against a raw polars baseline.

Both run in one invocation on the same generated sources (the ``large`` preset by default, ~25M
events). The baseline is the least a user would write to learn the UIH length distribution:
polars scans every source, counts events per user (string user ids mapped with the same
``stable_id`` so sources agree) and sums over sources — per-user lengths only: no validation, no
time merge, no truncation, no ids, no batching figures.

``freescale stats`` runs twice with the same ``--work-dir``:

* cold — an empty work directory: ``prepare``'s scan (k-core off), the partitions' samples built
  into id records, and every figure (lengths, sparsity, straggler predictions at W = 8, 64, 256,
  batch_overlap_rate curve, popularity, hash collisions, plots);
* warm — the scan resumes from its completion markers (its spill files are kept with
  ``--work-dir``): what a second run, e.g. with other W or table sizes, pays.

Every arm runs ``--repeats`` times (default 3), interleaved, and the run with the median wall time
is reported (the host is shared and its cores drift: docs/design.md#pitfalls); ``wall_s_each`` keeps every run.
Peak RSS is the peak of the summed RSS of the whole process tree (workers included), sampled every
50 ms. Target (issue 3): stats ≤ 2× the baseline's wall time.

Targets restated (issue 19), measured in the same run: exact ``stats`` cold costs no more wall time
than ``prepare`` on the same sources (same memory limit and workers), and ``stats --sample-fraction
0.1`` (cold, its own work directory) ≤ 2× the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import psutil
from measure import FREESCALE, Points, ensure_preset, run_measured

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
TARGET_RATIO = 2.0
ARMS = ("baseline", "cold", "warm", "sampled", "prepare")

BASELINE = r"""
import sys, polars as pl
from freescale import storage
from freescale.datasets.config import SourcesConfig
from freescale.datasets.ids import stable_id
config = SourcesConfig.from_toml(sys.argv[1])
per_source = []
for source in config.sources:
    files = storage.expand(config.resolve(source.path))
    if source.format == "parquet":
        frame = pl.scan_parquet(files)
    elif source.format == "jsonl":
        frame = pl.scan_ndjson(files, infer_schema_length=10000)
    else:
        frame = pl.scan_csv(files, separator="\t" if source.format == "tsv" else ",")
    users = frame.group_by(pl.col(source.columns["user"]).alias("user")).agg(pl.len().alias("n")).collect()
    if users["user"].dtype == pl.String:
        users = users.with_columns(pl.Series("user", stable_id(users["user"].to_arrow())))
    per_source.append(users.with_columns(pl.col("user").cast(pl.Int64), pl.col("n").cast(pl.Int64)))
lengths = pl.concat(per_source).group_by("user").agg(pl.col("n").sum())["n"]
print(lengths.len(), lengths.sum(), lengths.mean(), lengths.quantile(0.99), lengths.max())
"""


def _median(runs: list[dict]) -> dict:
    """The run with the median wall time (its stdout and peak RSS come with it)."""
    return sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]


def one_round(work: Path, commands: dict[str, list[str]]) -> dict:
    """One interleaved round: polars, stats cold, stats warm, ``--sample-fraction 0.1``, prepare (each
    from empty output and work directories but warm's, which resumes cold's); the cold run's
    ``stats.json`` comes with it, its event count checked against the baseline's."""
    for folder in ("stats", "work", "work-sampled", "ds"):
        shutil.rmtree(work / folder, ignore_errors=True)
    runs = {"baseline": run_measured(commands["baseline"], "baseline")}
    runs["cold"] = run_measured(commands["stats"], "stats cold")
    runs["warm"] = run_measured(commands["stats"], "stats warm")
    report = json.loads((work / "stats" / "stats.json").read_text())
    runs["sampled"] = run_measured(commands["sampled"], "stats sampled")
    runs["prepare"] = run_measured(commands["prepare"], "prepare")
    events = int(runs["baseline"]["stdout"].strip().splitlines()[-1].split()[1])
    if events != report["rows"]["events_read"]:
        raise RuntimeError(f"baseline counted {events} events, stats read {report['rows']['events_read']}")
    return {"runs": runs, "report": report}


def summarize(args: argparse.Namespace, rounds: list[dict], load_before: float) -> dict:
    """The report of the rounds run so far: per arm the run with the median wall time; no round:
    targets not met."""
    if not rounds:
        return {"benchmark": "bench_stats", "preset": args.preset, "rounds": 0, "target_met": False}
    runs = {name: [r["runs"][name] for r in rounds] for name in ARMS}
    report = rounds[-1]["report"]
    base, cold, warm, sampled, prepared = (_median(runs[name]) for name in ARMS)
    users, events, mean, p99, longest = base["stdout"].strip().splitlines()[-1].split()
    at = report["straggler"]["by_world_size"]
    result = {
        "benchmark": "bench_stats",
        "preset": args.preset,
        "environment": {
            "cpus": psutil.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "memory_limit": args.memory_limit,
            "workers": args.workers,
            "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        },
        "events": report["rows"]["events_read"],
        "repeats": args.repeats,
        "rounds": len(rounds),
        "wall_s_each": {name: [round(r["wall_s"], 3) for r in each] for name, each in runs.items()},
        "baseline": {
            "wall_s": base["wall_s"],
            "peak_rss_bytes": base["peak_rss_bytes"],
            "users": int(users),
            "events": int(events),
            "mean_length": float(mean),
            "p99_length": float(p99),
            "max_length": int(longest),
        },
        "stats_cold": {"wall_s": cold["wall_s"], "peak_rss_bytes": cold["peak_rss_bytes"]},
        "stats_warm": {"wall_s": warm["wall_s"], "peak_rss_bytes": warm["peak_rss_bytes"]},
        "stats_sample_fraction_0.1": {"wall_s": sampled["wall_s"], "peak_rss_bytes": sampled["peak_rss_bytes"]},
        "prepare": {"wall_s": prepared["wall_s"], "peak_rss_bytes": prepared["peak_rss_bytes"]},
        "figures": {
            "samples": report["lengths"]["merged"]["count"],
            "mean_length": report["lengths"]["merged"]["mean"],
            "p99_length": report["lengths"]["merged"]["p99"],
            "sparsity": report["sparsity"]["random"]["sparsity"],
            "wasted_compute_pct": report["sparsity"]["random"]["wasted_compute_pct"],
            "straggler_pct": {w: {s: e.get("straggler_pct") for s, e in v.items()} for w, v in at.items()},
            "batch_overlap_rate_item": report["batch_overlap"]["headline"]["tables"]["item"]["batch_overlap_rate"],
            "headline_global_batch_size": report["batch_overlap"]["headline"]["global_batch_size"],
            "zipf_exponent": report["popularity"]["zipf_exponent"],
        },
    }
    ratio_cold = cold["wall_s"] / base["wall_s"]
    ratio_warm = warm["wall_s"] / base["wall_s"]
    result["wall_ratio_cold"] = ratio_cold
    result["wall_ratio_warm"] = ratio_warm
    result["scan_s_estimate"] = cold["wall_s"] - warm["wall_s"]
    result["targets"] = {
        f"cold_wall_le_{TARGET_RATIO:g}x_baseline": ratio_cold <= TARGET_RATIO,
        f"warm_wall_le_{TARGET_RATIO:g}x_baseline": ratio_warm <= TARGET_RATIO,
        "cold_wall_le_prepare_wall": cold["wall_s"] <= prepared["wall_s"],
        f"sample_fraction_0.1_wall_le_{TARGET_RATIO:g}x_baseline": sampled["wall_s"] / base["wall_s"] <= TARGET_RATIO,
    }
    result["target_met"] = result["targets"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="large")
    parser.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "freescale-bench-data"))
    parser.add_argument("--memory-limit", default="2GB")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS / "bench_stats.json"))
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")

    freescale = FREESCALE
    data = ensure_preset(args.preset, args.data_dir)
    load_before = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    work = Path(tempfile.mkdtemp(prefix="bench-stats-"))
    stats_cmd = [
        *freescale,
        "stats",
        str(data / "sources.toml"),
        "--out",
        str(work / "stats"),
        "--work-dir",
        str(work / "work"),
        "--memory-limit",
        args.memory_limit,
        "--workers",
        str(args.workers),
        "--quiet",
    ]
    sampled_cmd = [*stats_cmd, "--sample-fraction", "0.1", "--no-plots"]
    sampled_cmd[sampled_cmd.index(str(work / "work"))] = str(work / "work-sampled")
    prepare_cmd = [*freescale, "prepare", "--sources", str(data / "sources.toml"), "--output", str(work / "ds")]
    prepare_cmd += ["--memory-limit", args.memory_limit, "--workers", str(args.workers), "--quiet"]
    baseline_cmd = [sys.executable, "-c", BASELINE, str(data / "sources.toml")]
    commands = {"baseline": baseline_cmd, "stats": stats_cmd, "sampled": sampled_cmd, "prepare": prepare_cmd}
    rounds: list[dict] = []
    recorder = Points("bench_stats", Path(args.out), lambda: summarize(args, rounds, load_before))
    try:
        for repeat in range(args.repeats):  # interleaved: a slow spell of the host hits every arm alike
            print(f"repeat {repeat + 1}/{args.repeats}: polars, stats cold, warm, --sample-fraction 0.1, prepare")
            recorder.run(f"repeat {repeat + 1}", one_round, work, commands, keep=rounds.append)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = recorder.save(final=True)
    print(f"wrote {args.out}")
    if not rounds:
        print("every repeat failed: see failures in the JSON")
        return 1
    report = rounds[-1]["report"]
    base = {**result["baseline"]}
    cold, warm = result["stats_cold"], result["stats_warm"]
    sampled, prepared = result["stats_sample_fraction_0.1"], result["prepare"]
    ratio_cold, ratio_warm = result["wall_ratio_cold"], result["wall_ratio_warm"]
    mb = 2**20
    print(f"\n{'':20}{'baseline (polars)':>19}{'stats cold':>13}{'ratio':>8}{'stats warm':>13}{'ratio':>8}")
    print(
        f"{'wall time (s)':20}{base['wall_s']:>19.1f}{cold['wall_s']:>13.1f}{ratio_cold:>8.2f}"
        f"{warm['wall_s']:>13.1f}{ratio_warm:>8.2f}"
    )
    print(
        f"{'peak RSS (MB)':20}{base['peak_rss_bytes'] / mb:>19,.0f}{cold['peak_rss_bytes'] / mb:>13,.0f}"
        f"{cold['peak_rss_bytes'] / max(base['peak_rss_bytes'], 1):>8.2f}{warm['peak_rss_bytes'] / mb:>13,.0f}"
        f"{warm['peak_rss_bytes'] / max(base['peak_rss_bytes'], 1):>8.2f}"
    )
    print(f"{'users / samples':20}{base['users']:>19,}{report['lengths']['merged']['count']:>13,}")
    print(
        f"{'mean / p99 length':20}{base['mean_length']:>12.1f} / {base['p99_length']:>4,.0f}"
        f"{report['lengths']['merged']['mean']:>8.1f} / {report['lengths']['merged']['p99']:,.0f}"
    )
    print(f"scan ≈ {result['scan_s_estimate']:.1f} s of the cold run (cold - warm)")
    print(f"{'':20}{'prepare':>19}{'stats cold':>13}{'ratio':>8}{'stats f=0.1':>13}{'/ base':>8}")
    print(
        f"{'wall time (s)':20}{prepared['wall_s']:>19.1f}{cold['wall_s']:>13.1f}"
        f"{cold['wall_s'] / prepared['wall_s']:>8.2f}"
        f"{sampled['wall_s']:>13.1f}{sampled['wall_s'] / base['wall_s']:>8.2f}"
    )
    print(f"targets: {result['targets']}")
    return recorder.exit_code()


if __name__ == "__main__":
    sys.exit(main())
