"""What the kernel caches trust on disk (issue 39): code planted in an entry is never
executed, folders others can write are refused, signed caches ignore unsigned entries,
the umask is respected, and a FIFO in place of a cache file never blocks.

Both caches: the LLVM backend's object cache (the default) and the numba backend's
(``GEODE_BACKEND=numba``), whose entries hold pickles.
"""

from __future__ import annotations

import pytest

# the numba backend's own tests: numba is an optional extra (CI installs it)
pytest.importorskip("numba", reason='needs numba, an optional extra: pip install "geode[numba]"')

import contextlib
import gc
import hashlib
import json
import logging
import os
import pickle
import signal
import stat
from pathlib import Path

import numpy as np
from test_backend_llvm import eltwise
from test_kernel_cache import check as numba_check
from test_kernel_cache import make_kernel as numba_kernel

import geode
from geode import signing
from geode.codegen import ast as A
from geode.codegen.backends import numba as nb
from geode.codegen.backends.llvm import kernel as kernel_mod
from geode.codegen.backends.llvm import objcache
from geode.codegen.backends.llvm.kernel import compile_kernel
from geode.codegen.backends.numba import kernel as nb_kernel


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    """A fresh XDG_CONFIG_HOME (so a fresh signing key), no GEODE_CACHE_KEY."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    return tmp_path / "config"


@pytest.fixture
def fresh_memos():
    """Forget kernels compiled in this process, so compiles go to the disk cache."""
    kernel_mod.forget_kernels()
    nb_kernel._memo.clear()
    yield
    kernel_mod.forget_kernels()
    nb_kernel._memo.clear()


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging) if the block takes longer than ``seconds``."""

    def expired(signum, frame):
        raise TimeoutError(f"blocked for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


class Payload:
    """Unpickling this makes the folder ``marker``: code run from a cache file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------
# the LLVM object cache
# ---------------------------------------------------------------------------------


def triple_kernel() -> A.Kernel:
    return eltwise(lambda X: X * A.Const(3.0, "float64"), {"X": "float32"}, "float32")


def compile_and_check(cache) -> bool:
    """Compile the kernel through ``cache`` (after forgetting it in memory), run it and
    check its result; returns whether it came from the disk cache."""
    kernel_mod.forget_kernels()
    k = compile_kernel(triple_kernel(), cache_dir=cache)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.zeros_like(x)
    k(x, y, 3, 4)
    np.testing.assert_array_equal(y, x * 3)
    return k.from_cache


def the_entry(cache: Path) -> Path:
    (entry,) = (cache / "kernels").iterdir()
    return entry


def rewrite_manifest(entry: Path, obj: bytes, keep_hmac: bool = False) -> dict:
    """What a writer without the key can do: recompute the manifest's size and hash."""
    manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
    manifest.update(size=len(obj), sha256=sha256(obj))
    if not keep_hmac:
        manifest.pop(signing.FIELD, None)
    (entry / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return manifest


def test_pickle_planted_in_an_object_entry_is_never_executed(tmp_path, fresh_memos) -> None:
    cache = tmp_path / "cache"
    assert not compile_and_check(cache)
    entry = the_entry(cache)
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Payload(marker))
    (entry / "kernel.o").write_bytes(payload)
    rewrite_manifest(entry, payload)

    assert not compile_and_check(cache), "the planted entry was used"
    assert not marker.exists(), "the planted pickle ran"
    assert (entry / "kernel.o").read_bytes()[:4] == b"\x7fELF", "the entry was not rebuilt"
    assert compile_and_check(cache)


def test_object_code_that_does_not_link_is_rebuilt(tmp_path, fresh_memos, caplog) -> None:
    cache = tmp_path / "cache"
    compile_and_check(cache)
    entry = the_entry(cache)
    junk = b"\x7fELF" + bytes(range(256)) * 8
    (entry / "kernel.o").write_bytes(junk)
    rewrite_manifest(entry, junk)
    with caplog.at_level(logging.WARNING):
        assert not compile_and_check(cache)
    assert "does not link, rebuilding" in caplog.text
    assert compile_and_check(cache)


def test_signed_cache_ignores_entries_without_a_valid_signature(
    tmp_path, fresh_memos, config_home
) -> None:
    folder = tmp_path / "cache"
    signed = objcache.CacheLocation(str(folder), sign=True)
    assert not compile_and_check(signed)
    entry = the_entry(folder)
    manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
    assert isinstance(manifest.get(signing.FIELD), str)
    assert compile_and_check(signed)
    assert compile_and_check(folder), "an unsigned reader rejected a signed entry"

    obj = (entry / "kernel.o").read_bytes()
    tampered = obj[:-1] + bytes([obj[-1] ^ 1])
    # an entry re-hashed by someone without the key: signature gone, or stale
    for keep in (False, True):
        rewrite_manifest(entry, tampered, keep_hmac=keep)
        (entry / "kernel.o").write_bytes(tampered)
        assert not compile_and_check(signed), f"tampered entry used (hmac kept: {keep})"
        assert compile_and_check(signed), "the rebuilt entry is not signed"
    # signed with another key
    m = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
    m[signing.FIELD] = signing.sign(m, b"somebody else's key, long enough")
    (entry / "manifest.json").write_text(json.dumps(m), encoding="utf-8")
    assert not compile_and_check(signed)
    # an entry written unsigned is not trusted by a signed reader
    (entry / "manifest.json").unlink()
    assert not compile_and_check(folder)
    assert not compile_and_check(signed)
    assert compile_and_check(signed)


def test_cache_sign_option_and_environment_reach_the_object_cache(
    tmp_path, fresh_memos, config_home, monkeypatch
) -> None:
    g = geode.Graph("signed")
    x = g.input("x", ["N", 8], "float32")
    g.output(geode.ops.exp(x) * 2.0, names=["y"])
    feeds = {"x": np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)}
    want = np.exp(feeds["x"]) * 2

    for name, kwargs in [("opt", {"cache_sign": True}), ("env", {})]:
        folder = tmp_path / name
        if name == "env":
            monkeypatch.setenv("GEODE_CACHE_SIGN", "1")
        model = geode.compile(g, cache_dir=str(folder), **kwargs)
        np.testing.assert_allclose(model(**feeds)["y"], want, rtol=1e-6)
        manifests = list((folder / "kernels").glob("*/manifest.json"))
        assert manifests
        key = signing.signing_key()
        assert all(
            signing.verify(json.loads(p.read_text(encoding="utf-8")), key) for p in manifests
        )
        del model
        gc.collect()


