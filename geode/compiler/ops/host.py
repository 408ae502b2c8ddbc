"""Host ops: shape computations and ops whose output shape depends on input values.

Shape, Size, ConstantOfShape, Range, NonZero, EyeLike, OneHot, TopK, Unique and
NonMaxSuppression run on the host engine (OpKind.HOST). Where an output shape depends on an input's *value*
(ConstantOfShape's shape, Range's bounds, OneHot's depth, TopK's K, the data of
NonZero, Unique and NonMaxSuppression) the OpDef lists that input in ``value_inputs``; shape inference reads
the value when it is a compile-time constant and otherwise gives the dim a fresh
symbol, bound when the op runs.

Shape and Size record the symbolic contents of their outputs (``Value.sym_value``), and
the ops here read such contents back (``InferContext.sym_ints``): ``ConstantOfShape(
Shape(x))`` has ``x``'s symbolic shape and ``Range(0, Size(x), 1)`` a symbolic length.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.registry import Attr, In, InferContext, OpDef, OpKind, Out, register
from geode.compiler.shapes import Dim, as_dim, numel
from geode.errors import ShapeError, VerifyError
from geode.lazy import sympy

INT64 = frozenset([np.dtype(np.int64)])
#: longest Range whose contents are recorded as a symbolic value (for constant folding)
SYM_VALUE_LIMIT = 64
#: dtypes of Range (ONNX opset 11: float, double, int16, int32, int64; float16 as in newer opsets)
RANGE_TYPES = frozenset(
    np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int16, np.int32, np.int64)
)


# -- helpers --------------------------------------------------------------------------------


def shape_slice(rank: int, start: int, end: int | None) -> tuple[int, int]:
    """Shape's (start, end) attributes clamped to ``[0, rank]`` (negative ones count from the back)."""
    s = start + rank if start < 0 else start
    e = rank if end is None else (end + rank if end < 0 else end)
    s = min(max(s, 0), rank)
    e = min(max(e, 0), rank)
    return s, max(s, e)


def shape_value(ctx: InferContext, i: int) -> list[Dim] | None:
    """The dims held by a 1-D int input (ints or sympy expressions), None when unknown.

    Known when the input is a constant or a shape computation that recorded its
    symbolic value (Shape, and Gather/Concat/... over it).
    """
    vals = ctx.sym_ints(i)
    return None if vals is None else [as_dim(d) for d in vals]


def _sym_scalar(ctx: InferContext, i: int) -> Dim | None:
    """The single element of an int input as a dim (symbolic when computed from shapes)."""
    vals = shape_value(ctx, i) if ctx.has(i) else None
    if vals is None:
        return None
    if len(vals) != 1:
        ctx.fail(f"input {i} must hold exactly one element, holds {len(vals)}")
    return vals[0]


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
    ctx.set_sym_value(0, ctx.shape(0)[s:e])
    return [TensorDesc(np.int64, (e - s,))]


def _size_infer(ctx: InferContext) -> list[TensorDesc]:
    shape = ctx.shape(0)
    if shape is not None:
        ctx.set_sym_value(0, (numel(shape),))
    return [TensorDesc(np.int64, ())]


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
        infer=_size_infer,
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
    dtype = ctx.dtype(0)
    vals = [_scalar(ctx, i) for i in range(3)]
    if all(v is not None for v in vals):
        if vals[2] == 0:
            ctx.fail("delta must not be zero")
        n = range_length(*vals)
        if np.issubdtype(dtype, np.integer) and n <= SYM_VALUE_LIMIT:
            ctx.set_sym_value(0, range(int(vals[0]), int(vals[1]), int(vals[2])))
        return [TensorDesc(dtype, (n,))]
    if np.issubdtype(dtype, np.integer):
        start, limit, delta = (_sym_scalar(ctx, i) for i in range(3))
    else:
        start, limit, delta = (_integral_float(ctx, i, vals[i]) for i in range(3))
    if start is not None and limit is not None and isinstance(delta, int) and delta != 0:
        # symbolic bounds (a Size or a Shape element) with a static step
        span = as_dim(limit - start) if delta > 0 else as_dim(start - limit)
        # a unit step needs no ceiling (sympy's first ceiling of a symbol imports its
        # tensor module: 30-60 ms of a cold compile)
        steps = span if abs(delta) == 1 else sympy.ceiling(span / abs(delta))
        n_sym = as_dim(sympy.Max(0, steps))
        return [TensorDesc(dtype, (n_sym,))]
    return [TensorDesc(dtype, (ctx.fresh("range"),))]


#: float dtypes and the largest integer each holds exactly
_EXACT_INT = {np.dtype(np.float32): 2**24, np.dtype(np.float64): 2**53}


