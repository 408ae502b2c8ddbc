"""The variable checkpoint format: named tensors in a data-only file with checksums.

A checkpoint holds :class:`VarEntry` records (name, dtype, stored shape, storage format,
data in that format) and nothing executable: it is never unpickled. The bytes::

    offset 0    b"GEODEVAR"                      magic (8 bytes)
    8           format version, uint32 LE       (:data:`VERSION`)
    12          0, uint32 LE                    (reserved)
    16          header length H, uint64 LE
    24          header: H bytes of UTF-8 JSON   {"version", "payload_size", "entries": [
                                                 {"name", "dtype", "shape", "format",
                                                  "offset", "nbytes", "sha256"}, ...]}
    ...         zeros up to a multiple of 64    (the payload starts 64-byte aligned)
    P           payload: each entry's bytes at P + offset (little endian, C order,
                offsets multiples of 64, zeros between)
    end - 32    SHA-256 of every byte before it

:func:`encode` / :func:`decode` turn entries into those bytes and back (for a file that
embeds a checkpoint, such as a model file's variable snapshot); :func:`write` /
:func:`read` do it for a path. :func:`decode` trusts nothing: a short file is reported
as truncated, a checksum mismatch as altered (naming the entries whose data changed),
and every header field is checked (dtypes: booleans and numbers only; sizes; offsets;
formats). :func:`write` replaces the file atomically (a temporary file in the same
folder, then a rename), so a failed write never leaves a partial file at ``path``; it
refuses a path that is a directory or a symbolic link.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from geode.errors import CheckpointError
from geode.runtime import var_format
from geode.safe_files import atomic_writer, umask

__all__ = ["MAGIC", "VERSION", "VarEntry", "decode", "describe", "encode", "entry", "read", "write"]

MAGIC = b"GEODEVAR"
#: the format version this geode writes and reads
VERSION = 1
_FIXED = struct.Struct("<8sIIQ")  # magic, version, reserved, header length
_ALIGN = 64
_DIGEST = 32
#: dtype kinds a checkpoint may hold: bool, signed and unsigned ints, floats, complex
_KINDS = frozenset("biufc")


@dataclass(frozen=True)
class VarEntry:
    """One variable of a checkpoint: its description and its stored data.

    ``shape`` is the stored shape (the user's shape converted by ``format``, see
    :mod:`geode.runtime.var_format`); ``data`` has exactly ``dtype`` and ``shape``.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    format: str
    data: np.ndarray

    def describe(self) -> str:
        """``w: float32[4, 3] TRANSPOSED(1,0)``."""
        return f"{self.name}: {describe(self.dtype, self.shape, self.format)}"


def describe(dtype: np.dtype, shape: Sequence[int], fmt: str) -> str:
    """How errors show a variable's description: ``float32[4, 3] TRANSPOSED(1,0)``."""
    return f"{np.dtype(dtype).name}{list(shape)} {fmt}"


def entry(name: str, data: np.ndarray, fmt: str = var_format.ND) -> VarEntry:
    """A :class:`VarEntry` for ``data`` (stored layout)."""
    arr = np.asarray(data)
    return VarEntry(name, arr.dtype, tuple(arr.shape), fmt, arr)


# -- encoding -----------------------------------------------------------------------------
def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _little_endian(e: VarEntry) -> np.ndarray:
    """``e.data`` checked against its description, C-contiguous and little endian."""
    if not isinstance(e, VarEntry):
        raise CheckpointError(f"a checkpoint holds VarEntry records, got {type(e).__name__}")
    if not isinstance(e.name, str) or not e.name:
        raise CheckpointError(f"checkpoint entry name {e.name!r} is not a non-empty string")
    arr = np.asarray(e.data)
    dt = np.dtype(e.dtype)
    if dt.kind not in _KINDS or dt.fields is not None or arr.dtype.kind not in _KINDS:
        raise CheckpointError(
            f"variable {e.name!r}: dtype {arr.dtype} cannot be saved (booleans and numbers only)"
        )
    if arr.dtype.newbyteorder("=") != dt.newbyteorder("=") or arr.shape != tuple(e.shape):
        raise CheckpointError(
            f"variable {e.name!r}: data is {arr.dtype}{list(arr.shape)}, its description "
            f"says {describe(dt, e.shape, e.format)}"
        )
    var_format.storage_shape(arr.shape, e.format)  # the format is valid for the rank
    return np.array(arr, dtype=dt.newbyteorder("<"), order="C", copy=None)


