"""What a full ranking ranks: the candidates each row of the item table stands for (``eval.catalogue``).

``"items"`` (the default): every item of the *evaluated* dataset's item vocabulary is a candidate,
scored by the row its id reads: its own row under exact ids; ``raw id % num_items`` under
``ids = "hashed"``, a row it shares with every other item folded onto it; its slot under
``ids = "zch"`` when the identity table holds it, and no row (not a candidate) when it does not. A row
then counts once for each catalogue item reading it, and the other items on the target's own row
score exactly what the target scores, so they tie with it and count against it (the evaluator's tie
rule). Why: a recommender serves items, not rows. Ranked by rows, a modulo table hides its
collisions from its own evaluation: an item sharing the target's row is no competitor, and a row
that holds only yesterday's items still competes today. ``docs/training.md#evaluation`` has the
figures this changes.

``"rows"``: every row standing for an item counts once (a zero-collision table's empty slots and
fallback rows count for none), whatever the evaluated data holds; the ranking before item-level
ranking existed, kept for comparison with older results.

Under exact ids on the training dataset both give the same ranks: the vocabulary is the table.
The sampled protocol (``eval.num_candidates > 0``) draws catalogue items under ``"items"`` (scored by
their rows; one on the target's row that is another item ties against it) and table rows under ``"rows"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import CollateConfig

CATALOGUE_CHUNK = 65_536  # catalogue ids a rank maps per (collective) lookup


def eval_catalogue(catalogue: str, dataset: PreparedDataset) -> np.ndarray | None:
    """The raw item ids ``eval.catalogue`` ranks on ``dataset`` (the evaluated one): its item vocabulary
    (``"items"``), or None (``"rows"``); one line when the dataset has no vocabulary."""
    if catalogue == "rows":
        return None
    vocab = dataset.vocabulary("item")
    if vocab is None:
        raise ValueError(
            f"{dataset.uri} has no item vocabulary (prepared by an older FreeScale): eval.catalogue 'items' ranks "
            "its items; re-run `freescale prepare --overwrite`, or set eval.catalogue = 'rows'"
        )
    return vocab.raw_ids


def row_weights(engine: Any, collate_cfg: CollateConfig, catalogue: np.ndarray | None) -> torch.Tensor:
    """int64 per row of this rank's item-table shard: how many candidates the row stands for.

    ``catalogue``: raw item ids (``"items"``; every rank passes the same array) or None (``"rows"``).
    Collective with a catalogue: each rank maps its share of the ids through the engine (a zero-collision
    table's read-only lookup routes them to their owners) and one all-reduce sums the counts."""
    shard = engine.local_item_rows()
    size, device = shard.rows.shape[0], shard.rows.device
    if catalogue is None:
        if shard.is_item is None:
            return torch.ones(size, dtype=torch.int64, device=device)
        return shard.is_item.to(device=device, dtype=torch.int64)
    total = torch.tensor([shard.first_row + size], dtype=torch.int64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    counts = torch.zeros(int(total), dtype=torch.int64, device=device)
    for ids in _my_chunks(catalogue, dist.get_rank(), dist.get_world_size()):
        rows = engine.catalogue_rows(torch.from_numpy(collate_cfg.item_rows(ids, where="eval catalogue")))
        rows = rows.to(device)
        counts += torch.bincount(rows[rows >= 0], minlength=counts.numel())
    dist.all_reduce(counts)
    return counts[shard.first_row : shard.first_row + size]


def _my_chunks(catalogue: np.ndarray, rank: int, world: int) -> list[np.ndarray]:
    """This rank's share of ``catalogue`` in chunks, as many chunks on every rank (empty ones pad)."""
    share = np.array_split(np.asarray(catalogue, dtype=np.int64), world)[rank]
    largest = -(-len(catalogue) // world)
    calls = -(-largest // CATALOGUE_CHUNK)
    return [share[i * CATALOGUE_CHUNK : (i + 1) * CATALOGUE_CHUNK] for i in range(calls)]


def own_row_ties(target_rows: torch.Tensor, first_row: int, weights: torch.Tensor) -> torch.Tensor:
    """Per target (its global row, -1: none), the other candidates on its own row when this rank's
    shard (from ``first_row``, ``weights``) holds that row: they score what it scores and tie against it."""
    local = target_rows - first_row
    if weights.numel() == 0:
        return torch.zeros_like(local)
    inside = (local >= 0) & (local < weights.numel())
    others = (weights[local.clamp(0, weights.numel() - 1)] - 1).clamp(min=0)
    return torch.where(inside, others, torch.zeros_like(local))
