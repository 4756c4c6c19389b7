"""The shard files one process reads from a prepared dataset: fetched, checked once, then held open.

A reader keeps the manifest, index and offsets it opened: the plan. Reading another dataset's shard
bytes under that plan would yield wrong rows without any error, and that is what re-preparing the
same output does to a reader that is still open: ``prepare --overwrite`` swaps a new local directory
in at the same path (``output.publish_local``), and an ``s3://`` output is rewritten in place. So:

- a shard file is opened once per process, when it is first read, and then held open (at most
  ``MAX_HELD`` files; the least recently used is closed and opened again, and checked again, when
  next read): the bytes a reader checked are the bytes it reads, even after the path has been
  given to a new dataset or the old files deleted (an open file outlives its name on POSIX);
- a shard opened after the reader was opened is checked to belong to the same dataset first
  (``DatasetIdentity``: the dataset directory's inode, or the ``s3://`` manifest's size and time),
  and a reader whose dataset changed stops with one line naming it (``DatasetChangedError``);
- a cached copy of an ``s3://`` shard that fails its check is removed and downloaded once more
  (a damaged cache would otherwise fail every run the same way); if that copy fails too, the error
  names the cache path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from freescale import storage
from freescale.pipeline.dataset.manifest import MANIFEST_NAME, FileEntry
from freescale.pipeline.integrity import IntegrityError, check_shard

MAX_HELD = 256  # shard files one process holds open (a shard is 64 MB by default: 16 GB of data)


class DatasetChangedError(IntegrityError):
    """The dataset was replaced (prepared again) while this reader had it open."""


@dataclass(frozen=True)
class DatasetIdentity:
    """Which dataset a URI holds now: the directory's (device, inode) for a local dataset (a swapped-in
    directory has another inode), the manifest object's (size, mtime) on ``s3://`` (rewritten last
    by every ``prepare``; absent while one runs)."""

    uri: str
    token: tuple[int, ...] | None

    @classmethod
    def of(cls, uri: str) -> DatasetIdentity:
        if storage.is_remote(uri):
            fs, path = storage.filesystem(storage.join(uri, MANIFEST_NAME))
            info = fs.get_file_info(path)
            found = info.type == pafs.FileType.File
            return cls(uri, (int(info.size), int(info.mtime_ns or 0)) if found else None)
        try:
            stat = os.stat(uri)
        except FileNotFoundError:
            return cls(uri, None)
        return cls(uri, (stat.st_dev, stat.st_ino))

    def check(self) -> None:
        """Raise ``DatasetChangedError`` unless the URI still holds the dataset this was taken of."""
        if DatasetIdentity.of(self.uri).token != self.token:
            raise DatasetChangedError(
                f"{self.uri} was replaced (prepared again?) while this reader had it open: its files no longer "
                "match the manifest and plan the reader holds; open the dataset again (restart the run)"
            )


class ShardFiles:
    """Shard ``i`` of ``shards`` (index entries) of the dataset ``identity.uri``, local or cached in
    ``cache_dir``, as an open file descriptor checked against ``files`` (the manifest's table)."""

    def __init__(
        self,
        identity: DatasetIdentity,
        shards: list[dict[str, Any]],
        files: dict[str, FileEntry] | None,
        verify: bool,
        cache_dir: str | None,
    ) -> None:
        self.identity, self.shards, self.files, self.verify = identity, shards, files, verify
        self.remote = storage.is_remote(identity.uri)
        self.root = cache_dir if self.remote else identity.uri
        self.held: OrderedDict[int, int] = OrderedDict()  # shard id -> fd, least recently used first

    def __getstate__(self) -> dict[str, Any]:
        """Pickled into a loader worker: descriptors do not travel (it opens and checks its own)."""
        return {**self.__dict__, "held": OrderedDict()}

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit os may be gone: the OS closes them then
            self.close()

    def close(self) -> None:
        for fd in self.held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.held.clear()

    def name(self, shard_id: int) -> str:
        return self.shards[shard_id]["raw_data"]["basename"]

    def local_path(self, shard_id: int) -> str:
        return os.path.join(self.root, self.name(shard_id))

    def fetch(self, shard_id: int, again: bool = False) -> str:
        """The local path of a shard, downloaded first for ``s3://`` (``again``: the cached copy is
        removed and downloaded anew). One process downloads a shard; others that need it at the same
        time (ranks, loader workers, the loader's prefetch thread) wait on a lock file beside it."""
        local = self.local_path(shard_id)
        if not self.remote or (os.path.isfile(local) and not again):
            return local
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(f"{local}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if again:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(local)  # processes holding it open keep reading their copy
            if not os.path.isfile(local):
                storage.download(storage.join(self.identity.uri, self.name(shard_id)), local)
        return local

    def fd(self, shard_id: int) -> tuple[int, bool]:
        """An open, checked descriptor of the shard, and whether it was opened (and checked) just now."""
        fd = self.held.get(shard_id)
        if fd is not None:
            self.held.move_to_end(shard_id)
            return fd, False
        fd = self._open_checked(shard_id)
        self.held[shard_id] = fd
        while len(self.held) > MAX_HELD:
            os.close(self.held.popitem(last=False)[1])
        return fd, True

    def _label(self, shard_id: int) -> str:
        label = storage.join(self.identity.uri, self.name(shard_id))
        return f"{label} (cached as {self.local_path(shard_id)})" if self.remote else label

    def _open_checked(self, shard_id: int) -> int:
        """Open the shard, check it is this reader's dataset (then the descriptor is too, whatever
        happens to the path later), then its header and (``verify``) its hash; a damaged cached copy
        is downloaded once more."""
        fd = self._open(shard_id, again=False)
        try:
            self._check(fd, shard_id)
            return fd
        except DatasetChangedError:
            os.close(fd)
            raise
        except IntegrityError as error:
            os.close(fd)
            if not self.remote:
                raise
            first = error
        fd = self._open(shard_id, again=True)
        try:
            self._check(fd, shard_id)
        except IntegrityError as error:
            os.close(fd)
            if isinstance(error, DatasetChangedError):
                raise
            raise IntegrityError(
                f"{error}, also after the damaged cached copy was removed and downloaded again: the object "
                f"in {self.identity.uri} differs from its manifest; re-run `freescale prepare --overwrite`"
            ) from first
        return fd

    def _open(self, shard_id: int, again: bool) -> int:
        local = self.fetch(shard_id, again)
        try:
            return os.open(local, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self.identity.check()  # a shard gone because the dataset was replaced says so
            raise IntegrityError(f"{self._label(shard_id)}: missing; re-run `freescale prepare --overwrite`") from None

    def _check(self, fd: int, shard_id: int) -> None:
        self.identity.check()  # after the open: the descriptor is this dataset's file
        entry = None if self.files is None else self.files[self.name(shard_id)]
        with open(fd, "rb", closefd=False) as handle:
            check_shard(handle, self._label(shard_id), int(self.shards[shard_id]["samples"]), entry, self.verify)


def read_at(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset`` of an open file (fewer at its end): no seek, so descriptors can be
    shared with forked loader workers."""
    parts, done = [], 0
    while done < size:
        chunk = os.pread(fd, size - done, offset + done)
        if not chunk:
            break
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)
