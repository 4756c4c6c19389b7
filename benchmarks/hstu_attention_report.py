"""bench_hstu_attention's report: its targets judged on the measured rows (the heavy batch's forward +
backward against the padded PyTorch reference; the forward at the longest uniform length as a share of
the card's measured matmul TFLOP/s), the printed table and the plot. ``s``: the benchmark's
``Settings`` (its ``uniform_lengths``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TARGET_SPEEDUP, TARGET_MFU = 4.0, 0.35


def _arm(row: dict, label: str) -> dict | None:
    return next((a for a in row["arms"] if a["arm"] == label and a["status"] == "ok"), None)


def check_targets(rows: list[dict], matmul: float | None, s: Any) -> dict:
    targets: dict = {}
    heavy = next((r for r in rows if r["workload"] == "heavy"), None)
    ours, theirs = (_arm(heavy, a) if heavy else None for a in ("triton fwd+bwd", "torch fwd+bwd"))
    if ours and theirs:
        ratio = theirs["ms"] / ours["ms"]
        targets["heavy_fwd_bwd_speedup_vs_padded_torch"] = {"value": ratio, "target": TARGET_SPEEDUP,
                                                            "target_met": ratio >= TARGET_SPEEDUP}  # fmt: skip
    top = next((r for r in rows if r["workload"] == f"uniform_{max(s.uniform_lengths)}"), None)
    fwd = _arm(top, "triton fwd") if top else None
    if fwd and matmul:
        share = fwd["tflops"] / matmul
        targets[f"uniform_{max(s.uniform_lengths)}_fwd_share_of_matmul"] = {
            "value": share, "tflops": fwd["tflops"], "matmul_tflops": matmul, "target": TARGET_MFU,
            "target_met": share >= TARGET_MFU}  # fmt: skip
    targets["target_met"] = bool(targets) and all(t["target_met"] for t in targets.values() if isinstance(t, dict))
    return targets


def print_table(rows: list[dict], matmul: float | None) -> None:
    print(f"\nmeasured matmul: {matmul:.1f} TFLOP/s" if matmul else "\nmatmul TFLOP/s: not measured")
    head = f"{'workload':<14} {'arm':<30} {'ms':>9} {'TFLOP/s':>8} {'torch/ours':>10}"
    print(head + "\n" + "-" * len(head))
    for row in rows:
        for arm in row["arms"]:
            if arm["status"] != "ok":
                print(f"{row['workload']:<14} {arm['arm']:<30} {'failed':>9}")
                continue
            kind = "fwd+bwd" if "bwd" in arm["arm"] else "fwd"
            ours = _arm(row, f"triton {kind}")
            ratio = f"{arm['ms'] / ours['ms']:9.2f}x" if ours and not arm["arm"].startswith("triton") else ""
            print(f"{row['workload']:<14} {arm['arm']:<30} {arm['ms']:9.3f} {arm['tflops']:8.2f} {ratio:>10}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["triton fwd+bwd", "torch fwd+bwd", "compiled fwd+bwd"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.25
    for i, label in enumerate(labels):
        values = [(_arm(r, label) or {}).get("ms", float("nan")) for r in rows]
        ax.bar([x + (i - 1) * width for x in range(len(rows))], values, width, label=label)
    ax.set_xticks(range(len(rows)), [r["workload"] for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("ms per forward + backward (log)")
    ax.set_title("Jagged HSTU attention: Triton vs padded PyTorch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
