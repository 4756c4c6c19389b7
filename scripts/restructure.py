"""Replayable restructuring of the source tree (issue 32, items 2 and 4): ``git mv`` + reference rewrites.

Run from anywhere; it works on the checkout it lives in (or ``--root``)::

    python scripts/restructure.py            # apply, then print what it did and what it could not place
    python scripts/restructure.py --dry-run  # print the plan, change nothing
    python scripts/restructure.py --check    # exit 1 when applying would change anything (idempotency check)

What it does, in order, re-scanning the tree every time it runs (so it can be replayed on a newer main):

1. ``SOURCE_MOVES`` (old path -> new path, files or folders): ``git mv`` each whose source exists and whose
   target does not. A source that is absent is reported (``absent``: already moved, deleted or renamed by
   another branch), never an error.
2. Tests: ``HELPER_MOVES`` put non-test helpers into ``tests/helpers/`` (they stay importable by their bare
   module name: ``pythonpath`` in pyproject.toml names ``tests/helpers``); every ``tests/test_*.py`` at the
   top of ``tests/`` goes to the folder that mirrors its module (``TEST_PLACES`` first, then the rule
   "``test_<module>[_<anything>].py`` goes to ``tests/<folder of module>/``"; ``TEST_RENAMES`` then drops a
   name's repetition of its folder). Files the rule cannot place stay where they are and are listed.
3. Rewrites, in every tracked or unignored text file (``benchmarks/results/`` is a record and is left alone):
   dotted module names (``freescale.trainer.engine`` in imports, ``-m`` runs, ``"module:func"`` strings,
   docs), ``from freescale.trainer import engine`` forms, relative imports of moved modules, repository
   paths (``trainer/engine.py``, ``tests/test_pec.py``, ``"trainer" / "profiles"``), and, in moved test
   files, ``Path(__file__)`` expressions that climb to the repository or point at a moved helper.
4. Package ``__init__.py`` files for new source folders, their names in pyproject's ``packages`` list,
   and the ``FIXUPS`` (exact replacements the rules above cannot express).

A name that is both a new package and an old module (``trainer/data.py`` -> ``trainer/data/batches.py``) is
rewritten unless it is followed by one of the package's own module names, so a second run changes nothing.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

# Top-level folders that install as ``freescale.<folder>`` (pyproject.toml [tool.setuptools.package-dir]).
PACKAGE_DIRS = {
    "freescale": "freescale",
    "pipeline": "freescale.pipeline",
    "trainer": "freescale.trainer",
    "kernels": "freescale.kernels",
    "datasets": "freescale.datasets",
    "tools": "freescale.tools",
}

# trainer/ grouped by role (issue 32 item 2). Launcher, runner, config, checkpoint*, run_dir, rendezvous,
# lifetime, errors stay at the top of trainer/.
SOURCE_MOVES: list[tuple[str, str]] = [
    # engines: the engine protocol and every engine, with what only engines use
    ("trainer/engine.py", "trainer/engines/engine.py"),
    ("trainer/torchrec_engine.py", "trainer/engines/torchrec_engine.py"),
    ("trainer/kjt.py", "trainer/engines/kjt.py"),  # imports engine.FEATURES; only the TorchRec engine uses it
    ("trainer/sharded.py", "trainer/engines/sharded.py"),
    ("trainer/sparse_optim.py", "trainer/engines/sparse_optim.py"),
    ("trainer/comm.py", "trainer/engines/comm.py"),
    ("trainer/pec.py", "trainer/engines/pec.py"),
    ("trainer/overlap.py", "trainer/engines/overlap.py"),
    ("trainer/online.py", "trainer/engines/online.py"),
    ("trainer/balancer.py", "trainer/engines/balancer.py"),
    # model: the dense model and its loss
    ("trainer/model.py", "trainer/model/transducer.py"),
    # data: prepared micro-batches -> model-ready jagged batches
    ("trainer/data.py", "trainer/data/batches.py"),
    ("trainer/jagged.py", "trainer/data/jagged.py"),
    # eval: the evaluation protocol (id tables, splits, best tracking) and HR/NDCG
    ("trainer/protocol.py", "trainer/eval/protocol.py"),
    ("trainer/evaluate.py", "trainer/eval/evaluate.py"),
    # metrics: step timings, bubble analysis, traces
    ("trainer/instrument.py", "trainer/metrics/instrument.py"),
    ("trainer/bubbles.py", "trainer/metrics/bubbles.py"),
    ("trainer/trace.py", "trainer/metrics/trace.py"),
    # simulate: never runs during training
    ("trainer/simulate.py", "trainer/simulate/simulator.py"),
    ("trainer/sim_config.py", "trainer/simulate/sim_config.py"),
    ("trainer/sim_inputs.py", "trainer/simulate/sim_inputs.py"),
    ("trainer/sim_report.py", "trainer/simulate/sim_report.py"),
    ("trainer/calibrate.py", "trainer/simulate/calibrate.py"),
    ("trainer/profiles", "trainer/simulate/profiles"),
    # the demo drives prepare + train: a tool
    ("trainer/demo.py", "tools/demo.py"),
]

# One-line roles of new source packages (their ``__init__.py`` docstrings).
PACKAGE_ROLES = {
    "trainer/engines": "Training engines: the engine protocol, the FreeScale and TorchRec engines, sharded tables, "
    "communication, PEC overlap and online balancing.",
    "trainer/model": "The dense model (HSTU / SASRec sequential transducer) and its loss.",
    "trainer/data": "From prepared micro-batches to model-ready jagged batches.",
    "trainer/eval": "The evaluation protocol (id tables, splits, best-validation tracking) and HR@k / NDCG@k.",
    "trainer/metrics": "Step timings, bubble analysis and Chrome traces of a training run.",
    "trainer/simulate": "The bubble simulator, its hardware profiles and the cost-model calibration "
    "(never imported by training).",
}
DATA_ONLY_PACKAGES = {"trainer/simulate/profiles"}  # no .py: listed in pyproject so setuptools ships it

# Non-test modules and folders under tests/ (imported by bare name or started as scripts).
HELPERS = [
    "reference.py",
    "pec_check.py",
    "killed_prepare.py",
    "mounts.py",
    "ray_cluster.py",
    "s3_upload.py",
    "train_cli.py",
    "collate_reference.py",
    "hstu_attention_cases.py",
    "online_check.py",
    "prepare_configs.py",
    "exit_check",
    "no_torchrec",
]
HELPER_DIR = "tests/helpers"

# Test files that test the repository as a whole: they stay at the top of tests/.
ROOT_TESTS = {
    "test_layout.py",
    "test_layering.py",
    "test_import_cycles.py",
    "test_docs.py",
    "test_packaging.py",
    "test_examples.py",
}

# Test files whose name does not start with a module's name (the rule below places the rest).
TEST_PLACES = {
    "test_cuda_paths.py": "tests/trainer",  # the trainer's CUDA-only decisions (runner, engine, pec)
    "test_multinode.py": "tests/trainer",  # freescale train --nnodes 2 (launcher)
    "test_rank_exit.py": "tests/trainer",  # rank processes end cleanly (launcher, lifetime)
    "test_reprepare_under_reader.py": "tests/pipeline",  # prepare --overwrite under an open reader
    "test_sim_contention.py": "tests/trainer/simulate",  # the simulator's overlap slowdown
    "test_triton_compile.py": "tests/kernels",  # every Triton kernel compiles for sm_90
    "test_loader.py": "tests/pipeline/dataset",  # the public loader (pipeline/dataset/loader.py)
    "test_manifest_shape.py": "tests/pipeline/dataset",  # the typed manifest parse of bad shapes
}
# ``test_<prefix>_...`` names a folder rather than a module.
TEST_PREFIXES = {"bench": "tests/benchmarks"}

# Mirrored test files whose name repeated their folder (``tests/kernels/test_kernels_dispatch.py``): renamed
# after the module alone, both when a top-level test is placed and when the old mirrored name is found.
TEST_RENAMES = {
    "tests/datasets/test_datasets_fastpaths.py": "tests/datasets/test_fastpaths.py",
    "tests/datasets/test_datasets_sampling.py": "tests/datasets/test_sampling.py",
    "tests/datasets/test_datasets_sessions.py": "tests/datasets/test_sessions.py",
    "tests/datasets/test_datasets_sources.py": "tests/datasets/test_sources.py",
    "tests/datasets/test_datasets_synthetic.py": "tests/datasets/test_synthetic.py",
    "tests/kernels/test_kernels_autograd.py": "tests/kernels/test_autograd.py",
    "tests/kernels/test_kernels_dispatch.py": "tests/kernels/test_dispatch.py",
    "tests/kernels/test_kernels_dispatch_gpu.py": "tests/kernels/test_dispatch_gpu.py",
    "tests/kernels/test_kernels_hstu_attention.py": "tests/kernels/test_hstu_attention.py",
    "tests/kernels/test_kernels_hstu_attention_gpu.py": "tests/kernels/test_hstu_attention_gpu.py",
    "tests/pipeline/balance/test_balance_algos.py": "tests/pipeline/balance/test_algos.py",
    "tests/pipeline/balance/test_balance_windows.py": "tests/pipeline/balance/test_windows.py",
    "tests/pipeline/dataset/test_dataset_manifest.py": "tests/pipeline/dataset/test_manifest.py",
    "tests/pipeline/stats/test_stats_figures.py": "tests/pipeline/stats/test_figures.py",
    "tests/trainer/model/test_model_attention.py": "tests/trainer/model/test_attention.py",
    "tests/trainer/test_trainer_dist.py": "tests/trainer/test_dist.py",
    "tests/trainer/test_trainer_faults.py": "tests/trainer/test_faults.py",
    "tests/trainer/test_trainer_runs.py": "tests/trainer/test_runs.py",
}

# Exact replacements the generic rules cannot express: (file, old, new). Applied when ``old`` is present.
FIXUPS: list[tuple[str, str, str]] = [
    (
        "pyproject.toml",
        'pythonpath = ["tests"]  # shared test helpers (train_cli.py)',
        'pythonpath = ["tests/helpers"]  # shared test helpers (train_cli.py, pec_check.py, ...)',
    ),
    ("tools/gpu_check.py", '(repo / "tests").glob("test_*.py")', '(repo / "tests").rglob("test_*.py")'),
    (
        "benchmarks/bench_prepare.py",
        'sys.path.insert(0, str(REPO / "tests"))',
        'sys.path.insert(0, str(REPO / "tests" / "helpers"))',
    ),
    # a replay on a tree whose source tests still import the renamed module by bare name
    ("tests/datasets/test_fastpaths.py", "from test_datasets_sources import", "from test_sources import"),
    ("tests/datasets/test_sampling.py", "from test_datasets_sources import", "from test_sources import"),
]

SKIP_PREFIXES = ("benchmarks/results/", ".venv/", "scripts/restructure.py")  # records, and this table
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".sh", ".cfg", ".ini", ".yaml", ".yml", ".json", ".rst", ""}


@dataclass
class Move:
    """One planned rename and what the script found for it."""

    old: str
    new: str
    status: str  # "move", "done" (target there, source gone), "absent", "conflict" (both there)
    reason: str = ""


@dataclass
class Report:
    """Everything the run did or could not do, printed at the end."""

    moves: list[Move] = field(default_factory=list)
    unplaced_tests: list[str] = field(default_factory=list)
    rewrites: dict[str, int] = field(default_factory=dict)
    fixups: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- the tree


def repo_files(root: Path) -> list[str]:
    """Tracked and unignored files, relative to ``root``."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({p for p in out.split("\0") if p and (root / p).exists()})


