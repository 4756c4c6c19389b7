"""Fit ``cost(L) = a·L² + b·L + c`` in seconds on this hardware, for ``prepare --cost-model``.

The planner balances *predicted* cost. Analytic FLOPs (DESIGN §3) are right about the shape but not
about a real kernel's constants — on a CPU the attention's elementwise work and per-sample overheads
weigh more than FLOPs suggest — so a measured straggler share left after planning is partly
prediction error. Timing the dense forward + backward of single samples at a spread of lengths and
fitting non-negative coefficients removes most of it (the manifest records the fitted origin).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from freescale.pipeline.cost import CostModel, ModelConfig
from freescale.trainer.config import ModelExtraConfig
from freescale.trainer.jagged import build_layout
from freescale.trainer.model import SequentialTransducer, sampled_softmax_loss


def sample_seconds(
    model_cfg: ModelConfig, extra: ModelExtraConfig, length: int, reps: int = 3, batch: int = 8
) -> float:
    """Seconds per sample of forward + backward + loss, ``batch`` samples of ``length`` run together.

    Timing samples in a batch, as the trainer runs them (one length group), keeps per-call overheads
    from posing as a per-sample constant that would hide the linear (projection, loss) term.
    """
    torch.manual_seed(0)
    model = SequentialTransducer(model_cfg, extra)
    d = model_cfg.d_model
    rows = batch * length
    items, actions = torch.randn(rows, d), torch.randn(rows, d)
    negatives = torch.randn(model_cfg.num_negatives + extra.inbatch_negatives, d)
    times = torch.arange(rows) * 60
    layout = build_layout(torch.full((batch,), length), extra.length_group_ratio)
    ids = torch.arange(rows)
    seconds = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        out = model(items, actions, layout, times)
        loss = sampled_softmax_loss(
            out, items, negatives, ids, -torch.ones(negatives.shape[0], dtype=torch.int64), extra.temperature
        )
        loss.backward()
        seconds.append((time.perf_counter() - start) / batch)
    return float(np.min(seconds[1:]))


def fit(lengths: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float]:
    """Non-negative least squares for (a, b, c), errors weighted by 1/sqrt(seconds).

    Step costs are sums, so long samples must be right in absolute terms; the square-root weight
    keeps short samples from being ignored entirely.
    """
    design = np.stack([lengths.astype(float) ** 2, lengths.astype(float), np.ones(len(lengths))], axis=1)
    weights = 1.0 / np.sqrt(seconds)
    best: tuple[float, float, float] | None = None
    best_error = np.inf
    for active in ([0, 1, 2], [0, 1], [0, 2], [1, 2], [0], [1]):  # tiny NNLS by enumerating supports
        coef, *_ = np.linalg.lstsq(design[:, active] * weights[:, None], seconds * weights, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(3)
        full[active] = coef
        error = float(np.sum(((design @ full - seconds) * weights) ** 2))
        if error < best_error:
            best, best_error = (float(full[0]), float(full[1]), float(full[2])), error
    if best is None:
        raise ValueError("cannot fit a non-negative cost model to the measured times")
    return best


def calibrate(
    model_cfg: ModelConfig, extra: ModelExtraConfig, max_len: int, path: str | None = None, points: int = 8
) -> CostModel:
    """Measure, fit and (optionally) write a cost-model JSON that ``prepare --cost-model`` reads."""
    lengths = np.unique(np.geomspace(8, max_len, points).astype(int))
    seconds = np.array(
        [sample_seconds(model_cfg, extra, int(n), batch=max(1, min(8, 4096 // int(n)))) for n in lengths]
    )
    a, b, c = fit(lengths, seconds)
    model = CostModel(
        a=a,
        b=b,
        c=c,
        units="seconds",
        origin="calibrated",
        details={"lengths": lengths.tolist(), "seconds": seconds.tolist(), "threads": torch.get_num_threads()},
    )
    if path is not None:
        Path(path).write_text(
            json.dumps(
                {"a": a, "b": b, "c": c, "units": "seconds", "origin": "calibrated", "details": model.details}, indent=1
            )
        )
    return model
