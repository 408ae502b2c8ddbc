"""geode_gemm: C = A @ B + beta C split into independent blocks over the native pool, each
a single-threaded BLAS call (runtime/native/gemm.c), against numpy."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geode.codegen.backends.llvm.library import blas
from geode.runtime import native

pytestmark = pytest.mark.skipif(blas() is None, reason="no BLAS found in numpy's wheel")

_GEMM = native.gemm_function()
RNG = np.random.default_rng(5)


def _gemm(a, b, c, beta=0.0, threads=0):
    kind = 0 if a.dtype == np.float32 else 1
    m, k = a.shape
    n = b.shape[1]
    _GEMM(
        kind,
        m,
        n,
        k,
        a.ctypes.data,
        a.strides[0] // a.itemsize,
        b.ctypes.data,
        b.strides[0] // b.itemsize,
        beta,
        c.ctypes.data,
        c.strides[0] // c.itemsize,
        threads,
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape", [(300, 200, 500), (1000, 64, 40), (7, 3, 1), (64, 256, 2048), (32, 256, 768)]
)
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_blocks_add_up_to_the_product(dtype, shape, beta):
    m, k, n = shape
    a, b = RNG.standard_normal((m, k)).astype(dtype), RNG.standard_normal((k, n)).astype(dtype)
    c0 = RNG.standard_normal((m, n)).astype(dtype)
    c = c0.copy()
    _gemm(a, b, c, beta)
    want = a.astype(np.float64) @ b + (c0 if beta else 0)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol * k)


def test_large_products_are_split_small_ones_are_one_call():
    """float64: a float32 product this size may take geode's own kernel (the wide tests)."""
    if native.get_num_threads() < 2:
        pytest.skip("one thread: nothing is split")
    a = RNG.standard_normal((256, 256))
    c = np.empty_like(a)
    before = native.pool_info()["gemm_split_calls"]
    _gemm(a, a, c)
    assert native.pool_info()["gemm_split_calls"] == before + 1
    _gemm(a[:8, :8].copy(), a[:8, :8].copy(), c[:8, :8].copy())  # 512 multiply-adds
    _gemm(a, a, c, threads=1)  # asked for one thread
    assert native.pool_info()["gemm_split_calls"] == before + 1


def test_strided_operands_and_k_zero():
    """Leading dims larger than the width (a sub-matrix), and K = 0: C = beta C."""
    big = RNG.standard_normal((50, 90)).astype(np.float32)
    a, b = big[:, :30], big[:30, 40:85]
    c = np.zeros((50, 45), np.float32)
    _gemm(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    c = np.ones((4, 5), np.float32)
    _gemm(np.empty((4, 0), np.float32), np.empty((0, 5), np.float32), c, beta=1.0)
    np.testing.assert_array_equal(c, 1.0)
    _gemm(np.empty((4, 0), np.float32), np.empty((0, 5), np.float32), c, beta=0.0)
    np.testing.assert_array_equal(c, 0.0)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 300),
    k=st.integers(1, 64),
    n=st.integers(1, 300),
    threads=st.integers(0, 3),
)
def test_random_shapes_match_numpy(m, k, n, threads):
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    _gemm(a, b, c, threads=threads)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_the_blas_thread_count_is_restored_after_a_split_gemm():
    """While geode_gemm runs OpenBLAS is single-threaded; afterwards it has the count it had
    (here one the user set) again."""
    lib = blas()
    if not lib.set_threads or not lib.get_threads:
        pytest.skip("the BLAS has no thread-count functions")
    set_threads = ctypes.CFUNCTYPE(None, ctypes.c_int)(lib.set_threads)
    get_threads = ctypes.CFUNCTYPE(ctypes.c_int)(lib.get_threads)
    old = get_threads()
    try:
        set_threads(3)
        a = RNG.standard_normal((256, 256)).astype(np.float32)
        _gemm(a, a, np.empty_like(a))
        assert get_threads() == 3
    finally:
        set_threads(old)