def module_name(path: str) -> str | None:
    """``trainer/engines/engine.py`` -> ``freescale.trainer.engines.engine``; None outside the packages."""
    parts = path.removesuffix(".py").split("/")
    if parts[0] not in PACKAGE_DIRS or (len(parts) == 1 and path.endswith(".py")):
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGE_DIRS[parts[0]], *parts[1:]])


def plan_move(root: Path, old: str, new: str, taken: set[str]) -> Move:
    """The status of one rename in the tree as it is now."""
    old_there, new_there = (root / old).exists(), (root / new).exists() or new in taken
    if old_there and new_there:
        return Move(old, new, "conflict", "both paths exist: merge them by hand")
    if old_there:
        return Move(old, new, "move")
    return Move(old, new, "done" if new_there else "absent", "" if new_there else "source not found")


def expand(moves: list[Move], files: list[str]) -> dict[str, str]:
    """File-level renames of the planned moves (a folder move renames every file under it)."""
    renames: dict[str, str] = {}
    for m in moves:
        if m.status != "move":
            continue
        for f in files:
            if f == m.old:
                renames[f] = m.new
            elif f.startswith(m.old + "/"):
                renames[f] = m.new + f[len(m.old) :]
    return renames


# ---------------------------------------------------------------- tests/ mirror


