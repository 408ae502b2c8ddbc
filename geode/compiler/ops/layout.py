"""Layout and indexing ops: Concat, Split, Slice, Gather*, Transpose, Reshape, Pad, ...

(The scatter ops are in :mod:`geode.compiler.ops.scatter`.)

Every op follows the ONNX opset-21 form. Ops whose output shape depends on an input's
*value* (Reshape's shape, Slice's starts/ends/axes/steps, Pad's pads, ...) list that
input in ``value_inputs``: shape inference uses the value when it is a compile-time
constant and otherwise produces fresh symbols, or an unknown rank when even the rank
cannot be known.

Layout ops are :attr:`OpKind.INJECTIVE` (each output element reads one input element, or
is a constant).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.common import (
    check_const_indices,
    equate_dims,
    normalize_indices,
    same_as_input,
)
from geode.compiler.ops.reduce import (
    carries_value,
    input_length,
    int_values,
    normalize_axes,
    opt,
    value_dims,
)
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
from geode.compiler.shapes import (
    Dim,
    Shape,
    as_dim,
    broadcast_shapes,
    dims_equal,
    evaluate_dim,
    monomial,
    numel,
    sym,
)
from geode.errors import ShapeError, VerifyError
from geode.lazy import sympy

_ALL = dtypes.ANY  # data movement carries the storage dtypes too
_I64 = frozenset([np.dtype(np.int64)])
_IND = dtypes.INDEX

#: |value| at or beyond this is "past the end of any dim" in Slice starts/ends
HUGE = 2**62


def _known_or_fresh(ctx: InferContext, candidates: Sequence[Dim]) -> Dim:
    """The common dim when every candidate is provably equal, else a fresh symbol."""
    if candidates and all(dims_equal(candidates[0], c) is True for c in candidates[1:]):
        return candidates[0]
    return ctx.fresh()


def _pass_value(ctx: InferContext, out: TensorDesc, i: int = 0) -> None:
    """An output holding input ``i``'s elements in the same order keeps its symbolic value."""
    if carries_value(out):
        vals = value_dims(ctx, i)
        if vals is not None and len(vals) == int(np.prod(out.shape, dtype=np.int64)):
            ctx.set_sym_value(0, vals)


# -- Concat ------------------------------------------------------------------------------------
def _infer_concat(ctx: InferContext) -> list[TensorDesc]:
    vals = ctx.node.inputs
    if not vals:
        ctx.fail("needs at least one input", VerifyError)
    for i, v in enumerate(vals):
        if v is None:
            ctx.fail(f"input {i} is missing", VerifyError)
    dtype = vals[0].dtype
    known = [(i, v.shape) for i, v in enumerate(vals) if v.shape is not None]
    if not known:
        return [TensorDesc(dtype, None)]
    ranks = {len(s) for _, s in known}
    if len(ranks) > 1:
        desc = ", ".join(f"input {i}: rank {len(s)}" for i, s in known)
        ctx.fail(f"inputs must have the same rank ({desc})")
    rank = ranks.pop()
    if rank == 0:
        ctx.fail("cannot concatenate scalars")
    axis = ctx.axis(ctx.attr("axis"), rank)
    out: list[Dim] = []
    for j in range(rank):
        if j == axis:
            if len(known) < len(vals):
                out.append(ctx.fresh())
            else:
                out.append(as_dim(sum((s[j] for _, s in known), sympy.Integer(0))))
            continue
        d = known[0][1][j]
        for i, s in known[1:]:
            if dims_equal(d, s[j]) is False:
                ctx.fail(
                    f"dim {j} of input {i} is {s[j]} but input {known[0][0]} has {d} "
                    f"(only axis {axis} may differ)"
                )
            d = equate_dims(ctx, d, s[j], f"dim {j} of input {i}")
        out.append(d)
    desc = TensorDesc(dtype, tuple(out))
    if rank == 1 and carries_value(desc):
        parts = [value_dims(ctx, i) for i in range(len(vals))]
        if all(p is not None for p in parts):
            ctx.set_sym_value(0, [v for p in parts for v in p])  # type: ignore[union-attr]
    return [desc]


def _concat(ins: list, attrs: dict) -> list[np.ndarray]:
    return [np.concatenate([np.asarray(x) for x in ins], axis=int(attrs["axis"]))]


register(
    OpDef(
        "Concat",
        OpKind.INJECTIVE,
        inputs=[In("inputs", "T", variadic=True)],
        outputs=[Out("concat_result", "T")],
        types={"T": _ALL},
        attrs=[Attr("axis", "int", REQUIRED)],
        infer=_infer_concat,
        kernel=_concat,
        doc="join tensors along axis; other dims must agree",
    )
)


# -- Split -------------------------------------------------------------------------------------
def _verify_split(ctx: InferContext) -> None:
    """verify: exactly one of the split input and num_outputs (opset 18), matching the outputs."""
    num = ctx.attr("num_outputs")
    if ctx.has(1) and num is not None:
        ctx.fail("give either the split input or num_outputs, not both", VerifyError)
    if not ctx.has(1) and num is None:
        ctx.fail("give the split input or the num_outputs attribute", VerifyError)
    if num is not None and int(num) != ctx.n_outputs:
        ctx.fail(f"num_outputs={num} but the node has {ctx.n_outputs} outputs", VerifyError)
    if num is not None and int(num) < 1:
        ctx.fail(f"num_outputs must be positive, got {num}", VerifyError)


