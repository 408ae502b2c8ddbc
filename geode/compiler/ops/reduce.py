"""Reduction and normalization ops: Reduce*, ArgMax/ArgMin, Softmax family, norms, CumSum.

Every op follows the ONNX opset-21 form. The ``Reduce*`` family takes ``axes`` as an
optional int64 *input* (opset 18): when it is a compile-time constant the output shape is
exact; when it is not, the output rank is still known with ``keepdims=1`` (each dim is
either kept or becomes 1) or when the length of ``axes`` is static, and otherwise the
rank is unknown (shape ``None``).

Composite ops (Softmax, LogSoftmax, LayerNormalization, MeanVarianceNormalization,
LpNormalization, Hardmax, CumSum) are :attr:`OpKind.OPAQUE`: their output is not a
reduced tensor, and a later pass decomposes them into primitives.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.common import same_as_input
from geode.compiler.ops.registry import (
    Attr,
    In,
    InferContext,
    OpDef,
    OpKind,
    Out,
    register,
)
from geode.compiler.shapes import Dim, Shape, as_dim, broadcast_shapes, dims_equal
from geode.errors import ShapeError, VerifyError
from geode.lazy import sympy

#: dtypes of the opset-18 Reduce family (bfloat16 aside)
REDUCE_TYPES = dtypes.FLOATS | frozenset(
    np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64)
)
#: ReduceMax/ReduceMin (opset 20) also take 8-bit ints and bool
MINMAX_TYPES = REDUCE_TYPES | frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.bool_))
#: ArgMax/ArgMin: every numeric type
ARG_TYPES = dtypes.NUMERIC
_I64 = frozenset([np.dtype(np.int64)])


# -- helpers shared with layout.py ----------------------------------------------------------
def opt(ins: Sequence[np.ndarray | None], i: int) -> np.ndarray | None:
    """Kernel input ``i``, or None when it is omitted or past the end of ``ins``."""
    return ins[i] if i < len(ins) else None


def input_length(ctx: InferContext, i: int) -> int | None:
    """Static number of elements of a 1-D (or scalar) input ``i``, None when unknown."""
    if not ctx.has(i):
        return None
    v = ctx.value(i)
    if v is not None:
        return int(np.asarray(v).size)
    shape = ctx.shape(i)
    if shape is None or len(shape) > 1:
        return None
    if len(shape) == 0:
        return 1
    return shape[0] if isinstance(shape[0], int) else None


def normalize_axes(
    ctx: InferContext, axes: Sequence[int], rank: int, what: str = "axes"
) -> list[int]:
    """Normalise axes against ``rank`` (ShapeError naming the node when out of range or repeated)."""
    out = [ctx.axis(a, rank) for a in axes]
    if len(set(out)) != len(out):
        ctx.fail(f"{what} {list(axes)} repeat an axis (rank {rank})")
    return out


def _plain(v: object) -> Dim:
    """A dim without sympy.simplify: ints (numpy or sympy) become ints, expressions stay."""
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, sympy.Expr):
        return int(v) if v.is_Integer else v
    return as_dim(v)


def value_dims(ctx: InferContext, i: int) -> list[Dim] | None:
    """Contents of int input ``i`` as dims, when known before run time.

    Known for constants and for shape tensors whose producer recorded a symbolic value
    (``Shape``, and Concat/Gather/Slice/... over it); None otherwise.
    """
    if not ctx.has(i):
        return None
    vals = ctx.sym_ints(i)
    return None if vals is None else [_plain(v) for v in vals]


def int_values(ctx: InferContext, i: int) -> list[int] | None:
    """Contents of int input ``i`` when every element is a known integer (axes, steps...)."""
    vals = value_dims(ctx, i)
    if vals is None or not all(isinstance(v, int) for v in vals):
        return None
    return vals  # type: ignore[return-value]


#: the largest int tensor whose symbolic contents ops keep track of
MAX_SYM_VALUE = 64


def carries_value(desc: TensorDesc) -> bool:
    """Whether an output is a small static int tensor worth a symbolic value."""
    return (
        desc.dtype.kind in "iu"
        and desc.shape is not None
        and all(isinstance(d, int) for d in desc.shape)
        and int(np.prod(desc.shape, dtype=np.int64)) <= MAX_SYM_VALUE
    )


def value_fits(vals: Sequence[object], dtype: np.dtype) -> bool:
    """Whether symbolic contents ``vals`` are what an int tensor of ``dtype`` holds: every
    int in its range (ops compute them in Python ints, where numpy's would wrap:
    ``uint8 0 - 1`` is 255, not -1), and symbolic entries only in int32/int64 (the dtypes
    of shape arithmetic, whose dims fit)."""
    info = np.iinfo(dtype)
    wide = np.dtype(dtype) in (np.dtype(np.int32), np.dtype(np.int64))
    return all(
        info.min <= int(v) <= info.max if isinstance(v, (int, np.integer)) else wide for v in vals
    )


def _same_dim(dims: Sequence[Dim]) -> Dim | None:
    """The common dim when all ``dims`` are provably equal, else None."""
    if not dims:
        return None
    first = dims[0]
    return first if all(dims_equal(first, d) is True for d in dims[1:]) else None


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulation dtype for float reductions: float16 accumulates in float32."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


# -- Reduce* ---------------------------------------------------------------------------------
def reduce_shape(
    ctx: InferContext, shape: Shape, axes: list[int] | None, keepdims: bool, noop: bool
) -> Shape:
    """Output shape of a reduction over constant ``axes`` (None: no axes given)."""
    if not axes:
        if noop:
            return shape
        if shape is None:
            return None if keepdims else ()
        axes = list(range(len(shape)))
    if shape is None:
        return None
    norm = set(normalize_axes(ctx, axes, len(shape)))
    if keepdims:
        return tuple(1 if i in norm else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in norm)


def _dynamic_reduce_shape(ctx: InferContext, shape: Shape, keepdims: bool, noop: bool) -> Shape:
    """Output shape of a reduction whose ``axes`` input is not a compile-time constant."""
    k = input_length(ctx, 1)
    if k == 0:
        return reduce_shape(ctx, shape, None, keepdims, noop)
    if shape is None:
        return None
    rank = len(shape)
    if k is not None and k > rank:
        ctx.fail(f"axes has {k} entries but the input has rank {rank}")
    if k == rank:  # distinct axes, as many as dims: everything is reduced
        return reduce_shape(ctx, shape, None, keepdims, False)
    if keepdims:
        # each dim is either kept or becomes 1
        return tuple(1 if d == 1 else ctx.fresh() for d in shape)
    if k is None:
        return None
    out: list[Dim] = []
    for i in range(rank - k):
        # output dim i is one of input dims i .. i + k (a subsequence of k dims is removed)
        same = _same_dim(shape[i : i + k + 1])
        out.append(same if same is not None else ctx.fresh())
    return tuple(out)


def infer_reduce(ctx: InferContext, out_dtype: np.dtype | None = None) -> list[TensorDesc]:
    """InferShape of the opset-18 Reduce family (``axes`` as optional input 1)."""
    x = ctx.desc(0)
    keep = bool(ctx.attr("keepdims"))
    noop = bool(ctx.attr("noop_with_empty_axes"))
    dtype = out_dtype if out_dtype is not None else x.dtype
    if ctx.has(1):
        if ctx.rank(1) not in (None, 1):
            ctx.fail(f"axes must be 1-D, got rank {ctx.rank(1)}")
        axes = int_values(ctx, 1)
        if axes is None:
            return [TensorDesc(dtype, _dynamic_reduce_shape(ctx, x.shape, keep, noop))]
    else:
        axes = None
    out = TensorDesc(dtype, reduce_shape(ctx, x.shape, axes, keep, noop))
    _reduce_value(ctx, out)
    return [out]


_VALUE_FOLDS: dict[str, Callable[[list[Dim]], Dim]] = {
    "ReduceSum": lambda v: _plain(sympy.Add(*v)),
    "ReduceProd": lambda v: _plain(sympy.Mul(*v)),
    "ReduceMax": lambda v: _plain(sympy.Max(*v)),
    "ReduceMin": lambda v: _plain(sympy.Min(*v)),
}


def _reduce_value(ctx: InferContext, out: TensorDesc) -> None:
    """Symbolic value of a full reduction of a shape tensor (e.g. ReduceProd(Shape(x)))."""
    fold = _VALUE_FOLDS.get(ctx.node.op_type)
    if fold is None or not carries_value(out) or int(np.prod(out.shape, dtype=np.int64)) != 1:
        return
    vals = value_dims(ctx, 0)
    if vals and ctx.rank(0) in (0, 1):
        folded = [fold(vals)]
        if value_fits(folded, out.dtype):
            ctx.set_sym_value(0, folded)


def kernel_axes(ndim: int, axes: np.ndarray | None, noop: bool) -> tuple[int, ...]:
    """Axes a reference kernel reduces: ``()`` for a no-op, all axes when none are given."""
    if axes is None or np.asarray(axes).size == 0:
        return () if noop else tuple(range(ndim))
    vals = [int(a) for a in np.asarray(axes).reshape(-1)]
    return tuple(a + ndim if a < 0 else a for a in vals)


ReduceFn = Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]


def _sum(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype))


def _mean(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    if x.dtype.kind in "iu":
        return _int_mean(x, axes, keep)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.mean(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype))


def _int_mean(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    """An integer mean, exact: the sum in the input's type (wrapping, as a native
    kernel's does) divided by the count, truncated toward zero; the mean of nothing is
    0 (integer division by zero gives 0 in geode). numpy's mean divides in float64,
    which drops the low bits of int64 sums beyond 2**53 and turns the int64 maximum
    into the minimum."""
    s = np.sum(x, axis=axes, keepdims=keep, dtype=x.dtype)
    n = math.prod(x.shape[a] for a in axes)
    if n == 0:
        return np.zeros_like(s)
    q = s // n
    if x.dtype.kind == "i":
        q = q + ((s % n != 0) & (s < 0)).astype(q.dtype)
    return q


def _identity_low(dtype: np.dtype) -> object:
    if dtype == np.bool_:
        return False
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).min
    return -np.inf


def _identity_high(dtype: np.dtype) -> object:
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return np.inf


def _max(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    # the identity as ``initial`` makes empty reductions give -inf / the type's minimum / False
    return np.maximum.reduce(x, axis=axes, keepdims=keep, initial=_identity_low(x.dtype))


def _min(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.minimum.reduce(x, axis=axes, keepdims=keep, initial=_identity_high(x.dtype))


def _prod(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.prod(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype))


def _l1(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.sum(np.abs(x), axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype))


def _l2(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        wide = np.uint64 if np.issubdtype(x.dtype, np.unsignedinteger) else np.int64
        sq = np.sum(np.square(x.astype(wide)), axis=axes, keepdims=keep)
        return np.sqrt(sq.astype(np.float64))  # cast back (truncating) by the kernel wrapper
    acc = _acc_dtype(x.dtype)
    return np.sqrt(np.sum(np.square(x.astype(acc)), axis=axes, keepdims=keep))


def _logsum(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.sum(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype)))


def _logsumexp(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    xa = x.astype(_acc_dtype(x.dtype))
    with np.errstate(all="ignore"):
        m = np.maximum.reduce(xa, axis=axes, keepdims=True, initial=-np.inf)
        m = np.where(np.isfinite(m), m, 0).astype(xa.dtype)  # all -inf or an inf: no shift
        s = np.sum(np.exp(xa - m), axis=axes, keepdims=True)
        res = np.log(s) + m
    if not keep:
        res = np.squeeze(res, axis=axes)
    return res


def _sumsquare(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    acc = _acc_dtype(x.dtype)
    return np.sum(np.square(x.astype(acc)), axis=axes, keepdims=keep, dtype=acc)


def _reduce_kernel(fn: ReduceFn) -> Callable[[list, dict], list[np.ndarray]]:
    def kernel(ins: list, attrs: dict) -> list[np.ndarray]:
        x = np.asarray(ins[0])
        axes = kernel_axes(x.ndim, opt(ins, 1), bool(attrs["noop_with_empty_axes"]))
        res = fn(x, axes, bool(attrs["keepdims"]))
        return [np.asarray(res).astype(x.dtype, copy=False)]

    return kernel


_REDUCE_ATTRS = [Attr("keepdims", "int", 1), Attr("noop_with_empty_axes", "int", 0)]


def _register_reduce(op_type: str, fn: ReduceFn, types: frozenset, doc: str) -> OpDef:
    return register(
        OpDef(
            op_type,
            OpKind.REDUCE,
            inputs=[In("data", "T"), In("axes", "I", optional=True)],
            outputs=[Out("reduced", "T")],
            types={"T": types, "I": _I64},
            attrs=list(_REDUCE_ATTRS),
            infer=infer_reduce,
            kernel=_reduce_kernel(fn),
            value_inputs=(1,),
            doc=doc,
        )
    )


_register_reduce("ReduceSum", _sum, REDUCE_TYPES, "sum over axes")
_register_reduce("ReduceMean", _mean, REDUCE_TYPES, "mean over axes (integers truncate)")
_register_reduce("ReduceMax", _max, MINMAX_TYPES, "max over axes (empty: -inf / type minimum)")
_register_reduce("ReduceMin", _min, MINMAX_TYPES, "min over axes (empty: +inf / type maximum)")
_register_reduce("ReduceProd", _prod, REDUCE_TYPES, "product over axes")
_register_reduce("ReduceL1", _l1, REDUCE_TYPES, "sum of absolute values over axes")
_register_reduce("ReduceL2", _l2, REDUCE_TYPES, "square root of the sum of squares over axes")
# ReduceLogSum/LogSumExp: log and exp are only defined for floats (integer types were
# dropped from the schema in opset 28 and ONNX's reference refuses them), so floats only.
_register_reduce("ReduceLogSum", _logsum, dtypes.FLOATS, "log of the sum over axes")
_register_reduce("ReduceLogSumExp", _logsumexp, dtypes.FLOATS, "log-sum-exp over axes (stable)")
_register_reduce("ReduceSumSquare", _sumsquare, REDUCE_TYPES, "sum of squares over axes")


# -- ArgMax / ArgMin ----------------------------------------------------------------------------
def infer_arg(ctx: InferContext) -> list[TensorDesc]:
    """InferShape of ArgMax/ArgMin: the axis is kept as 1 or dropped; int64 output."""
    shape = ctx.shape(0)
    i64 = np.dtype(np.int64)
    if shape is None:
        return [TensorDesc(i64, None)]
    axis = ctx.axis(ctx.attr("axis"), len(shape))
    if isinstance(shape[axis], int) and shape[axis] == 0:
        ctx.fail(f"cannot take the arg-extremum over axis {axis} of size 0")
    if ctx.attr("keepdims"):
        out = tuple(1 if i == axis else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i != axis)
    return [TensorDesc(i64, out)]


def _arg_kernel(fn: Callable[..., np.ndarray]) -> Callable[[list, dict], list[np.ndarray]]:
    def kernel(ins: list, attrs: dict) -> list[np.ndarray]:
        x = np.asarray(ins[0])
        axis = int(attrs["axis"])
        axis = axis + x.ndim if axis < 0 else axis
        if attrs["select_last_index"]:
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        if attrs["keepdims"]:
            idx = np.expand_dims(idx, axis)
        return [np.asarray(idx, dtype=np.int64)]

    return kernel


for _name, _fn in (("ArgMax", np.argmax), ("ArgMin", np.argmin)):
    register(
        OpDef(
            _name,
            OpKind.REDUCE,
            inputs=[In("data", "T")],
            outputs=[Out("reduced", "I")],
            types={"T": ARG_TYPES},
            attrs=[
                Attr("axis", "int", 0),
                Attr("keepdims", "int", 1),
                Attr("select_last_index", "int", 0),
            ],
            infer=infer_arg,
            kernel=_arg_kernel(_fn),
            doc=f"index of the {'largest' if _name == 'ArgMax' else 'smallest'} element along axis (int64)",
        )
    )


# -- Softmax / LogSoftmax / Hardmax ---------------------------------------------------------------
def _check_axis_attr(ctx: InferContext) -> None:
    """verify: the ``axis`` attribute is in range for input 0's rank (when known)."""
    rank = ctx.rank(0)
    if rank is not None:
        ctx.axis(ctx.attr("axis"), rank)