def test_split_blocks_round_every_column_alike():
    """Equal columns stay equal when the product is split (a block must not fall into the
    BLAS's small-matrix kernel, which rounds its edge columns differently): softmax over
    such logits is uniform, as with one call."""
    x = (RNG.standard_normal((1, 2048)) * 1e17).astype(np.float32)
    w = np.full((2048, 1000), 0.02, np.float32)
    c = np.empty((1, 1000), np.float32)
    _gemm(x, w, c, threads=2)
    assert len(np.unique(c)) == 1
    big = np.ones((4, 4000), np.float32)  # 48M multiply-adds: split into column blocks
    c = np.empty((4, 3000), np.float32)
    _gemm(big, np.full((4000, 3000), 0.25, np.float32), c, threads=2)
    assert len(np.unique(c)) == 1


def _thin_calls() -> int:
    return native.pool_info()["gemm_thin_calls"]


@pytest.fixture
def wide_off():
    """The thin kernel's products (3 rows or more) as on a CPU without the AVX-512 packed
    kernel, which takes them where it runs."""
    was = native.set_gemm_wide(False)
    yield
    native.set_gemm_wide(was)


thin_only = pytest.mark.skipif(
    not native.pool_info()["gemm_thin_kernel"], reason="no AVX2 and FMA: the BLAS does all"
)


@thin_only
def test_small_float32_products_use_geode_own_kernel(wide_off):
    """A float32 product too small for the BLAS's blocks but worth two blocks takes geode's
    own kernel on any thread count (split on two, one block on one: the same bits), a
    GEMV (one row) always does; float64 and tiny products never do."""
    a = RNG.standard_normal((32, 256)).astype(np.float32)
    b = RNG.standard_normal((256, 256)).astype(np.float32)
    c = np.empty((32, 256), np.float32)
    before = _thin_calls()
    _gemm(a, b, c, threads=2)  # 2M multiply-adds: one BLAS call, or two thin blocks
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert _thin_calls() == before + 1
    c1 = np.empty_like(c)
    _gemm(a, b, c1, threads=1)  # one thread: the same kernel as one block, the same bits
    assert _thin_calls() == before + 2
    np.testing.assert_array_equal(c1, c)
    x, y = a[:1].copy(), np.empty((1, 256), np.float32)
    _gemm(x, b, y, threads=1)
    np.testing.assert_allclose(y, x.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert _thin_calls() == before + 3
    _gemm(a.astype(np.float64)[:1], b.astype(np.float64), np.empty((1, 256)), threads=2)
    _gemm(a[:8, :8].copy(), b[:8, :8].copy(), np.empty((8, 8), np.float32), threads=2)
    _gemm(a[:2, :64].copy(), b[:64].copy(), np.empty((2, 256), np.float32), threads=1)
    assert _thin_calls() == before + 3  # float64, tiny, one block's work: the BLAS


@thin_only
@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 700),
    n=st.integers(1, 300),
    pad=st.integers(0, 9),
    beta=st.sampled_from([0.0, 1.0]),
    threads=st.integers(1, 3),
)
def test_thin_kernel_matches_numpy(m, k, n, pad, beta, threads):
    """(With the wide kernel kept off: hypothesis does not run function fixtures per
    example.) Every tile shape (rows 1-4, full and masked column vectors, GEMV panels), strips of B
    packed (K up to 512) or read in place, sub-matrix operands (leading dims past the
    width), beta 0 and 1, split or not."""
    a = RNG.standard_normal((m, k + pad)).astype(np.float32)[:, :k]
    b = RNG.standard_normal((k, n + pad)).astype(np.float32)[:, :n]
    full = RNG.standard_normal((m, n + pad)).astype(np.float32)
    c = full[:, :n]
    c0, outside = c.copy(), full[:, n:].copy()
    was = native.set_gemm_wide(False)
    try:
        _gemm(a, b, c, beta, threads)
    finally:
        native.set_gemm_wide(was)
    want = a.astype(np.float64) @ b + (c0 if beta else 0)
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_array_equal(full[:, n:], outside)  # masked stores stay in the row


