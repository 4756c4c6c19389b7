"""bench_loader: samples/s of the public loader (KJT output, 2 workers) against a bare StreamingDataset.

One run, one prepared dataset, read locally and through a moto S3 server (a separate ``moto_server``
process on 127.0.0.1, so its request handling does not share a GIL with either reader):

- ``freescale loader``: ``freescale.pipeline.dataset.loader.Loader`` at world size 1 over one epoch,
  ``output = "kjt"`` (ids mapped to exact rows, leave-one-out holdout, a TorchRec
  ``KeyedJaggedTensor`` per micro-batch), 2 worker processes, prefetch 2;
- ``bare streaming``: what a user would write without FreeScale — mosaicml-streaming's
  ``StreamingDataset`` over the same shards (``shuffle=False``) in a ``torch.utils.data.DataLoader``
  with the same 2 workers, batches of the same size as lists of decoded samples (no collation).

Both count the rows of the dataset they read (every row once), wall time from the first ``iter`` to
the last batch (worker start-up included). Each S3 repeat starts from an empty shard cache, so both
arms download every shard. Arms run ``--repeat`` times interleaved (bare, ours, bare, ours, ...) and
the medians are compared, since this host's cores drift ~10% in speed.

Target (issue 18): ours >= 0.9x the bare iteration's samples/s, locally and on S3. The trainer's
``data`` share of step time is measured by ``bench_bubbles.py`` (its JSON: ``runs[].data_pct``).

    python benchmarks/bench_loader.py            # ~2 minutes on 2 cores
    python benchmarks/bench_loader.py --quick    # smoke run, no result file unless --out
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from measure import Points, machine

RESULTS = Path(__file__).resolve().parent / "results" / "bench_loader.json"
TARGET_RATIO = 0.9
ARMS = ("bare streaming", "freescale loader")
LABELS = {
    "bare streaming": "bare StreamingDataset (2 workers)",
    "freescale loader": "freescale loader (kjt, 2 workers)",
}


@dataclass
class Settings:
    users: int = 20_000
    items: int = 20_000
    median: float = 60.0
    sigma: float = 1.2
    cap: int = 1024
    group_size: int = 8
    micro_batch_size: int = 32
    workers: int = 2
    repeat: int = 3
    seed: int = 0


def make_data(s: Settings, work: Path) -> str:
    """The dataset both arms read: the demo generator scaled down, prepared with G and k."""
    from freescale.datasets.presets import preset
    from freescale.datasets.synthetic import generate
    from freescale.pipeline.balance import BalanceConfig
    from freescale.pipeline.config import PrepareConfig, SampleConfig
    from freescale.pipeline.prepare import prepare

    config = preset(
        "demo", n_users=s.users, n_items=s.items, median=s.median, sigma=s.sigma, max_len=s.cap, seed=s.seed
    )
    generate(config, str(work / "sources"))
    out = work / "prepared"
    prepare(
        PrepareConfig(
            sources=str(work / "sources" / "sources.toml"),
            output=str(out),
            samples=SampleConfig(max_uih_len=s.cap),
            balance=BalanceConfig(group_size=s.group_size, micro_batch_size=s.micro_batch_size, seed=s.seed),
            workers=1,
            progress=False,
            overwrite=True,
        )
    )
    return str(out)


def start_s3(work: Path) -> tuple[subprocess.Popen, str]:
    """``moto_server`` on a free loopback port; the environment points S3 clients at it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=work,
    )
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        S3_ENDPOINT_URL=endpoint,
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, endpoint
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"moto_server did not start on port {port}")


def upload(local: str, endpoint: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="bench")
    for path in Path(local).rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "bench", f"prepared/{path.relative_to(local)}")
    return "s3://bench/prepared"


def read_bare(uri: str, cache: Path, s: Settings) -> int:
    """Every row through ``StreamingDataset`` in a 2-worker DataLoader; returns the rows read."""
    from torch.utils.data import DataLoader

    from freescale.pipeline.streaming_modules import streaming_dataset_class

    remote = uri if uri.startswith("s3://") else None
    dataset = streaming_dataset_class()(
        remote=remote, local=str(cache) if remote else uri, shuffle=False, batch_size=s.micro_batch_size
    )
    batches = DataLoader(
        dataset, batch_size=s.micro_batch_size, collate_fn=list, num_workers=s.workers, prefetch_factor=2
    )
    return sum(len(batch) for batch in batches)


def read_ours(uri: str, cache: Path, s: Settings) -> int:
    """Every step of one epoch at world size 1 as ``KJTBatch``; returns the rows read."""
    from freescale.pipeline.dataset.loader import Config, Loader

    config = Config(path=uri, output="kjt", num_workers=s.workers, prefetch_factor=2, cache_dir=str(cache))
    loader = Loader(config)
    for _ in loader:
        pass
    return int(loader.dataset.offsets[-1])


