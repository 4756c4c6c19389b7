"""The evaluation protocol around the training loop: id tables sized from the data, the validation /
test split, best-validation selection and early stopping.

Id tables (``resolve_tables``): a prepared dataset publishes an exact vocabulary per table
(``pipeline/dataset/vocabulary.py``), so the trainer takes each table's size from the manifest and maps raw
ids to rows through it; ``model_extra.num_items`` only needs setting to reserve *more* rows, and a
size below the vocabulary is refused (it would fold ids together). ``model_extra.ids = "hashed"`` is
for open-ended id spaces: raw id modulo ``num_items``, with the resulting ``hash_collision_rate``
measured on the dataset's vocabulary and reported at train start. ``model_extra.ids = "zch"`` keeps
raw item ids for the engine's zero-collision identity table (``zch_size`` slots; the dataset's item
vocabulary only supplies the raw ids random negatives are drawn from).

Protocol (``BestTracker``): each user's last event is the test item and the one before it the
validation item; neither is ever a training target (``data.held_out``). Periodic evaluations score
validation; each time it improves on ``eval.metric`` the test split is scored too, on the same model,
and (with ``checkpoint.dir``) that model is saved as the best checkpoint. The run's final figures are
validation and test of the best-validation model; ``eval.patience`` evaluations without improvement
stop the run. Choosing on validation and reporting test is the point: a step count picked on the test
item overstates the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.vocabulary import Vocabulary, hash_collision_rate
from freescale.trainer.config import RunConfig
from freescale.trainer.learning_config import ModelExtraConfig


class TableSizeError(ValueError):
    """A configured table size that cannot hold the dataset's ids."""


@dataclass(frozen=True)
class IdTables:
    """How raw ids become rows in this run, and what that costs."""

    num_items: int
    num_actions: int
    mode: str  # exact | hashed | zch
    item_vocab: Vocabulary | None  # exact mode: raw id -> row
    action_vocab: Vocabulary | None
    vocabulary_items: int | None  # the dataset's distinct items (None: dataset without vocabularies)
    hash_collision_rate: float | None  # hashed mode, measured on the vocabulary
    item_pool: Any = None  # zch mode: the raw item ids negatives are drawn from (numpy int64)

    def describe(self) -> str:
        if self.mode == "exact":
            unused = self.num_items - (self.vocabulary_items or 0)
            extra = f" (+{unused} rows no id maps to)" if unused else ""
            return f"ids exact: {self.num_items} item rows{extra}, {self.num_actions} action rows"
        if self.mode == "zch":
            return f"ids zch: {self.num_items} item slots (zero-collision table), {self.num_actions} action rows"
        rate = "unknown (no vocabulary)" if self.hash_collision_rate is None else f"{self.hash_collision_rate:.4f}"
        return f"ids hashed: raw id % {self.num_items} item rows, hash_collision_rate {rate}"

    def summary(self) -> dict[str, Any]:
        return {
            "ids": self.mode,
            "num_items": self.num_items,
            "num_actions": self.num_actions,
            "vocabulary_items": self.vocabulary_items,
            "hash_collision_rate": self.hash_collision_rate,
        }


def _exact_size(option: str, configured: int, vocab: Vocabulary, where: str) -> int:
    if configured and configured < vocab.size:
        raise TableSizeError(
            f"model_extra.{option} = {configured} is smaller than the {vocab.size} {vocab.table} ids of {where}; "
            f"leave it at 0 to use the vocabulary size or set it >= {vocab.size}"
        )
    return configured or vocab.size


def table_rows(extra: ModelExtraConfig, sizes: dict[str, int]) -> tuple[int, int]:
    """Item and action rows ``resolve_tables`` gives ``extra`` on a dataset whose vocabularies have
    ``sizes`` (``PreparedDataset.table_sizes``: {} before vocabularies), read from the manifest alone: the
    launcher compares them with a checkpoint's before any rank starts."""
    actions = sizes.get("action")
    if actions is not None and not (extra.ids == "hashed" and extra.num_actions):
        num_actions = extra.num_actions or actions
    else:
        num_actions = extra.num_actions or 16  # no vocabulary: modulo (the old behaviour)
    num_items = extra.num_items if extra.ids == "hashed" else extra.num_items or sizes.get("item", 0)
    if extra.ids == "zch":
        num_items = extra.zch_size  # slots; the engine adds one fallback row per rank
    return num_items, num_actions


