"""Small generated samples and a collate config for the trainer's unit tests (and ``sequence_arrays``'s)."""

from __future__ import annotations

import numpy as np

from freescale.pipeline.dataset.samples import CollateConfig


def make_samples(lengths: list[int], seed: int = 0, n_items: int = 50) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "item_ids": rng.integers(0, n_items, n),
            "actions": rng.integers(0, 3, n),
            "timestamps": np.cumsum(rng.integers(1, 10_000, n)),
            "cost": float(n * n),
            "user_id": u,
            "window": 0,
            "length": n,
        }
        for u, n in enumerate(lengths)
    ]


def collate_cfg(**overrides) -> CollateConfig:
    options = {"num_items": 50, "num_actions": 4, "max_len": 64, "num_negatives": 8, "inbatch_negatives": 4}
    return CollateConfig(**(options | overrides))
