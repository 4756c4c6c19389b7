"""``--work-dir s3://bucket/prefix``: a job's intermediate files under an object-storage prefix.

The steps read and write ordinary files (memory-mapped spill and bucket files, ``np.load``, atomic
renames), so they keep doing that, in a node-local *mirror* of the work directory: the same path on
every node (``<tmp>/freescale-prepare-<uid>/mirror/<digest of the prefix>``), so the paths a call
carries mean the same thing wherever it runs. Around each call (``RemoteStep``) the node downloads
the files the call reads (``StepIO.inputs``), runs it, uploads what it wrote (``StepIO.outputs``:
data files first, its completion marker last) and drops its local copies of the data files, and
deletes from the prefix what it consumed (the step deleted its own local copies already). Inputs a
call only read stay in the mirror: on one host, calls share it, and a bucket read by two parts must
not vanish under the second. Small records (``.json``, ``.npy``, ``.npz``, ``.done``) stay in the
mirror: the driver reads them.

The prefix is the truth: a driver starts by emptying its mirror and downloading every record from
the prefix (``RemoteWork.reset_mirror``), so a resumed job skips exactly the calls whose marker
reached object storage, on any machine. Each step function that may run with a remote work
directory declares what it reads and writes in ``STEP_IO``; a step without an entry is refused.
"""

from __future__ import annotations

import fnmatch
import hashlib
import inspect
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from freescale import storage
from freescale.pipeline.output import private_work_root
from freescale.pipeline.steps.writer import PART_SIZE, part_name

RECORD_SUFFIXES = (".json", ".npy", ".npz", ".done")  # small files the driver reads; markers among them
MARKER_SUFFIXES = (".json", ".done")  # uploaded after every other output of a call


def mirror_path(remote_root: str) -> Path:
    """The node-local mirror of ``remote_root``: the same path on every node, private to this user."""
    digest = hashlib.sha256(remote_root.rstrip("/").encode()).hexdigest()[:16]
    return private_work_root() / "mirror" / digest


def _is_record(name: str) -> bool:
    return name.endswith(RECORD_SUFFIXES)


@dataclass(frozen=True)
class RemoteWork:
    """The work directory ``remote`` (an ``s3://`` prefix) and its node-local mirror ``local``."""

    remote: str
    local: str

    def _remote_names(self, directory: str = "") -> dict[str, int]:
        """Relative name -> size of every object under the prefix (or one directory of it)."""
        fs, path = storage.filesystem(storage.join(self.remote, directory) if directory else self.remote)
        _, root = storage.filesystem(self.remote)
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        return {info.path[len(root) + 1 :]: info.size for info in infos if info.type == pafs.FileType.File}

    def pull(self, patterns: Iterable[str]) -> None:
        """Download the objects matching ``patterns`` (relative globs) that the mirror lacks."""
        patterns = list(patterns)
        for directory in sorted({pattern.rpartition("/")[0] for pattern in patterns}):
            for name, size in sorted(self._remote_names(directory).items()):
                if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                    self._download(name, size)

    def _download(self, name: str, size: int) -> None:
        local = Path(self.local, name)
        if local.exists() and local.stat().st_size == size:
            return
        local.parent.mkdir(parents=True, exist_ok=True)
        storage.download(storage.join(self.remote, name), str(local))

    def push(self, patterns: Iterable[str]) -> None:
        """Upload the mirror's files matching ``patterns``: data first, markers last (a marker in
        the prefix means the call's other files are there); local data copies are then dropped."""
        names = [name for name in self._local_names(patterns) if not name.endswith(".tmp")]
        names.sort(key=lambda name: (name.endswith(MARKER_SUFFIXES), name))
        for name in names:
            storage.write_bytes(storage.join(self.remote, name), Path(self.local, name).read_bytes())
        for name in names:
            if not _is_record(name):
                Path(self.local, name).unlink(missing_ok=True)

    def _local_names(self, patterns: Iterable[str]) -> list[str]:
        root = Path(self.local)
        found: set[str] = set()
        for pattern in patterns:
            found.update(str(path.relative_to(root)) for path in root.glob(pattern) if path.is_file())
        return sorted(found)

    def delete(self, patterns: Iterable[str]) -> None:
        """Delete the objects matching ``patterns`` (files a finished call consumed)."""
        patterns = list(patterns)
        if not patterns:
            return
        fs, root = storage.filesystem(self.remote)
        for directory in sorted({pattern.rpartition("/")[0] for pattern in patterns}):
            for name in self._remote_names(directory):
                if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                    fs.delete_file(f"{root}/{name}")

    def reset_mirror(self) -> None:
        """Empty the mirror and download every record of the prefix: what a (resumed) driver reads."""
        shutil.rmtree(self.local, ignore_errors=True)
        Path(self.local).mkdir(parents=True)
        self.pull_records()

    def pull_records(self) -> None:
        """Download the prefix's records the mirror lacks (after a step ran on other nodes)."""
        for name, size in sorted(self._remote_names().items()):
            if _is_record(name):
                self._download(name, size)

    def push_records(self) -> None:
        """Upload the mirror's records the prefix lacks or holds at another size (the driver's own:
        partition count, k-core, plan), so a resumed job finds them."""
        remote = self._remote_names()
        root = Path(self.local)
        for path in sorted(root.rglob("*")):
            name = str(path.relative_to(root))
            if path.is_file() and _is_record(name) and remote.get(name) != path.stat().st_size:
                storage.write_bytes(storage.join(self.remote, name), path.read_bytes())

    def remove(self) -> None:
        """Delete the prefix and the mirror (the job is published)."""
        fs, path = storage.filesystem(self.remote)
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            fs.delete_dir(path)
        shutil.rmtree(self.local, ignore_errors=True)


