"""mosaicml-streaming's ``StreamingDataset`` without the package's ``__init__``.

``import streaming`` runs ``streaming/__init__.py``, which also imports the text and vision dataset
modules and through them transformers and torchvision: 7.8 s of CPU and ~900 MB resident here, of
which the dataset needs none (it needs torch, ~2 s). Every trainer rank paid that import once per
start (``prepare`` no longer imports streaming: ``steps.mds_shards`` writes the shards).

The class is the genuine one, loaded from the installed package's own files: while the module is
imported, ``streaming`` and ``streaming.base`` are stand-in packages whose ``__path__`` points at the
real folders, so Python finds every submodule where ``import streaming`` would but does not run the
two ``__init__`` files. The stand-ins are removed right after, so a later ``import streaming`` runs
the real ``__init__`` files, which pick up the already-loaded submodules
(``streaming.StreamingDataset is streaming_dataset_class()`` holds; ``tests/pipeline/steps/test_writer.py`` checks
it). If the package's layout ever changes so that this fails, the plain ``import streaming`` is used
instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

STAND_IN_PACKAGES = ("streaming", "streaming.base")  # the __init__ files that import the heavy modules


def import_streaming_module(name: str) -> types.ModuleType:
    """``importlib.import_module(name)`` for a ``streaming.base…`` module, skipping the package inits."""
    if "streaming" in sys.modules:  # already imported (either way): nothing left to save
        return importlib.import_module(name)
    spec = importlib.util.find_spec("streaming")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("mosaicml-streaming is not installed (pip install mosaicml-streaming)")
    root = next(iter(spec.submodule_search_locations))
    stand_ins = {}
    for package in STAND_IN_PACKAGES:
        module = types.ModuleType(package)
        module.__path__ = [root + package.removeprefix("streaming").replace(".", "/")]
        module.__package__ = package
        stand_ins[package] = sys.modules[package] = module
    loaded_before = set(sys.modules)
    try:
        return importlib.import_module(name)
    except (ImportError, AttributeError):  # a streaming release laid out differently: plain import below
        for partial in [m for m in sys.modules if m.startswith("streaming.") and m not in loaded_before]:
            del sys.modules[partial]
    finally:
        for package, module in stand_ins.items():
            if sys.modules.get(package) is module:
                del sys.modules[package]
    importlib.import_module("streaming")  # pragma: no cover
    return importlib.import_module(name)  # pragma: no cover


def streaming_dataset_class() -> Any:
    """``streaming.StreamingDataset``."""
    return import_streaming_module("streaming.base.dataset").StreamingDataset
