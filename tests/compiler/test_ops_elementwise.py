"""Conformance of the elementwise and broadcasting ops against ONNX.

Every op registered in ``geode/compiler/ops/elementwise.py`` is run through
``opcheck.check_op`` (reference kernel vs ``onnx.reference.ReferenceEvaluator``,
inferred dtype and symbolic/static shape vs the kernel's output). Where the
ReferenceEvaluator is itself wrong or less precise than the op's definition, the
case compares against an explicit numpy/``math`` expectation instead, and says why.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, defs, helper
from opcheck import assert_close, check_op

import geode
from geode import ops
from geode.compiler import dtypes
from geode.compiler.frontend.onnx_versions import SUPPORTED_OPSET_RANGE
from geode.compiler.ops import elementwise, registry
from geode.compiler.ops.registry import OpKind
from geode.errors import DTypeError, ShapeError, VerifyError

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, I16, I32, I64 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
U8, U16, U32, U64 = (np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
BOOL = np.dtype(np.bool_)
FLOATS = [F32, F64, F16]
SHAPES = [(), (7,), (2, 3, 4)]
SYMBOLIC = pytest.mark.parametrize("symbolic", [True, False], ids=["sym", "static"])


def _name(d: object) -> str:
    return dtypes.name(d)


def rng_for(*key: object) -> np.random.Generator:
    """A generator seeded by the test case, so every case sees fixed data."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def rand(
    shape: tuple[int, ...], dtype: object, lo: float = -3, hi: float = 3, key: object = 0
) -> np.ndarray:
    """Random data of a dtype in [lo, hi] (ints: integers in [lo, hi]; bool: coin flips)."""
    dt = np.dtype(dtype)
    r = rng_for(shape, str(dt), lo, hi, key)
    if dt == BOOL:
        return np.asarray(r.random(shape) < 0.5)
    if dt.kind in "iu":
        return np.asarray(r.integers(int(lo), int(hi), size=shape, endpoint=True)).astype(dt)
    return np.asarray(r.uniform(lo, hi, size=shape)).astype(dt)


def check(op: str, inputs: list, attrs: dict | None = None, expect: object = None, **kw: object):
    """check_op, or (``expect`` given) check_op for dtype/shape plus an explicit value check."""
    if expect is None:
        return check_op(op, inputs, attrs, **kw)
    got = check_op(op, inputs, attrs, compare=False, **kw)
    want = np.asarray(expect)
    assert_close(got[0], want, f"{op} (explicit expectation)")
    return got


def scalar_map(fn, x: np.ndarray, dtype: object = None) -> np.ndarray:
    """Apply a Python float function to every element in double precision."""
    x = np.asarray(x)
    out = np.array([fn(float(v)) for v in x.reshape(-1)], dtype=np.float64).reshape(x.shape)
    return out.astype(dtype or x.dtype)


# -- explicit expectations, computed element by element with Python's math -------------
def _gelu_exact(v: float) -> float:
    return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))


def _hard_swish(v: float) -> float:
    return v * max(0.0, min(1.0, v / 6 + 0.5))


def explicit(op: str, x: np.ndarray, attrs: dict) -> np.ndarray | None:
    """An explicit expectation for cases where the ReferenceEvaluator is not exact.

    * Erf runs ``math.erf`` through ``np.vectorize(otypes='f')``: float32 precision,
      so float64 results are off by ~1e-8.
    * Gelu and HardSwish are expanded from their ONNX function bodies, whose
      constants (erf again; sqrt(2/pi), 0.044715 and 1/6) are float32 values.
    * Softsign divides in place (``np.divide(x, tmp, out=tmp)``), which fails on rank 0.
    """
    if op == "Softsign" and x.ndim == 0:
        return scalar_map(lambda v: v / (1 + abs(v)), x)
    if x.dtype != F64:
        return None
    if op == "Erf":
        return scalar_map(math.erf, x)
    if op == "Gelu":
        tanh = attrs.get("approximate", "none") == "tanh"
        return scalar_map(_gelu_tanh if tanh else _gelu_exact, x)
    if op == "HardSwish":
        return scalar_map(_hard_swish, x)
    return None


# -- unary float math ------------------------------------------------------------------------
#: op -> (low, high) input domain; a third item lists attribute sets to try
UNARY_FLOAT: dict[str, tuple] = {
    "Exp": (-5, 5),
    "Log": (0.1, 10),
    "Sqrt": (0, 10),
    "Reciprocal": (0.25, 4),
    "Sin": (-4, 4),
    "Cos": (-4, 4),
    "Tan": (-1.2, 1.2),
    "Asin": (-0.99, 0.99),
    "Acos": (-0.99, 0.99),
    "Atan": (-5, 5),
    "Sinh": (-4, 4),
    "Cosh": (-4, 4),
    "Asinh": (-5, 5),
    "Acosh": (1, 6),
    "Atanh": (-0.95, 0.95),
    "Tanh": (-5, 5),
    "Sigmoid": (-10, 10),
    "Erf": (-3, 3),
    "Floor": (-5, 5),
    "Ceil": (-5, 5),
    "Round": (-5, 5),
    "Neg": (-5, 5),
    "Abs": (-5, 5),
    "Sign": (-5, 5),
    "Relu": (-5, 5),
    "Softplus": (-10, 10),
    "Softsign": (-10, 10),
    "Mish": (-5, 5),
    "HardSwish": (-5, 5),
    "Identity": (-5, 5),
    "LeakyRelu": (-3, 3, [{}, {"alpha": 0.2}]),
    "Elu": (-3, 3, [{}, {"alpha": 0.5}]),
    "Selu": (-3, 3, [{}, {"alpha": 1.5, "gamma": 2.0}]),
    "ThresholdedRelu": (-3, 3, [{}, {"alpha": 0.5}]),
    "HardSigmoid": (-5, 5, [{}, {"alpha": 0.3, "beta": 0.4}]),
    "Gelu": (-4, 4, [{}, {"approximate": "none"}, {"approximate": "tanh"}]),
}

