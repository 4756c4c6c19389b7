"""The TorchRec boundary: ``Batch`` ↔ ``KeyedJaggedTensor``.

A batch's sparse features as TorchRec sees them: keys ``item`` and ``action`` (one id per event,
one jagged row per sample) and ``neg`` (the micro-batch's shared negatives, all in the first row:
KJT needs every key to have the same number of rows). The FreeScale engine's sharded tables accept
this KJT as well as their own ``JaggedIds`` (both expose ``keys``, ``values``, ``length_per_key``), so
a TorchRec data pipeline can feed either engine. TorchRec is imported lazily: the FreeScale engine
(and the GPU hosts, which have no TorchRec CUDA build) never need it.
"""

from __future__ import annotations

from typing import Any

import torch

from freescale.trainer.data import Batch
from freescale.trainer.engine import FEATURES


def batch_to_kjt(batch: Batch) -> Any:
    """The ``KeyedJaggedTensor`` of ``batch``'s features (keys ``item``, ``action``, ``neg``)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    rows = max(1, batch.num_samples)
    seq_lengths = batch.lengths if batch.num_samples else torch.zeros(1, dtype=torch.int64)
    neg_lengths = torch.zeros(rows, dtype=torch.int64)
    neg_lengths[0] = batch.negative_ids.numel()
    values = torch.cat([batch.item_ids, batch.action_ids, batch.negative_ids])
    lengths = torch.cat([seq_lengths, seq_lengths, neg_lengths]).to(torch.int32)
    return KeyedJaggedTensor.from_lengths_sync(keys=list(FEATURES), values=values, lengths=lengths)


def kjt_feature_ids(kjt: Any) -> dict[str, torch.Tensor]:
    """Per-key id tensors of a KJT (what ``sharded.split_features`` reads)."""
    return dict(zip(kjt.keys(), torch.split(kjt.values(), kjt.length_per_key())))
