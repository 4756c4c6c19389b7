"""The documentation stays usable: a short README that starts with the two commands, relative links
(files and anchors) that resolve, every benchmark documented, and no citation of a design document
that is not in the repository."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 200
LINKED_DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SKIPPED_DIRS = {".venv", ".git", "node_modules", ".pytest_cache", ".ruff_cache", "__pycache__"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".cfg", ".ini", ".yaml", ".yml"}


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        result.add(anchor if count == 0 else f"{anchor}-{count}")
    return result


def relative_links(path: Path) -> list[str]:
    """Link targets in a Markdown file's prose that are neither URLs nor mail addresses."""
    targets = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                targets.append(target)
    return targets


def broken_link(source: Path, target: str) -> str | None:
    """Why ``target`` (relative to ``source``) does not resolve, or None when it does."""
    file_part, _, anchor = target.partition("#")
    resolved = (source.parent / file_part).resolve() if file_part else source
    if not resolved.exists():
        return f"{source.name}: {target}: no such file"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{source.name}: {target}: no heading with anchor #{anchor}"
    return None


def repository_text_files() -> list[Path]:
    """The repository's own text files (virtual environments and caches left out)."""
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        files.extend(Path(folder) / name for name in names if Path(name).suffix in TEXT_SUFFIXES)
    return files


def test_readme_fits_the_limit() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (limit {README_MAX_LINES})"


def test_readme_starts_with_make_demo_and_make_test() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# ")
    start = next(i for i, line in enumerate(lines) if line.strip())  # the title
    block_start = next(i for i in range(start + 1, len(lines)) if lines[i].strip())
    assert FENCE.match(lines[block_start]), "the first thing after the title must be a code block"
    block_end = next(i for i in range(block_start + 1, len(lines)) if FENCE.match(lines[i]))
    commands = [line.split("#")[0].strip() for line in lines[block_start + 1 : block_end]]
    assert commands == ["make demo", "make test"], commands


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    assert doc.exists(), doc
    problems = [problem for target in relative_links(doc) if (problem := broken_link(doc, target))]
    assert not problems, "\n".join(problems)


def test_every_benchmark_script_is_documented() -> None:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    missing = [p.stem for p in sorted((ROOT / "benchmarks").glob("*.py")) if p.stem not in text]
    assert not missing, f"benchmarks/README.md does not describe {missing}"


def test_no_file_cites_the_out_of_repository_design_brief() -> None:
    citations = ("DESIGN " + "§", "DESIGN" + ".md")  # split so this file does not match itself
    found = []
    for path in repository_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if any(citation in line for citation in citations):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
    assert not found, "cite docs/design.md#<section> instead:\n" + "\n".join(found)


def test_github_anchor_matches_githubs_rules() -> None:
    assert github_anchor("Cost model") == "cost-model"
    assert github_anchor("`bench_stats`") == "bench_stats"
    assert github_anchor("GPU benchmarks (one NVIDIA H200)") == "gpu-benchmarks-one-nvidia-h200"
    assert github_anchor("Projecting a cluster: `freescale simulate`") == "projecting-a-cluster-freescale-simulate"