UNARY_CASES = [
    (op, attrs)
    for op, spec in UNARY_FLOAT.items()
    for attrs in (spec[2] if len(spec) > 2 else [{}])
]


@pytest.mark.parametrize(
    "op,attrs", UNARY_CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(UNARY_CASES)]
)
@pytest.mark.parametrize("dtype", FLOATS, ids=_name)
@SYMBOLIC
def test_unary_float(op: str, attrs: dict, dtype: np.dtype, symbolic: bool) -> None:
    """Unary float math over float32/64/16, scalar to rank 3, with its attribute sets."""
    lo, hi = UNARY_FLOAT[op][:2]
    for shape in SHAPES:
        x = rand(shape, dtype, lo, hi, key=op)
        if op == "Reciprocal":  # both signs, away from 0
            x = (x * np.where(rand(shape, BOOL, key=op), 1, -1)).astype(dtype)
        check(op, [x], attrs, expect=explicit(op, x, attrs), symbolic=symbolic)


def test_celu_floats() -> None:
    """Celu matches ONNX on float32 and rejects the dtypes ONNX does not allow."""
    # ONNX constrains Celu to tensor(float) before opset 28, to the float types from
    # opset 28 on (geode imports opsets up to 28, so it takes them all); ints are rejected.
    for shape in SHAPES:
        x = rand(shape, F32, -3, 3)
        for attrs in ({}, {"alpha": 2.0}):
            check_op("Celu", [x], attrs)
            check_op("Celu", [x], attrs, symbolic=False)
    check_op("Celu", [rand((3,), F64)], {}, opset=28)
    with pytest.raises(DTypeError, match="Celu"):
        check_op("Celu", [np.arange(3, dtype=np.int32)], {}, compare=False)


@pytest.mark.parametrize("op", ["Exp", "Relu", "Gelu", "Identity", "Sigmoid", "Round"])
@SYMBOLIC
def test_unary_zero_size(op: str, symbolic: bool) -> None:
    """Unary ops keep zero-size shapes."""
    for shape in [(0,), (2, 0, 3)]:
        check(op, [np.zeros(shape, F32)], symbolic=symbolic)


def test_round_half_to_even() -> None:
    """Round breaks ties to even, on every float dtype."""
    vals = [-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -0.50000006, 2.4, -2.6]
    for dt in FLOATS:
        x = np.array(vals, dtype=dt)
        got = check_op("Round", [x])[0]
        np.testing.assert_array_equal(got, np.array([round(float(v)) for v in x], dtype=dt))


def test_float16_stays_float16() -> None:
    """float16 in, float16 out, rounded once from a float32 computation."""
    # float16 math is computed in float32 and rounded once: closer than the evaluator's
    # float16 chain, and the output dtype is still float16.
    x = np.linspace(-4, 4, 33).astype(F16)
    for op in ["Gelu", "Mish", "Selu", "Softplus", "Sigmoid", "HardSwish", "Erf"]:
        got = registry.get(op).run([x], {})[0]
        assert got.dtype == F16, op
    got = registry.get("Gelu").run([x], {})[0]
    want = scalar_map(_gelu_exact, x.astype(F64)).astype(F16)
    np.testing.assert_array_equal(got, want)


def test_erf_paths_agree() -> None:
    """The scipy and math.erf paths of erf agree to double precision."""
    # scipy is optional: the math.erf fallback must give the same double-precision values.
    x = np.linspace(-7, 7, 1001)
    want = scalar_map(math.erf, x)
    np.testing.assert_allclose(elementwise._erf_python(x), want, rtol=1e-15, atol=1e-16)
    np.testing.assert_allclose(elementwise.erf(x), want, rtol=1e-14, atol=1e-16)
    assert elementwise.erf(x.astype(F16)).dtype == F16


def test_special_values() -> None:
    """inf, nan, signed zeros and huge values follow IEEE without warnings."""
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30], dtype=F32)
    for op in ["Exp", "Sigmoid", "Tanh", "Softplus", "Softsign", "Relu", "Abs", "Neg", "Floor"]:
        with np.errstate(all="raise"):  # geode's kernels never warn on IEEE special cases
            registry.get(op).run([x], {})
        with np.errstate(all="ignore"):  # the evaluator's do
            check_op(op, [x])
    with np.errstate(all="raise"):
        for op in ["Log", "Sqrt", "Reciprocal", "Acosh", "Atanh"]:
            registry.get(op).run([np.array([-1.0, 0.0, 2.0], F32)], {})


# -- unary integer / bool ops -------------------------------------------------------------------
INT_UNARY = {
    "Neg": [I8, I16, I32, I64],
    "Abs": [I8, I16, I32, I64, U8, U16, U32, U64],
    "Sign": [I8, I16, I32, I64, U8, U16, U32, U64],
    "Relu": [I8, I16, I32, I64],
    "BitwiseNot": [I8, I16, I32, I64, U8, U16, U32, U64],
    "Identity": [I8, I32, I64, U8, U64, BOOL],
    "Not": [BOOL],
}
INT_CASES = [(op, dt) for op, dts in INT_UNARY.items() for dt in dts]