def module_index(files: list[str]) -> dict[str, list[str]]:
    """Basename of every source module and package -> the folders holding it (after the source moves)."""
    index: dict[str, list[str]] = {}

    def add(name: str, folder: str) -> None:
        if folder not in index.setdefault(name, []):
            index[name].append(folder)

    for f in files:
        if not f.endswith(".py") or f.split("/")[0] not in PACKAGE_DIRS:
            continue
        parts = f.removesuffix(".py").split("/")
        for i in range(1, len(parts) - 1):  # packages: trainer/engines/x.py -> "engines" at trainer/engines
            add(parts[i], "/".join(parts[: i + 1]))
        if parts[-1] != "__init__":
            add(parts[-1], "/".join(parts[:-1]))
    return index


def mirror_folder(source_folder: str) -> str:
    """``trainer/engines`` -> ``tests/trainer/engines``."""
    return f"tests/{source_folder}"


def place_test(name: str, index: dict[str, list[str]]) -> tuple[str | None, str]:
    """The folder a top-level ``tests/test_*.py`` belongs in, and why (or None and why not)."""
    if name in ROOT_TESTS:
        return "tests", "repository-wide test"
    if name in TEST_PLACES:
        return TEST_PLACES[name], "TEST_PLACES"
    words = name.removeprefix("test_").removesuffix(".py").split("_")
    for k in range(len(words), 0, -1):
        stem = "_".join(words[:k])
        if stem in TEST_PREFIXES:
            return TEST_PREFIXES[stem], f"prefix {stem!r}"
        folders = index.get(stem, [])
        if stem in PACKAGE_DIRS and stem != "freescale":
            return mirror_folder(stem), f"package {stem!r}"
        if len(folders) == 1:
            return mirror_folder(folders[0]), f"module {stem!r} in {folders[0]}"
        if len(folders) > 1:
            return None, f"{stem!r} is ambiguous: {', '.join(sorted(folders))}"
    return None, "no module, package or TEST_PLACES entry matches its name"


