"""Zero-collision ids (``model_extra.ids = "zch"``) on a stream with id churn, window by window:
collision rate, occupancy, next-window NDCG@10 / HR@10 and samples/s of three arms with the same data,
model and steps, then the probe kernel alone against TorchRec's ``HashZchManagedCollisionModule``.

The stream: ``freescale generate`` with item churn (``item_lifetime_days`` equal to the window, so
each window holds about twice the items alive at any instant) and user churn, item ids read as strings
(``id_types.item = "string"``: 63-bit hashed ids, as production ids are; the generator's own ids
are consecutive integers, which a modulo folds without collision inside any range shorter than the
table), cut into one prepared dataset per day (``prepare --time-window 1d --time-range``). Arms, each
one run continued window after window (``checkpoint.continue_on_new_data``), trained on window t and
evaluated on window t+1's users (``eval.data_path``, leave-one-out on the last event, full ranking over
window t+1's items, each scored by the row it reads: ``eval.catalogue = "items"``, so the items sharing a
modulo row with the target tie against it; ``--set catalogue=rows`` ranks table rows as before):

* ``oracle``: a row for every id of the whole stream. A zch table of 1.5x the stream's distinct items
  whose probe covers the whole bucket (``zch_max_probe = zch_bucket_size``): an id keeps its row
  for the whole run, nothing is evicted or shared (the JSON has its measured evictions and collisions,
  which must be 0). ``ids = "exact"`` itself cannot continue across windows (each window's dataset has
  its own vocabulary, refused by design), so the exact vocabulary of the whole stream is this table.
* ``hashed``: raw id modulo ``rows``; ``zch``: a zch table of ``rows`` slots (lru, 64-row buckets,
  each probed whole: the trainer's defaults). ``rows`` = 1.25x the peak live item count (the most
  distinct items of one window), rounded up to whole buckets. Same rows for both.

Step time: ``hashed`` maps raw ids to rows in the loader as ``ids = "exact"`` does, with no identity
table, so it is the exact-id path at the same rows; zch's target is against it (and the oracle's is
printed too). Collision rates: zch and the oracle from the run's own counters (trained lookups,
negatives included); ``hashed`` from every item event of the window (a lookup collides when another
item of the same window has its row).

Kernel: ``ZchTable.lookup(train=False)`` against TorchRec's ``remap`` in eval (read-only) mode, the only
mode its CPU kernel runs (training mode raises on CPU: recorded), on the same ids and table shape:
empty tables, and tables full of other ids (every probe runs ``max_probe`` slots and falls back);
ours also on a table that holds the queried ids (hits) and inserting (training mode).

    python benchmarks/bench_zch.py            # about 6 minutes on an idle 2-core host (a stream a CPU learns)
    python benchmarks/bench_zch.py --issue-scale   # the issue's stream (216,901 ids): CUDA; --device cpu: 17 minutes
    python benchmarks/bench_zch.py --quick    # smoke run, no result file unless --out
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
from measure import FREESCALE, Points, machine
from zch_kernel import kernel_point
from zch_report import ARMS, plot, print_kernel, print_segments, print_windows, targets
from zch_segments import EvalTargets, eval_targets, segments

from freescale.overrides import add_set_option
from freescale.trainer.eval.evaluate import EvalRanks

RESULTS = Path(__file__).resolve().parent / "results" / "bench_zch.json"
ISSUE_SCALE_RESULTS = RESULTS.with_name("bench_zch_issue_scale.json")  # its own file: the default run's stays
DAY_S = 86_400
CATALOGUE_NOTES = {  # what the note says full ranking ranked (Settings.catalogue)
    "items": "the next window's items, each scored by the row it reads (items sharing the target's row tie against it)",
    "rows": "the arm's table rows (each row standing for an item once)",
}


@dataclass
class Settings:
    # the stream (this default: one a 2-core CPU learns in its budget; ISSUE_SCALE: the issue's, for a GPU)
    n_users: int = 6_000
    n_items: int = 6_000  # items alive at any instant (slots)
    item_lifetime_days: float = 1.0  # = the window: a window holds about 2 x n_items distinct items
    user_lifetime_days: float = 1.0
    windows: int = 5  # days; trained on windows 0..windows-2, each evaluated on the next
    median: float = 60.0
    sigma: float = 0.9
    zipf: float = 0.9
    markov_prob: float = 0.6
    # the model and its training
    max_uih_len: int = 30
    micro_batch_size: int = 32
    steps_per_window: int = 400  # about 2 passes over a window's users (steps x micro_batch_size samples)
    eval_users: int = 2000  # next-window users evaluated (leave-one-out, last event; 400: HR@10 +-0.02)
    d_model: int = 32
    num_layers: int = 1
    num_heads: int = 2
    num_negatives: int = 128
    inbatch_negatives: int = 32
    dense_lr: float = 0.005
    sparse_lr: float = 0.1
    embedding_init: str = "dim"  # model_extra.embedding_init of every arm (rows: TorchRec's sqrt(1/rows))
    embedding_init_gain: float = 0.25
    threads: int = 1
    device: str = "cpu"  # engine.device of the training runs (cuda: the quality comparison at GPU speed)
    # the tables
    rows_factor: float = 1.25  # hashed / zch rows = this x the peak live item count
    oracle_factor: float = 1.5  # oracle slots = this x the stream's distinct items
    bucket_size: int = 64
    max_probe: int = 64  # the trainer's default: the whole bucket (zch_max_probe = 0)
    policy: str = "lru"
    lfu_halflife: int = 0  # policy lfu: training steps after which an unseen id's count halves (0: never)
    # the kernel
    kernel_slots: int = 65_536
    kernel_batches: tuple[int, ...] = (8_192, 65_536)
    kernel_repeats: int = 15
    kernel_step_slots: int = 12_288  # the steady training step: about the zch arm's rows
    kernel_step_ids: int = 650  # distinct ids a step looks up (the zch arm's, measured)
    kernel_step_new: int = 20  # of them never seen (its insert rate, about 3%)
    kernel_step_calls: int = 300
    kernel_step_large_slots: int = 1_048_576  # the same calls on a table this large: a call's cost is not the table's
    seed: int = 0
    catalogue: str = "items"  # eval.catalogue of every arm: "items" (next window's items) or "rows"


# The issue's stream (>= 200k distinct items over the days, <= ~60k alive at once): 7 days, 216,901 ids.
ISSUE_SCALE = Settings(n_users=32_000, n_items=36_000, windows=7, steps_per_window=2_000, d_model=128, device="cuda")
QUICK = Settings(n_users=300, n_items=300, windows=3, median=15.0, steps_per_window=3, eval_users=30,
                 kernel_slots=4_096, kernel_batches=(1_024,), kernel_repeats=3, kernel_step_slots=1_024,
                 kernel_step_ids=100, kernel_step_calls=10, kernel_step_large_slots=16_384)  # fmt: skip


# ---------------------------------------------------------------- the stream


def make_stream(s: Settings, work: Path) -> list[str]:
    """Generate the churned stream, read item ids as strings (63-bit hashed), prepare one dataset per day."""
    from freescale.datasets.presets import preset
    from freescale.datasets.synthetic import generate
    from freescale.pipeline.balance import BalanceConfig
    from freescale.pipeline.config import PrepareConfig, SampleConfig
    from freescale.pipeline.time_windows import prepare_windows

    config = preset("demo", n_users=s.n_users, n_items=s.n_items, median=s.median, sigma=s.sigma,
                    max_len=400, zipf=s.zipf, markov_prob=s.markov_prob, window_days=float(s.windows),
                    item_lifetime_days=s.item_lifetime_days, user_lifetime_days=s.user_lifetime_days,
                    click_files=2, purchase_files=1, seed=s.seed)  # fmt: skip
    generate(config, str(work / "sources"))
    sources = work / "sources" / "sources.toml"
    hashed = work / "sources" / "sources_hashed_items.toml"
    hashed.write_text(sources.read_text().replace("[sources.columns]", '[sources.id_types]\nitem = "string"\n\n'
                                                                         "[sources.columns]"))  # fmt: skip
    start = config.start_time
    index = prepare_windows(
        PrepareConfig(
            sources=str(hashed),
            output=str(work / "windows"),
            samples=SampleConfig(max_uih_len=s.max_uih_len),
            balance=BalanceConfig(group_size=1, micro_batch_size=s.micro_batch_size, seed=s.seed),
            workers=1,
            progress=False,
            overwrite=True,
            time_range=(start, start + s.windows * DAY_S),
        ),
        DAY_S,
    )
    missing = [f"{entry.name} ({entry.skipped})" for entry in index.windows if entry.path is None]
    if missing:  # each arm trains on a day and scores the next one: a gap would pair days two apart
        raise SystemExit(f"bench_zch: no dataset for {'; '.join(missing)}: every day of the stream needs one")
    return index.datasets(str(work / "windows"))


def window_items(path: str) -> np.ndarray:
    """Every item event (raw id) of a prepared window, in sample order."""
    from freescale.pipeline.dataset.reader import PreparedDataset

    dataset = PreparedDataset(path)
    parts = [np.asarray(sample["item_ids"], dtype=np.int64)
             for i in range(dataset.n_micro_batches) for sample in dataset.micro_batch(i)]  # fmt: skip
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def round_up(value: float, multiple: int) -> int:
    return int(-(-int(np.ceil(value)) // multiple) * multiple)


def table_sizes(distinct_per_window: list[int], stream_distinct: int, s: Settings) -> dict[str, int]:
    """Rows of each arm: hashed and zch 1.25x the peak live item count (whole buckets), the oracle 1.5x
    the stream's distinct items."""
    peak = max(distinct_per_window)
    rows = round_up(s.rows_factor * peak, s.bucket_size)
    return {"peak_live_items": peak, "rows": rows,
            "oracle_rows": round_up(s.oracle_factor * stream_distinct, s.bucket_size)}  # fmt: skip


