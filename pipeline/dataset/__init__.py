"""A prepared dataset, as its readers see it: the typed manifest, the reader, the balanced loader.

``freescale prepare`` writes a dataset; everything that reads one (the loader, the trainer,
evaluation, ``stats``, ``simulate``, a bring-your-own model) goes through this package:

- ``manifest``: ``manifest.json`` parsed once into a typed ``Manifest`` (``Layout``, ``SampleSpec``, ...);
- ``reader``: ``PreparedDataset`` (checked files, the step schedule) and ``RankReader``;
- ``loader``: the balanced streaming ``Loader`` (``Config``) for any model;
- ``samples``: what a sample means (ids -> rows, held-out items, window stride); ``kjt``: TorchRec's view;
- ``vocabulary``, ``targets``, ``mds_rows``, ``shard_files``: the pieces underneath.

The names below are resolved on first use, so that ``prepare`` (which writes the manifest through
``manifest``) never pays for the loader's torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from freescale.pipeline.dataset.loader import Config, Loader, total_steps
    from freescale.pipeline.dataset.manifest import Layout, Manifest, ManifestError, SampleSpec, load_manifest
    from freescale.pipeline.dataset.reader import PreparedDataset, RankReader

_EXPORTS = {
    "Config": "loader",
    "Loader": "loader",
    "total_steps": "loader",
    "Layout": "manifest",
    "Manifest": "manifest",
    "ManifestError": "manifest",
    "SampleSpec": "manifest",
    "load_manifest": "manifest",
    "PreparedDataset": "reader",
    "RankReader": "reader",
}
__all__ = [
    "Config",
    "Layout",
    "Loader",
    "Manifest",
    "ManifestError",
    "PreparedDataset",
    "RankReader",
    "SampleSpec",
    "load_manifest",
    "total_steps",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
