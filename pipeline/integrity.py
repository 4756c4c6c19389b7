"""Integrity of a prepared dataset: the manifest's ``files`` table, safe shard paths, hash checks.

``manifest.json`` lists every file ``prepare`` published (relative path, size, xxh64) and is written
last. Readers compare the dataset against it so that damage is found where it happens and named:

- on open, one listing of the dataset: every listed file exists and has its size (a deleted or
  truncated shard is an error naming it before any row is read);
- the small metadata files (``index.json``, ``micro_batch_offsets.npy``) are hashed on every open;
- a shard's header is checked when it is first read, and its hash too unless ``verify=False``.

xxh64 because it is what the shard writer records in ``index.json``, as ``MDSWriter(hashes=[...])``
does (so shard hashes are computed once, in the writer, over bytes already in memory) and it hashes
at memory speed; ``xxhash`` comes with mosaicml-streaming.

Shard names come from ``index.json``, which may be remote and crafted: mosaicml-streaming joins them
onto the cache directory, so ``../x`` or ``/x`` would write (and evict) files anywhere.
``check_index`` refuses such names before ``StreamingDataset`` sees the index.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np
import pyarrow.fs as pafs
import xxhash

from freescale import storage
from freescale.pipeline.dataset.manifest import FileEntry, Manifest, ManifestError

HASH_ALGO = "xxh64"
_CHUNK = 8 * 2**20
_DRIVE = re.compile(r"^[A-Za-z]:")


class IntegrityError(ManifestError):
    """A file of a prepared dataset is missing or differs from what the manifest recorded."""


def xxh64_stream(stream: BinaryIO) -> str:
    """The xxh64 hex digest of everything left in ``stream``, read in chunks (shards are large)."""
    digest = xxhash.xxh64()
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_hash(uri: str) -> str:
    fs, path = storage.filesystem(uri)
    with fs.open_input_stream(path) as stream:
        return xxh64_stream(stream)


def safe_relative_path(name: object, where: str) -> str:
    """``name`` if it is a plain relative POSIX path that stays inside the dataset root, else an error.

    Refused: non-strings, empty names, absolute paths, ``..`` or ``.`` components, empty components,
    backslashes and drive letters (Windows paths), control characters."""
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where}: file name {name!r} is not a non-empty string")
    if "\\" in name or _DRIVE.match(name) or any(ord(ch) < 32 for ch in name):
        raise ManifestError(f"{where}: unsafe file name {name!r} (backslash, drive letter or control character)")
    if posixpath.isabs(name):
        raise ManifestError(f"{where}: unsafe file name {name!r} (absolute path)")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ManifestError(f"{where}: unsafe file name {name!r} (leaves the dataset directory or is not normalized)")
    return name


def check_index(data: bytes, where: str) -> list[dict[str, Any]]:
    """The shards of an MDS ``index.json`` (bytes), with every file name checked by ``safe_relative_path``."""
    try:
        index = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ManifestError(f"{where} is not valid JSON ({error})") from error
    shards = index.get("shards") if isinstance(index, dict) else None
    if not isinstance(shards, list) or index.get("version") != 2:
        raise ManifestError(f"{where}: not an MDS index (version 2 with a list of shards)")
    for number, shard in enumerate(shards):
        if not isinstance(shard, dict) or shard.get("format") != "mds" or not isinstance(shard.get("raw_data"), dict):
            raise ManifestError(f"{where}: shard {number} is not an MDS shard with raw_data")
        for key in ("raw_data", "zip_data"):
            if shard.get(key) is not None:
                safe_relative_path(shard[key].get("basename"), f"{where}: shard {number} {key}")
        if not isinstance(shard.get("samples"), int) or shard["samples"] < 0:
            raise ManifestError(f"{where}: shard {number} has no valid sample count")
    return shards


def file_table(output: str, names: Iterable[str], shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's ``files`` table: ``names`` hashed here, shards from the hashes the shard writer
    (``steps.mds_shards``) recorded in the index (computed over the bytes it wrote). Sorted by path."""
    table = {name: {"path": name, "bytes": storage.size(storage.join(output, name))} for name in names}
    for name in table:
        table[name][HASH_ALGO] = file_hash(storage.join(output, name))
    for shard in shards:
        raw = shard["raw_data"]
        if HASH_ALGO not in raw.get("hashes", {}):
            raise IntegrityError(f"{output}: shard {raw['basename']} was written without an {HASH_ALGO} hash")
        table[raw["basename"]] = {
            "path": raw["basename"],
            "bytes": int(raw["bytes"]),
            HASH_ALGO: raw["hashes"][HASH_ALGO],
        }
    return [table[name] for name in sorted(table)]