def modulo_collisions(items: np.ndarray, rows: int, earlier_rows: np.ndarray | None = None) -> dict[str, Any]:
    """``raw id % rows`` on one window's item events: the share of lookups whose row another item of the
    window also uses (``collision_rate``), the share of rows used (``occupancy``), the share of the
    window's distinct items sharing a row, and (``earlier_rows``: rows used by earlier windows) the
    share of lookups landing on a row an earlier window's items trained."""
    ids, counts = np.unique(items, return_counts=True)
    row = ids % rows
    per_row = np.bincount(row, minlength=rows)
    shared = per_row[row] > 1
    lookups = int(counts.sum())
    result = {
        "lookups": lookups,
        "collision_rate": float(counts[shared].sum() / lookups) if lookups else 0.0,
        "items_sharing_a_row": float(shared.mean()) if len(ids) else 0.0,
        "occupancy": float((per_row > 0).sum() / rows),
        "distinct_items": len(ids),
    }
    if earlier_rows is not None:
        result["stale_row_rate"] = float(counts[earlier_rows[row]].sum() / lookups) if lookups else 0.0
    return result


# ---------------------------------------------------------------- training


def arm_ids(arm: str, sizes: dict[str, int], s: Settings) -> dict[str, Any]:
    if arm == "hashed":
        return {"ids": "hashed", "num_items": sizes["rows"]}
    if arm == "zch":
        return {"ids": "zch", "zch_size": sizes["rows"], "zch_bucket_size": s.bucket_size,
                "zch_max_probe": s.max_probe, "zch_policy": s.policy, "zch_lfu_halflife": s.lfu_halflife}  # fmt: skip
    return {"ids": "zch", "zch_size": sizes["oracle_rows"], "zch_bucket_size": s.bucket_size,
            "zch_max_probe": s.bucket_size, "zch_policy": s.policy, "zch_lfu_halflife": s.lfu_halflife}  # fmt: skip


