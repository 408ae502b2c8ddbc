"""Float division in compiled kernels is IEEE division.

The default fast-math policy used to put ``arcp`` on every ``fdiv``: LLVM then turned
``x / d`` with ``d`` fixed in a loop into ``x * (1 / d)``, and for a subnormal ``d`` the
reciprocal overflows to inf, so finite quotients came out inf and ``0 / d`` NaN (found by
geode.fuzz). Only a divisor whose reciprocal is finite and normal (a constant, an integer
converted to float) keeps ``arcp`` now; the softmax-like scaled stream divides when its
divisor may be subnormal. Both backends are checked bit for bit against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

import geode
from geode import ops


def _quotient_rows(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of dividends (x = 0 included) and one divisor per row: subnormal, the
    smallest subnormal, normal, tiny normal, negative subnormal, zero."""
    info = np.finfo(dtype)
    sub = info.smallest_subnormal
    divisors = np.array([3 * sub, sub, 3.0, info.tiny, -7 * sub, 0.0, 1e-3], dtype)
    row = np.array([info.tiny, 0.0, 1.0, -3.0, 1e-30, -0.0, 2.5e-38, 7.0] * 2, dtype)
    x = np.tile(row, (len(divisors), 1))
    # finite quotients by a subnormal divisor whose reciprocal is inf: what arcp broke
    with np.errstate(over="ignore"):
        assert np.isinf(np.array(1, dtype) / divisors[0])
    assert 0 < row[0] / divisors[0] < np.inf
    return x, divisors


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "backend,d_shape",
    [
        ("llvm", ["N", 1]),
        ("llvm", [1, 1]),
        ("llvm", [1, 16]),
        pytest.param("numba", ["N", 1], marks=pytest.mark.numba),
    ],
)
def test_division_by_a_divisor_fixed_in_the_loop_is_ieee(dtype, backend, d_shape):
    g = geode.Graph("div")
    x = g.input("x", ["N", 16], dtype=dtype)
    d = g.input("d", d_shape, dtype=dtype)
    g.output(x / d, names=["y"])
    model = geode.compile(g, backend=backend)
    xs, divisors = _quotient_rows(dtype)
    for k, dv in enumerate(divisors):
        shape = [len(divisors) if s == "N" else s for s in d_shape]
        ds = np.full(shape, dv, dtype)
        with np.errstate(all="ignore"):
            want = xs / ds
        got = model(x=xs, d=ds)["y"]
        np.testing.assert_array_equal(got, want, err_msg=f"{dtype} divisor {dv!r} (row {k})")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_elementwise_division_is_ieee(dtype):
    g = geode.Graph("div")
    x, d = g.input("x", ["N"], dtype=dtype), g.input("d", ["N"], dtype=dtype)
    g.output(x / d, names=["y"])
    model = geode.compile(g)
    xs, divisors = _quotient_rows(dtype)
    ds = np.repeat(divisors, xs.shape[1])
    with np.errstate(all="ignore"):
        want = xs.reshape(-1) / ds
    np.testing.assert_array_equal(model(x=xs.reshape(-1), d=ds)["y"], want)


