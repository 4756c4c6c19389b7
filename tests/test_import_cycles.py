"""No import cycles among FreeScale's modules, deferred (function-level) imports included.

The graph is built statically with ``ast`` from every ``.py`` file of every ``freescale`` package
(``pyproject.toml``'s package-dir mapping), so an import hidden inside a function to dodge a loop at
import time still counts as an edge. Only imports between FreeScale modules are edges: optional
third-party packages (torch, torchrec, ray, triton, ...) are not nodes, so importing them lazily is
fine. Imports under ``if TYPE_CHECKING:`` count too: a type-only back-edge is still a layering loop.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[str, Path]:
    """``freescale`` package name → its folder, from pyproject.toml's ``package-dir`` table."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {name: ROOT / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def module_files() -> dict[str, Path]:
    """Every importable ``freescale`` module (``pkg.__init__`` named ``pkg``) → its file."""
    modules: dict[str, Path] = {}
    for package, folder in package_dirs().items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if any(not part.isidentifier() for part in parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """All import statements at any depth: module level, in functions, under ``if TYPE_CHECKING:``."""
    return (node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The FreeScale modules ``module`` imports (``from pkg import sub`` counts ``pkg.sub`` if a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    targets: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        source = _absolute(node, module, path.name == "__init__.py")
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            targets.add(submodule if submodule in known else source)
    return {target for target in targets if target in known and target != module}


def import_graph() -> dict[str, set[str]]:
    """Module → the FreeScale modules it imports, top-level and deferred imports alike."""
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path: list[str] = [start]
        stack: list[Iterator[str]] = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_graph_covers_the_packages() -> None:
    graph = import_graph()
    for name in ("freescale", "freescale.pipeline.prepare", "freescale.trainer.engines.engine", "freescale.tools.cli"):
        assert name in graph
    assert "freescale.pipeline.config" in graph["freescale.pipeline.prepare"]


def test_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
