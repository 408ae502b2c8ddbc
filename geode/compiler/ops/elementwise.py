"""Elementwise and broadcasting math ops, in their ONNX opset-21 form.

Every reference kernel follows ONNX semantics and returns exactly the dtype ONNX
gives. Conventions shared by the kernels below:

* One-input ops whose output has the input's shape are ``OpKind.ELEMENTWISE``;
  ops that broadcast several inputs (numpy/ONNX multidirectional broadcasting, or
  PRelu's unidirectional one) are ``OpKind.BROADCAST``.
* Float math on float16 runs in float32 and is rounded to float16 once, at the end
  (what a native kernel does, and within one float16 ulp of the exact result).
* Float attributes are float32 in ONNX (``AttributeProto.f``), so kernels round them
  to float32 before use: ``alpha=0.01`` means ``float32(0.01)`` on every dtype.
* IEEE special cases (``log(0)``, ``0/0``, overflow) give inf/nan without warnings;
  integer division or modulo by zero, which ONNX leaves undefined, gives 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.common import binary, broadcast_infer, same_as_input, unary
from geode.compiler.ops.reduce import carries_value, value_dims, value_fits
from geode.compiler.ops.registry import (
    REQUIRED,
    Attr,
    In,
    InferContext,
    OpDef,
    OpKind,
    Out,
    register,
)
from geode.compiler.shapes import as_dim, broadcast_shapes, dims_equal, shape_str
from geode.errors import DTypeError, ShapeError, VerifyError
from geode.lazy import sympy

_F = dtypes.FLOATS
_SIGNED = dtypes.FLOATS | dtypes.SIGNED_INTS
_NUM = dtypes.NUMERIC
_F32 = frozenset([np.dtype(np.float32)])
_POW_BASE = dtypes.FLOATS | dtypes.INDEX
_PRELU = dtypes.FLOATS | frozenset(np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64))


# -- helpers -------------------------------------------------------------------------
def _up(x: np.ndarray) -> np.ndarray:
    """float16 -> float32 working precision; other dtypes unchanged."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _f32(v: object) -> float:
    """An ONNX float attribute as the float32 value it stands for."""
    return float(np.float32(v))


def _str(v: object) -> str:
    """A string attribute (the ONNX frontend may hand over bytes)."""
    return v.decode() if isinstance(v, bytes) else str(v)


def _fmath(
    fn: Callable[[np.ndarray, dict], np.ndarray],
) -> Callable[[np.ndarray, dict], np.ndarray]:
    """Kernel for float math: float16 computed in float32, result in the input dtype."""

    def run(x: np.ndarray, a: dict) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(_up(x), a)).astype(x.dtype, copy=False)

    return run


def _quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a kernel with numpy floating-point warnings silenced (IEEE results stand)."""

    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args)

    return run


def _with_verify(od: OpDef, verify: Callable[[InferContext], None]) -> OpDef:
    """Attach an op-specific verify hook to a factory-built OpDef."""
    od.verify = verify
    return od


def _one_of(
    attr: str, allowed: Sequence[object], conv: Callable[[object], object] = int
) -> Callable[[InferContext], None]:
    """A verify hook: attribute ``attr`` must be one of ``allowed``."""

    def verify(ctx: InferContext) -> None:
        v = ctx.attr(attr)
        try:
            ok = conv(v) in allowed
        except (TypeError, ValueError):
            ok = False
        if not ok:
            ctx.fail(f"attribute {attr!r} must be one of {list(allowed)}, got {v!r}", VerifyError)

    return verify


# -- the error function ----------------------------------------------------------------
_math_erf = np.frompyfunc(math.erf, 1, 1)


def _erf_python(x: np.ndarray) -> np.ndarray:
    """erf through ``math.erf`` (double precision, one Python call per element)."""
    x = np.asarray(x)
    return np.asarray(_math_erf(x.astype(np.float64)), dtype=np.float64).astype(x.dtype)


@functools.cache
def _scipy_erf() -> Callable[[np.ndarray], np.ndarray] | None:
    """scipy's vectorised erf, or None when scipy is not installed (imported on first use)."""
    try:
        from scipy.special import erf as scipy_erf
    except ImportError:  # scipy is optional: fall back to math.erf
        return None
    return scipy_erf


