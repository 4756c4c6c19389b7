"""User-profile tables on a dataset (``[user_tables.<feature>]``, docs/training.md#user-profile-tables):
their rows and how a sample's value becomes a row, resolved from the dataset's manifest.

Kept free of torch: the launcher refuses a table the dataset cannot feed in one line before any rank
starts, and every rank resolves the same rows from the same manifest (``run_data.run_tables``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from freescale.pipeline.dataset.profiles import ProfileRead
from freescale.pipeline.dataset.vocabulary import Vocabulary
from freescale.trainer.config import RunConfig
from freescale.trainer.table_config import USER_ID_FEATURE, UserTableConfig


def resolve_user_tables(cfg: RunConfig, features: tuple[str, ...], sizes: dict[str, int], where: str) -> RunConfig:
    """``cfg`` with each user table's ``rows`` resolved on a dataset whose users table has ``features``
    (``layout.user_features``) and whose vocabularies have ``sizes`` (``table_sizes``): exact tables get
    the vocabulary size (or keep a larger ``rows``). ``where``: the dataset, for the errors."""
    resolved = {name: _resolved(table, features, sizes, where) for name, table in cfg.user_tables.items()}
    return replace(cfg, user_tables=resolved) if resolved else cfg


def _resolved(table: UserTableConfig, features: tuple[str, ...], sizes: dict[str, int], where: str) -> UserTableConfig:
    if table.feature != USER_ID_FEATURE and table.feature not in features:
        has = f"its users table gives {list(features)}" if features else "it was prepared without a users table"
        raise ValueError(
            f"{table.where}: {where} has no user-profile feature {table.feature!r} ({has}; "
            f"'{USER_ID_FEATURE}' reads each sample's user id)"
        )
    if table.ids != "exact":
        return table
    size = sizes.get(table.table)
    if size is None:
        raise ValueError(
            f"{table.where}.ids 'exact': {where} has no vocabulary of {table.table} (prepared by an older FreeScale): "
            f"re-run `freescale prepare --overwrite`, or set {table.where}.ids = 'hashed' with {table.where}.rows"
        )
    if table.rows and table.rows < size:
        raise ValueError(
            f"{table.where}.rows = {table.rows} is smaller than the {size} values of {table.feature} in {where}; "
            f"leave it at 0 to use the vocabulary size or set it >= {size}"
        )
    return replace(table, rows=table.rows or size)


def profile_reads(
    cfg: RunConfig, features: tuple[str, ...], vocabulary: Callable[[str], Vocabulary | None]
) -> tuple[ProfileRead, ...]:
    """How each user table of a resolved ``cfg`` reads a sample (``features``: the dataset's profile
    features, in the order of a sample's ``user_features``; ``vocabulary``: a table's vocabulary)."""
    reads = []
    for table in cfg.user_tables.values():
        column = None if table.feature == USER_ID_FEATURE else features.index(table.feature)
        vocab = vocabulary(table.table) if table.ids == "exact" else None
        reads.append(ProfileRead(table.table, column, table.id_rows, vocab, raw=table.ids == "zch"))
    return tuple(reads)


def describe_user_tables(cfg: RunConfig) -> str:
    """One log line part naming each user table of a resolved ``cfg`` with its mode and rows."""
    parts = []
    for table in cfg.user_tables.values():
        rows = f"{table.id_rows} {'slots' if table.ids == 'zch' else 'rows'}"
        parts.append(f"{table.table} {table.ids} ({rows})")
    return "user tables: " + ", ".join(parts) if parts else ""


def user_table_options(cfg: RunConfig) -> dict[str, Any]:
    """The options that shape a resolved ``cfg``'s user tables (the checkpoint record's ``run.model``):
    rows (zch: slots) and, for zch, the bucket size that decides where an id lives."""
    options: dict[str, Any] = {}
    for table in cfg.user_tables.values():
        options[f"{table.where}.ids"] = table.ids
        options[f"{table.where}.rows"] = table.id_rows
        if table.ids == "zch":
            options[f"{table.where}.zch_bucket_size"] = table.zch_bucket_size
    return options
