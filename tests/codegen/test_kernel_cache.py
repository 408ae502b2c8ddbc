"""The on-disk kernel cache: hits across processes, corrupt entries, keys, maintenance.

The cross-process test starts fresh Python processes (numba's cache only matters
there): two cold ones at once on an empty cache (concurrent writers), then a warm one
that must load the machine code from disk. Their compile times are printed (run with
``-s`` to see them); per the project's conventions nothing asserts on wall time.
"""

from __future__ import annotations

import pytest

# the numba backend's own tests: numba is an optional extra (CI installs it)
pytest.importorskip("numba", reason='needs numba, an optional extra: pip install "geode[numba]"')

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np

from geode.codegen import cache
from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Const,
    For,
    ForKind,
    IterVar,
    Kernel,
    Load,
    Store,
    Var,
)
from geode.codegen.backends import numba as nb
from geode.codegen.backends.numba import kernel as nb_kernel

N, K = Var("N"), Var("K")


def make_kernel(scale: float, parallel: bool = True) -> Kernel:
    """``Y[i, k] = X[i, k] * scale + sum_k X[i, :]`` with a register accumulator."""
    vi, vk = Var("vi"), Var("vk")
    kind = ForKind.PARALLEL if parallel else ForKind.SERIAL
    body = [
        For(
            "i",
            N,
            [
                Block(
                    "init", [IterVar("vi", N)], [Var("i")], [Store("s", (), Const(0.0, "float32"))]
                ),
                For(
                    "k",
                    K,
                    [
                        Block(
                            "sum",
                            [IterVar("vi", N), IterVar("vk", K, "reduce")],
                            [Var("i"), Var("k")],
                            [Store("s", (), Bin("+", Load("s", ()), Load("X", (vi, vk))))],
                        )
                    ],
                ),
                For(
                    "k",
                    K,
                    [
                        Block(
                            "out",
                            [IterVar("vi", N), IterVar("vk", K)],
                            [Var("i"), Var("k")],
                            [
                                Store(
                                    "Y",
                                    (vi, vk),
                                    Bin(
                                        "+",
                                        Bin("*", Load("X", (vi, vk)), Const(scale, "float32")),
                                        Load("s", ()),
                                    ),
                                )
                            ],
                        )
                    ],
                    ForKind.VECTORIZED,
                ),
            ],
            kind,
        )
    ]
    return Kernel(
        f"cached_{'par' if parallel else 'ser'}",
        [Buffer("X", "float32", (N, K))],
        [Buffer("Y", "float32", (N, K))],
        ["N", "K"],
        body,
        temps=[Buffer("s", "float32", (), "register")],
    )


def expected(X: np.ndarray, scale: float) -> np.ndarray:
    return X * np.float32(scale) + X.sum(1, keepdims=True, dtype=np.float32)


def check(k: nb.NumbaKernel, scale: float) -> None:
    X = np.arange(15, dtype=np.float32).reshape(3, 5) / 7
    Y = np.empty_like(X)
    k(X, Y, 3, 5)
    np.testing.assert_allclose(Y, expected(X, scale), rtol=1e-6)


@pytest.fixture
def fresh_memo():
    """Forget in-process compiled kernels so compile_kernel goes to the disk cache."""
    nb_kernel._memo.clear()
    yield
    nb_kernel._memo.clear()


# ---------------------------------------------------------------------------------
# across processes
# ---------------------------------------------------------------------------------

_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import numba
@numba.njit
def _warm(x):
    return x + 1
_warm(1)
numba_init = time.perf_counter() - t0
sys.path.insert(0, {tests!r})
import numpy as np
from test_kernel_cache import make_kernel, expected
from geode.codegen.backends.numba import compile_kernel
k = compile_kernel(make_kernel(2.0), cache_dir=sys.argv[1])
X = np.arange(15, dtype=np.float32).reshape(3, 5) / 7
Y = np.empty_like(X)
k(X, Y, 3, 5)
ok = bool(np.allclose(Y, expected(X, 2.0), rtol=1e-6))
print(json.dumps({{"from_cache": k.from_cache, "compile_seconds": k.compile_seconds,
                   "numba_init_seconds": numba_init, "ok": ok}}))
