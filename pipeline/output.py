"""Where ``prepare`` writes and how it keeps that safe: a lock, a staging directory, an atomic swap.

A prepared dataset must never be half one run and half another, and a user's files must never be
deleted by accident. So, for a local output:

- an exclusive lock (``flock`` on ``.<name>.freescale-lock`` beside the output) is taken before any
  work: a second ``prepare`` on the same output fails at once naming the holder. The kernel drops
  the lock when its process dies (``kill -9`` included), so a lock is never stale;
- everything is written into a staging directory beside the output (``.<name>.freescale-staging-<fp>``,
  one per dataset fingerprint, on the output's file system) and the finished directory replaces the
  output in one ``rename`` (``renameat2(RENAME_EXCHANGE)`` from ``.<name>.freescale-swap`` when an
  old output exists: the old dataset never sits under a staging name). A reader sees the old dataset
  or the new one, never a mix; a killed job leaves the output as it was and resumes into its staging
  directory, trusting a part there only when it is what the part's marker recorded
  (``writer.written_part_problem``);
- an output that is, or contains, an input (a source file, the source config, the cost model) is
  refused: ``--overwrite`` would otherwise delete the raw data. Paths are compared by file identity
  too (``check_no_overlap``), so a bind mount is not a way around it.

An ``s3://`` output has no rename and no ``flock``: parts are written in place and ``manifest.json``
last (one PUT, so a reader sees it whole or not at all), and the lock is a local ``flock`` in the work
directory's root: it excludes jobs on this machine only (see README, "Options that shape the dataset").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from freescale import storage

LOCK_SUFFIX = ".freescale-lock"
STAGING_INFIX = ".freescale-staging-"
# The swap's far side: the finished dataset moves here from its staging directory and is exchanged
# with the output from here, so the old dataset lands under this name, which no run resumes from.
SWAP_SUFFIX = ".freescale-swap"
OLD_SUFFIX = ".freescale-old"  # where the old output waits for deletion when the kernel cannot exchange
# Names a FreeScale output holds: an output holding only these (and at least one part) is an
# unfinished run of ours (a killed job of an older release wrote in place), not somebody's files.
OWN_NAMES = re.compile(r"part-\d{5}|index\.json|micro_batch_offsets\.npy|quarantine\.jsonl|manifest\.json|vocab")
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_RENAME_EXCHANGE = 2


class PrepareError(RuntimeError):
    """A prepare job that cannot go on; the message says why and what to change."""


class RejectsError(PrepareError):
    """More rows rejected than ``--max-reject-fraction`` allows; ``quarantine`` holds examples."""

    def __init__(self, summary: str, quarantine: Path) -> None:
        super().__init__(f"{summary}; examples in {quarantine}")
        self.summary = summary
        self.quarantine = quarantine


class NoSamplesError(PrepareError):
    """Every event was rejected or filtered out: no sample to write. ``rows`` is the accounting a manifest
    would have held (``manifest.no_sample_rows``: ``samples`` 0, every valid event under a filter reason)."""

    def __init__(self, message: str, rows: dict[str, Any]) -> None:
        super().__init__(message)
        self.rows = rows


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line (library messages carry newlines and control bytes), shortened."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in str(text)).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------- lock
class OutputLock:
    """An exclusive ``flock`` on ``path``, holding a line that says who holds it.

    The file is removed on release; a process that opened it just before then would lock an unlinked
    inode, so ``acquire`` checks that the locked file is still the one at ``path`` and retries if not.
    """

    def __init__(self, path: Path, what: str, activity: str = "prepared") -> None:
        self.path = path
        self.what = what
        self.activity = activity  # the refusal says "<what> is being <activity> by another run"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that is starting"
                os.close(fd)
                raise PrepareError(
                    f"{self.what} is being {self.activity} by another run ({one_line(holder)}; lock {self.path}): "
                    "wait for it to end or stop it, then run again"
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # unlinked by a holder that released it meanwhile: lock the new file
        holder = f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        if _same_file(self._fd, self.path):
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------------------- places
def local_output(output: str) -> Path:
    """The output directory with symlinks resolved: the swap replaces the real directory."""
    return Path(output).expanduser().resolve()


def lock_path(output: str, work_root: Path) -> Path:
    """Beside a local output (never inside it: the output is replaced whole); in the local work root
    for an ``s3://`` output, named by the output URI."""
    if storage.is_remote(output):
        return work_root / f"{hashlib.sha256(output.encode()).hexdigest()[:16]}{LOCK_SUFFIX}"
    path = local_output(output)
    return path.parent / f".{path.name}{LOCK_SUFFIX}"


def staging_path(output: str, fingerprint: str) -> Path:
    path = local_output(output)
    return path.parent / f".{path.name}{STAGING_INFIX}{fingerprint[:16]}"


