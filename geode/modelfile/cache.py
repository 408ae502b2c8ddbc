"""Compiled models in the kernel cache: a warm compile is a model file loaded.

A compile with the LLVM backend writes its model file into the cache folder
(``<cache_dir>/models/<key[:32]>/model.geode``), keyed by everything the result depends
on: the user's graph as it was given (structure, attributes, tensor bytes), the compile
options that shape the result, the device (its fingerprint: CPU, cores, caches; a greedy
compile plans on it with nominal rates, measuring nothing) and what the code
depends on (geode, llvmlite and LLVM versions, code conventions, the target CPU). The
next compile of the same graph with the same options loads that file (checked like any
model file: format, checksum, versions, CPU features) instead of running the pipeline:
no pass, no fusion, no scheduling, no IR. The kernels' object code is already cached
too, so a miss here still compiles no kernel twice.

A tuning database (``tuning_db``) keys the entry by its contents: a database tuned
further gives another key. Skipped (the pipeline runs): ``model_cache=False``
(``GEODE_MODEL_CACHE=0``), schedules given to the compile (``schedules``: functions
have no file form), the numba backend, debug logging or dumps asked for
(``GEODE_DEBUG``/``GEODE_DUMP_DIR``: the user wants to see the stages), a graph with
constants still in external files (loaded lazily: hashing them would read them), a
model whose constants are too large to copy into the cache (an eighth of
``cache_max_mb``), a cache folder geode does not trust (not the user's own, or writable
by others). With ``cache_sign`` (``GEODE_CACHE_SIGN=1``) an entry also carries a
manifest signed with the user's key, and one without a valid signature is not used: in
a shared folder only models written by holders of the key are trusted. An entry that
fails its checks is recompiled and written again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import geode.signing as signing
from geode.codegen.backends.llvm import optlevel
from geode.codegen.cache import MODEL_AREA
from geode.compiler.ir import Graph, ValueKind
from geode.config import Options
from geode.costmodel.device import cached_spec, fingerprint
from geode.errors import GeodeError
from geode.modelfile import compat
from geode.modelfile.container import Writer, read_user_file
from geode.modelfile.graph_codec import encode_graph
from geode.safe_files import (
    atomic_write,
    file_mode,
    is_private,
    make_dirs,
    private_dir,
    private_folder,
    read_file,
)
from geode.version import source_digest

_FILE = "model.geode"
_MANIFEST = "model.json"
#: options that do not change the compiled model
_IRRELEVANT = frozenset(
    {
        "dynamic_dims",  # a cached compile is one variant: the same with or without them
        "incremental",
        "debug",
        "dump_dir",
        "cache_dir",
        "cache_max_mb",
        "cache_sign",
        "progress",
        "model_cache",
        "memory_limit_mb",
        "tuning_db",  # keyed by the database's contents instead (see _context)
        "schedules",  # a compile given schedules does not use the model cache
    }
)

log = logging.getLogger(__name__)


def usable(g: Graph, opts: Options) -> bool:
    """Whether a compile of ``g`` with ``opts`` may go through the model cache."""
    if not options_usable(opts):
        return False
    # a constant without data is in an external file, loaded lazily
    return all(v.data is not None for v in g.values.values() if v.kind is ValueKind.CONSTANT)


def options_usable(opts: Options) -> bool:
    """Whether compiles with ``opts`` may go through the model cache at all."""
    if not opts.model_cache or opts.backend != "llvm" or not opts.codegen:
        return False
    return not (opts.debug or opts.dump_dir or opts.schedules)


#: ONNX files larger than this are keyed by their graph, not hashed whole first
MAX_KEYED_FILE = 1 << 30


def file_key(path: str | os.PathLike, opts: Options) -> str | None:
    """The key of compiling the ONNX file at ``path`` with ``opts``, from its bytes; None
    when the file may refer to external data files (the bytes ``location``, the key every
    external tensor carries, appear in it), is too large, or cannot be read: then the
    graph is read as ONNX and keyed by :func:`cache_key`."""
    if not options_usable(opts):
        return None
    try:
        if os.path.getsize(path) > MAX_KEYED_FILE:
            return None
        data = read_user_file(path)
    except (OSError, TypeError, ValueError):
        return None
    if data is None or b"location" in data:
        return None
    digest = hashlib.sha256(b"geode-model-cache-onnx-file-1\0")
    digest.update(json.dumps(_context(opts), sort_keys=True, default=str).encode())
    digest.update(data)
    return digest.hexdigest()


def _context(opts: Options) -> dict[str, Any]:
    """What besides the model a compile's result depends on: the environment, geode's
    own code (:func:`~geode.version.source_digest`), the options, the device: its
    fingerprint (:func:`~geode.costmodel.device.fingerprint`: CPU, cores, caches), which
    is all a greedy compile's plan depends on (it plans on the untimed spec, the
    fingerprint with nominal rates: so the key is known without a calibration, and no
    compile needs one); with the plan search on, also the measured spec and the projected
    model fitted on it (they score the plans)."""
    context = {
        "env": compat.environment(),
        "source": source_digest(),
        "options": {k: v for k, v in dataclasses.asdict(opts).items() if k not in _IRRELEVANT},
        "device": fingerprint(),
        "tuning_db": None if opts.tuning_db is None else _db_digest(opts.tuning_db),
        "llvm_opt": optlevel.setting(),
    }
    if opts.fusion_search != "greedy":
        from geode.codegen.costs import projected_model

        spec = cached_spec(opts.cache_dir)
        context["device_spec"] = dataclasses.asdict(spec)
        context["projected_model"] = projected_model(opts.cache_dir, spec).to_dict()
    return context


def cache_key(g: Graph, opts: Options) -> str | None:
    """The key of a compile of ``g`` (the user's graph, before any stage ran) with
    ``opts``; None when the graph has no file form (then nothing is cached)."""
    digest = hashlib.sha256(b"geode-model-cache-1\0")
    w = Writer()
    try:
        graph = encode_graph(g, w)
    except GeodeError:
        return None
    head = {**_context(opts), "graph": graph}
    digest.update(json.dumps(head, sort_keys=True, default=str).encode())
    for blob in w.blobs():
        digest.update(len(blob).to_bytes(8, "little"))
        digest.update(blob)
    return digest.hexdigest()


def entry_path(cache_dir: str, key: str) -> Path:
    """Where the model file of ``key`` lives in ``cache_dir``."""
    return Path(cache_dir).expanduser() / MODEL_AREA / key[:32] / _FILE


def _trusted(cache_dir: str) -> bool:
    return private_folder(cache_dir, (MODEL_AREA,), "kernel cache")


def lookup(cache_dir: str, key: str, sign: bool = False) -> Path | None:
    """The cached model file of ``key``, when there and trusted: a regular file in the
    user's own folders, writable by nobody else, and with ``sign`` one whose signed
    manifest (``model.json``, an HMAC under the user's key, :mod:`geode.signing`) names
    this key and the file's checksum."""
    path = entry_path(cache_dir, key)
    if not _trusted(cache_dir) or not private_dir(path.parent):
        return None
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or not is_private(st):
        return None
    if sign and not _signed(path, key):
        return None
    with contextlib.suppress(OSError):
        os.utime(path.parent)  # last use, for least-recently-used eviction
    return path


def _tail(path: Path) -> str | None:
    """The file's own checksum (its last 32 bytes, which :mod:`.container` checks
    against everything before them): signing it signs the whole file."""
    try:
        with open(path, "rb") as f:
            f.seek(-32, os.SEEK_END)
            return f.read(32).hex()
    except OSError:
        return None


def _signed(path: Path, key: str) -> bool:
    secret = signing.signing_key()
    raw = read_file(path.parent / _MANIFEST, 1 << 16)
    if secret is None or raw is None:
        return False
    try:
        manifest = json.loads(raw)
    except ValueError:
        return False
    return (
        isinstance(manifest, dict)
        and manifest.get("key") == key
        and manifest.get("digest") == _tail(path)
        and signing.verify(manifest, secret)
    )


def store(cache_dir: str, key: str, max_bytes: int, save: Any, sign: bool = False) -> Path | None:
    """Write a model file for ``key`` with ``save(path, max_bytes)`` (and with ``sign``
    its signed manifest); None when the cache folder is not trusted, the model is larger
    than ``max_bytes`` or signing has no key."""
    if not _trusted(cache_dir):
        return None
    path = entry_path(cache_dir, key)
    try:
        make_dirs(path.parent)
        if not private_dir(path.parent):
            return None
        save(path, max_bytes)
        os.chmod(path, file_mode())
        if sign:
            secret = signing.signing_key()
            if secret is None:
                raise OSError("no signing key")
            manifest = {"key": key, "digest": _tail(path)}
            manifest[signing.FIELD] = signing.sign(manifest, secret)
            atomic_write(path.parent / _MANIFEST, json.dumps(manifest).encode())
    except (OSError, GeodeError) as exc:  # no room, too large: the compile stands
        log.info("compiled model not cached (%s)", exc)
        _remove(path)
        return None
    except Exception as exc:  # noqa: BLE001 - a bug in saving must not lose the compile
        warnings.warn(
            f"compiled model not cached: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=3
        )
        _remove(path)
        return None
    return path


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _db_digest(path: str) -> str:
    # imported here: the tuning database's module brings the schedule primitives (and
    # sympy), which a cache hit without one never needs
    from geode.codegen.tuning_db import db_digest

    return db_digest(path)