"""


def _spawn(cache_dir: Path) -> subprocess.Popen:
    script = _SCRIPT.format(tests=str(Path(__file__).parent))
    return subprocess.Popen(
        [sys.executable, "-c", script, str(cache_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_warm_compile_in_new_process_hits_disk_cache(tmp_path: Path) -> None:
    # two cold processes at once: concurrent writers of one entry
    cold = [_result(p) for p in [_spawn(tmp_path), _spawn(tmp_path)]]
    assert all(r["ok"] for r in cold)
    assert not all(r["from_cache"] for r in cold)
    info = cache.cache_info(tmp_path)
    assert info.entries == 1 and info.bytes > 0
    entry = next((tmp_path / cache.KERNEL_AREA).iterdir())
    assert not [p for p in entry.iterdir() if ".tmp." in p.name], "temporary files left behind"
    assert (entry / "manifest.json").exists()

    warm = _result(_spawn(tmp_path))
    assert warm["ok"] and warm["from_cache"]
    cold_s = max(r["compile_seconds"] for r in cold if not r["from_cache"])
    print(
        f"\nkernel compile in a new process: cold {cold_s:.3f}s, warm (disk cache) "
        f"{warm['compile_seconds']:.3f}s (numba start-up {warm['numba_init_seconds']:.2f}s "
        "not included)"
    )


# ---------------------------------------------------------------------------------
# corrupt entries
# ---------------------------------------------------------------------------------


def _entry_dir(cache_dir: Path) -> Path:
    (d,) = list((cache_dir / cache.KERNEL_AREA).iterdir())
    return d


def _corrupt(entry: Path, what: str) -> None:
    module = next(entry.glob("geode_k_*.py"))
    # a chunked kernel has two of each (its entry and its chunk function): the last one
    # in name order is the chunk function's (``..._rows-``), the part that does the work
    index = sorted(entry.glob("*.nbi"))[-1]
    data = sorted(entry.glob("*.nbc"))[-1]
    manifest = entry / "manifest.json"
    if what == "module-truncated":
        module.write_bytes(module.read_bytes()[:40])
    elif what == "module-garbage":
        module.write_bytes(b"import os\nos._exit(3)\n")
    elif what == "index-garbage":
        index.write_bytes(b"\x80\x04garbage" * 10)
    elif what == "index-truncated":
        index.write_bytes(index.read_bytes()[:20])
    elif what == "data-truncated":
        data.write_bytes(data.read_bytes()[: len(data.read_bytes()) // 2])
    elif what == "data-bitflip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif what == "manifest-garbage":
        manifest.write_text("{not json", encoding="utf-8")
    elif what == "manifest-missing":
        manifest.unlink()
    else:  # pragma: no cover
        raise AssertionError(what)


@pytest.mark.parametrize(
    "what",
    [
        "module-truncated",
        "module-garbage",
        "index-garbage",
        "index-truncated",
        "data-truncated",
        "data-bitflip",
        "manifest-garbage",
        "manifest-missing",
    ],
)
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "chunked"])
def test_corrupt_entry_is_rebuilt(
    tmp_path: Path, fresh_memo: None, what: str, parallel: bool
) -> None:
    kern = make_kernel(3.0, parallel=parallel)
    first = nb.compile_kernel(kern, cache_dir=tmp_path)
    assert first.chunked == parallel
    check(first, 3.0)
    entry = _entry_dir(tmp_path)
    _corrupt(entry, what)

    nb_kernel._memo.clear()
    rebuilt = nb.compile_kernel(kern, cache_dir=tmp_path)
    assert not rebuilt.from_cache, "a corrupt entry was trusted"
    check(rebuilt, 3.0)
    assert next(entry.glob("geode_k_*.py")).read_text(encoding="utf-8") == rebuilt.source

    nb_kernel._memo.clear()
    again = nb.compile_kernel(kern, cache_dir=tmp_path)
    assert again.from_cache, "the rebuilt entry was not reused"
    check(again, 3.0)


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "chunked"])
def test_cached_kernel_can_still_be_inspected(
    tmp_path: Path, fresh_memo: None, parallel: bool
) -> None:
    kern = make_kernel(4.0, parallel=parallel)
    nb.compile_kernel(kern, cache_dir=tmp_path)
    nb_kernel._memo.clear()
    k = nb.compile_kernel(kern, cache_dir=tmp_path)
    assert k.from_cache and k.chunked == parallel
    assert "define" in k.llvm and kern.name in k.asm and "ret" in k.asm
    if parallel:  # the chunk function's code comes first, then the entry's
        assert k.asm.index("cached_par_rows") < k.asm.index("_g_launch")
    check(k, 4.0)


# ---------------------------------------------------------------------------------
# keys and maintenance
# ---------------------------------------------------------------------------------


def test_key_depends_on_source_settings_and_environment() -> None:
    src_a = nb.emit_source(make_kernel(2.0))
    src_b = nb.emit_source(make_kernel(2.5))
    src_fast = nb.emit_source(make_kernel(2.0), fastmath=True)
    keys = {cache.cache_key(s) for s in (src_a, src_b, src_fast)}
    assert len(keys) == 3
    assert cache.cache_key(src_a) == cache.cache_key(src_a)
    assert cache.cache_key(src_a, {"opt": "3"}) != cache.cache_key(src_a, {"opt": "2"})
    env = cache.environment_fingerprint()
    for field in (
        "cpu_name",
        "cpu_features",
        "numba",
        "llvmlite",
        "numpy",
        "python",
        "codegen_version",
    ):
        assert env[field]


# ---------------------------------------------------------------------------------
# runtime helpers (the chunk launcher, vmath functions) across processes
# ---------------------------------------------------------------------------------

_HELPER_SCRIPT = r"""
import json, sys
import numpy as np
import geode
from geode import examples
from geode.codegen.backends import chunks, vmath
from geode.codegen.backends import numba as nb
from geode.codegen.backends.numba import kernel as nb_kernel
ex = examples.softmax(hidden=64)
model = geode.compile(ex.graph, cache_dir=sys.argv[1], backend="numba")
(k,) = nb_kernel._memo.values()  # the one native kernel this process compiled
feeds = ex.make_inputs(np.random.default_rng(0), 37)
got, want = model(**feeds), ex.numpy(**feeds)
ok = all(np.allclose(got[n], want[n], rtol=1e-5, atol=1e-7) for n in want)
hits = lambda d: sum(d.stats.cache_hits.values())
print(json.dumps({"ok": ok, "chunked": k.chunked, "from_cache": k.from_cache,
                  "launcher_hits": hits(chunks._g_launch), "exp_hits": hits(vmath.exp_f32),
                  "launcher_compiled": len(chunks._g_launch.signatures),
                  "exp_compiled": len(vmath.exp_f32.signatures)}))
