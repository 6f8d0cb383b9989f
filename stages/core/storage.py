"""All of FAR's I/O, over fsspec, so a local path, file://, memory:// and gs:// behave alike.

A plan (`far validate`, and the check that a run is already complete) reads a run it does
not write, and each of its checks asks storage again for what an earlier check read:
within `reads_once()` each read (an existence test, a file's bytes, a listing, a
directory's digests) goes to storage once and is remembered, and a write forgets what it
may change.

Orbax checkpoints are written by TensorStore/epath, which understand local paths and gs://
but not fsspec's in-process memory:// filesystem. For memory:// (used by tests and notebooks)
checkpoints are staged in a local mirror directory and published with `publish_tree`.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import hashlib
import json
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import fsspec

from stages.core.errors import InputError

ORBAX_NATIVE_PROTOCOLS = ("file", "gs")
R = TypeVar("R")
# within reads_once(): {(read, normalized uri, other arguments): its result}
_REMEMBERED: ContextVar[dict[tuple[Any, ...], Any] | None] = ContextVar("_REMEMBERED", default=None)


@contextlib.contextmanager
def reads_once() -> Iterator[None]:
    """Within it, each read below goes to storage once per URI and is remembered after.

    Nested, it keeps the outer scope's memory. A write or delete through this module forgets
    what it may change (the URI, its parents' listings and existence).

    Returns:
        A context manager; on leaving the outermost one, everything remembered is dropped.
    """
    if _REMEMBERED.get() is not None:
        yield
        return
    token = _REMEMBERED.set({})
    try:
        yield
    finally:
        _REMEMBERED.reset(token)


def _read_once(read: Callable[..., R]) -> Callable[..., R]:
    """`read(uri, ...)`, remembered within reads_once() (a copy of a list or dict result)."""

    @functools.wraps(read)
    def remembered(uri: str, *args: Any, **kwargs: Any) -> R:
        memory = _REMEMBERED.get()
        if memory is None:
            return read(uri, *args, **kwargs)
        key = (read.__name__, normalize(uri), args, tuple(sorted(kwargs.items())))
        if key not in memory:
            memory[key] = read(uri, *args, **kwargs)
        return copy.copy(memory[key])

    return remembered


def _forget(uri: str) -> None:
    """Drop what reads_once() remembers about `uri` and the directories above it."""
    memory = _REMEMBERED.get()
    if memory is None:
        return
    path = normalize(uri)
    for key in [k for k in memory if path == k[1] or path.startswith(k[1].rstrip("/") + "/")]:
        del memory[key]


def _split(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path


def protocol(uri: str) -> str:
    """'file' for local paths and file:// URIs, else the URI's scheme."""
    return uri.split("://", 1)[0] if "://" in uri else "file"


def normalize(uri: str) -> str:
    """Local paths become absolute; file://x becomes x; other URIs are kept as they are."""
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if "://" not in uri:
        return os.path.abspath(os.path.expanduser(uri))
    return uri.rstrip("/")


def nearest_existing(uri: str) -> str:
    """A local `uri`, or its nearest ancestor that exists (where writing it would create it);
    any other URI as it is (buckets and memory:// have no directories to create)."""
    if protocol(uri) != "file":
        return uri
    path = normalize(uri)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


@_read_once
def exists(uri: str) -> bool:
    fs, path = _split(uri)
    return bool(fs.exists(path))


@_read_once
def is_dir(uri: str) -> bool:
    """True when `uri` is a directory (a local one, or a prefix holding objects)."""
    fs, path = _split(uri)
    return bool(fs.isdir(path))


def check_export_target(out_uri: str) -> None:
    """An export writes a directory: an existing file there is refused, never overwritten."""
    if exists(out_uri) and not is_dir(out_uri):
        raise InputError(
            f"export target {out_uri} is a file; expected a directory (new or existing) to "
            f"write the Hugging Face model into"
        )


@_read_once
def read_bytes(uri: str) -> bytes:
    fs, path = _split(uri)
    try:
        return bytes(fs.cat_file(path))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"no such file: {uri}") from e
    except IsADirectoryError as e:
        raise IsADirectoryError(f"{uri} is a directory, not a file") from e


