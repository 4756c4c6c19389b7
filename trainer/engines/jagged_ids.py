"""Keyed jagged ids, the features a table lookup reads: ``JaggedIds`` or, unchanged, TorchRec's
``KeyedJaggedTensor`` (the interop boundary; TorchRec itself is never imported here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class JaggedIds:
    """Keyed jagged ids (the subset of ``KeyedJaggedTensor`` this module needs).

    ``value_tensor`` holds every key's ids back to back and ``length_list`` counts them per *key*,
    not per sample: a table lookup needs no sample structure, and a TorchRec ``KeyedJaggedTensor``
    can stand in for it unchanged. Per-sample jagged data has its own containers:
    ``jagged.JaggedLayout`` (the attention layout, no values) and ``kernels.dispatch.JaggedRows``
    (per-sample rows moved between ranks).
    """

    key_list: list[str]
    value_tensor: torch.Tensor
    length_list: list[int]  # ids per key

    def keys(self) -> list[str]:
        return self.key_list

    def values(self) -> torch.Tensor:
        return self.value_tensor

    def length_per_key(self) -> list[int]:
        return self.length_list


def split_features(features: Any) -> dict[str, torch.Tensor]:
    """Per-key id tensors of a ``JaggedIds`` or a TorchRec ``KeyedJaggedTensor``."""
    chunks = torch.split(features.values(), list(features.length_per_key()))
    return dict(zip(features.keys(), chunks))
