"""Accuracy, special values and vectorization of geode.codegen.backends.vmath.

Every function is checked in its own (non-parallel) njit loop against a higher-precision
reference: float32 functions against float64 numpy/math, float64 functions against
``np.longdouble`` (80-bit on x86) or mpmath. Errors are measured in ulps of the correctly
rounded result (subnormal ulp below the normal range) and reported in assertion messages.
"""

from __future__ import annotations

import pytest

# the numba backend's own tests: numba is an optional extra (CI installs it)
pytest.importorskip("numba", reason='needs numba, an optional extra: pip install "geode[numba]"')

import math
import re
import zlib
from collections.abc import Callable

import mpmath
import numba
import numpy as np

from geode.codegen import ast
from geode.codegen.backends import vmath

NAMES = ["exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "sin", "cos"]
DTYPES = {"float32": np.float32, "float64": np.float64}
SUFFIX = {"float32": "f32", "float64": "f64"}

#: ulp bounds asserted per (function, dtype); the measured maxima are 0.3-0.9 ulp below
#: (float32: exp 1.05, expm1 1.52, log 0.82, log1p 0.81, tanh 2.30, sigmoid 2.30, erf 1.01,
#: sin/cos 0.66; float64: 0.98, 1.71, 0.83, 0.81, 2.55, 2.37, 0.95, 0.81).
MAX_ULP = {
    "exp": (1.5, 1.5),
    "expm1": (2.0, 2.0),
    "log": (1.5, 1.5),
    "log1p": (1.5, 1.5),
    "tanh": (3.0, 3.0),
    "sigmoid": (3.0, 3.0),
    "erf": (2.0, 2.0),
    "sin": (1.5, 1.5),
    "cos": (1.5, 1.5),
}

#: interesting input ranges (float32, float64), sampled densely on top of random bit patterns
RANGES = {
    "exp": ((-110.0, 95.0), (-760.0, 720.0)),
    "expm1": ((-20.0, 95.0), (-45.0, 720.0)),
    "log": ((0.0, 4.0), (0.0, 4.0)),
    "log1p": ((-1.0, 4.0), (-1.0, 4.0)),
    "tanh": ((-12.0, 12.0), (-22.0, 22.0)),
    "sigmoid": ((-110.0, 110.0), (-760.0, 760.0)),
    "erf": ((-4.5, 4.5), (-6.5, 6.5)),
    "sin": ((-20.0, 20.0), (-20.0, 20.0)),
    "cos": ((-20.0, 20.0), (-20.0, 20.0)),
}

#: points around range reductions, splits and thresholds (both signs are added)
EDGES = {
    "exp": [
        88.72283,
        88.72284,
        88.7228391,
        709.78,
        709.7827128933840,
        87.33655,
        103.972,
        103.9721,
        745.13,
        745.1332191019412,
        708.39,
        0.34657359,
        1e-30,
    ],
    "expm1": [0.34657359, 17.3, 17.4, 37.4, 88.72283, 709.78, 1e-30, 1e-10],
    "log": [
        1.0,
        0.70710677,
        0.7071068,
        1.4142135,
        1.4142137,
        2.0**-126,
        2.0**-149,
        2.0**-1022,
        5e-324,
        3.4028235e38,
        1.7976931348623157e308,
        1.0000001,
        0.99999994,
    ],
    "log1p": [
        1e-30,
        1e-8,
        -0.29289322,
        0.41421357,
        -0.99999994,
        -0.9999999999999999,
        3.4028235e38,
        1.7976931348623157e308,
    ],
    "tanh": [1e-30, 1e-8, 0.55, 0.625, 9.0, 10.0, 19.0, 20.0],
    "sigmoid": [
        1e-30,
        0.3466,
        0.3467,
        86.0,
        86.01,
        87.3,
        88.8,
        103.3,
        103.9,
        104.0,
        104.99,
        105.0,
        105.01,
        707.0,
        707.01,
        708.3,
        745.0,
        745.13,
        745.9,
        746.0,
        746.01,
    ],
    "erf": [1e-30, 1e-8, 0.75, 0.875, 2.0, 3.92, 3.95, 4.0, 5.9, 6.0],
    "sin": [
        np.pi / 4,
        np.pi / 2,
        np.pi,
        3 * np.pi / 2,
        2 * np.pi,
        1e6,
        1e22,
        1.5e38,
        2.0**-27,
        1e-30,
    ],
    "cos": [
        np.pi / 4,
        np.pi / 2,
        np.pi,
        3 * np.pi / 2,
        2 * np.pi,
        1e6,
        1e22,
        1.5e38,
        2.0**-27,
        1e-30,
    ],
}

# expected results of special inputs: (x, y); y "nan" means NaN, floats compare exactly
# (including the sign of zero where it is given as -0.0)
INF, NAN = math.inf, math.nan
SPECIALS = {
    "exp": [(NAN, NAN), (INF, INF), (-INF, 0.0), (0.0, 1.0), (1000.0, INF), (-1000.0, 0.0)],
    "expm1": [(NAN, NAN), (INF, INF), (-INF, -1.0), (0.0, 0.0), (1000.0, INF), (-1000.0, -1.0)],
    "log": [
        (NAN, NAN),
        (INF, INF),
        (0.0, -INF),
        (-0.0, -INF),
        (-1.0, NAN),
        (-INF, NAN),
        (1.0, 0.0),
    ],
    "log1p": [(NAN, NAN), (INF, INF), (-1.0, -INF), (-2.0, NAN), (-INF, NAN), (0.0, 0.0)],
    "tanh": [
        (NAN, NAN),
        (INF, 1.0),
        (-INF, -1.0),
        (50.0, 1.0),
        (-50.0, -1.0),
        (0.0, 0.0),
        (-0.0, -0.0),
    ],
    "sigmoid": [(NAN, NAN), (INF, 1.0), (-INF, 0.0), (0.0, 0.5), (1000.0, 1.0), (-1000.0, 0.0)],
    "erf": [
        (NAN, NAN),
        (INF, 1.0),
        (-INF, -1.0),
        (10.0, 1.0),
        (-10.0, -1.0),
        (0.0, 0.0),
        (-0.0, -0.0),
    ],
    "sin": [(NAN, NAN), (INF, NAN), (-INF, NAN), (0.0, 0.0), (-0.0, -0.0)],
    "cos": [(NAN, NAN), (INF, NAN), (-INF, NAN), (0.0, 1.0), (-0.0, 1.0)],
}

_LONG = np.finfo(np.longdouble).nmant >= 63  # x86 80-bit extended: a good float64 reference


# ---------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------


def _loop_kernel(f: Callable, fastmath: bool | set[str] = False) -> Callable:
    @numba.njit(fastmath=fastmath)
    def kernel(x, y):
        for i in range(x.size):
            y[i] = f(x[i])

    return kernel


@pytest.fixture(scope="module")
def kernels() -> Callable[..., Callable]:
    """Compiled ``kernel(x, y)`` per (name, dtype, fastmath), compiled once for the module."""
    cache: dict[tuple[str, str, bool], Callable] = {}

    def get(name: str, dtype: str, fastmath: bool = False) -> Callable:
        if (name, dtype, fastmath) not in cache:
            cache[name, dtype, fastmath] = _loop_kernel(vmath.VMATH[name, dtype], fastmath)
        return cache[name, dtype, fastmath]

    return get


def _run(kernel: Callable, x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    kernel(x, y)
    return y


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _mp_ref(name: str, x: np.ndarray) -> np.ndarray:
    """mpmath reference, returned as longdouble (hi + lo) when extended precision exists."""
    fns = {
        "exp": mpmath.exp,
        "expm1": mpmath.expm1,
        "log": mpmath.log,
        "log1p": mpmath.log1p,
        "tanh": mpmath.tanh,
        "sigmoid": lambda v: 1 / (1 + mpmath.exp(-v)),
        "erf": mpmath.erf,
        "sin": mpmath.sin,
        "cos": mpmath.cos,
    }
    out = np.empty(x.shape, np.longdouble)
    with mpmath.workdps(40):
        for i, v in enumerate(x.tolist()):
            if math.isnan(v) or (name in ("log", "log1p") and v < (0 if name == "log" else -1)):
                out[i] = np.nan
                continue
            r = fns[name](mpmath.mpf(v))
            hi = float(r) if abs(r) < mpmath.mpf("1.8e308") else math.copysign(INF, float(r))
            lo = float(r - hi) if math.isfinite(hi) else 0.0
            out[i] = np.longdouble(hi) + np.longdouble(lo)
    return out


def _reference(name: str, x: np.ndarray) -> np.ndarray:
    """Reference values in a wider type than ``x``."""
    np_fns = {
        "exp": np.exp,
        "expm1": np.expm1,
        "log": np.log,
        "log1p": np.log1p,
        "tanh": np.tanh,
        "sigmoid": _sigmoid,
        "sin": np.sin,
        "cos": np.cos,
    }
    with np.errstate(all="ignore"):
        if x.dtype == np.float32:
            wide = x.astype(np.float64)
            if name == "erf":
                return np.frompyfunc(math.erf, 1, 1)(wide).astype(np.float64)
            return np_fns[name](wide)
        if name == "erf" or not _LONG:
            return _mp_ref(name, x)
        return np_fns[name](x.astype(np.longdouble))


def ulp_error(y: np.ndarray, ref: np.ndarray, dtype: type) -> np.ndarray:
    """|y - ref| in ulps of ``dtype`` at ``ref`` (subnormal ulp below the normal range).

    Equal infinities and NaN/NaN count 0; an infinite ``y`` counts 0 when ``|ref|`` is beyond
    the largest finite value (it rounds to inf); any other NaN/inf mismatch counts inf.
    """
    fi = np.finfo(dtype)
    wide = np.longdouble if dtype == np.float64 else np.float64
    ref = np.asarray(ref, wide)
    yw = y.astype(wide)
    with np.errstate(all="ignore"):
        mag = np.maximum(np.abs(ref), wide(fi.tiny))
        exponent = np.floor(np.log2(mag.astype(np.float64) if dtype == np.float32 else mag))
        ulp = np.exp2(exponent - fi.nmant).astype(wide)
        err = np.abs(yw - ref) / ulp
    err = np.where(np.isnan(err), np.inf, err)
    same_nan = np.isnan(y) & np.isnan(ref)
    same_inf = np.isinf(y) & (np.sign(yw) == np.sign(ref)) & (np.abs(ref) > wide(fi.max))
    err[same_nan | same_inf] = 0
    return err.astype(np.float64)


def _samples(name: str, dtype: str, n: int, seed: int) -> np.ndarray:
    """Random bit patterns (the whole finite range), dense uniform samples of the interesting
    range, log-uniform magnitudes, and the edge points with their neighbours."""
    dt = DTYPES[dtype]
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        return _samples_impl(name, dtype, n, rng, dt)


def _samples_impl(name: str, dtype: str, n: int, rng: np.random.Generator, dt: type) -> np.ndarray:
    lo, hi = RANGES[name][dtype == "float64"]
    if dt == np.float32:
        bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    else:
        bits = rng.integers(0, 2**63, n, dtype=np.int64).view(np.float64) * rng.choice(
            [-1.0, 1.0], n
        )
    fi = np.finfo(dt)
    logmag = np.exp(
        rng.uniform(np.log(float(fi.smallest_subnormal)) + 1, np.log(float(fi.max)) - 1, n // 4)
    )
    edges = np.array(EDGES[name], dtype=dt)
    edges = np.concatenate([edges, -edges])
    near = [np.nextafter(edges, dt(np.inf)), np.nextafter(edges, dt(-np.inf))]
    parts = [bits, rng.uniform(lo, hi, n), logmag * rng.choice([-1.0, 1.0], n // 4), edges, *near]
    if name in ("log", "log1p"):  # the mantissa range [sqrt(1/2), sqrt(2)) and around 1
        parts += [rng.uniform(0.5, 2.0, n // 2), 1 + rng.uniform(-1e-3, 1e-3, n // 4)]
    if name in ("sin", "cos"):  # close to multiples of pi/2
        k = rng.integers(1, 1 << 40, n // 8).astype(np.float64)
        parts += [k * (np.pi / 2), np.nextafter(k * (np.pi / 2), np.inf)]
    x = np.concatenate([np.asarray(p, dtype=np.float64).astype(dt) for p in parts])
    return x[np.isfinite(x)]


# ---------------------------------------------------------------------------------
# accuracy
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fastmath", [False, True], ids=["ieee", "fastmath"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_accuracy(kernels, name: str, dtype: str, fastmath: bool) -> None:
    """Max ulp error over the whole range; with ``fastmath=True`` in the calling kernel the
    error-free steps are protected, so the bound only grows by one ulp (arcp, contraction)."""
    dt = DTYPES[dtype]
    slow_ref = dtype == "float64" and (name == "erf" or not _LONG)
    n = 4000 if slow_ref else (300_000 if not fastmath else 100_000)
    x = _samples(name, dtype, n, seed=zlib.crc32(f"{name}/{dtype}".encode()))
    y = _run(kernels(name, dtype, fastmath), x)
    assert y.dtype == dt
    err = ulp_error(y, _reference(name, x), dt)
    worst = int(np.argmax(err))
    bound = MAX_ULP[name][dtype == "float64"] + (1.0 if fastmath else 0.0)
    assert err[worst] <= bound, (
        f"{name}_{SUFFIX[dtype]} (fastmath={fastmath}): max error {err[worst]:.3f} ulp > {bound} "
        f"at x={x[worst]!r}: got {y[worst]!r}, mean {err.mean():.3f} ulp over {x.size} points"
    )


def test_erf_f64_dense_against_math(kernels) -> None:
    """A dense float64 erf check against math.erf (itself within ~1 ulp), both signs."""
    x = np.random.default_rng(7).uniform(-6.5, 6.5, 200_000)
    y = _run(kernels("erf", "float64"), x)
    ref = np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)
    err = ulp_error(y, ref, np.float64)
    assert err.max() <= 3.0, (
        f"erf_f64 vs math.erf: max {err.max():.3f} ulp at x={x[np.argmax(err)]!r}"
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_subnormal_results(kernels, dtype: str) -> None:
    """exp and sigmoid produce correctly rounded-ish subnormals (not flushed) near underflow."""
    dt = DTYPES[dtype]
    lo, hi = (-103.9, -87.4) if dt == np.float32 else (-745.0, -708.4)
    x = np.linspace(lo, hi, 20_001).astype(dt)
    for name in ("exp", "sigmoid"):
        y = _run(kernels(name, dtype), x)
        assert np.all(y > 0), f"{name}_{SUFFIX[dtype]} flushed a subnormal result to 0"
        err = ulp_error(y, _reference(name, x), dt)
        assert err.max() <= 1.0, (
            f"{name}_{SUFFIX[dtype]} subnormal: {err.max():.3f} ulp at x={x[np.argmax(err)]!r}"
        )


# ---------------------------------------------------------------------------------
# special values
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fastmath", [False, True], ids=["ieee", "fastmath"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_special_values(kernels, name: str, dtype: str, fastmath: bool) -> None:
    """NaN/inf/zero inputs give the C99 results, also inside a ``fastmath=True`` kernel (the
    NaN/inf tests are integer bit tests); the sign of zero is checked without fastmath."""
    dt = DTYPES[dtype]
    xs, expected = zip(*SPECIALS[name])
    x = np.array(xs, dtype=dt)
    y = _run(kernels(name, dtype, fastmath), x)
    for xi, yi, ei in zip(x, y, expected):
        what = f"{name}_{SUFFIX[dtype]}({xi!r}) with fastmath={fastmath} = {yi!r}, expected {ei!r}"
        if math.isnan(ei):
            assert np.isnan(yi), what
        else:
            assert yi == ei, what
            if not fastmath:
                assert np.signbit(yi) == (math.copysign(1.0, ei) < 0), what


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_saturation(kernels, dtype: str) -> None:
    """Large arguments saturate exactly: tanh -> +-1, erf -> +-1, sigmoid -> 0/1, exp
    overflow -> inf and underflow -> 0, expm1 -> -1; NaN payloads of any sign stay NaN."""
    dt = DTYPES[dtype]
    big = np.array([1e3, 1e30, np.finfo(dt).max], dtype=dt)
    run = {name: (lambda v, n=name: _run(kernels(n, dtype), v.astype(dt))) for name in NAMES}
    for sign in (1, -1):
        assert np.all(run["tanh"](sign * big) == sign), "tanh must saturate to +-1"
        assert np.all(run["erf"](sign * big) == sign), "erf must saturate to +-1"
    assert np.all(run["sigmoid"](big) == 1) and np.all(run["sigmoid"](-big) == 0)
    assert np.all(run["exp"](big) == np.inf) and np.all(run["exp"](-big) == 0)
    assert np.all(run["expm1"](-big) == -1) and np.all(run["expm1"](big) == np.inf)
    nans = np.array([np.nan, -np.nan], dtype=dt)
    for name in NAMES:
        assert np.all(np.isnan(run[name](nans))), f"{name}_{SUFFIX[dtype]} lost a NaN"


def test_scalar_call_keeps_dtype() -> None:
    """Called from Python (compiled on demand) the f32 functions compute in and return float32,
    also for float64 arguments, which they convert."""
    assert abs(vmath.exp_f32(1.0) - math.e) <= 2.5e-7
    assert vmath.log_f64(math.e) == 1.0
    assert {sig.return_type for sig in vmath.exp_f32.nopython_signatures} == {numba.float32}


def test_two_over_pi_digits() -> None:
    """The embedded 2/pi bits used by the sin/cos range reduction are right."""
    nbits = len(vmath._TWO_OVER_PI_HEX) * 4
    with mpmath.workprec(nbits + 64):
        expected = int(mpmath.floor(2 / mpmath.pi * mpmath.mpf(2) ** nbits))
    assert int(vmath._TWO_OVER_PI_HEX, 16) == expected


def test_vmath_table() -> None:
    extra = {"expm1", "log1p", "sigmoid", "one_plus_tanh"}
    for (op, dtype), fn in vmath.VMATH.items():
        assert op in ast.UN_OPS or op in extra, op
        assert dtype in DTYPES and fn is getattr(vmath, f"{op}_{SUFFIX[dtype]}")
        assert fn.__doc__ and "method" in fn.__doc__.lower(), op
    assert {op for op, _ in vmath.VMATH} == set(NAMES) | {"one_plus_tanh"}


# ---------------------------------------------------------------------------------
# one_plus_tanh: 1 + tanh(x) without the cancellation
# ---------------------------------------------------------------------------------


def _one_plus_tanh_inputs(dtype: type) -> np.ndarray:
    rng = np.random.default_rng(7)
    lim = 50.0 if dtype == np.float32 else 400.0
    dense = np.linspace(-lim, lim, 400_001).astype(dtype)
    normal = (rng.standard_normal(200_000) * 4).astype(dtype)
    tiny = np.array([1e-30, -1e-30, 1e-8, -1e-8, 0.0, -0.0], dtype)
    edges = np.array([-43.5, -44.0, -44.2, -44.4, 43.5, 44.5, -354.0, -355.0], dtype)
    return np.concatenate([dense, normal, tiny, edges])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_plus_tanh_accuracy(kernels, dtype: str) -> None:
    """Within 3 ulp of 2 / (1 + exp(-2x)) in a wider type wherever that is a normal number;
    below the normal range (x < -44.2 in float32) the result is flushed: 0 or tiny."""
    dt = DTYPES[dtype]
    x = _one_plus_tanh_inputs(dt)
    y = _run(kernels("one_plus_tanh", dtype), x)
    wide = np.float64 if dt == np.float32 else np.longdouble
    with np.errstate(over="ignore"):
        ref = wide(2) / (wide(1) + np.exp(wide(-2) * x.astype(wide)))
    normal = ref >= wide(np.finfo(dt).tiny)
    err = ulp_error(y[normal], ref[normal], dt)
    worst = int(np.argmax(err))
    assert err.max() <= 3.0, f"{dtype}: {err.max():.2f} ulp at x={x[normal][worst]!r}"
    assert np.all((y[~normal] >= 0) & (y[~normal] <= 2 * np.finfo(dt).tiny))
    # where plain float arithmetic cancels, this keeps the digits: 1 + tanh(-10)
    (v,) = _run(kernels("one_plus_tanh", dtype), np.array([-10.0], dt))
    assert abs(float(v) / (2 / (1 + math.exp(20))) - 1) < 1e-6


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_plus_tanh_special_values(kernels, dtype: str) -> None:
    dt = DTYPES[dtype]
    x = np.array([NAN, INF, -INF, 0.0, -0.0, 1e4, -1e4], dt)
    y = _run(kernels("one_plus_tanh", dtype), x)
    assert np.isnan(y[0])
    np.testing.assert_array_equal(y[1:], np.array([2.0, 0.0, 1.0, 1.0, 2.0, 0.0], dt))


# ---------------------------------------------------------------------------------
# div_one_plus_exp: a / (1 + exp(t)), the tanh GELU's 0.5 * a * (1 + tanh(z)) at t = -2z
# ---------------------------------------------------------------------------------

#: t above which exp(t) overflows and div_one_plus_exp flushes (float32, float64), and the
#: bound on the exact result there, as a multiple of |a|
_GATE_FLUSH = {np.float32: (88.2, 2.0**-127.4), np.float64: (709.2, 2.0**-1023.4)}


def _gate_kernel(dtype: str, fastmath: bool = False) -> Callable:
    f = vmath.VMATH2["div_one_plus_exp", dtype]
    flags = True if fastmath else {"contract", "arcp", "reassoc"}

    @numba.njit(fastmath=flags)
    def kernel(a, t, y):
        for i in range(a.size):
            y[i] = f(a[i], t[i])

    return kernel


def _gate_inputs(dt: type) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    n = 300_000
    lim = 100.0 if dt == np.float32 else 800.0
    t = np.concatenate([np.linspace(-lim, lim, n), rng.standard_normal(n) * 8])
    mag = np.concatenate([rng.standard_normal(n) * 10, np.exp(rng.uniform(-30, 30, n))])
    return (mag * rng.choice([-1.0, 1.0], 2 * n)).astype(dt), t.astype(dt)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_div_one_plus_exp_accuracy(dtype: str) -> None:
    """Within 3 ulp (2.3 / 2.04 measured) of the exact ``a / (1 + exp(t))`` wherever
    exp(t) does not overflow; beyond (t > 88.2 in float32) the result is that value or a
    zero of a's sign, and the exact value is tiny."""
    dt = DTYPES[dtype]
    a, t = _gate_inputs(dt)
    y = np.empty_like(a)
    _gate_kernel(dtype)(a, t, y)
    wide = np.float64 if dt == np.float32 else np.longdouble
    with np.errstate(over="ignore"):
        ref = a.astype(wide) / (wide(1) + np.exp(t.astype(wide)))
    tlim, bound = _GATE_FLUSH[dt]
    err = ulp_error(y, ref, dt)  # in subnormal ulps below the normal range
    close = err <= 3.0
    worst = int(np.argmax(np.where(t < tlim, err, 0)))
    assert np.all(close[t < tlim]), (
        f"{dtype}: {err[worst]:.2f} ulp at a={a[worst]!r}, t={t[worst]!r}"
    )
    flushed = ~close
    assert np.all(y[flushed] == 0) and np.all(np.signbit(y[flushed]) == np.signbit(a[flushed]))
    assert np.all(np.abs(ref[flushed]) <= np.abs(a[flushed]).astype(wide) * wide(bound))
    assert flushed.sum() < 0.1 * a.size


@pytest.mark.parametrize("fastmath", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_div_one_plus_exp_is_the_tanh_gate_at_special_values(dtype: str, fastmath: bool) -> None:
    """At ``t = -2z`` the special values are numpy's ``0.5 * a * (1 + tanh(z))``, under
    any caller flags (the function keeps its own)."""
    dt = DTYPES[dtype]
    a = np.array([NAN, 1, INF, -INF, INF, 0.0, -0.0, -0.0, 5, -3, 2], dt)
    z = np.array([0, NAN, -INF, -INF, INF, -INF, 0, 1e4, -1e4, INF, 0], dt)
    y = np.empty_like(a)
    _gate_kernel(dtype, fastmath)(a, dt(-2) * z, y)
    with np.errstate(all="ignore"):
        want = dt(0.5) * a * (1 + np.tanh(z))
    np.testing.assert_array_equal(y, want)
    assert np.array_equal(np.signbit(y[~np.isnan(y)]), np.signbit(want[~np.isnan(want)]))


# ---------------------------------------------------------------------------------
# vectorization
# ---------------------------------------------------------------------------------

_LIBM = re.compile(r"\$(?:expf?|expm1f?|logf?|log1pf?|tanhf?|erff?|sinf?|cosf?)\b")
_PACKED_F32 = re.compile(r"\bv(?:fmadd|fnmadd|fmsub|mul|add|sub|div)\w*ps\s+[^\n]*%[yz]mm")


def _prange_asm(f: Callable, dtype: type) -> str:
    @numba.njit(parallel=True, fastmath={"contract"})
    def kernel(x, y):
        for i in numba.prange(x.size):
            y[i] = f(x[i])

    x = np.linspace(-3, 3, 64).astype(dtype)
    kernel(x, np.empty_like(x))
    return kernel.inspect_asm(kernel.signatures[0])


def test_libm_regex_sees_scalar_calls() -> None:
    """The asm pattern used below does spot a libm call (math.exp is one without SVML)."""

    @numba.njit
    def kernel(x, y):
        for i in range(x.size):
            y[i] = math.exp(x[i])

    x = np.ones(4, np.float32)
    kernel(x, np.empty_like(x))
    assert _LIBM.search(kernel.inspect_asm(kernel.signatures[0]))


@pytest.mark.parametrize("name", ["exp", "tanh", "one_plus_tanh"])
def test_float32_loop_vectorizes(name: str) -> None:
    asm = _prange_asm(vmath.VMATH[name, "float32"], np.float32)
    packed = _PACKED_F32.findall(asm)
    assert len(packed) >= 8, (
        f"{name}_f32 prange loop has only {len(packed)} packed float32 ymm/zmm ops"
    )
    assert re.search(r"vfn?madd\w*ps\s+[^\n]*%[yz]mm", asm), f"{name}_f32: no packed FMA"
    assert not _LIBM.search(asm), f"{name}_f32 loop calls libm: {_LIBM.search(asm).group(0)}"
    assert not re.search(r"\bv\w+pd\s+[^\n]*%[yz]mm", asm), f"{name}_f32 computes in float64"


def _vmath_calls(ir: str, name: str) -> list[str]:
    """The call instructions to vmath's ``name`` in optimized LLVM IR (by mangled name)."""
    pattern = re.compile(rf"\bcall\b.*@\"?_ZN\w*5vmath{len(name)}{name}")
    return [ln.strip() for ln in ir.splitlines() if pattern.search(ln)]


_ALL_FUNCTIONS = sorted(
    {*vmath.VMATH.items(), *vmath.VMATH_IEEE.items()}, key=lambda kv: kv[1].__name__
)


@pytest.mark.parametrize("fn", [f for _, f in _ALL_FUNCTIONS], ids=lambda f: f.__name__)
def test_public_functions_are_inlined_into_the_caller(fn) -> None:
    """Every public function is compiled once and inlined into its caller by LLVM
    (``forceinline``), including the largest (sin/cos/erf in float64, which LLVM's cost
    model would leave as calls): the caller's optimized IR holds no call to it, so the
    caller's loop can vectorize over it."""
    dt = np.float32 if fn.__name__.endswith("_f32") else np.float64
    kernel = _loop_kernel(fn, {"contract", "reassoc", "arcp"})
    x = np.linspace(0.125, 3, 64).astype(dt)  # inside every domain (log)
    y = _run(kernel, x)
    ir = kernel.inspect_llvm(kernel.signatures[0])
    calls = _vmath_calls(ir, fn.__name__)
    assert not calls, f"{fn.__name__} is called, not inlined: {calls[0][:120]}"
    assert np.isfinite(y).all() and y.dtype == dt


def test_inlining_check_sees_a_call() -> None:
    """The check above finds a call when the function is not forced inline."""
    plain = numba.njit(error_model="numpy")(vmath.sin_f64.py_func)
    kernel = _loop_kernel(plain, {"contract", "reassoc", "arcp"})
    _run(kernel, np.ones(4))
    ir = kernel.inspect_llvm(kernel.signatures[0])
    assert _vmath_calls(ir, "sin_f64")


# ---------------------------------------------------------------------------------
# exp_f32 at its boundaries, in compiled kernels; strict division under fastmath
# ---------------------------------------------------------------------------------

#: underflow to 0 and the subnormal range (n down to -150), the normal/subnormal edge,
#: the a = max(n, -125) split of the scaling, the overflow edge and both clamps (-104, 89)
EXP_F32_BOUNDARIES = [-103.97, -103.28, -87.34, -87.33, -86.64, 88.72, 88.7229, 89.0, 89.1, -104.5]


def _exp_f32_boundary_inputs() -> np.ndarray:
    pts = np.array(EXP_F32_BOUNDARIES, np.float32)
    dense = [
        np.linspace(lo, hi, 4001, dtype=np.float32)
        for lo, hi in ((-104.5, -102.5), (-88.0, -86.0), (88.5, 89.2))
    ]
    up, down = np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(-np.inf))
    return np.concatenate([pts, up, down, *dense])


def _geode_unary(op: str, dtype: str, fastmath: bool):
    """A geode kernel ``Y[i] = op(X[i])`` (vectorized loop) compiled by the numba backend."""
    from geode.codegen.ast import Block, Buffer, For, ForKind, IterVar, Kernel, Load, Store, Un, Var
    from geode.codegen.backends import numba as nb

    n, vi = Var("N"), Var("vi")
    blk = Block(op, [IterVar("vi", n)], [Var("i")], [Store("Y", (vi,), Un(op, Load("X", (vi,))))])
    k = Kernel(
        f"{op}_{dtype}",
        [Buffer("X", dtype, (n,))],
        [Buffer("Y", dtype, (n,))],
        ["N"],
        [For("i", n, [blk], ForKind.VECTORIZED)],
    )
    native = nb.compile_kernel(k, fastmath=fastmath)

    def run(x: np.ndarray) -> np.ndarray:
        y = np.full_like(x, 7.0)
        native(x, y, x.size)
        return y

    run.native = native  # type: ignore[attr-defined]
    return run


@pytest.mark.parametrize("fastmath", [False, True], ids=["ieee", "fastmath"])
@pytest.mark.parametrize("via", ["njit", "geode"])
def test_exp_f32_boundaries(kernels, via: str, fastmath: bool) -> None:
    """Within 1 ulp of exp in float64 rounded to float32 (counting ulps as steps between
    float32 values, so subnormal results are held to the subnormal ulp); overflow gives inf
    exactly, and the special values are exact."""
    run = (
        (lambda v: _run(kernels("exp", "float32", fastmath), v))
        if via == "njit"
        else _geode_unary("exp", "float32", fastmath)
    )
    x = _exp_f32_boundary_inputs()
    y = run(x)
    assert y.dtype == np.float32
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64)).astype(np.float32)
    inf = np.isinf(ref)
    assert inf.any() and (ref == 0).any() and (ref < np.finfo(np.float32).tiny).sum() > 1000
    np.testing.assert_array_equal(y[inf], ref[inf], err_msg="overflow must give inf exactly")
    assert np.all(np.isfinite(y[~inf])) and np.all(y >= 0)
    steps = np.abs(y.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
    worst = int(np.argmax(steps))
    assert steps[worst] <= 1, (
        f"exp_f32({x[worst]!r}) = {y[worst]!r}, exp in float64 rounded: {ref[worst]!r} "
        f"({steps[worst]} float32 steps apart; via {via}, fastmath={fastmath})"
    )
    at = {v: y[i] for i, v in enumerate(EXP_F32_BOUNDARIES)}
    assert at[88.7229] == at[89.0] == at[89.1] == np.inf  # overflow, the clamp, beyond it
    assert np.isfinite(at[88.72]) and at[-104.5] == 0  # below the low clamp: exactly 0
    assert at[-103.28] == np.finfo(np.float32).smallest_subnormal
    special = np.array([-np.inf, np.inf, np.nan, -np.nan, 0.0, -0.0], np.float32)
    ys = run(special)
    assert ys[0] == 0 and not np.signbit(ys[0])
    assert ys[1] == np.inf
    assert np.isnan(ys[2]) and np.isnan(ys[3])
    assert ys[4] == 1 and ys[5] == 1


_RECIPROCAL = re.compile(r"\bvrcp\w*")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [8, 16, 17])
def test_div_stays_exact_under_fastmath(kernels, dtype: str, n: int) -> None:
    """sigmoid(0) = 1 / (1 + 1) is 0.5 exactly in a fastmath=True caller: the division is
    not turned into a reciprocal estimate (arcp) in the vector loop or its remainder."""
    dt = DTYPES[dtype]
    x = np.zeros(n, dt)
    njit_k = kernels("sigmoid", dtype, True)
    geode_k = _geode_unary("sigmoid", dtype, True)
    for what, y in (("njit", _run(njit_k, x)), ("geode", geode_k(x))):
        assert y.dtype == dt
        np.testing.assert_array_equal(y, np.full(n, 0.5, dt), err_msg=f"{what} n={n}")
    for what, asm in (
        ("njit", njit_k.inspect_asm(njit_k.signatures[0])),
        ("geode", geode_k.native.asm),
    ):
        found = _RECIPROCAL.search(asm)
        assert not found, f"{what} fastmath sigmoid uses a reciprocal estimate: {found.group(0)}"


# ---------------------------------------------------------------------------------
# the exp scaling: ldexp (vscalef) and two normal factors give identical results
# ---------------------------------------------------------------------------------


def _scaling_inputs(dtype: str) -> np.ndarray:
    """Every exponent exp can produce (normal, subnormal, underflow, overflow), dense
    around the edges, plus special values and random bits; an odd count so vector loops
    also run their scalar remainder."""
    dt = DTYPES[dtype]
    lo, hi = (-110.0, 95.0) if dt == np.float32 else (-760.0, 720.0)
    x = np.concatenate(
        [
            np.linspace(lo, hi, 400_001),
            _samples("exp", dtype, 20_000, seed=11),
            np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0]),
        ]
    ).astype(dt)
    return x


def _compile_with_scalef(flag: bool, name: str, scalar: bool) -> Callable:
    """A fresh njit kernel calling a fresh copy of the vmath function (compiled once per
    process otherwise), so the intrinsic's lowering runs again, with ``vmath.SCALEF``."""
    f = vmath._export(vmath.VMATH[name].py_func)
    old = vmath.SCALEF
    vmath.SCALEF = flag
    try:
        if scalar:  # one call per element through a non-inlined scalar function

            @numba.njit(inline="never")
            def one(v):
                return f(v)

            @numba.njit
            def kernel(x, y):
                for i in range(x.size):
                    y[i] = one(x[i])

        else:
            kernel = _loop_kernel(f, {"contract", "reassoc", "arcp"})
        probe = np.zeros(3, DTYPES[name[1]])
        kernel(probe, np.empty_like(probe))  # compile now, while the flag is set
    finally:
        vmath.SCALEF = old
    return kernel


@pytest.mark.parametrize("scalar", [False, True], ids=["loop", "scalar"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["exp", "sigmoid"])
def test_scaling_paths_bitwise_equal(name: str, dtype: str, scalar: bool) -> None:
    """exp and sigmoid give bit-identical results with the ldexp scaling and with the two
    normal factors, over every exponent range (subnormal results and overflow included),
    in vectorized loops and in scalar code."""
    x = _scaling_inputs(dtype)
    a = _compile_with_scalef(True, (name, dtype), scalar)
    b = _compile_with_scalef(False, (name, dtype), scalar)
    ya, yb = np.empty_like(x), np.empty_like(x)
    a(x, ya)
    b(x, yb)
    asm_a, asm_b = (k.inspect_asm(k.signatures[0]) for k in (a, b))
    assert "vscalef" not in asm_b and ("vscalef" in asm_a or "ldexp" in asm_a)
    same = (ya.view(f"u{x.itemsize}") == yb.view(f"u{x.itemsize}")) | (np.isnan(ya) & np.isnan(yb))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (
        f"{name}_{SUFFIX[dtype]}: {bad.size} results differ between the scalings, first at "
        f"x={x[bad[0]]!r}: ldexp {ya[bad[0]]!r}, two factors {yb[bad[0]]!r}"
    )
    assert (ya == 0).any() and np.isinf(ya).any() == (name == "exp")
    tiny = np.finfo(x.dtype).tiny
    assert ((ya > 0) & (ya < tiny)).sum() > 100, "the subnormal range was not exercised"


@pytest.mark.parametrize("scalef", [True, False], ids=["ldexp", "two-factors"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scale2_from_rounded_sum_equals_ldexp(dtype: str, scalef: bool) -> None:
    """``_scale2_rnd(p, n + 1.5 * 2**mant)`` (the exponent read from the rounded sum exp
    already holds) is bit for bit ``ldexp(p, n)`` (rounded once) for every exponent exp
    can need (subnormal, underflow to zero, overflow to inf) and mantissas over
    ``[0.5, 2)``, NaN included, on both scaling paths."""
    dt = DTYPES[dtype]
    info = np.finfo(dt)
    rnd = dt(1.5 * 2.0**info.nmant)
    lo, hi = (-160, 129) if dt == np.float32 else (-1090, 1025)  # what exp can need
    n = np.repeat(np.arange(lo, hi, dtype=dt), 7)
    p = np.random.default_rng(5).uniform(0.5, 2.0, n.size).astype(dt)
    p[::97] = np.nan
    old = vmath.SCALEF
    vmath.SCALEF = scalef
    try:

        @numba.njit
        def scaled(p, n, b):
            for i in range(p.size):
                b[i] = vmath._scale2_rnd(p[i], n[i] + rnd)

        b = np.empty_like(p)
        scaled(p, n, b)
    finally:
        vmath.SCALEF = old
    with np.errstate(over="ignore"):
        a = np.ldexp(p, n.astype(np.int32))
    assert np.array_equal(a, b, equal_nan=True)
    assert np.isnan(a[::97]).all() and (a == 0).any() and np.isinf(a).any()
    assert ((a > 0) & (a < info.tiny)).any(), "no subnormal result was produced"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow2_rounded_is_two_to_the_n(dtype: str) -> None:
    """``_pow2_rounded(fma(x, log2(e), c))`` is exactly ``2**n`` (``_RNDB``) or
    ``2**(n - 1)`` (``_RNDB1``) with ``n = rint(x * log2(e))``, for every ``n`` whose power
    is normal: the exponent bias folded into the rounding constant lands in the exponent
    field with one shift."""
    dt = DTYPES[dtype]
    suf = SUFFIX[dtype]
    info = np.finfo(dt)
    rndb, rndb1 = getattr(vmath, f"_RNDB_{suf.upper()}"), getattr(vmath, f"_RNDB1_{suf.upper()}")
    n = np.arange(info.minexp + 1, info.maxexp, dtype=dt)  # 2**(n-1) and 2**n both normal
    x = (n + np.random.default_rng(3).uniform(-0.49, 0.49, n.size)) * dt(math.log(2))
    x = x.astype(dt)

    @numba.njit
    def run(x, a, b):
        for i in range(x.size):
            a[i] = vmath._pow2_rounded(vmath._fma(x[i], dt(math.log2(math.e)), rndb))
            b[i] = vmath._pow2_rounded(vmath._fma(x[i], dt(math.log2(math.e)), rndb1))

    a, b = np.empty_like(x), np.empty_like(x)
    run(x, a, b)
    want = np.ldexp(np.ones_like(x), np.rint(x.astype(np.float64) / math.log(2)).astype(int))
    assert np.array_equal(a, want), f"first mismatch at n={n[np.argmax(a != want)]}"
    assert np.array_equal(b, want / 2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tanh_expm1_agrees_with_expm1(dtype: str) -> None:
    """tanh's clamp-free ``expm1`` of ``2|x|`` (``_expm1_pos``: ``2**n`` from the rounding
    step's bits, one FMA; ln2 as one rounded constant) is bit for bit the general
    :func:`expm1` where ``n = 0`` (zero and tiny arguments included), and elsewhere on
    tanh's whole range ``[0, 2 * clamp]`` differs from it by no more than the reduction's
    stated error ``n * |ln2 - fl(ln2)|`` plus a few roundings; NaN propagates."""
    dt = DTYPES[dtype]
    suf = SUFFIX[dtype]
    top = 2 * float(getattr(vmath, f"_TANH_CLAMP_{suf.upper()}"))
    rng = np.random.default_rng(4)
    x = np.concatenate(
        [rng.uniform(0, top, 200_000), rng.uniform(0, 1e-3, 20_000), [0.0, 1e-30, top, np.nan]]
    ).astype(dt)
    pos = getattr(vmath, f"_expm1_pos_{suf}")
    gen = getattr(vmath, f"expm1_{suf}")

    @numba.njit
    def run(x, a, b):
        for i in range(x.size):
            a[i] = pos(x[i])
            b[i] = gen(x[i])

    a, b = np.empty_like(x), np.empty_like(x)
    run(x, a, b)
    assert np.isnan(a[-1]) and np.isnan(b[-1])
    a, b, xs = a[:-1].astype(np.float64), b[:-1].astype(np.float64), x[:-1].astype(np.float64)
    n = np.rint(xs / math.log(2))
    small = n == 0
    assert small.sum() > 20_000 and np.array_equal(a[small], b[small])
    with mpmath.workdps(40):
        delta = float(abs(mpmath.log(2) - mpmath.mpf(float(dt(math.log(2))))))
    big = ~small
    rel = np.abs(a[big] - b[big]) / np.abs(b[big])
    bound = n[big] * delta + 4 * float(np.finfo(dt).eps)
    worst = int(np.argmax(rel - bound))
    assert np.all(rel <= bound), (
        f"x={xs[big][worst]!r}: relative difference {rel[worst]:.3g} > {bound[worst]:.3g}"
    )
    assert np.any(a != b), "the one-constant reduction should differ somewhere"


def test_exp_uses_vscalef_on_avx512() -> None:
    """On AVX-512 hosts exp's scaling is one vscalefps per vector (no shift/multiply pair)."""
    if not vmath._target_has_scalef():
        pytest.skip("host without AVX-512F/VL: exp scales with two normal factors")
    asm = _prange_asm(vmath.VMATH["exp", "float32"], np.float32)
    assert re.search(r"vscalefps\s+[^\n]*%zmm", asm), "exp_f32 loop does not use vscalefps zmm"
    assert not _LIBM.search(asm), "exp_f32 loop calls libm (ldexpf?)"


# ---------------------------------------------------------------------------------
# the variants without a final NaN test (kernels compiled without nnan)
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [False, {"arcp", "contract", "reassoc"}], ids=["ieee", "geode"])
@pytest.mark.parametrize("key", sorted(vmath.VMATH_IEEE))
def test_ieee_variants_equal_the_guarded_functions(key, flags) -> None:
    """In a kernel without ``nnan`` (plain IEEE, or geode's default flags) each variant
    returns bit for bit what the function with the final NaN test returns, over random
    bits, the interesting range, the edges, NaN of both signs and the infinities."""
    name, dtype = key
    dt = DTYPES[dtype]
    x = np.concatenate(
        [
            _samples(name, dtype, 200_000, seed=zlib.crc32(f"ieee/{name}/{dtype}".encode())),
            np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], dt),
        ]
    ).astype(dt)
    y_ieee = _run(_loop_kernel(vmath.VMATH_IEEE[key], flags), x)
    y_full = _run(_loop_kernel(vmath.VMATH[key], flags), x)
    same = (y_ieee.view(f"u{x.itemsize}") == y_full.view(f"u{x.itemsize}")) | (
        np.isnan(y_ieee) & np.isnan(y_full)
    )
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (
        f"{name}_ieee_{SUFFIX[dtype]}: x={x[bad[0]]!r} gives {y_ieee[bad[0]]!r}, "
        f"the guarded function {y_full[bad[0]]!r}"
    )
    assert np.isnan(y_ieee[-6:-4]).all()


@pytest.mark.parametrize("fastmath", [False, True])
def test_backend_uses_the_ieee_variants_unless_fastmath(fastmath: bool) -> None:
    for op in ("sigmoid", "tanh"):
        src = _geode_unary(op, "float32", fastmath).native.source
        assert (f"{op}_ieee_f32" in src) != fastmath, src
