"""Host ops: shape computations and ops whose output shape depends on input values.

Shape, Size, ConstantOfShape, Range, NonZero, EyeLike, OneHot, TopK and Unique run on
the host engine (OpKind.HOST). Where an output shape depends on an input's *value*
(ConstantOfShape's shape, Range's bounds, OneHot's depth, TopK's K, NonZero's and
Unique's data) the OpDef lists that input in ``value_inputs``; shape inference reads
the value when it is a compile-time constant and otherwise gives the dim a fresh
symbol, bound when the op runs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.common import const_ints
from geode.compiler.ops.registry import Attr, In, InferContext, OpDef, OpKind, Out, register
from geode.compiler.shapes import Dim, as_dim, numel
from geode.errors import ShapeError, VerifyError

INT64 = frozenset([np.dtype(np.int64)])
#: dtypes of Range (ONNX: float, double, int16, int32, int64)
RANGE_TYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int16, np.int32, np.int64))


# -- helpers --------------------------------------------------------------------------------


def shape_slice(rank: int, start: int, end: int | None) -> tuple[int, int]:
    """Shape's (start, end) attributes clamped to ``[0, rank]`` (negative ones count from the back)."""
    s = start + rank if start < 0 else start
    e = rank if end is None else (end + rank if end < 0 else end)
    s = min(max(s, 0), rank)
    e = min(max(e, 0), rank)
    return s, max(s, e)


def shape_value(ctx: InferContext, i: int) -> list[Dim] | None:
    """The dims held by a 1-D int input: from a constant, or from a Shape node's input.

    Returns None when the value is not known before run time.
    """
    vals = const_ints(ctx, i)
    if vals is not None:
        return list(vals)
    v = ctx.input(i)
    prod = v.producer if v is not None else None
    if prod is not None and prod.op_type == "Shape" and prod.domain == "":
        src = prod.input(0)
        if src is not None and src.shape is not None:
            s, e = shape_slice(len(src.shape), int(prod.attr("start", 0)), prod.attr("end"))
            return list(src.shape[s:e])
    return None


