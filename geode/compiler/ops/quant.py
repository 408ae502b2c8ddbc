"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, MatMulInteger and ConvInteger.

Reference kernels follow ONNX semantics (opset 21 and the later additions: ``output_dtype``,
``precision``, blocked quantization, the 4- and 2-bit and 8-bit float types):

* ``QuantizeLinear``: ``y = saturate(round(x / y_scale) + y_zero_point)``, rounding half to
  even, saturating to the range of the output type (uint8 by default, else the zero
  point's type or ``output_dtype``). Into float8 the zero point is not added and
  ``saturate`` picks clamping (default) or Inf/NaN for values out of range.
* ``DequantizeLinear``: ``y = (x - x_zero_point) * x_scale`` in float32, then the output
  type (``output_dtype``, else the scale's type).

Scales and zero points are per tensor (a scalar or one element), per axis (1-D along
``axis``) or blocked (``block_size`` > 0: the same rank as ``x``, ``axis`` divided in
blocks of ``block_size``). The integer ops accumulate in int32.

All of them run on the AICPU engine (OpKind.OPAQUE/LIBRARY: geode compiles no kernels in
the narrow types).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.elementwise import cast_array
from geode.compiler.ops.nn import CONV_ATTRS, conv_nd, conv_shape, matmul_shape
from geode.compiler.ops.registry import Attr, In, InferContext, OpDef, OpKind, Out, register
from geode.compiler.shapes import as_dim, dims_equal
from geode.errors import DTypeError, ShapeError, VerifyError

_NP = np.dtype
#: integer quantized types and their ranges
INT_RANGES: dict[np.dtype, tuple[int, int]] = {
    _NP(np.uint8): (0, 255),
    _NP(np.int8): (-128, 127),
    _NP(np.uint16): (0, 65535),
    _NP(np.int16): (-32768, 32767),
}
for _name, _rng in (("uint4", (0, 15)), ("int4", (-8, 7)), ("uint2", (0, 3)), ("int2", (-2, 1))):
    for _d in dtypes.SUB_BYTE_INTS:
        if _d.name == _name:
            INT_RANGES[_d] = _rng

#: the 8-bit floats QuantizeLinear produces (FLOAT8E8M0 is a scale type, not a quantized one)
QUANT_FLOAT8 = frozenset(d for d in dtypes.FLOAT8 if d.name != "float8_e8m0fnu")
#: types QuantizeLinear produces and DequantizeLinear reads
QUANTIZED = frozenset(INT_RANGES) | QUANT_FLOAT8 | dtypes.FLOAT4
#: DequantizeLinear also reads int32 (e.g. a quantized bias)
DEQUANT_INPUTS = QUANTIZED | frozenset([_NP(np.int32)])
#: types of ``x`` and of the scales
SCALE_TYPES = dtypes.FLOATS | dtypes.BFLOAT16 | frozenset([_NP(np.int32)])
#: 8-bit integers of the integer matmul/conv ops
INT8S = frozenset([_NP(np.int8), _NP(np.uint8)])


# -- helpers ---------------------------------------------------------------------------------
def quant_param(
    value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int
) -> np.ndarray:
    """A scale or zero point shaped to broadcast against an input of ``shape``.

    Per tensor: a scalar. Per axis: a 1-D tensor placed along ``axis``. Blocked
    (``block_size`` > 0): each element repeated ``block_size`` times along ``axis``
    (the last block may be short).
    """
    v = np.asarray(value)
    if v.ndim == 0:
        return v
    if v.size == 1 and not block_size:
        return v.reshape(())
    if not 0 <= axis < len(shape):
        raise ShapeError(f"axis {axis} is out of range for an input of rank {len(shape)}")
    if not block_size:
        if v.ndim != 1 or v.size != shape[axis]:
            raise ShapeError(
                f"a per-axis scale or zero point must be 1-D of length {shape[axis]} (axis {axis}), "
                f"got shape {list(v.shape)}"
            )
        dims = [1] * len(shape)
        dims[axis] = v.size
        return v.reshape(dims)
    if v.ndim != len(shape):
        raise ShapeError(
            f"a blocked scale or zero point must have rank {len(shape)}, got shape {list(v.shape)}"
        )
    full = np.repeat(v, block_size, axis=axis)
    if full.shape[axis] >= shape[axis]:
        full = np.take(full, np.arange(shape[axis]), axis=axis)
    if full.shape != tuple(shape):
        raise ShapeError(
            f"blocked scale or zero point of shape {list(v.shape)} with block_size {block_size} "
            f"does not cover an input of shape {list(shape)}"
        )
    return full


def _axis(axis: int, rank: int) -> int:
    """``axis`` normalised against ``rank`` (only per-axis and blocked parameters read it)."""
    if not -rank <= axis < rank:
        return axis  # harmless unless a per-axis or blocked parameter needs it
    return axis % rank


def _as_int(v: np.ndarray) -> np.ndarray:
    """An integer array (sub-byte ints widened) for arithmetic."""
    return np.asarray(v).astype(np.int64)


def _verify_params(ctx: InferContext, scale_i: int, zp_i: int | None) -> None:
    """verify: scale and zero point shapes agree with axis and block_size."""
    x = ctx.shape(0)
    block = int(ctx.attr("block_size") or 0)
    if block < 0:
        ctx.fail(f"block_size must not be negative, got {block}", VerifyError)
    for i in (scale_i, zp_i):
        if i is None or not ctx.has(i):
            continue
        s = ctx.shape(i)
        if s is None or x is None:
            continue
        if block:
            if len(s) != len(x):
                ctx.fail(
                    f"blocked quantization: input {i} must have rank {len(x)}, got shape {list(s)}"
                )
        elif len(s) > 1:
            ctx.fail(f"input {i} must be a scalar or 1-D (per axis), got shape {list(s)}")
        elif len(s) == 1 and len(x) > 0 and s[0] != 1:
            axis = _axis(int(ctx.attr("axis")), len(x))
            if dims_equal(s[0], x[axis]) is False:
                ctx.fail(
                    f"input {i} has {s[0]} elements but axis {axis} of the input has {x[axis]}"
                )
    if zp_i is not None and ctx.has(zp_i) and ctx.has(scale_i):
        zs, ss = ctx.shape(zp_i), ctx.shape(scale_i)
        same_rank = zs is not None and ss is not None and len(zs) == len(ss)
        if same_rank and any(dims_equal(a, b) is False for a, b in zip(zs, ss)):
            ctx.fail(f"zero point shape {list(zs)} differs from scale shape {list(ss)}")


# -- QuantizeLinear ----------------------------------------------------------------------------
def _quant_out_dtype(zp_dtype: np.dtype | None, output_dtype: int) -> np.dtype:
    if zp_dtype is not None:
        return np.dtype(zp_dtype)
    if output_dtype:
        return dtypes.to_numpy(int(output_dtype))
    return np.dtype(np.uint8)


def _quantize_verify(ctx: InferContext) -> None:
    out_attr = int(ctx.attr("output_dtype") or 0)
    if ctx.has(2) and out_attr and dtypes.to_numpy(out_attr) != ctx.dtype(2):
        ctx.fail(
            f"output_dtype {dtypes.name(dtypes.to_numpy(out_attr))} differs from the zero point's "
            f"dtype {dtypes.name(ctx.dtype(2))}",
            VerifyError,
        )
    out = _quant_out_dtype(ctx.dtype(2) if ctx.has(2) else None, out_attr)
    if out not in QUANTIZED:
        ctx.fail(f"cannot quantize to {dtypes.name(out)}", DTypeError)
    _verify_params(ctx, 1, 2)


def _quantize_infer(ctx: InferContext) -> list[TensorDesc]:
    d = ctx.desc(0)
    out = _quant_out_dtype(ctx.dtype(2) if ctx.has(2) else None, int(ctx.attr("output_dtype") or 0))
    return [TensorDesc(out, d.shape, d.format)]


def quantize_linear(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    *,
    axis: int = 1,
    saturate: bool = True,
    block_size: int = 0,
    output_dtype: int = 0,
    precision: int = 0,
) -> np.ndarray:
    """ONNX QuantizeLinear on numpy arrays."""
    x = np.asarray(x)
    ax = _axis(int(axis), x.ndim)
    out = _quant_out_dtype(
        None if zero_point is None else np.asarray(zero_point).dtype, int(output_dtype)
    )
    s = quant_param(scale, x.shape, ax, int(block_size))
    with np.errstate(all="ignore"):
        if precision:
            work = dtypes.to_numpy(int(precision))
            q = x.astype(work) / s.astype(work)
        else:
            q = x / s
        zp = None if zero_point is None else quant_param(zero_point, x.shape, ax, int(block_size))
        if out in INT_RANGES:
            lo, hi = INT_RANGES[out]
            r = np.rint(q).astype(np.float64)
            if zp is not None:
                r = r + _as_int(zp)
            return np.clip(r, lo, hi).astype(np.int64).astype(out)
        if out in QUANT_FLOAT8:
            return cast_array(q, out, bool(saturate))
        if zp is not None:  # FLOAT4E2M1: its cast saturates on its own (no Inf/NaN encodings)
            q = q.astype(np.float32) + np.asarray(zp).astype(np.float32)
        return np.asarray(q).astype(np.float32).astype(out)


register(
    OpDef(
        "QuantizeLinear",
        OpKind.OPAQUE,
        inputs=[In("x", "T1"), In("y_scale", "T2"), In("y_zero_point", "T3", optional=True)],
        outputs=[Out("y", "T3")],
        types={"T1": SCALE_TYPES, "T2": SCALE_TYPES | dtypes.FLOAT8, "T3": QUANTIZED},
        attrs=[
            Attr("axis", "int", 1),
            Attr("saturate", "int", 1),
            Attr("block_size", "int", 0),
            Attr("output_dtype", "int", 0),
            Attr("precision", "int", 0),
        ],
        verify=_quantize_verify,
        infer=_quantize_infer,
        kernel=lambda ins, a: [
            quantize_linear(
                ins[0],
                ins[1],
                ins[2] if len(ins) > 2 else None,
                axis=a["axis"],
                saturate=a["saturate"],
                block_size=a["block_size"],
                output_dtype=a["output_dtype"],
                precision=a["precision"],
            )
        ],
        doc="saturate(round(x / y_scale) + y_zero_point), per tensor, per axis or blocked",
    )
)


# -- DequantizeLinear --------------------------------------------------------------------------
def _dequant_out_dtype(ctx_or_scale: np.dtype, output_dtype: int) -> np.dtype:
    return dtypes.to_numpy(int(output_dtype)) if output_dtype else np.dtype(ctx_or_scale)


def _dequantize_verify(ctx: InferContext) -> None:
    if ctx.has(2) and ctx.dtype(2) != ctx.dtype(0):
        ctx.fail(
            f"zero point dtype {dtypes.name(ctx.dtype(2))} differs from x's {dtypes.name(ctx.dtype(0))}",
            DTypeError,
        )
    if ctx.dtype(0) == np.int32 and ctx.has(2):
        zp = ctx.value(2)
        if zp is not None and np.any(zp != 0):
            ctx.fail("an int32 input takes no (or a zero) zero point", VerifyError)
    _verify_params(ctx, 1, 2)


def _dequantize_infer(ctx: InferContext) -> list[TensorDesc]:
    d = ctx.desc(0)
    return [
        TensorDesc(
            _dequant_out_dtype(ctx.dtype(1), int(ctx.attr("output_dtype") or 0)), d.shape, d.format
        )
    ]


def dequantize_linear(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> np.ndarray:
    """ONNX DequantizeLinear on numpy arrays (computed in float32)."""
    x = np.asarray(x)
    scale = np.asarray(scale)
    ax = _axis(int(axis), x.ndim)
    out = _dequant_out_dtype(scale.dtype, int(output_dtype))
    dx = x.astype(np.float32)
    if zero_point is not None and x.dtype not in QUANT_FLOAT8 and x.dtype not in dtypes.FLOAT4:
        zp = quant_param(zero_point, x.shape, ax, int(block_size))
        zp = zp.astype(np.int64) if zp.dtype in dtypes.SUB_BYTE_INTS else zp
        dx = dx - zp
    s = quant_param(scale, x.shape, ax, int(block_size))
    if s.dtype in dtypes.STORAGE:
        s = s.astype(np.float32)
    with np.errstate(all="ignore"):
        return np.asarray(dx * s).astype(out)


register(
    OpDef(
        "DequantizeLinear",
        OpKind.OPAQUE,
        inputs=[In("x", "T1"), In("x_scale", "T2"), In("x_zero_point", "T1", optional=True)],
        outputs=[Out("y", "T3")],
        types={"T1": DEQUANT_INPUTS, "T2": dtypes.FLOATS | dtypes.BFLOAT16 | dtypes.FLOAT8},
        attrs=[
            Attr("axis", "int", 1),
            Attr("block_size", "int", 0),
            Attr("output_dtype", "int", 0),
        ],
        verify=_dequantize_verify,
        infer=_dequantize_infer,
        kernel=lambda ins, a: [
            dequantize_linear(
                ins[0],
                ins[1],
                ins[2] if len(ins) > 2 else None,
                axis=a["axis"],
                block_size=a["block_size"],
                output_dtype=a["output_dtype"],
            )
        ],
        doc="(x - x_zero_point) * x_scale, per tensor, per axis or blocked",
    )
)


# -- DynamicQuantizeLinear ---------------------------------------------------------------------
def dynamic_quantize_linear(x: np.ndarray) -> list[np.ndarray]:
    """ONNX DynamicQuantizeLinear: uint8 data, its float32 scale and uint8 zero point.

    The range is ``[min(0, min(x)), max(0, max(x))]`` mapped onto ``[0, 255]``; the zero
    point is ``round(-min / scale)`` saturated to uint8.
    """
    x = np.asarray(x, dtype=np.float32)
    hi = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    lo = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    scale = np.float32((hi - lo) if hi != lo else 1.0) / np.float32(255)
    zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    with np.errstate(all="ignore"):
        y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return [y, np.array(scale, dtype=np.float32), np.array(zp, dtype=np.uint8)]


register(
    OpDef(
        "DynamicQuantizeLinear",
        OpKind.OPAQUE,
        inputs=[In("x", "T1")],
        outputs=[Out("y", "T2"), Out("y_scale", "T1"), Out("y_zero_point", "T2")],
        types={"T1": frozenset([_NP(np.float32)])},
        infer=lambda ctx: [
            TensorDesc(np.dtype(np.uint8), ctx.shape(0)),
            TensorDesc(np.dtype(np.float32), ()),
            TensorDesc(np.dtype(np.uint8), ()),
        ],
        kernel=lambda ins, a: dynamic_quantize_linear(ins[0]),
        doc="uint8 quantization with a scale and zero point computed from the data's range",
    )
)


# -- MatMulInteger / QLinearMatMul ------------------------------------------------------------
def _row_param(v: np.ndarray | None, a_ndim: int) -> np.ndarray | int:
    """A's zero point or scale: a scalar, or per row (1-D of M) as an (M, 1) column."""
    if v is None:
        return 0
    v = np.asarray(v)
    if v.size == 1:
        return v.reshape(())
    return v.reshape(-1, 1) if a_ndim >= 2 and v.ndim == 1 else v


def _col_param(v: np.ndarray | None) -> np.ndarray | int:
    """B's zero point or scale: a scalar, or per column (1-D of N)."""
    if v is None:
        return 0
    v = np.asarray(v)
    return v.reshape(()) if v.size == 1 else v


def matmul_integer(
    a: np.ndarray, b: np.ndarray, a_zero_point: np.ndarray | None, b_zero_point: np.ndarray | None
) -> np.ndarray:
    """``(A - a_zero_point) @ (B - b_zero_point)`` accumulated in int32."""
    a32 = np.asarray(a).astype(np.int32) - np.asarray(_row_param(a_zero_point, np.ndim(a))).astype(
        np.int32
    )
    b32 = np.asarray(b).astype(np.int32) - np.asarray(_col_param(b_zero_point)).astype(np.int32)
    return np.matmul(a32, b32).astype(np.int32)


register(
    OpDef(
        "MatMulInteger",
        OpKind.LIBRARY,
        inputs=[
            In("A", "T1"),
            In("B", "T2"),
            In("a_zero_point", "T1", optional=True),
            In("b_zero_point", "T2", optional=True),
        ],
        outputs=[Out("Y", "T3")],
        types={"T1": INT8S, "T2": INT8S},
        infer=lambda ctx: [
            TensorDesc(np.dtype(np.int32), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))
        ],
        kernel=lambda ins, a: [
            matmul_integer(
                ins[0], ins[1], ins[2] if len(ins) > 2 else None, ins[3] if len(ins) > 3 else None
            )
        ],
        doc="integer matmul of 8-bit operands minus their zero points, int32 result",
    )
)


def _requantize(
    acc: np.ndarray, multiplier: Any, y_zero_point: np.ndarray | None, out: np.dtype
) -> np.ndarray:
    """``saturate(round(acc * multiplier) + y_zero_point)`` into ``out`` (an 8-bit int)."""
    lo, hi = INT_RANGES[np.dtype(out)]
    with np.errstate(all="ignore"):
        r = acc * multiplier
        if y_zero_point is not None:
            r = r + np.asarray(y_zero_point).astype(np.float64)
        return np.clip(np.rint(r), lo, hi).astype(out)


def qlinear_matmul(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray | None,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None,
) -> np.ndarray:
    """ONNX QLinearMatMul: integer matmul, rescaled by ``a_scale * b_scale / y_scale``."""
    acc = matmul_integer(a, b, a_zero_point, b_zero_point)
    # the multiplier in the scales' dtype, applied in double
    mult = (
        np.asarray(_row_param(a_scale, np.ndim(a)))
        * np.asarray(_col_param(b_scale))
        / np.asarray(y_scale).reshape(())
    )
    out = np.asarray(y_zero_point).dtype if y_zero_point is not None else np.asarray(a).dtype
    zp = None if y_zero_point is None else np.asarray(y_zero_point).reshape(())
    return _requantize(acc.astype(np.float64), np.asarray(mult).astype(np.float64), zp, out)


register(
    OpDef(
        "QLinearMatMul",
        OpKind.LIBRARY,
        inputs=[
            In("a", "T1"),
            In("a_scale", "TS"),
            In("a_zero_point", "T1"),
            In("b", "T2"),
            In("b_scale", "TS"),
            In("b_zero_point", "T2"),
            In("y_scale", "TS"),
            In("y_zero_point", "T3"),
        ],
        outputs=[Out("y", "T3")],
        types={"T1": INT8S, "T2": INT8S, "T3": INT8S, "TS": dtypes.FLOATS},
        infer=lambda ctx: [TensorDesc(ctx.dtype(7), matmul_shape(ctx, ctx.shape(0), ctx.shape(3)))],
        kernel=lambda ins, a: [qlinear_matmul(*ins[:8])],
        doc="quantized matmul: dequantize a and b, multiply, quantize with y_scale/y_zero_point",
    )
)


# -- ConvInteger / QLinearConv ----------------------------------------------------------------
def _conv_params(attrs: dict) -> dict:
    return {a.name: attrs.get(a.name, a.default) for a in CONV_ATTRS}


def _weight_zero_point(w_zero_point: np.ndarray | None, w_ndim: int) -> np.ndarray:
    """W's zero point: a scalar or one per output channel (reshaped to (M, 1, ..., 1))."""
    if w_zero_point is None:
        return np.zeros((), np.int32)
    z = np.asarray(w_zero_point).astype(np.int32)
    if z.size == 1:
        return z.reshape(())
    return z.reshape((-1,) + (1,) * (w_ndim - 1))


def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None,
    w_zero_point: np.ndarray | None,
    attrs: dict,
) -> np.ndarray:
    """Convolution of ``X - x_zero_point`` with ``W - w_zero_point``, accumulated in int32."""
    x32 = np.asarray(x).astype(np.int32)
    if x_zero_point is not None:
        x32 = x32 - np.asarray(x_zero_point).astype(np.int32).reshape(())
    w32 = np.asarray(w).astype(np.int32) - _weight_zero_point(w_zero_point, np.ndim(w))
    return conv_nd(x32, w32, None, _conv_params(attrs)).astype(np.int32)


def _conv_like_verify(x_i: int, w_i: int) -> Any:
    """Conv's checks on the inputs at ``x_i`` / ``w_i`` of a quantized convolution."""

    def verify(ctx: InferContext) -> None:
        """verify: rank, groups and channels of X and W."""
        x, w = ctx.shape(x_i), ctx.shape(w_i)
        group = int(ctx.attr("group") or 1)
        if group < 1:
            ctx.fail(f"group must be >= 1, got {group}", VerifyError)
        if x is not None and len(x) < 3:
            ctx.fail(f"X must have rank >= 3 (N, C, spatial...), got shape {list(x)}")
        if x is not None and w is not None:
            if len(x) != len(w):
                ctx.fail(f"X of shape {list(x)} and W of shape {list(w)} must have the same rank")
            if dims_equal(x[1], as_dim(w[1] * group)) is False:
                ctx.fail(f"input channels X[1]={x[1]} must equal W[1] * group = {w[1]} * {group}")

    return verify


register(
    OpDef(
        "ConvInteger",
        OpKind.LIBRARY,
        inputs=[
            In("x", "T1"),
            In("w", "T2"),
            In("x_zero_point", "T1", optional=True),
            In("w_zero_point", "T2", optional=True),
        ],
        outputs=[Out("y", "T3")],
        types={"T1": INT8S, "T2": INT8S},
        attrs=list(CONV_ATTRS),
        verify=_conv_like_verify(0, 1),
        infer=lambda ctx: [
            TensorDesc(np.dtype(np.int32), conv_shape(ctx, ctx.shape(0), ctx.shape(1)))
        ],
        kernel=lambda ins, a: [
            conv_integer(
                ins[0],
                ins[1],
                ins[2] if len(ins) > 2 else None,
                ins[3] if len(ins) > 3 else None,
                a,
            )
        ],
        doc="integer convolution of 8-bit operands minus their zero points, int32 result",
    )
)


def qlinear_conv(ins: list, attrs: dict) -> np.ndarray:
    """ONNX QLinearConv: integer conv (+ int32 bias), rescaled by ``x_scale * w_scale / y_scale``."""
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = ins[:8]
    bias = ins[8] if len(ins) > 8 else None
    acc = conv_integer(x, w, x_zp, w_zp, attrs).astype(np.int64)
    nsp = np.ndim(x) - 2
    if bias is not None:
        acc = acc + np.asarray(bias).astype(np.int64).reshape((1, -1) + (1,) * nsp)
    ws = np.asarray(w_scale).astype(np.float32)
    ws = ws.reshape(()) if ws.size == 1 else ws.reshape((1, -1) + (1,) * nsp)
    mult = (
        np.asarray(x_scale).astype(np.float32).reshape(())
        * ws
        / np.asarray(y_scale).astype(np.float32).reshape(())
    )
    out = np.asarray(y_zp).dtype if y_zp is not None else np.asarray(x).dtype
    zp = None if y_zp is None else np.asarray(y_zp).reshape(())
    return _requantize(acc.astype(np.float32), mult, zp, out)


register(
    OpDef(
        "QLinearConv",
        OpKind.LIBRARY,
        inputs=[
            In("x", "T1"),
            In("x_scale", "TS"),
            In("x_zero_point", "T1"),
            In("w", "T2"),
            In("w_scale", "TS"),
            In("w_zero_point", "T2"),
            In("y_scale", "TS"),
            In("y_zero_point", "T3"),
            In("B", "T4", optional=True),
        ],
        outputs=[Out("y", "T3")],
        types={
            "T1": INT8S,
            "T2": INT8S,
            "T3": INT8S,
            "T4": frozenset([_NP(np.int32)]),
            "TS": frozenset([_NP(np.float32)]),
        },
        attrs=list(CONV_ATTRS),
        verify=_conv_like_verify(0, 3),
        infer=lambda ctx: [TensorDesc(ctx.dtype(7), conv_shape(ctx, ctx.shape(0), ctx.shape(3)))],
        kernel=lambda ins, a: [qlinear_conv(ins, a)],
        doc="quantized convolution: dequantize x and w, convolve, add bias, quantize with y_scale",
    )
)

__all__ = [
    "INT_RANGES",
    "QUANTIZED",
    "conv_integer",
    "dequantize_linear",
    "dynamic_quantize_linear",
    "matmul_integer",
    "qlinear_conv",
    "qlinear_matmul",
    "quant_param",
    "quantize_linear",
]
