"""Terminal summaries (rich tables) of what ``prepare`` produced, from its typed ``Manifest``."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from freescale.pipeline.dataset.manifest import Manifest, Rows
from freescale.pipeline.dataset.targets import TargetCoverage


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3f}"


def rows_table(manifest: Manifest) -> Table:
    rows = manifest.rows
    table = Table(title="row accounting", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("events read", f"{rows.events_read:,}")
    for source, count in rows.events_read_by_source.items():
        table.add_row(f"  from {source}", f"{count:,}")
    table.add_row("events used", f"{rows.events_used:,}")
    table.add_row("events rejected", f"{rows.events_rejected.total:,}")
    for reason, count in rows.events_rejected.by_reason.items():
        table.add_row(f"  {reason}", f"{count:,}")
    table.add_row("events filtered", f"{rows.events_filtered.total:,}")
    for reason, count in rows.events_filtered.by_reason.items():
        table.add_row(f"  {reason}", f"{count:,}")
    balanced = "yes" if rows.balanced else "NO"
    table.add_row("read = used + rejected + filtered", balanced)
    table.add_row("users", f"{rows.users:,}")
    table.add_row("samples", f"{rows.samples:,}")
    table.add_row("micro-batches", f"{rows.micro_batches:,}")
    table.add_row("step groups", f"{rows.step_groups:,}")
    if manifest.layout.user_features:
        _users_table_rows(table, rows)
    return table


def _users_table_rows(table: Table, rows: Rows) -> None:
    """The users table's accounting: a table whose rows are all rejected must not pass unseen."""
    table.add_row("users-table rows read", f"{rows.users_table_rows_read:,}")
    table.add_row("users-table rows rejected", f"{sum(rows.users_table_rejected.values()):,}")
    for reason, count in rows.users_table_rejected.items():
        table.add_row(f"  {reason}", f"{count:,}")
    table.add_row("samples without a profile", f"{rows.samples_without_profile:,}")


def balance_table(manifest: Manifest) -> Table:
    """Predicted straggler_pct of random batching, within-step balancing and the plan, side by side."""
    predicted = manifest.balance.straggler_pct
    layout = manifest.layout
    table = Table(title=f"balance (G = {layout.group_size}, k = {layout.micro_batch_size}, {layout.mode})")
    table.add_column("batching")
    table.add_column("predicted straggler_pct", justify="right")
    table.add_column("vs random", justify="right")
    random_pct = predicted["random"]
    for name in ("random", "within_step", "plan"):
        ratio = f"{predicted[name] / random_pct:.3f}x" if random_pct else "-"
        table.add_row(name, f"{predicted[name]:.2f}%", ratio)
    return table


def print_prepare_summary(manifest: Manifest, console: Console | None = None) -> None:
    console = console or Console()
    console.print(rows_table(manifest))
    console.print(balance_table(manifest))
    balance, lengths = manifest.balance, manifest.lengths
    console.print(
        f"imbalance (max/mean within groups): {balance.imbalance_max:.4f} max, "
        f"{balance.imbalance_mean:.4f} mean; max/lower_bound {balance.max_over_lower_bound_max:.4f}; "
        f"UIH length mean {_fmt(lengths.mean)}, p99 {_fmt(lengths.p99)}, max {_fmt(lengths.max)}"
    )
    if manifest.targets is not None:
        console.print(target_line(manifest.targets))
    if manifest.tables:
        sizes = ", ".join(f"{name} {entry.size:,}" for name, entry in sorted(manifest.tables.items()))
        console.print(f"exact id tables (rows = distinct ids, vocab/<table>.npy): {sizes}")
    else:
        console.print("no id vocabularies (an older FreeScale prepared it): train with model_extra.ids = 'hashed'")


def target_line(targets: TargetCoverage) -> str:
    """What a model of ``model_max_uih_len`` trains on under the windowing chosen (``dataset.targets``)."""
    window = targets.max_uih_len, targets.window_stride, targets.model_max_uih_len
    line = (
        f"training targets (samples of {window[0]:,} events, window stride {window[1]:,}, model.max_uih_len "
        f"{window[2]:,}, {targets.holdout_events} events held out per user): {targets.targets:,} of "
        f"{targets.events:,} events; {targets.never_target:,} never a target"
    )
    if targets.never_target:
        stride = max(1, window[2] // 2)
        line += (
            f" (older than every sample's model window: prepare with --max-uih-len {window[2]} "
            f"--window-stride {stride}, or give only --model-config)"
        )
    return line
