"""OpenBLAS's parallel work on geode's native pool (one pool, one thread count).

Each test runs in a fresh process: routing OpenBLAS to the pool is process-wide and
cannot be undone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from geode.codegen.backends.llvm.library import blas

pytestmark = pytest.mark.skipif(
    blas() is None or not blas().set_callback,
    reason="numpy's BLAS has no threads callback (OpenBLAS older than 0.3.27)",
)

_PRELUDE = """
import ctypes, threading
import numpy as np
from geode.codegen.backends.llvm.library import blas, share_pool
from geode.runtime import native
lib = blas()
get_threads = None
for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads"):
    try:
        get_threads = getattr(ctypes.CDLL(lib.where), name)
        break
    except AttributeError:
        pass
rng = np.random.default_rng(0)
a = rng.standard_normal((384, 384)).astype(np.float32)
b = rng.standard_normal((384, 384)).astype(np.float32)
"""


def _run(body: str, **env: str) -> str:
    code = _PRELUDE + textwrap.dedent(body)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GEODE_NUM_THREADS": "2", **env},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_blas_runs_on_the_pool_with_the_same_results():
    _run("""
        before = a @ b
        assert share_pool(lib)
        runs = native.pool_info()["blas_pool_runs"]
        after = a @ b
        assert native.pool_info()["blas_pool_runs"] > runs, native.pool_info()
        assert get_threads() == native.get_num_threads() == 2
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(after, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    """)


def test_blas_thread_count_follows_the_pool():
    _run("""
        share_pool(lib)
        native.set_num_threads(1)
        assert get_threads() == 1
        runs = native.pool_info()["blas_pool_runs"]
        c = a @ b
        assert native.pool_info()["blas_pool_runs"] == runs  # one thread: no job to share
        native.set_num_threads(2)
        assert get_threads() == 2
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-4)
    """)


def test_more_blas_jobs_than_pool_threads_run_on_their_own_threads():
    """Level-3 jobs wait on each other: more of them than the pool's threads must not run
    serially (a deadlock); they get threads of their own."""
    _run("""
        share_pool(lib)
        set_threads = ctypes.CFUNCTYPE(None, ctypes.c_int)(lib.set_threads)
        set_threads(4)  # behind geode's back: 4 jobs, a pool of 2
        runs = native.pool_info()["blas_thread_runs"]
        c = a @ b
        assert native.pool_info()["blas_thread_runs"] > runs, native.pool_info()
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    """)


def test_concurrent_callers_share_the_pool_without_deadlock():
    _run("""
        share_pool(lib)
        want = a @ b
        out = [None] * 6
        def work(i):
            for _ in range(5):
                out[i] = a @ b
        ts = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        [t.start() for t in ts]
        [t.join(60) for t in ts]
        assert not any(t.is_alive() for t in ts), "deadlock"
        for o in out:
            np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-4)
    """)


def test_sharing_can_be_turned_off():
    _run(
        """
        assert not share_pool(lib)
        runs = native.pool_info()["blas_pool_runs"]
        a @ b
        assert native.pool_info()["blas_pool_runs"] == runs
        """,
        GEODE_BLAS_POOL="0",
    )