def plan_tests(root: Path, files: list[str], report: Report, taken: set[str]) -> list[Move]:
    """Helper moves and test-file moves, from the tree as it will be after the source moves."""
    moves = [plan_move(root, f"tests/{h}", f"{HELPER_DIR}/{h}", taken) for h in HELPERS]
    index = module_index(files)
    for f in files:
        if not re.fullmatch(r"tests/test_[^/]*\.py", f):
            continue
        name = f.split("/")[1]
        folder, why = place_test(name, index)
        if folder is None:
            report.unplaced_tests.append(f"{f}: {why}")
        elif folder != "tests":
            target = f"{folder}/{name}"
            moves.append(plan_move(root, f, TEST_RENAMES.get(target, target), taken))
            moves[-1].reason = why
    for old, new in TEST_RENAMES.items():
        if old in files:
            moves.append(plan_move(root, old, new, taken))
            moves[-1].reason = "TEST_RENAMES"
    return moves


# ---------------------------------------------------------------- rewrites


def module_pairs(renames: dict[str, str], folders: dict[str, str]) -> dict[str, str]:
    """Old dotted name -> new dotted name, for moved modules and moved folders under the packages."""
    pairs = {}
    for old, new in renames.items():
        a, b = (module_name(old), module_name(new)) if old.endswith(".py") else (None, None)
        if a and b and a != b:
            pairs[a] = b
    for old, new in folders.items():
        a, b = module_name(old + "/__init__.py"), module_name(new + "/__init__.py")
        if a and b and a != b:
            pairs[a] = b
    return pairs


