"""The GPU check's wheel list (``scripts/gpu_wheels.txt``) against a folder of downloaded wheels.

Standard library only: ``tools/gpu_check.py`` runs it before FreeScale is installed, and
``scripts/gpu_wheels.sh`` after downloading. A folder *resolves* when every listed package has
exactly one wheel of the listed version that CPython 3.12 on manylinux x86_64 can install, and the
folder holds nothing else; their total size must stay under ``LIMIT_BYTES`` (the wheels travel with
every GPU command).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

LIMIT_BYTES = 60 * 2**20
PYTHON = (3, 12)


@dataclass(frozen=True)
class Wanted:
    """One line of the list: ``name==version  # why``."""

    name: str  # normalised (PEP 503)
    version: str
    why: str


@dataclass
class Resolution:
    """Which file serves each wanted package, and what is wrong."""

    files: dict[str, Path] = field(default_factory=dict)  # normalised name -> wheel
    problems: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.files.values())


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path) -> list[Wanted]:
    """The wanted packages; a line that is not ``name==version`` is an error naming it."""
    wanted = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text, _, why = line.partition("#")
        if not text.strip():
            continue
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)\s*", text)
        if match is None:
            raise ValueError(f"{path}:{number}: expected 'name==version  # why', got {line.strip()!r}")
        wanted.append(Wanted(normalise(match[1]), match[2], why.strip()))
    return wanted


def wheel_parts(filename: str) -> tuple[str, str, list[str], list[str], list[str]] | None:
    """(name, version, python tags, abi tags, platform tags) of a wheel file name, or None."""
    if not filename.endswith(".whl"):
        return None
    pieces = filename[:-4].split("-")
    if len(pieces) not in (5, 6):
        return None
    name, version, python, abi, platform = pieces[0], pieces[1], *pieces[-3:]
    return normalise(name), version, python.split("."), abi.split("."), platform.split(".")


def installable(python: list[str], abi: list[str], platform: list[str]) -> bool:
    """Whether CPython 3.12 on manylinux x86_64 can install a wheel with these tags."""
    major, minor = PYTHON
    exact = {f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"}
    stable = [t for t in python if re.fullmatch(rf"cp{major}(\d+)", t) and int(t[3:]) <= minor]
    python_ok = bool(exact & set(python)) or ("abi3" in abi and bool(stable))
    abi_ok = bool({"none", "abi3", f"cp{major}{minor}"} & set(abi))
    platform_ok = any(p == "any" or re.fullmatch(r"(manylinux\w*|linux)_x86_64", p) for p in platform)
    return python_ok and abi_ok and platform_ok


def resolve(folder: Path, wanted: list[Wanted]) -> Resolution:
    """Match ``folder``'s wheels to ``wanted`` (see the module docstring)."""
    result = Resolution()
    by_name: dict[str, list[tuple[Path, str, bool]]] = {}
    for path in sorted(folder.glob("*.whl")):
        parts = wheel_parts(path.name)
        if parts is None:
            result.problems.append(f"{path.name}: not a wheel file name")
            continue
        name, version, python, abi, platform = parts
        by_name.setdefault(name, []).append((path, version, installable(python, abi, platform)))
    names = {w.name for w in wanted}
    for extra in sorted(set(by_name) - names):
        listed = ", ".join(p.name for p, _, _ in by_name[extra])
        result.problems.append(f"{listed}: not in the wheel list (delete it or add it to scripts/gpu_wheels.txt)")
    for want in wanted:
        found = by_name.get(want.name, [])
        if len(found) != 1:
            what = "no wheel" if not found else f"{len(found)} wheels ({', '.join(p.name for p, _, _ in found)})"
            result.problems.append(f"{want.name}=={want.version}: {what} in {folder}")
            continue
        path, version, ok = found[0]
        if version != want.version:
            result.problems.append(f"{path.name}: version {version}, the list wants {want.version}")
        elif not ok:
            result.problems.append(
                f"{path.name}: CPython {PYTHON[0]}.{PYTHON[1]} on manylinux x86_64 cannot install it"
            )
        else:
            result.files[want.name] = path
    return result


def describe(resolution: Resolution, wanted: list[Wanted]) -> str:
    """One line: how many wheels, their size against the limit."""
    mib = resolution.total_bytes / 2**20
    return f"{len(resolution.files)} of {len(wanted)} wheels, {mib:.1f} MiB (limit {LIMIT_BYTES / 2**20:.0f} MiB)"