def split_sizes(d: Dim, n: int) -> list[Dim]:
    """Chunk sizes of Split with num_outputs ``n``: ceil(d / n) each, the last one smaller.

    For a symbolic ``d`` the last chunk is ``d - (n - 1) * ceil(d / n)``, which assumes the
    chunks fit (true unless ``d`` is small against ``n``; a mismatch is caught at run time).
    """
    if isinstance(d, int):
        if d % n == 0:
            return [d // n] * n
        chunk = -(-d // n)
        # as the ONNX reference: chunks of ceil(d / n) while the dim lasts, then smaller
        # (possibly empty) ones, e.g. 5 into 4 outputs -> [2, 2, 1, 0]
        return [min(chunk, max(d - i * chunk, 0)) for i in range(n)]
    if n == 1:
        return [d]
    chunk = as_dim(sympy.ceiling(d / n))
    return [chunk] * (n - 1) + [as_dim(d - chunk * (n - 1))]


def _infer_split(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    n = ctx.n_outputs
    if x.shape is None:
        return [TensorDesc(x.dtype, None) for _ in range(n)]
    if len(x.shape) == 0:
        ctx.fail("cannot split a scalar")
    axis = ctx.axis(ctx.attr("axis"), len(x.shape))
    d = x.shape[axis]
    sizes: list[Dim]
    if ctx.has(1):
        split = value_dims(ctx, 1)
        k = input_length(ctx, 1)
        if k is not None and k != n:
            ctx.fail(f"split has {k} entries but the node has {n} outputs")
        if split is None:
            sizes = [ctx.fresh() for _ in range(n)]
        else:
            if any(isinstance(s, int) and s < 0 for s in split):
                ctx.fail(f"split sizes must be non-negative, got {split}")
            total = as_dim(sum(split, sympy.Integer(0)))
            if dims_equal(total, d) is False:
                ctx.fail(f"split sizes {split} sum to {total} but axis {axis} has {d}")
            equate_dims(ctx, d, total, f"split sizes {split} along axis {axis}")
            sizes = list(split)
    else:
        sizes = split_sizes(d, n)
        if isinstance(sizes[-1], int) and sizes[-1] < 0:
            ctx.fail(f"cannot split a dim of {d} into {n} chunks of ceil({d}/{n})")
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        outs.append(TensorDesc(x.dtype, tuple(shape)))
    vals = value_dims(ctx, 0) if len(x.shape) == 1 else None
    if vals is not None and all(isinstance(s, int) for s in sizes):
        start = 0
        for k_out, s in enumerate(sizes):
            if carries_value(outs[k_out]):
                ctx.set_sym_value(k_out, vals[start : start + s])
            start += s
    return outs


def _split(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    axis = int(attrs["axis"])
    axis = axis + x.ndim if axis < 0 else axis
    split = opt(ins, 1)
    if split is not None:
        sizes = [int(s) for s in np.asarray(split).reshape(-1)]
    elif attrs.get("num_outputs") is not None:
        sizes = split_sizes(x.shape[axis], int(attrs["num_outputs"]))
    else:
        raise VerifyError("Split: give the split input or the num_outputs attribute")
    bounds = np.cumsum([0] + sizes)
    index = [slice(None)] * x.ndim
    outs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        index[axis] = slice(int(lo), int(hi))
        outs.append(x[tuple(index)].copy())
    return outs


register(
    OpDef(
        "Split",
        OpKind.INJECTIVE,
        inputs=[In("input", "T"), In("split", "I", optional=True)],
        outputs=[Out("outputs", "T", variadic=True)],
        types={"T": _ALL, "I": _I64},
        attrs=[Attr("axis", "int", 0), Attr("num_outputs", "int", None)],
        verify=_verify_split,
        infer=_infer_split,
        kernel=_split,
        value_inputs=(1,),
        doc="split along axis by the split sizes or into num_outputs chunks (last one smaller)",
    )
)


# -- Slice -------------------------------------------------------------------------------------
def _slice_bounds(d: int, start: int, end: int, step: int) -> tuple[int, int]:
    """Effective (start, end) of one sliced axis with ONNX's clamping rules."""
    if start < 0:
        start += d
    if end < 0:
        end += d
    if step > 0:
        return min(max(start, 0), d), min(max(end, 0), d)
    return min(max(start, 0), d - 1), min(max(end, -1), d - 1)


def _clamp_forward(d: sympy.Expr, v: int) -> sympy.Expr | int:
    """Start or end of a positive-step slice clamped into [0, d]."""
    if v <= -HUGE:
        return 0
    if v >= HUGE:
        return d
    return sympy.Max(d + v, 0) if v < 0 else sympy.Min(v, d)


def _forward_span(d: sympy.Expr, start: int, end: int) -> sympy.Expr | int:
    """end' - start' of a positive-step slice over a symbolic dim, in a simplified form."""
    if start <= -HUGE:
        start = 0
    if end >= HUGE:
        if start >= HUGE:
            return 0
        if start >= 0:
            return sympy.Max(d - start, 0)  # d - Min(start, d)
        return sympy.Min(-start, d)  # d - Max(d + start, 0)
    if end <= -HUGE or start >= HUGE:
        return 0
    if start >= 0 and end >= 0:
        # Min(end, d) - Min(start, d)
        return 0 if end <= start else sympy.Min(end - start, sympy.Max(d - start, 0))
    if start < 0 and end < 0:
        # Max(d + end, 0) - Max(d + start, 0)
        return 0 if end <= start else sympy.Max(0, sympy.Min(end - start, d + end))
    if start >= 0:  # end < 0: Max(d + end, 0) - Min(start, d)
        return sympy.Max(0, d + end - start)
    return _clamp_forward(d, end) - _clamp_forward(d, start)


def _clamp_start_backward(d: sympy.Expr, v: int) -> sympy.Expr | int:
    """Start of a negative-step slice clamped into [0, d - 1]."""
    if v >= HUGE:
        return d - 1
    if v <= -HUGE:
        return 0
    return sympy.Max(d + v, 0) if v < 0 else sympy.Min(v, d - 1)


def _clamp_end_backward(d: sympy.Expr, v: int) -> sympy.Expr | int:
    """End of a negative-step slice clamped into [-1, d - 1]."""
    if v <= -HUGE:
        return -1
    if v >= HUGE:
        return d - 1
    return sympy.Max(d + v, -1) if v < 0 else sympy.Min(v, d - 1)


def _nonnegative(v: Dim) -> bool:
    return v >= 0 if isinstance(v, int) else bool(v.is_nonnegative)


def _symbolic_bounds_len(d: Dim, start: Dim, end: Dim, step: int) -> Dim | None:
    """Slice length when start or end is a symbolic dim (from a shape tensor).

    Handled for a positive step and bounds that are provably non-negative (they then
    only clamp at ``d``); None otherwise.
    """
    if step < 0 or not (_nonnegative(start) and _nonnegative(end)):
        return None
    e = (
        d
        if (isinstance(end, int) and end >= HUGE) or dims_equal(end, d) is True
        else sympy.Min(end, d)
    )
    s = 0 if start == 0 else sympy.Min(start, d)
    span = sympy.Max(0, e - s)
    length = span if step == 1 else sympy.ceiling(span / step)
    return int(length) if length.is_Integer else length


def slice_dim(d: Dim, start: Dim, end: Dim, step: int) -> Dim | None:
    """Length of one sliced axis of size ``d`` (an int, or a sympy expression with Min/Max).

    ``start`` and ``end`` may be symbolic dims; None when the length cannot be expressed.
    """
    if step == 0:
        raise ShapeError("slice step cannot be 0")
    if not isinstance(end, int) and step > 0 and dims_equal(end, d) is True:
        end = HUGE  # "up to the dim itself" is the usual "to the end"
    if not (isinstance(start, int) and isinstance(end, int)):
        return _symbolic_bounds_len(d, start, end, step)
    if isinstance(d, int):
        s, e = _slice_bounds(d, start, end, step)
        span = e - s if step > 0 else s - e
        return max(0, -(-span // abs(step)))
    if step > 0:
        span = _forward_span(d, start, end)
    else:
        s = _clamp_start_backward(d, start)
        e = _clamp_end_backward(d, end)
        span = s - e
    k = abs(step)
    length = sympy.Max(0, span if k == 1 else sympy.ceiling(sympy.Integer(1) * span / k))
    if step < 0:
        # symbols are positive, so sympy folds the start clamp Min(start, d - 1) to start;
        # at a run-time d = 0 ONNX clamps it to -1 and the slice is empty. A slice is never
        # longer than its dim, so Min(length, d) is the same length for d >= 1 and 0 for 0.
        length = sympy.Min(length, d)
    # the Min/Max forms above are already simplified; sympy.simplify (as_dim) only adds time
    return int(length) if length.is_Integer else length


def zero_safe_slice(start: Dim, end: Dim, step: int) -> bool:
    """Whether the symbolic length :func:`slice_dim` gives for these bounds is right for a
    run-time dim of 0 too (symbols are positive, so e.g. ``x[-1:]`` has length
    ``Min(1, N)`` = 1, where ONNX gives 0 for ``N = 0``)."""
    if not (isinstance(start, int) and isinstance(end, int)):
        return True  # symbolic bounds: only non-negative ones are handled, which clamp at d
    t = sym("_zero_probe")
    length = slice_dim(t, start, end, step)
    return length is None or evaluate_dim(length, {t: 0}) == slice_dim(0, start, end, step)


def _infer_slice(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    for i in range(1, 5):
        if ctx.has(i) and ctx.rank(i) not in (None, 1):
            ctx.fail(f"{ctx.opdef.inputs[i].name} must be 1-D, got rank {ctx.rank(i)}")
    if x.shape is None:
        return [TensorDesc(x.dtype, None)]
    rank = len(x.shape)
    starts, ends = value_dims(ctx, 1), value_dims(ctx, 2)
    steps = int_values(ctx, 4) if ctx.has(4) else None
    lens = {input_length(ctx, i) for i in (1, 2, 3, 4) if ctx.has(i)} - {None}
    if len(lens) > 1:
        ctx.fail(f"starts, ends, axes and steps must have the same length, got {sorted(lens)}")
    n = lens.pop() if lens else None
    if steps is not None and 0 in steps:
        ctx.fail(f"steps cannot contain 0, got {steps}")
    if ctx.has(3):
        axes = int_values(ctx, 3)
        if axes is None:  # any axis may be sliced
            return [TensorDesc(x.dtype, tuple(ctx.fresh() for _ in x.shape))]
    else:
        if n is None:
            return [TensorDesc(x.dtype, tuple(ctx.fresh() for _ in x.shape))]
        if n > rank:
            ctx.fail(f"{n} starts for an input of rank {rank}")
        axes = list(range(n))
    axes = normalize_axes(ctx, axes, rank)
    out = list(x.shape)
    for j, a in enumerate(axes):
        if starts is None or ends is None or (ctx.has(4) and steps is None):
            out[a] = ctx.fresh()
            continue
        step = steps[j] if steps is not None else 1
        length = slice_dim(x.shape[a], starts[j], ends[j], step)
        out[a] = ctx.fresh() if length is None else length
        if length is not None and not zero_safe_slice(starts[j], ends[j], step):
            ctx.graph.symbols.require_nonzero(
                x.shape[a], f"{ctx.where}: the sliced axis {a} may not be empty"
            )
    desc = TensorDesc(x.dtype, tuple(out))
    _slice_value(ctx, desc, starts, ends, steps)
    return [desc]


def _slice_value(
    ctx: InferContext,
    out: TensorDesc,
    starts: list[Dim] | None,
    ends: list[Dim] | None,
    steps: list[int] | None,
) -> None:
    """Symbolic value of a slice of a 1-D shape tensor with integer bounds."""
    vals = value_dims(ctx, 0) if ctx.rank(0) == 1 else None
    if vals is None or starts is None or ends is None or not carries_value(out):
        return
    if (ctx.has(4) and steps is None) or not (
        isinstance(starts[0], int) and isinstance(ends[0], int)
    ):
        return
    step = steps[0] if steps else 1
    s, e = _slice_bounds(len(vals), starts[0], ends[0], step)
    picked = [vals[i] for i in range(s, e, step)] if vals else []
    ctx.set_sym_value(0, picked)


def _checked_slice_args(
    rank: int, starts: list[int], ends: list[int], axes: list[int], steps: list[int]
) -> list[int]:
    """Slice's run-time ``axes`` made non-negative, after checking what ONNX requires:
    starts, ends, axes and steps of one length, axes in ``[-rank, rank)`` and distinct,
    no zero step (ShapeError naming the offending value)."""
    lengths = {"starts": len(starts), "ends": len(ends), "axes": len(axes), "steps": len(steps)}
    if len(set(lengths.values())) > 1:
        raise ShapeError(f"Slice: starts, ends, axes and steps differ in length: {lengths}")
    bad = [a for a in axes if not -rank <= a < rank]
    if bad:
        raise ShapeError(f"Slice: axes {bad} out of range for an input of rank {rank}")
    axes = [a % rank for a in axes]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"Slice: axes {axes} repeat an axis")
    if 0 in steps:
        raise ShapeError(f"Slice: steps {steps} hold a 0")
    return axes


def _slice(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    starts = [int(v) for v in np.asarray(ins[1]).reshape(-1)]
    ends = [int(v) for v in np.asarray(ins[2]).reshape(-1)]
    axes_in, steps_in = opt(ins, 3), opt(ins, 4)
    axes = (
        list(range(len(starts)))
        if axes_in is None
        else [int(v) for v in np.asarray(axes_in).reshape(-1)]
    )
    steps = (
        [1] * len(starts)
        if steps_in is None
        else [int(v) for v in np.asarray(steps_in).reshape(-1)]
    )
    axes = _checked_slice_args(x.ndim, starts, ends, axes, steps)
    index = [slice(None)] * x.ndim
    for a, st, en, sp in zip(axes, starts, ends, steps):
        s, e = _slice_bounds(x.shape[a], st, en, sp)
        if sp < 0 and x.shape[a] == 0:
            index[a] = slice(0, 0)
        else:
            # a clamped end of -1 (negative step) means "past the first element": None in Python
            index[a] = slice(s, e if e >= 0 else None, sp)
    return [x[tuple(index)].copy()]


register(
    OpDef(
        "Slice",
        OpKind.INJECTIVE,
        inputs=[
            In("data", "T"),
            In("starts", "Tind"),
            In("ends", "Tind"),
            In("axes", "Tind", optional=True),
            In("steps", "Tind", optional=True),
        ],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "Tind": _IND},
        infer=_infer_slice,
        kernel=_slice,
        value_inputs=(1, 2, 3, 4),
        doc="strided slice with ONNX clamping (negative steps allowed)",
    )
)


# -- Gather / GatherElements / GatherND ------------------------------------------------------------
def _infer_gather(ctx: InferContext) -> list[TensorDesc]:
    data, idx = ctx.desc(0), ctx.desc(1)
    if data.shape is None:
        return [TensorDesc(data.dtype, None)]
    if len(data.shape) == 0:
        ctx.fail("cannot gather from a scalar")
    axis = ctx.axis(ctx.attr("axis"), len(data.shape))
    check_const_indices(ctx, 1, data.shape[axis], "indices")
    if idx.shape is None:
        return [TensorDesc(data.dtype, None)]
    out = tuple(data.shape[:axis]) + tuple(idx.shape) + tuple(data.shape[axis + 1 :])
    desc = TensorDesc(data.dtype, out)
    vals, picks = value_dims(ctx, 0), int_values(ctx, 1)
    if (
        len(data.shape) == 1
        and vals is not None
        and picks is not None
        and carries_value(desc)
        and all(-len(vals) <= p < len(vals) for p in picks)
    ):
        ctx.set_sym_value(0, [vals[p] for p in picks])
    return [desc]


def _gather(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    axis = int(attrs["axis"])
    axis = axis + x.ndim if axis < 0 else axis
    return [np.take(x, normalize_indices(ins[1], x.shape[axis]), axis=axis)]


register(
    OpDef(
        "Gather",
        OpKind.INJECTIVE,
        inputs=[In("data", "T"), In("indices", "Tind")],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "Tind": _IND},
        attrs=[Attr("axis", "int", 0)],
        infer=_infer_gather,
        kernel=_gather,
        doc="take slices along axis at indices (negative indices count from the end)",
    )
)


def _infer_gather_elements(ctx: InferContext) -> list[TensorDesc]:
    data, idx = ctx.desc(0), ctx.desc(1)
    if data.shape is not None and idx.shape is not None:
        if len(data.shape) != len(idx.shape):
            ctx.fail(f"data has rank {len(data.shape)} but indices has rank {len(idx.shape)}")
        if len(data.shape) == 0:
            ctx.fail("cannot gather elements from a scalar")
    if data.shape is not None:
        axis = ctx.axis(ctx.attr("axis"), len(data.shape))
        check_const_indices(ctx, 1, data.shape[axis], "indices")
    return [TensorDesc(data.dtype, idx.shape)]


def _gather_elements(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    axis = int(attrs["axis"])
    axis = axis + x.ndim if axis < 0 else axis
    return [np.take_along_axis(x, normalize_indices(ins[1], x.shape[axis]), axis=axis)]


register(
    OpDef(
        "GatherElements",
        OpKind.INJECTIVE,
        inputs=[In("data", "T"), In("indices", "Tind")],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "Tind": _IND},
        attrs=[Attr("axis", "int", 0)],
        infer=_infer_gather_elements,
        kernel=_gather_elements,
        doc="output[i][j] = data[indices[i][j]][j] (for axis 0): indices-shaped gather",
    )
)


def _infer_gather_nd(ctx: InferContext) -> list[TensorDesc]:
    data, idx = ctx.desc(0), ctx.desc(1)
    b = int(ctx.attr("batch_dims"))
    if b < 0:
        ctx.fail(f"batch_dims must be non-negative, got {b}", VerifyError)
    if idx.shape is not None and len(idx.shape) < 1:
        ctx.fail("indices must have rank >= 1")
    if data.shape is None or idx.shape is None:
        return [TensorDesc(data.dtype, None)]
    r, q = len(data.shape), len(idx.shape)
    if b >= min(r, q):
        ctx.fail(f"batch_dims={b} must be less than the ranks of data ({r}) and indices ({q})")
    for j in range(b):
        equate_dims(ctx, data.shape[j], idx.shape[j], f"batch dim {j} of data and indices")
    m = idx.shape[-1]
    if not isinstance(m, int):
        return [TensorDesc(data.dtype, None)]  # the output rank depends on the last indices dim
    if m < 1 or m > r - b:
        ctx.fail(
            f"the last dim of indices ({m}) must be in [1, {r - b}] (data rank {r}, batch_dims {b})"
        )
    out = tuple(idx.shape[:-1]) + tuple(data.shape[b + m :])
    return [TensorDesc(data.dtype, out)]


def _gather_nd(ins: list, attrs: dict) -> list[np.ndarray]:
    data, indices = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64)
    b = int(attrs["batch_dims"])
    m = indices.shape[-1]
    out_shape = indices.shape[:-1] + data.shape[b + m :]
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    dat = data.reshape((nb,) + data.shape[b:])
    idx = indices.reshape(nb, -1, m)
    parts = []
    for i in range(nb):
        sub = dat[i]
        cols = tuple(normalize_indices(idx[i][:, j], sub.shape[j]) for j in range(m))
        parts.append(sub[cols])
    if not parts:
        return [np.empty(out_shape, dtype=data.dtype)]
    return [np.stack(parts).reshape(out_shape)]


register(
    OpDef(
        "GatherND",
        OpKind.INJECTIVE,
        inputs=[In("data", "T"), In("indices", "I")],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "I": _I64},
        attrs=[Attr("batch_dims", "int", 0)],
        infer=_infer_gather_nd,
        kernel=_gather_nd,
        doc="gather slices of data addressed by the last dim of indices (after batch_dims)",
    )
)


# -- Transpose -----------------------------------------------------------------------------------
def _perm(ctx: InferContext, rank: int) -> list[int]:
    perm = ctx.attr("perm")
    if perm is None:
        return list(range(rank - 1, -1, -1))
    perm = [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):
        ctx.fail(f"perm {perm} is not a permutation of the {rank} axes")
    return perm


def _infer_transpose(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if x.shape is None:
        perm = ctx.attr("perm")
        return [TensorDesc(x.dtype, None if perm is None else tuple(ctx.fresh() for _ in perm))]
    perm = _perm(ctx, len(x.shape))
    return [TensorDesc(x.dtype, tuple(x.shape[p] for p in perm))]


def _transpose(ins: list, attrs: dict) -> list[np.ndarray]:
    perm = attrs.get("perm")
    return [
        np.ascontiguousarray(np.transpose(ins[0], None if perm is None else [int(p) for p in perm]))
    ]


register(
    OpDef(
        "Transpose",
        OpKind.INJECTIVE,
        inputs=[In("data", "T")],
        outputs=[Out("transposed", "T")],
        types={"T": _ALL},
        attrs=[Attr("perm", "ints", None)],
        infer=_infer_transpose,
        kernel=_transpose,
        doc="permute axes (default: reverse them)",
    )
)


# -- Reshape / Flatten ----------------------------------------------------------------------------
def _counts_differ(a: Dim, b: Dim) -> bool:
    """True when element counts ``a`` and ``b`` provably differ for every positive symbol value.

    Covers what ``dims_equal`` leaves open: ``c * N * M`` (N, M positive integers) can
    never equal an integer that ``c`` does not divide, nor one smaller than ``c``.
    """
    if isinstance(a, int) == isinstance(b, int):
        return False
    expr, n = (b, a) if isinstance(a, int) else (a, b)
    coeff, rest = expr.as_coeff_Mul()
    if not coeff.is_Integer:
        return False
    for factor in sympy.Mul.make_args(rest):
        base, exp = factor.as_base_exp()
        if not (base.is_Symbol and base.is_positive and base.is_integer):
            return False
        if not (exp.is_Integer and exp > 0):
            return False
    c = int(coeff)
    return c > 0 and (n < c or n % c != 0)


def exact_quotient(total: Dim, known: Dim) -> Dim | None:
    """``total / known`` when both are products ``c * s1**k1 ...`` of symbols
    (:func:`~geode.compiler.shapes.monomial`, ``c`` positive) and ``known`` divides
    ``total`` exactly (its coefficient divides, no exponent is larger): the quotient,
    the very dim sympy's division gives, without sympy's arithmetic; else None."""
    a, b = monomial(total), monomial(known)
    if a is None or b is None or a[0] < 1 or b[0] < 1 or a[0] % b[0]:
        return None
    powers = dict(a[1])
    for base, k in b[1].items():
        left = powers.get(base, 0) - k
        if left < 0:
            return None
        if left:
            powers[base] = left
        else:
            del powers[base]
    c = a[0] // b[0]
    if not powers:
        return c
    return as_dim(sympy.Mul(c, *(base**k for base, k in powers.items())))


def reshape_shape(ctx: InferContext, shape: Shape, target: Sequence[Dim], allowzero: bool) -> Shape:
    """Output shape of Reshape to a known ``target`` (0 copies a dim unless allowzero, -1 infers).

    Entries of ``target`` are ints, or symbolic dims taken literally (from a shape tensor).
    """
    ints = [t for t in target if isinstance(t, int)]
    target = list(target)
    if ints.count(-1) > 1:
        ctx.fail(f"shape {target} has more than one -1")
    if any(t < -1 for t in ints):
        ctx.fail(f"shape {target} has a negative dim other than -1")
    if allowzero and 0 in ints and -1 in ints:
        ctx.fail(f"shape {target} has both 0 and -1 with allowzero=1")
    dims: list[Dim | None] = []
    for i, t in enumerate(target):
        if not isinstance(t, int):
            dims.append(t)
        elif t == 0 and not allowzero:
            if shape is None:
                dims.append(ctx.fresh())
            elif i >= len(shape):
                ctx.fail(f"shape {target} copies dim {i} (0) but the input has rank {len(shape)}")
            else:
                dims.append(shape[i])
        elif t == -1:
            dims.append(None)
        else:
            dims.append(t)
    if shape is None:
        return tuple(ctx.fresh() if d is None else d for d in dims)
    total = numel(shape)
    known = numel([d for d in dims if d is not None])
    if -1 in ints:
        ambiguous = f"cannot infer the -1 of {target}: the other dims multiply to 0 (ambiguous)"
        if isinstance(total, int) and isinstance(known, int):
            if known == 0:
                ctx.fail(ambiguous)
            if total % known != 0:
                ctx.fail(f"cannot reshape {list(shape)} ({total} elements) to {target}")
            q: Dim = total // known
        elif dims_equal(known, 0) is True:
            ctx.fail(ambiguous)
        else:
            exact = exact_quotient(total, known)
            q = as_dim(sympy.Integer(1) * total / known) if exact is None else exact
            if not isinstance(q, int) and q.is_number:
                ctx.fail(f"cannot reshape {list(shape)} ({total} elements) to {target}")
            # the -1 is a whole number only when the other dims divide the element count:
            # checked when the inputs bind the symbols (nothing to check when the
            # product of symbols divides: sympy's Mod is 0 then)
            what = f"{total} elements divisible by {known} (the -1 of {target})"
            rest = as_dim(sympy.Mod(total, known)) if exact is None else 0
            equate_dims(ctx, rest, 0, what)
            # ONNX and numpy refuse a -1 whose other dims multiply to 0 (any size would
            # do): the inferred q holds only while they do not, so a run where they do is
            # refused (as the reference kernel refuses it), not given the size q
            ctx.graph.symbols.require_nonzero(known, f"{ctx.where}, {ambiguous}")
        return tuple(q if d is None else d for d in dims)
    if dims_equal(total, known) is False or _counts_differ(total, known):
        ctx.fail(f"cannot reshape {list(shape)} ({total} elements) to {target} ({known} elements)")
    equate_dims(ctx, total, known, f"element count of reshape to {target}")
    return tuple(dims)  # type: ignore[arg-type]


def _infer_reshape(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if ctx.rank(1) not in (None, 1):
        ctx.fail(f"shape must be 1-D, got rank {ctx.rank(1)}")
    target = value_dims(ctx, 1)
    if target is None:
        k = input_length(ctx, 1)
        return [TensorDesc(x.dtype, None if k is None else tuple(ctx.fresh() for _ in range(k)))]
    desc = TensorDesc(x.dtype, reshape_shape(ctx, x.shape, target, bool(ctx.attr("allowzero"))))
    _pass_value(ctx, desc)
    return [desc]


def _reshape(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    given = [int(t) for t in np.asarray(ins[1]).reshape(-1)]
    target = given
    if not attrs["allowzero"]:
        target = [x.shape[i] if t == 0 else t for i, t in enumerate(given)]
    if -1 in target and 0 in target:
        raise ShapeError(
            f"Reshape: cannot infer the -1 of {given} for an input of shape {list(x.shape)}: "
            "the other dims multiply to 0 (ambiguous)"
        )
    return [np.reshape(x, target).copy()]


register(
    OpDef(
        "Reshape",
        OpKind.INJECTIVE,
        inputs=[In("data", "T"), In("shape", "I")],
        outputs=[Out("reshaped", "T")],
        types={"T": _ALL, "I": _I64},
        attrs=[Attr("allowzero", "int", 0)],
        infer=_infer_reshape,
        kernel=_reshape,
        value_inputs=(1,),
        doc="reshape to the shape input (0 copies the input dim unless allowzero, -1 is inferred)",
    )
)


def _flatten_axis(ctx: InferContext, rank: int) -> int:
    axis = int(ctx.attr("axis"))
    if not -rank <= axis <= rank:
        ctx.fail(f"axis {axis} out of range [{-rank}, {rank}] for rank {rank}")
    return axis + rank if axis < 0 else axis


def _infer_flatten(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if x.shape is None:
        first: Dim = 1 if int(ctx.attr("axis")) == 0 else ctx.fresh()
        return [TensorDesc(x.dtype, (first, ctx.fresh()))]
    a = _flatten_axis(ctx, len(x.shape))
    desc = TensorDesc(x.dtype, (numel(x.shape[:a]), numel(x.shape[a:])))
    _pass_value(ctx, desc)
    return [desc]


def _flatten(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    axis = int(attrs["axis"])
    axis = axis + x.ndim if axis < 0 else axis
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    cols = int(np.prod(x.shape[axis:], dtype=np.int64))
    return [x.reshape(rows, cols).copy()]


register(
    OpDef(
        "Flatten",
        OpKind.INJECTIVE,
        inputs=[In("input", "T")],
        outputs=[Out("output", "T")],
        types={"T": _ALL},
        attrs=[Attr("axis", "int", 1)],
        infer=_infer_flatten,
        kernel=_flatten,
        doc="2-D view: (prod(dims[:axis]), prod(dims[axis:]))",
    )
)


# -- Squeeze / Unsqueeze --------------------------------------------------------------------------
def _infer_squeeze(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if ctx.has(1) and ctx.rank(1) not in (None, 1):
        ctx.fail(f"axes must be 1-D, got rank {ctx.rank(1)}")
    shape = x.shape
    if not ctx.has(1):
        # squeeze every dim of size 1: unknowable while a dim is symbolic
        if shape is None or not all(isinstance(d, int) for d in shape):
            return [TensorDesc(x.dtype, None)]
        return [TensorDesc(x.dtype, tuple(d for d in shape if d != 1))]
    if input_length(ctx, 1) == 0:  # empty axes squeeze nothing (ONNX's inference and reference)
        return [TensorDesc(x.dtype, shape, x.format)]
    axes = int_values(ctx, 1)
    if shape is None:
        return [TensorDesc(x.dtype, None)]
    if axes is None:
        k = input_length(ctx, 1)
        if k is None:
            return [TensorDesc(x.dtype, None)]
        if k > len(shape):
            ctx.fail(f"axes has {k} entries but the input has rank {len(shape)}")
        out = [_known_or_fresh(ctx, shape[i : i + k + 1]) for i in range(len(shape) - k)]
        return [TensorDesc(x.dtype, tuple(out))]
    norm = set(normalize_axes(ctx, axes, len(shape)))
    for a in sorted(norm):
        if dims_equal(shape[a], 1) is False:
            ctx.fail(f"cannot squeeze axis {a}: its dim is {shape[a]}, not 1")
        equate_dims(ctx, shape[a], 1, f"squeezed axis {a}")
    desc = TensorDesc(x.dtype, tuple(d for i, d in enumerate(shape) if i not in norm))
    _pass_value(ctx, desc)
    return [desc]


def _squeeze(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    axes = opt(ins, 1)
    if axes is None:
        return [np.squeeze(x).copy()]
    return [np.squeeze(x, axis=tuple(int(a) for a in np.asarray(axes).reshape(-1))).copy()]


register(
    OpDef(
        "Squeeze",
        OpKind.INJECTIVE,
        inputs=[In("data", "T"), In("axes", "I", optional=True)],
        outputs=[Out("squeezed", "T")],
        types={"T": _ALL, "I": _I64},
        infer=_infer_squeeze,
        kernel=_squeeze,
        value_inputs=(1,),
        doc="remove dims of size 1: those in axes, or all of them when axes is omitted",
    )
)


def _infer_unsqueeze(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if ctx.rank(1) not in (None, 0, 1):  # a scalar axis is read as one axis (ONNX reference)
        ctx.fail(f"axes must be 1-D, got rank {ctx.rank(1)}")
    axes = int_values(ctx, 1)
    shape = x.shape
    if shape is None:
        return [TensorDesc(x.dtype, None)]
    if axes is None:
        k = input_length(ctx, 1)
        if k is None:
            return [TensorDesc(x.dtype, None)]
        r = len(shape)
        # output dim j is 1 or one of input dims j-k .. j
        out = [
            _known_or_fresh(ctx, [1, *shape[max(0, j - k) : min(r, j + 1)]]) for j in range(r + k)
        ]
        return [TensorDesc(x.dtype, tuple(out))]
    out_rank = len(shape) + len(axes)
    norm = set(normalize_axes(ctx, axes, out_rank))
    it = iter(shape)
    desc = TensorDesc(x.dtype, tuple(1 if j in norm else next(it) for j in range(out_rank)))
    _pass_value(ctx, desc)
    return [desc]


def _unsqueeze(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    axes = [int(a) for a in np.asarray(ins[1]).reshape(-1)]
    return [np.expand_dims(x, tuple(axes)).copy()]


register(
    OpDef(
        "Unsqueeze",
        OpKind.INJECTIVE,
        inputs=[In("data", "T"), In("axes", "I")],
        outputs=[Out("expanded", "T")],
        types={"T": _ALL, "I": _I64},
        infer=_infer_unsqueeze,
        kernel=_unsqueeze,
        value_inputs=(1,),
        doc="insert dims of size 1 at axes (of the output)",
    )
)


# -- Expand / Tile -------------------------------------------------------------------------------
def _infer_expand(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if ctx.rank(1) not in (None, 1):
        ctx.fail(f"shape must be 1-D, got rank {ctx.rank(1)}")
    target = value_dims(ctx, 1)
    if target is None:
        k = input_length(ctx, 1)
        if k is None or x.shape is None:
            return [TensorDesc(x.dtype, None)]
        r = max(len(x.shape), k)
        padded = (1,) * (r - len(x.shape)) + tuple(x.shape)
        # a static dim other than 1 survives broadcasting; anything else may change
        out = tuple(d if isinstance(d, int) and d != 1 else ctx.fresh() for d in padded)
        return [TensorDesc(x.dtype, out)]
    if any(isinstance(t, int) and t < 0 for t in target):
        ctx.fail(f"shape {target} has a negative dim")
    if x.shape is None:
        return [TensorDesc(x.dtype, None)]
    return [
        TensorDesc(
            x.dtype,
            broadcast_shapes(x.shape, tuple(target), where=ctx.where, symbols=ctx.graph.symbols),
        )
    ]


def _expand(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    target = tuple(int(t) for t in np.asarray(ins[1]).reshape(-1))
    return [np.broadcast_to(x, np.broadcast_shapes(x.shape, target)).copy()]


register(
    OpDef(
        "Expand",
        OpKind.INJECTIVE,
        inputs=[In("input", "T"), In("shape", "I")],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "I": _I64},
        infer=_infer_expand,
        kernel=_expand,
        value_inputs=(1,),
        doc="broadcast to shape (bidirectional: 1s in shape keep the input dim)",
    )
)


def _infer_tile(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if ctx.rank(1) not in (None, 1):
        ctx.fail(f"repeats must be 1-D, got rank {ctx.rank(1)}")
    reps = value_dims(ctx, 1)
    k = input_length(ctx, 1)
    if x.shape is None:
        return [TensorDesc(x.dtype, None if k is None else tuple(ctx.fresh() for _ in range(k)))]
    if k is not None and k != len(x.shape):
        ctx.fail(f"repeats has {k} entries but the input has rank {len(x.shape)}")
    if reps is None:
        return [TensorDesc(x.dtype, tuple(0 if d == 0 else ctx.fresh() for d in x.shape))]
    if any(isinstance(r, int) and r < 0 for r in reps):
        ctx.fail(f"repeats must be non-negative, got {reps}")
    return [TensorDesc(x.dtype, tuple(as_dim(d * r) for d, r in zip(x.shape, reps)))]


register(
    OpDef(
        "Tile",
        OpKind.INJECTIVE,
        inputs=[In("input", "T"), In("repeats", "I")],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "I": _I64},
        infer=_infer_tile,
        kernel=lambda ins, a: [np.tile(ins[0], [int(r) for r in np.asarray(ins[1]).reshape(-1)])],
        value_inputs=(1,),
        doc="repeat the input repeats[i] times along axis i",
    )
)


# -- Pad ----------------------------------------------------------------------------------------
_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _verify_pad(ctx: InferContext) -> None:
    """verify: a known mode; pads and axes are 1-D."""
    mode = ctx.attr("mode")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in _PAD_MODES:
        ctx.fail(f"mode {mode!r} is not one of {list(_PAD_MODES)}", VerifyError)
    for i in (1, 3):
        if ctx.has(i) and ctx.rank(i) not in (None, 1):
            ctx.fail(f"{ctx.opdef.inputs[i].name} must be 1-D, got rank {ctx.rank(i)}")


def _infer_pad(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if x.shape is None:
        return [TensorDesc(x.dtype, None)]
    rank = len(x.shape)
    if ctx.has(3):
        axes = int_values(ctx, 3)
        if axes is None:
            return [TensorDesc(x.dtype, tuple(ctx.fresh() for _ in x.shape))]
        axes = normalize_axes(ctx, axes, rank)
    else:
        axes = list(range(rank))
    pads = value_dims(ctx, 1)
    k = input_length(ctx, 1)
    if k is not None and k != 2 * len(axes):
        ctx.fail(f"pads has {k} entries, expected {2 * len(axes)} (two per padded axis)")
    out = list(x.shape)
    for j, a in enumerate(axes):
        if pads is None:
            out[a] = ctx.fresh()
            continue
        d = as_dim(x.shape[a] + pads[j] + pads[j + len(axes)])
        if isinstance(d, int) and d < 0:
            ctx.fail(f"pads {pads} remove more than the {x.shape[a]} elements of axis {a}")
        out[a] = d
    return [TensorDesc(x.dtype, tuple(out))]


def _pad(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    pads = [int(p) for p in np.asarray(ins[1]).reshape(-1)]
    cval, axes_in = opt(ins, 2), opt(ins, 3)
    axes = (
        list(range(x.ndim))
        if axes_in is None
        else [int(a) for a in np.asarray(axes_in).reshape(-1)]
    )
    axes = [a + x.ndim if a < 0 else a for a in axes]
    width = [(0, 0)] * x.ndim
    for j, a in enumerate(axes):
        width[a] = (pads[j], pads[j + len(axes)])
    # negative pads remove elements; they are applied first, then the positive ones pad
    crop = tuple(slice(max(-b, 0), x.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(width))
    x = x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in width]
    mode = attrs["mode"]
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "constant":
        value = 0 if cval is None or np.asarray(cval).size == 0 else np.asarray(cval).reshape(-1)[0]
        return [np.pad(x, grow, mode="constant", constant_values=value).astype(x.dtype)]
    return [np.pad(x, grow, mode=mode).astype(x.dtype)]


register(
    OpDef(
        "Pad",
        OpKind.INJECTIVE,
        inputs=[
            In("data", "T"),
            In("pads", "I"),
            In("constant_value", "T", optional=True),
            In("axes", "Tind", optional=True),
        ],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "I": _I64, "Tind": _IND},
        attrs=[Attr("mode", "string", "constant")],
        verify=_verify_pad,
        infer=_infer_pad,
        kernel=_pad,
        value_inputs=(1, 3),
        doc="pad (or, with negative pads, crop) axes; modes constant/reflect/edge/wrap",
    )
)


# -- DepthToSpace / SpaceToDepth ------------------------------------------------------------------
def _verify_blocks(ctx: InferContext) -> None:
    """verify: positive blocksize, known mode, rank-4 input."""
    if int(ctx.attr("blocksize")) < 1:
        ctx.fail(f"blocksize must be positive, got {ctx.attr('blocksize')}", VerifyError)
    mode = ctx.attr("mode") if ctx.opdef.attr_spec("mode") else "DCR"
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("DCR", "CRD"):
        ctx.fail(f"mode {mode!r} is not DCR or CRD", VerifyError)
    if ctx.rank(0) not in (None, 4):
        ctx.fail(f"input must have rank 4 (N, C, H, W), got rank {ctx.rank(0)}")


def _divide(ctx: InferContext, d: Dim, by: int, what: str) -> Dim:
    if isinstance(d, int):
        if d % by:
            ctx.fail(f"{what} ({d}) is not divisible by {by}")
        return d // by
    return as_dim(d / by)


def _infer_d2s(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if x.shape is None:
        return [TensorDesc(x.dtype, tuple(ctx.fresh() for _ in range(4)))]
    b = int(ctx.attr("blocksize"))
    n, c, h, w = x.shape
    c2 = _divide(ctx, c, b * b, "channels")
    return [TensorDesc(x.dtype, (n, c2, as_dim(h * b), as_dim(w * b)))]


def _d2s(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    mode = attrs["mode"]
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [t.reshape(n, c // (b * b), h * b, w * b).copy()]


register(
    OpDef(
        "DepthToSpace",
        OpKind.INJECTIVE,
        inputs=[In("input", "T")],
        outputs=[Out("output", "T")],
        types={"T": _ALL},
        attrs=[Attr("blocksize", "int", REQUIRED), Attr("mode", "string", "DCR")],
        verify=_verify_blocks,
        infer=_infer_d2s,
        kernel=_d2s,
        doc="move channel blocks into spatial blocks: (N, C, H, W) -> (N, C/b^2, H*b, W*b)",
    )
)


def _infer_s2d(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    if x.shape is None:
        return [TensorDesc(x.dtype, tuple(ctx.fresh() for _ in range(4)))]
    b = int(ctx.attr("blocksize"))
    n, c, h, w = x.shape
    out = (n, as_dim(c * b * b), _divide(ctx, h, b, "height"), _divide(ctx, w, b, "width"))
    return [TensorDesc(x.dtype, out)]


def _s2d(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    mode = attrs.get("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    t = x.reshape(n, c, h // b, b, w // b, b)
    if mode == "DCR":  # output channel = (row offset * b + column offset) * C + c
        t = t.transpose(0, 3, 5, 1, 2, 4)
    else:  # CRD (opset 28): output channel = c * b * b + row offset * b + column offset
        t = t.transpose(0, 1, 3, 5, 2, 4)
    return [t.reshape(n, c * b * b, h // b, w // b).copy()]


register(
    OpDef(
        "SpaceToDepth",
        OpKind.INJECTIVE,
        inputs=[In("input", "T")],
        outputs=[Out("output", "T")],
        types={"T": _ALL},
        attrs=[Attr("blocksize", "int", REQUIRED), Attr("mode", "string", "DCR")],
        verify=_verify_blocks,
        infer=_infer_s2d,
        kernel=_s2d,
        doc="move spatial blocks into channels: (N, C, H, W) -> (N, C*b^2, H/b, W/b)",
    )
)


# -- Trilu / ReverseSequence ------------------------------------------------------------------------
def _verify_trilu(ctx: InferContext) -> None:
    """verify: rank >= 2 and a scalar k."""
    if ctx.rank(0) is not None and ctx.rank(0) < 2:
        ctx.fail(f"input must have rank >= 2, got {ctx.rank(0)}")
    if ctx.has(1) and ctx.rank(1) not in (None, 0) and input_length(ctx, 1) not in (None, 1):
        ctx.fail("k must be a scalar")


def _trilu(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    k_in = opt(ins, 1)
    k = 0 if k_in is None else int(np.asarray(k_in).reshape(-1)[0])
    return [np.triu(x, k) if attrs["upper"] else np.tril(x, k)]


register(
    OpDef(
        "Trilu",
        OpKind.INJECTIVE,
        inputs=[In("input", "T"), In("k", "I", optional=True)],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "I": _I64},
        attrs=[Attr("upper", "int", 1)],
        verify=_verify_trilu,
        infer=same_as_input(0),
        kernel=_trilu,
        doc="keep the upper (or lower) triangle of the last two dims from diagonal k",
    )
)


def _infer_reverse_sequence(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.desc(0)
    b, t = int(ctx.attr("batch_axis")), int(ctx.attr("time_axis"))
    if {b, t} != {0, 1}:
        ctx.fail(
            f"batch_axis and time_axis must be 0 and 1 in some order, got {b} and {t}", VerifyError
        )
    if x.shape is not None:
        if len(x.shape) < 2:
            ctx.fail(f"input must have rank >= 2, got {len(x.shape)}")
        lens = ctx.shape(1)
        if lens is not None:
            if len(lens) != 1:
                ctx.fail(f"sequence_lens must be 1-D, got rank {len(lens)}")
            equate_dims(ctx, lens[0], x.shape[b], "sequence_lens against the batch axis")
    return [TensorDesc(x.dtype, x.shape, x.format)]


def _reverse_sequence(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    b, t = int(attrs["batch_axis"]), int(attrs["time_axis"])
    out = x.copy()
    for i, n in enumerate(np.asarray(ins[1]).reshape(-1)):
        n = int(n)
        dst = [slice(None)] * x.ndim
        dst[b], dst[t] = i, slice(0, n)
        src = list(dst)
        src[t] = slice(n - 1, None, -1) if n > 0 else slice(0, 0)
        out[tuple(dst)] = x[tuple(src)]
    return [out]


register(
    OpDef(
        "ReverseSequence",
        OpKind.INJECTIVE,
        inputs=[In("input", "T"), In("sequence_lens", "I")],
        outputs=[Out("Y", "T")],
        types={"T": _ALL, "I": _I64},
        attrs=[Attr("batch_axis", "int", 1), Attr("time_axis", "int", 0)],
        infer=_infer_reverse_sequence,
        kernel=_reverse_sequence,
        doc="reverse the first sequence_lens[i] steps of each batch entry along time_axis",
    )
)
