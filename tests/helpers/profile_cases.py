"""User-profile tables for the engine comparisons (``pec_check``, ``online_check``): a hashed profile
feature and a zero-collision table of user ids drawn from a pool larger than its slots (inserts,
evictions and fallback rows every few steps)."""

from __future__ import annotations

from typing import Any

import numpy as np

from freescale.pipeline.dataset.profiles import ProfileRead
from freescale.trainer.table_config import UserTableConfig

USERS = 48  # distinct user ids the samples draw from: more than the zch table's 32 slots

USER_TABLES = {
    "segment": UserTableConfig(feature="segment", ids="hashed", rows=8),
    "user_id": UserTableConfig(feature="user_id", ids="zch", zch_size=32, zch_bucket_size=8, zch_max_probe=4),
}
PROFILE_READS = (ProfileRead("user.segment", 0, 8), ProfileRead("user.user_id", None, 32, raw=True))


def profile_fields(rng: np.random.Generator) -> dict[str, Any]:
    """A sample's ``user_id`` (raw, 63-bit-like) and its one ``user_features`` value."""
    user = int(rng.integers(0, USERS))
    return {"user_id": user * 0x9E3779B97F4A7C15 % 2**62, "user_features": np.array([user % 11], np.int32)}