@pytest.mark.parametrize("op,dtype", INT_CASES, ids=[f"{o}-{_name(d)}" for o, d in INT_CASES])
@SYMBOLIC
def test_unary_int_bool(op: str, dtype: np.dtype, symbolic: bool) -> None:
    """Unary ops on the integer and bool dtypes ONNX allows for them."""
    lo = 0 if dtype.kind == "u" else -100
    for shape in SHAPES + [(0, 2)]:
        check_op(op, [rand(shape, dtype, lo, 100, key=op)], symbolic=symbolic)


@pytest.mark.parametrize("dtype", FLOATS, ids=_name)
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"detect_positive": 0},
        {"detect_negative": 0},
        {"detect_positive": 0, "detect_negative": 0},
    ],
)
def test_isinf_isnan(dtype: np.dtype, attrs: dict) -> None:
    """IsInf honours detect_positive/detect_negative; IsNaN finds NaNs; both give bool."""
    x = np.array([[1.0, np.inf, -np.inf], [np.nan, 0.0, -2.5]], dtype=dtype)
    got = check_op("IsInf", [x], attrs)[0]
    assert got.dtype == BOOL
    check_op("IsInf", [x[0, 1]], attrs, symbolic=False)
    got = check_op("IsNaN", [x])[0]
    np.testing.assert_array_equal(got, [[False, False, False], [True, False, False]])
    check_op("IsNaN", [x[1, 0]], symbolic=False)


# -- Cast, CastLike ---------------------------------------------------------------------------
CAST_DTYPES = [F32, F64, F16, I8, I32, I64, U8, U16, BOOL]