@thin_only
@pytest.mark.parametrize("m", [1, 2, 3, 5, 32])
def test_thin_blocks_round_every_column_alike(m, wide_off):
    """B with equal columns gives equal columns of C in every row, however the product is
    split and whichever tile (full, masked, GEMV panel) computes a column."""
    a = (RNG.standard_normal((m, 300)) * 1e6).astype(np.float32)
    col = RNG.standard_normal((300, 1)).astype(np.float32)
    b = np.repeat(col, 203, axis=1)
    c = np.empty((m, 203), np.float32)
    _gemm(a, b, c, threads=2)
    for row in c:
        assert len(np.unique(row)) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape", [(300, 200, 500), (1000, 64, 40), (1, 64, 300), (7, 3, 1), (256, 64, 256)]
)
@pytest.mark.parametrize("threads", [1, 2])
def test_b_stored_transposed(dtype, shape, threads):
    """kind + 2: B is given as B^T (row-major, its own leading dim: here a slice of a wider
    array, as attention's K read in place), split by columns or rows like any product,
    never on the thin kernel (its count does not move; on AVX-512 the packed kernel takes
    float32, test_wide_kernel_reads_b_transposed)."""
    m, k, n = shape
    a = RNG.standard_normal((m, k)).astype(dtype)
    wide = RNG.standard_normal((n, 3 * k + 1)).astype(dtype)
    bt = wide[:, k : 2 * k]  # B^T [n, k], leading dim 3k + 1
    c = np.full((m, n), np.nan, dtype)
    thin = _thin_calls()
    kind = (0 if dtype == np.float32 else 1) + 2
    ld = wide.shape[1]
    _GEMM(kind, m, n, k, a.ctypes.data, k, bt.ctypes.data, ld, 0.0, c.ctypes.data, n, threads)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(c, a.astype(np.float64) @ bt.T, rtol=tol, atol=tol * k)
    assert _thin_calls() == thin


def _wide_calls() -> int:
    return native.pool_info()["gemm_wide_calls"]


wide_only = pytest.mark.skipif(
    not native.pool_info()["gemm_wide_kernel"],
    reason="no AVX-512 packed kernel: float32 products keep the BLAS",
)


@wide_only
def test_float32_products_take_the_packed_kernel():
    """A float32 product of 3 rows or more with K up to 1024 (the BLAS's or the thin
    kernel's before) takes geode_sgemm_wide; float64, K past 1024, the packed kernel's path
    set to AVX2 and ``set_gemm_wide(False)`` keep the BLAS."""
    a = RNG.standard_normal((256, 256)).astype(np.float32)
    c = np.empty_like(a)
    thin, split, wide = _thin_calls(), native.pool_info()["gemm_split_calls"], _wide_calls()
    _gemm(a[:32].copy(), a, c[:32].copy(), threads=2)  # the thin kernel's without it
    assert _wide_calls() == wide + 1 and _thin_calls() == thin
    wide += 1
    _gemm(a, a, c, threads=2)
    _gemm(a, a, c, threads=1)
    assert _wide_calls() == wide + 2
    _gemm(a.astype(np.float64), a.astype(np.float64), np.empty((256, 256)), threads=2)
    long_k = RNG.standard_normal((8, 1100)).astype(np.float32)
    _gemm(
        long_k, RNG.standard_normal((1100, 512)).astype(np.float32), np.empty((8, 512), np.float32)
    )
    assert _wide_calls() == wide + 2
    old = native.set_packed_isa(1)
    try:
        assert not native.pool_info()["gemm_wide_kernel"]
        _gemm(a, a, c, threads=2)
    finally:
        native.set_packed_isa(-1)
    assert old == 2 and _wide_calls() == wide + 2
    assert native.set_gemm_wide(False)
    try:
        assert not native.pool_info()["gemm_wide_kernel"]
        _gemm(a, a, c, threads=2)
        np.testing.assert_allclose(c, a.astype(np.float64) @ a, rtol=1e-4, atol=1e-3)
    finally:
        assert not native.set_gemm_wide(True)
    assert _wide_calls() == wide + 2 and native.pool_info()["gemm_wide_kernel"]
    if native.get_num_threads() >= 2:
        assert native.pool_info()["gemm_split_calls"] >= split + 2