"""


def _helpers_run(cache_dir: Path) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", _HELPER_SCRIPT, str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def _runtime_entries(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / cache.RUNTIME_AREA).iterdir())


def test_runtime_helpers_are_cached_across_processes(tmp_path: Path) -> None:
    """The first process compiles softmax's kernel, the chunk launcher and exp_f32 and
    saves each (helpers under ``runtime/``, apart from the kernel entries); a second
    process whose kernel entry is gone compiles the kernel again but loads both helpers
    from disk; a third loads the kernel, which already holds the helpers' code."""
    first = _helpers_run(tmp_path)
    assert first["ok"] and first["chunked"] and not first["from_cache"]
    assert first["launcher_hits"] == 0 and first["exp_hits"] == 0
    helpers = _runtime_entries(tmp_path)
    assert len(helpers) == 2, helpers  # the launcher and exp_f32
    for d in helpers:
        manifest = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
        assert any(n.endswith(".nbc") for n in manifest["files"])
    assert cache.cache_info(tmp_path).entries == 1  # kernels only

    shutil.rmtree(tmp_path / cache.KERNEL_AREA)
    second = _helpers_run(tmp_path)
    assert second["ok"] and not second["from_cache"]
    assert second["launcher_hits"] == 1 and second["exp_hits"] == 1

    third = _helpers_run(tmp_path)
    assert third["ok"] and third["from_cache"]
    # a kernel loaded from its entry links nothing: neither helper is compiled or loaded
    assert third["launcher_compiled"] == 0 and third["exp_compiled"] == 0

    assert cache.clear_cache(tmp_path) == 1
    assert (
        not (tmp_path / cache.RUNTIME_AREA).exists() and not (tmp_path / cache.KERNEL_AREA).exists()
    )