def dotted_rules(
    root: Path, renames: dict[str, str], folders: dict[str, str], files_after: set[str], report: Report
) -> list[tuple[re.Pattern[str], str]]:
    """Regexes that rewrite old dotted module names to new ones, longest first."""
    rules = []
    for a, b in sorted(module_pairs(renames, folders).items(), key=lambda p: -len(p[0])):
        guard = ""
        if b.startswith(a + "."):  # a package now holds what was the module: skip its own children
            children = package_children(a, files_after)
            clash = children & top_level_names(root, renames, b)
            if clash:
                report.warnings.append(f"{a}.{{{', '.join(sorted(clash))}}}: old attribute or new module? left as is")
            if children:
                guard = r"(?!\.(?:" + "|".join(map(re.escape, sorted(children))) + r")(?!\w))"
        rules.append((re.compile(r"(?<![\w.])" + re.escape(a) + r"(?!\w)" + guard), b))
    return rules


def helper_rules() -> list[tuple[re.Pattern[str], str]]:
    """``from tests.train_cli import ...`` -> ``from train_cli import ...``: helpers by their bare name."""
    names = [h.removesuffix(".py") for h in HELPERS if h.endswith(".py")]
    return [(re.compile(r"(?<![\w.])tests\.(" + "|".join(names) + r")(?!\w)"), r"\1")]


def top_level_names(root: Path, renames: dict[str, str], dotted: str) -> set[str]:
    """Names a module defines or imports at its top level (read from wherever it is now)."""
    for old, new in renames.items():
        if module_name(new) == dotted and (root / old).exists():
            path = root / old
            break
    else:
        return set()
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def package_children(dotted: str, files_after: set[str]) -> set[str]:
    """Module and subpackage names directly inside package ``dotted`` in the tree after the moves."""
    children = set()
    for f in files_after:
        name = module_name(f) if f.endswith(".py") else None
        if name and name.startswith(dotted + "."):
            children.add(name[len(dotted) + 1 :].split(".")[0])
        elif not f.endswith(".py"):
            folder = module_name(f.rsplit("/", 1)[0] + "/x.py")
            if folder and folder.removesuffix(".x").startswith(dotted + "."):
                children.add(folder.removesuffix(".x")[len(dotted) + 1 :].split(".")[0])
    return children


def path_rules(renames: dict[str, str], folders: dict[str, str]) -> list[tuple[re.Pattern[str], str]]:
    """Regexes for repository paths (``trainer/engine.py``) and Python path joins (``"trainer" / "x"``)."""
    rules = []
    for a, b in sorted({**renames, **folders}.items(), key=lambda p: -len(p[0])):
        rules.append((re.compile(r"(?<![\w.-])" + re.escape(a) + r"(?![\w.-]*\w)"), b))
        a_parts, b_parts = a.split("/"), b.split("/")
        if len(a_parts) > 1:
            joined = r"\s*/\s*".join(f'"{re.escape(p)}"' for p in a_parts)
            rules.append((re.compile(r'(?<![\w"])' + joined), " / ".join(f'"{p}"' for p in b_parts)))
    return rules


def from_import_rule(text: str, renames: dict[str, str]) -> tuple[str, int]:
    """``from freescale.trainer import engine, config`` -> one import per new parent package."""
    moved = {}
    for old, new in renames.items():
        a, b = module_name(old), module_name(new)
        if a and b and a != b and old.endswith(".py"):
            moved[a] = b
    count = 0
    pattern = re.compile(r"^([ \t]*)from (freescale(?:\.\w+)*) import (\(?)([\w ,\n]+?)(\)?)[ \t]*$", re.M)

    def replace(m: re.Match[str]) -> str:
        nonlocal count
        indent, parent, names = m.group(1), m.group(2), [n.strip() for n in m.group(4).split(",") if n.strip()]
        groups: dict[str, list[str]] = {}
        changed = False
        for item in names:
            name, _, alias = item.partition(" as ")
            new = moved.get(f"{parent}.{name}")
            if new is None:
                groups.setdefault(parent, []).append(item)
                continue
            changed = True
            new_parent, new_name = new.rsplit(".", 1)
            spelled = new_name if not alias and new_name == name else f"{new_name} as {alias or name}"
            groups.setdefault(new_parent, []).append(spelled)
        if not changed:
            return m.group(0)
        count += 1
        return "\n".join(f"{indent}from {p} import {', '.join(ns)}" for p, ns in groups.items())

    return pattern.sub(replace, text), count