def erf(x: np.ndarray) -> np.ndarray:
    """Gauss error function of a float array, accurate to its dtype's precision.

    Uses scipy when it is installed (vectorised), else ``math.erf`` per element.
    float16 is computed in float32; the result has the input's dtype.
    """
    x = np.asarray(x)
    fn = _scipy_erf() or _erf_python
    return np.asarray(fn(_up(x))).astype(x.dtype, copy=False)


# -- binary arithmetic ---------------------------------------------------------------
def _sym_div(a: Any, b: Any) -> Any:
    """Integer division of shape values (truncation; floor of symbolic non-negative dims)."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return None
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    if isinstance(b, int) and b > 0:
        return as_dim(sympy.floor(a / b))
    return None


def _with_sym_values(od: OpDef, fn: Callable[[Any, Any], Any]) -> OpDef:
    """Make a binary int op record the symbolic value of its result when both inputs
    carry one (``Mul(Gather(Shape(x), 0), Gather(Shape(x), 1))`` is ``N*T``), so that a
    Reshape to a computed shape keeps symbolic dims."""
    base = od.infer

    def infer(ctx: InferContext) -> list[TensorDesc]:
        descs = base(ctx)
        out = descs[0]
        if not carries_value(out):
            return descs
        a, b = value_dims(ctx, 0), value_dims(ctx, 1)
        n = int(np.prod(out.shape, dtype=np.int64)) if out.shape is not None else -1
        if a is None or b is None or len(a) not in (1, n) or len(b) not in (1, n):
            return descs
        vals = [fn(a[i if len(a) > 1 else 0], b[i if len(b) > 1 else 0]) for i in range(n)]
        if all(v is not None for v in vals):
            vals = [v if isinstance(v, int) else as_dim(v) for v in vals]
            if value_fits(vals, out.dtype):  # Python ints do not wrap as numpy's do
                ctx.set_sym_value(0, vals)
        return descs

    od.infer = infer
    return od


_with_sym_values(
    binary("Add", _quiet(lambda a, b, _: np.add(a, b)), doc="A + B with broadcasting"),
    lambda a, b: a + b,
)
_with_sym_values(
    binary("Sub", _quiet(lambda a, b, _: np.subtract(a, b)), doc="A - B with broadcasting"),
    lambda a, b: a - b,
)
_with_sym_values(
    binary("Mul", _quiet(lambda a, b, _: np.multiply(a, b)), doc="A * B with broadcasting"),
    lambda a, b: a * b,
)


@_quiet
def _div(a: np.ndarray, b: np.ndarray, _: dict) -> np.ndarray:
    if a.dtype.kind in "iu":
        # ONNX integer Div truncates toward zero; stay in integers so int64 is exact.
        q = np.floor_divide(a, b)
        if a.dtype.kind == "i":
            inexact = np.remainder(a, b) != 0
            q = q + (inexact & ((a < 0) != (b < 0))).astype(q.dtype)
        return q
    return np.true_divide(a, b)


_with_sym_values(
    binary("Div", _div, doc="A / B with broadcasting (integer division truncates toward zero)"),
    _sym_div,
)


@_quiet
def _mod(a: np.ndarray, b: np.ndarray, at: dict) -> np.ndarray:
    return np.fmod(a, b) if int(at["fmod"]) == 1 else np.mod(a, b)


_with_verify(
    binary(
        "Mod",
        _mod,
        attrs=[Attr("fmod", "int", 0)],
        doc=(
            "Remainder with broadcasting. fmod=0: the sign of the divisor (Python %); "
            "fmod=1: the sign of the dividend (C fmod). ONNX asks for fmod=1 on floats; "
            "geode also accepts fmod=0 there (Python % semantics, as the ONNX reference "
            "evaluator computes) so that the builder's ``x % y`` works on floats."
        ),
    ),
    _one_of("fmod", (0, 1)),
)


@_quiet
def _pow(x: np.ndarray, y: np.ndarray, _: dict) -> np.ndarray:
    if x.dtype.kind == "f":
        work = np.result_type(x.dtype, y.dtype, np.float32)
        return np.power(x.astype(work), y.astype(work)).astype(x.dtype)
    if y.dtype.kind == "f":  # integer base, float exponent: compute in double, truncate
        return np.power(x.astype(np.float64), y.astype(np.float64)).astype(x.dtype)
    # integer ** integer, exact (wrapping on overflow like a native kernel)
    if y.dtype == np.uint64:  # keep huge unsigned exponents positive in int64
        y = np.minimum(y, np.uint64(np.iinfo(np.int64).max))
    e = y.astype(np.int64)
    base = x.astype(np.int64)
    out = np.power(base, np.maximum(e, 0))
    # a negative exponent gives 1/x**|e|, truncated: 0 unless |x| == 1 (x == 0 is undefined)
    neg = np.where(base == 1, 1, np.where(base == -1, np.where(e % 2 == 0, 1, -1), 0))
    return np.where(e < 0, neg, out).astype(x.dtype)


register(
    OpDef(
        "Pow",
        OpKind.BROADCAST,
        inputs=[In("X", "T"), In("Y", "T1")],
        outputs=[Out("Z", "T")],
        types={"T": _POW_BASE, "T1": _NUM},
        infer=broadcast_infer(),
        kernel=lambda ins, a: [_pow(ins[0], ins[1], a)],
        doc="X ** Y with broadcasting; the output has X's dtype",
    )
)

# -- comparisons, logic and bits -------------------------------------------------------
binary(
    "Equal",
    lambda a, b, _: np.equal(a, b),
    types=dtypes.ALL | frozenset([np.dtype(object)]),
    out_dtype=np.bool_,
)
binary("Less", lambda a, b, _: np.less(a, b), out_dtype=np.bool_)
binary("Greater", lambda a, b, _: np.greater(a, b), out_dtype=np.bool_)
binary("LessOrEqual", lambda a, b, _: np.less_equal(a, b), out_dtype=np.bool_)
binary("GreaterOrEqual", lambda a, b, _: np.greater_equal(a, b), out_dtype=np.bool_)
binary("And", lambda a, b, _: np.logical_and(a, b), types=dtypes.BOOL)
binary("Or", lambda a, b, _: np.logical_or(a, b), types=dtypes.BOOL)
binary("Xor", lambda a, b, _: np.logical_xor(a, b), types=dtypes.BOOL)
binary("BitwiseAnd", lambda a, b, _: np.bitwise_and(a, b), types=dtypes.INTS)
binary("BitwiseOr", lambda a, b, _: np.bitwise_or(a, b), types=dtypes.INTS)
binary("BitwiseXor", lambda a, b, _: np.bitwise_xor(a, b), types=dtypes.INTS)


def _bitshift(a: np.ndarray, b: np.ndarray, at: dict) -> np.ndarray:
    """ONNX BitShift (opset 28 semantics): right shifts of signed types are arithmetic, left
    shifts drop the bits shifted past the sign bit; a shift amount that is negative or at
    least the bit width gives what the sign extension alone gives (-1 for a right shift of
    a negative X, else 0)."""
    bits = a.dtype.itemsize * 8
    out_of_range = (b < 0) | (b >= bits)
    s = np.where(out_of_range, 0, b).astype(a.dtype)
    if _str(at["direction"]) == "LEFT":
        r = np.left_shift(a, s)
        fill = np.zeros((), dtype=a.dtype)
    else:
        r = np.right_shift(a, s)
        fill = (
            np.where(a < 0, -1, 0).astype(a.dtype) if a.dtype.kind == "i" else np.zeros((), a.dtype)
        )
    return np.where(out_of_range, fill, r).astype(a.dtype)


_with_verify(
    binary(
        "BitShift",
        _bitshift,
        types=dtypes.INTS,
        attrs=[Attr("direction", "string", REQUIRED)],
        doc="X << Y (direction='LEFT') or X >> Y ('RIGHT'); arithmetic right shift on signed ints",
    ),
    _one_of("direction", ("LEFT", "RIGHT"), _str),
)


# -- Where, PRelu ----------------------------------------------------------------------
def _infer_where(ctx: InferContext) -> list[TensorDesc]:
    shapes = [ctx.shape(i) for i in range(3)]
    return [
        TensorDesc(
            ctx.dtype(1), broadcast_shapes(*shapes, where=ctx.where, symbols=ctx.graph.symbols)
        )
    ]


register(
    OpDef(
        "Where",
        OpKind.BROADCAST,
        inputs=[In("condition", "B"), In("X", "T"), In("Y", "T")],
        outputs=[Out("output", "T")],
        types={"B": dtypes.BOOL, "T": dtypes.ALL},
        infer=_infer_where,
        kernel=lambda ins, _: [np.where(ins[0], ins[1], ins[2])],
        doc="condition ? X : Y, all three broadcast",
    )
)


def _verify_prelu(ctx: InferContext) -> None:
    x, slope = ctx.shape(0), ctx.shape(1)
    if x is None or slope is None:
        return
    bad = len(slope) > len(x)
    for sd, xd in zip(reversed(slope), reversed(x)):
        # a symbolic slope dim may be 1 at run time; only provable mismatches fail
        if sd != 1 and dims_equal(sd, xd) is False and isinstance(sd, int):
            bad = True
    if bad:
        ctx.fail(
            f"input 1 (slope) of shape {shape_str(slope)} does not broadcast to "
            f"X of shape {shape_str(x)}",
            ShapeError,
        )


def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)


register(
    OpDef(
        "PRelu",
        OpKind.BROADCAST,
        inputs=[In("X", "T"), In("slope", "T")],
        outputs=[Out("Y", "T")],
        types={"T": _PRELU},
        verify=_verify_prelu,
        infer=same_as_input(0),
        kernel=lambda ins, _: [_prelu(ins[0], ins[1])],
        doc="slope * X where X < 0, else X; slope broadcasts (unidirectionally) to X",
    )
)


# -- Clip --------------------------------------------------------------------------------
def _verify_clip(ctx: InferContext) -> None:
    for i, name in ((1, "min"), (2, "max")):
        if not ctx.has(i) or ctx.shape(i) is None:
            continue
        s = ctx.shape(i)
        if len(s) == 0 or (len(s) == 1 and dims_equal(s[0], 1) is not False):
            continue
        ctx.fail(f"input {i} ({name}) must be a scalar, got shape {shape_str(s)}", ShapeError)


@_quiet
def _clip(ins: list) -> np.ndarray:
    x = ins[0]
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    y = np.array(x)
    if lo is not None:
        y = np.maximum(y, np.asarray(lo).reshape(()))
    if hi is not None:  # applied last: min > max gives max everywhere, as ONNX says
        y = np.minimum(y, np.asarray(hi).reshape(()))
    return y.astype(x.dtype, copy=False)


register(
    OpDef(
        "Clip",
        OpKind.ELEMENTWISE,
        inputs=[In("input", "T"), In("min", "T", optional=True), In("max", "T", optional=True)],
        outputs=[Out("output", "T")],
        types={"T": _NUM},
        verify=_verify_clip,
        infer=same_as_input(0),
        kernel=lambda ins, _: [_clip(ins)],
        doc="min(max(input, min), max); min and max are optional scalar inputs",
    )
)


# -- variadic: Min, Max, Sum, Mean ----------------------------------------------------------
def _verify_variadic(ctx: InferContext) -> None:
    for i, v in enumerate(ctx.node.inputs):
        if v is None:
            ctx.fail(f"input {i} is missing; variadic inputs cannot be omitted", VerifyError)


def _variadic(op_type: str, types: frozenset, fold: Callable[[list], np.ndarray], doc: str) -> None:
    def kernel(ins: list, _: dict) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return [np.asarray(fold(ins)).astype(ins[0].dtype, copy=False)]

    register(
        OpDef(
            op_type,
            OpKind.BROADCAST,
            inputs=[In("data_0", "T", variadic=True)],
            outputs=[Out(op_type.lower(), "T")],
            types={"T": types},
            verify=_verify_variadic,
            infer=broadcast_infer(),
            kernel=kernel,
            doc=doc,
        )
    )


def _sum(ins: list) -> np.ndarray:
    return functools.reduce(np.add, [_up(x) for x in ins[1:]], np.array(_up(ins[0])))


_variadic(
    "Min",
    _NUM,
    lambda ins: functools.reduce(np.minimum, ins[1:], np.array(ins[0])),
    "elementwise minimum of all inputs, broadcast",
)
_variadic(
    "Max",
    _NUM,
    lambda ins: functools.reduce(np.maximum, ins[1:], np.array(ins[0])),
    "elementwise maximum of all inputs, broadcast",
)
_variadic("Sum", _F, _sum, "elementwise sum of all inputs, broadcast")
_variadic("Mean", _F, lambda ins: _sum(ins) / len(ins), "elementwise mean of all inputs, broadcast")

# -- unary: signs, rounding, identity, casts ------------------------------------------------
unary("Neg", lambda x, _: np.negative(x), types=_SIGNED)
unary("Abs", lambda x, _: np.abs(x), types=_NUM)
unary("Sign", lambda x, _: np.sign(x), types=_NUM)
unary("Relu", lambda x, _: np.maximum(x, 0), types=_SIGNED)
unary("Floor", lambda x, _: np.floor(x))
unary("Ceil", lambda x, _: np.ceil(x))
unary("Round", lambda x, _: np.rint(x), doc="round half to even")
unary("Not", lambda x, _: np.logical_not(x), types=dtypes.BOOL)
unary("BitwiseNot", lambda x, _: np.invert(x), types=dtypes.INTS)
unary("IsNaN", lambda x, _: np.isnan(x), out_dtype=np.bool_)


def _isinf(x: np.ndarray, a: dict) -> np.ndarray:
    pos, neg = bool(a["detect_positive"]), bool(a["detect_negative"])
    return (np.isposinf(x) & pos) | (np.isneginf(x) & neg)


unary(
    "IsInf",
    _isinf,
    out_dtype=np.bool_,
    attrs=[Attr("detect_negative", "int", 1), Attr("detect_positive", "int", 1)],
)
unary("Identity", lambda x, _: np.array(x, copy=True), types=dtypes.ANY)


def _cast_target(ctx: InferContext, to: object) -> np.dtype:
    """The numpy dtype of a Cast's ``to``; DTypeError naming the node if geode lacks it."""
    d = dtypes.to_numpy(to, ctx.where)
    if d not in dtypes.SUPPORTED and d not in dtypes.STORAGE:
        ctx.fail(f"attribute 'to'={to!r} names a dtype geode does not support ({d})", DTypeError)
    return d


