"""What a training run reads: its id tables sized from the prepared dataset, how it collates, its step
count, and the public loader over this rank's steps (``runner.Trainer`` and the references that replay a
rank's step derive these alike).
"""

from __future__ import annotations

from typing import Any

from freescale.pipeline.dataset import loader
from freescale.pipeline.dataset.profiles import ProfileRead
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.trainer.config import RunConfig
from freescale.trainer.data.batches import collate
from freescale.trainer.eval.protocol import IdTables, resolve_tables, sized_config
from freescale.trainer.user_tables import profile_reads, resolve_user_tables


def collate_config(
    cfg: RunConfig, tables: IdTables | None = None, window_stride: int = 0, profiles: tuple[ProfileRead, ...] = ()
) -> CollateConfig:
    """How this run collates: table sizes and vocabularies (``tables``, from the dataset), held-out
    events (2 with ``eval.validation``: validation + test), prepare's window stride and the user-profile
    tables' reads (``user_tables.profile_reads``)."""
    vocabularies: dict[str, Any] = {"profiles": profiles}
    if tables is not None:
        vocabularies |= {"item_vocab": tables.item_vocab, "action_vocab": tables.action_vocab}
    if tables is not None and tables.mode == "zch":
        vocabularies["item_pool"] = tables.item_pool
    return CollateConfig.for_model(
        cfg.model,
        cfg.model_extra,
        holdout_last=cfg.data.holdout_last,
        seed=cfg.data.seed,
        holdout_events=2 if cfg.eval.validation else 1,
        window_stride=window_stride,
        **vocabularies,
    )


def run_tables(cfg: RunConfig, dataset: PreparedDataset) -> tuple[RunConfig, IdTables, CollateConfig]:
    """``cfg`` with its tables sized from ``dataset``, the id tables, and how the run collates: what
    every rank (and a reference that replays a rank's step) derives from the config and the data."""
    tables = resolve_tables(cfg, dataset)
    cfg = sized_config(cfg, tables)  # engines size their tables from model_extra
    features = dataset.info.layout.user_features
    cfg = resolve_user_tables(cfg, features, dataset.table_sizes(), dataset.uri)
    profiles = profile_reads(cfg, features, dataset.vocabulary)
    return cfg, tables, collate_config(cfg, tables, dataset.info.window_stride, profiles)


def total_steps(cfg: RunConfig, dataset: PreparedDataset, world_size: int) -> int:
    return loader.total_steps(dataset, world_size, cfg.data.epochs, cfg.data.max_steps)


def make_loader(
    cfg: RunConfig,
    dataset: PreparedDataset,
    collate_cfg: CollateConfig,
    rank: int,
    world_size: int,
    start: int,
    end: int,
) -> loader.Loader:
    """The public loader reading this rank's ``Batch`` of steps ``[start, end)``: the trainer reads the
    way any user's model does. A resumed run starts at its checkpoint's step, which is all the loader
    state a run needs (the schedule is a function of the step)."""
    config = loader.Config(
        path=cfg.data.path,
        world_size=world_size,
        rank=rank,
        output="batch",
        start_step=start,
        num_steps=end - start,
        seed=cfg.data.seed,
        num_workers=cfg.data.workers,
        prefetch_factor=cfg.data.prefetch,
        collate=collate_cfg,
        collate_fn=collate,
    )
    return loader.Loader(config, dataset)