def _cast_input(src: np.dtype, dst: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Values every (src, dst) pair defines: no negatives into unsigned, no overflow."""
    unsigned = src.kind == "u" or dst.kind == "u"
    x = rand(shape, F64, 0 if unsigned else -100, 100, key=(str(src), str(dst)))
    if src.kind == "f":
        x = np.where(np.arange(x.size).reshape(shape) % 3 == 0, 0.0, x)  # zeros, for bool
        return x.astype(src)  # fractions: float -> int truncates toward zero
    if src == BOOL:
        return x > 0
    return np.trunc(x).astype(src)


@pytest.mark.parametrize("src", CAST_DTYPES, ids=_name)
@SYMBOLIC
def test_cast(src: np.dtype, symbolic: bool) -> None:
    """Cast and CastLike between every pair of supported dtypes."""
    for dst in CAST_DTYPES:
        for shape in [(), (2, 5)]:
            x = _cast_input(src, dst, shape)
            got = check_op("Cast", [x], {"to": dtypes.to_onnx(dst)}, symbolic=symbolic)[0]
            assert got.dtype == dst
        like = np.zeros((3, 1), dst)
        check_op("CastLike", [_cast_input(src, dst, (2, 4)), like], symbolic=symbolic)


def test_cast_attributes_and_truncation() -> None:
    """Cast truncates toward zero, maps nonzero to True and accepts saturate."""
    x = np.array([-2.7, -0.5, 0.0, 0.5, 2.7], F32)
    got = check_op("Cast", [x], {"to": TensorProto.INT32, "saturate": 0})[0]
    np.testing.assert_array_equal(got, [-2, 0, 0, 0, 2])
    got = check_op("Cast", [x], {"to": TensorProto.BOOL})[0]
    np.testing.assert_array_equal(got, [True, True, False, True, True])
    check_op("CastLike", [x, np.zeros((), I64)], {"saturate": 1})
    check_op("Cast", [np.zeros((0, 3), F32)], {"to": TensorProto.FLOAT16}, symbolic=False)


@pytest.mark.parametrize("to", [TensorProto.COMPLEX64, TensorProto.STRING, 999])
def test_cast_unsupported_target(to: int) -> None:
    """Cast to a dtype geode lacks is a DTypeError naming the node."""
    g = geode.Graph("g")
    x = g.input("x", ["N"], "float32")
    with pytest.raises(DTypeError, match="cast_bad"):
        g.add_node("Cast", [x], {"to": to}, name="cast_bad")


def test_cast_requires_to() -> None:
    """Cast without 'to' fails verification."""
    g = geode.Graph("g")
    x = g.input("x", ["N"], "float32")
    with pytest.raises(VerifyError, match="'to' is required"):
        g.add_node("Cast", [x], {})


# -- binary arithmetic -----------------------------------------------------------------------
SHAPE_PAIRS = [
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),
    ((1, 4), (3, 1)),
    ((), (2, 3)),
    ((2, 1, 3), ()),
    ((), ()),
]
ARITH_DTYPES = [F32, F64, F16, I8, I32, I64, U8]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", ARITH_DTYPES, ids=_name)
@SYMBOLIC
def test_arith(op: str, dtype: np.dtype, symbolic: bool) -> None:
    """Add/Sub/Mul/Div over float and integer dtypes and fixed broadcast pairs."""
    lo = 0 if dtype.kind == "u" else -20
    for sa, sb in SHAPE_PAIRS:
        a = rand(sa, dtype, lo, 20, key=op)
        b = rand(sb, dtype, lo, 20, key=(op, 1))
        if op == "Div":  # no zero divisors
            b = np.where(b == 0, 3, b).astype(dtype)
        check_op(op, [a, b], symbolic=symbolic)


@SYMBOLIC
def test_binary_zero_size(symbolic: bool) -> None:
    """Broadcasting ops with zero-size dims: 0 against 1 is 0, symbolic dims included
    (``bcast(d0_0, d1_0)`` bound to 0 and 1 is 0, where ``Max`` was 1)."""
    for op in ["Add", "Mul", "Equal", "Max"]:
        check_op(op, [np.zeros((0, 3), F32), np.ones((1, 3), F32)], symbolic=symbolic)
        check_op(op, [np.ones((1, 3), F32), np.zeros((0, 3), F32)], symbolic=symbolic)
        check_op(op, [np.zeros((2, 0), F32), np.ones((), F32)], symbolic=symbolic)
    check_op("Add", [np.zeros((0, 3), F32), np.ones((0, 3), F32)], symbolic=symbolic)


def test_int_div_truncates() -> None:
    """Integer Div truncates toward zero and is exact for large int64."""
    a = np.array([7, -7, 7, -7, 0, 1, -1, 6], I32)
    b = np.array([2, 2, -2, -2, 3, 5, 5, -3], I32)
    got = check_op("Div", [a, b])[0]
    np.testing.assert_array_equal(got, [3, -3, -3, 3, 0, 0, 0, -2])
    # int64 beyond float64's 53-bit mantissa stays exact
    big = np.array([2**62 + 1, -(2**62) - 3], I64)
    got = check_op("Div", [big, np.array([1, 3], I64)])[0]
    np.testing.assert_array_equal(got, [2**62 + 1, (-(2**62) - 3) // 3 + 1])


@pytest.mark.parametrize("dtype", [I8, I32, I64, U8, U32, F32, F64, F16], ids=_name)
@pytest.mark.parametrize("fmod", [0, 1])
@SYMBOLIC
def test_mod(dtype: np.dtype, fmod: int, symbolic: bool) -> None:
    """Mod with fmod=0 and fmod=1 over integer and float dtypes."""
    lo = 0 if dtype.kind == "u" else -9
    for sa, sb in SHAPE_PAIRS:
        a = rand(sa, dtype, lo, 9, key="a")
        b = rand(sb, dtype, lo, 9, key="b")
        b = np.where(np.abs(b.astype(F64)) < 0.5, 4, b).astype(dtype)
        attrs = {"fmod": 1} if fmod else {}  # fmod=0 is the default (Python-style % on floats too)
        check_op("Mod", [a, b], attrs, symbolic=symbolic)


def test_mod_signs() -> None:
    """fmod=0 takes the divisor's sign, fmod=1 the dividend's."""
    a = np.array([5, -5, 5, -5], I32)
    b = np.array([3, 3, -3, -3], I32)
    np.testing.assert_array_equal(check_op("Mod", [a, b])[0], [2, 1, -1, -2])  # Python %
    np.testing.assert_array_equal(check_op("Mod", [a, b], {"fmod": 1})[0], [2, -2, 2, -2])
    af, bf = a.astype(F32) + 0.5, b.astype(F32)
    np.testing.assert_allclose(check_op("Mod", [af, bf], {"fmod": 1})[0], np.fmod(af, bf))


POW_CASES = [
    (F32, F32),
    (F64, F64),
    (F16, F16),
    (F32, I64),
    (F16, I32),
    (F64, F32),
    (I32, I32),
    (I64, I64),
    (I32, U8),
    (I64, F32),
    (I32, F64),
]


@pytest.mark.parametrize("tx,ty", POW_CASES, ids=[f"{_name(a)}-{_name(b)}" for a, b in POW_CASES])
@SYMBOLIC
def test_pow(tx: np.dtype, ty: np.dtype, symbolic: bool) -> None:
    """Pow with base and exponent dtypes that differ; the output has the base's dtype."""
    for sa, sb in SHAPE_PAIRS:
        x = rand(sa, tx, 0.5 if tx.kind == "f" else -4, 4, key="x")
        y = rand(sb, ty, 0 if ty.kind in "iu" else -2, 4 if ty.kind in "iu" else 2, key="y")
        got = check_op("Pow", [x, y], symbolic=symbolic)[0]
        assert got.dtype == tx


def test_pow_negative_int_exponent() -> None:
    """Integer Pow with negative exponents truncates 1/x**n."""
    # The ReferenceEvaluator raises (numpy refuses integers to negative integer powers);
    # mathematically x**-n truncates to 0 unless |x| == 1.
    x = np.array([2, -2, 1, -1, -1, 3, 5], I32)
    y = np.array([-1, -1, -3, -3, -2, 0, 2], I64)
    check("Pow", [x, y], expect=np.array([0, 0, 1, -1, 1, 1, 25], I32))


# -- comparisons, logic and bits ------------------------------------------------------------
@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [F32, F64, F16, I32, I64, U8, BOOL], ids=_name)
@SYMBOLIC
def test_compare(op: str, dtype: np.dtype, symbolic: bool) -> None:
    """Comparisons give bool; only Equal accepts bool inputs."""
    if dtype == BOOL and op != "Equal":
        with pytest.raises(DTypeError, match=op):
            check_op(op, [rand((3,), BOOL), rand((3,), BOOL)])
        return
    for sa, sb in SHAPE_PAIRS:  # small integers, so ties happen
        a, b = rand(sa, dtype, 0, 3, key="a"), rand(sb, dtype, 0, 3, key="b")
        assert check_op(op, [a, b], symbolic=symbolic)[0].dtype == BOOL


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@SYMBOLIC
def test_logic(op: str, symbolic: bool) -> None:
    """And/Or/Xor on bool with broadcasting."""
    for sa, sb in SHAPE_PAIRS:
        check_op(op, [rand(sa, BOOL, key="a"), rand(sb, BOOL, key="b")], symbolic=symbolic)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [I8, I16, I32, I64, U8, U16, U32, U64], ids=_name)