def _infer_cast(ctx: InferContext) -> list[TensorDesc]:
    d = ctx.desc(0)
    out = TensorDesc(_cast_target(ctx, ctx.attr("to")), d.shape, d.format)
    if d.dtype.kind in "iu" and out.dtype in (np.int32, np.int64) and carries_value(out):
        # shape values survive an int -> int32/int64 Cast (torch's arange(seq) exports
        # Range(0, Cast(Gather(Shape(x))), 1)): keep them so the Range stays symbolic
        vals = value_dims(ctx, 0)
        info = np.iinfo(out.dtype)
        if vals is not None and all(
            not isinstance(v, int) or info.min <= v <= info.max for v in vals
        ):
            ctx.set_sym_value(0, vals)
    return [out]


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float32 -> FLOAT8E8M0 (a biased power-of-two exponent; the sign is dropped).

    The exponent of ``x`` rounded by ``round_mode`` ("up": any fraction bumps it; "down":
    truncate; "nearest": round to nearest, ties to even by the guard/round/sticky bits);
    NaN and Inf give 0xFF (NaN); with ``saturate`` rounding never reaches 0xFF.
    """
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exp == 0xFF
    if round_mode == "up":
        bump = (bits & 0x7FFFFF) != 0
    elif round_mode == "down":
        bump = np.zeros(exp.shape, dtype=bool)
    elif round_mode == "nearest":
        guard = (bits & 0x400000) != 0
        rest = (bits & 0x3FFFFF) != 0
        bump = guard & (rest | (exp > 0))
    else:
        raise DTypeError(f"Cast: round_mode {round_mode!r} is not 'up', 'down' or 'nearest'")
    bump &= ~special
    if saturate:
        bump &= exp != 0xFE
    out = np.where(special, 0xFF, exp + bump.astype(np.uint16)).astype(np.uint8)
    return out.view(dtypes.to_numpy("float8_e8m0fnu"))


_E8M0 = next((d for d in dtypes.FLOAT8 if d.name == "float8_e8m0fnu"), None)


@_quiet
def cast_array(
    x: np.ndarray, to: np.dtype, saturate: bool = True, round_mode: str = "up"
) -> np.ndarray:
    """ONNX Cast of ``x`` to ``to``.

    numpy's ``astype`` is ONNX's Cast for the numeric dtypes (floats truncate toward zero
    into integers, nonzero is True, out-of-range values are undefined). Into the 8-bit
    floats with ``saturate`` (the default), values beyond the type's range (infinities
    included) clamp to its largest finite value while NaN stays NaN; without it they
    become NaN or Inf as the type allows. FLOAT8E8M0 rounds by ``round_mode``.
    """
    x = np.asarray(x)
    to = np.dtype(to)
    if to == x.dtype:
        return x.copy()
    if _E8M0 is not None and to == _E8M0:
        return _to_e8m0(x.astype(np.float32), bool(saturate), str(round_mode))
    if to in dtypes.FLOAT8 and saturate:
        import ml_dtypes

        info = ml_dtypes.finfo(to)
        wide = x if x.dtype == np.float64 else x.astype(np.float32)
        return np.clip(wide, float(info.min), float(info.max)).astype(to)
    if x.dtype in dtypes.STORAGE and to in dtypes.STORAGE:
        return x.astype(np.float32).astype(to)  # every narrow value is exact in float32
    return x.astype(to)


register(
    OpDef(
        "Cast",
        OpKind.ELEMENTWISE,
        inputs=[In("input", "T1")],
        outputs=[Out("output", "T2")],
        types={"T1": dtypes.ANY},
        attrs=[
            Attr("to", "int", REQUIRED),
            Attr("saturate", "int", 1),
            Attr("round_mode", "string", "up"),
        ],
        infer=_infer_cast,
        kernel=lambda ins, a: [
            cast_array(ins[0], dtypes.to_numpy(a["to"]), a["saturate"], a["round_mode"])
        ],
        doc="convert to dtype 'to' (an ONNX TensorProto enum); 'saturate' only matters for float8",
    )
)


def _infer_cast_like(ctx: InferContext) -> list[TensorDesc]:
    d = ctx.desc(0)
    return [TensorDesc(ctx.dtype(1), d.shape, d.format)]


register(
    OpDef(
        "CastLike",
        OpKind.ELEMENTWISE,
        inputs=[In("input", "T1"), In("target_type", "T2")],
        outputs=[Out("output", "T2")],
        types={"T1": dtypes.ANY, "T2": dtypes.ANY},
        attrs=[Attr("saturate", "int", 1), Attr("round_mode", "string", "up")],
        infer=_infer_cast_like,
        kernel=lambda ins, a: [cast_array(ins[0], ins[1].dtype, a["saturate"], a["round_mode"])],
        doc="Cast to target_type's dtype (only its dtype is read, never its shape or data)",
    )
)


# -- BitCast -------------------------------------------------------------------------------
def _bitcast_target(ctx: InferContext) -> np.dtype:
    d = dtypes.to_numpy(ctx.attr("to"), ctx.where)
    if d not in dtypes.ANY:
        ctx.fail(
            f"attribute 'to'={ctx.attr('to')!r} names a dtype geode does not support ({d})",
            DTypeError,
        )
    src = ctx.dtype(0)
    if d.itemsize != src.itemsize or (d in dtypes.SUB_BYTE_INTS | dtypes.FLOAT4) != (
        src in dtypes.SUB_BYTE_INTS | dtypes.FLOAT4
    ):
        ctx.fail(
            f"cannot reinterpret {dtypes.name(src)} as {dtypes.name(d)}: the bit widths differ",
            DTypeError,
        )
    return d


def _infer_bitcast(ctx: InferContext) -> list[TensorDesc]:
    d = ctx.desc(0)
    return [TensorDesc(_bitcast_target(ctx), d.shape, d.format)]


def _bitcast(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """The same bits read as ``to`` (little endian, as ONNX asks)."""
    x = np.array(x, order="C")  # (ascontiguousarray would make a scalar 1-D)
    if x.dtype.byteorder == ">":
        x = x.astype(x.dtype.newbyteorder("<"))
    out = x.view(to).copy()
    if to == np.bool_:
        out = out.view(np.uint8) != 0
    return out


register(
    OpDef(
        "BitCast",
        OpKind.OPAQUE,
        inputs=[In("input", "T1")],
        outputs=[Out("output", "T2")],
        types={"T1": dtypes.ANY},
        attrs=[Attr("to", "int", REQUIRED)],
        infer=_infer_bitcast,
        kernel=lambda ins, a: [_bitcast(ins[0], dtypes.to_numpy(a["to"]))],
        doc="reinterpret the bits as dtype 'to' (same bit width), no value conversion",
    )
)

# -- unary float math -----------------------------------------------------------------------
unary("Exp", _fmath(lambda x, _: np.exp(x)))
unary("Log", _fmath(lambda x, _: np.log(x)))
unary("Sqrt", _fmath(lambda x, _: np.sqrt(x)))
unary("Reciprocal", _fmath(lambda x, _: np.reciprocal(x)))
unary("Sin", _fmath(lambda x, _: np.sin(x)))
unary("Cos", _fmath(lambda x, _: np.cos(x)))
unary("Tan", _fmath(lambda x, _: np.tan(x)))
unary("Asin", _fmath(lambda x, _: np.arcsin(x)))
unary("Acos", _fmath(lambda x, _: np.arccos(x)))
unary("Atan", _fmath(lambda x, _: np.arctan(x)))
unary("Sinh", _fmath(lambda x, _: np.sinh(x)))
unary("Cosh", _fmath(lambda x, _: np.cosh(x)))
unary("Asinh", _fmath(lambda x, _: np.arcsinh(x)))
unary("Acosh", _fmath(lambda x, _: np.arccosh(x)))
unary("Atanh", _fmath(lambda x, _: np.arctanh(x)))
unary("Tanh", _fmath(lambda x, _: np.tanh(x)))
unary("Erf", _fmath(lambda x, _: erf(x)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x)  # log(1 + exp(x)) without overflow


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.maximum(0, np.minimum(1, alpha * x + beta))


unary("Sigmoid", _fmath(lambda x, _: _sigmoid(x)))
unary("Softplus", _fmath(lambda x, _: _softplus(x)))
unary("Softsign", _fmath(lambda x, _: x / (1 + np.abs(x))))
unary("Mish", _fmath(lambda x, _: x * np.tanh(_softplus(x))))
unary(
    "LeakyRelu",
    _fmath(lambda x, a: np.where(x < 0, _f32(a["alpha"]) * x, x)),
    attrs=[Attr("alpha", "float", 0.01)],
)
unary(
    "Elu",
    _fmath(lambda x, a: np.where(x < 0, _f32(a["alpha"]) * np.expm1(x), x)),
    attrs=[Attr("alpha", "float", 1.0)],
)
unary(
    "Selu",
    _fmath(lambda x, a: _f32(a["gamma"]) * np.where(x > 0, x, _f32(a["alpha"]) * np.expm1(x))),
    attrs=[
        Attr("alpha", "float", 1.67326319217681884765625),
        Attr("gamma", "float", 1.05070102214813232421875),
    ],
)


def _celu(x: np.ndarray, a: dict) -> np.ndarray:
    alpha = _f32(a["alpha"])
    return np.maximum(0, x) + np.minimum(0, alpha * np.expm1(x / alpha))


unary("Celu", _fmath(_celu), attrs=[Attr("alpha", "float", 1.0)])
unary(
    "ThresholdedRelu",
    _fmath(lambda x, a: np.where(x > _f32(a["alpha"]), x, 0)),
    attrs=[Attr("alpha", "float", 1.0)],
)
unary(
    "HardSigmoid",
    _fmath(lambda x, a: _hard_sigmoid(x, _f32(a["alpha"]), _f32(a["beta"]))),
    attrs=[Attr("alpha", "float", 0.2), Attr("beta", "float", 0.5)],
)
# HardSwish's alpha is exactly 1/6 (the ONNX function body's float32 1/6 is an artifact)
unary("HardSwish", _fmath(lambda x, _: x * _hard_sigmoid(x, 1 / 6, 0.5)))

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _gelu(x: np.ndarray, a: dict) -> np.ndarray:
    if _str(a["approximate"]) == "tanh":
        z = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        # 0.5 * (1 + tanh(z)) is sigmoid(2 z), without the cancellation of 1 + tanh(z)
        # where tanh(z) rounds to -1: at x = -7.07 (float32) the sum was 0 and Gelu -0.0,
        # against -1.0e-15 (found by geode.fuzz through a Reciprocal: -inf against -9.8e14;
        # the compiled kernel computes 1 + tanh(z) without the cancellation too)
        return x / (1 + np.exp(-2 * z))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


_with_verify(
    unary(
        "Gelu",
        _fmath(_gelu),
        attrs=[Attr("approximate", "string", "none")],
        doc="x * Phi(x) (approximate='none') or its tanh approximation (approximate='tanh')",
    ),
    _one_of("approximate", ("none", "tanh"), _str),
)
