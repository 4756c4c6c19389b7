"""Terminal summary of a ``freescale stats`` report (rich tables), drawn from the report alone."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _short(value: int) -> str:
    """Ids and sizes in a few characters: 49,999 / 1M / 9.2e+18."""
    if value < 100_000:
        return f"{value:,}"
    for unit, scale in (("k", 10**3), ("M", 10**6), ("G", 10**9)):
        if value / scale < 999.5:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.2g}"


def _pct(value: float | None, scale: float = 100.0, digits: int = 1) -> str:
    return "—" if value is None else f"{value * scale:.{digits}f}%"


def _pm(value: float | None, err: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" + (f" ± {err:.{digits}f}" if err else "")


def lengths_table(report: dict[str, Any]) -> Table:
    """Metrics as rows, merged and each source as columns (stays narrow with many thresholds)."""
    lengths = report["lengths"]
    entries = [("merged", lengths["merged"]), *lengths["by_source"].items()]
    table = Table(title="UIH length per sample (merged; events of each source per sample)")
    table.add_column("")
    for name, _ in entries:
        table.add_column(name, justify="right")
    table.add_row("samples", *(f"{s['count']:,}" for _, s in entries))
    table.add_row("mean", *(_num(s["mean"], 1) for _, s in entries))
    for key in ("p50", "p90", "p99", "max"):
        table.add_row(key, *(_num(s[key]) for _, s in entries))
    for t in lengths["merged"]["share_above"]:
        table.add_row(f"share > {int(t):,}", *(_pct(s["share_above"][t], digits=2) for _, s in entries))
    return table


def sparsity_table(report: dict[str, Any]) -> Table:
    sp = report["sparsity"]
    table = Table(title=f"sparsity (paper Eq. 1) and padded compute ({sp['cost_units']})")
    for column in ("batching", "batches", "sparsity", "per batch", "wasted compute", "attn. wasted"):
        table.add_column(column, justify="left" if column == "batching" else "right", no_wrap=True)
    entries = [(f"random B={sp['batch_size']}", sp["random"])]
    if sp.get("plan"):
        entries.append(("plan", sp["plan"]))
    for name, s in entries:
        table.add_row(
            name,
            f"{s['batches']:,}",
            _pct(s["sparsity"]),
            _pct(s["sparsity_mean"]),
            _pct(s["wasted_compute_pct"], 1.0),
            _pct(s["attention_wasted_pct"], 1.0),
        )
    return table


def fillable_world_sizes(straggler: dict[str, Any]) -> tuple[list[int], list[int]]:
    """World sizes with a prediction for some strategy, and those the data cannot fill (none has one)."""
    filled, unfilled = [], []
    for w in straggler["world_sizes"]:
        entries = straggler["by_world_size"][str(w)].values()
        (filled if any(e.get("straggler_pct") is not None for e in entries) else unfilled).append(w)
    return filled, unfilled


def straggler_table(report: dict[str, Any]) -> Table:
    st = report["straggler"]
    table = Table(title=f"predicted straggler_pct (imbalance = mean max/mean), k = {st['micro_batch_size']} per rank")
    table.add_column("W", justify="right")
    for name in st["strategies"]:
        table.add_column(name, justify="right")
    filled, unfilled = fillable_world_sizes(st)
    if unfilled:  # a row of n/a says nothing: name them once instead
        table.caption = f"W = {', '.join(map(str, unfilled))}: the data holds less than one step of W·k samples"
    for w in filled:
        cells = []
        for name in st["strategies"]:
            entry = st["by_world_size"][str(w)][name]
            if entry.get("straggler_pct") is None:
                cells.append("n/a")
            else:
                cells.append(f"{entry['straggler_pct']:.2f}% ({entry['imbalance']['mean']:.2f})")
        table.add_row(str(w), *cells)
    return table


def overlap_table(report: dict[str, Any]) -> Table:
    ov = report["batch_overlap"]
    head = ov["headline"]
    label = "step group" if head["layout"] == "step_group" else f"B = {head['global_batch_size']:,}"
    table = Table(title=f"batch_overlap_rate per table ({ov['order']})")
    table.add_column("table", no_wrap=True)
    table.add_column(f"{label} ±stderr", justify="right", no_wrap=True)
    worlds = list(ov["by_world_size"])
    for w in worlds:
        table.add_column(f"W={w}\nB={ov['by_world_size'][w]['global_batch_size']:,}", justify="right")
    for name, entry in head["tables"].items():
        cells = [_pm(ov["by_world_size"][w]["tables"][name], None) for w in worlds]
        table.add_row(name, _pm(entry["batch_overlap_rate"], entry["stderr"]), *cells)
    return table


def ids_table(report: dict[str, Any]) -> Table:
    ids = report["ids"]
    table = Table(title="ids per table and hash_collision_rate (modulo T)")
    for column in ("table", "unique ids", "id range"):
        table.add_column(column, justify="left" if column == "table" else "right", no_wrap=True)
    for size in ids["table_sizes"]:
        table.add_column(f"T={_short(size)}", justify="right")
    for name, entry in ids["tables"].items():
        span = "—" if entry["min_id"] is None else f"{_short(entry['min_id'])}–{_short(entry['max_id'])}"
        table.add_row(
            name,
            f"{entry['unique_ids']:,}",
            span,
            *(_pct(entry["hash_collision_rate"][str(s)], digits=2) for s in ids["table_sizes"]),
        )
    return table


def zch_table(zch: dict[str, Any]) -> Table:
    """The ZCH replay beside modulo hashing at the same rows (``zch_replay``)."""
    cfg = zch["table"]
    policy = cfg["policy"] + (f", ttl {cfg['ttl']} s" if cfg["ttl"] else "")
    policy += f", admission {cfg['admission_threshold']}" if cfg["admission_threshold"] > 1 else ""
    policy += f", halflife {cfg['lfu_halflife']} calls" if cfg.get("lfu_halflife") else ""
    table = Table(
        title=f"ZCH replay of {zch.get('ids', 'item')} ids in time order: {cfg['zch_size']:,} rows, "
        f"max_probe {cfg['max_probe']}, {policy}"
    )
    columns = ("lookups", "hit", "insert", "collide", "evict", "full", "id % T")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_row(
        _short(zch["counters"]["lookups"]),
        *(_pct(zch[key], digits=2) for key in ("hit_rate", "insert_rate", "collision_rate", "eviction_rate")),
        _pct(zch["occupancy"], digits=1),
        _pct(zch["modulo_hash_collision_rate"], digits=2),
    )
    table.caption = "rates per lookup; full: occupancy; id % T: modulo hashing's hash_collision_rate at T rows"
    return table


def print_stats_summary(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    source = report["input"]
    sample = report["sample"]
    console.print(
        f"[bold]freescale stats[/bold] — {source['dataset'] or source['uri']} ({source['kind']}: {source['uri']})"
    )
    if sample["estimated"]:
        console.print(
            f"[yellow]estimated from a sample of users: fraction {sample['fraction']:g}, "
            f"{sample['samples_selected']:,} of {sample['samples_total']:,} samples[/yellow]"
        )
    rows = report["rows"]
    console.print(
        f"events read {rows['events_read']:,}, used {rows['events_used']:,}, rejected "
        f"{rows['events_rejected']['total']:,}, filtered {rows['events_filtered']['total']:,}; "
        f"{rows['samples']:,} samples"
    )
    for table in (lengths_table, sparsity_table, straggler_table, overlap_table, ids_table):
        console.print(table(report))
    if report.get("zch"):
        console.print(zch_table(report["zch"]))
    pop = report["popularity"]
    shares = ", ".join(
        f"{k.replace('top_', 'top ').replace('pct', '%')}: {v:.1%}" for k, v in pop.get("top_share", {}).items()
    )
    console.print(
        f"item popularity: Zipf exponent {_pm(pop.get('zipf_exponent'), pop.get('stderr'))} "
        f"(ranks {pop['fit_ranks'][0]}–{pop['fit_ranks'][1]:,}); share of events: {shares}"
    )
