"""Optional packages: TorchRec and fbgemm are needed only by what talks to TorchRec.

The FreeScale engine, the loader's ``batch``/``samples`` outputs, the model and the kernels never
import ``torchrec`` or ``fbgemm_gpu`` (``tests/freescale/test_optional_deps.py`` trains in an interpreter where
both imports fail). Two features do need them: ``engine.name = "torchrec"`` (the baseline) and the
loader's ``output = "kjt"``. Where they are missing (a GPU host with no TorchRec CUDA build), asking
for either fails up front with one line naming the missing module and what to install, instead of a
``ModuleNotFoundError`` traceback from inside a rank after torchrun started it.

Presence is checked with ``importlib.util.find_spec`` (no import: TorchRec takes seconds to import,
and the launcher only validates).
"""

from __future__ import annotations

import importlib.util

TORCHREC_MODULES = ("torchrec", "fbgemm_gpu")
TORCHREC_INSTALL = (
    "install torchrec==1.9.2 with --no-deps plus fbgemm-gpu==1.9.0 (CUDA hosts) or fbgemm-gpu-cpu==1.9.0 "
    "(CPU hosts), as scripts/setup.sh does"
)


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """The ``modules`` that cannot be imported here (not installed, or refused by an import hook)."""
    absent = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            absent.append(name)
    return absent


def torchrec_unavailable(feature: str) -> str | None:
    """One line saying why ``feature`` cannot run here (TorchRec or fbgemm missing), or None."""
    absent = missing_modules(TORCHREC_MODULES)
    if not absent:
        return None
    names = " and ".join(f"'{name}'" for name in absent)
    return f"{feature} needs TorchRec, but {names} cannot be imported here: {TORCHREC_INSTALL}"