# each case runs three numba processes (about 7 s on two cores): all in `-m slow`; the
# default suite keeps the cheaper corrupt-entry cases of the kernel cache above
@pytest.mark.parametrize(
    "what",
    [
        pytest.param("data", marks=pytest.mark.slow),
        pytest.param("index", marks=pytest.mark.slow),
        pytest.param("manifest", marks=pytest.mark.slow),
    ],
)
def test_corrupt_runtime_helper_entry_is_rebuilt(tmp_path: Path, what: str) -> None:
    """A helper entry whose machine code, index or manifest was damaged is not trusted:
    the next process compiles the helper again, computes correctly and saves a sound
    entry that a third process loads."""
    _helpers_run(tmp_path)
    for d in _runtime_entries(tmp_path):
        target = {
            "data": next(d.glob("*.nbc")),
            "index": next(d.glob("*.nbi")),
            "manifest": d / "manifest.json",
        }[what]
        target.write_bytes(b"\x00garbage" * 8)
    shutil.rmtree(tmp_path / cache.KERNEL_AREA)
    again = _helpers_run(tmp_path)
    assert again["ok"] and again["launcher_hits"] == 0 and again["exp_hits"] == 0
    shutil.rmtree(tmp_path / cache.KERNEL_AREA)
    healed = _helpers_run(tmp_path)
    assert healed["ok"] and healed["launcher_hits"] == 1 and healed["exp_hits"] == 1


def test_unwritable_cache_compiles_helpers_in_memory(tmp_path: Path, fresh_memo: None) -> None:
    """A cache folder that cannot be created (a file is in the way) costs only the cache:
    the helper compiles in memory."""
    from geode.codegen.backends import vmath

    blocker = tmp_path / "file"
    blocker.write_text("not a folder", encoding="utf-8")
    fn = vmath._export(vmath.exp_f64.py_func)  # a fresh dispatcher, not yet compiled
    cache.compile_helper(fn, (numba.float64,), str(blocker / "cache"))
    assert len(fn.signatures) == 1 and fn(0.0) == 1.0
    assert blocker.read_text(encoding="utf-8") == "not a folder"


def test_different_source_gets_its_own_entry_and_clear(tmp_path: Path, fresh_memo: None) -> None:
    a = nb.compile_kernel(make_kernel(5.0, parallel=False), cache_dir=tmp_path)
    b = nb.compile_kernel(make_kernel(6.0, parallel=False), cache_dir=tmp_path)
    assert a.key != b.key and a.cache_path != b.cache_path
    check(a, 5.0)
    check(b, 6.0)
    info = cache.cache_info(tmp_path)
    assert info.entries == 2 and info.bytes > 2000
    (tmp_path / "unrelated.txt").write_text(
        "keep me", encoding="utf-8"
    )  # clear_cache only touches kernels/
    assert cache.clear_cache(tmp_path) == 2
    assert cache.cache_info(tmp_path).entries == 0
    assert (tmp_path / "unrelated.txt").exists()