def resolve_tables(cfg: RunConfig, dataset: PreparedDataset) -> IdTables:
    """Table sizes and id mapping for ``cfg`` on ``dataset`` (errors name the option and both numbers)."""
    extra = cfg.model_extra
    items, actions = dataset.vocabulary("item"), dataset.vocabulary("action")
    num_items, num_actions = table_rows(extra, dataset.table_sizes())
    if actions is not None and not (extra.ids == "hashed" and extra.num_actions):
        _exact_size("num_actions", extra.num_actions, actions, dataset.uri)
    else:
        actions = None  # no vocabulary: modulo (the old behaviour)
    if extra.ids == "hashed":
        rate = hash_collision_rate(items.raw_ids, extra.num_items) if items is not None else None
        size = items.size if items is not None else None
        return IdTables(num_items, num_actions, "hashed", None, actions, size, rate)
    if extra.ids == "zch":
        if items is None:
            raise TableSizeError(
                f"{dataset.uri} has no item vocabulary: model_extra.ids 'zch' draws random negatives from it "
                "(re-run `freescale prepare --overwrite`)"
            )
        return IdTables(num_items, num_actions, "zch", None, actions, items.size, None, items.raw_ids)
    if items is None:
        raise TableSizeError(
            f"{dataset.uri} has no id vocabulary (prepared by an older FreeScale): re-run `freescale prepare "
            '--overwrite` for exact ids, or set model_extra.ids = "hashed" with model_extra.num_items'
        )
    _exact_size("num_items", extra.num_items, items, dataset.uri)
    return IdTables(num_items, num_actions, "exact", items, actions, items.size, None)


def sized_config(cfg: RunConfig, tables: IdTables) -> RunConfig:
    """``cfg`` with the resolved table sizes: engines size their tables from ``model_extra``."""
    items = 0 if tables.mode == "zch" else tables.num_items  # zch: zch_size sizes the item table
    extra = replace(cfg.model_extra, num_items=items, num_actions=tables.num_actions)
    return replace(cfg, model_extra=extra)


@dataclass
class EvalPoint:
    """One evaluation: validation (or test when eval.validation is off) metrics at a step."""

    step: int
    metrics: dict[str, Any]


@dataclass
class BestTracker:
    """Best-validation selection and early stopping; every rank holds one and sees the same metrics
    (``evaluate`` gathers them everywhere), so every rank decides alike."""

    metric: str  # e.g. "ndcg@10"
    patience: int
    best: EvalPoint | None = None
    best_test: dict[str, Any] | None = None
    best_checkpoint: str | None = None
    since_best: int = 0
    history: list[EvalPoint] = field(default_factory=list)

    def offer(self, step: int, metrics: dict[str, Any]) -> bool:
        """Record an evaluation; True when it is the new best (strictly better; ties keep the earlier)."""
        point = EvalPoint(step, metrics)
        self.history.append(point)
        if self.best is None or metrics[self.metric] > self.best.metrics[self.metric]:
            self.best, self.since_best = point, 0
            return True
        self.since_best += 1
        return False

    @property
    def should_stop(self) -> bool:
        return bool(self.patience) and self.since_best >= self.patience

    def report(self) -> dict[str, Any]:
        if self.best is None:
            return {}
        return {
            "metric": self.metric,
            "best_step": self.best.step,
            "validation": self.best.metrics,
            "test": self.best_test,
            "best_checkpoint": self.best_checkpoint,
            "evaluations": len(self.history),
            "stopped_early": self.should_stop,
            "history": [asdict(point) for point in self.history],
        }
