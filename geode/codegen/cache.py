"""On-disk kernel cache, keyed by content, CPU and library versions.

numba cannot cache functions created by ``exec``: its cache locates a function by the
source file it came from. So every kernel's generated Python source is written to a
content-hashed module file in the cache directory, registered in ``sys.modules`` and
executed from there; numba's own ``cache=True`` then persists the machine code (an
index ``.nbi`` and data ``.nbc`` files) next to the module, and a later process that
compiles the same kernel loads the machine code instead of running LLVM again.

Layout (``cache_dir`` comes from the caller: ``geode.config.Options.cache_dir``)::

    <cache_dir>/kernels/<key[:32]>/
        geode_k_<key[:32]>.py                       the generated module
        geode_k_<key[:32]>.<func>-<line>.py311.nbi  numba's index
        geode_k_<key[:32]>.<func>-<line>.py311.1.nbc  numba's machine code
        manifest.json                               sha256 of every file above
    <cache_dir>/runtime/<key[:32]>/                 the same for one runtime helper that
                                                    kernels link in (the chunk launcher, a
                                                    vmath function): :func:`compile_helper`

The key (:func:`cache_key`) is the sha256 of the source text, the target triple, CPU
name and feature string numba's codegen uses (host features, plus the vector-width
preference of :mod:`geode.codegen.backends.target`), the versions of
numba, llvmlite, numpy and Python, :data:`CODEGEN_VERSION`, and whatever the backend
adds (a hash of its own runtime helpers, compile settings).

Trust: numba's index and data files are pickles, and unpickling runs code, so a
writer of the cache folder could run code in every process that loads an entry. So:

- the cache folder, its area and the entry folder must be private to the user (owned
  by them, not writable by group or others; :func:`geode.safe_files.private_folder`),
  else geode warns once naming the folder and compiles in memory;
- every manifest is signed with the user's secret key (HMAC, :mod:`geode.signing`;
  always for this cache, whatever the ``cache_sign`` option says), and an entry is used
  only if its manifest's signature is valid, it lists the hash of every file, every
  file still has that hash and the module file equals the expected source byte for
  byte. Without a usable key this cache is not used at all;
- numba reads its files through :class:`_VerifiedCacheFile`: each file is read once,
  non-blocking and only if it is a regular private file, and unpickled only if the
  sha256 of those very bytes is one the verified manifest lists (or one this process
  wrote), so a file swapped after the check is never unpickled either. A fresh entry's
  manifest lists the files on disk when it is written (:func:`commit_entry`).

Anything else (a truncated or garbage module, a corrupt numba index or data file, a
missing, corrupt or unsigned manifest, an entry left half-written by a crashed process,
a FIFO in place of a file) makes the entry untrusted: its files are deleted and the
kernel is rebuilt. All writes are atomic (a temporary file in the same directory, then
``os.replace``) and respect the umask (:func:`geode.safe_files.atomic_write`), so
concurrent processes compiling the same kernel never see a torn file; the worst a race
can cause is a cache miss.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import io
import json
import linecache
import logging
import math
import os
import pickle
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import geode.signing as signing
from geode.errors import CodegenError
from geode.lazy import require_numba
from geode.safe_files import atomic_write as _atomic_write
from geode.safe_files import make_dirs, private_dir, private_folder, read_file

#: Bump when generated code or its runtime conventions change in a way the source
#: text does not show (the backend also hashes its own helpers into the key).
CODEGEN_VERSION = "1"

log = logging.getLogger(__name__)

#: the folder of the kernel entries under a cache directory
KERNEL_AREA = "kernels"
#: entries of the runtime helpers kernels link in (the chunk launcher, vmath functions),
#: kept apart so the kernel entries can be counted
RUNTIME_AREA = "runtime"
#: compiled models (model files keyed by graph and options, :mod:`geode.modelfile.cache`)
MODEL_AREA = "models"
_AREAS = (KERNEL_AREA, RUNTIME_AREA, MODEL_AREA)
_MANIFEST = "manifest.json"
_MODULE_PREFIX = "geode_k_"
#: no module, numba file or manifest of an entry is near this size; larger ones are not read
_MAX_FILE_BYTES = 256 << 20


#: the target's part of the environment fingerprint (triple, CPU name and features),
#: installed by the codegen package for its backend (see :func:`set_target_fingerprint`)
_target_fingerprint: Callable[[], Mapping[str, str]] | None = None


def set_target_fingerprint(fn: Callable[[], Mapping[str, str]]) -> None:
    """Install the function giving the backend target's fingerprint (part of every key).

    ``geode.codegen`` installs its backend's when imported, so the cache does not import
    the backends that use it."""
    global _target_fingerprint
    _target_fingerprint = fn
    environment_fingerprint.cache_clear()


@functools.lru_cache(maxsize=1)
def environment_fingerprint() -> dict[str, str]:
    """Everything besides the source that decides the machine code: CPU and versions
    (this cache holds the numba backend's kernels and helpers: it needs numba)."""
    import llvmlite
    import numpy

    numba = require_numba("the numba backend's kernel cache")

    if _target_fingerprint is None:
        raise CodegenError("the kernel cache has no target fingerprint installed")
    return {
        **_target_fingerprint(),
        "numba": numba.__version__,
        "llvmlite": llvmlite.__version__,
        "numpy": numpy.__version__,
        "python": sys.version,
        "implementation": sys.implementation.name,
        "codegen_version": CODEGEN_VERSION,
    }


def cache_key(source: str, extra: Mapping[str, str] | None = None) -> str:
    """The content key of a kernel: sha256 over source, environment and ``extra``."""
    payload = {
        "source": source,
        "env": environment_fingerprint(),
        "extra": dict(sorted((extra or {}).items())),
    }
    blob = json.dumps(payload, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`geode.safe_files.atomic_write`)."""
    _atomic_write(path, data)


class UntrustedCacheError(OSError):
    """The cache folder may not be used (not private to the user, or no signing key);
    already reported once as a warning naming it."""


@dataclass
class CacheEntry:
    """One kernel's directory in the cache."""

    key: str
    directory: Path
    module_name: str
    module_path: Path
    #: True when the entry's files were verified against its manifest (a probable hit).
    trusted: bool = False
    #: file name -> sha256 of the files numba may unpickle: those the verified manifest
    #: lists, and those this process wrote
    hashes: dict[str, str] = field(default_factory=dict)
    #: sha256 of the module's source (what the module file holds)
    source_sha256: str = ""

    def data_files(self) -> list[Path]:
        """numba's files of this entry (index and data)."""
        if not self.directory.is_dir():
            return []
        return sorted(
            p
            for p in self.directory.iterdir()
            if p.is_file() and p.suffix in (".nbi", ".nbc") and ".tmp." not in p.name
        )


def _area_dir(cache_dir: str | os.PathLike[str], area: str = KERNEL_AREA) -> Path:
    return Path(cache_dir).expanduser() / area


def _entry_for(cache_dir: str | os.PathLike[str], key: str, area: str) -> CacheEntry:
    short = key[:32]
    directory = _area_dir(cache_dir, area) / short
    name = _MODULE_PREFIX + short
    return CacheEntry(key, directory, name, directory / f"{name}.py")


def _verify(entry: CacheEntry, source_bytes: bytes, secret: bytes) -> bool:
    """True when the module equals the source, the manifest is signed with ``secret``
    and every hash it lists still holds; then ``entry.hashes`` holds those hashes."""
    if read_file(entry.module_path, _MAX_FILE_BYTES) != source_bytes:
        return False
    raw = read_file(entry.directory / _MANIFEST, _MAX_FILE_BYTES)
    try:
        manifest = json.loads(raw) if raw is not None else None
        if not isinstance(manifest, dict) or manifest.get("key") != entry.key:
            return False
        files = manifest.get("files")
        if not isinstance(files, dict) or not any(str(n).endswith(".nbi") for n in files):
            return False
        if not signing.verify(manifest, secret):
            return False
        for name, digest in files.items():
            if os.sep in name or name.startswith("."):
                return False
            data = read_file(entry.directory / name, _MAX_FILE_BYTES)
            if data is None or _sha256(data) != digest:
                return False
    except (ValueError, TypeError, AttributeError):
        return False
    entry.hashes = dict(files)
    return True


def _wipe(entry: CacheEntry) -> None:
    """Delete an untrusted entry's manifest and numba files (the module is rewritten)."""
    with contextlib.suppress(OSError):
        (entry.directory / _MANIFEST).unlink()
    for p in entry.data_files():
        with contextlib.suppress(OSError):
            p.unlink()
    with contextlib.suppress(OSError):
        import shutil  # here and below: only removing entries needs it

        shutil.rmtree(entry.directory / "__pycache__")
    entry.hashes = {}


def _secret(cache_dir: str | os.PathLike[str], area: str) -> bytes:
    """The signing key, once the cache folder is found private; UntrustedCacheError when
    either is missing (reported once, naming the folder or the key)."""
    if not private_folder(cache_dir, (area,), "kernel cache"):
        raise UntrustedCacheError(f"kernel cache {cache_dir} is not private to this user")
    secret = signing.signing_key()
    if secret is None:
        raise UntrustedCacheError(f"no signing key for the numba kernel cache {cache_dir}")
    return secret


def prepare_entry(
    cache_dir: str | os.PathLike[str], key: str, source: str, area: str = KERNEL_AREA
) -> CacheEntry:
    """The cache entry for ``key``, verified; an untrusted entry is wiped and its module
    rewritten, so numba finds either verified files or none. ``area``: ``"kernels"``, or
    :data:`RUNTIME_AREA` for a runtime helper's entry. :class:`UntrustedCacheError` when
    the folder may not be used (see the module docstring), OSError when it cannot be."""
    secret = _secret(cache_dir, area)
    entry = _entry_for(cache_dir, key, area)
    make_dirs(entry.directory)
    if not private_dir(entry.directory):
        raise UntrustedCacheError(f"kernel cache entry {entry.directory} is not private")
    data = source.encode()
    entry.source_sha256 = _sha256(data)
    if _verify(entry, data, secret):
        entry.trusted = True
        with contextlib.suppress(OSError):
            os.utime(entry.directory)  # last use, for least-recently-used eviction
        return entry
    _wipe(entry)
    atomic_write(entry.module_path, data)
    return entry


def discard_entry(entry: CacheEntry) -> None:
    """Forget an entry's machine code (after numba failed to load it)."""
    _wipe(entry)
    entry.trusted = False


def commit_entry(entry: CacheEntry) -> bool:
    """Write the signed manifest of a freshly compiled entry: the module's hash and those
    of numba's files as they are on disk now; False if numba saved nothing (or a file
    cannot be read, or no key is usable).

    The files on disk, not only those this process wrote: two processes compiling the
    same kernel at once each replace numba's files (numba's pickles differ from process
    to process), and the manifest written last must describe the files that stayed. In a
    private folder only this user's processes write them (see the module docstring)."""
    if not any(entry.hashes):
        return False
    files = {entry.module_path.name: entry.source_sha256}
    for p in entry.data_files():
        data = read_file(p, _MAX_FILE_BYTES)
        if data is None:
            return False
        files[p.name] = _sha256(data)
    names = set(files)
    if not any(n.endswith(".nbi") for n in names) or not any(n.endswith(".nbc") for n in names):
        return False
    secret = signing.signing_key()
    if secret is None:
        return False
    entry.hashes = {n: h for n, h in files.items() if n != entry.module_path.name}
    manifest: dict[str, Any] = {"key": entry.key, "files": files, "env": environment_fingerprint()}
    manifest[signing.FIELD] = signing.sign(manifest, secret)
    atomic_write(entry.directory / _MANIFEST, json.dumps(manifest, indent=1).encode())
    return True


#: held while a kernel module is added to or removed from ``sys.modules``
module_lock = threading.Lock()


def load_module(source: str, module_name: str, filename: str) -> types.ModuleType:
    """Execute ``source`` as module ``module_name`` whose code claims ``filename``.

    The module is registered in ``sys.modules`` before it runs (numba rebuilds cached
    functions' environments by module name). No bytecode cache is written: the source
    is compiled here, so a stale or corrupt ``.pyc`` can never be picked up. The text
    is also registered with ``linecache`` so tracebacks and numba's error messages
    show generated lines even for in-memory kernels.
    """
    with module_lock:
        existing = sys.modules.get(module_name)
        if existing is not None and getattr(existing, "__geode_source__", None) == source:
            return existing
        module = types.ModuleType(module_name)
        module.__file__ = filename
        module.__geode_source__ = source  # type: ignore[attr-defined]
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        code = compile(source, filename, "exec")
        sys.modules[module_name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        return module


# ---------------------------------------------------------------------------------
# numba's cache, pinned to the entry directory
# ---------------------------------------------------------------------------------


def attach_numba_cache(dispatcher: Any, entry: CacheEntry) -> None:
    """Make numba's cache of ``dispatcher`` (an ``njit`` dispatcher or a ``cfunc``) live
    in ``entry.directory``.

    numba would otherwise pick its own location (``NUMBA_CACHE_DIR``, ``__pycache__``,
    a user-wide directory); pinning it keeps module, machine code and manifest
    together so they are verified, counted and cleared as one entry.
    """
    py_func = getattr(dispatcher, "py_func", None) or dispatcher._pyfunc
    dispatcher._cache = _entry_cache_class()(py_func, entry)


@functools.lru_cache(maxsize=1)
def _entry_cache_class() -> type:
    from numba.core.caching import (
        CompileResultCacheImpl,
        FunctionCache,
        IndexDataCacheFile,
        _CacheLocator,
    )

    class _VerifiedCacheFile(IndexDataCacheFile):
        """numba's index and data files, read once and unpickled only when the sha256
        of the bytes read is one the entry trusts (``CacheEntry.hashes``); written
        atomically with the umask respected, their hashes recorded for the manifest."""

        def __init__(self, cache: Any, entry: CacheEntry) -> None:
            super().__init__(cache._cache_path, cache._impl.filename_base, entry.key)
            self._entry = entry

        def _verified(self, path: str) -> bytes | None:
            want = self._entry.hashes.get(os.path.basename(path))
            data = read_file(path, _MAX_FILE_BYTES) if want else None
            return data if data is not None and _sha256(data) == want else None

        def _load_index(self) -> dict:
            data = self._verified(self._index_path)
            if data is None:
                return {}
            stream = io.BytesIO(data)
            if pickle.load(stream) != self._version:
                return {}
            stamp, overloads = pickle.loads(stream.read())
            return overloads if stamp == self._source_stamp else {}

        def _load_data(self, name: str) -> Any:
            data = self._verified(self._data_path(name))
            if data is None:
                raise OSError(f"{name}: not a file the entry's manifest vouches for")
            return pickle.loads(data)

        def _save_index(self, overloads: dict) -> None:
            blob = pickle.dumps(self._version, protocol=-1)
            self._write(self._index_path, blob + self._dump((self._source_stamp, overloads)))

        def _save_data(self, name: str, data: Any) -> None:
            self._write(self._data_path(name), self._dump(data))

        def _write(self, path: str, blob: bytes) -> None:
            atomic_write(Path(path), blob)
            self._entry.hashes[os.path.basename(path)] = _sha256(blob)

    class _EntryLocator(_CacheLocator):
        """Locates numba's files in one cache entry; the stamp is the source hash."""

        def __init__(self, entry: CacheEntry) -> None:
            self._entry = entry

        def get_cache_path(self) -> str:
            return str(self._entry.directory)

        def get_source_stamp(self) -> str:
            # content, not mtime: an identical module rewritten by a concurrent
            # process keeps its machine code valid
            return self._entry.key

        def get_disambiguator(self) -> str:
            return "0"

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> None:
            return None

    class _EntryCacheImpl(CompileResultCacheImpl):
        """numba's compile-result cache with the entry locator."""

        def __init__(self, py_func: Any, entry: CacheEntry) -> None:
            self._lineno = py_func.__code__.co_firstlineno
            self._locator = _EntryLocator(entry)
            fullname = f"{entry.module_name}.{py_func.__qualname__}"
            self._filename_base = self.get_filename_base(fullname, getattr(sys, "abiflags", ""))

    class _EntryFunctionCache(FunctionCache):
        """numba's FunctionCache whose files live in a geode cache entry."""

        def __init__(self, py_func: Any, entry: CacheEntry) -> None:
            self._entry = entry
            super().__init__(py_func)
            self._cache_file = _VerifiedCacheFile(self, entry)

        @property
        def _impl_class(self) -> Any:  # type: ignore[override]
            entry = self._entry
            return lambda f: _EntryCacheImpl(f, entry)

    return _EntryFunctionCache


# ---------------------------------------------------------------------------------
# runtime helpers: module-level numba functions every kernel may call
# ---------------------------------------------------------------------------------


def compile_helper(dispatcher: Any, signature: tuple[Any, ...], cache_dir: str | None) -> None:
    """Compile the module-level numba dispatcher ``dispatcher`` (a runtime helper of
    geode's, such as the chunk launcher or a vmath function; not a generated kernel)
    for ``signature`` unless this process already has, through an entry of
    :data:`RUNTIME_AREA` under ``cache_dir`` (``None``: in memory only).

    The entry is keyed by the text of the helper's module, its name, the signature and
    :func:`environment_fingerprint`, and is trusted on the same terms as a kernel's: a
    corrupt one is rebuilt, and a cache that cannot be used (read-only, full) only costs
    the compile. The cache is detached afterwards, so the dispatcher never writes to a
    folder that may since have gone (a test's temporary cache).
    """
    from numba.core.caching import NullCache
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        signature = tuple(signature)
        if signature in dispatcher.signatures:
            return
        entry = _helper_entry(dispatcher, signature, cache_dir)
        hits = sum(dispatcher.stats.cache_hits.values())
        try:
            try:
                dispatcher.compile(signature)
            except Exception as exc:
                if entry is None:
                    raise
                log.warning("helper cache entry %s unusable (%s): rebuilding", entry.directory, exc)
                discard_entry(entry)
                entry = None
                dispatcher._cache = NullCache()
                dispatcher.compile(signature)
            hit = sum(dispatcher.stats.cache_hits.values()) > hits
        finally:
            dispatcher._cache = NullCache()
        if entry is not None and not hit:
            try:
                commit_entry(entry)
            except OSError as exc:
                log.warning("helper cache entry %s not saved: %s", entry.directory, exc)


def _helper_entry(
    dispatcher: Any, signature: tuple[Any, ...], cache_dir: str | None
) -> CacheEntry | None:
    """The helper's entry under ``cache_dir``, attached to ``dispatcher``, or None (no
    cache directory, or one that cannot be written)."""
    if cache_dir is None:
        return None
    py_func = dispatcher.py_func
    try:
        source = Path(inspect.getsourcefile(py_func) or "").read_text(encoding="utf-8")
        extra = {
            "helper": f"{py_func.__module__}.{py_func.__qualname__}",
            "signature": str(signature),
        }
        entry = prepare_entry(cache_dir, cache_key(source, extra), source, area=RUNTIME_AREA)
    except UntrustedCacheError as exc:  # reported once, naming the folder
        log.debug("helper %s not cached: %s", py_func.__name__, exc)
        return None
    except OSError as exc:
        log.warning(
            "kernel cache %s unusable (%s): compiling %s in memory",
            cache_dir,
            exc,
            py_func.__name__,
        )
        return None
    attach_numba_cache(dispatcher, entry)
    return entry


# ---------------------------------------------------------------------------------
# inspection and maintenance
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheInfo:
    """What the kernel cache under one directory holds."""

    path: str
    entries: int
    bytes: int


_ENTRY_NAME = re.compile(r"[0-9a-f]{32}")


def _checked_dir(cache_dir: Any) -> str:
    from geode.config import check_path_option

    return str(check_path_option("cache_dir", cache_dir))


def _entry_dirs(cache_dir: str | os.PathLike[str], area: str = KERNEL_AREA) -> Iterator[Path]:
    root = _area_dir(cache_dir, area)
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        if p.is_dir() and _ENTRY_NAME.fullmatch(p.name):
            yield p


def cache_info(cache_dir: str | os.PathLike[str]) -> CacheInfo:
    """Number of kernel entries and their total size in bytes under ``cache_dir``
    (:class:`~geode.config.OptionError` if ``cache_dir`` is not a path)."""
    cache_dir = _checked_dir(cache_dir)
    sizes = [_dir_bytes(d) for d in _entry_dirs(cache_dir)]
    return CacheInfo(str(_area_dir(cache_dir)), len(sizes), sum(sizes))


def clear_cache(cache_dir: str | os.PathLike[str]) -> int:
    """Delete every entry under ``cache_dir`` (only geode's ``kernels/``, ``runtime/`` and
    ``models/`` folders); returns the number of kernel entries removed
    (:class:`~geode.config.OptionError` if ``cache_dir`` is not a path)."""
    cache_dir = _checked_dir(cache_dir)
    n = 0
    for area in _AREAS:
        for d in list(_entry_dirs(cache_dir, area)):
            import shutil

            shutil.rmtree(d, ignore_errors=True)
            n += area == KERNEL_AREA
        root = _area_dir(cache_dir, area)
        if root.is_dir():
            with contextlib.suppress(OSError):
                root.rmdir()
    return n


# ---------------------------------------------------------------------------------
# size limit: least-recently-used eviction
# ---------------------------------------------------------------------------------

#: seconds between two size checks of one cache (:func:`maybe_prune`)
PRUNE_INTERVAL = 3600.0
#: entries used or written this recently (seconds) are never evicted: another process
#: may be writing or loading them
KEEP_RECENT = 600.0
_PRUNE_STAMP = ".geode-pruned"
_pruned_at: dict[str, float] = {}


@dataclass(frozen=True)
class PruneResult:
    """What one :func:`prune_cache` did: entries removed, bytes freed, bytes left."""

    removed: int
    freed: int
    left: int


def _dir_bytes(d: str | os.PathLike[str]) -> int:
    """Total size of the files under ``d`` (files that vanish meanwhile count 0)."""
    total = 0
    with contextlib.suppress(OSError), os.scandir(d) as it:
        for e in it:
            with contextlib.suppress(OSError):
                if e.is_dir(follow_symlinks=False):
                    total += _dir_bytes(e.path)
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
    return total


def prune_cache(
    cache_dir: str | os.PathLike[str], max_bytes: int, keep_recent: float = KEEP_RECENT
) -> PruneResult:
    """Evict the least recently used entries (kernels and runtime helpers) until the
    cache under ``cache_dir`` holds at most ``max_bytes``.

    An entry's last use is its folder's modification time: writing it sets it and every
    trusted load touches it (:func:`prepare_entry`). Entries used within ``keep_recent``
    seconds stay even above the limit. Only geode's entry folders are removed; other
    files in the folder are never touched. An evicted kernel is compiled again when
    next needed.
    """
    cache_dir = _checked_dir(cache_dir)
    entries = []
    for area in _AREAS:
        for d in _entry_dirs(cache_dir, area):
            with contextlib.suppress(OSError):
                entries.append((d.stat().st_mtime, _dir_bytes(d), d))
    left = sum(size for _, size, _ in entries)
    removed = freed = 0
    now = time.time()
    for used, size, d in sorted(entries, key=lambda e: e[0]):
        if left <= max_bytes or now - used < keep_recent:
            break
        import shutil

        shutil.rmtree(d, ignore_errors=True)
        removed, freed, left = removed + 1, freed + size, left - size
    if removed:
        log.info("kernel cache %s: evicted %d entries (%d bytes)", cache_dir, removed, freed)
    return PruneResult(removed, freed, left)


def maybe_prune(cache_dir: str | os.PathLike[str], max_bytes: int) -> PruneResult | None:
    """:func:`prune_cache` if ``max_bytes`` > 0 and this cache was not checked (by any
    process) in the last :data:`PRUNE_INTERVAL` seconds; None when it was not due.

    The check time is a stamp file in ``cache_dir``; a cache that cannot be read or
    written is left as it is (the limit is best effort, never a compile error), and so
    is one that is not private to the user (geode does not use it, so it does not
    maintain it either).
    """
    if max_bytes <= 0 or not private_folder(cache_dir, _AREAS, "kernel cache"):
        return None
    key = os.fspath(cache_dir)
    now = time.time()
    if now - _pruned_at.get(key, -math.inf) < PRUNE_INTERVAL:
        return None
    _pruned_at[key] = now
    stamp = Path(key).expanduser() / _PRUNE_STAMP
    try:
        if now - stamp.stat().st_mtime < PRUNE_INTERVAL:
            return None
    except OSError:
        pass  # never checked
    try:
        make_dirs(stamp.parent)
        stamp.touch(mode=0o644)
        return prune_cache(key, max_bytes)
    except OSError as exc:
        log.warning("kernel cache %s: size check failed: %s", key, exc)
        return None