def _chunks(entries: Sequence[VarEntry]) -> Iterator[bytes | memoryview]:
    """The checkpoint's bytes, piece by piece (data is not copied into one buffer)."""
    arrays = [_little_endian(e) for e in entries]
    names = [e.name for e in entries]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise CheckpointError(f"variables {dups} appear more than once in the checkpoint")
    records, offset = [], 0
    for e, arr in zip(entries, arrays):
        raw = memoryview(arr.reshape(-1).view(np.uint8))
        records.append(
            {
                "name": e.name,
                "dtype": arr.dtype.str,
                "shape": [int(d) for d in arr.shape],
                "format": e.format,
                "offset": offset,
                "nbytes": raw.nbytes,
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        )
        offset = _round_up(offset + raw.nbytes)
    header = json.dumps(
        {"version": VERSION, "payload_size": offset, "entries": records}, sort_keys=True
    ).encode()
    head = _FIXED.pack(MAGIC, VERSION, 0, len(header)) + header
    head += bytes(_round_up(len(head)) - len(head))
    digest = hashlib.sha256(head)
    yield head
    pos = 0
    for arr in arrays:
        raw = memoryview(arr.reshape(-1).view(np.uint8))
        digest.update(raw)
        yield raw
        pad = bytes(_round_up(pos + raw.nbytes) - pos - raw.nbytes)
        digest.update(pad)
        yield pad
        pos = _round_up(pos + raw.nbytes)
    yield digest.digest()


def encode(entries: Sequence[VarEntry]) -> bytes:
    """The checkpoint bytes of ``entries`` (CheckpointError for an entry that cannot be
    saved: a non-numeric dtype, data that contradicts its description, a name twice)."""
    return b"".join(bytes(c) for c in _chunks(list(entries)))


# -- decoding -----------------------------------------------------------------------------
def decode(buffer: bytes | bytearray | memoryview | np.ndarray, where: str) -> list[VarEntry]:
    """The entries of checkpoint bytes. ``where`` names the source in errors (a path).

    The entries' arrays are views of ``buffer`` (when their byte order is the machine's):
    copy them if ``buffer`` will change. Raises :class:`CheckpointError` saying what is wrong: not a checkpoint,
    another format version, truncated, altered (naming the entries whose data changed),
    or a malformed header.
    """
    if isinstance(buffer, np.ndarray):
        buf = memoryview(np.ascontiguousarray(buffer).reshape(-1).view(np.uint8))
    else:
        buf = memoryview(np.frombuffer(buffer, np.uint8))
    size = buf.nbytes
    if size < _FIXED.size:
        raise CheckpointError(
            f"{where}: truncated: {size} bytes, shorter than a checkpoint's fixed header"
        )
    magic, version, _, hlen = _FIXED.unpack(buf[: _FIXED.size])
    if magic != MAGIC:
        raise CheckpointError(f"{where}: not a geode variable checkpoint (bad magic bytes)")
    if version != VERSION:
        raise CheckpointError(
            f"{where}: checkpoint format version {version}; this geode reads version {VERSION}"
        )
    header = _header(buf, hlen, where)
    start = _round_up(_FIXED.size + hlen)
    want = start + header["payload_size"] + _DIGEST
    if size < want:
        raise CheckpointError(f"{where}: truncated: {size} bytes, the header announces {want}")
    if size > want:
        raise CheckpointError(f"{where}: altered: {size - want} bytes after the checksum")
    if hashlib.sha256(buf[: size - _DIGEST]).digest() != bytes(buf[size - _DIGEST :]):
        changed = [
            r["name"]
            for r in header["entries"]
            if hashlib.sha256(
                buf[start + r["offset"] : start + r["offset"] + r["nbytes"]]
            ).hexdigest()
            != r["sha256"]
        ]
        what = f"the data of {changed}" if changed else "its header or padding"
        raise CheckpointError(f"{where}: altered: checksum mismatch in {what}")
    return [_entry(r, buf, start, where) for r in header["entries"]]


def _header(buf: memoryview, hlen: int, where: str) -> dict:
    """The parsed and type-checked JSON header."""
    end = _FIXED.size + hlen
    if end + _DIGEST > buf.nbytes:
        raise CheckpointError(
            f"{where}: truncated: {buf.nbytes} bytes, the header alone announces {end}"
        )
    try:
        header = json.loads(bytes(buf[_FIXED.size : end]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{where}: altered: the header is not valid JSON ({exc})") from None
    ok = (
        isinstance(header, dict)
        and header.get("version") == VERSION
        and _natural(header.get("payload_size"))
        and isinstance(header.get("entries"), list)
    )
    if not ok:
        raise CheckpointError(f"{where}: altered: malformed header")
    fields = {"name", "dtype", "shape", "format", "offset", "nbytes", "sha256"}
    seen: set[str] = set()
    for r in header["entries"]:
        if not isinstance(r, dict) or set(r) != fields:
            raise CheckpointError(f"{where}: altered: malformed entry {r!r:.80}")
        name = r["name"]
        good = (
            isinstance(name, str)
            and name
            and isinstance(r["dtype"], str)
            and isinstance(r["format"], str)
            and isinstance(r["sha256"], str)
            and isinstance(r["shape"], list)
            and all(_natural(d) for d in r["shape"])
            and _natural(r["offset"])
            and _natural(r["nbytes"])
            and r["offset"] + r["nbytes"] <= header["payload_size"]
            and name not in seen
        )
        if not good:
            raise CheckpointError(f"{where}: altered: malformed entry for {name!r:.80}")
        seen.add(name)
    return header


def _natural(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _entry(r: dict, buf: memoryview, start: int, where: str) -> VarEntry:
    name = r["name"]
    try:
        dt = np.dtype(r["dtype"])
    except TypeError:
        dt = None
    if dt is None or dt.kind not in _KINDS or dt.fields is not None or dt.subdtype is not None:
        raise CheckpointError(f"{where}: variable {name!r} has unsupported dtype {r['dtype']!r}")
    shape = tuple(r["shape"])
    count = int(np.prod(shape, dtype=np.int64))
    if count * dt.itemsize != r["nbytes"]:
        raise CheckpointError(
            f"{where}: variable {name!r}: {r['nbytes']} bytes do not hold {dt.name}{list(shape)}"
        )
    try:
        var_format.storage_shape(shape, r["format"])
    except var_format.FormatError as exc:
        raise CheckpointError(f"{where}: variable {name!r}: {exc}") from None
    off = start + r["offset"]
    arr = np.frombuffer(buf[off : off + r["nbytes"]], dt, count).reshape(shape)
    if not dt.isnative:
        arr = arr.astype(dt.newbyteorder("="))
    return VarEntry(name, arr.dtype, shape, r["format"], arr)


# -- files --------------------------------------------------------------------------------
def _fspath(path: object) -> str:
    try:
        p = os.fspath(path)  # type: ignore[call-overload]
    except TypeError:
        raise CheckpointError(
            f"a checkpoint path is a str or os.PathLike, got {type(path).__name__}"
        ) from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p or "\0" in p:
        raise CheckpointError(f"checkpoint path {p!r} is empty or holds a NUL character")
    return p


def write(path: str | os.PathLike, entries: Sequence[VarEntry]) -> None:
    """Write ``entries`` to ``path`` atomically: into a temporary file in the same
    folder, flushed to disk, then renamed over ``path``. On any failure ``path`` is left
    as it was and the temporary file is removed.

    Raises :class:`CheckpointError` when ``path`` is a directory, a symbolic link (the
    rename would replace the link, not write where it points: give the real path),
    something other than a regular file, in a folder that does not exist or cannot be
    written, or when the disk write fails.
    """
    p = _fspath(path)
    chunks = _chunks(list(entries))  # checks the entries before touching the disk
    first = next(chunks)
    if os.path.islink(p):
        raise CheckpointError(
            f"checkpoint path {p!r} is a symbolic link; geode replaces checkpoint files "
            "and does not write through links: give the path it points to"
        )
    if os.path.isdir(p):
        raise CheckpointError(f"checkpoint path {p!r} is a directory")
    if os.path.exists(p) and not os.path.isfile(p):
        raise CheckpointError(f"checkpoint path {p!r} exists and is not a regular file")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(folder):
        raise CheckpointError(f"cannot write checkpoint {p!r}: folder {folder!r} does not exist")
    mode = stat.S_IMODE(os.stat(p).st_mode) if os.path.isfile(p) else 0o666 & ~umask()
    opened = False
    try:
        with atomic_writer(p, mode=mode, sync=True) as f:
            opened = True
            f.write(first)
            for chunk in chunks:
                f.write(chunk)
    except OSError as exc:
        where = (
            "" if opened else f": cannot create a file in {os.path.dirname(os.path.abspath(p))!r}"
        )
        raise CheckpointError(
            f"cannot write checkpoint {p!r}{where}: {exc.strerror or exc}"
        ) from None


def read(path: str | os.PathLike) -> list[VarEntry]:
    """The entries of the checkpoint at ``path`` (a symbolic link is followed; the file
    it names must be a regular file). Raises :class:`CheckpointError` naming what is
    wrong (see :func:`decode`), or when the file cannot be read."""
    p = _fspath(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {p!r}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"checkpoint path {p!r} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"checkpoint path {p!r} is not a regular file")
    buf = np.empty(st.st_size, np.uint8)
    try:
        with open(p, "rb") as f:
            got = f.readinto(memoryview(buf))
            extra = f.read(1)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {p!r}: {exc.strerror}") from None
    if got != st.st_size or extra:
        raise CheckpointError(f"checkpoint {p!r} changed while it was read")
    return decode(buf, f"checkpoint {p!r}")