def remove_stale_staging(output: str, keep: Path | None) -> None:
    """Staging directories but ``keep`` (other datasets' ones; all of them when the output is up to
    date) and a swap's leftovers (the output's lock is held: nobody uses them)."""
    path = local_output(output)
    for entry in path.parent.glob(f".{glob_escape(path.name)}{STAGING_INFIX}*"):
        if entry != keep:
            shutil.rmtree(entry, ignore_errors=True)
    for suffix in (SWAP_SUFFIX, OLD_SUFFIX):
        shutil.rmtree(path.parent / f".{path.name}{suffix}", ignore_errors=True)


# A job's work directory: ``<fingerprint[:16]>-w<WORK_LAYOUT>`` in the work root, with a lock file beside it
WORK_NAME = re.compile(r"[0-9a-f]{16}-w\d+")
OWNER_NAME = "output.txt"  # in a work directory: the output its job writes


def record_work_owner(work: Path, output: str) -> None:
    """Write which output ``work`` belongs to: in a shared ``--work-dir`` that is how a later job on
    the same output tells its own stale work directories from other outputs' ones."""
    work.mkdir(parents=True, exist_ok=True)
    (work / OWNER_NAME).write_text(_comparable(output) + "\n")


def remove_stale_work(work_root: Path, keep: Path, output: str, own_root: bool) -> list[Path]:
    """Work directories of ``output``'s earlier jobs (another fingerprint: a source edited, options
    changed, an older layout) and their lock files, which a killed job leaves. Called with the
    output's lock held, so no job of this output runs; a work directory whose lock another process
    holds is kept all the same. ``own_root``: the work root is the output's default one, so every
    work directory in it is the output's; in a ``--work-dir`` only those recording ``output`` are."""
    if not work_root.is_dir():
        return []
    removed = []
    for entry in sorted(work_root.iterdir()):
        if entry == keep or entry.is_symlink() or not entry.is_dir() or not WORK_NAME.fullmatch(entry.name):
            continue
        if not own_root and _work_owner(entry) != _comparable(output):
            continue
        lock = OutputLock(entry.with_name(entry.name + LOCK_SUFFIX), f"work directory {entry}")
        try:
            lock.acquire()
        except PrepareError:
            continue
        try:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        finally:
            lock.release()  # and its lock file, which a killed job leaves behind
    return removed


