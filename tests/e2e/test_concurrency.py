"""Concurrency (issue 39): one model called from many threads at once with different
sizes gives bit-identical results to one thread; processes compiling the same graph
into one cache folder all succeed and leave one valid entry per kernel; a process
killed mid-compile, or an entry left half-written, leaves nothing a later process
trusts (it recompiles and computes correct results).

Child processes run with timeouts; the kill loop is ``slow``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import geode
from geode import ops
from geode.codegen.backends.llvm import kernel as kernel_mod

HERE = Path(__file__).parent
W = np.random.default_rng(7).standard_normal((32, 48)).astype(np.float32)


def graph() -> geode.Graph:
    """A symbolic batch through a GEMM with its epilogue, a normalization (reductions)
    and an elementwise tail: native fused, library and dense kernels."""
    g = geode.Graph("concurrent")
    x = g.input("x", ["N", 32], "float32")
    h = ops.tanh(ops.matmul(x, g.constant(W, name="w")) * 0.5 + 0.25)
    mean = ops.reduce_mean(h, axes=[1])
    var = ops.reduce_mean((h - mean) * (h - mean), axes=[1])
    y = (h - mean) / ops.sqrt(var + 1e-5)
    g.output(ops.exp(y * 0.1), ops.reduce_sum(y * y, axes=[0]), names=["y", "s"])
    return g


def small_graph() -> geode.Graph:
    """Two cheap fused kernels (elementwise and a row reduction): quick to compile."""
    g = geode.Graph("small")
    x = g.input("x", ["N", 32], "float32")
    e = ops.exp(x * 0.5)
    g.output(e + 1.0, ops.reduce_sum(e * e, axes=[1]), names=["y", "s"])
    return g


def small_reference(x: np.ndarray) -> dict[str, np.ndarray]:
    e = np.exp(x * np.float32(0.5))
    return {"y": e + 1, "s": (e * e).sum(1, keepdims=True)}


def reference(x: np.ndarray) -> dict[str, np.ndarray]:
    h = np.tanh((x @ W) * np.float32(0.5) + np.float32(0.25))
    mean = h.mean(1, keepdims=True)
    y = (h - mean) / np.sqrt(((h - mean) ** 2).mean(1, keepdims=True) + np.float32(1e-5))
    return {"y": np.exp(y * np.float32(0.1)), "s": (y * y).sum(0, keepdims=True)}


def test_threads_with_different_sizes_match_one_thread_bit_for_bit() -> None:
    model = geode.compile(graph())
    rng = np.random.default_rng(3)
    sizes = [1, 2, 7, 64, 129, 1000, 4096, 33]
    feeds = {n: rng.standard_normal((n, 32)).astype(np.float32) for n in sizes}
    alone = {n: model(x=feeds[n]) for n in sizes}  # one thread
    for n in sizes:
        want = reference(feeds[n])
        np.testing.assert_allclose(alone[n]["y"], want["y"], rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(alone[n]["s"], want["s"], rtol=2e-3, atol=1e-3)

    n_threads, rounds = 8, 25
    start = threading.Barrier(n_threads)
    mismatches: list[str] = []
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            start.wait(timeout=60)
            for r in range(rounds):
                n = sizes[(t + r) % len(sizes)]  # threads on different sizes at once
                out = model(x=feeds[n])
                for name in ("y", "s"):
                    if not np.array_equal(out[name], alone[n][name]):
                        mismatches.append(f"thread {t} round {r} n={n} {name}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, errors
    assert not mismatches, mismatches[:10]


# ---------------------------------------------------------------------------------
# processes sharing one cache folder
# ---------------------------------------------------------------------------------

_CHILD = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, {here!r})
import test_concurrency as t
import geode
small = sys.argv[2] == "small"
print("ready", flush=True)  # imports done: what follows is the compile
model = geode.compile(t.small_graph() if small else t.graph(), cache_dir=sys.argv[1])
x = np.random.default_rng(5).standard_normal((17, 32)).astype(np.float32)
out = model(x=x)
want = t.small_reference(x) if small else t.reference(x)
ok = bool(np.allclose(out["y"], want["y"], rtol=2e-4, atol=2e-5)
          and np.allclose(out["s"], want["s"], rtol=2e-3, atol=1e-3))
hits = [bool(k.cost.get("from_cache")) for k in model.kernels if k.engine == "aicore"]
print(json.dumps({{"ok": ok, "hits": hits}}))
"""


def spawn(cache: Path, which: str = "small") -> subprocess.Popen:
    """A process compiling ``which`` graph (``small`` or ``full``) into ``cache`` and
    checking its results."""
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(here=str(HERE)), str(cache), which],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GEODE_PROGRESS": "0"},
    )


