"""Import layering: what each layer of the package may import.

``pipeline`` (prepare and the prepared dataset's readers, the public loader among them) sits below
``trainer``: a loader "for any model" must be usable without the trainer. Checked by importing every
module under ``freescale.pipeline`` in a fresh interpreter and listing the ``freescale.trainer``
modules that came with them.
"""

from __future__ import annotations

import ast
import subprocess
import sys

IMPORT_ALL = r"""
import importlib, pkgutil, sys, warnings
import freescale.pipeline as root
warnings.simplefilter("ignore", DeprecationWarning)  # pipeline.loader: the deprecated loader path
for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
    importlib.import_module(info.name)
print(sorted(name for name in sys.modules if name.startswith("freescale.")))
"""


def test_no_pipeline_module_imports_the_trainer() -> None:
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    imported = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert "freescale.pipeline.dataset.loader" in imported  # every module was reached
    assert [name for name in imported if name.startswith("freescale.trainer")] == []
