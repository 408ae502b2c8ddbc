"""Composite decomposition: rewrite composite ops into primitive ones (CINN's 组合算子拆分).

Fusion only knows Trivial (elementwise/broadcast/injective) and Reduce ops; a
LayerNormalization left whole is an opaque kernel that nothing fuses with. Split into
ReduceMean/Sub/Mul/Sqrt/..., the same computation becomes reductions and elementwise
ops that the fusion planner rebuilds into one kernel, together with its neighbours.

What is decomposed and what is not:

* composites with reductions inside (LayerNormalization, Softmax, LogSoftmax,
  InstanceNormalization, MeanVarianceNormalization, LpNormalization, ReduceL1/L2/
  LogSum/LogSumExp/SumSquare) and BatchNormalization (inference) are decomposed:
  that is where fusion gains;
* Gelu is decomposed into Erf/Tanh arithmetic, so the codegen needs no Gelu;
* float Gemm becomes MatMul (transposes of constant weights fold) and an elementwise
  scale and bias, which fuse into the MatMul as its epilogue; float16 Gemm and MatMul
  compute in float32 (Cast in, Cast out), as their reference kernels do;
* variadic Sum/Mean (and Max/Min with more than two inputs) become binary chains;
* single-input elementwise activations (HardSwish, HardSigmoid, Softplus, Elu,
  Mish, ...) stay whole: each is already one Trivial op that fuses as it is, and
  splitting it would only multiply nodes.

float16 composites compute in float32 (Cast in, Cast out), as their reference
kernels do. A decomposition that needs a rank it cannot know (BatchNormalization's
channel axis, a non-negative LayerNormalization axis) leaves the node alone, and so
does one whose primitives are not registered.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.passes.rewrite import (
    Rewriter,
    const_ints,
    const_value,
    has_ops,
    node_alive,
    try_rewrite,
)
from geode.compiler.shapes import normalize_axis

Decomposition = Callable[[Rewriter, Node], list[Value | None] | None]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


def decompose(graph: Graph) -> bool:
    """Rewrite every composite op with a registered decomposition into primitives.

    Each replacement has the composite's output dtypes and shapes (checked; a
    mismatch rolls the rewrite back) and graph outputs keep their names. Returns True
    when any node was decomposed.
    """
    changed = False
    for node in graph.toposort():
        if node.domain not in ("", "ai.onnx"):
            continue
        fn = DECOMPOSITIONS.get(node.op_type)
        if fn is None or not node_alive(graph, node):
            continue
        if try_rewrite(graph, node, lambda rw, fn=fn, node=node: fn(rw, node)):
            changed = True
    return changed


# -- helpers ----------------------------------------------------------------------------------
def _up(rw: Rewriter, x: Value) -> Value:
    """float16 -> float32 working precision; other dtypes unchanged."""
    return rw.op("Cast", x, to=dtypes.to_onnx(_F32)) if x.dtype == _F16 else x


def _cast(rw: Rewriter, x: Value, dtype: np.dtype) -> Value:
    """Cast ``x`` to ``dtype`` unless it already is."""
    return x if x.dtype == dtype else rw.op("Cast", x, to=dtypes.to_onnx(dtype))


def _axes_attr(node: Node, name: str = "axis") -> int:
    return int(node.attr(name, -1))


def _reduce(
    rw: Rewriter, op: str, x: Value, axes: Value | None, keepdims: int, noop: int = 0
) -> Value:
    attrs = {"keepdims": keepdims}
    if noop:
        attrs["noop_with_empty_axes"] = noop
    return rw.op(op, x, axes, **attrs) if axes is not None else rw.op(op, x, **attrs)


# -- normalizations ------------------------------------------------------------------------------
def _layer_norm(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """ONNX's function body: statistics in stash_type, normalized value cast back, then affine."""
    if not has_ops("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Reciprocal", "Cast"):
        return None
    x, scale, bias = node.input(0), node.input(1), node.input(2)
    axis = _axes_attr(node)
    if x.rank is None:
        if axis >= 0:
            return None  # the normalized axes [axis, rank) need the rank
        axes = list(range(axis, 0))
    else:
        start = normalize_axis(axis, x.rank, node.where)
        axes = list(range(start, x.rank))
    stash = dtypes.to_numpy(int(node.attr("stash_type", 1)))
    xs = _cast(rw, x, stash)
    ax = rw.ints(axes)
    mean = rw.op("ReduceMean", xs, ax, keepdims=1)
    dev = rw.op("Sub", xs, mean)
    var = rw.op("ReduceMean", rw.op("Mul", dev, dev), ax, keepdims=1)
    eps = rw.scalar(float(node.attr("epsilon", 1e-5)), like=var)
    inv_std = rw.op("Reciprocal", rw.op("Sqrt", rw.op("Add", var, eps)))
    normed = _cast(rw, rw.op("Mul", dev, inv_std), x.dtype)
    y = rw.op("Mul", normed, scale)
    if bias is not None:
        y = rw.op("Add", y, bias)
    outs = [y, mean, inv_std]
    return [_cast(rw, v, o.dtype) for v, o in zip(outs, node.outputs)]