def result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def valid_entries(cache: Path) -> list[Path]:
    """The cache's kernel entries, each checked: a manifest that parses, an object of
    the size and hash it lists, and no temporary file left."""
    entries = sorted((cache / "kernels").iterdir())
    for e in entries:
        names = {p.name for p in e.iterdir()}
        assert names == {"kernel.o", "manifest.json"}, (e, names)
        m = json.loads((e / "manifest.json").read_text(encoding="utf-8"))
        obj = (e / "kernel.o").read_bytes()
        assert m["size"] == len(obj) and m["sha256"] == hashlib.sha256(obj).hexdigest(), e
    return entries


@pytest.mark.slow  # two fresh processes compiling: about 4 s
def test_two_processes_compiling_into_one_empty_cache(tmp_path) -> None:
    cache = tmp_path / "cache"
    first, second = spawn(cache), spawn(cache)
    a, b = result(first), result(second)
    assert a["ok"] and b["ok"]
    entries = valid_entries(cache)
    assert len(entries) == len(a["hits"]) >= 1, (entries, a)
    warm = result(spawn(cache))
    assert warm["ok"] and all(warm["hits"]), warm


def compile_in_process(cache: Path) -> geode.runtime.model.CompiledModel:
    kernel_mod.forget_kernels()
    return geode.compile(small_graph(), cache_dir=str(cache))


def check(model) -> None:
    x = np.random.default_rng(6).standard_normal((9, 32)).astype(np.float32)
    out, want = model(x=x), small_reference(x)
    np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5)
    np.testing.assert_allclose(out["s"], want["s"], rtol=1e-5)


@pytest.mark.parametrize(
    "damage",
    ["object-only", "half-object", "half-manifest", "temp-files", "stale-manifest", "empty"],
)
def test_a_half_written_entry_is_not_trusted(tmp_path, damage) -> None:
    """What a process killed while writing an entry can leave (objects are written
    first, each file through a temporary file and a rename): none of it is used."""
    cache = tmp_path / "cache"
    check(compile_in_process(cache))
    entries = valid_entries(cache)
    for e in entries:
        obj, manifest = e / "kernel.o", e / "manifest.json"
        data = obj.read_bytes()
        if damage == "object-only":  # killed before the manifest was written
            manifest.unlink()
        elif damage == "half-object":  # a torn object (not possible with the rename)
            obj.write_bytes(data[: len(data) // 2])
        elif damage == "half-manifest":
            manifest.write_bytes(manifest.read_bytes()[:40])
        elif damage == "temp-files":  # temporaries of a killed writer, no entry yet
            manifest.unlink()
            obj.rename(e / "kernel.o.tmp.abc123")
            (e / "manifest.json.tmp.def456").write_bytes(b'{"key": ')
        elif damage == "stale-manifest":  # a new object under an old manifest
            obj.write_bytes(data[:-1] + bytes([data[-1] ^ 0x5A]))
        elif damage == "empty":
            obj.write_bytes(b"")
            manifest.write_bytes(b"")
    model = compile_in_process(cache)
    assert not any(k.cost.get("from_cache") for k in model.kernels if k.engine == "aicore")
    check(model)
    again = compile_in_process(cache)  # the rebuilt entries are used
    assert all(k.cost.get("from_cache") for k in again.kernels if k.engine == "aicore")
    check(again)


@pytest.mark.slow
def test_processes_killed_mid_compile_leave_nothing_trusted(tmp_path) -> None:
    """Processes compiling into one cache are killed (SIGKILL) at random moments, many
    of them inside LLVM or while writing entries; a later process recompiles what is
    missing or damaged and computes correct results, and every entry left is valid."""
    rng = random.Random(39)
    cache = tmp_path / "cache"
    killed = 0
    left: list[int] = []
    for i in range(8):
        if i % 3 == 2 and (cache / "kernels").exists():
            # start over now and then, so kills keep landing in cold compiles
            for e in (cache / "kernels").iterdir():
                for p in e.iterdir():
                    p.unlink()
                e.rmdir()
        p = spawn(cache, "full")
        ready, _, _ = select.select([p.stdout], [], [], 120)
        assert ready and p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.1, 1.5))  # somewhere in the compile (cold: about 1.5 s)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
            files = sum(1 for _ in cache.rglob("*") if _.is_file()) if cache.exists() else 0
            left.append(files)
        p.communicate(timeout=60)
    print(f"\n{killed} of 8 compiling processes killed mid-compile; files left: {left}")
    assert killed >= 3, "the processes finished before the kills: lower the delays"
    survivor = result(spawn(cache, "full"))
    assert survivor["ok"], survivor
    # every entry is valid or gone: leftovers of killed writers are temporaries only
    for e in (cache / "kernels").iterdir():
        for leftover in [p for p in e.iterdir() if ".tmp." in p.name]:
            leftover.unlink()
    valid_entries(cache)
    warm = result(spawn(cache, "full"))
    assert warm["ok"] and all(warm["hits"]), warm