def test_in_memory_compile_writes_nothing(tmp_path: Path, fresh_memo: None, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    k = nb.compile_kernel(make_kernel(7.0, parallel=False))
    check(k, 7.0)
    assert k.cache_path is None and not k.from_cache
    assert list(tmp_path.iterdir()) == []


# -- size limit ---------------------------------------------------------------------------------


def _fake_entry(root: Path, area: str, name: str, size: int, used: float) -> Path:
    """An entry folder of ``size`` bytes last used at time ``used``."""
    d = root / area / (name * 32)[:32]
    d.mkdir(parents=True)
    (d / "geode_k.py").write_bytes(b"x" * size)
    os.utime(d, (used, used))
    return d


def test_prune_evicts_least_recently_used_entries(tmp_path: Path) -> None:
    """Oldest entries go first, in both areas, until the cache fits; entries used within
    ``keep_recent`` stay even above the limit; other files are never touched."""
    now = time.time()
    old = _fake_entry(tmp_path, cache.KERNEL_AREA, "a", 4000, now - 5000)
    helper = _fake_entry(tmp_path, cache.RUNTIME_AREA, "b", 3000, now - 4000)
    mid = _fake_entry(tmp_path, cache.KERNEL_AREA, "c", 2000, now - 3000)
    new = _fake_entry(tmp_path, cache.KERNEL_AREA, "d", 1000, now - 10)
    (tmp_path / cache.KERNEL_AREA / "README").write_text("mine", encoding="utf-8")
    done = cache.prune_cache(tmp_path, 5000)
    assert (done.removed, done.freed, done.left) == (2, 7000, 3000)
    assert not old.exists() and not helper.exists() and mid.exists() and new.exists()
    done = cache.prune_cache(tmp_path, 0)  # the recent entry survives even a zero limit
    assert (done.removed, done.left) == (1, 1000) and new.exists() and not mid.exists()
    assert (tmp_path / cache.KERNEL_AREA / "README").read_text(encoding="utf-8") == "mine"
    assert cache.prune_cache(tmp_path, 0, keep_recent=0).removed == 1 and not new.exists()


def test_a_cache_hit_marks_the_entry_used(tmp_path: Path, fresh_memo: None) -> None:
    first = nb.compile_kernel(make_kernel(7.0, parallel=False), cache_dir=tmp_path)
    entry_dir = Path(first.cache_path)
    os.utime(entry_dir, (1000.0, 1000.0))
    cache.prepare_entry(tmp_path, first.key, first.source)
    assert entry_dir.stat().st_mtime > 1000.0
    assert cache.prune_cache(tmp_path, 0).removed == 0  # just used: kept


def test_maybe_prune_runs_at_most_once_per_interval(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cache, "_pruned_at", {})
    stale = _fake_entry(tmp_path, cache.KERNEL_AREA, "e", 5000, 1000.0)
    assert cache.maybe_prune(tmp_path, 0) is None  # no limit
    done = cache.maybe_prune(tmp_path, 1000)
    assert done is not None and done.removed == 1 and not stale.exists()
    again = _fake_entry(tmp_path, cache.KERNEL_AREA, "f", 5000, 1000.0)
    assert cache.maybe_prune(tmp_path, 1000) is None  # this process checked just now
    monkeypatch.setattr(cache, "_pruned_at", {})
    assert cache.maybe_prune(tmp_path, 1000) is None  # another process did (the stamp)
    os.utime(tmp_path / cache._PRUNE_STAMP, (1000.0, 1000.0))
    monkeypatch.setattr(cache, "_pruned_at", {})
    assert cache.maybe_prune(tmp_path, 1000).removed == 1 and not again.exists()


def test_maybe_prune_of_an_unusable_cache_is_not_an_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cache, "_pruned_at", {})
    blocker = tmp_path / "file"
    blocker.write_text("not a folder", encoding="utf-8")
    assert cache.maybe_prune(blocker / "cache", 1000) is None
    assert blocker.read_text(encoding="utf-8") == "not a folder"


def test_maybe_prune_leaves_a_folder_others_can_write_alone(tmp_path: Path, monkeypatch) -> None:
    """geode does not use a cache folder that is not private, so it does not evict from
    it either (nor leave its stamp there)."""
    monkeypatch.setattr(cache, "_pruned_at", {})
    old = time.time() - 10 * cache.KEEP_RECENT
    entry = _fake_entry(tmp_path, cache.KERNEL_AREA, "a" * 32, 4096, old)
    os.chmod(tmp_path, 0o777)
    assert cache.maybe_prune(tmp_path, 1) is None
    assert entry.exists() and not (tmp_path / ".geode-pruned").exists()
    os.chmod(tmp_path, 0o755)
    monkeypatch.setattr(cache, "_pruned_at", {})
    assert cache.maybe_prune(tmp_path, 1).removed == 1


def test_compile_keeps_the_cache_under_its_limit(tmp_path: Path, monkeypatch) -> None:
    """A compile evicts stale entries when the cache is over ``cache_max_mb``."""
    import geode
    from geode import examples

    monkeypatch.setattr(cache, "_pruned_at", {})
    stale = _fake_entry(tmp_path, cache.KERNEL_AREA, "9", 3 << 20, 1000.0)
    geode.compile(examples.softmax(hidden=64).graph, cache_dir=str(tmp_path), cache_max_mb=2)
    assert not stale.exists()
    assert cache.cache_info(tmp_path).entries >= 1  # the new kernel stays


def test_a_numba_kernel_and_its_module_are_forgotten_with_it(fresh_memo) -> None:
    """The memo holds kernels only while they are used: a process compiling kernel after
    kernel does not keep them all, nor their generated modules in ``sys.modules``."""
    import gc
    import weakref

    k = nb.compile_kernel(make_kernel(4.5, parallel=False))
    check(k, 4.5)
    assert nb.compile_kernel(make_kernel(4.5, parallel=False)) is k  # memoized while alive
    import linecache

    name = f"geode_k_{k.key[:32]}"
    assert name in sys.modules
    filename = sys.modules[name].__file__
    assert filename in linecache.cache
    ref = weakref.ref(k)
    del k
    gc.collect()
    assert ref() is None, "the memo kept a kernel nobody uses"
    nb.kernel.release_dead_modules()  # what the next compile does first
    assert name not in sys.modules and filename not in linecache.cache