def relative_import_rule(path: str, new_path: str, text: str, renames: dict[str, str]) -> tuple[str, int]:
    """Relative imports in a package module that moved or that name a moved module: made absolute."""
    if not path.endswith(".py") or module_name(path) is None:
        return text, 0
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text, 0
    moved = {module_name(o): module_name(n) for o, n in renames.items() if o.endswith(".py")}
    package = module_name(path).rsplit(".", 1)[0] if not path.endswith("__init__.py") else module_name(path)
    lines, count = text.splitlines(keepends=True), 0
    for node in sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level), key=lambda n: -n.lineno
    ):
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
        touches = path != new_path or target in moved or any(f"{target}.{a.name}" in moved for a in node.names)
        if not touches or node.lineno != node.end_lineno:
            continue
        line = lines[node.lineno - 1]
        segment = line[node.col_offset : node.end_col_offset]
        absolute = re.sub(r"^from \.+\w*(?:\.\w+)* import", f"from {target} import", segment)
        lines[node.lineno - 1] = line[: node.col_offset] + absolute + line[node.end_col_offset :]
        count += 1
    return "".join(lines), count


def test_path_rules(new_path: str, helpers: set[str], text: str) -> tuple[str, int]:
    """In a test file now at ``new_path``: ``Path(__file__)`` climbs to the repository and to helpers."""
    depth = new_path.count("/")  # tests/x.py -> 1, tests/trainer/engines/x.py -> 3
    if depth <= 1:
        return text, 0
    total = 0
    here = r"Path\(__file__\)(?:\.resolve\(\))?"
    repo = f"Path(__file__).resolve().parents[{depth}]"
    text, n = re.subn(here + r"\.parent\.parent(?![\w.]*\bparent\b)", repo, text)
    total += n
    names = "|".join(map(re.escape, sorted(helpers)))
    if names:
        helper_dir = f'Path(__file__).resolve().parents[{depth - 1}] / "helpers" / '
        text, n = re.subn(here + r'\.parent\s*/\s*"(' + names + r')"', lambda m: f'{helper_dir}"{m.group(1)}"', text)
        total += n
        text, n = re.subn(here + r'\.with_name\("(' + names + r')"\)', lambda m: f'{helper_dir}"{m.group(1)}"', text)
        total += n
    return text, total


def is_text(root: Path, path: str) -> bool:
    """Files the rewrites may touch: text files outside recorded results."""
    if path.startswith(SKIP_PREFIXES) or Path(path).suffix not in TEXT_SUFFIXES:
        return False
    try:
        (root / path).read_text()
    except (UnicodeDecodeError, IsADirectoryError):
        return False
    return True


def rewrite(
    root: Path, files: list[str], renames: dict[str, str], folders: dict[str, str], report: Report, write: bool
) -> None:
    """Apply every rewrite rule to every text file (read at its old path, written at its new one)."""
    files_after = {renames.get(f, f) for f in files}
    dotted, paths = dotted_rules(root, renames, folders, files_after, report), path_rules(renames, folders)
    dotted += helper_rules()
    helpers = {h.rstrip("/") for h in HELPERS}
    moved_tests = {n for o, n in renames.items() if n.startswith("tests/") and "/test_" in n}
    for f in files:
        if not is_text(root, f):
            continue
        new_path = renames.get(f, f)
        before = text = (root / f).read_text()
        count = 0
        text, n = relative_import_rule(f, new_path, text, renames)
        count += n
        text, n = from_import_rule(text, renames)
        count += n
        for pattern, new in [*dotted, *paths]:
            text, n = pattern.subn(new, text)
            count += n
        if new_path in moved_tests and f != new_path:
            text, n = test_path_rules(new_path, helpers, text)
            count += n
        if text != before:
            report.rewrites[new_path] = count
            if write:
                (root / f).write_text(text)


