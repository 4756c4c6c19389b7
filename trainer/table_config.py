"""How each embedding table maps raw ids to rows: the id modes, the zero-collision options, and the
user-profile tables (``[user_tables.<feature>]``, docs/training.md#user-profile-tables).

The item table's options live in ``[model_extra]`` (``ids``, ``num_items``, ``zch_*``); every user-profile
table has the same ones in its own TOML table, named after the dataset's profile feature it reads
(``prepare``'s users table: ``[user_tables.country_id]``) or ``user_id`` (the sample's user id itself)::

    [user_tables.country_id]      # exact: a row per value of the dataset's vocabulary
    [user_tables.user_id]
    ids = "zch"                   # users that appear while streaming get their own row
    zch_size = 65536

The zero-collision checks are one function for both (``check_zch_options``), so the item table and a
user table refuse the same mistakes with the same words, each naming its own option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from freescale.trainer.config_checks import check, choice

ID_MODES = ("exact", "hashed", "zch")
ZCH_POLICIES = ("ttl", "lru", "lfu")  # kernels.zch_types.POLICIES, without importing torch here
USER_ID_FEATURE = "user_id"  # the table of the sample's own user id (no vocabulary: hashed or zch)
ZCH_DEFAULTS = {
    "zch_size": 0,
    "zch_bucket_size": 64,
    "zch_max_probe": 0,  # the whole bucket
    "zch_policy": "lru",
    "zch_ttl": 0,
    "zch_admission_threshold": 1,
    "zch_lfu_halflife": 0,
}


class ZchOptions(Protocol):
    """A table's zero-collision options (``ModelExtraConfig`` for items, ``UserTableConfig``)."""

    ids: str
    zch_size: int
    zch_bucket_size: int
    zch_max_probe: int
    zch_policy: str
    zch_ttl: int
    zch_admission_threshold: int
    zch_lfu_halflife: int


def check_zch_options(where: str, options: ZchOptions) -> None:
    """The identity table's shape and policy (``kernels.zch_types.ZchConfig`` says the same, per rank);
    ``where``: the TOML table the options are in (``model_extra``, ``user_tables.user_id``)."""
    if options.ids != "zch":
        for name, default in ZCH_DEFAULTS.items():
            value = getattr(options, name)
            check(value == default, f"{where}.{name}", f"applies to {where}.ids 'zch' only", value)
        return
    size, bucket, probe = options.zch_size, options.zch_bucket_size, options.zch_max_probe
    check(size >= 1, f"{where}.zch_size", f"must be set (>= 1) with {where}.ids 'zch'", size)
    check(bucket >= 1, f"{where}.zch_bucket_size", "must be >= 1", bucket)
    check(size % bucket == 0, f"{where}.zch_size", f"must be a multiple of zch_bucket_size {bucket}", size)
    check(0 <= probe <= bucket, f"{where}.zch_max_probe", f"must be in [0, zch_bucket_size {bucket}] (0: all)", probe)
    choice(f"{where}.zch_policy", options.zch_policy, ZCH_POLICIES)
    ttl = options.zch_ttl
    if options.zch_policy == "ttl":
        check(ttl > 0, f"{where}.zch_ttl", "must be > 0 seconds of event time with zch_policy 'ttl'", ttl)
    else:
        check(ttl == 0, f"{where}.zch_ttl", "applies to zch_policy 'ttl' only", ttl)
    for name, off in (("zch_admission_threshold", 1), ("zch_lfu_halflife", 0)):  # lfu's options, and their off value
        value = getattr(options, name)
        check(value >= off, f"{where}.{name}", f"must be >= {off} ({off}: off)", value)
        check(value == off or options.zch_policy == "lfu", f"{where}.{name}",
              f"applies to zch_policy 'lfu' only (leave it at {off})", value)  # fmt: skip


def check_zch_world(where: str, options: ZchOptions, world_size: int) -> None:
    """A zch table: every rank holds whole buckets (the launcher checks before any rank starts)."""
    if options.ids != "zch":
        return
    buckets = options.zch_size // options.zch_bucket_size
    if buckets % world_size:
        raise ValueError(
            f"{where}.zch_size {options.zch_size} gives {buckets} buckets of {options.zch_bucket_size} "
            f"rows, not a multiple of the {world_size} ranks (each rank holds whole buckets)"
        )


@dataclass(frozen=True)
class UserTableConfig:
    """One user-profile table (``[user_tables.<feature>]``): the model adds the rows of the sample's
    user's features to every input position. ``feature``: the profile feature (the TOML table's name)."""

    feature: str
    ids: str = "exact"  # exact: the dataset's vocabulary of the feature | hashed: raw value modulo rows | zch
    rows: int = 0  # exact: 0 = the vocabulary size (or >= it) | hashed: the table's rows | zch: 0 (zch_size)
    zch_size: int = 0
    zch_bucket_size: int = 64
    zch_max_probe: int = 0  # 0: the whole bucket
    zch_policy: str = "lru"
    zch_ttl: int = 0
    zch_admission_threshold: int = 1
    zch_lfu_halflife: int = 0

    def __post_init__(self) -> None:
        where = self.where
        check(bool(self.feature.strip()), "user_tables", "needs a feature name per table", self.feature)
        choice(f"{where}.ids", self.ids, ID_MODES)
        check(self.rows >= 0, f"{where}.rows", "must be >= 0", self.rows)
        if self.ids == "hashed":
            check(self.rows >= 1, f"{where}.rows", f"must be set (>= 1) with {where}.ids 'hashed'", self.rows)
        if self.ids == "zch":
            check(self.rows == 0, f"{where}.rows", "must be 0 with ids 'zch' (zch_size sizes the table)", self.rows)
        if self.feature == USER_ID_FEATURE:
            check(self.ids != "exact", f"{where}.ids", "must be 'hashed' or 'zch': user ids have no vocabulary (new "
                  "users appear in every window)", self.ids)  # fmt: skip
        check_zch_options(where, self)

    @property
    def where(self) -> str:
        return f"user_tables.{self.feature}"

    @property
    def id_rows(self) -> int:
        """Rows that stand for ids (a resolved table's ``rows``; zch: its ``zch_size`` slots)."""
        return self.zch_size if self.ids == "zch" else self.rows

    @property
    def table(self) -> str:
        """The embedding table's (and its feature key's) name: ``user.<feature>``."""
        return f"user.{self.feature}"
