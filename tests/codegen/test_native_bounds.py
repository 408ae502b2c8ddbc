"""Native kernels read and write only inside their operands: the AVX-512 zmm Winograd
path (masked loads at the borders, items split by output channels) and geode_gemm's
float32 products on geode_sgemm_wide (B packed per call, B^T by 16 x 16 transposes).

Every input sits in a larger buffer between NaN guards (a float read outside an operand
and used turns outputs NaN), every output between canaries (a float written outside it
changes one), the guards more than a zmm vector of 4 x 16 floats wide and of odd length,
so the operands start unaligned. Shapes: tails of 16 columns, 1 row, 1 column, leading
dims wider than the rows, more threads than items."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_conv_winograd import spec_of

from geode.codegen.backends.llvm.conv import conv_kernel
from geode.codegen.backends.llvm.library import blas
from geode.codegen.winograd_weights import transform_filters
from geode.compiler.ops.nn import conv_nd
from geode.runtime import native

pytestmark = pytest.mark.skipif(blas() is None, reason="no BLAS found in numpy's wheel")

GUARD = 67  # floats of guard on each side of an operand
CANARY = np.float32(-12345.5)


def guarded_matrix(x: np.ndarray, ld: int, fill, off: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (2-D) inside a flat buffer at leading dim ``ld``, ``off`` floats after the
    guard, ``fill`` everywhere else (the guards and the gaps between rows): (the buffer,
    the view)."""
    rows, cols = x.shape
    start = GUARD + off
    buf = np.full(start + (rows - 1) * ld + cols + GUARD, fill, np.float32)
    view = np.lib.stride_tricks.as_strided(buf[start:], (rows, cols), (ld * 4, 4))
    view[...] = x
    return buf, view


def guarded(x: np.ndarray, fill) -> tuple[np.ndarray, np.ndarray]:
    """``x`` copied into a contiguous view of a buffer with ``fill`` on both sides."""
    buf = np.full(x.size + 2 * GUARD, fill, np.float32)
    view = buf[GUARD : GUARD + x.size].reshape(x.shape)
    view[...] = x
    return buf, view


def outside(buf: np.ndarray, view: np.ndarray) -> np.ndarray:
    """The floats of ``buf`` that are not ``view``'s (a view into it)."""
    keep = np.ones(buf.size, bool)
    first = (view.__array_interface__["data"][0] - buf.ctypes.data) // 4
    ld = view.strides[0] // 4
    for i in range(view.shape[0]):
        keep[first + i * ld : first + i * ld + view.shape[1]] = False
    return buf[keep]


# ---------------------------------------------------------------- Winograd