def read_lines(uri: str, limit: int, chunk: int = 1 << 16) -> Iterator[bytes | None]:
    """The file's lines (without their newline), read `chunk` bytes at a time and gunzipped
    on the way when the name ends in .gz. A line longer than `limit` bytes comes as None: its
    bytes are dropped as they arrive, so it is never held whole."""
    fs, path = _split(uri)
    compression = "gzip" if uri.lower().endswith(".gz") else None
    try:
        f = fs.open(path, "rb", compression=compression)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"no such file: {uri}") from e
    with f:
        yield from capped_lines(iter(lambda: f.read(chunk), b""), limit)


def capped_lines(chunks: Iterable[bytes], limit: int) -> Iterator[bytes | None]:
    """Lines split from `chunks`; None for one over `limit` bytes (see read_lines)."""
    pending, over = bytearray(), False
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            part = chunk[start:end]
            over = over or len(pending) + len(part) > limit
            yield None if over else bytes(pending + part)
            pending.clear()
            over, start = False, end + 1
        rest = chunk[start:]
        over = over or len(pending) + len(rest) > limit
        if over:
            pending.clear()
        else:
            pending += rest
    if over:
        yield None
    elif pending:
        yield bytes(pending)


# The stage directory this process works on now, and its write fence (stages/core/runner.py
# sets it around a stage's work): a write or delete under that directory, from any thread,
# calls the fence first, which raises once the session may no longer write there (its lease
# was taken over, or another session committed the directory). None outside a stage's work.
_write_guard: tuple[str, Callable[[], None]] | None = None


@contextlib.contextmanager
def guarding(directory: str, check: Callable[[], None]) -> Iterator[None]:
    """Within it, every write or delete through this module under `directory` calls `check`
    first.

    Args:
        directory: the stage directory (any protocol).
        check: raises when the directory may no longer be written.

    Returns:
        A context manager; the previous guard is back on leaving it.
    """
    global _write_guard
    previous, _write_guard = _write_guard, (normalize(directory).rstrip("/") + "/", check)
    try:
        yield
    finally:
        _write_guard = previous


def _guard(uri: str) -> None:
    guard = _write_guard
    if guard is not None and normalize(uri).startswith(guard[0]):
        guard[1]()


def write_bytes(uri: str, data: bytes) -> None:
    """Write atomically: readers see the old content or the new, never a torn file."""
    _guard(uri)
    _forget(uri)
    fs, path = _split(uri)
    parent = path.rsplit("/", 1)[0]
    if protocol(uri) == "file":
        fs.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            _write_synced(tmp, data)
            os.replace(tmp, path)
        except OSError as e:  # a full disk: leave no temporary file behind, name the file
            _remove_quietly(tmp)
            if e.filename is None:
                raise OSError(e.errno, e.strerror, path) from e
            raise
        except BaseException:
            _remove_quietly(tmp)
            raise
    else:  # object stores and memory:// replace an object in one call
        fs.pipe_file(path, data)


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# A write refused for want of space: ENOSPC or EDQUOT from Python, or the same from
# TensorStore (Orbax's writer), which reports it as RESOURCE_EXHAUSTED text naming the file.
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
_FAILED_PATH = re.compile(r'(?:Failed writing|local file):? "([^"]+)"')