def _scalar(ctx: InferContext, i: int) -> Any:
    """The single element of a constant input (None when not constant)."""
    v = ctx.value(i) if ctx.has(i) else None
    if v is None:
        return None
    arr = np.asarray(v)
    if arr.size != 1:
        ctx.fail(f"input {i} must hold exactly one element, has shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def _check_scalar_input(ctx: InferContext, i: int, what: str) -> None:
    """Input ``i`` must be a scalar or a one-element 1-D tensor."""
    shape = ctx.shape(i)
    if shape is None:
        return
    if len(shape) > 1 or (len(shape) == 1 and isinstance(shape[0], int) and shape[0] != 1):
        ctx.fail(f"{what} must be a scalar (or one element), got shape {list(shape)}")


# == Shape / Size ============================================================================


def _shape_infer(ctx: InferContext) -> list[TensorDesc]:
    r = ctx.rank(0)
    if r is None:
        return [TensorDesc(np.int64, (ctx.fresh(),))]
    s, e = shape_slice(r, int(ctx.attr("start")), ctx.attr("end"))
    return [TensorDesc(np.int64, (e - s,))]


def _shape_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x = ins[0]
    s, e = shape_slice(x.ndim, int(attrs.get("start") or 0), attrs.get("end"))
    return [np.array(x.shape[s:e], dtype=np.int64)]


register(
    OpDef(
        "Shape",
        OpKind.HOST,
        inputs=[In("data", "T")],
        outputs=[Out("shape", "T1")],
        types={"T": dtypes.ALL},
        attrs=[Attr("start", "int", 0), Attr("end", "int", None)],
        infer=_shape_infer,
        kernel=_shape_kernel,
        doc="the input's shape as int64, optionally sliced with start/end",
    )
)

register(
    OpDef(
        "Size",
        OpKind.HOST,
        inputs=[In("data", "T")],
        outputs=[Out("size", "T1")],
        types={"T": dtypes.ALL},
        infer=lambda ctx: [TensorDesc(np.int64, ())],
        kernel=lambda ins, attrs: [np.array(np.asarray(ins[0]).size, dtype=np.int64)],
        doc="number of elements of the input, as an int64 scalar",
    )
)


# == ConstantOfShape =========================================================================


def _cos_value(attrs: dict[str, Any]) -> np.ndarray:
    v = attrs.get("value")
    return np.zeros(1, dtype=np.float32) if v is None else np.asarray(v)


def _cos_verify(ctx: InferContext) -> None:
    v = _cos_value(ctx.attrs)
    if v.size != 1:
        ctx.fail(f"attribute 'value' must hold one element, has shape {list(v.shape)}", VerifyError)
    if v.dtype not in dtypes.ALL:
        ctx.fail(f"attribute 'value' has unsupported dtype {v.dtype}", VerifyError)
    r = ctx.rank(0)
    if r is not None and r != 1:
        ctx.fail(f"input must be 1-D, got shape {list(ctx.shape(0))}")


def _cos_infer(ctx: InferContext) -> list[TensorDesc]:
    dtype = _cos_value(ctx.attrs).dtype
    dims = shape_value(ctx, 0)
    if dims is not None:
        for d in dims:
            if isinstance(d, int) and d < 0:
                ctx.fail(f"shape {dims} has a negative dim")
        return [TensorDesc(dtype, tuple(as_dim(d) for d in dims))]
    shape = ctx.shape(0)
    if shape is not None and len(shape) == 1 and isinstance(shape[0], int):
        return [TensorDesc(dtype, tuple(ctx.fresh() for _ in range(shape[0])))]
    return [TensorDesc(dtype, None)]


def _cos_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    dims = [int(d) for d in np.asarray(ins[0]).reshape(-1)]
    if any(d < 0 for d in dims):
        raise ShapeError(f"ConstantOfShape: shape {dims} has a negative dim")
    v = _cos_value(attrs)
    return [np.full(dims, v.reshape(-1)[0], dtype=v.dtype)]


register(
    OpDef(
        "ConstantOfShape",
        OpKind.HOST,
        inputs=[In("input", "T1")],
        outputs=[Out("output", "T2")],
        types={"T1": INT64},
        attrs=[Attr("value", "tensor", None)],
        verify=_cos_verify,
        infer=_cos_infer,
        kernel=_cos_kernel,
        value_inputs=(0,),
        doc="a tensor of the given shape filled with 'value' (default float32 0)",
    )
)


# == Range ===================================================================================


def range_length(start: Any, limit: Any, delta: Any) -> int:
    """``max(ceil((limit - start) / delta), 0)``, computed like numpy.arange (in double for floats)."""
    if delta == 0:
        raise ShapeError("Range: delta must not be zero")
    if all(isinstance(v, (int, np.integer)) for v in (start, limit, delta)):
        n = -((int(start) - int(limit)) // int(delta))
    else:
        n = math.ceil((float(limit) - float(start)) / float(delta))
    return max(int(n), 0)


def _range_infer(ctx: InferContext) -> list[TensorDesc]:
    for i, name in enumerate(("start", "limit", "delta")):
        _check_scalar_input(ctx, i, name)
    vals = [_scalar(ctx, i) for i in range(3)]
    if all(v is not None for v in vals):
        if vals[2] == 0:
            ctx.fail("delta must not be zero")
        return [TensorDesc(ctx.dtype(0), (range_length(*vals),))]
    return [TensorDesc(ctx.dtype(0), (ctx.fresh("range"),))]


def _range_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    start, limit, delta = (np.asarray(x).reshape(-1)[0] for x in ins[:3])
    dtype = np.asarray(ins[0]).dtype
    n = range_length(start, limit, delta)
    if np.issubdtype(dtype, np.integer):
        out = np.arange(int(start), int(limit), int(delta), dtype=np.int64)
    else:  # in double, like numpy.arange (and onnxruntime's double-precision count)
        out = np.arange(float(start), float(limit), float(delta), dtype=np.float64)
    if out.shape[0] != n:  # pragma: no cover - numpy and range_length use one formula
        raise ShapeError(f"Range: {out.shape[0]} elements, expected {n}")
    return [out.astype(dtype)]


register(
    OpDef(
        "Range",
        OpKind.HOST,
        inputs=[In("start", "T"), In("limit", "T"), In("delta", "T")],
        outputs=[Out("output", "T")],
        types={"T": RANGE_TYPES},
        infer=_range_infer,
        kernel=_range_kernel,
        value_inputs=(0, 1, 2),
        doc="start, start + delta, ... up to (excluding) limit",
    )
)


# == NonZero =================================================================================


def _nonzero_infer(ctx: InferContext) -> list[TensorDesc]:
    r = ctx.rank(0)
    v = ctx.value(0)
    count: Dim = int(np.count_nonzero(v)) if v is not None else ctx.fresh("nnz")
    return [TensorDesc(np.int64, (r if r is not None else ctx.fresh(), count))]


def _nonzero_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    if x.ndim == 0:
        return [np.zeros((0, int(np.count_nonzero(x))), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


register(
    OpDef(
        "NonZero",
        OpKind.HOST,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T1")],
        types={"T": dtypes.ALL},
        infer=_nonzero_infer,
        kernel=_nonzero_kernel,
        value_inputs=(0,),
        doc="indices of the non-zero elements, shape [rank, count], row-major order",
    )
)


# == EyeLike =================================================================================


def _eyelike_dtype(attrs: dict[str, Any], in_dtype: np.dtype) -> np.dtype:
    dt = attrs.get("dtype")
    return in_dtype if dt is None else dtypes.to_numpy(dt)


def _eyelike_infer(ctx: InferContext) -> list[TensorDesc]:
    r = ctx.rank(0)
    if r is not None and r != 2:
        ctx.fail(f"input must be 2-D, got shape {list(ctx.shape(0))}")
    dtype = _eyelike_dtype(ctx.attrs, ctx.dtype(0))
    if dtype not in dtypes.ALL:
        ctx.fail(f"attribute dtype={ctx.attr('dtype')} is not supported", VerifyError)
    shape = ctx.shape(0)
    return [TensorDesc(dtype, shape if shape is not None else (ctx.fresh(), ctx.fresh()))]


def _eyelike_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    rows, cols = x.shape
    return [np.eye(rows, cols, k=int(attrs.get("k") or 0), dtype=_eyelike_dtype(attrs, x.dtype))]


register(
    OpDef(
        "EyeLike",
        OpKind.HOST,
        inputs=[In("input", "T1")],
        outputs=[Out("output", "T2")],
        types={"T1": dtypes.ALL},
        attrs=[Attr("dtype", "int", None), Attr("k", "int", 0)],
        infer=_eyelike_infer,
        kernel=_eyelike_kernel,
        doc="a 2-D tensor shaped like the input with ones on diagonal k",
    )
)


# == OneHot ==================================================================================


def _onehot_infer(ctx: InferContext) -> list[TensorDesc]:
    _check_scalar_input(ctx, 1, "depth")
    vshape = ctx.shape(2)
    if vshape is not None and (len(vshape) != 1 or (isinstance(vshape[0], int) and vshape[0] != 2)):
        ctx.fail(f"values must be [off_value, on_value] (shape [2]), got shape {list(vshape)}")
    dtype = ctx.dtype(2)
    shape = ctx.shape(0)
    if shape is None:
        return [TensorDesc(dtype, None)]
    r = len(shape)
    axis = int(ctx.attr("axis"))
    if not -r - 1 <= axis <= r:
        ctx.fail(f"axis {axis} out of range for output rank {r + 1}")
    axis = axis + r + 1 if axis < 0 else axis
    depth = _scalar(ctx, 1)
    if depth is not None:
        depth_dim: Dim = int(depth)
        if depth_dim < 1:
            ctx.fail(f"depth must be positive, got {depth}")
    else:
        depth_dim = ctx.fresh("depth")
    return [TensorDesc(dtype, (*shape[:axis], depth_dim, *shape[axis:]))]


def _onehot_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    indices = np.asarray(ins[0])
    depth = int(np.asarray(ins[1]).reshape(-1)[0])
    values = np.asarray(ins[2]).reshape(-1)
    r = indices.ndim
    axis = int(attrs.get("axis", -1))
    axis = axis + r + 1 if axis < 0 else axis
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)  # in-range negatives wrap; others stay off
    shape = [1] * (r + 1)
    shape[axis] = depth
    hot = np.expand_dims(idx, axis) == np.arange(depth, dtype=np.int64).reshape(shape)
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


register(
    OpDef(
        "OneHot",
        OpKind.HOST,
        inputs=[In("indices", "T1"), In("depth", "T2"), In("values", "T3")],
        outputs=[Out("output", "T3")],
        types={"T1": dtypes.NUMERIC, "T2": dtypes.NUMERIC, "T3": dtypes.ALL},
        attrs=[Attr("axis", "int", -1)],
        infer=_onehot_infer,
        kernel=_onehot_kernel,
        value_inputs=(1,),
        doc="one-hot encoding along a new axis of size depth ([off_value, on_value] values)",
    )
)


# == TopK ====================================================================================


def _topk_infer(ctx: InferContext) -> list[TensorDesc]:
    kshape = ctx.shape(1)
    if kshape is not None and (len(kshape) != 1 or (isinstance(kshape[0], int) and kshape[0] != 1)):
        ctx.fail(f"K must be a 1-D tensor of one element, got shape {list(kshape)}")
    for name in ("largest", "sorted"):
        if int(ctx.attr(name)) not in (0, 1):
            ctx.fail(f"attribute {name!r} must be 0 or 1, got {ctx.attr(name)}", VerifyError)
    dtype = ctx.dtype(0)
    shape = ctx.shape(0)
    if shape is None:
        return [TensorDesc(dtype, None), TensorDesc(np.int64, None)]
    if len(shape) == 0:
        ctx.fail("X must have rank >= 1")
    axis = ctx.axis(int(ctx.attr("axis")), len(shape))
    k = _scalar(ctx, 1)
    if k is not None:
        kd: Dim = int(k)
        if kd < 0:
            ctx.fail(f"K must not be negative, got {kd}")
        if isinstance(shape[axis], int) and kd > shape[axis]:
            ctx.fail(f"K={kd} exceeds the size {shape[axis]} of axis {axis}")
    else:
        kd = ctx.fresh("k")
    out = (*shape[:axis], kd, *shape[axis + 1 :])
    return [TensorDesc(dtype, out), TensorDesc(np.int64, out)]


def topk(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """Top-k values and int64 indices along ``axis``; equal values keep the lower index first."""
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ShapeError(f"TopK: K={k} is out of range for axis {axis} of size {n}")
    if largest:
        # a stable ascending sort of the reversed axis, read backwards, is descending
        # with ties in ascending index order
        order = np.argsort(np.flip(x, axis=axis), axis=axis, kind="stable")
        idx = (n - 1) - np.flip(order, axis=axis)
    else:
        idx = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(idx, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


def _topk_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    k = int(np.asarray(ins[1]).reshape(-1)[0])
    return list(
        topk(np.asarray(ins[0]), k, int(attrs.get("axis", -1)), bool(attrs.get("largest", 1)))
    )


register(
    OpDef(
        "TopK",
        OpKind.HOST,
        inputs=[In("X", "T"), In("K", "I")],
        outputs=[Out("Values", "T"), Out("Indices", "I")],
        types={"T": dtypes.NUMERIC, "I": INT64},
        attrs=[Attr("axis", "int", -1), Attr("largest", "int", 1), Attr("sorted", "int", 1)],
        infer=_topk_infer,
        kernel=_topk_kernel,
        value_inputs=(1,),
        doc="the K largest (or smallest) elements along an axis, with their int64 indices",
    )
)


# == Unique ==================================================================================


def unique(
    x: np.ndarray, axis: int | None, sorted_: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Unique: values, first-occurrence indices, inverse indices and counts.

    With ``sorted_`` false the unique values keep the order of their first occurrence.
    """
    if axis is None:
        flat = x.reshape(-1)
        y, first, inverse, counts = np.unique(flat, True, True, True)
    else:
        axis = axis + x.ndim if axis < 0 else axis
        y, first, inverse, counts = np.unique(x, True, True, True, axis=axis)
    inverse = np.asarray(inverse).reshape(-1)
    if not sorted_:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = flat[first] if axis is None else np.take(x, first, axis=axis)
    as64 = (np.asarray(a, dtype=np.int64) for a in (first, inverse, counts))
    return (np.asarray(y), *as64)


def _unique_infer(ctx: InferContext) -> list[TensorDesc]:
    dtype = ctx.dtype(0)
    shape = ctx.shape(0)
    axis = None if ctx.attr("axis") is None else int(ctx.attr("axis"))
    if axis is not None and shape is not None:
        axis = ctx.axis(axis, len(shape))
    v = ctx.value(0)
    if v is not None:
        u: Dim = int(unique(np.asarray(v), axis, True)[1].shape[0])
    else:
        u = ctx.fresh("uniq")
    y: tuple[Dim, ...] | None
    if axis is None:
        y = (u,)
        inv: tuple[Dim, ...] = (numel(shape),) if shape is not None else (ctx.fresh(),)
    elif shape is None:
        y, inv = None, (ctx.fresh(),)
    else:
        y = (*shape[:axis], u, *shape[axis + 1 :])
        inv = (shape[axis],)
    return [
        TensorDesc(dtype, y),
        TensorDesc(np.int64, (u,)),
        TensorDesc(np.int64, inv),
        TensorDesc(np.int64, (u,)),
    ]


def _unique_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    axis = attrs.get("axis")
    return list(
        unique(
            np.asarray(ins[0]), None if axis is None else int(axis), bool(attrs.get("sorted", 1))
        )
    )


register(
    OpDef(
        "Unique",
        OpKind.HOST,
        inputs=[In("X", "T")],
        outputs=[
            Out("Y", "T"),
            Out("indices", "I", optional=True),
            Out("inverse_indices", "I", optional=True),
            Out("counts", "I", optional=True),
        ],
        types={"T": dtypes.ALL},
        attrs=[Attr("axis", "int", None), Attr("sorted", "int", 1)],
        infer=_unique_infer,
        kernel=_unique_kernel,
        value_inputs=(0,),
        doc="unique elements (or slices along axis), sorted or in first-occurrence order",
    )
)