def measure(arm: str, uri: str, cache: Path, s: Settings) -> dict[str, float]:
    from freescale.pipeline.streaming_modules import import_streaming_module

    shutil.rmtree(cache, ignore_errors=True)
    import_streaming_module("streaming.base.util").clean_stale_shared_memory()
    start = time.perf_counter()
    rows = (read_bare if arm == "bare streaming" else read_ours)(uri, cache, s)
    seconds = time.perf_counter() - start
    return {"rows": rows, "seconds": seconds, "samples_per_s": rows / seconds}


def run(s: Settings, work: Path, out: Path | None) -> dict[str, Any]:
    """Every (repeat, location, arm) read, each one a ``Points`` point (the JSON at ``out`` rewritten
    after each); returns the final report."""
    from freescale.pipeline.dataset.kjt import register_pipelineable

    local = make_data(s, work)
    register_pipelineable()  # imports TorchRec once (seconds) before any timing: a process cost, not a pass's
    runs: dict[str, dict[str, list[dict[str, float]]]] = {loc: {arm: [] for arm in ARMS} for loc in ("local", "s3")}

    def report() -> dict[str, Any]:
        return {
            "settings": asdict(s),
            **summarize(runs),
            "machine": machine(),
            "note": "medians over interleaved repeats; wall time includes worker start-up; S3 = moto_server on "
            "loopback, empty shard cache per repeat",
        }

    recorder = Points("bench_loader", out, report)
    server, endpoint = start_s3(work)
    try:
        locations = {"local": local, "s3": upload(local, endpoint)}
        for repeat in range(s.repeat):
            for location, uri in locations.items():
                for arm in ARMS:
                    cache = work / f"cache-{location}-{arm.split()[0]}"
                    kept = runs[location][arm]
                    if recorder.run(f"{location} {arm} repeat {repeat}", measure, arm, uri, cache, s, keep=kept.append):
                        print(f"repeat {repeat} {location:5} {arm:17} {kept[-1]['samples_per_s']:10.0f}/s")
    finally:
        server.terminate()
        server.wait()
    return recorder.save(final=True)


def summarize(runs: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    """Medians per (location, arm) and ours/bare per location; a location missing an arm (every
    read of it failed) has no ratio and its target is not met."""
    rows, comparisons = [], {}
    for location, arms in runs.items():
        medians = {
            arm: statistics.median(r["samples_per_s"] for r in results) for arm, results in arms.items() if results
        }
        bare = medians.get("bare streaming")
        for arm in ARMS:
            if arm not in medians:
                continue
            rows.append(
                {
                    "location": location,
                    "arm": arm,
                    "samples_per_s": medians[arm],
                    "samples_per_s_by_repeat": [r["samples_per_s"] for r in arms[arm]],
                    "rows": arms[arm][0]["rows"],
                    "ratio_to_bare": medians[arm] / bare if bare else None,
                }
            )
        ratio = medians["freescale loader"] / bare if bare and "freescale loader" in medians else None
        comparisons[f"ours_over_bare_{location}"] = ratio
        comparisons[f"target_met_{location}"] = ratio is not None and ratio >= TARGET_RATIO
    comparisons["target"] = f"freescale loader (kjt, 2 workers) >= {TARGET_RATIO}x bare StreamingDataset samples/s"
    comparisons["target_met"] = all(v for k, v in comparisons.items() if k.startswith("target_met_"))
    return {"rows": rows, "comparisons": comparisons}


def print_table(summary: dict[str, Any]) -> None:
    print(f"{'location':9} {'reader':36} {'samples/s':>10} {'vs bare':>8}")
    for row in summary["rows"]:
        ratio = f"{row['ratio_to_bare']:7.2f}x" if row["ratio_to_bare"] is not None else f"{'-':>8}"
        print(f"{row['location']:9} {LABELS[row['arm']]:36} {row['samples_per_s']:10.0f} {ratio}")
    c = summary["comparisons"]
    for location in ("local", "s3"):
        verdict = "met" if c[f"target_met_{location}"] else "NOT met"
        ratio = c[f"ours_over_bare_{location}"]
        print(f"target {location}: ours/bare {'-' if ratio is None else f'{ratio:.2f}'} >= {TARGET_RATIO}: {verdict}")


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    locations = ["local", "s3"]
    for offset, arm in ((-0.2, "bare streaming"), (0.2, "freescale loader")):
        values = [
            next((r["samples_per_s"] for r in summary["rows"] if r["location"] == loc and r["arm"] == arm), 0.0)
            for loc in locations
        ]
        ax.bar([i + offset for i in range(len(locations))], values, width=0.4, label=arm)
    ax.set_xticks(range(len(locations)), locations)
    ax.set_ylabel("samples/s (median)")
    ax.set_title("loader throughput, 2 workers")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    s = Settings(users=300, items=2_000, cap=256, repeat=1) if args.quick else Settings()
    if args.repeat:
        s.repeat = args.repeat
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out) if args.out else (None if args.quick else RESULTS)
    with tempfile.TemporaryDirectory(prefix="bench_loader-") as tmp:
        report = run(s, Path(tmp), out)
    print_table(report)
    if out is not None:
        plot(report, out.with_suffix(".png"))
        print(f"wrote {out}")
    return 1 if report["points_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
