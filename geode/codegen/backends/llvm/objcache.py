"""The LLVM backend's disk cache: relocatable object code plus a JSON manifest.

An entry is ``<cache_dir>/kernels/<key[:32]>/`` holding ``kernel.o`` (the object code
LLVM emitted for the kernel's module) and ``manifest.json`` (the key, the entry symbol,
the object's size and sha256, the environment). The key hashes the module's IR text
(every codegen decision, vmath included, is in it), the target (triple, CPU, features,
vector width) and the versions of llvmlite, LLVM and the backend's conventions
(:data:`CODEGEN_VERSION`), so a warm start maps machine code without running LLVM's
optimizer, and code built for another CPU or library is never loaded.

Trust: loading maps machine code into the process, so an entry is code that will run.
Nothing is unpickled. geode reads an entry only when the cache folder, its ``kernels``
folder and the entry folder are folders (not links) owned by the current user and not
writable by group or others, and its files are regular files of that user's (anyone
else who could write them could run code in this process); otherwise it warns once,
naming the folder, and compiles without the cache (:func:`geode.safe_files.private_folder`).
A manifest or object that is missing, truncated, of the wrong size or hash, or not a
regular file (a FIFO would block a read: files are opened non-blocking and checked on
the open descriptor, :func:`geode.safe_files.read_file`) is a miss: the entry is
rebuilt, as is one whose object code fails to link. With signing on
(:class:`CacheLocation` ``sign``: the ``cache_sign`` option, ``GEODE_CACHE_SIGN=1``) the
manifest carries an HMAC under the user's key (:mod:`geode.signing`) and an entry
without a valid one is a miss too: in a shared folder only entries written by holders
of the key are trusted. Writes are atomic and respect the umask
(:func:`geode.safe_files.atomic_write`), so concurrent processes never see a torn file
and a process killed mid-write leaves at most an entry that is a miss.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import geode.signing as signing
from geode.codegen.cache import KERNEL_AREA
from geode.safe_files import atomic_write, make_dirs, private_dir, private_folder, read_file

__all__ = [
    "CODEGEN_VERSION",
    "CacheLocation",
    "cache_key",
    "load",
    "location",
    "module_key",
    "store",
    "trusted_folder",
    "versions",
]

#: bump when generated code's conventions change in a way the IR text does not show
CODEGEN_VERSION = "llvm-1"
_OBJECT = "kernel.o"
_MANIFEST = "manifest.json"
#: manifests and objects larger than this are not read (no entry is near it)
_MAX_BYTES = 256 << 20
_MAX_MANIFEST_BYTES = 1 << 20

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str]:
    import llvmlite  # the package only: llvmlite.binding is not needed to ask

    from geode.codegen.backends.llvm.linker import llvm_version

    return {
        "llvmlite": llvmlite.__version__,
        "llvm": ".".join(map(str, llvm_version())),
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


@dataclass(frozen=True)
class CacheLocation:
    """An object cache folder and how its entries are trusted: ``sign`` writes an HMAC
    under the user's key into each manifest and reads only entries that carry a valid
    one (see the module docstring)."""

    path: str
    sign: bool = False


#: what the functions here take as a cache: a folder (entries unsigned) or a location
CacheDir = str | os.PathLike[str] | CacheLocation


def module_key(ir: str, target: Any, level: int) -> str:
    """The cache key of module ``ir`` compiled for ``target`` (a ``Target``: its
    ``fingerprint()``) at optimization ``level``."""
    return cache_key(ir, {**target.fingerprint(), "opt_level": str(level)})


def location(cache_dir: CacheDir | None) -> CacheLocation | None:
    """``cache_dir`` as a :class:`CacheLocation` (a plain folder: unsigned); None for None."""
    if cache_dir is None or isinstance(cache_dir, CacheLocation):
        return cache_dir
    return CacheLocation(os.fspath(cache_dir))


def _entry_dir(cache_dir: str, key: str) -> Path:
    return Path(cache_dir).expanduser() / KERNEL_AREA / key[:32]


def trusted_folder(cache_dir: CacheDir) -> bool:
    """Whether the cache folder may be used (see the module docstring); warns once per
    folder when not."""
    loc = location(cache_dir)
    assert loc is not None
    return private_folder(loc.path, (KERNEL_AREA,), "kernel cache")


def _key(loc: CacheLocation) -> bytes | None | bool:
    """The signing key when ``loc`` signs (None: none usable), else False."""
    return signing.signing_key() if loc.sign else False


def _manifest(raw: bytes, key: str, entry: str) -> dict | None:
    try:
        manifest = json.loads(raw)
    except ValueError:
        return None
    ok = (
        isinstance(manifest, dict)
        and manifest.get("key") == key
        and manifest.get("entry") == entry
        and isinstance(manifest.get("size"), int)
        and isinstance(manifest.get("sha256"), str)
    )
    return manifest if ok else None


def load(cache_dir: CacheDir, key: str, entry: str) -> bytes | None:
    """The object code cached for ``key`` (exporting ``entry``), or None on a miss."""
    loc = location(cache_dir)
    assert loc is not None
    if not trusted_folder(loc):
        return None
    secret = _key(loc)
    if secret is None:
        return None
    d = _entry_dir(loc.path, key)
    if not private_dir(d):
        return None
    raw = read_file(d / _MANIFEST, _MAX_MANIFEST_BYTES)
    manifest = None if raw is None else _manifest(raw, key, entry)
    if manifest is None or (secret and not signing.verify(manifest, secret)):
        return None
    obj = read_file(d / _OBJECT, _MAX_BYTES)
    if obj is None or len(obj) != manifest["size"]:
        return None
    if hashlib.sha256(obj).hexdigest() != manifest["sha256"]:
        return None
    with contextlib.suppress(OSError):
        os.utime(d)  # last use, for least-recently-used eviction
    return obj


def store(cache_dir: CacheDir, key: str, entry: str, obj: bytes, env: dict[str, str]) -> bool:
    """Write an entry (object first, manifest last); False when the folder is not usable
    (or signing is on and there is no key)."""
    loc = location(cache_dir)
    assert loc is not None
    if not trusted_folder(loc):
        return False
    secret = _key(loc)
    if secret is None:
        return False
    d = _entry_dir(loc.path, key)
    try:
        make_dirs(d)
        if not private_dir(d):
            return False
        atomic_write(d / _OBJECT, obj)
        manifest = {
            "key": key,
            "entry": entry,
            "size": len(obj),
            "sha256": hashlib.sha256(obj).hexdigest(),
            "env": {**env, **_versions()},
        }
        if secret:
            manifest[signing.FIELD] = signing.sign(manifest, secret)
        atomic_write(d / _MANIFEST, json.dumps(manifest, indent=1).encode())
    except OSError as exc:
        log.warning("kernel cache %s: entry not written: %s", loc.path, exc)
        return False
    return True
