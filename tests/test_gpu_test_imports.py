"""The GPU tests' imports resolve on CPU.

A test marked ``gpu`` is skipped on a machine without CUDA, so a name it imports inside its body (a
test helper moved to ``tests/helpers/``, a kernel function renamed) breaks unseen until the few
minutes a GPU is lent: ``test_copy_engine_matches_gloo`` failed on the H200 (2026-11-28) on a helper
that had moved months before. This test reads every import statement of every file holding a ``gpu``
mark, at any depth, and requires each module to import and each imported name to exist.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEARCH = (REPO / "tests" / "helpers", REPO / "benchmarks")  # where the GPU tests' own helpers live


def gpu_test_files() -> list[Path]:
    here = Path(__file__).resolve()
    return sorted(p for p in (REPO / "tests").rglob("test_*.py") if p != here and "pytest.mark.gpu" in p.read_text())


def imports_of(path: Path) -> list[tuple[str, str | None, int]]:
    """``(module, name or None, line)`` of every absolute import in the file."""
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module, alias.name, node.lineno) for alias in node.names if alias.name != "*"]
    return found


def test_there_are_gpu_test_files() -> None:
    assert len(gpu_test_files()) >= 4, gpu_test_files()


@pytest.mark.parametrize("path", gpu_test_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_import_of_a_gpu_test_resolves(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for folder in SEARCH:
        monkeypatch.syspath_prepend(str(folder))
    broken = []
    for module, name, line in imports_of(path):
        if module == "__future__":
            continue
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            broken.append(f"{path.name}:{line}: import {module}: {error}")
            continue
        if name is not None and not hasattr(loaded, name):
            try:  # a submodule imported by name (from package import submodule)
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                broken.append(f"{path.name}:{line}: {module} has no {name}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("path", gpu_test_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_gpu_test_loads_a_module_by_file_path(path: Path) -> None:
    """A module loaded from a path (``importlib.util.spec_from_file_location``) escapes the check above:
    its names are looked up only when the test body runs, on a GPU."""
    assert "spec_from_file_location" not in path.read_text(), f"{path.name}: import the helper by name"
