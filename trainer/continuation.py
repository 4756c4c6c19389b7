"""Continuing a run onto the next time window's dataset (``checkpoint.continue_on_new_data``,
docs/training.md#streaming-windows), and evaluating on another window's users (``eval.data_path``).

A streaming run trains window by window: ``prepare --time-window`` writes one dataset per window, and
the run for window ``t+1`` resumes from window ``t``'s checkpoint with the new ``data.path``. What
carries over is the whole training state (tables, zch identity tables and their counters, both
optimizers, the dense model); what starts afresh is the data position: the new dataset is read from
its first step while the step counter goes on (``RunRecord.data_start`` keeps the step the run began
reading the dataset, so a continued run that is interrupted resumes at the right place of its window).

That is only meaningful when a row means the same id in both windows: zch and hashed item tables are
keyed by the raw id, exact tables by each dataset's own vocabulary (refused when it differs). Kept free
of torch: the launcher checks all of it in one line before any rank starts.
"""

from __future__ import annotations

from typing import Any

from freescale.trainer.checkpoint_record import (
    CheckpointRecord,
    DataIdentity,
    RunRecord,
    check_user_table_set,
    vocabulary_tables,
)
from freescale.trainer.config import RunConfig
from freescale.trainer.learning_config import ModelExtraConfig

OPTION = "checkpoint.continue_on_new_data"
ROW_OPTIONS = {"item": "model_extra.num_items", "action": "model_extra.num_actions"}  # model_options keys


def continues(run: RunRecord, data: DataIdentity, cfg: RunConfig) -> bool:
    """Whether resuming ``run``'s checkpoint on ``data`` continues onto new data (rather than resuming
    the same data, which a continued run's own restarts do with the same config)."""
    return cfg.checkpoint.continue_on_new_data and not run.data.same_data(data)


def data_start(record: CheckpointRecord, data: DataIdentity, cfg: RunConfig) -> int:
    """The run's step at which it started reading ``data``: the checkpoint's step when this resume
    continues onto ``data``, else the checkpoint's own ``data_start``."""
    if record.run is None:
        return 0
    return record.step if continues(record.run, data, cfg) else record.run.data_start


def check_continuation(run: RunRecord, data: DataIdentity, cfg: RunConfig, rows: tuple[int, int], where: str) -> None:
    """The checkpoint's tables carry over unchanged (``rows``: this run's item and action rows,
    ``protocol.table_rows``; ``cfg``'s user tables resolved on ``data``), and every table keyed by a
    vocabulary has the same one on ``data``."""
    check_table_set(run, cfg.model_extra, rows, where)
    check_user_table_set(run, cfg, where)
    for table in run.data.other_ids(data, vocabulary_tables(cfg)):
        if table == "item":
            how = "model_extra.ids = 'exact' maps item ids to rows through each dataset's vocabulary"
            hint = "train with model_extra.ids = 'zch' (or 'hashed') for item ids that change between windows"
        elif table.startswith("user."):
            how = f"user_tables.{table[5:]}.ids = 'exact' maps its values to rows through each dataset's vocabulary"
            hint = f"set user_tables.{table[5:]}.ids = 'zch' (or 'hashed') for values that change between windows"
        else:
            how = "the action table maps action ids to rows through each dataset's vocabulary"
            hint = "prepare the windows with the same action types, or set model_extra.ids = 'hashed' with num_actions"
        raise ValueError(
            f"{OPTION}: table '{table}': {data.path} has other {table} ids than {run.data.path}, which {where} was "
            f"trained on, and {how} (a row would stand for another id); {hint}"
        )


def check_table_set(run: RunRecord, extra: ModelExtraConfig, rows: tuple[int, int], where: str) -> None:
    """Each model table of this run against the checkpoint's: kind (zch or not), rows, bucket size."""
    saved_zch = "model_extra.zch_bucket_size" in run.model
    if saved_zch != (extra.ids == "zch"):
        kinds = ("a zch table", "not a zch table")
        raise ValueError(
            f"{OPTION}: table 'item' of {where} is {kinds[not saved_zch]}, this run's is {kinds[extra.ids != 'zch']} "
            "(model_extra.ids); the tables carry over unchanged: train with the checkpoint's model_extra.ids"
        )
    for (table, option), mine in zip(ROW_OPTIONS.items(), rows):
        shown = "model_extra.zch_size" if table == "item" and extra.ids == "zch" else option
        _same(table, shown, run.model.get(option), mine, where)
    if saved_zch:
        _same(
            "item",
            "model_extra.zch_bucket_size",
            run.model.get("model_extra.zch_bucket_size"),
            extra.zch_bucket_size,
            where,
        )


def _same(table: str, option: str, saved: Any, mine: Any, where: str) -> None:
    if saved != mine:
        raise ValueError(
            f"{OPTION}: table '{table}' of {where} has {option} = {saved!r}, this run's has {mine!r}; the tables "
            f"carry over unchanged: set {option} = {saved!r}"
        )


def check_eval_data(cfg: RunConfig, trained: DataIdentity, evaluated: DataIdentity) -> None:
    """``eval.data_path``: its users' ids must mean the same rows as the training data's (zch and hashed
    item tables: always; vocabulary-keyed tables: the same vocabulary)."""
    for table in trained.other_ids(evaluated, vocabulary_tables(cfg)):
        raise ValueError(
            f"eval.data_path: table '{table}': {evaluated.path} has other {table} ids than data.path {trained.path}, "
            f"and the {table} table maps ids to rows through data.path's vocabulary, so its users cannot be scored; "
            "train with model_extra.ids = 'zch' (or 'hashed') to evaluate on another window"
        )
