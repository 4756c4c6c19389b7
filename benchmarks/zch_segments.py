"""bench_zch's reading of each arm's per-user ranks (``eval.write_ranks``): how sure a figure is, and
where it comes from.

* Uncertainty: HR@10 is a share of a few hundred or thousand users, NDCG@10 a mean over them; the
  95% half-width of HR@10 (normal approximation) and the standard error of NDCG@10 say whether two
  arms differ by more than their sampling noise.
* Segments: a next-window target is either an item some earlier window held (``known``: a row per id
  can have learned it) or an id the model never trained (``new``: an oracle or zch table does not hold
  it, so it is a miss; a modulo table scores it by whatever row another item trained). The two
  segments separate what the id mapping buys on known items from what it does with ids it never saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.trainer.eval.evaluate import EvalRanks, metrics_from_ranks

K = 10


@dataclass(frozen=True)
class EvalTargets:
    """The test target (last event of each user's most recent sample) of an evaluated window, and
    which of them an earlier window held."""

    users: np.ndarray  # int64, sorted
    items: np.ndarray  # int64, the target of users[i]
    known: np.ndarray  # bool: the target is an item of a training window

    def lookup(self, user_ids: np.ndarray) -> np.ndarray:
        """``known`` of each user (every evaluated user has a target here, or a one-line error)."""
        at = np.searchsorted(self.users, user_ids)
        found = (at < len(self.users)) & (self.users[np.minimum(at, len(self.users) - 1)] == user_ids)
        if not found.all():
            raise ValueError(f"bench_zch: evaluated user {int(user_ids[~found][0])} has no test target")
        return self.known[at]


def eval_targets(path: str, trained_items: np.ndarray) -> EvalTargets:
    """Targets of ``path``'s window-0 samples (the ones the evaluation reads) against the items of
    every training window so far (``trained_items``)."""
    dataset = PreparedDataset(path)
    users, items = [], []
    for index in range(dataset.n_micro_batches):
        for sample in dataset.micro_batch(index):
            if int(sample["window"]) == 0 and len(sample["item_ids"]):
                users.append(int(sample["user_id"]))
                items.append(int(sample["item_ids"][-1]))
    order = np.argsort(np.asarray(users, dtype=np.int64), kind="stable")
    user_arr, item_arr = np.asarray(users, dtype=np.int64)[order], np.asarray(items, dtype=np.int64)[order]
    return EvalTargets(user_arr, item_arr, np.isin(item_arr, trained_items))


def spread(ranks: np.ndarray) -> dict[str, Any]:
    """HR@10 / NDCG@10 with their sampling uncertainty."""
    n = len(ranks)
    metrics = metrics_from_ranks(ranks, K)
    if n == 0:
        return {"users": 0, **metrics, "hits": 0, "hr@10_ci95": None, "ndcg@10_se": None}
    hits = ranks < K
    gains = np.where(hits, 1.0 / np.log2(ranks + 2.0), 0.0)
    p = float(hits.mean())
    return {"users": n, **metrics, "hits": int(hits.sum()), "hr@10_ci95": 1.96 * float(np.sqrt(p * (1 - p) / n)),
            "ndcg@10_se": float(gains.std(ddof=1) / np.sqrt(n)) if n > 1 else None}  # fmt: skip


def segments(per_user: EvalRanks, targets: EvalTargets) -> dict[str, Any]:
    """All users, and the known-target and new-target segments, each with its uncertainty."""
    known = targets.lookup(per_user.user_ids)
    return {"all": spread(per_user.ranks), "known": spread(per_user.ranks[known]),
            "new": spread(per_user.ranks[~known])}  # fmt: skip


def separable(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    """Whether two arms' NDCG@10 differ by more than twice their combined standard error."""
    if a.get("ndcg@10_se") is None or b.get("ndcg@10_se") is None:
        return None
    return abs(a["ndcg@10"] - b["ndcg@10"]) > 2 * float(np.hypot(a["ndcg@10_se"], b["ndcg@10_se"]))