def write_config(work: Path, arm: str, window: int, datasets: list[str], sizes: dict[str, int], s: Settings) -> str:
    from freescale.trainer.config_toml import write_run_toml

    checkpoint: dict[str, Any] = {"dir": str(work / arm / "ckpt")}
    if window:
        checkpoint |= {"resume": "latest", "continue_on_new_data": True}
    tables = {
        "model": {"d_model": s.d_model, "num_layers": s.num_layers, "num_heads": s.num_heads,
                  "num_negatives": s.num_negatives, "max_uih_len": s.max_uih_len},
        "model_extra": {"architecture": "hstu", "loss": "sampled_softmax", "inbatch_negatives": s.inbatch_negatives,
                        "embedding_init": s.embedding_init, "embedding_init_gain": s.embedding_init_gain,
                        **arm_ids(arm, sizes, s)},
        "data": {"path": datasets[window], "max_steps": s.steps_per_window, "seed": s.seed},
        "optimizer": {"dense_lr": s.dense_lr, "sparse_lr": s.sparse_lr},
        "engine": {"threads": s.threads, "seed": s.seed, "device": s.device},
        "eval": {"k": 10, "max_users": s.eval_users, "validation": False, "data_path": datasets[window + 1],
                 "write_ranks": True, "catalogue": s.catalogue},
        "checkpoint": checkpoint,
        "logging": {"out_dir": str(work / arm / f"w{window}"), "log_every": 10, "progress": False},
    }  # fmt: skip
    return write_run_toml(work / arm / f"w{window}.toml", tables)


