"""What the generated logs say, shared by the simulation that draws events and the writers that spell
them: the action ids, each log's kinds (indices into these tuples) with the odds they are drawn with,
and how text logs spell user ``k``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

ACTIONS = {"view": 0, "click": 1, "like": 2, "add_to_cart": 3, "purchase": 4, "review": 5}
CLICK_KINDS = ("view", "click", "like")
CLICK_P = (0.7, 0.25, 0.05)
PURCHASE_KINDS = ("add_to_cart", "purchase")
PURCHASE_P = (0.6, 0.4)


def user_names(indices: np.ndarray | pl.Series, n_users: int) -> pl.Series:
    """``u`` + zero-padded index: the spelling text logs use for user ``k``."""
    width = max(6, len(str(max(n_users - 1, 0))))
    series = indices if isinstance(indices, pl.Series) else pl.Series(np.asarray(indices, dtype=np.int64))
    return "u" + series.cast(pl.String).str.zfill(width)