@pytest.mark.parametrize("how", ["group-writable", "other-writable", "kernels-writable"])
def test_a_folder_others_can_write_is_refused(tmp_path, fresh_memos, caplog, how) -> None:
    cache = tmp_path / how
    (cache / "kernels").mkdir(parents=True)
    target = cache / "kernels" if how == "kernels-writable" else cache
    os.chmod(target, 0o777 if how != "group-writable" else 0o775)
    with caplog.at_level(logging.WARNING):
        assert not compile_and_check(cache)
        assert not compile_and_check(cache)
    assert str(cache) in caplog.text and "not private" in caplog.text
    assert list((cache / "kernels").iterdir()) == [], "wrote into a refused folder"
    # the whole pipeline compiles (and runs) without the cache too
    g = geode.Graph("refused")
    x = g.input("x", [4], "float32")
    g.output(x * 2.0 + 1.0, names=["y"])
    model = geode.compile(g, cache_dir=str(cache))
    np.testing.assert_array_equal(model(x=np.ones(4, np.float32))["y"], np.full(4, 3.0))
    assert list((cache / "kernels").iterdir()) == []


def test_a_folder_of_another_user_is_refused(tmp_path, fresh_memos, caplog) -> None:
    cache = tmp_path / "theirs"
    compile_and_check(cache)
    try:
        os.chown(cache, os.getuid() + 4242, -1)
    except PermissionError:
        pytest.skip("changing a folder's owner needs root")
    with caplog.at_level(logging.WARNING):
        assert not compile_and_check(cache)
    assert str(cache) in caplog.text


@pytest.mark.parametrize(
    "mask, file_mode, dir_mode",
    [(0o077, 0o600, 0o700), (0o002, 0o644, 0o755), (0o022, 0o644, 0o755)],
)
def test_cache_files_respect_the_umask(tmp_path, fresh_memos, mask, file_mode, dir_mode) -> None:
    cache = tmp_path / "cache"
    with umask(mask):
        assert not compile_and_check(cache)
        assert compile_and_check(cache), "the entry written under this umask is not used"
    for p in [cache, *cache.rglob("*")]:
        want = dir_mode if p.is_dir() else file_mode
        assert stat.S_IMODE(p.stat().st_mode) == want, p