def _integral_float(ctx: InferContext, i: int, const: Any) -> Dim | None:
    """A float Range bound as a dim, when it is an integer: a constant like 0.0, or a
    Cast of an int shape value (torch's ``arange(seq, dtype=float32)`` exports
    ``Range(0.0, Cast(Gather(Shape(x), 1)), 1.0)``). None otherwise."""
    limit = _EXACT_INT.get(ctx.dtype(i))
    if limit is None:
        return None
    if const is not None:
        f = float(const)
        return int(f) if f.is_integer() and abs(f) <= limit else None
    v = ctx.node.input(i)
    cast = v.producer if v is not None else None
    if cast is None or cast.op_type != "Cast" or cast.input(0) is None:
        return None
    src = cast.input(0)
    if src.dtype.kind not in "iu" or src.sym_value is None or len(src.sym_value) != 1:
        return None
    dim = as_dim(src.sym_value[0])
    return None if isinstance(dim, int) and abs(dim) > limit else dim


def _range_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    start, limit, delta = (np.asarray(x).reshape(-1)[0] for x in ins[:3])
    dtype = np.asarray(ins[0]).dtype
    n = range_length(start, limit, delta)
    if np.issubdtype(dtype, np.integer):
        out = np.arange(int(start), int(limit), int(delta), dtype=np.int64)
    elif dtype == np.float16:  # opset 27: float16 accumulates in stash_type (float or double)
        stash = np.float64 if int(attrs.get("stash_type", 1)) == 11 else np.float32
        out = np.arange(stash(start).item(), float(limit), float(delta), dtype=stash)
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
        attrs=[Attr("stash_type", "int", 1)],
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
    depth_dim: Dim | None = int(depth) if depth is not None else None
    if depth_dim is None and np.issubdtype(ctx.dtype(1), np.integer):
        depth_dim = _sym_scalar(ctx, 1)  # e.g. a dim gathered from Shape
    if depth_dim is None:
        depth_dim = ctx.fresh("depth")
    elif isinstance(depth_dim, int) and depth_dim < 1:
        ctx.fail(f"depth must be positive, got {depth}")
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
    kd = _sym_scalar(ctx, 1)  # a constant, or computed from shapes
    if kd is None:
        kd = ctx.fresh("k")
    elif isinstance(kd, int):
        if kd < 0:
            ctx.fail(f"K must not be negative, got {kd}")
        if isinstance(shape[axis], int) and kd > shape[axis]:
            ctx.fail(f"K={kd} exceeds the size {shape[axis]} of axis {axis}")
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


# == NonMaxSuppression =======================================================================