@pytest.mark.parametrize("backend", ["llvm", pytest.param("numba", marks=pytest.mark.numba)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_like_row_over_a_subnormal_sum_streams_its_quotient(backend, dtype):
    """``e / sum(e)`` whose sum is subnormal (every ``e`` is): streamed from the row
    buffer (``streaming="0"``), each element divided, not multiplied by an inf reciprocal."""
    shift = 100.0 if dtype == "float32" else 740.0
    g = geode.Graph("sm")
    x = g.input("x", ["N", 4096], dtype=dtype)
    e = ops.exp(x - ops.reduce_max(x, axes=[-1], keepdims=1) - shift)
    g.output(e / ops.reduce_sum(e, axes=[-1], keepdims=1), names=["y"])
    model = geode.compile(g, streaming="0", backend=backend)
    xs = np.zeros((3, 4096), dtype)
    xs[1] = np.linspace(-1.0, 1.0, 4096)
    ee = np.exp(xs - xs.max(-1, keepdims=True) - shift).astype(dtype)
    assert ee[0, 0] < np.finfo(dtype).tiny and ee[0].sum() < np.finfo(dtype).tiny
    got = model(x=xs)["y"]
    np.testing.assert_array_equal(got[0], np.full(4096, 1 / 4096, dtype))  # all e equal
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[1], ee[1] / ee[1].sum(), rtol=0.02)  # subnormal e: few bits
    sources = "".join(k.source for k in model.kernels if k.engine == "aicore")
    assert ("stream.float" in sources or "_g_stream_" in sources) and (
        ".divided" in sources or "_g_stream_divided(" in sources
    )


def _fdiv_lines(model) -> list[str]:
    return [
        line.strip()
        for k in model.kernels
        if k.engine == "aicore"
        for line in k.source.splitlines()
        if " = fdiv " in line
    ]


def test_only_divisors_with_a_normal_reciprocal_keep_arcp():
    g = geode.Graph("policy")
    x = g.input("x", ["N", "M"])
    d = g.input("d", ["N", 1])
    outs = [
        x / d,  # a value: IEEE division
        x / 3.0,  # a constant whose reciprocal is normal: x * (1 / 3)
        x / 1e-40,  # subnormal in float32: its reciprocal overflows
        x / 1e38,  # its reciprocal 1e-38 is subnormal in float32
        ops.reduce_mean(x, axes=[-1], keepdims=1),  # sum / float(M): M >= 1 or 0
    ]
    g.output(*outs, names=[f"y{i}" for i in range(len(outs))])
    model = geode.compile(g, model_cache=False)
    lines = _fdiv_lines(model)
    with_arcp = [ln for ln in lines if " arcp " in ln]
    without = [ln for ln in lines if " arcp " not in ln]
    # by a value and by the two constants without a normal reciprocal
    assert len(without) == 3, lines
    assert not any("0x40" in ln for ln in without), lines  # 3.0 is 0x4008...
    assert with_arcp, lines  # 3.0 and the mean's count keep the multiply
    xs = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    ds = np.full((5, 1), 3e-45, np.float32)
    got = model(x=xs, d=ds)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got["y0"], xs / ds)
        np.testing.assert_array_equal(got["y2"], xs / np.float32(1e-40))
        np.testing.assert_array_equal(got["y3"], xs / np.float32(1e38))
    np.testing.assert_allclose(got["y1"], xs / np.float32(3.0), rtol=2e-7)
    np.testing.assert_allclose(got["y4"], xs.mean(-1, keepdims=True), rtol=1e-6, atol=1e-7)


def test_a_mean_over_a_symbolic_dim_keeps_its_multiply():
    """The count of a mean is an integer converted to float: 1 / count is finite and
    normal (count >= 1), or inf for an empty axis, whose 0 * inf is the same NaN as 0 / 0."""
    g = geode.Graph("mean")
    x = g.input("x", ["N", "M"])
    g.output(ops.reduce_mean(x, axes=[-1], keepdims=1), names=["y"])
    model = geode.compile(g, model_cache=False)
    lines = _fdiv_lines(model)
    assert lines and all(" arcp " in ln for ln in lines), lines
    xs = np.random.default_rng(1).standard_normal((4, 9)).astype(np.float32)
    np.testing.assert_allclose(model(x=xs)["y"], xs.mean(-1, keepdims=True), rtol=1e-6)
    with np.errstate(invalid="ignore"):
        empty = model(x=np.zeros((3, 0), np.float32))["y"]
    assert empty.shape == (3, 1) and np.isnan(empty).all()


def test_fastmath_kernels_keep_their_fast_division():
    g = geode.Graph("fast")
    x, d = g.input("x", ["N", 8]), g.input("d", ["N", 1])
    g.output(x / d, names=["y"])
    lines = _fdiv_lines(geode.compile(g, fastmath=True, model_cache=False))
    assert lines and all(" fast " in ln for ln in lines), lines