def _softmax(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    if x.size == 0:
        return [x.copy()]
    xa = x.astype(_acc_dtype(x.dtype))
    axis = int(attrs["axis"])
    e = np.exp(xa - np.max(xa, axis=axis, keepdims=True))
    return [(e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)]


def _log_softmax(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    if x.size == 0:
        return [x.copy()]
    xa = x.astype(_acc_dtype(x.dtype))
    axis = int(attrs["axis"])
    shifted = xa - np.max(xa, axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return [(shifted - lse).astype(x.dtype)]


def _hardmax(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    y = np.zeros_like(x)
    if x.size == 0:
        return [y]
    axis = int(attrs["axis"])
    axis = axis + x.ndim if axis < 0 else axis
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)  # first occurrence wins
    np.put_along_axis(y, idx, 1, axis=axis)
    return [y]


for _name, _kern, _doc in (
    ("Softmax", _softmax, "exp(x - max) / sum(exp(x - max)) along axis"),
    ("LogSoftmax", _log_softmax, "x - max - log(sum(exp(x - max))) along axis"),
    ("Hardmax", _hardmax, "1 at the first maximum along axis, 0 elsewhere"),
):
    register(
        OpDef(
            _name,
            OpKind.OPAQUE,
            inputs=[In("input", "T")],
            outputs=[Out("output", "T")],
            types={"T": dtypes.FLOATS},
            attrs=[Attr("axis", "int", -1)],
            verify=_check_axis_attr,
            infer=same_as_input(0),
            kernel=_kern,
            doc=_doc,
        )
    )


# -- LayerNormalization ---------------------------------------------------------------------------
def _verify_layer_norm(ctx: InferContext) -> None:
    """verify: stash_type is float32 and Scale/B broadcast to the normalized shape."""
    stash = ctx.attr("stash_type")
    if int(stash) != dtypes.to_onnx(np.float32):
        ctx.fail(f"stash_type {stash} is not supported (only 1, float32)", VerifyError)
    shape = ctx.shape(0)
    if shape is None:
        return
    axis = ctx.axis(ctx.attr("axis"), len(shape))
    norm_shape = shape[axis:]
    for i, name in ((1, "Scale"), (2, "B")):
        if not ctx.has(i) or ctx.shape(i) is None:
            continue
        s = ctx.shape(i)
        if len(s) > len(norm_shape):
            ctx.fail(
                f"{name} has rank {len(s)} but the normalized shape {list(norm_shape)} has rank {len(norm_shape)}"
            )
        try:
            out = broadcast_shapes(norm_shape, s, where=ctx.where)
        except ShapeError:
            out = None
        if out is None or len(out) != len(norm_shape):
            ctx.fail(
                f"{name} shape {list(s)} does not broadcast to the normalized shape {list(norm_shape)}"
            )
        for a, b in zip(out, norm_shape):
            if dims_equal(a, b) is False:
                ctx.fail(
                    f"{name} shape {list(s)} does not broadcast to the normalized shape {list(norm_shape)}"
                )


def _infer_layer_norm(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    stash = dtypes.to_numpy(int(ctx.attr("stash_type")))
    if x.shape is None:
        stat: Shape = None
    else:
        axis = ctx.axis(ctx.attr("axis"), len(x.shape))
        stat = tuple(x.shape[:axis]) + (1,) * (len(x.shape) - axis)
    return [
        TensorDesc(x.dtype, x.shape, x.format),
        TensorDesc(stash, stat),
        TensorDesc(stash, stat),
    ]


def _layer_norm(ins: list, attrs: dict) -> list[np.ndarray]:
    # ONNX's function body: statistics in stash_type, normalized value cast back to T,
    # then scaled and shifted in T.
    x = np.asarray(ins[0])
    scale, bias = ins[1], opt(ins, 2)
    stash = dtypes.to_numpy(int(attrs["stash_type"]))
    axis = int(attrs["axis"])
    axis = axis + x.ndim if axis < 0 else axis
    axes = tuple(range(axis, x.ndim))
    xs = x.astype(stash)
    mean = np.mean(xs, axis=axes, keepdims=True)
    dev = xs - mean
    var = np.mean(dev * dev, axis=axes, keepdims=True)
    inv_std = (1.0 / np.sqrt(var + stash.type(attrs["epsilon"]))).astype(stash)
    y = (dev * inv_std).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return [y.astype(x.dtype), mean.astype(stash), inv_std]


register(
    OpDef(
        "LayerNormalization",
        OpKind.OPAQUE,
        inputs=[In("X", "T"), In("Scale", "T"), In("B", "T", optional=True)],
        outputs=[
            Out("Y", "T"),
            Out("Mean", "U", optional=True),
            Out("InvStdDev", "U", optional=True),
        ],
        types={"T": dtypes.FLOATS},
        attrs=[
            Attr("axis", "int", -1),
            Attr("epsilon", "float", 1e-5),
            Attr("stash_type", "int", 1),
        ],
        verify=_verify_layer_norm,
        infer=_infer_layer_norm,
        kernel=_layer_norm,
        doc="normalize over axes [axis, rank) then scale (and shift); Mean/InvStdDev in stash_type",
    )
)


# -- CumSum ------------------------------------------------------------------------------------
def _verify_cumsum(ctx: InferContext) -> None:
    """verify: the axis input is a scalar (or one element) and in range when constant."""
    if ctx.rank(1) is not None and ctx.rank(1) > 1:
        ctx.fail(f"axis must be a scalar, got rank {ctx.rank(1)}")
    axis = int_values(ctx, 1)
    if axis is None:
        return
    if len(axis) != 1:
        ctx.fail(f"axis must hold one value, got {axis}")
    if ctx.rank(0) is not None:
        ctx.axis(axis[0], ctx.rank(0))


def _cumulative(ins: list, attrs: dict, prod: bool) -> list[np.ndarray]:
    """CumSum / CumProd: the running sum or product along the axis input; ``exclusive``
    shifts in the identity (0 or 1), ``reverse`` runs from the end."""
    x = np.asarray(ins[0])
    axis = int(np.asarray(ins[1]).reshape(-1)[0])
    axis = axis + x.ndim if axis < 0 else axis
    y = np.flip(x, axis) if attrs["reverse"] else x
    acc = _acc_dtype(x.dtype)
    with np.errstate(all="ignore"):
        c = np.cumprod(y, axis=axis, dtype=acc) if prod else np.cumsum(y, axis=axis, dtype=acc)
    if attrs["exclusive"]:
        c = np.roll(c, 1, axis=axis)
        first = [slice(None)] * x.ndim
        first[axis] = slice(0, 1)
        c[tuple(first)] = 1 if prod else 0
    if attrs["reverse"]:
        c = np.flip(c, axis)
    return [np.ascontiguousarray(c).astype(x.dtype)]


def _cumsum(ins: list, attrs: dict) -> list[np.ndarray]:
    return _cumulative(ins, attrs, prod=False)


register(
    OpDef(
        "CumSum",
        OpKind.OPAQUE,
        inputs=[In("x", "T"), In("axis", "T2")],
        outputs=[Out("y", "T")],
        types={"T": REDUCE_TYPES, "T2": dtypes.INDEX},
        attrs=[Attr("exclusive", "int", 0), Attr("reverse", "int", 0)],
        verify=_verify_cumsum,
        infer=same_as_input(0),
        kernel=_cumsum,
        doc="cumulative sum along the axis input (exclusive / reverse variants)",
    )
)

register(
    OpDef(
        "CumProd",
        OpKind.OPAQUE,
        inputs=[In("x", "T"), In("axis", "T2")],
        outputs=[Out("y", "T")],
        types={"T": REDUCE_TYPES, "T2": dtypes.INDEX},
        attrs=[Attr("exclusive", "int", 0), Attr("reverse", "int", 0)],
        verify=_verify_cumsum,
        infer=same_as_input(0),
        kernel=lambda ins, a: _cumulative(ins, a, prod=True),
        doc="cumulative product along the axis input (exclusive / reverse variants)",
    )
)


# -- LpNormalization ------------------------------------------------------------------------------
def _verify_lp(ctx: InferContext) -> None:
    """verify: p is 1 or 2 and axis is in range."""
    if ctx.attr("p") not in (1, 2):
        ctx.fail(f"p must be 1 or 2, got {ctx.attr('p')}", VerifyError)
    _check_axis_attr(ctx)


def _lp_norm(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    xa = x.astype(_acc_dtype(x.dtype))
    axis = int(attrs["axis"])
    if int(attrs["p"]) == 1:
        norm = np.sum(np.abs(xa), axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(xa * xa, axis=axis, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, 0, xa / norm)  # a zero norm gives 0, not NaN
    return [y.astype(x.dtype)]


register(
    OpDef(
        "LpNormalization",
        OpKind.OPAQUE,
        inputs=[In("input", "T")],
        outputs=[Out("output", "T")],
        types={"T": dtypes.FLOATS},
        attrs=[Attr("axis", "int", -1), Attr("p", "int", 2)],
        verify=_verify_lp,
        infer=same_as_input(0),
        kernel=_lp_norm,
        doc="x / ||x||_p along axis (p in {1, 2}; zero norm gives 0)",
    )
)


# -- MeanVarianceNormalization --------------------------------------------------------------------
def _verify_mvn(ctx: InferContext) -> None:
    """verify: the axes attribute is in range and has no repeats."""
    rank = ctx.rank(0)
    if rank is not None:
        normalize_axes(ctx, list(ctx.attr("axes")), rank)


def _mvn(ins: list, attrs: dict) -> list[np.ndarray]:
    # ONNX's function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)
    x = np.asarray(ins[0])
    xa = x.astype(_acc_dtype(x.dtype))
    axes = tuple(int(a) + x.ndim if int(a) < 0 else int(a) for a in attrs["axes"])
    mean = np.mean(xa, axis=axes, keepdims=True)
    var = np.mean(xa * xa, axis=axes, keepdims=True) - mean * mean
    with np.errstate(invalid="ignore"):
        std = np.sqrt(var)
    return [((xa - mean) / (std + xa.dtype.type(1e-9))).astype(x.dtype)]


register(
    OpDef(
        "MeanVarianceNormalization",
        OpKind.OPAQUE,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T")],
        types={"T": dtypes.FLOATS},
        attrs=[Attr("axes", "ints", [0, 2, 3])],
        verify=_verify_mvn,
        infer=same_as_input(0),
        kernel=_mvn,
        doc="(X - mean) / (std + 1e-9) over axes",
    )
)
