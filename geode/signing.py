"""Per-user HMAC signatures of geode's cache manifests.

A content hash in a manifest only detects accidents: whoever can write a cache entry
can recompute it. A signature made with a secret key tells entries this user's geode
processes wrote (or those of anyone the key is shared with, e.g. a CI secret) from
entries someone else planted. The signature is HMAC-SHA256 over the manifest's
canonical JSON (sorted keys, no whitespace) without its ``hmac`` field, which holds the
signature in hex; the manifest lists the hashes of the entry's files, so the signature
covers them.

The key:

- ``GEODE_CACHE_KEY``, when set, is the key itself (at least :data:`MIN_KEY_CHARS`
  characters; a CI secret shared by the machines that share a cache);
- otherwise the file :func:`key_path` (``$XDG_CONFIG_HOME/geode/cache.key``, default
  ``~/.config/geode/cache.key``): made on first use with 32 random bytes (hex), mode
  ``0o600`` in a folder of mode ``0o700``. A key file that is not a regular file owned
  by the user and unreadable by group and others is refused (a warning names it): a
  key others can read signs nothing.

Who signs is decided by the caches: the LLVM object cache when the ``cache_sign`` option
(``GEODE_CACHE_SIGN=1``) is on, the numba cache always (its entries are pickles, see
:mod:`geode.codegen.cache`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from geode.safe_files import make_dirs, read_file

__all__ = ["KEY_ENV", "MIN_KEY_CHARS", "key_path", "sign", "signing_key", "verify"]

log = logging.getLogger(__name__)

#: the environment variable holding the key itself
KEY_ENV = "GEODE_CACHE_KEY"
#: the shortest key accepted from :data:`KEY_ENV`
MIN_KEY_CHARS = 16
#: the field of a manifest that holds its signature
FIELD = "hmac"

_lock = threading.Lock()
_warned: set[str] = set()


def key_path() -> Path:
    """Where the key file lives: ``$XDG_CONFIG_HOME/geode/cache.key`` (default
    ``~/.config/geode/cache.key``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "geode" / "cache.key"


def _warn_once(what: str, message: str) -> None:
    with _lock:
        first = what not in _warned
        _warned.add(what)
    if first:
        log.warning(message)


def signing_key() -> bytes | None:
    """This user's key (see the module docstring), made on first use; None (with a
    warning, once) when there is none usable: signing is then impossible and a cache
    that needs it is not used."""
    env = os.environ.get(KEY_ENV)
    if env:
        if len(env) < MIN_KEY_CHARS:
            _warn_once(KEY_ENV, f"{KEY_ENV} is shorter than {MIN_KEY_CHARS} characters: not used")
            return None
        return env.encode()
    path = key_path()
    key = _read_key(path)
    if key is None and not os.path.lexists(path):
        with contextlib.suppress(OSError):
            _create_key(path)
        key = _read_key(path)
    if key is None:
        _warn_once(
            str(path),
            f"cache signing key {path} is missing, unreadable, or readable or writable by "
            "others (or not a plain file of this user's): signed caches are not used",
        )
    return key


def _read_key(path: Path) -> bytes | None:
    data = read_file(path, 4096, private=True, forbid=stat.S_IRWXG | stat.S_IRWXO)
    if data is None:
        return None
    data = data.strip()
    return data if len(data) >= MIN_KEY_CHARS else None


def _create_key(path: Path) -> None:
    """Put a new random key at ``path`` (mode ``0o600``) unless one is there already:
    written to a temporary file first, then linked in place, so a concurrent reader
    never sees a half-written key and two creators agree on one."""
    make_dirs(path.parent)
    with contextlib.suppress(OSError):
        os.chmod(path.parent, 0o700)
    import secrets  # here and below: a warm start that checks no signature needs none
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp.", dir=path.parent)  # mode 0o600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secrets.token_hex(32) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


def _payload(manifest: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k != FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(manifest: Mapping[str, Any], key: bytes) -> str:
    """The signature of ``manifest`` (its fields but ``hmac``) under ``key``, in hex."""
    import hmac

    return hmac.new(key, _payload(manifest), hashlib.sha256).hexdigest()


def verify(manifest: Mapping[str, Any], key: bytes) -> bool:
    """Whether ``manifest`` carries a valid signature under ``key`` (compared in
    constant time)."""
    got = manifest.get(FIELD)
    if not isinstance(got, str):
        return False
    try:
        import hmac

        return hmac.compare_digest(got, sign(manifest, key))
    except (TypeError, ValueError):
        return False
