"""Leave-one-out evaluation: HR@k and NDCG@k of each user's held-out item, validation or test.

Training never sees a user's validation (second-to-last) or test (last) event as a target
(``data.held_out``); here the model reads the history before the split's item (``data.split_query``:
the test history includes the validation item) and ranks the item. Which users, which split and the
best-validation selection live in ``trainer/eval/protocol.py`` and the runner.

``eval.num_candidates = 0`` ranks it against the *whole* catalogue: by default every item of the
evaluated dataset, each scored by the row its id reads, so a row counts once per item on it and the
items sharing the target's row tie against it (``eval.catalogue``, ``trainer/eval/catalogue.py``).
The item table is sharded, so every rank scores all ranks' queries against its own shard and counts
the candidates that beat each target; one all-reduce of the counts gives exact full-ranking ranks
without gathering the table. ``num_candidates > 0`` is the sampled protocol (labelled ``sampled-N`` in the
output; N uniform random items shared by a chunk of queries), for catalogues too large to score
every step. ``eval.exclude_history`` leaves the items of the query's history out of the ranking.

A target the engine has no row for (target id -1: an id a zero-collision table does not hold, read
through the shared fallback row) is a miss, ranked below every candidate: the fallback row stands
for no item, and scoring the target by it would rank a never-seen item by whatever that row learned
(in a next-window evaluation most targets can be new, and such a row can outscore every held item).

Ties and NaN are ranked pessimistically: a candidate counts above the target when its score is
greater *or equal*, or NaN, and a NaN target is ranked below everything. Why: a collapsed or
diverged model (every score equal, or NaN) must report HR@k = 0, not 1 — with ``>`` nothing beats a
tied or NaN target and every user counted as a hit. The target's own row is left out by id, since
its score recomputed through a different matmul may differ from the target score in the last bit.

``most_popular`` is the most-popular baseline under the same protocol, computed from the training
events, for the quality benchmark and the demo.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.pipeline.dataset.targets import held_out
from freescale.trainer.data.batches import collate
from freescale.trainer.eval.catalogue import own_row_ties, row_weights

EVAL_CHUNK = 64
SCORE_CHUNK_ROWS = 65_536


@dataclass(frozen=True)
class EvalRanks:
    """Every evaluated user's 0-based rank of its held-out item, all ranks' users (``eval.write_ranks``):
    what a segment analysis reads (new items against known ones, short histories against long)."""

    user_ids: np.ndarray  # int64 [U]
    ranks: np.ndarray  # int64 [U]: candidates scoring above the target (ties and NaN against it)

    def write_csv(self, path: Path) -> None:
        """``user_id,rank`` per line, written to a temporary name and renamed (never half a file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        rows = np.stack([self.user_ids, self.ranks], axis=1) if len(self.ranks) else np.zeros((0, 2), np.int64)
        np.savetxt(partial, rows, fmt="%d", delimiter=",", header="user_id,rank", comments="")
        partial.replace(path)

    @staticmethod
    def read_csv(path: Path) -> EvalRanks:
        rows = np.loadtxt(path, dtype=np.int64, delimiter=",", skiprows=1, ndmin=2)
        return EvalRanks(rows[:, 0], rows[:, 1])


def metrics_from_ranks(ranks: np.ndarray, k: int) -> dict[str, float]:
    """HR@k and NDCG@k from 0-based ranks (number of candidates scoring above the target)."""
    if len(ranks) == 0:
        return {f"hr@{k}": 0.0, f"ndcg@{k}": 0.0}
    hits = ranks < k
    ndcg = np.where(hits, 1.0 / np.log2(ranks + 2.0), 0.0)
    return {f"hr@{k}": float(hits.mean()), f"ndcg@{k}": float(ndcg.mean())}


def beats_target(scores: torch.Tensor, target_scores: torch.Tensor, is_target: torch.Tensor) -> torch.Tensor:
    """Which candidates rank above each target, ties and NaN against the target (module docstring).

    ``scores`` [Q, C], ``target_scores`` [Q], ``is_target`` [Q, C]: the candidate is the target item.
    """
    targets = target_scores[:, None]
    above = (scores >= targets) | scores.isnan() | targets.isnan()
    return above & ~is_target


def _all_gather_rows(rows: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Concatenate every rank's ``rows`` (varying counts) on every rank."""
    world = dist.get_world_size()
    count = torch.tensor([rows.shape[0]], device=rows.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = [int(c) for c in counts]
    padded = rows.new_zeros((max(sizes), *rows.shape[1:]))
    padded[: rows.shape[0]] = rows
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return torch.cat([g[:n] for g, n in zip(gathered, sizes)]), sizes


def history_pairs(batch: Any) -> torch.Tensor:
    """``[P, 2]`` (query, item row) pairs: the distinct items of each query's history other than its
    target (``eval.exclude_history``: such items are not ranked)."""
    lengths = batch.lengths.tolist()
    starts = torch.cumsum(batch.lengths, 0) - batch.lengths
    pairs = []
    for query, (start, length) in enumerate(zip(starts.tolist(), lengths, strict=True)):
        history = batch.item_ids[start : start + length - 1].unique()
        history = history[history != batch.item_ids[start + length - 1]]
        pairs.append(torch.stack([torch.full_like(history, query), history], dim=1))
    return torch.cat(pairs) if pairs else torch.zeros((0, 2), dtype=torch.int64)


def _full_ranks(
    engine: Any,
    queries: torch.Tensor,
    target_scores: torch.Tensor,
    target_ids: torch.Tensor,
    weights: torch.Tensor,
    history: torch.Tensor | None = None,
) -> torch.Tensor:
    """Candidates of the whole catalogue scoring above each target (this rank's queries): each row of
    this rank's shard counts ``weights`` candidates (``catalogue.row_weights``), the target's row its
    other candidates (ties); with ``history`` (``history_pairs``) those rows are left out."""
    all_queries, sizes = _all_gather_rows(queries)
    all_targets = _all_gather_rows(target_scores[:, None])[0][:, 0]
    all_ids = _all_gather_rows(target_ids[:, None].to(torch.int64))[0]
    first = sum(sizes[: dist.get_rank()])
    if history is not None:
        shifted = history.to(all_queries.device) + torch.tensor([first, 0], device=all_queries.device)
        history = _all_gather_rows(shifted)[0]
    shard = engine.local_item_rows()
    above = torch.zeros(all_queries.shape[0], dtype=torch.int64, device=all_queries.device)
    for start in range(0, shard.rows.shape[0], SCORE_CHUNK_ROWS):
        rows = F.normalize(shard.rows[start : start + SCORE_CHUNK_ROWS].to(all_queries.dtype), dim=-1)
        row_ids = shard.first_row + start + torch.arange(rows.shape[0], device=all_queries.device)
        excluded = row_ids[None, :] == all_ids
        if history is not None:
            inside = (history[:, 1] >= row_ids[0]) & (history[:, 1] < row_ids[0] + rows.shape[0])
            excluded[history[inside, 0], history[inside, 1] - row_ids[0]] = True
        beats = beats_target(all_queries @ rows.T, all_targets, excluded)
        counted = weights[start : start + rows.shape[0]].to(beats.device)
        above += torch.where(beats, counted[None, :], 0).sum(dim=1)
    above += own_row_ties(all_ids[:, 0], shard.first_row, weights.to(above.device))
    dist.all_reduce(above)
    return above[first : first + queries.shape[0]]


def _sampled_ranks(
    engine: Any,
    queries: torch.Tensor,
    target_scores: torch.Tensor,
    target_ids: torch.Tensor,
    num_candidates: int,
    collate_cfg: CollateConfig,
    seed: int,
    catalogue: np.ndarray | None,
    last_items: torch.Tensor,
) -> torch.Tensor:
    """Sampled candidates scoring above each target: ``num_candidates`` uniform table rows, or with a
    ``catalogue`` uniform catalogue items scored by their rows, where a candidate on the target's row
    that is another item (``last_items``: the targets' raw ids) ties against it."""
    generator = torch.Generator().manual_seed(seed)
    size = collate_cfg.num_items if catalogue is None else len(catalogue)
    drawn = torch.randint(0, size, (num_candidates,), generator=generator)
    picked = None if catalogue is None else catalogue[drawn.numpy()]
    candidates = drawn if picked is None else torch.from_numpy(collate_cfg.item_rows(picked))
    rows = F.normalize(engine.lookup_items(candidates), dim=-1)
    same_row = candidates.to(queries.device)[None, :] == target_ids[:, None]
    if picked is None:
        return beats_target(queries @ rows.T, target_scores, same_row).sum(dim=1)
    is_target = torch.from_numpy(picked).to(queries.device)[None, :] == last_items.to(queries.device)[:, None]
    return (beats_target(queries @ rows.T, target_scores, is_target) | (same_row & ~is_target)).sum(dim=1)


def evaluate(
    engine: Any,
    samples: list[dict[str, Any]],
    collate_cfg: CollateConfig,
    num_candidates: int,
    k: int,
    seed: int = 0,
    exclude_history: bool = False,
    keep_ranks: bool = False,
    catalogue: np.ndarray | None = None,
) -> dict[str, Any]:
    """HR@k / NDCG@k over all ranks' eval queries, each ranking its last event given the events before
    (collective: every rank must call it). ``keep_ranks``: the result also holds ``"ranks"``, an
    ``EvalRanks`` of every user (not JSON: the caller writes it). ``catalogue``: the raw item ids a full
    ranking ranks (``eval.catalogue = "items"``); None ranks the table's rows (``"rows"``)."""
    chunks = [samples[i : i + EVAL_CHUNK] for i in range(0, len(samples), EVAL_CHUNK)]
    count = torch.tensor([len(chunks)], device=engine.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    chunks += [[] for _ in range(int(count) - len(chunks))]  # equal collective counts on every rank
    ranks, users = [], []
    collate_cfg = replace(collate_cfg, full_softmax=False)  # queries need no catalogue of negatives
    weights = None if num_candidates else row_weights(engine, collate_cfg, catalogue)
    for number, chunk in enumerate(chunks):
        batch = collate(chunk, collate_cfg, step=number, rank=dist.get_rank(), holdout=False)
        queries, target_rows, target_ids = engine.encode(batch)
        queries, target_rows = F.normalize(queries.float(), dim=-1), F.normalize(target_rows.float(), dim=-1)
        target_scores = (queries * target_rows).sum(-1)
        # a target without a row of its own (id -1: a zero-collision table does not hold it) is a miss
        target_scores = torch.where(target_ids.to(target_scores.device) >= 0, target_scores, torch.nan)
        if num_candidates:
            rank = _sampled_ranks(
                engine,
                queries,
                target_scores,
                target_ids,
                num_candidates,
                collate_cfg,
                seed * 100_003 + number,
                catalogue,
                batch.last_items,
            )
        else:
            history = history_pairs(batch) if exclude_history else None
            rank = _full_ranks(engine, queries, target_scores, target_ids, weights, history)
        ranks.append(rank.cpu())
        users.append(batch.user_ids.cpu())
    local = torch.cat(ranks) if ranks else torch.zeros(0, dtype=torch.int64)
    local_users = torch.cat(users) if users else torch.zeros(0, dtype=torch.int64)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (local.numpy(), local_users.numpy()))
    all_ranks = np.concatenate([r for r, _ in gathered]) if gathered else np.zeros(0)
    protocol = f"sampled-{num_candidates}" if num_candidates else "full"
    if exclude_history:
        protocol += "-exclude-history"
    ranked = "items" if catalogue is not None else "rows"
    result = {"protocol": protocol, "catalogue": ranked, "users": len(all_ranks), **metrics_from_ranks(all_ranks, k)}
    if keep_ranks:
        all_users = np.concatenate([u for _, u in gathered]).astype(np.int64)
        result["ranks"] = EvalRanks(all_users, all_ranks.astype(np.int64))
    return result


def popularity_metrics(train_items: np.ndarray, eval_targets: np.ndarray, num_items: int, k: int) -> dict[str, Any]:
    """Most-popular baseline, full ranking: rank = number of items more frequent than the target."""
    counts = np.bincount(train_items % num_items, minlength=num_items)
    ordered = np.sort(counts)
    target_counts = counts[eval_targets % num_items]
    above = num_items - np.searchsorted(ordered, target_counts, side="right")
    result = metrics_from_ranks(above.astype(np.float64), k)
    return {
        "protocol": "full",
        "users": len(eval_targets),
        **result,
        "note": "score = training frequency; ties broken in the target's favour",
    }


def most_popular(dataset: PreparedDataset, k: int) -> dict[str, dict[str, Any]]:
    """Most-popular baseline on the protocol's validation and test targets of every evaluated user
    (window-0 samples with at least 3 events): item frequency over the training events (every event
    but the held-out validation and test items), in exact rows. Why here: the demo and
    ``bench_quality`` print it next to the model, and both must score the baseline alike."""
    vocab = dataset.vocabulary("item")
    if vocab is None:
        raise ValueError(f"{dataset.uri}: no item vocabulary (prepared by an older FreeScale); re-run prepare")
    stride = dataset.info.window_stride
    train, validation, test = [], [], []
    for index in range(dataset.n_micro_batches):
        for sample in dataset.micro_batch(index):
            rows = vocab.rows(sample["item_ids"])
            train.append(rows[: len(rows) - held_out(sample, 2, stride)])
            if int(sample["window"]) == 0 and len(rows) >= 3:
                validation.append(int(rows[-2]))
                test.append(int(rows[-1]))
    counts = np.concatenate(train)
    return {
        split: popularity_metrics(counts, np.array(targets), vocab.size, k)
        for split, targets in (("validation", validation), ("test", test))
    }
