"""User-profile features as table rows (pipeline/dataset/profiles.py) through the trainer's collation."""

from __future__ import annotations

import numpy as np
import pytest

from freescale.pipeline.dataset.profiles import ProfileRead, profile_rows
from freescale.pipeline.dataset.samples import CollateConfig
from freescale.pipeline.dataset.vocabulary import UnknownIdError, Vocabulary
from freescale.trainer.data.batches import collate

COUNTRY = Vocabulary("user.country", np.array([-1, 4, 9, 30], np.int64))
READS = (
    ProfileRead("user.country", 1, 4, COUNTRY),  # exact: the second profile feature
    ProfileRead("user.age", 0, 5),  # hashed: modulo 5
    ProfileRead("user.user_id", None, 64, raw=True),  # zch: the raw user id
)


def _sample(user: int, age: int, country: int, length: int) -> dict:
    events = np.arange(length, dtype=np.int64)
    return {"item_ids": events, "actions": events % 2, "timestamps": events * 60, "cost": 1.0, "user_id": user,
            "user_features": np.array([age, country], np.int32)}  # fmt: skip


def test_each_table_reads_its_value_of_the_kept_samples() -> None:
    samples = [_sample(2**40 + 1, 7, 9, 4), _sample(5, 3, 30, 1), _sample(6, 12, -1, 3)]  # the second is too short
    cfg = CollateConfig(num_items=8, num_actions=2, max_len=16, num_negatives=0, inbatch_negatives=0,
                        holdout_last=False, profiles=READS)  # fmt: skip
    batch = collate(samples, cfg, step=0, rank=0)
    assert batch.profile_tables == ("user.country", "user.age", "user.user_id")
    assert batch.profile_ids.tolist() == [[2, 0], [7 % 5, 12 % 5], [2**40 + 1, 6]]
    assert batch.input_samples().tolist() == [0, 0, 0, 1, 1]  # 3 and 2 inputs


def test_a_value_outside_the_vocabulary_names_its_table() -> None:
    with pytest.raises(UnknownIdError, match=r"table user.country: user.country id 5 is not in"):
        profile_rows(READS[:1], [_sample(1, 1, 5, 3)], [0])


def test_no_profile_tables_give_an_empty_batch_field() -> None:
    cfg = CollateConfig(num_items=8, num_actions=2, max_len=16, num_negatives=0, inbatch_negatives=0)
    batch = collate([_sample(1, 1, 4, 3)], cfg, step=0, rank=0, holdout=False)
    assert batch.profile_tables == () and tuple(batch.profile_ids.shape) == (0, 1)


def test_a_missing_profile_value_gets_an_id_a_zch_table_accepts() -> None:
    """-1 (a user the users table does not list) must not reach an identity table, which refuses ids < 0."""
    read = ProfileRead("user.zip", 0, 64, raw=True)
    rows = profile_rows((read,), [_sample(1, -1, 4, 3), _sample(2, 17, 4, 3)], [0, 1])
    assert rows.tolist() == [[2**63 - 1, 17]]
