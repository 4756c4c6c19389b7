"""The declared layering of the source tree, checked by static analysis of every module's imports.

Packages: ``freescale`` (core helpers) < ``kernels``, ``datasets`` < ``pipeline`` < ``trainer`` < ``tools``:
a module imports only its own package and packages below it. Inside ``trainer/`` each folder is a layer
and ``TRAINER_LAYERS`` says which layers it may import; training code (engines, eval, metrics, the runner)
never imports ``simulate/`` (the simulator and calibration may use the engines' placement and the model);
the runner may, to decide ``engine.overlap``/``engine.balancer = "auto"`` by the simulator's prediction.
Every import counts, function-level ones too: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"freescale": 0, "kernels": 1, "datasets": 1, "pipeline": 2, "trainer": 3, "tools": 4}

# trainer/ layer of a module: its folder, or for modules at the top of trainer/ "base" or "top".
TRAINER_BASE = {"config", "config_checks", "config_toml", "engine_config", "learning_config", "loop_config",
                "table_config", "user_tables", "errors", "checkpoint", "checkpoint_dirs", "checkpoint_record",
                "run_dir", "rendezvous", "lifetime", "cpus", "peers"}  # fmt: skip
TRAINER_LAYERS = {
    "base": {"base"},
    "data": {"base", "data"},
    "model": {"base", "data", "model"},
    "metrics": {"base", "metrics"},
    "engines": {"base", "data", "model", "metrics", "engines"},
    "eval": {"base", "data", "model", "eval"},
    "simulate": {"base", "data", "model", "engines", "simulate"},
    "top": {"base", "data", "model", "metrics", "engines", "eval", "simulate", "top"},
}


def source_modules() -> list[Path]:
    """Every module of the installed packages."""
    return sorted(p for top in PACKAGES for p in (REPO / top).rglob("*.py"))


def dotted(path: Path) -> str:
    """``trainer/engines/pec.py`` -> ``freescale.trainer.engines.pec`` (a package is its ``__init__``)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts) if parts[0] == "freescale" else ".".join(["freescale", *parts])


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, relative ones resolved; names imported from a
    package count as submodules when such a module exists."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = dotted(path) if path.name == "__init__.py" else dotted(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names if module_exists(f"{base}.{a.name}")]
    return [(line, name) for line, name in found if name.startswith("freescale")]


def module_exists(name: str) -> bool:
    """Whether ``freescale.x.y`` is a module or package of this checkout."""
    parts = name.split(".")[1:]
    if not parts:
        return True
    folder = REPO / "freescale" if parts[0] not in PACKAGES else REPO
    path = folder.joinpath(*parts)
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def package_of(name: str) -> str:
    """Top-level package of a dotted module name (``freescale.endpoints`` is the core ``freescale``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "freescale"


def trainer_layer(name: str) -> str | None:
    """Layer of a ``freescale.trainer...`` module, None for the package itself."""
    parts = name.split(".")[2:]
    if not parts:
        return None
    if module_exists(f"freescale.trainer.{parts[0]}") and (REPO / "trainer" / parts[0]).is_dir():
        return parts[0]
    return "base" if parts[0] in TRAINER_BASE else "top"


def judge(me: str, target: str) -> str | None:
    """Why ``me`` may not import ``target``, or None when the layering allows it."""
    mine, theirs = package_of(me), package_of(target)
    if mine != theirs and PACKAGES[theirs] >= PACKAGES[mine]:
        return f"{mine} may not import {theirs}"
    if mine == theirs == "trainer":
        a, b = trainer_layer(me), trainer_layer(target)
        if a is not None and b is not None and b not in TRAINER_LAYERS.get(a, set()):
            return f"trainer/{a} may not import trainer/{b}"
    return None


def violations() -> list[str]:
    """Every import against the declared layering, as ``file:line: module imports target (why)``."""
    found = []
    for path in source_modules():
        me, rel = dotted(path), path.relative_to(REPO).as_posix()
        for line, target in imports(path):
            why = judge(me, target)
            if why:
                found.append(f"{rel}:{line}: {me} imports {target} ({why})")
    return found


def test_every_trainer_folder_has_a_declared_layer() -> None:
    folders = {p.name for p in (REPO / "trainer").iterdir() if (p / "__init__.py").exists()}
    assert folders <= set(TRAINER_LAYERS), f"declare the layer of {sorted(folders - set(TRAINER_LAYERS))}"


def test_no_module_imports_a_layer_above_it() -> None:
    found = violations()
    assert not found, "imports against the layering:\n" + "\n".join(found)


def test_the_rules_catch_upward_imports() -> None:
    """The judge itself, on imports that do not exist."""
    assert (
        judge("freescale.trainer.engines.pec", "freescale.trainer.runner")
        == "trainer/engines may not import trainer/top"
    )
    assert judge("freescale.trainer.engines.pec", "freescale.trainer.simulate.simulator") == (
        "trainer/engines may not import trainer/simulate"
    )
    assert judge("freescale.trainer.eval.evaluate", "freescale.trainer.simulate.auto") == (
        "trainer/eval may not import trainer/simulate"
    )
    assert judge("freescale.trainer.runner", "freescale.trainer.simulate.auto") is None  # engine "auto" choices
    assert judge("freescale.pipeline.prepare", "freescale.trainer.config") == "pipeline may not import trainer"
    assert judge("freescale.kernels.dispatch", "freescale.datasets.ids") == "kernels may not import datasets"
    assert judge("freescale.trainer.simulate.simulator", "freescale.trainer.engines.balancer") is None
    assert judge("freescale.tools.cli", "freescale.trainer.launch") is None