# ---------------------------------------------------------------- packages, pyproject, fixups


def ensure_packages(root: Path, report: Report, write: bool) -> None:
    """``__init__.py`` in each new source folder holding modules; new packages in pyproject's list."""
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    for folder, role in PACKAGE_ROLES.items():
        if not (root / folder).is_dir():
            continue
        init = root / folder / "__init__.py"
        if not init.exists():
            report.created.append(f"{folder}/__init__.py")
            if write:
                init.write_text('"""' + "\n".join(textwrap.wrap(role, 110)) + '\n"""\n')
                subprocess.run(["git", "add", str(init)], cwd=root, check=True)
    for folder in [*PACKAGE_ROLES, *DATA_ONLY_PACKAGES]:
        dotted = module_name(folder + "/__init__.py")
        if (root / folder).is_dir() and dotted and f'"{dotted}"' not in text:
            parent = dotted.rsplit(".", 1)[0]
            anchor = re.search(
                rf'^(\s*)"{re.escape(parent)}(?:\.\w+)*",[^\n]*\n(?!\s*"{re.escape(parent)}\.)', text, re.M
            )
            if anchor is None:
                report.warnings.append(f"pyproject.toml: add {dotted!r} to [tool.setuptools] packages by hand")
                continue
            comment = (
                "  # data only (no .py): listed so setuptools ships it as package data"
                if folder in DATA_ONLY_PACKAGES
                else ""
            )
            text = text[: anchor.end()] + f'{anchor.group(1)}"{dotted}",{comment}\n' + text[anchor.end() :]
            report.created.append(f"pyproject.toml packages: {dotted}")
    if write:
        pyproject.write_text(text)


def shared_test_modules(root: Path, report: Report, write: bool) -> None:
    """A test module other tests import by bare name (``from test_datasets_sources import ...``) needs its
    folder on pytest's ``pythonpath``: added to pyproject.toml and reported (better: move the shared part
    into tests/helpers/)."""
    tests = {p.stem: p.parent.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py")}
    needed = set()
    for path in (root / "tests").rglob("*.py"):
        for name in re.findall(r"^\s*(?:from|import) (test_\w+)", path.read_text(), re.M):
            if name in tests and tests[name] not in ("tests", HELPER_DIR):
                needed.add(tests[name])
                report.warnings.append(
                    f"{path.relative_to(root)} imports {name} by bare name: {tests[name]} on pythonpath"
                )
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    m = re.search(r"^pythonpath = \[([^\]]*)\]", text, re.M)
    if m is None or not needed:
        return
    have = re.findall(r'"([^"]+)"', m.group(1))
    missing = sorted(needed - set(have))
    if missing:
        report.fixups.append(f"pyproject.toml: pythonpath += {missing}")
        if write:
            listed = ", ".join(f'"{p}"' for p in [*have, *missing])
            pyproject.write_text(text[: m.start(1)] + listed + text[m.end(1) :])


def apply_fixups(root: Path, report: Report, write: bool) -> None:
    """The exact replacements in ``FIXUPS`` whose old text is still there."""
    for path, old, new in FIXUPS:
        target = root / path
        if not target.exists():
            report.warnings.append(f"fixup skipped, {path} not found: {old!r}")
            continue
        text = target.read_text()
        if old in text:
            report.fixups.append(f"{path}: {old!r} -> {new!r}")
            if write:
                target.write_text(text.replace(old, new))


def sibling_warnings(root: Path, renames: dict[str, str], report: Report) -> None:
    """Moved tests that name a sibling file by ``with_name`` which no longer sits beside them."""
    after = {renames.get(f, f) for f in renames} | {f for f in repo_files(root) if f not in renames}
    for old, new in renames.items():
        if not (new.startswith("tests/") and new.endswith(".py")) or not (root / old).exists():
            continue
        for name in re.findall(r'with_name\("([^"]+)"\)', (root / old).read_text()):
            if name not in HELPERS and f"{new.rsplit('/', 1)[0]}/{name}" not in after:
                report.warnings.append(f"{new}: with_name({name!r}) names no file beside it")


def tidy(root: Path, report: Report) -> None:
    """Sort the rewritten imports and re-wrap long lines with the repository's ruff, where there is one."""
    ruff = next((str(p) for p in (Path(sys.executable).parent / "ruff", root / ".venv/bin/ruff") if p.exists()), None)
    ruff = ruff or shutil.which("ruff")
    touched = [f for f in [*report.rewrites, *report.created] if f.endswith(".py") and (root / f).exists()]
    if ruff is None:
        report.warnings.append(
            "ruff not found: run `ruff check --select I --fix` and `ruff format` on the rewritten files"
        )
        return
    if touched:
        subprocess.run([ruff, "check", "-q", "--select", "I", "--fix", *touched], cwd=root, check=False)
        subprocess.run([ruff, "format", "-q", *touched], cwd=root, check=False)
        long = subprocess.run(
            [ruff, "check", "-q", "--select", "E501", "--output-format", "concise", *touched],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.splitlines()
        report.warnings += [f"too long after the rewrite (wrap by hand): {x}" for x in long if "E501" in x]


def git_mv(root: Path, moves: list[Move]) -> None:
    """``git mv`` each planned move (parents created)."""
    for m in moves:
        if m.status == "move":
            (root / m.new).parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "mv", m.old, m.new], cwd=root, check=True)


