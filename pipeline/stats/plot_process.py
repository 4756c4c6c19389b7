"""The plots of ``freescale stats`` drawn by a process that got ready while the job ran.

Drawing needs the finished report, so it cannot overlap the job's work; but importing matplotlib
and the plotting code (~0.9 core-s) can. ``PlotProcess`` starts with the job at the lowest CPU
priority (nice 19): it takes CPU time only where a core would idle (the scan's start and tail, the
driver's serial steps), so the job is not slowed, and at the end it only draws (the four plots of
the ``large`` preset: 0.7 s instead of 1.2 s with the imports).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from multiprocessing.connection import Connection
from typing import Any

PLOT_NICENESS = 19


class PlotProcess:
    """A spawned process that imports the plotting code now and draws one report's plots later."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=serve, args=(child,), daemon=True, name="freescale-stats-plots")
        self._process.start()
        child.close()

    def draw(self, report: dict[str, Any], output: str) -> dict[str, str]:
        """``plots.write_plots(report, output)`` in the process; its error is raised here."""
        self._conn.send((report, output))
        try:
            ok, value = self._conn.recv()
        except EOFError as error:
            raise RuntimeError(f"stats: the plot process exited (code {self._process.exitcode})") from error
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop the process: after ``draw`` it has nothing left to do, and its interpreter teardown
        (matplotlib, polars) would cost the job ~0.2 s of waiting."""
        self._conn.close()
        self._process.terminate()
        self._process.join()


def serve(conn: Connection) -> None:
    """The process: import at low priority, then draw the one report it is sent."""
    with contextlib.suppress(OSError):
        os.nice(PLOT_NICENESS)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # (the import is the point: ready before the report is)

    from freescale.pipeline.stats.plots import write_plots

    try:
        report, output = conn.recv()
    except EOFError:
        return
    try:
        conn.send((True, write_plots(report, output)))
    except Exception as error:  # raised in the driver by ``draw``
        conn.send((False, error))
