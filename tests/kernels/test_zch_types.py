"""A zero-collision table's configuration (``kernels/zch_types.py``): a bad value is one line naming the
option, before any table is built."""

from __future__ import annotations

import pytest

from freescale.kernels.zch_types import ZchConfig


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"zch_size": 100, "bucket_size": 64}, "zch.zch_size"),
        ({"zch_size": 0}, "zch.zch_size"),
        ({"zch_size": 192, "bucket_size": 64, "world_size": 2}, "zch.zch_size"),
        ({"zch_size": 128, "bucket_size": 64, "max_probe": 0}, "zch.max_probe"),
        ({"zch_size": 128, "bucket_size": 64, "max_probe": 65}, "zch.max_probe"),
        ({"zch_size": 128, "policy": "fifo"}, "zch.policy"),
        ({"zch_size": 128, "policy": "ttl"}, "zch.ttl"),
        ({"zch_size": 128, "policy": "ttl", "ttl": 0}, "zch.ttl"),
        ({"zch_size": 128, "policy": "lru", "ttl": 60}, "zch.ttl"),
        ({"zch_size": 128, "policy": "lfu", "admission_threshold": 0}, "zch.admission_threshold"),
        ({"zch_size": 128, "policy": "lru", "admission_threshold": 2}, "zch.admission_threshold"),
        ({"zch_size": 128, "admission_slots": -1}, "zch.admission_slots"),
        ({"zch_size": 128, "policy": "lfu", "lfu_halflife": -1}, "zch.lfu_halflife"),
        ({"zch_size": 128, "policy": "lru", "lfu_halflife": 100}, "zch.lfu_halflife"),
    ],
)
def test_bad_configuration_names_the_option(kwargs: dict, option: str) -> None:
    with pytest.raises(ValueError, match=f"^{option}: ") as error:
        ZchConfig(**kwargs)
    assert "\n" not in str(error.value)