def arm_folder(work: Path, arm: str, window: int) -> Path:
    """The arm's folder under ``work``: emptied at window 0, where its run starts (a reused ``--work``, or
    a retried first window, would leave a checkpoint folder another run owns: ``train`` refuses it);
    kept after, where the run continues from its last window's checkpoint."""
    folder = work / arm
    if window == 0 and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def train_window(work: Path, arm: str, window: int, datasets: list[str], sizes: dict[str, int],
                 s: Settings, targets: EvalTargets) -> dict[str, Any]:  # fmt: skip
    """One arm trained on ``window`` (continuing its run) and evaluated on the next window: its row, with
    its per-user ranks read by ``zch_segments`` (uncertainty; known against new targets)."""
    arm_folder(work, arm, window)
    config = write_config(work, arm, window, datasets, sizes, s)
    start = time.perf_counter()
    result = subprocess.run([*FREESCALE, "train", "--config", config, "--nproc", "1"], cwd=work,
                            capture_output=True, text=True)  # fmt: skip
    if result.returncode:
        raise RuntimeError(f"{arm} window {window} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    report = json.loads((work / arm / f"w{window}" / "bubbles.json").read_text())
    summary, test = report["summary"], report["protocol"]["test"]
    row = {
        "arm": arm,
        "window": window,
        "evaluated_on": window + 1,
        "seconds": time.perf_counter() - start,
        "steps": summary["steps"],
        "step_ms": summary["step_ms"],
        "samples_per_s": summary["samples_per_s"],
        "stage_ms": summary.get("stage_ms"),
        "ndcg@10": test["ndcg@10"],
        "hr@10": test["hr@10"],
        "eval_users": test["users"],
        "catalogue": test["catalogue"],
        "segments": segments(EvalRanks.read_csv(Path(test["ranks_file"])), targets),
    }
    zch = summary.get("zch", {}).get("item")
    if zch is not None:
        row["zch"] = zch
        row["collision_rate"] = zch["collision_rate"]
        row["occupancy"] = zch["occupancy"]
    return row


def rerun_kernel(out: Path, s: Settings) -> int:
    """The kernel point alone (after a change to the probe code), written into an existing results file
    whose windows stay as they were measured; its targets are re-judged with the new kernel figures."""
    if not out.is_file():
        raise SystemExit(f"bench_zch --kernel-only: {out} does not exist (run the whole benchmark first)")
    result = json.loads(out.read_text())
    began = time.perf_counter()
    kernel = kernel_point(s)
    result["kernel"] = kernel
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["kernel_rerun"] = {"wall_s": time.perf_counter() - began, "when": when}
    result["targets"] = targets(result["windows"], kernel)
    result["target_met"] = all(g["target_met"] for g in result["targets"].values()) and not result.get("failures")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_kernel(kernel)
    plot(result["windows"], kernel, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def settings_with(s: Settings, overrides: list[str]) -> Settings:
    """``s`` with ``--set KEY=VALUE`` items applied (scalar fields, typed; one-line error naming the key)."""
    from freescale.overrides import typed_overrides

    scalar = {name: kind for name, kind in get_type_hints(Settings).items() if kind in (int, float, str, bool)}
    return replace(s, **typed_overrides(overrides, scalar))


def default_results(quick: bool, issue_scale: bool) -> Path | None:
    """Where a run writes without ``--out``: a smoke run nowhere, the issue's scale a file of its own."""
    if quick:
        return None
    return ISSUE_SCALE_RESULTS if issue_scale else RESULTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny stream, 3 steps a window (smoke run)")
    scale = "the issue's stream: 7 days, 216,901 item ids, 2,000 steps a day, d_model 128, CUDA (or --device cpu)"
    parser.add_argument("--issue-scale", action="store_true", help=scale)
    parser.add_argument("--steps", type=int, help="training steps per window (default: Settings)")
    parser.add_argument("--windows", type=int, help="days of the stream (>= 2; default: Settings)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where the arms train (default: cpu)")
    add_set_option(parser, "a Settings field, e.g. --set d_model=128 --set sparse_lr=0.05", "KEY=VALUE")
    parser.add_argument("--skip-training", action="store_true", help="only the stream's figures and the kernel")
    keep = "rerun only the kernel point, keeping the windows of the results file (--out)"
    parser.add_argument("--kernel-only", action="store_true", help=keep)
    parser.add_argument("--out")
    parser.add_argument("--work")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else ISSUE_SCALE if args.issue_scale else Settings()
    if args.steps:
        s.steps_per_window = args.steps
    if args.windows:
        if args.windows < 2:
            parser.error(f"--windows must be >= 2 (train on one, evaluate on the next), got {args.windows}")
        s.windows = args.windows
    if args.device:
        s.device = args.device
    try:
        s = settings_with(s, args.overrides)
    except ValueError as error:
        parser.error(str(error))
    if s.catalogue not in CATALOGUE_NOTES:
        parser.error(f"--set catalogue must be one of {sorted(CATALOGUE_NOTES)}, got {s.catalogue!r}")
    os.environ.setdefault("OMP_NUM_THREADS", str(s.threads))
    out = Path(args.out) if args.out else default_results(args.quick, args.issue_scale)
    if args.kernel_only:
        if out is None:
            parser.error("--kernel-only --quick needs --out: a smoke kernel point would replace the measured one")
        return rerun_kernel(out, s)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_zch-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"bench_zch: generating and preparing {s.windows} windows into {work}", flush=True)
        datasets = make_stream(s, work)
        items = [window_items(path) for path in datasets]
        distinct = [len(np.unique(w)) for w in items]
        stream_distinct = len(np.unique(np.concatenate(items)))
        sizes = table_sizes(distinct, stream_distinct, s)
        stream = {"windows": len(datasets), "events_per_window": [len(w) for w in items],
                  "distinct_items_per_window": distinct, "stream_distinct_items": stream_distinct,
                  "items_alive_at_once": s.n_items, **sizes,
                  "next_window_items_seen_before": [
                      float(np.isin(items[t + 1], np.concatenate(items[: t + 1])).mean())
                      for t in range(len(items) - 1)]}  # fmt: skip
        hashed_stats, used = [], np.zeros(sizes["rows"], dtype=bool)
        for w in items:
            hashed_stats.append(modulo_collisions(w, sizes["rows"], used.copy()))
            used[np.unique(w % sizes["rows"])] = True
        print(f"bench_zch: {stream_distinct:,} distinct items over {len(datasets)} windows, peak "
              f"{sizes['peak_live_items']:,} a window; rows {sizes['rows']:,} (hashed, zch), oracle "
              f"{sizes['oracle_rows']:,}", flush=True)  # fmt: skip
        windows: list[dict[str, Any]] = [{"window": t} for t in range(len(datasets) - 1)]
        kernel: dict[str, Any] = {}
        broken: set[str] = set()

        def report() -> dict[str, Any]:
            done = [w for w in windows if any(arm in w for arm in ARMS)]
            return {
                "benchmark": "bench_zch",
                "settings": asdict(s),
                "note": "training reads the first steps_per_window x micro_batch_size samples of each window (a "
                "subsample of its users); evaluation: eval_users of the next window, leave-one-out on the last "
                f"event, full ranking over {CATALOGUE_NOTES[s.catalogue]}; segments: users whose target an "
                "earlier window held (known) or not (new), with HR@10 95% half-widths and NDCG@10 standard errors",
                "stream": stream,
                "windows": done,
                "kernel": kernel or None,
                "targets": (goals := targets(done, kernel)),
                "target_met": all(g["target_met"] for g in goals.values()) and not recorder.failed,
                "wall_s": time.perf_counter() - began,
                "machine": machine(),
            }

        recorder = Points("bench_zch", out, report)
        if not args.skip_training:
            for t, row in enumerate(windows):  # window-major: the arms of a window run back to back
                targets_t = eval_targets(datasets[t + 1], np.unique(np.concatenate(items[: t + 1])))
                for arm in ARMS:
                    if arm in broken:
                        continue
                    print(f"bench_zch: window {t}, {arm} ({time.perf_counter() - began:.0f} s)", flush=True)
                    value = recorder.run(f"window {t} {arm}", train_window, work, arm, t, datasets, sizes, s, targets_t)
                    if value is None:
                        broken.add(arm)  # its later windows would continue from an older checkpoint
                        continue
                    if arm == "hashed":
                        value |= {
                            k: hashed_stats[t][k]
                            for k in ("collision_rate", "occupancy", "items_sharing_a_row", "stale_row_rate")
                        }
                    row[arm] = value
                    recorder.save()
        print(f"bench_zch: kernel ({time.perf_counter() - began:.0f} s)", flush=True)
        recorder.run("kernel", kernel_point, s, keep=kernel.update)
        result = recorder.save(final=True)
    print(f"full ranking over {CATALOGUE_NOTES[s.catalogue]}")
    print_windows(result["windows"])
    print_segments(result["windows"])
    if kernel:
        print_kernel(kernel)
    for name, goal in result["targets"].items():
        print(f"{'met    ' if goal['target_met'] else 'NOT MET'} {name}")
    for label in recorder.failed:
        print(f"FAILED  {label} (see failures in the JSON)")
    if out is not None:
        plot(result["windows"], kernel, out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}")
    return recorder.exit_code()


if __name__ == "__main__":
    sys.exit(main())
