"""bench_prepare: throughput and peak memory of ``freescale prepare`` against a raw polars baseline.

Both run in one invocation on the same generated sources (the ``large`` preset by default, ≥ 20M
events). The baseline is what a user would write without FreeScale: polars reads every source, maps
the columns to a common schema and writes one Parquet file — no validation, no per-user sequences,
no cost model, no balancing. Peak RSS is the peak of the summed RSS of the whole process tree
(workers included), sampled every 50 ms.

Target (issue 2): prepare ≥ 0.5× the baseline's events/s, and peak RSS under ``--memory-limit``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from measure import FREESCALE, ensure_preset, run_measured, write_result

REPO = Path(__file__).resolve().parent.parent
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="large")
    parser.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "freescale-bench-data"))
    parser.add_argument("--memory-limit", default="2GB")
    parser.add_argument("--out", default=str(RESULTS / "bench_prepare.json"))
    args = parser.parse_args()

    freescale = FREESCALE
    data = ensure_preset(args.preset, args.data_dir)
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        print("baseline: polars reads the same sources and writes one Parquet file")
        base = run_measured(
            [sys.executable, "-c", BASELINE, str(data / "sources.toml"), str(work / "all.parquet")], "baseline"
        )
        events_baseline = int(base["stdout"].strip().splitlines()[-1])
        print(f"freescale prepare --memory-limit {args.memory_limit}")
        ours = run_measured(
            [
                *freescale,
                "prepare",
                "--sources",
                str(data / "sources.toml"),
                "--output",
                str(work / "prepared"),
                "--memory-limit",
                args.memory_limit,
                "--group-size",
                "64",
                "--micro-batch-size",
                "32",
                "--quiet",
            ],
            "prepare",
        )
        manifest = json.loads((work / "prepared" / "manifest.json").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)

    events = manifest["rows"]["events_read"]
    from freescale.pipeline.config import parse_size

    limit = parse_size(args.memory_limit, "--memory-limit")
    result = {
        "preset": args.preset,
        "environment": {"cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0]},
        "events": events,
        "baseline": {
            "wall_s": base["wall_s"],
            "events_per_s": events_baseline / base["wall_s"],
            "peak_rss_bytes": base["peak_rss_bytes"],
            "events": events_baseline,
        },
        "prepare": {
            "wall_s": ours["wall_s"],
            "events_per_s": events / ours["wall_s"],
            "peak_rss_bytes": ours["peak_rss_bytes"],
            "memory_limit_bytes": limit,
            "samples": manifest["rows"]["samples"],
            "straggler_pct": manifest["balance"]["straggler_pct"],
        },
    }
    ratio = result["prepare"]["events_per_s"] / result["baseline"]["events_per_s"]
    result["throughput_ratio"] = ratio
    result["targets"] = {
        "throughput_ratio_ge_0.5": ratio >= 0.5,
        "peak_rss_under_limit": ours["peak_rss_bytes"] < limit,
    }
    print(f"\n{'':24}{'baseline (polars)':>20}{'freescale prepare':>20}{'ratio':>10}")
    print(f"{'wall time (s)':24}{base['wall_s']:>20.1f}{ours['wall_s']:>20.1f}{ours['wall_s'] / base['wall_s']:>10.2f}")
    print(
        f"{'events/s':24}{result['baseline']['events_per_s']:>20,.0f}{result['prepare']['events_per_s']:>20,.0f}"
        f"{ratio:>10.2f}"
    )
    print(
        f"{'peak RSS (MB)':24}{base['peak_rss_bytes'] / 2**20:>20,.0f}{ours['peak_rss_bytes'] / 2**20:>20,.0f}"
        f"{ours['peak_rss_bytes'] / max(base['peak_rss_bytes'], 1):>10.2f}"
    )
    print(f"memory limit {limit / 2**20:,.0f} MB; targets: {result['targets']}")
    write_result(Path(args.out), result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