def winograd_guarded(n, c, m, h, w, pad, threads, seed) -> None:
    """The F(4x4) conv of the case on the path in use with guarded operands: the
    reference's result, the same bits on every thread count, no canary of Y changed."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    want = conv_nd(x, wt, b, {"pads": list(pad)})
    z = rng.standard_normal(want.shape).astype(np.float32)
    want = np.maximum(want + z, 0)
    spec = spec_of(c, m, pad, True, True, True, winograd_tile=4)
    assert spec.method == "winograd"
    k = conv_kernel(spec)
    ins = [guarded(a, np.nan)[1] for a in (x, transform_filters(wt, 4), b, z)]
    scale = max(1.0, float(np.abs(want).max()))
    first = None
    for t in threads:
        ybuf, y = guarded(np.full(want.shape, np.nan, np.float32), CANARY)
        k(*ins, y, threads=t)
        np.testing.assert_allclose(y, want, rtol=3e-5, atol=3e-5 * scale, err_msg=f"{t}")
        assert (ybuf[:GUARD] == CANARY).all() and (ybuf[-GUARD:] == CANARY).all()
        first = y.copy() if first is None else first
        np.testing.assert_array_equal(y, first, err_msg=f"{t} threads")


def set_isa(isa: int) -> int:
    """Winograd path `isa` (skipped where the CPU cannot run it); returns the previous."""
    try:
        return native._ext._set_winograd_isa(isa)
    except ValueError:
        pytest.skip(f"this CPU cannot run path {isa}")


@pytest.mark.parametrize("isa", [3, 2, 1, 0])
@pytest.mark.parametrize(
    "shape",
    [
        (1, 3, 17, 5, 15, (2, 0, 1, 2)),  # 4 tiles a row (zmm row groups of 4), left pad 0
        (2, 5, 9, 7, 31, (0, 2, 2, 0)),  # 8 tiles a row (groups of 2), last tile partial
        (1, 4, 40, 6, 33, (1, 1, 1, 1)),  # 9 tiles a row: one lane of 16 used
        (1, 2, 33, 3, 132, (0, 1, 0, 2)),  # 33 tiles a row: items of 2 vectors and of 1
        (1, 3, 40, 1, 16, (1, 1, 1, 1)),  # one input row, one item split by channels
        (1, 2, 3, 9, 1, (1, 1, 1, 1)),  # one input column
        (3, 1, 1, 2, 3, (2, 2, 2, 2)),  # pads wider than the window's overlap
    ],
)
def test_winograd_stays_inside_its_operands(isa, shape) -> None:
    """Each vector path on guarded operands, on 1 to 8 threads (more than items)."""
    old = set_isa(isa)
    try:
        winograd_guarded(*shape, threads=(1, 2, 3, 8), seed=11)
    finally:
        native._ext._set_winograd_isa(old)


@st.composite
def conv_cases(draw):
    """A random F(4x4) conv at the widths the zmm path takes (4, 8 and 9+ tiles a row)
    and around them, pads 0 to 2 on each side, output channels around 16."""
    pad = tuple(draw(st.integers(0, 2)) for _ in range(4))
    tw = draw(st.sampled_from([3, 4, 5, 8, 9, 16, 17, 32, 33]))
    ow = 4 * tw - draw(st.integers(0, 3))
    w = ow + 2 - pad[1] - pad[3]
    return {
        "n": draw(st.integers(1, 2)),
        "c": draw(st.integers(1, 9)),
        "m": draw(st.sampled_from([1, 7, 16, 17, 33])),
        "h": draw(st.integers(max(1, 3 - pad[0] - pad[2]), 12)),
        "w": w,
        "pad": pad,
        "seed": draw(st.integers(0, 1000)),
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv_cases())
def test_winograd_zmm_stays_inside_its_operands_over_random_shapes(case) -> None:
    """The default path (zmm where the CPU runs it) on random guarded shapes."""
    winograd_guarded(**case, threads=(1, 3))


# ---------------------------------------------------------------- geode_gemm

_GEMM = native.gemm_function()


def gemm_guarded(m, k, n, trans, beta, pads, offs, threads, rng) -> None:
    """C (+)= A @ B (B^T given when trans) through geode_gemm with every operand guarded,
    at leading dims ``pads`` wider than its rows, starts ``offs`` floats further in."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    _, av = guarded_matrix(a, k + pads[0], np.nan, offs[0])
    _, bv = guarded_matrix(b, b.shape[1] + pads[1], np.nan, offs[1])
    cbuf, cv = guarded_matrix(c0, n + pads[2], CANARY, offs[2])
    before = native.pool_info()["gemm_wide_calls"]
    ops = [(v.__array_interface__["data"][0], v.strides[0] // 4) for v in (av, bv, cv)]
    _GEMM(2 * trans, m, n, k, *ops[0], *ops[1], beta, *ops[2], threads)
    assert native.pool_info()["gemm_wide_calls"] == before + 1
    want = a.astype(np.float64) @ (b.T if trans else b) + (c0 if beta else 0)
    np.testing.assert_allclose(cv, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    assert (outside(cbuf, cv) == CANARY).all()


wide_only = pytest.mark.skipif(
    not native.pool_info()["gemm_wide_kernel"],
    reason="float32 products take geode_sgemm_wide only where its tiles are AVX-512",
)


@wide_only
@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize(
    "m, k, n",
    [(3, 1, 1), (8, 16, 32), (9, 17, 33), (17, 1024, 47), (70, 31, 130), (5, 3, 16)],
)
def test_wide_gemm_stays_inside_its_operands(trans, m, k, n) -> None:
    """Strips of 32 columns and their tails, K tails of the 16 x 16 transposes, row
    tiles of 8 and fewer, K = 1024 (the strip buffer's size), unaligned starts."""
    rng = np.random.default_rng(m * k + n)
    for threads in (1, 2, 3):
        gemm_guarded(m, k, n, trans, 1.0, (1, 3, 2), (1, 2, 3), threads, rng)
    gemm_guarded(m, k, n, trans, 0.0, (0, 0, 0), (0, 0, 0), 2, rng)


@wide_only
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(3, 40),
    k=st.sampled_from([1, 2, 15, 16, 17, 63, 100, 1023, 1024]),
    n=st.integers(1, 99),
    trans=st.integers(0, 1),
    beta=st.sampled_from([0.0, 1.0]),
    pads=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    offs=st.tuples(st.integers(0, 15), st.integers(0, 15), st.integers(0, 15)),
    threads=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_wide_gemm_stays_inside_its_operands_over_random_shapes(
    m, k, n, trans, beta, pads, offs, threads, seed
) -> None:
    """Random shapes, leading dims, starts, beta and thread counts."""
    gemm_guarded(m, k, n, trans, beta, pads, offs, threads, np.random.default_rng(seed))