@SYMBOLIC
def test_bitwise(op: str, dtype: np.dtype, symbolic: bool) -> None:
    """BitwiseAnd/Or/Xor on every integer dtype."""
    lo = 0 if dtype.kind == "u" else -128
    for sa, sb in SHAPE_PAIRS:
        a, b = rand(sa, dtype, lo, 127, key="a"), rand(sb, dtype, lo, 127, key="b")
        check_op(op, [a, b], symbolic=symbolic)


@pytest.mark.parametrize("dtype", [U8, U16, U32, U64], ids=_name)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@SYMBOLIC
def test_bitshift(dtype: np.dtype, direction: str, symbolic: bool) -> None:
    """BitShift both ways on unsigned dtypes, including shifts past the bit width."""
    bits = dtype.itemsize * 8
    for sa, sb in SHAPE_PAIRS:
        x = rand(sa, dtype, 0, 255, key="x")
        s = rand(sb, dtype, 0, bits + 2, key="s")  # includes shifts >= the bit width
        check_op("BitShift", [x, s], {"direction": direction}, symbolic=symbolic)


# -- Where, PRelu, Clip ---------------------------------------------------------------------
WHERE_SHAPES = [
    ((3, 4), (3, 4), (3, 4)),
    ((3, 1), (1, 4), ()),
    ((), (2, 3), (3,)),
    ((2, 1, 1), (3, 1), (4,)),
    ((), (), ()),
]


@pytest.mark.parametrize("dtype", [F32, F64, F16, I32, I64, U8, BOOL], ids=_name)
@SYMBOLIC
def test_where(dtype: np.dtype, symbolic: bool) -> None:
    """Where broadcasts condition, X and Y; the output has X's dtype."""
    for sc, sx, sy in WHERE_SHAPES:
        c = rand(sc, BOOL, key="c")
        x, y = rand(sx, dtype, 0, 9, key="x"), rand(sy, dtype, 0, 9, key="y")
        assert check_op("Where", [c, x, y], symbolic=symbolic)[0].dtype == dtype
    check_op(
        "Where", [np.ones((0, 1), bool), np.ones((1, 3), dtype), np.ones((), dtype)], symbolic=False
    )


PRELU_SLOPES = [(2, 3, 4, 5), (3, 1, 1), (5,), (), (1,), (1, 1, 4, 1)]


@pytest.mark.parametrize("dtype", [F32, F64, F16, I32, I64, U32, U64], ids=_name)
@SYMBOLIC
def test_prelu(dtype: np.dtype, symbolic: bool) -> None:
    """PRelu with slopes that broadcast unidirectionally to X."""
    lo = 0 if dtype.kind == "u" else -5
    x = rand((2, 3, 4, 5), dtype, lo, 5, key="x")
    for ss in PRELU_SLOPES:
        slope = rand(ss, dtype, 0 if dtype.kind in "iu" else -1, 3, key=ss)
        assert check_op("PRelu", [x, slope], symbolic=symbolic)[0].shape == x.shape


CLIP_CASES = [
    ("none", (), lambda d: []),
    ("min", (), lambda d: [np.array(-1, d)]),
    ("max", (), lambda d: [None, np.array(2, d)]),
    ("both", (), lambda d: [np.array(-1, d), np.array(2, d)]),
    ("min>max", (), lambda d: [np.array(3, d), np.array(1, d)]),
    ("const", (1, 2), lambda d: [np.array(0, d), np.array(1, d)]),
    ("shape1", (), lambda d: [np.array([-1], d), np.array([1], d)]),
]


@pytest.mark.parametrize("case", CLIP_CASES, ids=[c[0] for c in CLIP_CASES])
@pytest.mark.parametrize("dtype", [F32, F64, F16, I8, I32, I64], ids=_name)
@SYMBOLIC
def test_clip(case: tuple, dtype: np.dtype, symbolic: bool) -> None:
    """Clip with no bound, one bound, both, min > max, constant and shape-[1] bounds."""
    name, const_inputs, bounds = case
    for shape in SHAPES + [(0, 3)]:
        x = rand(shape, dtype, -4, 4, key="clip")
        expect = None
        if name == "shape1" and x.ndim == 0:
            # ONNX bounds are scalars and the output has the input's shape; the evaluator
            # np.clip-broadcasts a shape-[1] bound, turning a rank-0 input into shape [1].
            expect = np.clip(x, -1, 1).astype(dtype)
        check(
            "Clip", [x, *bounds(dtype)], None, expect, const_inputs=const_inputs, symbolic=symbolic
        )


def test_clip_unsigned_and_kind() -> None:
    """Clip on unsigned input; Clip is an elementwise op."""
    x = rand((4, 4), U8, 0, 200)
    check_op("Clip", [x, np.array(10, U8), np.array(100, U8)])
    assert registry.get("Clip").kind is OpKind.ELEMENTWISE


# -- variadic ---------------------------------------------------------------------------------
VARIADIC_SHAPES = [
    [(3, 4)],
    [(3, 4), (3, 4)],
    [(2, 3, 4), (4,), (3, 1)],
    [(), (2, 3), (1, 3), (2, 1)],
    [(), ()],
]


def _mean_expectation(ins: list[np.ndarray]) -> np.ndarray | None:
    # The ReferenceEvaluator accumulates in place into a copy of the first input
    # (res += m), which fails when a later input broadcasts the result to a larger shape.
    if np.broadcast_shapes(*(x.shape for x in ins)) == ins[0].shape:
        return None
    total = sum(x.astype(F64) for x in ins)
    return (total / len(ins)).astype(ins[0].dtype)


