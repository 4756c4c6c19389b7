"""Fit ``cost(L) = a·L² + b·L + c`` in seconds on this hardware, for ``prepare --cost-model``.

The planner balances *predicted* cost, summed over a micro-batch's samples, and a rank's measured
time follows what the trainer *executes*, which is not a sum of isolated samples: a micro-batch runs
as a few padded length groups (``jagged.group_by_length``) with a fixed cost per group, shares its
sampled negatives, trains on ``length - 2`` inputs of a ``length``-event sample (held-out last event
and the next-item target) and gathers/scatters embedding rows. The first calibration timed batches
of one length each — one group, the fastest case — and the planned run of ``bench_bubbles`` showed
it: micro-batches the plan called equal (imbalance 1.0001) differed by 13.5% when timed alone.

So the calibration times *whole micro-batches* built by the trainer's own ``collate`` (mixed lengths
log-uniform over ``[3, max_len]`` plus equal-length ones to pin the quadratic term) through the
dense forward, the sampled-softmax loss and backward into the embedding rows, and fits
``t_mb = a·ΣL² + b·ΣL + c·n + d`` by non-negative least squares on micro-batch totals, in the
planner's units (``L`` = the sample's event count). ``d`` (per micro-batch) is the same for every
micro-batch of a step and cannot be split over samples; it is reported, not planned. Times are the
calling thread's CPU time (``time.thread_time``), the minimum over rounds that time every
micro-batch once: on a shared host other processes' load then neither inflates nor skews the fit.

    python -m freescale.trainer.simulate.calibrate --config run.toml --out cost.json   # then
    freescale prepare ... --cost-model cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from freescale import storage
from freescale.model_config import ModelConfig
from freescale.pipeline.cost import CostModel
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.trainer.data.batches import Batch, collate
from freescale.trainer.data.jagged import padded_sum_of_squares
from freescale.trainer.engines.engine import batch_loss
from freescale.trainer.learning_config import ModelExtraConfig
from freescale.trainer.model.transducer import SequentialTransducer, resolve_attention
from freescale.trainer.simulate.calibrate_options import HELP, add_arguments
from freescale.trainer.table_config import ZCH_DEFAULTS

CALIBRATION_ITEMS = 1_000  # item rows of the synthetic table when model_extra.num_items is 0 (from the data)


def synthetic_samples(lengths: list[int], num_items: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Prepared-sample dicts (what the reader yields) with ``lengths`` events each."""
    samples = []
    for user, n in enumerate(lengths):
        samples.append(
            {
                "user_id": user,
                "item_ids": rng.integers(0, num_items, n, dtype=np.int64),
                "actions": rng.integers(0, 8, n, dtype=np.int64),
                "timestamps": np.cumsum(rng.integers(1, 86_400, n, dtype=np.int64)),
                "cost": 0.0,
                "length": n,
            }
        )
    return samples


class MicroBatchTimer:
    """Times the trainer's dense work on one collated micro-batch: forward, loss, backward into rows.

    On CPU a micro-batch's time is the calling thread's CPU time; on CUDA it is wall time between
    device synchronisations (the work is the GPU's; the host only launches it), with the batch copied
    to the device before the clock starts, as the trainer's loader hands it over.
    """

    def __init__(self, model_cfg: ModelConfig, extra: ModelExtraConfig, seed: int = 0,
                 device: torch.device | None = None) -> None:  # fmt: skip
        torch.manual_seed(seed)
        self.device = device or torch.device("cpu")
        self.model = SequentialTransducer(model_cfg, extra).to(self.device)
        self.temperature = extra.temperature
        d = model_cfg.d_model
        self.items = (torch.randn(extra.num_items, d) * 0.1).to(self.device)
        self.actions = (torch.randn(extra.num_actions, d) * 0.1).to(self.device)

    def run(self, batch: Batch) -> None:
        """The trainer's ``engine.batch_loss`` + backward, whole tables standing in for the sharded rows."""
        items = self.items.clone().requires_grad_()
        actions = self.actions.clone().requires_grad_()
        rows = {"item": items[batch.item_ids], "action": actions[batch.action_ids], "neg": items[batch.negative_ids]}
        batch_loss(self.model, batch, rows, self.temperature).backward()
        self.model.zero_grad(set_to_none=True)

    def seconds(self, batches: list[Batch], rounds: int = 3) -> np.ndarray:
        """Per batch, the minimum time over ``rounds`` (each round times every batch once)."""
        batches = [batch.to(self.device) for batch in batches]
        for batch in batches[: min(2, len(batches))]:  # warm-up: allocator, first-call dispatch, kernel builds
            self.run(batch)
        best = np.full(len(batches), np.inf)
        for _ in range(rounds):
            for i, batch in enumerate(batches):
                best[i] = min(best[i], self._time(batch))
        return best

    def _time(self, batch: Batch) -> float:
        if self.device.type != "cuda":
            start = time.thread_time()
            self.run(batch)
            return time.thread_time() - start
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        self.run(batch)
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - start


