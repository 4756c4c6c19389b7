"""One way to reach local paths and ``s3://`` URIs from every part of FreeScale.

Sources, prepared datasets and caches can live on local disk or in object storage. Everything goes
through pyarrow filesystems so that readers (pyarrow/polars), writers and the trainer agree on
credentials and endpoints. An S3-compatible endpoint (MinIO, a moto server in tests) is taken from
``S3_ENDPOINT_URL`` (the variable mosaicml-streaming reads) or ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import tempfile
import tomllib
from pathlib import Path

import pyarrow.fs as pafs


def is_remote(uri: str) -> bool:
    """True for object-storage URIs (``s3://``), False for local paths."""
    return uri.startswith("s3://")


def s3_endpoint() -> str | None:
    """The S3 endpoint override, if any (``S3_ENDPOINT_URL`` first, as mosaicml-streaming does)."""
    return os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL") or None


def _s3_filesystem() -> pafs.S3FileSystem:
    endpoint = s3_endpoint()
    kwargs: dict = {"region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    if endpoint:
        scheme, _, rest = endpoint.partition("://")
        kwargs["endpoint_override"] = rest or endpoint
        kwargs["scheme"] = scheme if rest else "https"
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        kwargs["access_key"] = os.environ["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    return pafs.S3FileSystem(**kwargs)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for ``uri`` and the path to use with it."""
    if is_remote(uri):
        return _s3_filesystem(), uri[len("s3://") :]
    return pafs.LocalFileSystem(), str(Path(uri).expanduser().absolute())


def join(base: str, *parts: str) -> str:
    """Join path parts under a local directory or an ``s3://`` prefix."""
    if is_remote(base):
        return posixpath.join(base, *parts)
    return str(Path(base, *parts))


def resolve(path: str, base_dir: str) -> str:
    """Resolve ``path`` relative to ``base_dir`` unless it is absolute or a URI."""
    if is_remote(path) or os.path.isabs(path):
        return path
    return join(base_dir, path)


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    with fs.open_input_stream(path) as stream:
        return stream.read()


def read_text(uri: str, what: str) -> str:
    """A small file a user names (a config, a cost model) as UTF-8 text. One that cannot be read (missing,
    a directory, no permission, not UTF-8) is a ``ValueError`` naming ``what`` and the file, one line."""
    try:
        return read_bytes(uri).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{what} {uri}: cannot read it: {' '.join(str(error).split())}") from error


def read_toml(uri: str, what: str) -> dict:
    """``read_text`` parsed as TOML; invalid TOML is a ``ValueError`` naming ``what`` and the file."""
    text = read_text(uri, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{what} {uri}: not valid TOML ({error})") from error


DOWNLOAD_CHUNK = 8 * 2**20
DOWNLOAD_THREADS = 8


def download(uri: str, local_path: str) -> None:
    """Copy one object to ``local_path`` atomically (a temporary file renamed into place), reading
    ``DOWNLOAD_CHUNK`` ranges on ``DOWNLOAD_THREADS`` threads: one GET stream of a 64 MB shard is
    latency-bound, and boto3 (what mosaicml-streaming uses) reads large objects in parallel ranges too."""
    from concurrent.futures import ThreadPoolExecutor

    fs, path = filesystem(uri)
    tmp = f"{local_path}.tmp-{os.getpid()}"
    with fs.open_input_file(path) as source, open(tmp, "wb") as target:
        size = source.size()
        target.truncate(size)
        fd = target.fileno()

        def copy(offset: int) -> None:
            os.pwrite(fd, source.read_at(min(DOWNLOAD_CHUNK, size - offset), offset), offset)

        with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
            list(pool.map(copy, range(0, size, DOWNLOAD_CHUNK)))
    os.replace(tmp, local_path)


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object; local writes go through a temp file so readers never see half a file."""
    fs, path = filesystem(uri)
    if is_remote(uri):
        with fs.open_output_stream(path) as stream:
            stream.write(data)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # a full disk, an interrupt: leave no partial file behind
        raise


def local_write_problem(directory: str) -> str | None:
    """Why files cannot be created in the local ``directory``, or None. A directory still to be made is
    judged by its nearest existing ancestor (where it would be created); nothing is left behind. Asked
    before a job's work, so that a read-only place is one line up front, not a traceback at the end."""
    path = Path(directory).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        return f"{path} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=path):  # O_TMPFILE where the file system has it: no name appears
            pass
    except OSError as error:
        return f"cannot write in {path}: {error.strerror or error}"
    return None


def size(uri: str) -> int:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).size or 0


def expand(pattern: str) -> list[str]:
    """Expand a glob (``*``, ``?``, ``[..]`` in the last components) into sorted file URIs.

    A pattern without wildcards that names a directory expands to the files inside it. A pattern that
    matches nothing returns an empty list; callers turn that into an error naming the source.
    """
    fs, path = filesystem(pattern)
    prefix = "s3://" if is_remote(pattern) else ""
    if not any(ch in path for ch in "*?["):
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [pattern]
        if info.type == pafs.FileType.Directory:
            infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
            return sorted(prefix + i.path for i in infos if i.type == pafs.FileType.File)
        return []
    parts = path.split("/")
    first_wild = next(i for i, part in enumerate(parts) if any(ch in part for ch in "*?["))
    root = "/".join(parts[:first_wild]) or "/"
    root_info = fs.get_file_info(root)
    if root_info.type != pafs.FileType.Directory:
        return []
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    matches = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, path)]
    return sorted(prefix + m for m in matches)