@pytest.mark.parametrize("op", ["Min", "Max", "Sum", "Mean"])
@pytest.mark.parametrize("dtype", [F32, F64, F16, I32, I64, U8], ids=_name)
@SYMBOLIC
def test_variadic(op: str, dtype: np.dtype, symbolic: bool) -> None:
    """Min/Max/Sum/Mean with one to four broadcast inputs."""
    if dtype.kind != "f" and op in ("Sum", "Mean"):
        with pytest.raises(DTypeError, match=op):
            check_op(op, [rand((3,), dtype)])
        return
    for shapes in VARIADIC_SHAPES:
        ins = [rand(s, dtype, 0, 9, key=(op, i)) for i, s in enumerate(shapes)]
        expect = _mean_expectation(ins) if op == "Mean" else None
        check(op, ins, expect=expect, symbolic=symbolic)


def test_variadic_nan_and_zero_size() -> None:
    """Variadic ops propagate NaN and keep zero-size shapes."""
    a = np.array([1.0, np.nan, 3.0], F32)
    b = np.array([np.nan, 2.0, 0.5], F32)
    for op in ["Min", "Max", "Sum", "Mean"]:
        check_op(op, [a, b])
        check_op(op, [np.zeros((0, 2), F32), np.ones((1, 2), F32)], symbolic=False)


def test_variadic_missing_input() -> None:
    """An omitted input in a variadic list fails verification."""
    g = geode.Graph("g")
    x = g.input("x", [3], "float32")
    with pytest.raises(VerifyError, match=r"input 1 \(data_0\) is required"):
        g.add_node("Sum", [x, None, x], name="s")


# -- hypothesis: random broadcast-compatible shapes ------------------------------------------
HYP_BINARY = {
    "Add": [F32, F16, I32, I64],
    "Sub": [F32, F64, I32],
    "Mul": [F32, F16, I64],
    "Div": [F32, F64, I32],
    "Mod": [F32, I32, I64],
    "Pow": [F32, F64],
    "Equal": [F32, I32, BOOL],
    "Less": [F32, I64],
    "GreaterOrEqual": [F16, U8],
    "And": [BOOL],
    "Xor": [BOOL],
    "BitwiseOr": [I32, U16],
    "BitShift": [U8, U32],
    "Max": [F32, I32],
    "Sum": [F32, F64],
}


def _operands(op: str, dtype: np.dtype, shapes: tuple, seed: int) -> list[np.ndarray]:
    lo, hi = (0, 9) if dtype.kind in "ub" else (-9, 9)
    if op == "Pow":
        lo = 0.5
    ins = [rand(s, dtype, lo, hi, key=(seed, i)) for i, s in enumerate(shapes)]
    if op in ("Div", "Mod"):  # no zero divisors
        ins[1] = np.where(ins[1] == 0, 7, ins[1]).astype(dtype)
    return ins


@pytest.mark.parametrize("op", list(HYP_BINARY))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_binary_random_broadcast(op: str, data: st.DataObject) -> None:
    """Binary ops over random broadcast-compatible shapes (hypothesis)."""
    symbolic = data.draw(st.booleans(), label="symbolic")
    # zero-size dims only with static shapes (symbols are positive)
    shapes = data.draw(
        hnp.mutually_broadcastable_shapes(
            num_shapes=2, max_dims=4, min_side=1 if symbolic else 0, max_side=4
        ),
        label="shapes",
    ).input_shapes
    dtype = data.draw(st.sampled_from(HYP_BINARY[op]), label="dtype")
    seed = data.draw(st.integers(0, 2**31), label="seed")
    attrs = {"direction": "LEFT"} if op == "BitShift" else {}
    if op == "Mod" and dtype.kind == "f":
        attrs = {"fmod": 1}
    check_op(op, _operands(op, dtype, shapes, seed), attrs, symbolic=symbolic)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_where_random_broadcast(data: st.DataObject) -> None:
    """Where over three random broadcast-compatible shapes (hypothesis)."""
    symbolic = data.draw(st.booleans(), label="symbolic")
    shapes = data.draw(
        hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=4, max_side=4), label="shapes"
    ).input_shapes
    seed = data.draw(st.integers(0, 2**31), label="seed")
    c = rand(shapes[0], BOOL, key=seed)
    x, y = rand(shapes[1], F32, key=(seed, 1)), rand(shapes[2], F32, key=(seed, 2))
    check_op("Where", [c, x, y], symbolic=symbolic)


# -- errors -------------------------------------------------------------------------------------
def test_bad_dtype_names_node_and_input() -> None:
    """A bad dtype raises DTypeError naming the node, the input and the dtype."""
    g = geode.Graph("g")
    x = g.input("x", ["N", 4], "int32")
    with pytest.raises(DTypeError) as e:
        g.add_node("Exp", [x], name="my_exp")
    msg = str(e.value)
    assert "my_exp" in msg and "input 0" in msg and "'x'" in msg and "int32" in msg

    y = g.input("y", ["N", 4], "float32")
    with pytest.raises(DTypeError) as e:
        g.add_node("Add", [y, x], name="my_add")
    assert "my_add" in str(e.value) and "input 1" in str(e.value) and "'x'" in str(e.value)

    with pytest.raises(DTypeError, match=r"my_where.*input 0 \(condition"):
        g.add_node("Where", [y, y, y], name="my_where")
    with pytest.raises(DTypeError, match=r"my_pow.*input 0"):
        g.add_node("Pow", [g.input("u", [3], "uint8"), y], name="my_pow")
    with pytest.raises(DTypeError, match=r"my_shift.*input 0"):
        g.add_node("BitShift", [y, y], {"direction": "LEFT"}, name="my_shift")
    with pytest.raises(DTypeError, match=r"my_not.*input 0"):
        g.add_node("Not", [y], name="my_not")