def write_failure(error: BaseException) -> str | None:
    """'PATH: cause' when `error`, or one it was raised from, is a write that storage refused
    for want of space (a full disk or quota); None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return f"{current.filename or 'a file'}: {os.strerror(current.errno)}"
        text = str(current)
        cause = next((t for t in _FULL_TEXTS if t in text), None)
        if cause is not None:
            paths = _FAILED_PATH.findall(text)
            return f"{paths[-1] if paths else 'a file'}: {cause}"
        current = current.__cause__ or current.__context__
    return None


def delete(uri: str) -> None:
    """Remove one file or object; a missing one is not an error."""
    _guard(uri)
    _forget(uri)
    fs, path = _split(uri)
    if fs.exists(path):
        fs.rm_file(path)


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def read_json(uri: str) -> Any:
    return json.loads(read_text(uri))


def write_json(uri: str, obj: Any) -> None:
    write_text(uri, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@_read_once
def list_files(uri: str) -> dict[str, int]:
    """Every file under `uri`, as {relative path: size in bytes}; empty if `uri` is absent."""
    fs, path = _split(uri)
    if not fs.exists(path):
        return {}
    found = fs.find(path, detail=True)
    root = path.rstrip("/") + "/"
    return {name[len(root) :]: int(info["size"]) for name, info in found.items()}


def tree_fingerprint(uri: str) -> str:
    """A directory tree's content identity: sha256 over its (path, size, content digest) list.

    Each file's digest is the object store's own checksum where it keeps one (gs://: MD5, or
    CRC32C for composite objects), so fingerprinting a checkpoint on GCS downloads nothing;
    elsewhere the file's sha256 (see `file_digests`).
    """
    return digests_fingerprint(file_digests(uri))


def digests_fingerprint(digests: dict[str, tuple[int, str]]) -> str:
    """sha256 over a {relative path: (size, digest)} map, in path order."""
    listing = [[rel, size, digest] for rel, (size, digest) in sorted(digests.items())]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


@_read_once
def file_digests(uri: str, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, str]]:
    """{relative path: (size, digest)} for every file under `uri`, except names in `skip`.

    The digest is "md5:<base64>" or "crc32c:<base64>" when the object store keeps that
    checksum in its metadata (read from the one listing call, no download), otherwise
    "sha256:<hex>" of the bytes, read in 8 MiB chunks. Empty if `uri` is absent.
    """
    fs, path = _split(uri)
    if not fs.exists(path):
        return {}
    root = path.rstrip("/") + "/"
    out: dict[str, tuple[int, str]] = {}
    for name, info in sorted(fs.find(path, detail=True).items()):
        rel = name[len(root) :]
        if rel.rsplit("/", 1)[-1] in skip:
            continue
        out[rel] = (int(info["size"]), stored_checksum(info) or _sha256_of(fs, name))
    return out


def stored_checksum(info: dict[str, Any]) -> str | None:
    """The checksum an object store keeps for an object (GCS: md5Hash, crc32c), if any."""
    if info.get("md5Hash"):
        return f"md5:{info['md5Hash']}"
    if info.get("crc32c"):
        return f"crc32c:{info['crc32c']}"
    return None


def _sha256_of(fs: fsspec.AbstractFileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


@_read_once
def sha256_file(uri: str) -> str:
    """A file's "sha256:<hex>", read in 8 MiB chunks."""
    fs, path = _split(uri)
    return _sha256_of(fs, path)


def sha256_bytes(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@_read_once
def content_fingerprint(uri: str) -> str:
    """A file's content identity: the object store's checksum if it keeps one, else sha256."""
    fs, path = _split(uri)
    try:
        info = fs.info(path)
    except FileNotFoundError as e:  # HTTP filesystems also say this for a 5xx: kept as cause
        raise FileNotFoundError(f"cannot read {uri}: no such file, or the server failed") from e
    return stored_checksum(info) or _sha256_of(fs, path)


def list_dirs(uri: str) -> list[str]:
    """Names of the directories directly under `uri` (empty if `uri` is absent)."""
    return _names_under(uri, "directory")


def list_names(uri: str) -> list[str]:
    """Names of the files directly under `uri` (not below; empty if `uri` is absent)."""
    return _names_under(uri, "file")


@_read_once
def _names_under(uri: str, kind: str) -> list[str]:
    fs, path = _split(uri)
    if not fs.exists(path):
        return []
    entries = fs.ls(path, detail=True)
    return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == kind)


def copy_tree(src: str, dst: str) -> None:
    """Copy every file under `src` to the same relative paths under `dst` (any protocols)."""
    for rel in list_files(src):
        write_bytes(join(dst, rel), read_bytes(join(src, rel)))