def files_by_path(manifest: Manifest) -> dict[str, FileEntry] | None:
    """The manifest's ``files`` table keyed by path (each path checked to stay inside the dataset), or
    None for a dataset prepared before the table existed."""
    if manifest.files is None:
        return None
    return {safe_relative_path(entry.path, f"{manifest.where}: files"): entry for entry in manifest.files}


def check_listing(dataset: str, files: dict[str, FileEntry]) -> None:
    """Every listed file exists with its recorded size: one listing of the dataset (one request per
    1,000 objects on S3), so a deleted or truncated shard is named before any row is read."""
    fs, root = storage.filesystem(dataset)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    sizes = {posixpath.relpath(i.path, root): i.size for i in infos if i.type == pafs.FileType.File}
    for path, entry in files.items():
        uri = storage.join(dataset, path)
        if path not in sizes:
            raise IntegrityError(f"{uri}: missing (listed in the manifest); re-run `freescale prepare --overwrite`")
        if sizes[path] != entry.bytes:
            raise IntegrityError(
                f"{uri}: size {sizes[path]} != {entry.bytes} bytes recorded in the manifest "
                "(truncated or replaced); re-run `freescale prepare --overwrite`"
            )


def check_bytes(uri: str, data: bytes, entry: FileEntry | None) -> None:
    """``data`` (read from ``uri``) has the size and hash its manifest entry records."""
    if entry is None:
        return
    if len(data) != entry.bytes:
        raise IntegrityError(f"{uri}: size {len(data)} != {entry.bytes} bytes recorded in the manifest")
    if xxhash.xxh64(data).hexdigest() != entry.xxh64:
        raise IntegrityError(f"{uri}: {HASH_ALGO} hash mismatch with the manifest (the file was modified or damaged)")


def check_shard(handle: BinaryIO, label: str, samples: int, entry: FileEntry | None, verify: bool) -> None:
    """A shard on local disk, open as ``handle``: its header (sample count, offsets that end at the
    file's end) always — a cheap read that turns a damaged header into an error naming the shard
    instead of garbage rows or a decode error — and with ``verify`` its size and hash."""
    handle.seek(0)
    head = handle.read(4 + 4 * (samples + 1))
    handle.seek(0, 2)
    size = handle.tell()
    if entry is not None and size != entry.bytes:
        raise IntegrityError(f"{label}: size {size} != {entry.bytes} bytes recorded in the manifest (truncated?)")
    if len(head) < 4 + 4 * (samples + 1):
        raise IntegrityError(f"{label}: {size} bytes is too short for the header of {samples} samples (truncated?)")
    offsets = np.frombuffer(head[4:], "<u4").astype(np.int64)
    count = int.from_bytes(head[:4], "little")
    if count != samples or offsets[0] < len(head) or np.any(np.diff(offsets) < 0):
        raise IntegrityError(f"{label}: damaged shard header (sample count or offsets do not match the index)")
    if int(offsets[-1]) != size:
        raise IntegrityError(f"{label}: the header's last offset {int(offsets[-1])} != file size {size} (truncated?)")
    if verify and entry is not None:
        handle.seek(0)
        if xxh64_stream(handle) != entry.xxh64:
            raise IntegrityError(f"{label}: {HASH_ALGO} hash mismatch with the manifest (the shard is damaged)")


def verify_all(dataset: str, files: dict[str, FileEntry]) -> int:
    """Hash every listed file (``freescale inspect --verify``); returns the bytes checked."""
    check_listing(dataset, files)
    for path, entry in files.items():
        uri = storage.join(dataset, path)
        if file_hash(uri) != entry.xxh64:
            raise IntegrityError(
                f"{uri}: {HASH_ALGO} hash mismatch with the manifest (the file was modified or damaged)"
            )
    return sum(entry.bytes for entry in files.values())