def _work_owner(work: Path) -> str | None:
    try:
        return (work / OWNER_NAME).read_text().strip()
    except OSError:
        return None


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def private_work_root() -> Path:
    """``<tmp>/freescale-prepare-<uid>``: another user must not be able to plant or read work files.

    Created with mode 0o700; an existing one owned by another user or writable by group or others
    is refused rather than used."""
    root = Path(tempfile.gettempdir()) / f"freescale-prepare-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
        root.chmod(0o700)  # created here: exactly 0o700 whatever the umask
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode):
        raise PrepareError(f"work directory {root} is not a directory; remove it or pass --work-dir")
    if info.st_uid != os.getuid():
        raise PrepareError(
            f"work directory {root} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); pass --work-dir"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PrepareError(
            f"work directory {root} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            "chmod 700 it or pass --work-dir"
        )
    return root


# ----------------------------------------------------------------------------------------- checks
def check_output_place(output: str) -> None:
    """Before any work: a local output that exists must be a directory (it is replaced whole by one;
    a file there was found only when the finished job tried to publish), and the folder it is in must
    take new files (the lock, staging and default work directories go there)."""
    if storage.is_remote(output):
        return
    path = local_output(output)
    if path.exists() and not path.is_dir():
        raise PrepareError(f"--output {output} exists and is not a directory; remove it or choose another --output")
    problem = storage.local_write_problem(str(path.parent))
    if problem is not None:
        raise PrepareError(f"--output {output}: {problem} (the lock and the staging directory go beside the output)")


def check_replaceable(output: str) -> None:
    """Before any work, when an existing local output is to be replaced: publishing renames the new
    dataset into its place and deletes the old one's files, so the output must be writable and must
    not be a mount point (which no rename can move)."""
    if storage.is_remote(output):
        return
    path = local_output(output)
    if not path.is_dir():
        return
    problem = storage.local_write_problem(str(path))
    if problem is not None:
        raise PrepareError(f"--output {output}: {problem}, so the dataset in it cannot be replaced")
    if _is_mount_point(path):
        raise PrepareError(
            f"--output {output} is a mount point: a finished dataset replaces the output by a rename, "
            "which cannot move a mount point; use a folder inside it"
        )


def check_no_overlap(output: str, paths: list[str], what: str = "the input") -> None:
    """Refuse an output that is or contains one of ``paths`` (inputs, the work directory): replacing
    the output would delete it.

    Paths are compared as strings (symlinks resolved) and, for a local output that exists, by file
    identity: a bind mount (or a second mount the kernel gives the same device number) is another
    path to the same directory, so the output's (st_dev, st_ino) is compared with every existing
    ancestor of each path. Sources share folders: each folder is looked at once."""
    target = _comparable(output)
    output_id = _identity(target) if not storage.is_remote(output) else None
    seen: dict[Path, bool] = {}  # folder -> is the output

    def is_output(place: Path) -> bool:
        if place not in seen:
            seen[place] = _identity(str(place)) == output_id
        return seen[place]

    for uri in paths:
        inner = _comparable(uri)
        same = inner == target or inner.startswith(target.rstrip("/") + "/")
        if not same and output_id is not None and not storage.is_remote(uri):
            same = any(is_output(place) for place in (Path(inner), *Path(inner).parents))
        if same:
            raise PrepareError(
                f"--output {output} contains {what} {uri}: replacing the output would delete it; "
                "choose an --output outside it"
            )


def _identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of what ``path`` names, or None where it does not exist or cannot be reached."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _comparable(uri: str) -> str:
    if storage.is_remote(uri):
        return uri.rstrip("/")
    return str(local_output(uri))


def _is_mount_point(path: Path) -> bool:
    """``os.path.ismount`` misses a bind mount of a folder of the same file system (same device, an
    inode other than the root's); the kernel's mount table of this process has them all."""
    if os.path.ismount(path):
        return True
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    # field 5 is the mount point, with space, tab, newline and backslash escaped as octal
    points = {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in lines}
    return str(path) in points


def is_unfinished_own_output(names: list[str]) -> bool:
    """True when a directory without a manifest holds only FreeScale output names, one part at least."""
    return any(name.startswith("part-") for name in names) and all(OWN_NAMES.fullmatch(name) for name in names)


def disk_full(error: BaseException) -> bool:
    """Out of space or quota: ``OSError.errno``, or pyarrow's message (its IO errors carry no errno)."""
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
        return True
    text = str(error)
    return "No space left on device" in text or "Disk quota exceeded" in text


def disk_full_message(error: BaseException, where: str) -> str:
    path = getattr(error, "filename", None) or where
    return (
        f"no space left on the device holding {path} ({one_line(os.strerror(errno.ENOSPC))}); "
        "free some space and run the same command again: the job resumes where it stopped"
    )


# ----------------------------------------------------------------------------------------- publish
def publish_local(staging: Path, output: Path) -> None:
    """Make the finished ``staging`` directory the output in one step; the old output is deleted after.

    With an existing output the finished directory is first renamed to ``.<name>.freescale-swap``
    and exchanged with the output from there (Linux ``renameat2``), so the old dataset waits for its
    deletion under that name: never under the job's staging name, where a rerun of the job would
    take it for its own parts. Where the kernel cannot exchange, the old output is first moved aside
    (``.<name>.freescale-old``), so a reader can briefly find no dataset, never a mixed one. A kill
    between the renames leaves the old dataset in place and the new one under the swap name, which
    the next run deletes (its write markers then find no parts and it starts over)."""
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise PrepareError(f"--output {output} exists and is not a directory")
    if not output.exists() or _empty_dir(output):
        os.rename(staging, output)  # replaces an empty directory too
    else:
        swap = output.parent / f".{output.name}{SWAP_SUFFIX}"
        shutil.rmtree(swap, ignore_errors=True)
        os.rename(staging, swap)
        if _exchange(swap, output):
            shutil.rmtree(swap)  # the old output, now at the swap path
        else:
            old = output.parent / f".{output.name}{OLD_SUFFIX}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(output, old)
            os.rename(swap, output)
            shutil.rmtree(old)
    _fsync_dir(output.parent)


def remove_unlisted(directory: Path, keep: set[str]) -> list[str]:
    """Delete every file under ``directory`` whose relative path is not in ``keep`` (and folders left
    empty): a staging directory is published whole, so whatever a killed or failed run left in it (a
    temporary file, a part of a larger earlier plan) would otherwise be published too. Returns the
    relative paths removed."""
    removed = []
    for path in sorted(directory.rglob("*"), reverse=True):  # children before their folders
        name = path.relative_to(directory).as_posix()
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif name not in keep:
            path.unlink()
            removed.append(name)
    return removed


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the kernel or libc cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_npy_atomic(path: Path, array) -> None:
    """``np.save`` through a ``.tmp`` file: a work-dir file whose presence marks a step done must be whole."""
    import numpy as np

    with open(f"{path}.tmp", "wb") as handle:
        np.save(handle, array)
    os.replace(f"{path}.tmp", path)