# ---------------------------------------------------------------- main


def print_report(report: Report, write: bool) -> None:
    """What happened, grouped so the reader sees first what needs a human."""
    verb = "moved" if write else "would move"
    rewrote = ("rewrote" if write else "would rewrite") + " (file: replacements)"
    moves = {s: [f"{m.old} -> {m.new}" for m in report.moves if m.status == s] for s in ("done", "absent", "conflict")}
    sections = {
        verb: [
            f"{m.old} -> {m.new}" + (f"   ({m.reason})" if m.reason else "") for m in report.moves if m.status == "move"
        ],
        "already done (target present, source gone)": moves["done"],
        "ABSENT (source not found: moved, renamed or deleted elsewhere? check)": moves["absent"],
        "CONFLICT (both paths exist; nothing done)": moves["conflict"],
        "TESTS NOT PLACED (left in tests/: add to TEST_PLACES or ROOT_TESTS)": report.unplaced_tests,
        rewrote: [f"{f}: {n}" for f, n in sorted(report.rewrites.items())],
        "created": report.created,
        "fixups": report.fixups,
        "WARNINGS": report.warnings,
    }
    for title, lines in sections.items():
        print(f"== {title}: {len(lines)}")
        for line in lines:
            print(f"   {line}")


def run(root: Path, write: bool) -> Report:
    """Plan everything against the tree as it is, then (``write``) apply it."""
    report = Report()
    files = repo_files(root)
    source = [plan_move(root, o, n, set()) for o, n in SOURCE_MOVES]
    renames = expand(source, files)
    after = sorted({renames.get(f, f) for f in files})
    tests = plan_tests(root, after, report, set())
    renames.update(expand(tests, files))
    report.moves = source + tests
    folders = {m.old: m.new for m in report.moves if m.status == "move" and (root / m.old).is_dir()}
    rewrite(root, files, renames, folders, report, write)
    sibling_warnings(root, renames, report)
    if write:
        git_mv(root, report.moves)
    ensure_packages(root, report, write)
    apply_fixups(root, report, write)
    shared_test_modules(root, report, write)
    if write:
        tidy(root, report)
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI: apply (default), ``--dry-run`` or ``--check``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if applying would change anything")
    args = p.parse_args(argv)
    write = not (args.dry_run or args.check)
    report = run(args.root.resolve(), write)
    print_report(report, write)
    pending = [m for m in report.moves if m.status == "move"] or report.rewrites or report.created or report.fixups
    if args.check:
        return 1 if pending else 0
    return 2 if any(m.status == "conflict" for m in report.moves) else 0


if __name__ == "__main__":
    sys.exit(main())