def orbax_directory(uri: str) -> str:
    """Where Orbax should read and write the checkpoints that belong at `uri`.

    Local paths and gs:// are used directly. Other protocols get a local mirror directory;
    call `publish_tree(mirror, uri)` after saving and `fetch_tree(uri)` before restoring.
    """
    if protocol(uri) in ORBAX_NATIVE_PROTOCOLS:
        return uri
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "far-orbax-mirror", digest)


def local_directory(uri: str) -> str:
    """A local directory for writers that only write local files (e.g. TensorBoard).

    Local URIs are used directly; others get a mirror, published by publish_local_directory.
    """
    if protocol(uri) == "file":
        path = normalize(uri)
        os.makedirs(path, exist_ok=True)
        return path
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), "far-local-mirror", digest)
    os.makedirs(path, exist_ok=True)
    return path


def publish_local_directory(local_dir: str, uri: str) -> None:
    """Copy a local mirror (see local_directory) to `uri`; nothing when `uri` is that directory.
    Each file is a write through this module, so a stage's write guard (`guarding`) asks its
    fence before each."""
    if local_dir != normalize(uri):
        upload_tree(local_dir, uri)


def upload_tree(local_dir: str, uri: str) -> None:
    """Copy every file under a local directory to the same relative paths under `uri`."""
    for rel in list_files(local_dir):
        with open(os.path.join(local_dir, rel), "rb") as f:
            write_bytes(join(uri, rel), f.read())


def publish_tree(local_dir: str, uri: str) -> None:
    """Copy a checkpoint's local mirror to `uri` (no-op when Orbax wrote `uri` directly)."""
    if orbax_directory(uri) != uri:
        upload_tree(local_dir, uri)


def fetch_tree(uri: str) -> str:
    """A directory Orbax can restore from, holding the tree at `uri`."""
    local = orbax_directory(uri)
    if local == uri:
        return uri
    fs, path = _split(uri)
    for rel in list_files(uri):
        target = os.path.join(local, rel)
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fs.get_file(f"{path}/{rel}", target)
    return local


# OS-level network failures that a retry can outlive. Plain ConnectionError is not here: FAR
# raises it for "the hub is unreachable from this machine", which a retry will not fix.
_TRANSIENT_OS_ERRORS = (
    TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    ConnectionRefusedError,
    BrokenPipeError,
)
_TRANSIENT_HTTP_CODES = {408, 429, 500, 502, 503, 504}


