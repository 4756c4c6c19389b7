"""A run owns its folders: ``logging.out_dir`` and ``checkpoint.dir`` are locked while it runs, and a
checkpoint folder holds the checkpoints of one run only.

Why: two runs into one ``out_dir`` both ran (every step logged twice, checkpoints written by both),
and a fresh run into a folder holding another run's checkpoints overwrote some of them while
``checkpoint.resume = "latest"`` later resumed the other run's higher step (metrics jumping, the
best-model record mixing runs).

- Locks: ``prepare``'s ``OutputLock`` (``flock`` on ``.<name>.freescale-lock`` beside the folder, a line
  naming the holder; the kernel drops it when the process dies, ``kill -9`` included). The launcher
  (``freescale train``) takes them before it checks anything and holds them until torchrun and every
  rank have ended. On several nodes node 0's launcher takes them: the other nodes' launchers run the
  same command on the same folders. ``freescale evaluate`` takes none: it only writes
  ``evaluation.json`` and may score a checkpoint of a run that is still training.
- Ownership (``claim_checkpoint_dir``): every checkpoint carries its run id
  (``checkpoint_record.py``). A fresh run needs an absent or empty ``checkpoint.dir``; a resumed run
  one whose checkpoints (and ``best/``) all carry the id of the checkpoint it resumes. Leftovers of a
  save that died (``.step_N.partial``) are removed, under the lock. The folder must be writable: a
  file is written and removed there before any rank starts (a read-only folder failed at the first
  save, after the steps before it).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from freescale.pipeline.output import OutputLock, lock_path
from freescale.trainer.checkpoint_dirs import OLD_SUFFIX, PARTIAL_SUFFIX, STEP_DIR
from freescale.trainer.checkpoint_record import read_record
from freescale.trainer.config import RunConfig

WRITE_CHECK = ".freescale-write-check-"
LEFTOVER = re.compile(rf"\.(step_\d{{8}})({re.escape(PARTIAL_SUFFIX)}|{re.escape(OLD_SUFFIX)})$")


class RunFolders:
    """The run's folder locks, held from ``__enter__`` to ``__exit__`` (the launcher's whole job)."""

    def __init__(self, cfg: RunConfig) -> None:
        folders = {"logging.out_dir": cfg.logging.out_dir}
        if cfg.checkpoint.dir:
            folders["checkpoint.dir"] = cfg.checkpoint.dir
        self.locks: list[OutputLock] = []
        seen: set[Path] = set()
        for option, folder in folders.items():
            path = Path(folder).expanduser().resolve()
            if path not in seen:  # one folder for both: one lock (flock would refuse our second one)
                seen.add(path)
                where = lock_path(str(path), path.parent)  # a local folder's lock lies beside it
                self.locks.append(OutputLock(where, f"{option} {folder}", activity="used"))

    def __enter__(self) -> RunFolders:
        try:
            for lock in self.locks:
                lock.acquire()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()


def claim_checkpoint_dir(root: str, run_id: str | None) -> None:
    """Refuse ``root`` (``checkpoint.dir``) unless everything in it belongs to run ``run_id`` (None: a
    fresh run, which needs it absent or empty) and this process can write there. Call with the folder's
    lock held."""
    base = Path(root)
    if not base.exists():
        check_writable(base, root)
        return
    if not base.is_dir():
        raise ValueError(f"checkpoint.dir {root} is not a directory")
    foreign: list[tuple[str, str | None]] = []  # (entry, its run id if it has one)
    for folder in (base, base / "best"):
        if not folder.is_dir():
            continue
        for listed in sorted(folder.iterdir()):
            entry = _without_leftovers(listed)
            if entry is None:
                continue
            if folder == base and entry.name == "best" and entry.is_dir():
                continue
            owner = _owner(entry)
            if run_id is None or owner != run_id:
                foreign.append((str(entry.relative_to(base)), owner))
    if foreign:
        raise ValueError(_foreign_message(root, run_id, foreign))
    check_writable(base, root)


def check_writable(base: Path, root: str) -> None:
    """Create ``base`` if absent and write and remove a file in it: a checkpoint folder the run cannot
    write (read-only, full, under a file) would otherwise fail at the first save, after the steps before
    it were trained for nothing."""
    probe = base / f"{WRITE_CHECK}{os.getpid()}"
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ValueError(f"checkpoint.dir {root} cannot be written ({reason}): no checkpoint could be saved") from None


def _owner(entry: Path) -> str | None:
    """The run id of a checkpoint directory, None for anything else (or a record that cannot be read)."""
    if not (entry.is_dir() and STEP_DIR.match(entry.name)):
        return None
    try:
        record = read_record(entry)
    except ValueError:
        return None
    return record.run.run_id if record is not None and record.run is not None else None


def _without_leftovers(entry: Path) -> Path | None:
    """``entry``, or None when it was what a save that died left (removed here). A step moved aside for
    its replacement (``.old``) goes back to its name when the replacement never got there."""
    if entry.name.startswith(WRITE_CHECK):  # a write check that died before removing its file
        entry.unlink(missing_ok=True)
        return None
    match = LEFTOVER.match(entry.name)
    if not match:
        return entry
    step = entry.parent / match.group(1)
    if match.group(2) == OLD_SUFFIX and not step.exists():
        entry.rename(step)
        return step  # a checkpoint again: judged like the others
    shutil.rmtree(entry, ignore_errors=True)
    return None


def _foreign_message(root: str, run_id: str | None, foreign: list[tuple[str, str | None]]) -> str:
    names = ", ".join(name for name, _ in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    owners = sorted({owner for _, owner in foreign if owner})
    whose = f"run {', '.join(owners)}" if owners else "no run of this FreeScale"
    if run_id is None:
        return (
            f"checkpoint.dir {root} is not empty: it holds {names} ({whose}); a run owns its checkpoint folder: "
            'resume that run (checkpoint.resume = "latest" or a step directory) or choose an empty checkpoint.dir'
        )
    return (
        f"checkpoint.dir {root} holds {names} ({whose}), not of run {run_id} being resumed; a run owns its "
        "checkpoint folder: choose an empty checkpoint.dir to continue from that checkpoint"
    )
