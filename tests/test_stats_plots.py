"""``freescale stats`` plots drawn in helper processes (``PlotProcesses``): the same PNG bytes as
drawing in the driver, a helper's failure fails the run with its error, and a run that fails before
drawing leaves no helper behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.stats import StatsConfig, compute_stats, run_stats
from freescale.pipeline.stats.plots import PLOTS, PlotProcesses, write_plots


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("tiny")
    generate(preset("tiny", seed=3), str(out))
    config = StatsConfig(
        input=str(out / "sources.toml"), output=None, world_sizes=(2,), micro_batch_size=4, workers=1, progress=False
    )
    return compute_stats(config)


def test_helpers_draw_the_bytes_the_driver_draws(report, tmp_path) -> None:
    drawing = PlotProcesses()
    try:
        names = drawing.draw(report, str(tmp_path / "helpers"))
    finally:
        drawing.close()
    assert names == write_plots(report, str(tmp_path / "driver")) == PLOTS
    for name in names.values():
        assert (tmp_path / "helpers" / name).read_bytes() == (tmp_path / "driver" / name).read_bytes()


def test_a_failing_helper_fails_the_run_with_its_error(tmp_path) -> None:
    drawing = PlotProcesses()
    try:
        with pytest.raises(RuntimeError, match=r"drawing the plots failed: KeyError"):
            drawing.draw({"lengths": {}}, str(tmp_path / "plots"))
    finally:
        drawing.close()
    assert not (tmp_path / "plots").exists()


def test_a_run_failing_before_drawing_stops_its_helpers(tmp_path, monkeypatch) -> None:
    started: list[PlotProcesses] = []

    class Recorded(PlotProcesses):
        def __init__(self) -> None:
            super().__init__()
            started.append(self)

    monkeypatch.setattr("freescale.pipeline.stats.plots.PlotProcesses", Recorded)
    with pytest.raises(Exception, match="does not exist"):
        run_stats(StatsConfig(input=str(tmp_path / "missing.toml"), output=str(tmp_path / "out"), progress=False))
    assert len(started) == 1
    helpers = started[0]._procs
    assert helpers and all(proc.returncode is not None for proc in helpers)
    assert not Path(started[0]._dir).exists()