@dataclass(frozen=True)
class StepIO:
    """What one step call reads, writes and consumes, as globs relative to the work directory."""

    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)


def _spill(partition: int) -> list[str]:
    return [f"scan/t*.p{partition:05d}.arrow", f"scan/users.p{partition:05d}.arrow"]


def _removed_items(path: str | None) -> list[str]:
    return [f"samples/{Path(path).name}"] if path else []


def _scan_io(a: dict[str, Any]) -> StepIO:
    return StepIO(outputs=[f"scan/t{a['task_id']:05d}.*"])


def _user_table_io(a: dict[str, Any]) -> StepIO:
    return StepIO(outputs=["scan/users.*"])


def _kcore_io(a: dict[str, Any]) -> StepIO:
    return StepIO(inputs=_spill(a["partition"]))


def _partition_io(a: dict[str, Any]) -> StepIO:
    p = a["partition"]
    return StepIO(
        inputs=_spill(p) + _removed_items(a["removed_items_path"]),
        outputs=[f"samples/p{p:05d}.*", f"buckets/b*.p{p:05d}.arrow"],
        consumed=_spill(p),
    )


def _write_io(a: dict[str, Any]) -> StepIO:
    size, part = a["bucket_size"], a["part"]
    start, end = part * PART_SIZE, min((part + 1) * PART_SIZE, a["n_samples"])
    reads = range(start // size, (end - 1) // size + 1)
    whole = range(-(-start // size), end // size)  # buckets wholly inside the part: write_part deletes them
    return StepIO(
        inputs=[f"buckets/b{bucket:05d}.p*.arrow" for bucket in reads],
        outputs=[f"buckets/write.{part_name(part)}.done"],
        consumed=[f"buckets/b{bucket:05d}.p*.arrow" for bucket in whole],
    )


STEP_IO: dict[str, Callable[[dict[str, Any]], StepIO]] = {
    "run_scan_task": _scan_io,
    "run_user_table_task": _user_table_io,
    "kcore_item_counts": _kcore_io,
    "run_partition": _partition_io,
    "write_part": _write_io,
}


@dataclass(frozen=True)
class RemoteStep:
    """``fn`` run with its work files synchronised with ``work`` (see the module docstring); named
    as ``fn`` so the executors' per-step logs and test hooks see the step."""

    work: RemoteWork
    fn: Callable[..., Any]

    @property
    def __name__(self) -> str:
        return self.fn.__name__

    def __call__(self, *args: Any) -> Any:
        io = STEP_IO[self.fn.__name__](inspect.signature(self.fn).bind(*args).arguments)
        self.work.pull(io.inputs)
        result = self.fn(*args)
        self.work.push(io.outputs)
        self.work.delete(io.consumed)
        return result


def remote_step(work: RemoteWork, fn: Callable[..., Any]) -> RemoteStep:
    """``fn`` as a ``RemoteStep``; a step that has not declared its files cannot use a remote work dir."""
    if fn.__name__ not in STEP_IO:
        raise ValueError(f"step {fn.__name__} cannot run with an s3:// --work-dir (no STEP_IO entry)")
    return RemoteStep(work, fn)


__all__ = ["STEP_IO", "RemoteStep", "RemoteWork", "StepIO", "mirror_path", "remote_step"]
