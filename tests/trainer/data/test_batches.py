"""``collate`` (trainer/data/batches.py): held-out items and reproducible negatives."""

from __future__ import annotations

import torch
from trainer_samples import collate_cfg, make_samples

from freescale.trainer.data.batches import collate


def test_collate_holds_out_validation_and_test_items_and_draws_reproducible_negatives() -> None:
    samples = make_samples([6, 1, 4])
    batch = collate(samples, collate_cfg(), step=3, rank=1)
    assert batch.lengths.tolist() == [4, 2]  # the 1-event sample is dropped, the last two events held out
    assert batch.num_positions == 3 + 1
    first = torch.from_numpy(samples[0]["item_ids"][:4] % 50)
    assert batch.item_ids[:4].tolist() == first.tolist()
    assert batch.item_ids[batch.target_index[:3]].tolist() == first[1:].tolist()
    test_only = collate(samples, collate_cfg(holdout_events=1), step=3, rank=1)
    assert test_only.lengths.tolist() == [5, 3]
    again = collate(samples, collate_cfg(), step=3, rank=1)
    assert torch.equal(batch.negative_ids, again.negative_ids)
    assert not torch.equal(batch.negative_ids, collate(samples, collate_cfg(), step=4, rank=1).negative_ids)
    evaluation = collate(samples, collate_cfg(), step=0, rank=0, holdout=False)
    assert evaluation.lengths.tolist() == [6, 4]
