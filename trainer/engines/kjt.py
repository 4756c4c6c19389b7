"""The TorchRec engine's view of a ``Batch``: a ``KeyedJaggedTensor`` of ``ENGINE_KEYS``.

A batch's sparse features as TorchRec sees them (keys and builder: ``pipeline.dataset.kjt``): ``item``
and ``action`` (one id per event, one jagged row per sample) and ``neg`` (the micro-batch's shared
negatives, all in the first row). The FreeScale engine's sharded tables accept this KJT as well as
their own ``JaggedIds`` (both expose ``keys``, ``values``, ``length_per_key``), so a TorchRec data
pipeline can feed either engine. TorchRec is imported lazily (by the builder): the FreeScale engine
(and the GPU hosts, which have no TorchRec CUDA build) never need it.
"""

from __future__ import annotations

from typing import Any

import torch

from freescale.pipeline.dataset.kjt import ENGINE_KEYS, keyed_jagged
from freescale.trainer.data.batches import Batch


def batch_to_kjt(batch: Batch) -> Any:
    """The ``KeyedJaggedTensor`` of ``batch``'s features (keys ``item``, ``action``, ``neg``, then each
    user-profile table of ``batch.profile_tables``: one id per sample)."""
    rows = max(1, batch.num_samples)
    seq_lengths = batch.lengths if batch.num_samples else torch.zeros(1, dtype=torch.int64)
    neg_lengths = torch.zeros(rows, dtype=torch.int64)
    neg_lengths[0] = batch.negative_ids.numel()
    profile_lengths = (torch.ones if batch.num_samples else torch.zeros)(rows, dtype=torch.int64)
    values = torch.cat([batch.item_ids, batch.action_ids, batch.negative_ids, batch.profile_ids.reshape(-1)])
    lengths = torch.cat([seq_lengths, seq_lengths, neg_lengths, *[profile_lengths] * len(batch.profile_tables)])
    return keyed_jagged([*ENGINE_KEYS, *batch.profile_tables], values, lengths.to(torch.int32))
