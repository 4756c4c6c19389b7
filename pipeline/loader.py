"""Deprecated import path of the public loader: use ``freescale.pipeline.dataset`` (``Config``, ``Loader``).

Kept for one release because the README documented ``from freescale.pipeline.loader import Config,
Loader``; it re-exports the loader's public names and warns once on import.
"""

from __future__ import annotations

import warnings

from freescale.pipeline.dataset.kjt import KJTBatch
from freescale.pipeline.dataset.loader import Config, Loader, Samples, total_steps

__all__ = ["Config", "KJTBatch", "Loader", "Samples", "total_steps"]

warnings.warn(
    "freescale.pipeline.loader is deprecated: import Config and Loader from freescale.pipeline.dataset",
    DeprecationWarning,
    stacklevel=2,
)
