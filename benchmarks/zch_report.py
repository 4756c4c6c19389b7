"""bench_zch's report: the issue's targets judged from the per-window rows (``targets``), the tables it
prints and its PNG (``plot``). A window row is ``{"window": t, "oracle": row, "hashed": row, "zch": row}``
with each arm's row as ``bench_zch.train_window`` writes it; the kernel point is ``zch_kernel``'s.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
from zch_segments import separable

ARMS = ("oracle", "hashed", "zch")


def targets(windows: list[dict[str, Any]], kernel: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The issue's targets from the per-window rows (``{"window": t, "oracle": row, "hashed": row, "zch": row}``)."""
    goals: dict[str, dict[str, Any]] = {}
    zch_rates = [w["zch"]["collision_rate"] for w in windows if "zch" in w]
    goals["zch collision rate <= 0.5% of lookups in every window"] = {
        "per_window": zch_rates, "worst": max(zch_rates) if zch_rates else None,
        "target_met": bool(zch_rates) and max(zch_rates) <= 0.005,
    }  # fmt: skip
    full = [w for w in windows if all(arm in w for arm in ARMS)]

    def mean(arm: str, key: str) -> float | None:
        return float(np.mean([w[arm][key] for w in full])) if full else None

    z, o, h = mean("zch", "ndcg@10"), mean("oracle", "ndcg@10"), mean("hashed", "ndcg@10")
    oracle_met = bool(o) and z is not None and z >= 0.97 * o  # an oracle at 0 measured nothing
    goals["zch NDCG@10 within 3% of the oracle (mean over windows)"] = ndcg_goal(full, "oracle", z, o, oracle_met)
    goals["zch NDCG@10 >= 5% above hashed at the same rows (mean over windows)"] = ndcg_goal(
        full, "hashed", z, h, bool(z) and h is not None and z >= 1.05 * h
    )
    ratios = [w["zch"]["step_ms"] / w["hashed"]["step_ms"] for w in full]
    goals["zch step time <= 1.1x exact ids (hashed: no identity table, same rows; median over windows)"] = {
        "per_window_ratio": ratios, "ratio": statistics.median(ratios) if ratios else None,
        "zch_over_oracle_per_window": [w["zch"]["step_ms"] / w["oracle"]["step_ms"] for w in full],
        "target_met": bool(ratios) and statistics.median(ratios) <= 1.1,
    }  # fmt: skip
    return goals


def ndcg_goal(full: list[dict[str, Any]], other: str, z: float | None, theirs: float | None, met: bool) -> dict:
    """zch's NDCG@10 against ``other``'s (``z``, ``theirs``: the means over ``full``, the windows every arm
    ran), per window, whether each window's two figures separate, and ``met`` as ``target_met``."""
    return {
        "zch": z, other: theirs, "ratio": z / theirs if z is not None and theirs else None,
        "per_window_ratio": [w["zch"]["ndcg@10"] / w[other]["ndcg@10"] if w[other]["ndcg@10"] else None
                             for w in full],
        "separable_per_window": [separable(w["zch"]["segments"]["all"], w[other]["segments"]["all"])
                                 for w in full if "segments" in w["zch"] and "segments" in w[other]],
        "target_met": met,
    }  # fmt: skip


def print_windows(windows: list[dict[str, Any]]) -> None:
    print(f"{'window':>6} {'arm':7} {'collision':>9} {'occupancy':>9} {'ndcg@10':>8} {'hr@10':>7} {'samples/s':>9} "
          f"{'ms/step':>8} {'ndcg/oracle':>11} {'ms/hashed':>9}")  # fmt: skip
    for w in windows:
        for arm in ARMS:
            r = w.get(arm)
            if r is None:
                print(f"{w['window']:>6} {arm:7} {'failed':>9}")
                continue
            oracle, hashed = w.get("oracle"), w.get("hashed")
            vs_oracle = r["ndcg@10"] / oracle["ndcg@10"] if oracle and oracle["ndcg@10"] else float("nan")
            vs_hashed = r["step_ms"] / hashed["step_ms"] if hashed else float("nan")
            print(f"{w['window']:>6} {arm:7} {100 * r['collision_rate']:8.3f}% {r['occupancy']:9.3f} "
                  f"{r['ndcg@10']:8.4f} {r['hr@10']:7.4f} {r['samples_per_s']:9.1f} {r['step_ms']:8.1f} "
                  f"{vs_oracle:11.3f} {vs_hashed:9.3f}")  # fmt: skip


