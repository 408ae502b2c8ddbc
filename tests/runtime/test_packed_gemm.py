"""The packed-weight GEMM (runtime/native/sgemm_packed.c): B packed once into panels of 16
columns, C = alpha A @ B + beta C against numpy, on every path the CPU runs (AVX-512F,
AVX2 + FMA, plain C), the same bits on any thread count and on both vector paths."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geode.runtime import native

_PACKED = native.packed_gemm_function()
_BEST = native.set_packed_isa(-1)  # the default path: the best this CPU runs
#: the paths this CPU runs (0 plain C, 1 AVX2, 2 AVX-512)
ISAS = [isa for isa in (0, 1, 2) if isa <= _BEST]


@contextlib.contextmanager
def _path(isa: int):
    native.set_packed_isa(isa)
    try:
        yield
    finally:
        native.set_packed_isa(-1)


def _run(a, bp, n, c=None, alpha=1.0, beta=0.0, threads=0):
    m, k = a.shape
    out = np.full((m, n), np.nan, np.float32) if c is None else c
    lda, ldc = max(k, 1), max(n, 1)
    _PACKED(m, n, k, alpha, a.ctypes.data, lda, bp.ctypes.data, beta, out.ctypes.data, ldc, threads)
    return out


def _operands(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return a, b


SHAPES = [
    (1, 1, 1),
    (1, 5, 1),
    (1, 256, 256),
    (3, 7, 17),
    (7, 13, 37),
    (9, 1, 33),
    (32, 64, 48),
    (33, 65, 129),
    (5, 300, 16),
    (70, 20, 15),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_numpy(isa, shape):
    m, k, n = shape
    a, b = _operands(m, k, n)
    with _path(isa):
        got = _run(a, native.pack_weight(b), n)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 0.0), (2.0, -1.5)])
def test_alpha_beta(isa, alpha, beta):
    a, b = _operands(11, 19, 35)
    c0 = np.random.default_rng(1).standard_normal((11, 35)).astype(np.float32)
    with _path(isa):
        got = _run(a, native.pack_weight(b), 35, c0.copy(), alpha, beta)
    want = alpha * (a.astype(np.float64) @ b) + beta * c0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_empty_sizes():
    a, b = _operands(4, 0, 9)
    bp = native.pack_weight(b)
    assert bp.shape == (1, 0, 16)
    np.testing.assert_array_equal(_run(a, bp, 9), np.zeros((4, 9), np.float32))
    c = np.ones((4, 9), np.float32)
    np.testing.assert_array_equal(_run(a, bp, 9, c, beta=2.0), np.full((4, 9), 2.0))
    a0, b0 = _operands(0, 5, 9)
    assert _run(a0, native.pack_weight(b0), 9).shape == (0, 9)  # nothing to write
    assert native.pack_weight(np.zeros((5, 0), np.float32)).shape == (0, 5, 16)


def test_pack_layout_and_transposed():
    _, b = _operands(1, 6, 21)
    bp = native.pack_weight(b)
    assert bp.shape == (2, 6, 16) and bp.shape[0] * 6 * 16 == native.packed_size(6, 21)
    np.testing.assert_array_equal(bp[0], b[:, :16])
    np.testing.assert_array_equal(bp[1, :, :5], b[:, 16:])
    np.testing.assert_array_equal(bp[1, :, 5:], 0.0)
    bt = np.ascontiguousarray(b.T)  # Gemm's transB: B^T given (N x K)
    np.testing.assert_array_equal(native.pack_weight(bt, transposed=True), bp)


def test_pack_refuses_other_arrays():
    with pytest.raises(ValueError, match="2-D float32"):
        native.pack_weight(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="2-D float32"):
        native.pack_weight(np.zeros((2, 3, 4), np.float32))


def test_set_packed_isa_refuses_unknown_path():
    with pytest.raises(ValueError, match="no path"):
        native.set_packed_isa(3)
    assert native.pool_info()["gemm_packed_isa"] == _BEST


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(8, 96, 512), (300, 64, 40), (1, 256, 1024)])
def test_same_bits_on_any_thread_count(isa, shape):
    """Split by column panels (few rows) or by row blocks (many rows): every element is
    summed in one order, so 1 and 2 threads give the same bits."""
    a, b = _operands(*shape)
    bp = native.pack_weight(b)
    saved = native.get_num_threads()
    native.set_num_threads(2)
    try:
        with _path(isa):
            before = native.pool_info()["launches"]
            two = _run(a, bp, shape[2], threads=2)
            split = native.pool_info()["launches"] > before
            one = _run(a, bp, shape[2], threads=1)
    finally:
        native.set_num_threads(saved)
    assert split  # the pool ran it
    np.testing.assert_array_equal(one, two)


@pytest.mark.skipif(_BEST < 2, reason="no AVX-512F on this CPU")
def test_vector_paths_agree_bitwise():
    """AVX-512 and AVX2 tiles differ in shape, not in arithmetic: the same bits."""
    a, b = _operands(37, 45, 70)
    bp = native.pack_weight(b)
    with _path(2):
        wide = _run(a, bp, 70)
    with _path(1):
        narrow = _run(a, bp, 70)
    np.testing.assert_array_equal(wide, narrow)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(0, 40),
    k=st.integers(0, 40),
    n=st.integers(1, 70),
    isa=st.sampled_from(ISAS),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(m, k, n, isa, seed):
    a, b = _operands(m, k, n, seed)
    with _path(isa):
        got = _run(a, native.pack_weight(b), n, threads=2)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


_BIAS = native.packed_gemm_bias_function()


def _run_bias(a, bp, n, bias, c=None, beta=0.0, threads=0):
    m, k = a.shape
    out = np.full((m, n), np.nan, np.float32) if c is None else c
    lda, ldc = max(k, 1), max(n, 1)
    ptr = None if bias is None else bias.ctypes.data
    _BIAS(
        m, n, k, 1.0, a.ctypes.data, lda, bp.ctypes.data, ptr, beta, out.ctypes.data, ldc, threads
    )
    return out


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(0, 40),
    k=st.integers(0, 40),
    n=st.integers(1, 70),
    isa=st.sampled_from(ISAS),
    residual=st.booleans(),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_bias_and_residual_are_the_bits_of_adding_after(m, k, n, isa, residual, threads, seed):
    """``A @ B + bias (+ C)``: each element its sum, plus its column's bias, plus C's value
    (beta 1), on every path and thread count the same bits as the product alone followed
    by numpy's two float32 adds (``k = 0``: the sums are zeros)."""
    a, b = _operands(m, k, n, seed)
    rng = np.random.default_rng(seed + 1)
    bias = rng.standard_normal(n).astype(np.float32)
    r = rng.standard_normal((m, n)).astype(np.float32)
    bp = native.pack_weight(b)
    with _path(isa):
        plain = _run(a, bp, n, threads=threads)
        got = _run_bias(a, bp, n, bias, r.copy() if residual else None, float(residual), threads)
    want = plain + bias
    if residual:
        want = want + r
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("isa", ISAS)
def test_no_bias_is_the_plain_product(isa):
    a, b = _operands(13, 21, 35)
    bp = native.pack_weight(b)
    with _path(isa):
        np.testing.assert_array_equal(_run_bias(a, bp, 35, None), _run(a, bp, 35))


_AT = native.packed_gemm_at_function()


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 4),
    rows=st.integers(1, 30),
    k=st.integers(0, 30),
    n=st.integers(1, 40),
    isa=st.sampled_from(ISAS),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_a_read_transposed_in_place(batch, rows, k, n, isa, threads, seed):
    """``X [batch, K, R]`` read as ``A = X^T [batch, R, K]`` (row tiles cut at each batch's
    last row), from any first row: the same bits as the product of ``A`` copied out."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, k, rows)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bp = native.pack_weight(b)
    a = np.ascontiguousarray(x.transpose(0, 2, 1)).reshape(batch * rows, k)
    row0 = int(rng.integers(0, batch * rows))
    m = batch * rows - row0
    got = np.full((m, n), np.nan, np.float32)
    with _path(isa):
        want = _run(a[row0:], bp, n, threads=threads)
        _AT(
            m,
            n,
            k,
            1.0,
            x.ctypes.data,
            1,
            rows,
            rows,
            k * rows,
            row0,
            bp.ctypes.data,
            None,
            0.0,
            got.ctypes.data,
            n,
            threads,
        )
    np.testing.assert_array_equal(got, want)