def is_transient(error: BaseException) -> bool:
    """True for storage/network errors worth retrying: 5xx, 429, timeouts, dropped connections.

    Looks through the chain of causes (`raise ... from e`) so a wrapped error still counts.
    """
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None or isinstance(seen, InputError):
            return False
        if isinstance(seen, _TRANSIENT_OS_ERRORS) or _is_transient_library_error(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _is_transient_library_error(error: BaseException) -> bool:
    """gcsfs/google HTTP errors by status code; aiohttp and requests connection failures."""
    name = type(error).__name__
    code = {"HttpError": "code", "ClientResponseError": "status"}.get(name)
    if code is not None and isinstance(getattr(error, code, None), int):
        return getattr(error, code) in _TRANSIENT_HTTP_CODES
    module = type(error).__module__
    transient_names = (
        "ServerDisconnectedError",
        "ClientConnectorError",
        "ClientOSError",
        "ServerTimeoutError",
        "ConnectionError",
        "ReadTimeout",
        "ChunkedEncodingError",
        "TransportError",
    )
    from_network_library = module.split(".")[0] in ("aiohttp", "requests", "google", "urllib3")
    return from_network_library and name in transient_names


# Conditional writes: the primitives a run lease needs (one writer per run). A "version" names
# one state of an object: its generation on gs://, (inode, mtime, size) locally. Locally an
# flock on a sidecar file makes compare-and-replace atomic between processes of one host.


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create `uri` with `data` only if it does not exist; False if it already did.

    Local: the bytes go to a temporary file hard-linked into place (link fails if the name
    exists), so a reader never sees a partial file. gs://: an upload with the precondition
    ifGenerationMatch=0. memory://: check then write (one process only).
    """
    _forget(uri)
    fs, path = _split(uri)
    kind = protocol(uri)
    if kind == "file":
        return _create_exclusive_local(path, data)
    if kind == "gs":
        return _gcs_upload_if(fs, path, data, generation="0")
    if fs.exists(path):
        return False
    fs.pipe_file(path, data)
    return True


def read_versioned(uri: str) -> tuple[bytes, str] | None:
    """The object's bytes and version, or None when it does not exist."""
    fs, path = _split(uri)
    kind = protocol(uri)
    try:
        if kind == "gs":
            info = fs.info(path, refresh=True)
            data = bytes(fs.cat_file(path, generation=info["generation"]))
            return data, str(info["generation"])
        if kind == "file":
            with open(path, "rb") as f:
                return f.read(), _local_version(os.fstat(f.fileno()))
        data = bytes(fs.cat_file(path))
        return data, hashlib.sha256(data).hexdigest()
    except FileNotFoundError:
        return None


def replace_if_version(uri: str, data: bytes | None, version: str) -> bool:
    """Replace (or with data=None delete) `uri` only if it is still at `version`."""
    _forget(uri)
    fs, path = _split(uri)
    kind = protocol(uri)
    if kind == "gs":
        if data is None:
            return _gcs_delete_if(fs, path, version)
        return _gcs_upload_if(fs, path, data, generation=version)
    if kind == "file":
        return _replace_local_if(path, data, version)
    current = read_versioned(uri)
    if current is None or current[1] != version:
        return False
    if data is None:
        fs.rm_file(path)
    else:
        fs.pipe_file(path, data)
    return True


def _local_version(stat: os.stat_result) -> str:
    return f"{stat.st_ino}-{stat.st_mtime_ns}-{stat.st_size}"


def _create_exclusive_local(path: str, data: bytes) -> bool:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        _write_synced(tmp, data)
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        _remove_quietly(tmp)
    return True


def _replace_local_if(path: str, data: bytes | None, version: str) -> bool:
    import fcntl  # POSIX only, like the rest of FAR's local runs

    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not os.path.exists(path) or _local_version(os.stat(path)) != version:
                return False
            if data is None:
                os.unlink(path)
            else:
                write_bytes(path, data)
            return True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _gcs_upload_if(fs: fsspec.AbstractFileSystem, path: str, data: bytes, generation: str) -> bool:
    """Upload with the GCS precondition ifGenerationMatch (0: only if absent); False on 412.

    A multipart upload (metadata part, then the bytes), as gcsfs itself uploads small files.
    """
    bucket, key = path.split("/", 1)
    boundary = f"far-{uuid.uuid4().hex}"
    body = (
        (
            f"--{boundary}\nContent-Type: application/json; charset=UTF-8\n\n"
            f"{json.dumps({'name': key})}\n--{boundary}\n"
            "Content-Type: application/octet-stream\n\n"
        ).encode()
        + data
        + f"\n--{boundary}--".encode()
    )
    try:
        fs.call(
            "POST",
            f"{fs._location}/upload/storage/v1/b/{{}}/o",  # the JSON API's upload endpoint
            bucket,
            uploadType="multipart",
            ifGenerationMatch=generation,
            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
            data=body,
        )
    except FileExistsError:  # gcsfs raises it for HTTP 412 Precondition Failed
        return False
    fs.invalidate_cache(path)
    return True


def _gcs_delete_if(fs: fsspec.AbstractFileSystem, path: str, generation: str) -> bool:
    bucket, key = path.split("/", 1)
    try:
        fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=generation)
    except (FileExistsError, FileNotFoundError):
        return False
    fs.invalidate_cache(path)
    return True


def check_regular_target(uri: str, what: str) -> None:
    """A file FAR writes at a path the user gave (`what`, e.g. the flag): a regular file or a
    new path, never a device, FIFO, socket, directory or symlink, which an atomic write would
    replace with a regular file (as root, /dev/null itself)."""
    if protocol(uri) != "file":
        return
    path = normalize(uri)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise InputError(
            f"{what} {uri}: is {_file_kind(mode)}, not a regular file; FAR writes only to a "
            f"regular file (replaced) or a new path: give one"
        )


def _file_kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "a special file")
