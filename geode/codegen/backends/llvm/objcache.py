"""The LLVM backend's disk cache: relocatable object code plus a JSON manifest.

An entry is ``<cache_dir>/kernels/<key[:32]>/`` holding ``kernel.o`` (the object code
LLVM emitted for the kernel's module) and ``manifest.json`` (the key, the entry symbol,
the object's size and sha256, the environment). The key hashes the module's IR text
(every codegen decision, vmath included, is in it), the target (triple, CPU, features,
vector width) and the versions of llvmlite, LLVM and the backend's conventions
(:data:`CODEGEN_VERSION`), so a warm start maps machine code without running LLVM's
optimizer, and code built for another CPU or library is never loaded.

Trust: loading maps machine code into the process, so an entry is code that will run.
Nothing is unpickled. geode reads an entry only when the cache folder, the entry
folder and its files are regular files and folders owned by the current user and not
writable by group or others (anyone else who could write them could run code in this
process); otherwise it warns once, naming the folder, and compiles without the cache.
A manifest or object that is missing, truncated, of the wrong size or hash, or not a
regular file (a FIFO would block a read) is a miss: the entry is rebuilt. Writes are
atomic (:func:`geode.codegen.cache.atomic_write`), so concurrent processes never see a
torn file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

from geode.codegen.cache import KERNEL_AREA, atomic_write

__all__ = ["CODEGEN_VERSION", "cache_key", "load", "object_code", "store", "versions"]

#: bump when generated code's conventions change in a way the IR text does not show
CODEGEN_VERSION = "llvm-1"
_OBJECT = "kernel.o"
_MANIFEST = "manifest.json"
#: manifests and objects larger than this are not read (no entry is near it)
_MAX_BYTES = 256 << 20

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str]:
    import llvmlite
    import llvmlite.binding as llvm

    return {
        "llvmlite": llvmlite.__version__,
        "llvm": ".".join(map(str, llvm.llvm_version_info)),
        "codegen_version": CODEGEN_VERSION,
        "python": sys.implementation.cache_tag or sys.version,
    }


def versions() -> dict[str, str]:
    """The versions generated object code depends on (llvmlite, LLVM, code conventions,
    Python's cache tag)."""
    return dict(_versions())


def cache_key(ir_text: str, fingerprint: dict[str, str]) -> str:
    """sha256 over the module text, the target and the versions."""
    blob = json.dumps(
        {"ir": ir_text, "target": fingerprint, "versions": _versions()}, sort_keys=True
    ).encode()
    return hashlib.sha256(blob).hexdigest()


def _entry_dir(cache_dir: str | os.PathLike[str], key: str) -> Path:
    return Path(cache_dir).expanduser() / KERNEL_AREA / key[:32]


_warned: set[str] = set()


def _private(path: Path, kind: str) -> bool:
    """Whether ``path`` is a ``kind`` ("dir"/"file") owned by this user and not writable by
    others (no symlink)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "dir" else stat.S_ISREG(st.st_mode)
    if not is_kind:
        return False
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return False
    return not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def trusted_folder(cache_dir: str | os.PathLike[str]) -> bool:
    """Whether the cache folder may be read (see the module docstring); warns once per
    folder when not."""
    root = Path(cache_dir).expanduser()
    ok = all(_private(p, "dir") for p in (root, root / KERNEL_AREA) if p.exists())
    if not ok and str(root) not in _warned:
        _warned.add(str(root))
        log.warning(
            "kernel cache %s is not private to this user (owner or permissions): compiling "
            "without it",
            root,
        )
    return ok


def _read(path: Path) -> bytes | None:
    if not _private(path, "file"):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= _MAX_BYTES else None


def load(cache_dir: str | os.PathLike[str], key: str, entry: str) -> bytes | None:
    """The object code cached for ``key`` (exporting ``entry``), or None on a miss."""
    if not trusted_folder(cache_dir):
        return None
    d = _entry_dir(cache_dir, key)
    if not _private(d, "dir"):
        return None
    raw = _read(d / _MANIFEST)
    if raw is None:
        return None
    try:
        manifest = json.loads(raw)
        ok = (
            isinstance(manifest, dict)
            and manifest.get("key") == key
            and manifest.get("entry") == entry
            and isinstance(manifest.get("size"), int)
            and isinstance(manifest.get("sha256"), str)
        )
    except ValueError:
        ok = False
    if not ok:
        return None
    obj = _read(d / _OBJECT)
    if obj is None or len(obj) != manifest["size"]:
        return None
    if hashlib.sha256(obj).hexdigest() != manifest["sha256"]:
        return None
    with contextlib.suppress(OSError):
        os.utime(d)  # last use, for least-recently-used eviction
    return obj


def store(
    cache_dir: str | os.PathLike[str], key: str, entry: str, obj: bytes, env: dict[str, str]
) -> bool:
    """Write an entry (object first, manifest last); False when the folder is not usable."""
    if not trusted_folder(cache_dir):
        return False
    d = _entry_dir(cache_dir, key)
    try:
        old = os.umask(0o022)
        try:
            d.mkdir(parents=True, exist_ok=True)
        finally:
            os.umask(old)
        if not _private(d, "dir"):
            return False
        atomic_write(d / _OBJECT, obj)
        manifest = {
            "key": key,
            "entry": entry,
            "size": len(obj),
            "sha256": hashlib.sha256(obj).hexdigest(),
            "env": {**env, **_versions()},
        }
        atomic_write(d / _MANIFEST, json.dumps(manifest, indent=1).encode())
    except OSError as exc:
        log.warning("kernel cache %s: entry not written: %s", cache_dir, exc)
        return False
    return True


def object_code(
    name: str, ir: str, target: Any, cache_dir: str | os.PathLike[str] | None
) -> tuple[bytes, bool]:
    """``(object code, from the cache)`` of module ``ir`` (entry symbol ``name``) for
    ``target``: read from the disk cache in ``cache_dir`` when it holds the entry, else
    compiled now (and stored there). ``cache_dir=None`` compiles in memory."""
    from geode.codegen.backends.llvm import jit

    key = cache_key(ir, target.fingerprint())
    obj = None if cache_dir is None else load(cache_dir, key, name)
    if obj is not None:
        return obj, True
    obj = jit.compile_ir(ir, target)
    if cache_dir is not None:
        store(cache_dir, key, name, obj, target.fingerprint())
    return obj, False