@pytest.mark.parametrize("which", ["manifest.json", "kernel.o"])
def test_a_fifo_in_place_of_a_cache_file_never_blocks(tmp_path, fresh_memos, which) -> None:
    cache = tmp_path / "cache"
    compile_and_check(cache)
    entry = the_entry(cache)
    (entry / which).unlink()
    os.mkfifo(entry / which)
    with deadline(60):
        assert not compile_and_check(cache)
    assert stat.S_ISREG(os.lstat(entry / which).st_mode), "the FIFO was not replaced"
    assert compile_and_check(cache)


# ---------------------------------------------------------------------------------
# the numba backend's cache: pickles, so every manifest is signed
# ---------------------------------------------------------------------------------


def numba_compile(cache: Path) -> nb.NumbaKernel:
    nb_kernel._memo.clear()
    k = nb.compile_kernel(numba_kernel(2.5, parallel=False), cache_dir=cache)
    numba_check(k, 2.5)
    return k


def test_pickle_planted_in_a_numba_entry_is_never_executed(tmp_path, fresh_memos) -> None:
    cache = tmp_path / "cache"
    assert not numba_compile(cache).from_cache
    assert numba_compile(cache).from_cache
    (entry,) = (cache / "kernels").iterdir()
    manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
    assert signing.verify(manifest, signing.signing_key()), "numba's manifest is not signed"
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Payload(marker))
    for p in [*entry.glob("*.nbi"), *entry.glob("*.nbc")]:
        p.write_bytes(payload)
        manifest["files"][p.name] = sha256(payload)
    for keep in (True, False):  # a stale signature, or none
        m = dict(manifest)
        if not keep:
            m.pop(signing.FIELD)
        (entry / "manifest.json").write_text(json.dumps(m), encoding="utf-8")
        assert not numba_compile(cache).from_cache, "the planted entry was used"
        assert not marker.exists(), "the planted pickle ran"
        assert numba_compile(cache).from_cache
        for p in [*entry.glob("*.nbi"), *entry.glob("*.nbc")]:
            p.write_bytes(payload)


def test_numba_files_are_unpickled_only_if_the_manifest_vouches_for_them(
    tmp_path, fresh_memos
) -> None:
    """A file swapped after the manifest was checked is not unpickled: numba reads the
    bytes once and they must hash to what the verified manifest says."""
    from geode.codegen import cache as kcache

    cache = tmp_path / "cache"
    numba_compile(cache)
    marker = tmp_path / "pwned"
    real = kcache.prepare_entry

    def prepare_then_swap(*args, **kwargs):
        entry = real(*args, **kwargs)
        for p in entry.data_files():
            p.write_bytes(pickle.dumps(Payload(marker)))
        return entry

    kcache.prepare_entry = prepare_then_swap
    try:
        k = numba_compile(cache)
    finally:
        kcache.prepare_entry = real
    assert not k.from_cache and not marker.exists()


def test_numba_cache_in_a_folder_others_can_write_is_not_used(tmp_path, fresh_memos, caplog):
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with caplog.at_level(logging.WARNING):
        assert not numba_compile(cache).from_cache
    assert str(cache) in caplog.text and "not private" in caplog.text
    assert not (cache / "kernels").exists()


def test_numba_cache_without_a_usable_key_is_not_used(
    tmp_path, fresh_memos, config_home, monkeypatch, caplog
) -> None:
    monkeypatch.setenv(signing.KEY_ENV, "too short")
    cache = tmp_path / "cache"
    with caplog.at_level(logging.WARNING):
        assert not numba_compile(cache).from_cache
        assert not numba_compile(cache).from_cache
    assert not list(cache.rglob("manifest.json"))


@pytest.mark.parametrize("which", ["manifest.json", "index"])
def test_a_fifo_in_a_numba_entry_never_blocks(tmp_path, fresh_memos, which) -> None:
    cache = tmp_path / "cache"
    numba_compile(cache)
    (entry,) = (cache / "kernels").iterdir()
    target = entry / which if which == "manifest.json" else next(entry.glob("*.nbi"))
    target.unlink()
    os.mkfifo(target)
    with deadline(120):
        assert not numba_compile(cache).from_cache
    assert numba_compile(cache).from_cache
