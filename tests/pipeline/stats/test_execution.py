"""How ``freescale stats`` runs: plots drawn by the job's processes, reuse of a ``--work-dir``'s scan,
worker processes and the CLI's prestarted workers giving the one-process figures, S3 sources and output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stats_options import FAST

from freescale.pipeline.stats import TOP_LEVEL_KEYS, StatsConfig, compute_stats, run_stats
from freescale.pipeline.stats.plots import PLOTS, write_plots
from freescale.tools.cli import main as cli_main


def test_plots_drawn_by_the_job_processes_match_one_process_drawing_them(tiny, tmp_path) -> None:
    """With 2 workers the local job's driver and worker draw the plots between them (``write_plots``
    with the executor): the same names and bytes as one process drawing them from the same report."""
    out = tmp_path / "stats"
    config = StatsConfig(input=tiny, output=str(out), workers=2, progress=False, world_sizes=(2,), micro_batch_size=8)
    report = run_stats(config)
    assert write_plots(report, str(tmp_path / "alone")) == report["plots"]
    assert sorted(report["plots"].values()) == sorted(PLOTS.values())
    for name in report["plots"].values():
        assert (out / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()


def test_a_second_run_in_the_work_dir_skips_the_scan_and_gives_fresh_figures(tiny, tmp_path, monkeypatch) -> None:
    """With --work-dir the scan's spill files stay: a second run with another seed and W rebuilds the
    partitions from them (no read task runs again) and reports what a fresh run reports."""
    from freescale.pipeline.steps import scan

    first = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "work_dir": str(tmp_path), **FAST}
    compute_stats(StatsConfig(**first))
    assert list(tmp_path.rglob("t*.p*.arrow"))  # the scan's spill files were kept

    def no_scan(*args, **kwargs):
        raise AssertionError("the scan ran again")

    second = {**first, "world_sizes": (4,), "seed": 5}
    monkeypatch.setattr(scan, "run_scan_task", no_scan)
    again = compute_stats(StatsConfig(**second))
    monkeypatch.undo()
    fresh = compute_stats(StatsConfig(**{**second, "work_dir": None}))
    again.pop("runtime_s"), fresh.pop("runtime_s")
    assert again == fresh


def test_worker_processes_give_the_same_figures(tiny) -> None:
    """Two workers run the build and the id pass in parallel (the id pass on the build's executor)."""
    config = {"input": tiny, "world_sizes": (2,), "micro_batch_size": 4, "progress": False, "output": None}
    serial = compute_stats(StatsConfig(workers=1, **config))
    parallel = compute_stats(StatsConfig(workers=2, **config))
    for key in ("lengths", "sparsity", "straggler", "batch_overlap", "popularity", "ids"):
        assert parallel[key] == serial[key], key


def test_s3_sources_and_output(tiny, s3_bucket) -> None:
    from freescale import storage

    folder = Path(tiny).parent
    for path in folder.rglob("*"):
        if path.is_file():
            storage.write_bytes(f"s3://{s3_bucket}/src/{path.relative_to(folder)}", path.read_bytes())
    config = {"world_sizes": (2,), "micro_batch_size": 4, "workers": 1, "progress": False}
    remote = run_stats(
        StatsConfig(input=f"s3://{s3_bucket}/src/sources.toml", output=f"s3://{s3_bucket}/stats", plots=False, **config)
    )
    local = compute_stats(StatsConfig(input=tiny, output=None, **config))
    assert remote["lengths"] == local["lengths"] and remote["batch_overlap"] == local["batch_overlap"]
    written = json.loads(storage.read_bytes(f"s3://{s3_bucket}/stats/stats.json"))
    assert written["input"]["uri"] == f"s3://{s3_bucket}/src/sources.toml"


@pytest.mark.parametrize("which", ["sources", "prepared"])
def test_cli_prestarted_workers_give_the_one_process_report(which, tiny, prepared, tmp_path) -> None:
    """``--workers 2`` starts the scan's workers before the driver's imports (a prepared dataset hands
    them back unused): the report is the one a single process writes."""
    uri = tiny if which == "sources" else prepared[0]
    reports = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        args = ["stats", uri, "--out", str(out), "--workers", workers, "--quiet", "--no-plots", "--world-sizes", "2"]
        assert cli_main(args) == 0
        report = json.loads((out / "stats.json").read_text())
        reports.append({key: report[key] for key in TOP_LEVEL_KEYS if key not in ("options", "runtime_s")})
    assert reports[0] == reports[1]