def print_segments(windows: list[dict[str, Any]]) -> None:
    """Per arm: HR@10 with its 95% half-width, NDCG@10 with its standard error, on all users and on the
    users whose target an earlier window held (known) or not (new)."""
    print(f"{'window':>6} {'arm':7} {'users':>6} {'hr@10':>15} {'ndcg@10':>16} {'known':>6} {'ndcg known':>10} "
          f"{'new':>6} {'ndcg new':>9}")  # fmt: skip
    for w in windows:
        for arm in ARMS:
            seg = w.get(arm, {}).get("segments")
            if seg is None:
                continue
            a, kn, nw = seg["all"], seg["known"], seg["new"]
            ci = f"{a['hr@10']:.4f}+-{a['hr@10_ci95'] or 0:.4f}"
            se = f"{a['ndcg@10']:.4f}+-{a['ndcg@10_se'] or 0:.4f}"
            print(f"{w['window']:>6} {arm:7} {a['users']:>6} {ci:>15} {se:>16} {kn['users']:>6} {kn['ndcg@10']:10.4f} "
                  f"{nw['users']:>6} {nw['ndcg@10']:9.4f}")  # fmt: skip


def timings(row: dict[str, Any]) -> dict[str, float]:
    """A kernel row's median seconds per call (``ours_empty_s``, ...), without its rates."""
    return {k: v for k, v in row.items() if k.endswith("_s") and isinstance(v, float)}


def print_kernel(kernel: dict[str, Any]) -> None:
    print(f"kernel: {kernel['slots']} slots, buckets of {kernel['bucket_size']}, max_probe {kernel['max_probe']}, "
          f"{kernel['threads']} threads (median ms per call)")  # fmt: skip
    for row in kernel["rows"]:
        cells = ", ".join(f"{k[:-2]} {1e3 * v:.2f}" for k, v in timings(row).items())
        print(f"  {row['ids']:>7} ids: {cells}")
    if kernel.get("torchrec_error"):
        print(f"  TorchRec did not run: {kernel['torchrec_error'][:300]}")
    step = kernel.get("steady_training")
    if step:
        print(
            f"  steady training step, {step['ids']} ids ({step['new_ids']} new) on {step['slots']} slots "
            f"({100 * step['occupancy']:.0f}% full): {1e3 * step['shortcuts_s']:.2f} ms with the CPU's "
            f"host shortcuts, {1e3 * step['masked_s']:.2f} ms masked ({step['masked_over_shortcuts']:.2f}x)"
        )
    if step and "large_slots" in step:
        print(f"  the same calls on {step['large_slots']:,} slots: {1e3 * step['large_table_shortcuts_s']:.2f} ms "
              f"with the host shortcuts ({step['large_over_small']:.2f}x)")  # fmt: skip
    cuda = kernel.get("steady_training_cuda")
    if cuda:
        print(f"  the same calls on a CUDA table: {cuda['masked_ms']:.2f} ms with the masked torch "
              f"path, {cuda['kernel_ms']:.2f} ms with the Triton kernel ({cuda['speedup']:.2f}x)")  # fmt: skip


def plot(windows: list[dict[str, Any]], kernel: dict[str, Any] | None, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    for arm, marker in zip(ARMS, "os^", strict=True):
        xs = [w["window"] for w in windows if arm in w]
        panels = ((axes[0], "collision_rate", 100), (axes[1], "ndcg@10", 1), (axes[2], "samples_per_s", 1))
        for ax, key, scale in panels:
            ax.plot(xs, [scale * w[arm][key] for w in windows if arm in w], marker=marker, label=arm)
    axes[0].axhline(0.5, color="grey", ls=":", label="zch target 0.5%")
    axes[0].set(title="collision rate (% of lookups)", xlabel="training window", yscale="symlog")
    axes[0].set_ylim(bottom=0)
    axes[1].set(title="NDCG@10 on the next window", xlabel="training window")
    axes[2].set(title="samples/s", xlabel="training window")
    for ax in axes[:3]:
        ax.legend(fontsize=8)
    if kernel and kernel["rows"]:
        row = kernel["rows"][-1]
        times = timings(row)
        axes[3].barh([k[:-2] for k in times], [1e3 * v for v in times.values()])
        axes[3].set(title=f"probe kernel, {row['ids']} ids (ms per call)", xlabel="ms")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
