"""The bytes of a model file: a JSON header and raw blobs, sealed by a checksum.

Layout (little-endian)::

    0    magic  b"GEODEMDL"
    8    u32    format version (:data:`FORMAT_VERSION`)
    12   u32    flags (0)
    16   u64    header length H
    24   H      header: UTF-8 JSON (what the model is; blobs by index)
    ...         blobs, each starting on a 64-byte boundary (object code, tensor data)
    end-32      sha256 of every byte before it

Data only: the header is JSON and the blobs are bytes that the reader turns into
arrays of a dtype and shape the header names, or into object code. A file whose
checksum does not match (truncated, altered) is refused before anything in it is used.
Writing goes to a temporary file in the same folder, then replaces the target at once:
a crash never leaves half a model file under the user's name.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.errors import ModelFileError
from geode.safe_files import atomic_writer, read_file, umask

MAGIC = b"GEODEMDL"
#: bump when the layout or the header's meaning changes; files of other versions are refused
FORMAT_VERSION = 2
_PREFIX = struct.Struct("<8sIIQ")
_DIGEST = 32
_ALIGN = 64
#: a header larger than this is refused unread
MAX_HEADER = 1 << 30


def _pad(n: int) -> int:
    return -n % _ALIGN


@dataclass
class Writer:
    """Collects blobs, then writes the file (:meth:`write`)."""

    _blobs: list[bytes | memoryview] = field(default_factory=list)
    _offsets: list[tuple[int, int]] = field(default_factory=list)
    _size: int = 0

    def add(self, data: bytes | np.ndarray) -> int:
        """Add a blob (an array's bytes in C order); returns its index."""
        if isinstance(data, np.ndarray):  # its bytes (an empty or 0-d array too)
            data = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        start = self._size + _pad(self._size)
        self._blobs.append(data)
        self._offsets.append((start, len(data)))
        self._size = start + len(data)
        return len(self._blobs) - 1

    @property
    def size(self) -> int:
        """Bytes of the blobs added so far (with their alignment)."""
        return self._size

    def blobs(self) -> list[bytes | memoryview]:
        """The blobs added so far, in order."""
        return list(self._blobs)

    def write(
        self, path: str | os.PathLike, header: dict[str, Any], overwrite: bool, sync: bool = True
    ) -> int:
        """Write the file atomically; returns its size in bytes. ``sync``: flushed to the
        disk before it replaces ``path`` (a file the user keeps; the model cache's entries,
        whose digest a load checks, are not)."""
        target = writable_target(path, overwrite)
        head = json.dumps({**header, "blobs": self._offsets}, separators=(",", ":")).encode()
        prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(head))
        first = len(prefix) + len(head)
        digest = hashlib.sha256()
        written = 0
        try:  # the mode a plain ``open`` would give it (mkstemp's is 0600)
            with atomic_writer(target, mode=0o666 & ~umask(), sync=sync) as f:

                def put(chunk: bytes | memoryview) -> None:
                    nonlocal written
                    f.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)

                put(prefix)
                put(head)
                put(b"\0" * _pad(first))
                base = written
                for blob, (start, _) in zip(self._blobs, self._offsets):
                    put(b"\0" * (base + start - written))
                    put(blob)
                f.write(digest.digest())
        except OSError as exc:
            raise ModelFileError(f"model file {target!r}: cannot write it: {exc}") from None
        return written + _DIGEST