@wide_only
@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(3, 70),
    k=st.integers(1, 1100),
    n=st.integers(1, 200),
    pad=st.integers(0, 9),
    beta=st.sampled_from([0.0, 1.0]),
    threads=st.integers(1, 3),
)
def test_wide_kernel_matches_numpy(m, k, n, pad, beta, threads):
    """Strips of 32 columns and the last partial one (a panel or two, masked stores), row
    tiles of 8 and fewer, sub-matrix operands, beta 0 and 1, split or not."""
    a = RNG.standard_normal((m, k + pad)).astype(np.float32)[:, :k]
    b = RNG.standard_normal((k, n + pad)).astype(np.float32)[:, :n]
    full = RNG.standard_normal((m, n + pad)).astype(np.float32)
    c = full[:, :n]
    c0, outside = c.copy(), full[:, n:].copy()
    _gemm(a, b, c, beta, threads)
    want = a.astype(np.float64) @ b + (c0 if beta else 0)
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_array_equal(full[:, n:], outside)


def _packed(a, b, beta, c0):
    m, k = a.shape
    n = b.shape[1]
    bp = native.pack_weight(b)
    c = c0.copy()
    native.packed_gemm_function()(
        m, n, k, 1.0, a.ctypes.data, k, bp.ctypes.data, beta, c.ctypes.data, n, 1
    )
    return c