def design_lengths(max_len: int, micro_batch_size: int, mixed: int, points: int, seed: int) -> list[list[int]]:
    """Event counts of the calibration micro-batches: ``mixed`` drawn log-uniform, ``points`` equal-length.

    Mixed micro-batches hold k/2, k or 2k samples in turn: with one count only, the per-sample
    constant ``c`` and the per-micro-batch constant ``d`` could not be told apart (free-count plans
    need ``c``).
    """
    rng = np.random.default_rng(seed)
    low = 3  # two events are held out/targets: three is the shortest sample that trains a position
    counts = (micro_batch_size, max(1, micro_batch_size // 2), 2 * micro_batch_size)
    out = [
        [int(x) for x in np.exp(rng.uniform(np.log(low), np.log(max_len), counts[i % 3])).round()] for i in range(mixed)
    ]
    for n in np.unique(np.geomspace(low + 5, max_len, points).astype(int)):
        out.append([int(n)] * micro_batch_size)
    return out


def fit(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative least squares of ``seconds ≈ features @ coef``, errors relative to ``seconds``.

    Relative errors: a step's straggling is a ratio, so a 2 ms error matters as much on a 20 ms
    micro-batch as 20 ms does on a 200 ms one. Tiny NNLS by enumerating supports (≤ 4 columns).
    """
    weights = 1.0 / seconds
    columns = features.shape[1]
    best, best_error = None, np.inf
    for mask in range(1, 2**columns):
        active = [j for j in range(columns) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(features[:, active] * weights[:, None], seconds * weights, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(columns)
        full[active] = coef
        error = float(np.sum(((features @ full - seconds) * weights) ** 2))
        if error < best_error:
            best, best_error = full, error
    if best is None or (best[0] == 0 and best[1] == 0):
        raise ValueError("cannot fit a non-negative cost model (a or b > 0) to the measured times")
    return best


def calibrate(
    model_cfg: ModelConfig,
    extra: ModelExtraConfig,
    max_len: int,
    path: str | None = None,
    micro_batch_size: int = 8,
    mixed: int = 24,
    points: int = 6,
    rounds: int = 3,
    seed: int = 0,
    device: torch.device | None = None,
) -> CostModel:
    """Time trainer-shaped micro-batches, fit, and (optionally) write the JSON ``prepare --cost-model`` reads."""
    lengths = design_lengths(max_len, micro_batch_size, mixed, points, seed)
    rng = np.random.default_rng(seed + 1)
    # tables sized from the data (0) get a synthetic size: timing does not depend on the row count (nor on
    # how ids map to rows: a zch run is timed with exact rows)
    if extra.ids == "zch":
        extra = replace(extra, ids="exact", **ZCH_DEFAULTS)
    extra = replace(extra, num_items=extra.num_items or CALIBRATION_ITEMS, num_actions=extra.num_actions or 16)
    collate_cfg = CollateConfig.for_model(model_cfg, extra)
    batches = [collate(synthetic_samples(ls, extra.num_items, rng), collate_cfg, i, 0) for i, ls in enumerate(lengths)]
    device = device or torch.device("cpu")
    timer = MicroBatchTimer(model_cfg, extra, seed, device)
    seconds = timer.seconds(batches, rounds)
    sizes = [np.minimum(np.asarray(ls, dtype=np.float64), max_len) for ls in lengths]
    features = np.array([[float((s * s).sum()), float(s.sum()), float(len(s)), 1.0] for s in sizes])
    a, b, c, d = fit(features, seconds)
    predicted = features @ np.array([a, b, c, d])
    relative = np.abs(predicted - seconds) / seconds
    groups = [len(batch.layout.groups) for batch in batches]
    padding = [padded_sum_of_squares(batch.layout) for batch in batches]
    clock = "wall time between CUDA synchronisations" if device.type == "cuda" else "thread CPU time"
    details = {
        "method": f"micro-batches through collate + forward + loss + backward, {clock}, min over rounds",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "attention": resolve_attention(extra.attention, extra.architecture, device),
        "micro_batch_size": micro_batch_size,
        "rounds": rounds,
        "per_micro_batch_s": d,
        "fit_relative_error_mean": float(relative.mean()),
        "fit_relative_error_max": float(relative.max()),
        "lengths": lengths,
        "seconds": seconds.tolist(),
        "groups": groups,
        "padded_over_jagged": float(sum(p for p, _ in padding) / max(1, sum(i for _, i in padding))),
        "threads": torch.get_num_threads(),
    }
    model = CostModel(a=a, b=b, c=c, units="seconds", origin="calibrated", details=details)
    if path is not None:
        Path(path).write_text(
            json.dumps(
                {"a": a, "b": b, "c": c, "units": "seconds", "origin": "calibrated", "details": details}, indent=1
            )
        )
    return model


def read_config(path: str) -> tuple[ModelConfig, ModelExtraConfig, int]:
    """``[model]``, ``[model_extra]`` and ``engine.threads`` of a run config; no dataset needed to calibrate."""
    data = storage.read_toml(path, "--config")
    model_cfg = ModelConfig.from_dict(data.get("model", {}), where=f"model in {path}")
    values = data.get("model_extra", {})
    unknown = sorted(set(values) - {f.name for f in fields(ModelExtraConfig)})
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} in [model_extra] of {path}")
    threads = int(data.get("engine", {}).get("threads", 1))
    if threads < 1:
        raise ValueError(f"engine.threads must be >= 1, got {threads}")
    return model_cfg, ModelExtraConfig(**values), threads


def main(argv: list[str] | None = None) -> int:
    """``python -m freescale.trainer.simulate.calibrate ...`` is ``freescale calibrate ...`` (same options,
    same errors)."""
    parser = argparse.ArgumentParser(prog="freescale calibrate", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as error:  # what the CLI reports as a user's error
        print(f"freescale calibrate: error: {error}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """``freescale calibrate``: fit on this machine, write ``args.out``; 2 on a bad config."""
    try:
        model_cfg, extra, threads = read_config(args.config)
        if args.micro_batch_size < 1 or args.mixed < 1 or args.rounds < 1:
            raise ValueError("--micro-batch-size, --mixed and --rounds must be >= 1")
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
        resolve_attention(extra.attention, extra.architecture, device)  # a kernel that cannot run here: one line
    except ValueError as error:
        print(f"calibrate: error: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(threads)
    cost = calibrate(
        model_cfg,
        extra,
        model_cfg.max_uih_len,
        args.out,
        micro_batch_size=args.micro_batch_size,
        mixed=args.mixed,
        rounds=args.rounds,
        device=device,
    )
    print(
        f"a={cost.a:.4g} b={cost.b:.4g} c={cost.c:.4g} s (per micro-batch {cost.details['per_micro_batch_s']:.4g} s), "
        f"fit error mean {100 * cost.details['fit_relative_error_mean']:.1f}% → {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