def _shifted(rw: Rewriter, xs: Value, ax: Value) -> Value:
    """``min(x - max(x), 0)`` along ``ax``: never above 0, as it is exactly. A kernel that
    recomputes ``x`` for the max and again for the difference may round the two apart
    (``a * b`` contracted into a fused multiply-add in one pass only): a product near
    3e29 then came out 2e22 above its own max and its exp overflowed to a NaN softmax
    (found by geode.fuzz). The Min keeps NaN (NaN in, NaN out)."""
    diff = rw.op("Sub", xs, rw.op("ReduceMax", xs, ax, keepdims=1))
    return rw.op("Min", diff, rw.const(0.0, xs.dtype))


def _softmax(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """exp(x - max) / sum(exp(x - max)) along ``axis``."""
    if not has_ops("ReduceMax", "ReduceSum", "Sub", "Exp", "Div", "Min") or rw.graph.opset < 13:
        return None  # before opset 13 Softmax flattened the axes from ``axis`` on
    x = node.input(0)
    xs = _up(rw, x)
    ax = rw.ints([_axes_attr(node)])
    shifted = _shifted(rw, xs, ax)
    e = rw.op("Exp", shifted)
    y = rw.op("Div", e, rw.op("ReduceSum", e, ax, keepdims=1))
    return [_cast(rw, y, x.dtype)]


def _log_softmax(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """(x - max) - log(sum(exp(x - max))) along ``axis``."""
    if not has_ops("ReduceMax", "ReduceSum", "Sub", "Exp", "Log", "Min") or rw.graph.opset < 13:
        return None  # before opset 13 LogSoftmax flattened the axes from ``axis`` on
    x = node.input(0)
    xs = _up(rw, x)
    ax = rw.ints([_axes_attr(node)])
    shifted = _shifted(rw, xs, ax)
    lse = rw.op("Log", rw.op("ReduceSum", rw.op("Exp", shifted), ax, keepdims=1))
    return [_cast(rw, rw.op("Sub", shifted, lse), x.dtype)]


def _param_shape(rank: int) -> list[int]:
    """Reshape target that puts a per-channel [C] vector on axis 1 of a rank-``rank`` tensor."""
    return [-1] + [1] * (rank - 2)


def _per_channel(rw: Rewriter, p: Value, rank: int) -> Value:
    """A [C] parameter reshaped to broadcast over [N, C, D1, ...]."""
    if rank == 2:
        return p
    return rw.op("Reshape", p, rw.ints(_param_shape(rank)))


def _batch_norm(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """Inference BatchNormalization as ``X * a + b`` (a, b folded when the statistics are constant)."""
    if int(node.attr("training_mode", 0)) != 0 or len(node.outputs) != 1:
        return None
    if not has_ops("Mul", "Add", "Sub", "Sqrt", "Reciprocal", "Reshape", "Cast"):
        return None
    x, scale, bias, mean, var = (node.input(i) for i in range(5))
    if x.rank is None or x.rank < 2 or any(p is None for p in (scale, bias, mean, var)):
        return None
    eps = float(node.attr("epsilon", 1e-5))
    datas = [const_value(p) for p in (scale, bias, mean, var)]
    if all(d is not None for d in datas):
        s, b, m, v = (d.astype(np.float64) for d in datas)
        a = s / np.sqrt(v + np.float32(eps))
        shift = b - m * a
        shape = tuple(_param_shape(x.rank)) if x.rank > 2 else (-1,)
        a_c = rw.const(a.astype(x.dtype).reshape(shape), x.dtype)
        b_c = rw.const(shift.astype(x.dtype).reshape(shape), x.dtype)
        return [rw.op("Add", rw.op("Mul", x, a_c), b_c)]
    xs = _up(rw, x)
    work = xs.dtype
    s, b, m, v = (_cast(rw, p, work) for p in (scale, bias, mean, var))
    inv_std = rw.op("Reciprocal", rw.op("Sqrt", rw.op("Add", v, rw.scalar(eps, like=v))))
    a = _per_channel(rw, rw.op("Mul", s, inv_std), x.rank)
    y = rw.op("Mul", rw.op("Sub", xs, _per_channel(rw, m, x.rank)), a)
    y = rw.op("Add", y, _per_channel(rw, b, x.rank))
    return [_cast(rw, y, x.dtype)]


def _instance_norm(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """Normalize each (instance, channel) over the spatial axes, then per-channel affine."""
    if not has_ops("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Reciprocal", "Reshape"):
        return None
    x, scale, bias = node.input(0), node.input(1), node.input(2)
    if x.rank is None or x.rank < 3 or scale is None or bias is None:
        return None
    xs = _up(rw, x)
    ax = rw.ints(list(range(2, x.rank)))
    mean = rw.op("ReduceMean", xs, ax, keepdims=1)
    dev = rw.op("Sub", xs, mean)
    var = rw.op("ReduceMean", rw.op("Mul", dev, dev), ax, keepdims=1)
    eps = rw.scalar(float(node.attr("epsilon", 1e-5)), like=var)
    normed = rw.op("Mul", dev, rw.op("Reciprocal", rw.op("Sqrt", rw.op("Add", var, eps))))
    s = _per_channel(rw, _cast(rw, scale, xs.dtype), x.rank)
    b = _per_channel(rw, _cast(rw, bias, xs.dtype), x.rank)
    y = rw.op("Add", rw.op("Mul", normed, s), b)
    return [_cast(rw, y, x.dtype)]


def _mvn(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """ONNX's function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)."""
    if not has_ops("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div"):
        return None
    x = node.input(0)
    axes = [int(a) for a in node.attr("axes", [0, 2, 3])]
    xs = _up(rw, x)
    ax = rw.ints(axes)
    mean = rw.op("ReduceMean", xs, ax, keepdims=1)
    mean_sq = rw.op("ReduceMean", rw.op("Mul", xs, xs), ax, keepdims=1)
    std = rw.op("Sqrt", rw.op("Sub", mean_sq, rw.op("Mul", mean, mean)))
    denom = rw.op("Add", std, rw.scalar(1e-9, like=std))
    y = rw.op("Div", rw.op("Sub", xs, mean), denom)
    return [_cast(rw, y, x.dtype)]


def _lp_norm(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """x / ||x||_p along ``axis``; a zero norm gives 0."""
    if not has_ops("ReduceSum", "Abs", "Mul", "Sqrt", "Div", "Equal", "Where"):
        return None
    x = node.input(0)
    xs = _up(rw, x)
    ax = rw.ints([_axes_attr(node)])
    if int(node.attr("p", 2)) == 1:
        norm = rw.op("ReduceSum", rw.op("Abs", xs), ax, keepdims=1)
    else:
        norm = rw.op("Sqrt", rw.op("ReduceSum", rw.op("Mul", xs, xs), ax, keepdims=1))
    zero = rw.scalar(0.0, like=xs)
    y = rw.op("Where", rw.op("Equal", norm, zero), zero, rw.op("Div", xs, norm))
    return [_cast(rw, y, x.dtype)]


# -- Gelu -------------------------------------------------------------------------------------
def _gelu(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """approximate='none': 0.5*x*(1+erf(x/sqrt 2)); 'tanh': 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))."""
    approx = node.attr("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else str(approx)
    inner_op = "Tanh" if approx == "tanh" else "Erf"
    if not has_ops("Mul", "Add", "Div", inner_op):
        return None
    x = node.input(0)
    xs = _up(rw, x)
    if approx == "tanh":
        cube = rw.op("Mul", rw.op("Mul", xs, xs), xs)
        poly = rw.op("Add", xs, rw.op("Mul", rw.scalar(0.044715, like=xs), cube))
        inner = rw.op("Tanh", rw.op("Mul", rw.scalar(math.sqrt(2 / math.pi), like=xs), poly))
    else:
        inner = rw.op("Erf", rw.op("Div", xs, rw.scalar(math.sqrt(2.0), like=xs)))
    half_x = rw.op("Mul", rw.scalar(0.5, like=xs), xs)
    y = rw.op("Mul", half_x, rw.op("Add", rw.scalar(1.0, like=xs), inner))
    return [_cast(rw, y, x.dtype)]


# -- the Reduce family ------------------------------------------------------------------------
def _reduce_parts(node: Node) -> tuple[Value, Value | None, int, int] | None:
    x = node.input(0)
    return (
        x,
        node.input(1),
        int(node.attr("keepdims", 1)),
        int(node.attr("noop_with_empty_axes", 0)),
    )


def _reduce_sum_square(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """ReduceSum(x * x); with noop_with_empty_axes it is a plain square, as in ONNX."""
    if not has_ops("ReduceSum", "Mul"):
        return None
    x, axes, keep, noop = _reduce_parts(node)
    xs = _up(rw, x)
    y = _reduce(rw, "ReduceSum", rw.op("Mul", xs, xs), axes, keep, noop)
    return [_cast(rw, y, x.dtype)]


def _reduce_l1(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """ReduceSum(Abs(x))."""
    if not has_ops("ReduceSum", "Abs"):
        return None
    x, axes, keep, noop = _reduce_parts(node)
    xs = _up(rw, x)
    y = _reduce(rw, "ReduceSum", rw.op("Abs", xs), axes, keep, noop)
    return [_cast(rw, y, x.dtype)]


def _reduce_l2(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """Sqrt(ReduceSum(x * x)) (float inputs only: integer L2 truncates a float result)."""
    if not has_ops("ReduceSum", "Mul", "Sqrt"):
        return None
    x, axes, keep, noop = _reduce_parts(node)
    if x.dtype not in dtypes.FLOATS:
        return None
    xs = _up(rw, x)
    y = rw.op("Sqrt", _reduce(rw, "ReduceSum", rw.op("Mul", xs, xs), axes, keep, noop))
    return [_cast(rw, y, x.dtype)]


def _reduce_log_sum(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """Log(ReduceSum(x))."""
    if not has_ops("ReduceSum", "Log"):
        return None
    x, axes, keep, noop = _reduce_parts(node)
    xs = _up(rw, x)
    y = rw.op("Log", _reduce(rw, "ReduceSum", xs, axes, keep, noop))
    return [_cast(rw, y, x.dtype)]


def _reduce_log_sum_exp(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """log(sum(exp(x - m))) + m with m = max (0 where the max is infinite), stable."""
    if not has_ops("ReduceMax", "ReduceSum", "Sub", "Exp", "Log", "Add", "IsInf", "Where"):
        return None
    x, axes, keep, noop = _reduce_parts(node)
    axes_list = None if axes is None else const_ints(axes)
    if axes is not None and axes_list is None and (noop or not keep):
        return None  # which axes go away is only known at run time
    empty = axes is None or axes_list == []
    if not keep and not (noop and empty) and not has_ops("Squeeze" if not empty else "Reshape"):
        return None
    xs = _up(rw, x)
    m = _reduce(rw, "ReduceMax", xs, axes, 1, noop)
    m = rw.op("Where", rw.op("IsInf", m), rw.scalar(0.0, like=m), m)
    s = _reduce(rw, "ReduceSum", rw.op("Exp", rw.op("Sub", xs, m)), axes, 1, noop)
    y = rw.op("Add", rw.op("Log", s), m)
    if not keep and not (noop and empty):
        y = rw.op("Reshape", y, rw.ints([])) if empty else rw.op("Squeeze", y, axes)
    return [_cast(rw, y, x.dtype)]


# -- dense ops -------------------------------------------------------------------------------
def _gemm(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """float Gemm as ``MatMul(A', B') * alpha + C * beta``, in its reference kernel's order
    (float16 in float32, rounded back): the MatMul runs natively on the BLAS and the
    scaling and bias become an elementwise epilogue that fuses into it; a transposed
    constant weight folds (the weight is stored pre-transposed). Integer Gemm stays whole."""
    out = node.outputs[0].dtype
    if out not in (_F16, np.dtype(np.float32), np.dtype(np.float64)):
        return None
    if not has_ops("MatMul", "Transpose", "Mul", "Add", "Cast"):
        return None
    a, b, c = (None if v is None else _up(rw, v) for v in (node.input(i) for i in range(3)))
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if int(node.attr("transA", 0)):
        a = rw.op("Transpose", a, perm=[1, 0])
    if int(node.attr("transB", 0)):
        b = rw.op("Transpose", b, perm=[1, 0])
    y = rw.op("MatMul", a, b)
    if alpha != 1.0:
        y = rw.op("Mul", y, rw.scalar(alpha, like=y))
    if c is not None and beta != 0.0:
        y = rw.op("Add", y, c if beta == 1.0 else rw.op("Mul", c, rw.scalar(beta, like=c)))
    return [_cast(rw, y, out)]


def _matmul_f16(rw: Rewriter, node: Node) -> list[Value | None] | None:
    """float16 MatMul as its reference kernel computes it: in float32, rounded back; the
    float32 MatMul runs natively and the casts fuse into its neighbours (its epilogue)."""
    if node.outputs[0].dtype != _F16 or not has_ops("Cast"):
        return None
    a, b = (_up(rw, v) for v in node.inputs[:2])
    return [_cast(rw, rw.op("MatMul", a, b), _F16)]


# -- variadic ops -----------------------------------------------------------------------------
def _chain(op: str) -> Decomposition:
    def run(rw: Rewriter, node: Node) -> list[Value | None] | None:
        ins = node.inputs
        binary = {"Sum": "Add", "Mean": "Add"}.get(node.op_type, op)
        if not has_ops(binary) or any(v is None for v in ins) or not ins:
            return None
        if node.op_type in ("Max", "Min") and len(ins) <= 2:
            return None  # binary Max/Min is the primitive
        if len(ins) == 1:
            return [ins[0]] if ins[0].dtype == node.outputs[0].dtype else None
        up = node.outputs[0].dtype == _F16 and node.op_type in ("Sum", "Mean")
        vals = [_up(rw, v) for v in ins] if up else list(ins)
        acc = vals[0]
        for v in vals[1:]:
            acc = rw.op(binary, acc, v)
        if node.op_type == "Mean":
            if not has_ops("Div"):
                return None
            acc = rw.op("Div", acc, rw.scalar(float(len(ins)), like=acc))
        return [_cast(rw, acc, node.outputs[0].dtype)]

    return run


DECOMPOSITIONS: dict[str, Decomposition] = {
    "LayerNormalization": _layer_norm,
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "BatchNormalization": _batch_norm,
    "InstanceNormalization": _instance_norm,
    "MeanVarianceNormalization": _mvn,
    "LpNormalization": _lp_norm,
    "Gelu": _gelu,
    "Gemm": _gemm,
    "MatMul": _matmul_f16,
    "ReduceSumSquare": _reduce_sum_square,
    "ReduceL1": _reduce_l1,
    "ReduceL2": _reduce_l2,
    "ReduceLogSum": _reduce_log_sum,
    "ReduceLogSumExp": _reduce_log_sum_exp,
    "Sum": _chain("Add"),
    "Mean": _chain("Add"),
    "Max": _chain("Max"),
    "Min": _chain("Min"),
}