def test_bad_broadcast_raises_shape_error() -> None:
    """Shapes that cannot broadcast raise ShapeError naming the node."""
    g = geode.Graph("g")
    a = g.input("a", [3, 4], "float32")
    b = g.input("b", [5], "float32")
    c = g.input("c", [2, 3], "float32")
    with pytest.raises(ShapeError, match=r"my_add"):
        g.add_node("Add", [a, b], name="my_add")
    with pytest.raises(ShapeError, match=r"my_where"):
        g.add_node("Where", [g.input("m", [3, 1], "bool"), a, c], name="my_where")
    with pytest.raises(ShapeError, match=r"my_max"):
        g.add_node("Max", [a, a, b], name="my_max")
    with pytest.raises(ShapeError, match=r"my_prelu.*slope"):
        g.add_node("PRelu", [a, g.input("s", [3], "float32")], name="my_prelu")
    with pytest.raises(ShapeError, match=r"my_prelu2.*slope"):
        g.add_node("PRelu", [b, a], name="my_prelu2")  # slope of higher rank
    with pytest.raises(ShapeError, match=r"my_clip.*min"):
        g.add_node("Clip", [a, g.input("lo", [2], "float32")], name="my_clip")


def test_symbolic_broadcast_stays_symbolic() -> None:
    """Named dims broadcast symbolically; symbolic slope dims are accepted."""
    g = geode.Graph("g")
    a = g.input("a", ["N", 1], "float32")
    b = g.input("b", ["M"], "float32")
    out = g.op("Add", a, b)
    assert [str(d) for d in out.shape] == ["N", "M"]
    # a symbolic slope dim may be 1 at run time: accepted
    g.add_node("PRelu", [g.input("x", [2, 3], "float32"), g.input("s", ["K"], "float32")])


@pytest.mark.parametrize(
    "op,attrs,match",
    [
        ("Gelu", {"approximate": "erf"}, "approximate"),
        ("BitShift", {"direction": "UP"}, "direction"),
        ("BitShift", {}, "direction"),
        ("Mod", {"fmod": 2}, "fmod"),
        ("LeakyRelu", {"beta": 1.0}, "unknown attribute"),
    ],
)
def test_bad_attributes(op: str, attrs: dict, match: str) -> None:
    """Attribute values outside the schema fail verification."""
    g = geode.Graph("g")
    dt = "uint8" if op == "BitShift" else "float32"
    x = g.input("x", [3], dt)
    inputs = [x] if registry.get(op).min_inputs == 1 else [x, x]
    with pytest.raises(VerifyError, match=match):
        g.add_node(op, inputs, attrs, name="bad")


def test_string_attributes_may_be_bytes() -> None:
    """String attributes given as bytes (from onnx.helper) work."""
    # onnx.helper.get_attribute_value gives bytes for string attributes
    x = np.linspace(-2, 2, 9).astype(F32)
    want = registry.get("Gelu").run([x], {"approximate": "tanh"})[0]
    np.testing.assert_array_equal(registry.get("Gelu").run([x], {"approximate": b"tanh"})[0], want)
    s = np.array([1, 2], U8)
    got = registry.get("BitShift").run([s, np.array([1, 1], U8)], {"direction": b"LEFT"})[0]
    np.testing.assert_array_equal(got, [2, 4])


# -- schema conformance: kinds, dtype constraints and attributes against onnx.defs ---------------
# fmt: off
UNARY_OPS = [
    "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan", "Asin", "Acos",
    "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Tanh", "Sigmoid", "Relu", "LeakyRelu",
    "Elu", "Selu", "Celu", "ThresholdedRelu", "Erf", "Floor", "Ceil", "Round", "Sign",
    "Softplus", "Softsign", "HardSigmoid", "HardSwish", "Mish", "IsNaN", "IsInf", "Not",
    "BitwiseNot", "Gelu", "Identity", "Cast", "CastLike", "Clip",
]
BROADCAST_OPS = [
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    "PRelu", "Where", "Min", "Max", "Sum", "Mean",
]
# fmt: on
_ONNX_TYPES = {
    "float": F32,
    "double": F64,
    "float16": F16,
    "int8": I8,
    "int16": I16,
    "int32": I32,
    "int64": I64,
    "uint8": U8,
    "uint16": U16,
    "uint32": U32,
    "uint64": U64,
    "bool": BOOL,
}


def _onnx_allowed(schema: defs.OpSchema, type_str: str) -> frozenset:
    for tc in schema.type_constraints:
        if tc.type_param_str == type_str:
            names = [
                t[len("tensor(") : -1] for t in tc.allowed_type_strs if t.startswith("tensor(")
            ]
            return frozenset(_ONNX_TYPES[n] for n in names if n in _ONNX_TYPES)
    return frozenset([_ONNX_TYPES[type_str[len("tensor(") : -1]]])


