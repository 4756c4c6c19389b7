"""Where checkpoints live, which one ``checkpoint.resume`` means, and whether it may be loaded.

Kept free of torch: the launcher (``freescale train``) reads it before any rank starts.

Layout: ``<checkpoint.dir>/step_00000012/`` (DCP files and ``freescale-checkpoint.json``, the record
of ``checkpoint_record.py``), ``<checkpoint.dir>/best/step_N/`` for the best-validation model.
``checkpoint.resume = "latest"`` picks the highest finished step; a path picks that one. A checkpoint
is finished when its step directory has DCP's ``.metadata``; a save in progress (or one that died) is
``.step_00000012.partial`` and never matches a step name (``checkpoint.py``).

Trust: DCP unpickles a checkpoint's ``.metadata``, and unpickling runs code. A checkpoint must come
from a trusted place; resume refuses a step directory (or a file in it) that this user does not own
or that group/other can write, since whoever can write it can make the resuming job run their code.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

STEP_DIR = re.compile(r"step_(\d{8})$")
PARTIAL_SUFFIX = ".partial"  # .step_00000012.partial: a save in progress (or one that died)
OLD_SUFFIX = ".old"  # .step_00000012.old: a step replaced by a new save of the same step


def step_dir(root: str, step: int) -> str:
    return str(Path(root) / f"step_{step:08d}")


def partial_dir(root: str, step: int) -> str:
    return str(Path(root) / f".step_{step:08d}{PARTIAL_SUFFIX}")


def finished_steps(root: str) -> list[int]:
    """Steps with a complete checkpoint under ``root``, ascending."""
    base = Path(root)
    if not base.is_dir():
        return []
    steps = []
    for child in base.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / ".metadata").exists():
            steps.append(int(match.group(1)))
    return sorted(steps)


def resolve_resume(root: str, resume: str) -> str | None:
    """The checkpoint directory ``checkpoint.resume`` names, or None (fresh start)."""
    if not resume:
        return None
    if resume == "latest":
        steps = finished_steps(root)
        if not steps:
            return None
        check_trusted(step_dir(root, steps[-1]))
        return step_dir(root, steps[-1])
    path = Path(resume)
    if not (path / ".metadata").exists():
        raise ValueError(f"checkpoint.resume: {resume} is not a finished checkpoint (no .metadata)")
    check_trusted(str(path))
    return str(path)


def check_trusted(path: str) -> None:
    """Refuse a checkpoint another user owns or group/other can write (see the module docstring)."""
    me = os.getuid()
    base = Path(path)
    for entry in [base, *sorted(base.iterdir())]:
        info = entry.lstat()
        if info.st_uid != me:
            raise ValueError(
                f"checkpoint.resume: {entry} is owned by uid {info.st_uid}, not by this user (uid {me}); "
                "resuming unpickles checkpoint metadata, so only checkpoints you wrote are loaded"
            )
        if stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(
                f"checkpoint.resume: {entry} is writable by group/other (mode {stat.S_IMODE(info.st_mode):o}); "
                f"resuming unpickles checkpoint metadata: run `chmod -R go-w {base}` if you trust its contents"
            )
