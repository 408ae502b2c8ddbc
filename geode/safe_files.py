"""geode's own files on disk (kernel caches, the device spec, the signing key), read and
written as if someone else may have tampered with them.

- **Reads never block and never follow links.** A file is opened with ``O_NOFOLLOW |
  O_NONBLOCK`` and read only if ``fstat`` on the open descriptor says it is a regular
  file no larger than the caller's limit: a FIFO, device, socket or symbolic link in
  its place is treated like a missing file (a miss), never a hang or an endless read.
  Checking the descriptor, not the path, leaves no window to swap the file.
- **Private** means owned by the current user and not writable by group or others:
  anyone else who could write a cache file could put code into this process.
- **Writes respect the user's umask.** Files get ``0o644`` and folders ``0o755``, both
  masked by the umask, so nothing is more permissive than the umask allows; and never
  group- or other-writable even under a umask of ``002`` (geode would refuse to read
  such files back). Nothing ever changes the process umask (that would race with other
  threads creating files).
- **Writes are atomic**: a temporary file in the same folder, then ``os.replace``, so a
  reader (another process, or a later one after a crash) sees the old file or the new
  one, never a torn one; a crashed writer leaves only a ``*.tmp.*`` file nobody reads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "atomic_write",
    "atomic_writer",
    "file_mode",
    "is_private",
    "make_dirs",
    "private_dir",
    "private_folder",
    "read_file",
    "umask",
]

log = logging.getLogger(__name__)

#: the widest modes geode gives its files and folders (the umask narrows them)
FILE_MODE = 0o644
DIR_MODE = 0o755

_umask_lock = threading.Lock()


def umask() -> int:
    """The process's umask, read without changing it where the system tells it
    (``/proc/self/status`` on Linux); elsewhere read by setting and restoring it under
    a lock, through ``0o077`` so files created meanwhile are private rather than open."""
    with (
        contextlib.suppress(OSError, ValueError),
        open("/proc/self/status", encoding="ascii", errors="replace") as f,
    ):
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _umask_lock:
        old = os.umask(0o077)
        os.umask(old)
    return old


def file_mode() -> int:
    """The mode geode gives a file it writes: ``0o644`` narrowed by the umask."""
    return FILE_MODE & ~umask()


def is_private(st: os.stat_result) -> bool:
    """Whether ``st`` belongs to the current user and is not writable by group or others."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return False
    return not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def private_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder (not a link to one) that :func:`is_private` accepts."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and is_private(st)


def make_dirs(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and its missing parents, each with mode ``0o755`` narrowed by the
    umask (``os.makedirs`` gives parents ``0o777``; a umask of ``002`` would make them
    group-writable, and such a cache folder is refused). Existing folders are left as
    they are. OSError if it cannot be done."""
    p = Path(path)
    missing: list[Path] = []
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, DIR_MODE)
    if not Path(path).is_dir():
        raise NotADirectoryError(f"{path} is not a folder")


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file in the same folder, then
    ``os.replace``), with :func:`file_mode`; the folder is made if missing."""
    path = Path(path)
    make_dirs(path.parent)
    with atomic_writer(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike[str], mode: int | None = None, sync: bool = False
) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new contents to: a temporary file in the same
    folder that replaces ``path`` at once when the block ends (and is removed, leaving
    ``path`` as it was, when the block raises). ``mode``: its permission bits
    (:func:`file_mode` by default); ``sync``: flushed to the disk before it replaces
    ``path`` (for files the user keeps, not for caches). The folder must exist."""
    path = Path(path)
    import tempfile  # here: reading (a warm start) needs no temporary file

    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if sync:
                os.fsync(f.fileno())
            os.fchmod(f.fileno(), file_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def read_file(
    path: str | os.PathLike[str],
    max_bytes: int,
    private: bool = True,
    forbid: int = 0,
    follow_links: bool = False,
) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a link, unless
    ``follow_links``: a file the user names) of at most ``max_bytes`` bytes, with none of
    the mode bits ``forbid`` and, with ``private``, :func:`is_private`; None otherwise
    (missing, unreadable, a FIFO or device, too large, or grown while read). The file is
    read into one buffer of its size (no second copy of a large model)."""
    flags = _OPEN_FLAGS | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        if (private and not is_private(st)) or st.st_mode & forbid:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= min(st.st_size, max_bytes) else None


_warned: set[str] = set()
_warned_lock = threading.Lock()


def private_folder(
    root: str | os.PathLike[str], inner: tuple[str, ...] = (), what: str = ""
) -> bool:
    """Whether ``root`` and its sub-folders ``inner`` are private, each where it exists
    (a folder not made yet is fine: geode makes it private). When not, warns once per
    folder, naming it and ``what`` it is for."""
    root = Path(root).expanduser()
    ok = all(private_dir(p) for p in (root, *(root / i for i in inner)) if os.path.lexists(p))
    if not ok:
        with _warned_lock:
            first = str(root) not in _warned
            _warned.add(str(root))
        if first:
            log.warning(
                "%s %s is not private to this user (another owner, writable by group or "
                "others, or not a plain folder): not using it",
                what or "folder",
                root,
            )
    return ok