def _box_corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(ymin, xmin, ymax, xmax) of ``[..., 4]`` boxes given as corners or as centers."""
    if center_point_box:
        xc, yc, w, h = (boxes[..., i] for i in range(4))
        return yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


def non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_per_class: int,
    iou_threshold: float,
    score_threshold: float | None,
    center_point_box: int = 0,
) -> np.ndarray:
    """ONNX NonMaxSuppression: ``[k, 3]`` int64 rows (batch, class, box), greedy per class.

    Candidates (score above ``score_threshold`` when one is given) are visited by score,
    ties by box index; a box is dropped when its IoU with a box already selected for its
    class exceeds ``iou_threshold`` (boxes of zero area never suppress or get suppressed).
    Arithmetic runs in the boxes' float type, like the ONNX runtimes.
    """
    ct = np.result_type(boxes.dtype, np.float32)
    ymin, xmin, ymax, xmax = (
        a.astype(ct) for a in _box_corners(boxes.astype(ct), center_point_box)
    )
    area = (xmax - xmin) * (ymax - ymin)
    thr = ct.type(iou_threshold)
    rows: list[tuple[int, int, int]] = []
    n_batch, n_class = scores.shape[0], scores.shape[1]
    for b in range(n_batch):
        for c in range(n_class):
            s = scores[b, c]
            cand = (
                np.arange(s.shape[0])
                if score_threshold is None
                else np.nonzero(s > score_threshold)[0]
            )
            order = cand[np.lexsort((cand, -s[cand].astype(np.float64)))]
            chosen: list[int] = []
            for i in order:
                if len(chosen) >= max_per_class:
                    break
                if chosen:
                    j = np.asarray(chosen)
                    iw = np.minimum(xmax[b, i], xmax[b, j]) - np.maximum(xmin[b, i], xmin[b, j])
                    ih = np.minimum(ymax[b, i], ymax[b, j]) - np.maximum(ymin[b, i], ymin[b, j])
                    inter = np.where((iw > 0) & (ih > 0), iw * ih, ct.type(0))
                    union = area[b, i] + area[b, j] - inter
                    ok = (inter > 0) & (area[b, i] > 0) & (area[b, j] > 0) & (union > 0)
                    with np.errstate(divide="ignore", invalid="ignore"):
                        iou = np.where(ok, inter / np.where(ok, union, 1), 0)
                    if np.any(ok & (iou > thr)):
                        continue
                chosen.append(int(i))
            rows.extend((b, c, i) for i in chosen)
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _nms_args(ins: list, attrs: dict) -> tuple:
    def first(i: int) -> Any:
        if len(ins) <= i or ins[i] is None or np.asarray(ins[i]).size == 0:
            return None
        return np.asarray(ins[i]).reshape(-1)[0]

    max_out = first(2)
    iou = first(3)
    return (
        np.asarray(ins[0]),
        np.asarray(ins[1]),
        0 if max_out is None else max(int(max_out), 0),
        0.0 if iou is None else float(iou),
        first(4),
        int(attrs.get("center_point_box") or 0),
    )


def _nms_infer(ctx: InferContext) -> list[TensorDesc]:
    boxes, scores = ctx.shape(0), ctx.shape(1)
    if boxes is not None and (len(boxes) != 3 or (isinstance(boxes[2], int) and boxes[2] != 4)):
        ctx.fail(f"boxes must have shape [batches, boxes, 4], got {list(boxes)}")
    if scores is not None and len(scores) != 3:
        ctx.fail(f"scores must have shape [batches, classes, boxes], got {list(scores)}")
    if boxes is not None and scores is not None:
        for a, b, what in ((boxes[0], scores[0], "batches"), (boxes[1], scores[2], "boxes")):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                ctx.fail(f"boxes and scores disagree on the number of {what}: {a} != {b}")
            ctx.graph.symbols.equate(a, b, ctx.where)
    if int(ctx.attr("center_point_box")) not in (0, 1):
        ctx.fail(
            f"center_point_box must be 0 or 1, got {ctx.attr('center_point_box')}", VerifyError
        )
    given = [i for i in range(ctx.n_inputs) if ctx.has(i)]
    if all(ctx.value(i) is not None for i in given):
        vals = [ctx.value(i) if ctx.has(i) else None for i in range(ctx.n_inputs)]
        count: Dim = int(non_max_suppression(*_nms_args(vals, ctx.attrs)).shape[0])
    else:
        count = ctx.fresh("nms")
    return [TensorDesc(np.int64, (count, 3))]


register(
    OpDef(
        "NonMaxSuppression",
        OpKind.HOST,
        inputs=[
            In("boxes", "T"),
            In("scores", "T"),
            In("max_output_boxes_per_class", "I", optional=True),
            In("iou_threshold", "T", optional=True),
            In("score_threshold", "T", optional=True),
        ],
        outputs=[Out("selected_indices", "I")],
        types={"T": dtypes.FLOATS, "I": INT64},
        attrs=[Attr("center_point_box", "int", 0)],
        infer=_nms_infer,
        kernel=lambda ins, attrs: [non_max_suppression(*_nms_args(ins, attrs))],
        value_inputs=(0, 1, 2, 3, 4),
        doc="greedy per-class box selection by score and IoU; [k, 3] (batch, class, box) rows",
    )
)


# == Compress ==================================================================================


def _compress_verify(ctx: InferContext) -> None:
    r = ctx.rank(1)
    if r is not None and r != 1:
        ctx.fail(f"condition must be 1-D, got rank {r}")
    if ctx.attr("axis") is not None and ctx.rank(0) is not None:
        ctx.axis(int(ctx.attr("axis")), ctx.rank(0))


def _compress_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    cond = ctx.value(1)
    count: Dim = ctx.fresh("compress")
    axis = ctx.attr("axis")
    if cond is not None:
        limit = (
            int(numel(x.shape))
            if axis is None and x.shape is not None and all(isinstance(d, int) for d in x.shape)
            else None
        )
        if (
            axis is not None
            and x.shape is not None
            and isinstance(x.shape[ctx.axis(int(axis), len(x.shape))], int)
        ):
            limit = x.shape[ctx.axis(int(axis), len(x.shape))]
        if limit is not None:
            count = int(np.count_nonzero(np.asarray(cond).reshape(-1)[:limit]))
    if axis is None:
        return [TensorDesc(x.dtype, (count,))]
    if x.shape is None:
        return [TensorDesc(x.dtype, None)]
    ax = ctx.axis(int(axis), len(x.shape))
    shape = list(x.shape)
    shape[ax] = count
    return [TensorDesc(x.dtype, tuple(shape))]


def _compress_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    cond = np.asarray(ins[1]).reshape(-1).astype(bool)
    axis = attrs.get("axis")
    n = x.size if axis is None else x.shape[int(axis) % x.ndim]
    if cond.size > n:
        raise ShapeError(f"Compress: condition has {cond.size} entries, the selected axis {n}")
    return [np.compress(cond, x, axis=None if axis is None else int(axis)).copy()]


register(
    OpDef(
        "Compress",
        OpKind.HOST,
        inputs=[In("input", "T"), In("condition", "T1")],
        outputs=[Out("output", "T")],
        types={"T": dtypes.ANY, "T1": dtypes.BOOL},
        attrs=[Attr("axis", "int", None)],
        verify=_compress_verify,
        infer=_compress_infer,
        kernel=_compress_kernel,
        value_inputs=(1,),
        doc="the slices along axis (or elements of the flattened input) where condition is true",
    )
)