@pytest.mark.parametrize("op", UNARY_OPS + BROADCAST_OPS)
def test_schema_matches_onnx(op: str) -> None:
    """Kind, inputs, dtype constraints and attribute defaults match onnx.defs at the newest
    opset geode imports (the numeric and bool dtypes; geode's narrow storage dtypes and
    strings are checked by the ops' own tests)."""
    od = registry.get(op)
    assert od.kind is (OpKind.ELEMENTWISE if op in UNARY_OPS else OpKind.BROADCAST)
    assert od.kernel is not None and od.doc is not None
    schema = defs.get_schema(op, SUPPORTED_OPSET_RANGE[1])
    known = frozenset(_ONNX_TYPES.values())
    assert len(od.inputs) == len(schema.inputs), op
    for mine, theirs in zip(od.inputs, schema.inputs):
        opt = theirs.option
        assert mine.optional == (opt == defs.OpSchema.FormalParameterOption.Optional), op
        assert mine.variadic == (opt == defs.OpSchema.FormalParameterOption.Variadic), op
        mine_types = od.types.get(mine.type)
        mine_types = None if mine_types is None else mine_types & known
        assert mine_types == _onnx_allowed(schema, theirs.type_str), (op, mine.name)
    assert {a.name for a in od.attrs} == set(schema.attributes), op
    for name, a in schema.attributes.items():
        spec = od.attr_spec(name)
        if a.required:
            assert spec.required, (op, name)
            continue
        want = helper.get_attribute_value(a.default_value)
        if isinstance(want, bytes):
            assert spec.default == want.decode(), (op, name)
        elif isinstance(want, float):
            assert np.float32(spec.default) == np.float32(want), (op, name)
        else:
            assert spec.default == want, (op, name)


def test_float_attributes_are_float32() -> None:
    """Float attributes are used as float32 values, as ONNX stores them."""
    # An ONNX float attribute is a float32, so 0.01 means float32(0.01) on float64 too;
    # this is what makes float64 LeakyRelu match the evaluator to 1e-10.
    x = np.array([-1.0, -3.0], F64)
    got = registry.get("LeakyRelu").run([x], {})[0]
    np.testing.assert_array_equal(got, x * float(np.float32(0.01)))


# -- the Python builder reaches these ops ----------------------------------------------------------
def test_builder_operators() -> None:
    """The Python builder's operators and ops.* reach these ops."""
    g = geode.Graph("g")
    x = g.input("x", ["N", 4], "float32")
    i = g.input("i", ["N", 4], "int32")
    assert (x % 2.0).dtype == F32
    assert (x**2).dtype == F32 and (x**2).producer.op_type == "Pow"
    assert (x < 1.0).dtype == BOOL and ((x < 1.0) & (x > 0.0)).dtype == BOOL
    assert (~(x < 1.0)).producer.op_type == "Not"
    assert x.astype("int64").dtype == I64
    assert ops.clip(x, min=0.0, max=6.0).shape == x.shape
    assert ops.where(x > 0.0, x, 0.0).dtype == F32
    assert ops.gelu(x, approximate="tanh").dtype == F32
    assert ops.sum(x, x, x).producer.op_type == "Sum"
    assert ops.cast_like(i, x).dtype == F32
    assert (-i).dtype == I32 and abs(i).dtype == I32


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32])
def test_constant_integer_arithmetic_wraps_as_numpy_does(dtype) -> None:
    """Symbolic contents of small int tensors are computed in Python ints: a result the
    dtype cannot hold (``uint8 0 - 1``) is not recorded, so constant folding takes the
    kernel's wrapped value (it raised OverflowError while compiling, found by geode.fuzz)
    and a Cast to int64 does not carry the unwrapped one."""
    info = np.iinfo(dtype)
    zero, one, top = (np.array(v, dtype) for v in (0, 1, info.max))
    g = geode.Graph("wrap")
    a, b, c = g.constant(zero), g.constant(one), g.constant(top)
    diff = a - b
    assert diff.sym_value is None or diff.sym_value == (-1,)
    if np.dtype(dtype).kind == "u":
        assert diff.sym_value is None
    outs = [diff, c + b, c * c, g.op("Cast", diff, to=int(TensorProto.INT64))]
    g.output(*outs, names=["d", "s", "p", "wide"])
    got = geode.compile(g, model_cache=False)()
    with np.errstate(over="ignore"):
        want = {"d": zero - one, "s": top + one, "p": top * top}
    for k, v in want.items():
        assert got[k].dtype == dtype and got[k] == v, k
    assert got["wide"] == np.int64(zero - one)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_tanh_reference_has_no_cancellation_in_its_tail(dtype) -> None:
    """0.5 * x * (1 + tanh(z)) is x * sigmoid(2 z): where tanh(z) rounds to -1 the sum
    cancelled to 0, so Gelu(-7.07) was -0.0 against -1.02e-15, and a Reciprocal of it -inf
    while the compiled model (1 + tanh without the cancellation) gave -9.8e14 (geode.fuzz
    seed 2024 case 7860, shrunk to Gelu + Reciprocal)."""
    from geode.compiler.interpret import run_reference

    x = np.array([-7.0680623, -9.0, -3.0, -0.5, 0.0, 0.5, 3.0, 30.0], dtype)

    def exact(v: float) -> float:
        z = math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)
        return v / (1 + math.exp(-2 * z))

    g = geode.Graph("gelu_tail")
    xi = g.input("x", [8], dtype=dtype)
    gelu = g.op("Gelu", xi, approximate="tanh")
    g.output(gelu, g.op("Reciprocal", gelu), names=["y", "r"])
    want = np.array([exact(float(v)) for v in x])
    ref = run_reference(g, {"x": x})
    got = geode.compile(g, model_cache=False)(x=x)
    for out in (ref, got):
        np.testing.assert_allclose(out["y"], want, rtol=1e-5 if dtype == np.float32 else 1e-12)
        assert np.isfinite(out["r"][:2]).all() and out["r"][0] < -9e14
    np.testing.assert_allclose(got["r"], ref["r"], rtol=1e-5)
