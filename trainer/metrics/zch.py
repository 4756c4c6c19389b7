"""Zero-collision id tables in the run's metrics (docs/training.md#open-id-spaces-ids--zch).

Each owner records, per step and table, what its identity table did with the step's ids
(``StepRecord.extra["zch.<table>.<counter>"]``, ``kernels.zch_types.COUNTERS`` plus ``occupied`` and
``slots``). Summed over ranks, they give the step's rates: per lookup (an owner looks up each
requesting rank's distinct ids once) the share that hit, that took a new slot (insert), that evicted
an id, and that fell back to the shared row (collision, admission waits included); the mean age of
the evicted ids in the policy's clock (event seconds for ttl, steps for lru and lfu); and the
occupancy (slots holding an id / slots).
"""

from __future__ import annotations

from typing import Any

COUNTS = ("lookups", "hits", "inserts", "evictions", "collisions", "admission_waits", "evicted_age_sum")


def zch_tables(extras: list[dict[str, float]]) -> list[str]:
    """The tables named by ``zch.<table>.<counter>`` keys (a table's name may hold dots: ``user.user_id``)."""
    return sorted({key[4:].rsplit(".", 1)[0] for extra in extras for key in extra if key.startswith("zch.")})


def zch_figures(totals: dict[str, float], occupied: float, slots: float) -> dict[str, float | int]:
    """Rates of summed counts (``COUNTS``) and the occupancy of ``occupied`` out of ``slots``."""
    lookups, evictions = totals["lookups"], totals["evictions"]

    def rate(name: str) -> float:
        return totals[name] / lookups if lookups else 0.0

    return {
        "lookups": int(lookups),
        "hit_rate": rate("hits"),
        "insert_rate": rate("inserts"),
        "eviction_rate": rate("evictions"),
        "collision_rate": rate("collisions"),
        "admission_wait_rate": rate("admission_waits"),
        "evicted_mean_age": totals["evicted_age_sum"] / evictions if evictions else 0.0,
        "occupancy": occupied / slots if slots else 0.0,
    }


def zch_step_metrics(extras: list[dict[str, float]]) -> dict[str, Any]:
    """``{"zch": {table: figures}}`` of one step from every rank's ``extra`` (``{}`` without zch tables)."""
    out = {}
    for table in zch_tables(extras):
        prefix = f"zch.{table}."
        totals = {name: sum(e.get(prefix + name, 0.0) for e in extras) for name in COUNTS}
        occupied = sum(e.get(prefix + "occupied", 0.0) for e in extras)
        out[table] = zch_figures(totals, occupied, sum(e.get(prefix + "slots", 0.0) for e in extras))
    return {"zch": out} if out else {}


def summarize_zch(steps: list[list[dict[str, float]]]) -> dict[str, Any]:
    """The run's figures: counts summed over steps and ranks, occupancy at the last step."""
    flat = [extra for ranks in steps for extra in ranks]
    out = {}
    for table in zch_tables(flat):
        prefix = f"zch.{table}."
        totals = {name: sum(e.get(prefix + name, 0.0) for e in flat) for name in COUNTS}
        last = steps[-1]
        occupied = sum(e.get(prefix + "occupied", 0.0) for e in last)
        out[table] = zch_figures(totals, occupied, sum(e.get(prefix + "slots", 0.0) for e in last))
    return {"zch": out} if out else {}


def zch_lines(summary: dict[str, Any]) -> list[str]:
    """One summary line per zero-collision table of a run summary (``summarize_zch``)."""
    lines = []
    for table, f in summary.get("zch", {}).items():
        lines.append(
            f"zch {table}: {f['lookups']} lookups, hit {f['hit_rate']:.4f}, insert {f['insert_rate']:.4f}, "
            f"eviction {f['eviction_rate']:.4f}, collision {f['collision_rate']:.4f}, "
            f"evicted mean age {f['evicted_mean_age']:.1f}, occupancy {f['occupancy']:.4f}"
        )
    return lines
