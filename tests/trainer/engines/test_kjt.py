"""The KJT boundary (trainer/engines/kjt.py): our tables read TorchRec's KeyedJaggedTensor."""

from __future__ import annotations

import pytest
import torch
from trainer_samples import collate_cfg, make_samples

from freescale.trainer.data.batches import collate
from freescale.trainer.engines.engine import batch_features
from freescale.trainer.engines.jagged_ids import split_features


def test_sharded_tables_read_torchrec_keyed_jagged_tensors() -> None:
    """The KJT boundary: our tables take TorchRec's KeyedJaggedTensor as well as their own JaggedIds."""
    pytest.importorskip("torchrec")
    from freescale.trainer.engines.kjt import batch_to_kjt

    batch = collate(make_samples([6, 3, 9]), collate_cfg(), step=0, rank=0)
    kjt = batch_to_kjt(batch)
    ours, theirs = split_features(batch_features(batch)), split_features(kjt)
    assert list(theirs) == ["item", "action", "neg"]
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert kjt.stride() == batch.num_samples