@wide_only
@pytest.mark.parametrize("shape", [(32, 256, 256), (64, 288, 3136 // 8), (37, 300, 101)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_wide_bits_are_the_packed_and_thin_kernels(shape, beta):
    """Every element one fused multiply-add chain from zero in k order (then plus C): the
    same bits on any thread count, as the packed kernel's on both vector paths, and (32
    rows) as sgemm_thin.c's kernel, which computes the product split on two threads."""
    m, k, n = shape
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    c0 = RNG.standard_normal((m, n)).astype(np.float32)
    outs = []
    for threads in (1, 2, 3):
        c = c0.copy()
        _gemm(a, b, c, beta, threads)
        outs.append(c)
    with_isa = []
    for isa in (2, 1):
        native.set_packed_isa(isa)
        try:
            with_isa.append(_packed(a, b, beta, c0))
        finally:
            native.set_packed_isa(-1)
    for c in outs[1:] + with_isa:
        np.testing.assert_array_equal(c, outs[0])
    if m * k * n == 32 * 256 * 256 and native.get_num_threads() >= 2:
        thin = _thin_calls()
        c = c0.copy()
        was = native.set_gemm_wide(False)
        try:
            _gemm(a, b, c, beta, threads=2)  # two thin blocks
        finally:
            native.set_gemm_wide(was)
        assert _thin_calls() == thin + 1
        np.testing.assert_array_equal(c, outs[0])


@wide_only
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(3, 40),
    k=st.integers(1, 300),
    n=st.integers(1, 100),
    pad=st.integers(0, 5),
    beta=st.sampled_from([0.0, 1.0]),
    threads=st.integers(1, 3),
)
def test_wide_kernel_reads_b_transposed(m, k, n, pad, beta, threads):
    """kind + 2 (B^T given, a slice of a wider array) on geode_sgemm_wide: B^T's 16 x 16
    blocks transposed into panels (K's last block partial), the bits of the packed kernel
    with B^T packed once (geode_sgemm_pack's transB)."""
    a = RNG.standard_normal((m, k)).astype(np.float32)
    wide = RNG.standard_normal((n, k + pad)).astype(np.float32)
    bt = wide[:, :k]
    c0 = RNG.standard_normal((m, n)).astype(np.float32)
    c = c0.copy()
    before = _wide_calls()
    _GEMM(2, m, n, k, a.ctypes.data, k, bt.ctypes.data, k + pad, beta, c.ctypes.data, n, threads)
    assert _wide_calls() == before + 1
    np.testing.assert_allclose(
        c, a.astype(np.float64) @ bt.T + (c0 if beta else 0), rtol=1e-4, atol=1e-4 * np.sqrt(k)
    )
    bp = native.pack_weight(np.ascontiguousarray(bt), transposed=True)
    want = c0.copy()
    native.packed_gemm_function()(
        m, n, k, 1.0, a.ctypes.data, k, bp.ctypes.data, beta, want.ctypes.data, n, 1
    )
    np.testing.assert_array_equal(c, want)


@thin_only
@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("shape", [(2, 432, 1600), (2, 1100, 700), (4, 1100, 300), (32, 500, 256)])
def test_products_give_the_same_bits_on_any_thread_count(shape, wide):
    """A float32 product of a few rows (K past the wide kernel's 1024 too) or with K up to
    512 (the wide kernel off too, as on a CPU without it) takes the same kernel at 1, 2
    and 3 threads: the same bits (a conv's GEMM promises them)."""
    m, k, n = shape
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    was = native.set_gemm_wide(wide)
    try:
        got = []
        for threads in (1, 2, 3):
            c = np.empty((m, n), np.float32)
            _gemm(a, b, c, threads=threads)
            got.append(c)
    finally:
        native.set_gemm_wide(was)
    np.testing.assert_allclose(got[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])


_NO_BLAS = """
import numpy as np
from geode.runtime import native
f = native.gemm_function()
native.set_gemm_wide(False)
rng = np.random.default_rng(0)
for kind, dt in ((0, np.float32), (1, np.float64)):
    a, b = rng.random((5, 7)).astype(dt), rng.random((7, 9)).astype(dt)
    c = np.ones((5, 9), dt)
    f(kind, 5, 9, 7, a.ctypes.data, 7, b.ctypes.data, 9, 1.0, c.ctypes.data, 9, 1)
    np.testing.assert_allclose(c, a @ b + 1, rtol=1e-5)
    bt, c2 = np.ascontiguousarray(b.T), np.empty((5, 9), dt)
    f(kind + 2, 5, 9, 7, a.ctypes.data, 7, bt.ctypes.data, 7, 0.0, c2.ctypes.data, 9, 2)
    np.testing.assert_allclose(c2, a @ b, rtol=1e-5)
print("computed")
"""


def test_gemm_without_a_configured_blas_computes_rather_than_crashes():
    """In a process where nothing configured the BLAS (no compile, no model load), a direct
    call of ``geode_gemm`` computes the product with plain loops instead of calling a null
    function."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _NO_BLAS], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "computed"


def _set_wide_direct(on: bool) -> bool:
    """geode_sgemm_wide as if its scratch could not be had (the unbuffered fallback)."""
    fn = ctypes.CDLL(native._ext.__file__).geode_sgemm_wide_set_direct
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return bool(fn(int(on)))


@wide_only
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_wide_without_scratch_gives_the_same_bits(trans, beta):
    """Out of memory for the strip, geode_sgemm_wide sums each element straight from B (B
    or B^T) in the same order: the bits of the buffered path."""
    m, k, n = 19, 300, 83
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((n, k) if trans else (k, n)).astype(np.float32)
    c0 = RNG.standard_normal((m, n)).astype(np.float32)
    outs = []
    for direct in (False, True):
        c = c0.copy()
        was = _set_wide_direct(direct)
        try:
            before = _wide_calls()
            _GEMM(
                2 * trans,
                m,
                n,
                k,
                a.ctypes.data,
                k,
                b.ctypes.data,
                k if trans else n,
                beta,
                c.ctypes.data,
                n,
                1,
            )
            assert _wide_calls() == before + 1
        finally:
            _set_wide_direct(was)
        outs.append(c)
    want = a.astype(np.float64) @ (b.T if trans else b) + (c0 if beta else 0)
    np.testing.assert_allclose(outs[1], want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_array_equal(outs[1], outs[0])


@wide_only
def test_wide_runs_on_a_thread_with_a_small_stack():
    """The strip of B (128 KiB at K 1024) lives in the thread's scratch, not on its stack: a
    Python thread started with a 96 KiB stack computes the product (on the calling thread:
    threads=1) without overflowing it."""
    import threading

    m, k, n = 16, 1024, 64
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    before, done = _wide_calls(), []

    def run() -> None:
        _gemm(a, b, c, 0.0, threads=1)
        done.append(True)

    old = threading.stack_size(96 << 10)
    try:
        t = threading.Thread(target=run)
        t.start()
        t.join()
    finally:
        threading.stack_size(old)
    assert done and _wide_calls() == before + 1
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))
