"""The TorchRec boundary: one ``KeyedJaggedTensor`` builder, one key set, one ``Pipelineable`` batch.

Key set (every KJT FreeScale builds draws its keys from it, one id per event, one jagged row per
sample, in this order):

- ``item``: item table rows of the events;
- ``action``: action table rows of the events;
- ``timestamp``: event times in seconds (feeds no embedding table; a model's encoder reads it);
- ``neg``: the micro-batch's shared negatives (item table rows), all in the first row: KJT needs
  every key to have the same number of rows;
- then ``user.<feature>``: user-profile tables, one row id per sample (the loader's
  ``Config.user_features``, the engines' ``[user_tables]``).

Two views use it: the public loader's ``kjt`` output (``kjt_batch``: ``LOADER_KEYS`` of each sample's
*input* events, next-item targets beside them) and the TorchRec engine (``trainer.kjt.batch_to_kjt``:
``ENGINE_KEYS`` of every event of a collated ``Batch`` plus its negatives). Both are built by
``keyed_jagged`` and travel as ``KJTBatch``, registered as a TorchRec ``Pipelineable`` so TorchRec's
train pipelines move it to the device themselves.

TorchRec is imported lazily, here only: the loader's other outputs, the FreeScale engine and the GPU
hosts (which have no TorchRec CUDA build) never need it; where it is missing, asking for a KJT is one
line (``freescale.optional.torchrec_unavailable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from freescale.optional import torchrec_unavailable
from freescale.pipeline.dataset.profiles import profile_rows
from freescale.pipeline.dataset.samples import CollateConfig, sequence_arrays

ITEM, ACTION, TIMESTAMP, NEG = "item", "action", "timestamp", "neg"
KJT_KEYS = (ITEM, ACTION, TIMESTAMP, NEG)  # the one key set (module docstring)
LOADER_KEYS = (ITEM, ACTION, TIMESTAMP)  # the loader's ``kjt`` output
ENGINE_KEYS = (ITEM, ACTION, NEG)  # the TorchRec engine's (and the sharded tables') features
PROFILE_PREFIX = "user."  # then the engines' user-profile tables (``[user_tables]``), one id per sample


def _torchrec_kjt() -> Any:
    """TorchRec's ``KeyedJaggedTensor`` class, or one line saying why it cannot be imported here."""
    if reason := torchrec_unavailable("a KeyedJaggedTensor"):
        raise ModuleNotFoundError(reason)
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor


def keyed_jagged(keys: list[str], values: torch.Tensor, lengths: torch.Tensor) -> Any:
    """The ``KeyedJaggedTensor`` of ``keys`` (from ``KJT_KEYS``, in that order, then user-profile tables
    ``user.<feature>``, one id per row): ``values`` key after key, ``lengths`` the per-row lengths of
    every key, key after key."""
    unknown = [key for key in keys if key not in KJT_KEYS and not key.startswith(PROFILE_PREFIX)]
    if unknown:
        raise ValueError(f"KJT keys {unknown} are not in the key set {list(KJT_KEYS)} (or {PROFILE_PREFIX}<feature>)")
    return _torchrec_kjt().from_lengths_sync(keys=list(keys), values=values, lengths=lengths)


@dataclass
class KJTBatch:
    """One step's micro-batch for a TorchRec model: ``features`` (a ``KeyedJaggedTensor``) and what
    travels beside it.

    From the loader (``output = "kjt"``): ``features`` holds each sample's *input* events (all but its
    last, after holdout and truncation) under ``LOADER_KEYS``; ``lengths`` [B] counts them per sample
    and ``targets[j]`` is the item row of the event after input ``j`` (next-item training at every
    position). From the TorchRec engine: ``features`` holds ``ENGINE_KEYS`` and ``dense`` the
    collated ``Batch`` the dense side reads (``lengths``/``targets`` are then empty)."""

    step: int
    features: Any  # torchrec KeyedJaggedTensor
    lengths: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    targets: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    user_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    dense: Any = None  # the engine's collated batch (anything with ``to(device)``); None from the loader

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return self.lengths, self.targets, self.user_ids

    def to(self, device: torch.device, non_blocking: bool = False) -> KJTBatch:
        move = {"device": device, "non_blocking": non_blocking}
        dense = self.dense.to(device) if self.dense is not None else None
        return KJTBatch(self.step, self.features.to(**move), *(t.to(**move) for t in self._tensors()), dense)

    def record_stream(self, stream: Any) -> None:
        self.features.record_stream(stream)
        for tensor in self._tensors():
            tensor.record_stream(stream)

    def pin_memory(self) -> KJTBatch:
        return KJTBatch(self.step, self.features.pin_memory(), *(t.pin_memory() for t in self._tensors()), self.dense)


def register_pipelineable() -> None:
    """Declare ``KJTBatch`` a TorchRec ``Pipelineable`` (an ABC): TorchRec is imported only here, so
    the ``samples``/``batch`` outputs and the FreeScale trainer never need it."""
    _torchrec_kjt()
    from torchrec.streamable import Pipelineable

    Pipelineable.register(KJTBatch)


def kjt_batch(samples: list[dict[str, Any]], cfg: CollateConfig, step: int, rank: int = 0) -> KJTBatch:
    """Prepared samples -> ``KJTBatch`` of ``LOADER_KEYS`` (ids through ``sequence_arrays``, as the
    trainer collates); the loader's default ``collate_fn`` for ``output = "kjt"`` (``rank`` unused:
    nothing here is random)."""
    seq = sequence_arrays(samples, cfg, cfg.holdout_last)
    inputs = seq.input_rows()
    lengths = seq.lengths - 1
    profiles = profile_rows(cfg.profiles, samples, seq.kept)  # [tables, B]: one id per sample each
    values = np.concatenate([seq.items[inputs], seq.actions[inputs], seq.times[inputs], profiles.reshape(-1)])
    targets = seq.items[inputs + 1]
    keys = [*LOADER_KEYS, *(read.table for read in cfg.profiles)]
    row_lengths = [np.tile(lengths, len(LOADER_KEYS)), np.ones(profiles.size, np.int64)]
    features = keyed_jagged(keys, torch.from_numpy(values), torch.from_numpy(np.concatenate(row_lengths)))
    users = torch.tensor([int(samples[i]["user_id"]) for i in seq.kept], dtype=torch.int64)
    return KJTBatch(step, features, torch.from_numpy(lengths), torch.from_numpy(targets), users)