def writable_target(path: str | os.PathLike, overwrite: bool) -> str:
    """The path to write a model file to, refusing what would lose the user's data: an
    existing file that is not a geode model file (unless ``overwrite``), a folder or
    anything else that is not a regular file, a folder that does not exist."""
    try:
        target = os.fspath(path)
    except TypeError:
        raise ModelFileError(f"a model file path must be a str or path, got {path!r}") from None
    if isinstance(target, bytes):
        target = os.fsdecode(target)
    if not target or "\0" in target:
        raise ModelFileError(f"bad model file path {target!r}")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise ModelFileError(f"model file {target!r}: folder {folder!r} does not exist")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise ModelFileError(f"model file {target!r}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelFileError(f"model file {target!r}: exists and is not a regular file")
    if not overwrite and not _is_model_file(target):
        raise ModelFileError(
            f"model file {target!r}: a file that is not a geode model file is there; "
            "refusing to overwrite it (pass overwrite=True)"
        )
    return target


def _is_model_file(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return os.read(fd, len(MAGIC)) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def is_model_file(path: Any) -> bool:
    """Whether ``path`` names a regular file that starts like a geode model file."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    try:
        p = os.fspath(path)
        return stat.S_ISREG(os.stat(p).st_mode) and _is_model_file(p)
    except (OSError, TypeError, ValueError):
        return False


@dataclass
class Container:
    """A model file read and checked: its ``header`` and its blobs."""

    path: str
    header: dict[str, Any]
    data: bytes
    base: int
    blobs: list[tuple[int, int]]

    def blob(self, index: Any) -> memoryview:
        """Blob ``index``'s bytes."""
        if not isinstance(index, int) or isinstance(index, bool):
            raise ModelFileError(f"model file {self.path!r}: bad blob reference {index!r}")
        if not 0 <= index < len(self.blobs):
            raise ModelFileError(f"model file {self.path!r}: no blob {index}")
        start, size = self.blobs[index]
        return memoryview(self.data)[self.base + start : self.base + start + size]

    def array(self, index: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Blob ``index`` as a read-only array of ``dtype`` and ``shape``."""
        raw = self.blob(index)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * dtype.itemsize != len(raw):
            raise ModelFileError(
                f"model file {self.path!r}: blob {index} holds {len(raw)} bytes, "
                f"not a {dtype}{list(shape)} array"
            )
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def read(path: str | os.PathLike) -> Container:
    """Read and check a model file: a regular file, geode's magic and format version, a
    checksum that matches, a JSON header, blobs inside the file."""
    p = os.fsdecode(os.fspath(path))
    data = read_user_file(p)
    if data is None:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            raise ModelFileError(f"model file {p!r}: no such file") from None
        except OSError as exc:
            raise ModelFileError(f"model file {p!r}: cannot read it: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ModelFileError(f"model file {p!r}: not a regular file")
        raise ModelFileError(f"model file {p!r}: cannot read it (too large, or it changed)")
    return parse(data, p)


#: model files larger than this are not read
MAX_FILE = 1 << 40


def read_user_file(path: str | os.PathLike) -> bytes | None:
    """The bytes of the regular file at ``path`` the user named (links followed, any
    owner), or None when it is missing, unreadable or something else (a FIFO is never
    waited on: see :func:`geode.safe_files.read_file`)."""
    return read_file(path, MAX_FILE, private=False, follow_links=True)


def parse(data: bytes, label: str) -> Container:
    """Check and split a model file's bytes (``label`` names it in errors)."""
    if len(data) < _PREFIX.size + _DIGEST or data[: len(MAGIC)] != MAGIC:
        raise ModelFileError(f"model file {label!r}: not a geode model file")
    _, version, flags, head_len = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise ModelFileError(
            f"model file {label!r}: format version {version}, this geode reads version "
            f"{FORMAT_VERSION}; compile the model again"
        )
    body = memoryview(data)[:-_DIGEST]
    if hashlib.sha256(body).digest() != data[-_DIGEST:]:
        raise ModelFileError(
            f"model file {label!r}: checksum mismatch (the file is truncated or altered)"
        )
    if flags != 0 or head_len > min(MAX_HEADER, len(data) - _PREFIX.size - _DIGEST):
        raise ModelFileError(f"model file {label!r}: bad header")
    start = _PREFIX.size
    try:
        header = json.loads(bytes(body[start : start + head_len]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ModelFileError(f"model file {label!r}: unreadable header: {exc}"[:300]) from None
    if not isinstance(header, dict):
        raise ModelFileError(f"model file {label!r}: bad header")
    base = start + head_len + _pad(start + head_len)
    blobs = header.pop("blobs", None)
    if not isinstance(blobs, list) or not all(
        isinstance(b, list)
        and len(b) == 2
        and all(isinstance(x, int) and x >= 0 for x in b)
        and base + b[0] + b[1] <= len(body)
        for b in blobs
    ):
        raise ModelFileError(f"model file {label!r}: bad blob table")
    return Container(label, header, data, base, [tuple(b) for b in blobs])
