"""Lowering: a fused group -> a loop AST :class:`Kernel`, one ScheduleBlock per op.

Each op output becomes a block in its own loop nest over the output's shape; the
block stores the op's scalar expression, in which inputs are loads at index
expressions of the block's iteration variables (broadcasting maps unit dims to 0;
Transpose, Slice, Split, Concat, Gather, Reshape, ... map indices accordingly).
A reduction lowers to an init block and an update block with reduce iteration
variables; ReduceMean adds a block dividing by the element count. Values produced
and consumed inside the group are temporaries; the schedule inlines most of them.

Symbolic dims become kernel arguments: a plain symbol keeps its name; a compound
expression (``2*N``) becomes an argument ``_e<k>`` that the runtime evaluates.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import sympy

from geode.codegen import ast as A
from geode.codegen.nan_flow import nan_insensitive_reductions
from geode.compiler import dtypes
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.patterns import reduce_axes
from geode.compiler.fusion.stitch import lowering_order
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.shapes import (
    Dim,
    SymbolTable,
    broadcast_stride,
    broadcasts_to,
    dim_str,
    dims_equal,
    free_symbols,
)
from geode.errors import CodegenError

#: dtypes the native backend handles
CODEGEN_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        np.float32,
        np.float64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.bool_,
    )
)

_RESERVED = frozenset(
    {
        "np",
        "numba",
        "math",
        "prange",
        "range",
        "min",
        "max",
        "abs",
        "int",
        "float",
        "bool",
        "len",
        "print",
        "numpy",
        "nb",
    }
) | frozenset(keyword.kwlist)


@dataclass(frozen=True)
class IndexCheck:
    """Indices a kernel uses to address memory without a bounds check (Gather's): the
    runtime checks them before each launch. Every index must lie in ``[-dim, dim)``; the
    indices are kernel input ``input`` or, when they are a constant folded into the
    kernel as a literal, ``data``."""

    node: str  # the op, as Node.where names it
    axis: int
    dim: Dim
    input: int | None
    data: np.ndarray | None = None


@dataclass
class LoweredKernel:
    """A lowered group: its AST and how its arguments map to graph values."""

    kernel: A.Kernel
    inputs: list[Value]  # one per kernel input buffer, in order
    outputs: list[Value]  # one per kernel output buffer, in order
    dim_exprs: dict[str, Dim] = field(default_factory=dict)  # kernel dim arg -> its symbolic dim
    index_checks: list[IndexCheck] = field(default_factory=list)


class LowerCtx:
    """Names, buffers and dim arguments of one kernel being lowered."""

    def __init__(self, group: Group, graph: Graph):
        self.group = group
        self.graph = graph
        self.used: set[str] = set(_RESERVED)
        self.block_names: set[str] = set()
        self.buf: dict[int, str] = {}
        self.dims: dict[str, Dim] = {}
        self.dim_names: dict[str, str] = {}
        self.inputs: list[Value] = []
        self.temps: list[A.Buffer] = []
        self.in_bufs: list[A.Buffer] = []
        self.index_checks: dict[str, IndexCheck] = {}

    def name(self, base: str) -> str:
        """A fresh identifier derived from ``base``."""
        s = re.sub(r"\W", "_", base)
        if not s or s[0].isdigit():
            s = "t_" + s
        cand, k = s, 0
        while cand in self.used:
            k += 1
            cand = f"{s}_{k}"
        self.used.add(cand)
        return cand

    def block_name(self, base: str) -> str:
        """A fresh block name (blocks have their own namespace)."""
        s = re.sub(r"\W", "_", base)
        cand, k = s, 0
        while cand in self.block_names:
            k += 1
            cand = f"{s}_{k}"
        self.block_names.add(cand)
        return cand

    def dim(self, d: Dim) -> A.Expr:
        """An AST expression for a dim (kernel dim argument when symbolic)."""
        if isinstance(d, int):
            return A.Const(int(d))
        key = dim_str(d)
        if key not in self.dim_names:
            if isinstance(d, sympy.Symbol):
                nm = self.name(d.name)
            else:
                nm = self.name(f"_e{len(self.dim_names)}")
            self.dim_names[key] = nm
            self.dims[nm] = d
        return A.Var(self.dim_names[key])

    def shape(self, v: Value) -> tuple[A.Expr, ...]:
        """AST dims of a value's shape."""
        return tuple(self.dim(d) for d in v.shape)

    def buffer_of(self, v: Value) -> str:
        """The buffer name of a value, declaring it as a kernel input when external."""
        if id(v) not in self.buf:
            nm = self.name(v.name)
            self.buf[id(v)] = nm
            self.inputs.append(v)
            self.in_bufs.append(A.Buffer(nm, dtypes.name(v.dtype), self.shape(v), "global"))
        return self.buf[id(v)]

    def load(self, v: Value, idx: list[A.Expr]) -> A.Expr:
        """Read ``v`` at ``idx`` (scalar constants become literals)."""
        if v.is_constant and v.data is not None and v.data.size == 1:
            return literal(v.data.reshape(-1)[0], v.dtype)
        return A.Load(self.buffer_of(v), tuple(idx))

    def bload(self, v: Value, ivs: list[A.Expr], out_shape: tuple[Dim, ...]) -> A.Expr:
        """Read ``v`` broadcast to an output of ``out_shape`` at output index ``ivs``.

        A static 1 reads index 0; a dim provably equal to the output's reads the output's
        index. Any other dim ``d`` is a symbolic broadcast (``N`` into ``bcast(M, N)``,
        legal by :func:`broadcasts_to`): ``d`` is the output's dim or 1 at run time, so it
        reads index ``i * stride`` with the dim argument ``stride = Min(1, d - 1)``: 1
        when ``d`` is the output's dim, 0 when it is 1 (when ``d`` is 0 so is the
        output's dim, and nothing is read)."""
        shape = v.shape
        off = len(out_shape) - len(shape)
        idx = []
        for j, d in enumerate(shape):
            od = out_shape[j + off]
            if d == 1 and od != 1:
                idx.append(A.Const(0))
            elif d == od or dims_equal(d, od) is True:
                idx.append(ivs[j + off])
            else:
                idx.append(A.mul(ivs[j + off], self.dim(broadcast_stride(d))))
        return self.load(v, idx)


def literal(x: object, dtype: np.dtype) -> A.Const:
    """A typed literal."""
    dt = dtypes.name(dtype)
    if dtype == np.bool_:
        return A.Const(bool(x), "bool")
    if np.issubdtype(dtype, np.integer):
        return A.Const(int(x), dt)
    return A.Const(float(x), dt)


def _c(v: float, like: Value) -> A.Const:
    return literal(v, like.dtype)


# -- op rules ---------------------------------------------------------------------------
# rule(ctx, node, out_index, ivs) -> scalar expression of output ``out_index`` at ``ivs``

Rule = Callable[[LowerCtx, Node, int, list[A.Expr]], A.Expr]
RULES: dict[str, Rule] = {}


def _rule(*names: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn

    return deco


def _ins(ctx: LowerCtx, node: Node, ivs: list[A.Expr]) -> list[A.Expr | None]:
    out_shape = node.outputs[0].shape
    return [None if v is None else ctx.bload(v, ivs, out_shape) for v in node.inputs]


_UNARY = {
    "Neg": "neg",
    "Abs": "abs",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Sin": "sin",
    "Cos": "cos",
    "Tan": "tan",
    "Asin": "asin",
    "Acos": "acos",
    "Atan": "atan",
    "Sinh": "sinh",
    "Cosh": "cosh",
    "Tanh": "tanh",
    "Asinh": "asinh",
    "Acosh": "acosh",
    "Atanh": "atanh",
    "Erf": "erf",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Sign": "sign",
    "Not": "not",
    "IsNaN": "isnan",
    "BitwiseNot": "bitnot",
}


@_rule(*_UNARY)
def _unary(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    return A.Un(_UNARY[node.op_type], _ins(ctx, node, ivs)[0])


_BINARY = {
    "Add": "+",
    "Sub": "-",
    "Mul": "*",
    "Div": "/",
    "Pow": "pow",
    "Equal": "==",
    "Less": "<",
    "Greater": ">",
    "LessOrEqual": "<=",
    "GreaterOrEqual": ">=",
    "And": "and",
    "Or": "or",
    "Xor": "xor",
    "BitwiseAnd": "bitand",
    "BitwiseOr": "bitor",
    "BitwiseXor": "bitxor",
}


@_rule(*_BINARY)
def _binary(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    a, b = _ins(ctx, node, ivs)[:2]
    base, exponent = node.inputs[0].dtype, node.inputs[1].dtype
    if node.op_type == "Pow" and exponent != base:
        return _mixed_pow(a, b, base, exponent)
    return A.Bin(_BINARY[node.op_type], a, b)


def _mixed_pow(a: A.Expr, b: A.Expr, base: np.dtype, exponent: np.dtype) -> A.Expr:
    """``a ** b`` with an exponent of another dtype, computed as the reference does
    (then cast to the base's dtype): a float base in ``result_type(base, exponent,
    float32)`` (a float32 base with an int32 exponent in float64: float32 would round
    an odd exponent above 2**24 to an even one), an integer base with a float exponent
    in float64 (2 ** 0.5 -> 1), integers in int64 (the exponent's value kept: a uint32
    exponent of 2**32 - 1 is no -1 in int32; a uint64 one saturates at the int64
    maximum, as the reference's)."""
    if base.kind == "f" or exponent.kind == "f":
        work = np.result_type(base, exponent, np.float32) if base.kind == "f" else np.float64
        work_name = dtypes.name(work)
        wide = A.Bin("pow", A.Cast(work_name, a), A.Cast(work_name, b))
        return wide if np.dtype(work) == base else A.Cast(dtypes.name(base), wide)
    if exponent == np.uint64:
        b = A.Bin("min", b, literal(np.iinfo(np.int64).max, exponent))
    wide = A.Bin("pow", A.Cast("int64", a), A.Cast("int64", b))
    return wide if base == np.int64 else A.Cast(dtypes.name(base), wide)


@_rule("Mod")
def _mod(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    a, b = _ins(ctx, node, ivs)[:2]
    return A.Bin("fmod" if node.attrs.get("fmod", 0) else "%", a, b)


@_rule("Max", "Min", "Sum", "Mean")
def _variadic(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    xs = [x for x in _ins(ctx, node, ivs) if x is not None]
    op = {"Max": "max", "Min": "min", "Sum": "+", "Mean": "+"}[node.op_type]
    acc = xs[0]
    for x in xs[1:]:
        acc = A.Bin(op, acc, x)
    if node.op_type == "Mean":
        acc = A.Bin("/", acc, _c(len(xs), node.outputs[0]))
    return acc


@_rule("Where")
def _where(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    c, t, f = _ins(ctx, node, ivs)
    return A.Select(c, t, f)


@_rule("Identity")
def _identity(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    return _ins(ctx, node, ivs)[0]


@_rule("Cast", "CastLike")
def _cast(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    # CastLike's second input gives only the dtype: never load it
    x = ctx.bload(node.inputs[0], ivs, node.outputs[0].shape)
    to = node.outputs[0].dtype
    if to == np.bool_:
        return A.Bin("!=", x, literal(0, node.inputs[0].dtype))
    return A.Cast(dtypes.name(to), x)


@_rule("Relu")
def _relu(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = _ins(ctx, node, ivs)[0]
    return A.Bin("max", x, _c(0, node.outputs[0]))


@_rule("Sigmoid")
def _sigmoid(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    return A.Un("sigmoid", _ins(ctx, node, ivs)[0])


@_rule("Reciprocal")
def _reciprocal(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    return A.Bin("/", _c(1, node.outputs[0]), _ins(ctx, node, ivs)[0])


def _float_attr(node: Node, name: str, default: float) -> float:
    """A float attribute at ONNX's precision (``AttributeProto`` floats are 32-bit), as
    the reference kernels read it: ``alpha=0.2`` is ``float32(0.2)`` on float64 too."""
    return float(np.float32(node.attrs.get(name, default)))


@_rule("LeakyRelu")
def _leaky(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = _ins(ctx, node, ivs)[0]
    o = node.outputs[0]
    alpha = _float_attr(node, "alpha", 0.01)
    return A.Select(A.Bin("<", x, _c(0, o)), A.Bin("*", x, _c(alpha, o)), x)


def _expm1(x: A.Expr, o: Value) -> A.Expr:
    """``exp(x) - 1`` without its cancellation near 0 (Kahan): with ``u = exp(x)``, ``x``
    where ``u`` rounds to 1, -1 where ``u - 1`` does, else ``(u - 1) * x / log(u)``, whose
    rounding errors cancel. ``exp(x) - 1`` itself lost all but a few bits near 0: Elu at
    x = -4e-5 in float32 was off by 2e-4 relative (found by geode.fuzz)."""
    u = A.Un("exp", x)
    d = A.Bin("-", u, _c(1, o))
    ratio = A.Bin("/", A.Bin("*", d, x), A.Un("log", u))
    tail = A.Select(A.Bin("==", d, _c(-1, o)), _c(-1, o), ratio)
    return A.Select(A.Bin("==", d, _c(0, o)), x, tail)


@_rule("Elu")
def _elu(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = _ins(ctx, node, ivs)[0]
    o = node.outputs[0]
    alpha = _float_attr(node, "alpha", 1.0)
    return A.Select(A.Bin("<", x, _c(0, o)), A.Bin("*", _c(alpha, o), _expm1(x, o)), x)


@_rule("Selu")
def _selu(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = _ins(ctx, node, ivs)[0]
    o = node.outputs[0]
    alpha = _float_attr(node, "alpha", 1.67326319217681884765625)
    gamma = _float_attr(node, "gamma", 1.05070102214813232421875)
    neg = A.Bin("*", _c(alpha, o), _expm1(x, o))
    return A.Bin("*", _c(gamma, o), A.Select(A.Bin("<=", x, _c(0, o)), neg, x))


@_rule("HardSigmoid")
def _hardsigmoid(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = _ins(ctx, node, ivs)[0]
    o = node.outputs[0]
    a, b = _float_attr(node, "alpha", 0.2), _float_attr(node, "beta", 0.5)
    return A.Bin(
        "max", _c(0, o), A.Bin("min", _c(1, o), A.Bin("+", A.Bin("*", _c(a, o), x), _c(b, o)))
    )


@_rule("Softplus")
def _softplus(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    """``max(x, 0) + log1p(exp(-|x|))``: never overflows (``log(exp(x) + 1)`` is inf from
    x = 89 in float32) and keeps the tiny results of very negative x."""
    x = _ins(ctx, node, ivs)[0]
    o = node.outputs[0]
    tail = A.Un("log1p", A.Un("exp", A.Un("neg", A.Un("abs", x))))
    return A.Bin("+", A.Bin("max", x, _c(0, o)), tail)


@_rule("Gelu")
def _gelu(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = _ins(ctx, node, ivs)[0]
    o = node.outputs[0]
    if node.attrs.get("approximate", "none") == "tanh":
        inner = A.Bin(
            "*",
            _c(math.sqrt(2 / math.pi), o),
            A.Bin("+", x, A.Bin("*", _c(0.044715, o), A.Bin("*", x, A.Bin("*", x, x)))),
        )
        return A.Bin("*", A.Bin("*", _c(0.5, o), x), A.Bin("+", _c(1, o), A.Un("tanh", inner)))
    return A.Bin(
        "*",
        A.Bin("*", _c(0.5, o), x),
        A.Bin("+", _c(1, o), A.Un("erf", A.Bin("*", x, _c(1 / math.sqrt(2), o)))),
    )


@_rule("Clip")
def _clip(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    ins = _ins(ctx, node, ivs)
    x = ins[0]
    if len(ins) > 1 and ins[1] is not None:
        x = A.Bin("max", x, ins[1])
    if len(ins) > 2 and ins[2] is not None:
        x = A.Bin("min", x, ins[2])
    return x


# -- injective ops: index maps ------------------------------------------------------------


def _linear(idx: list[A.Expr], shape: list[A.Expr]) -> A.Expr:
    lin: A.Expr = A.Const(0)
    for i, d in zip(idx, shape):
        lin = A.add(A.mul(lin, d), i)
    return lin


def _delinear(lin: A.Expr, shape: list[A.Expr]) -> list[A.Expr]:
    """The indices of linear index ``lin`` in ``shape`` (row-major). ``lin`` is below the
    product of ``shape``, so the outermost index needs no ``% d``."""
    out: list[A.Expr] = []
    for k, d in enumerate(reversed(shape)):
        out.append(lin if k == len(shape) - 1 else A.mod(lin, d))
        lin = A.floordiv(lin, d)
    return list(reversed(out))


def _divides(a: Dim, b: Dim) -> bool:
    """``a`` provably divides ``b`` (``b / a`` is a product of dims and integers)."""
    if isinstance(a, int) and isinstance(b, int):
        return a > 0 and b % a == 0
    _, den = sympy.fraction(sympy.cancel(sympy.sympify(b) / sympy.sympify(a)))
    return den == 1


def reshape_groups(src: list[Dim], dst: list[Dim]) -> list[tuple[list[int], list[int]]] | None:
    """A reshape ``src -> dst`` as independent groups of consecutive axes of equal size:
    ``[B, S, 768] -> [B, S, 12, 64]`` is ``([0], [0]), ([1], [1]), ([2], [2, 3])``. Axes of
    size 1 belong to no group (index 0 on the source side). None when the dims do not
    split that way provably (symbolic dims whose products cannot be matched, a 0 dim).

    Each group's indices depend only on its own axes, so the source index of a split or
    merged axis is ``i * 64 + j`` or ``k // 64, k % 64``, not a division of the whole
    linear index by every dim (a symbolic divisor is an integer division per element).
    """
    if any(isinstance(d, int) and d == 0 for d in [*src, *dst]):
        return None
    si = [a for a, d in enumerate(src) if d != 1]
    di = [a for a, d in enumerate(dst) if d != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(si) and j < len(di):
        gs, gd = [si[i]], [di[j]]
        ps, pd = src[si[i]], dst[di[j]]
        i, j = i + 1, j + 1
        while dims_equal(ps, pd) is not True:
            both_int = isinstance(ps, int) and isinstance(pd, int)
            if (ps < pd if both_int else _divides(ps, pd)) and i < len(si):
                gs.append(si[i])
                ps, i = ps * src[si[i]], i + 1
            elif (pd < ps if both_int else _divides(pd, ps)) and j < len(di):
                gd.append(di[j])
                pd, j = pd * dst[di[j]], j + 1
            else:
                return None
        groups.append((gs, gd))
    return groups if i == len(si) and j == len(di) else None


@_rule("Reshape", "Flatten")
def _reshape(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = node.inputs[0]
    out = node.outputs[0]
    if len(x.shape) == len(out.shape) and all(
        dims_equal(a, b) is True for a, b in zip(x.shape, out.shape)
    ):
        return ctx.load(x, ivs)
    src, dst = list(ctx.shape(x)), list(ctx.shape(out))
    groups = reshape_groups(list(x.shape), list(out.shape))
    if groups is None:
        return ctx.load(x, _delinear(_linear(ivs, dst), src))
    idx: list[A.Expr] = [A.Const(0)] * len(src)
    for gs, gd in groups:
        lin = _linear([ivs[a] for a in gd], [dst[a] for a in gd])
        for a, e in zip(gs, _delinear(lin, [src[a] for a in gs])):
            idx[a] = e
    return ctx.load(x, idx)


@_rule("Squeeze", "Unsqueeze")
def _squeeze(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = node.inputs[0]
    out = node.outputs[0]
    # drop/insert unit axes: match non-unit dims in order
    src = [i for i, d in enumerate(out.shape) if d != 1]
    idx: list[A.Expr] = []
    j = 0
    for d in x.shape:
        if d == 1:
            idx.append(A.Const(0))
        else:
            idx.append(ivs[src[j]])
            j += 1
    return ctx.load(x, idx)


@_rule("Expand")
def _expand(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    return ctx.bload(node.inputs[0], ivs, node.outputs[0].shape)


@_rule("Transpose")
def _transpose(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = node.inputs[0]
    r = len(x.shape)
    perm = node.attrs.get("perm") or list(range(r - 1, -1, -1))
    idx: list[A.Expr] = [A.Const(0)] * r
    for out_axis, in_axis in enumerate(perm):
        idx[int(in_axis)] = ivs[out_axis]
    return ctx.load(x, idx)


@_rule("Split")
def _split(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = node.inputs[0]
    axis = int(node.attrs.get("axis", 0)) % len(x.shape)
    offset: A.Expr = A.Const(0)
    for o in node.outputs[:k]:
        offset = A.add(offset, ctx.dim(o.shape[axis]))
    idx = list(ivs)
    idx[axis] = A.add(ivs[axis], offset)
    return ctx.load(x, idx)


@_rule("Concat")
def _concat(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    out = node.outputs[0]
    axis = int(node.attrs["axis"]) % len(out.shape)
    parts = [v for v in node.inputs if v is not None]
    starts: list[A.Expr] = []
    acc: A.Expr = A.Const(0)
    for v in parts:
        starts.append(acc)
        acc = A.add(acc, ctx.dim(v.shape[axis]))
    expr: A.Expr | None = None
    for v, st in reversed(list(zip(parts, starts))):
        idx = list(ivs)
        idx[axis] = A.sub(ivs[axis], st)
        ld = ctx.load(v, idx)
        expr = (
            ld
            if expr is None
            else A.Select(A.Bin("<", ivs[axis], A.add(st, ctx.dim(v.shape[axis]))), ld, expr)
        )
    return expr


@_rule("Slice")
def _slice(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x = node.inputs[0]
    starts, _, axes, steps = _slice_params(node)
    idx = list(ivs)
    for st, ax, sp in zip(starts, axes, steps):
        idx[ax] = A.add(A.Const(st), A.mul(ivs[ax], A.Const(sp)))
    return ctx.load(x, idx)


def _slice_params(node: Node) -> tuple[list[int], list[int], list[int], list[int]]:
    """Clamped static starts/ends/axes/steps of a Slice whose sliced dims are static."""
    x = node.inputs[0]
    r = len(x.shape)

    def ints(i: int) -> list[int] | None:
        v = node.input(i)
        return None if v is None else [int(t) for t in np.asarray(v.data).reshape(-1)]

    starts, ends = ints(1), ints(2)
    axes = ints(3) or list(range(len(starts)))
    steps = ints(4) or [1] * len(starts)
    out_s, out_e, out_a, out_p = [], [], [], []
    for s, e, a, p in zip(starts, ends, axes, steps):
        a = a % r
        d = x.shape[a]
        s = s + d if s < 0 else s
        # ONNX clamps a start into [0, d] for a positive step and into [0, d - 1] for a
        # negative one (as the reference kernel and shape inference do); Python slicing
        # would clamp a negative step's start to -1, before the first element
        s = min(max(s, 0), d) if p > 0 else min(max(s, 0), d - 1)
        out_s.append(s)
        out_e.append(e)
        out_a.append(a)
        out_p.append(p)
    return out_s, out_e, out_a, out_p


@_rule("Gather")
def _gather(ctx: LowerCtx, node: Node, k: int, ivs: list[A.Expr]) -> A.Expr:
    x, ind = node.inputs[0], node.inputs[1]
    axis = int(node.attrs.get("axis", 0)) % len(x.shape)
    q = len(ind.shape)
    raw = ctx.load(ind, ivs[axis : axis + q])
    i64 = A.Cast("int64", raw) if ind.dtype != np.int64 else raw
    _check_indices_later(ctx, node, axis)
    dim = ctx.dim(x.shape[axis])
    pos = A.Select(A.Bin("<", i64, A.Const(0)), A.add(i64, dim), i64)
    idx = list(ivs[:axis]) + [pos] + list(ivs[axis + q :])
    return ctx.load(x, idx)


def _check_indices_later(ctx: LowerCtx, node: Node, axis: int) -> None:
    """Record the :class:`IndexCheck` of Gather ``node`` (the kernel reads ``x`` at its
    indices unchecked). Indices computed in the group cannot be checked before the
    launch; the fusion rules keep them out, and this refuses them."""
    x, ind = node.inputs[0], node.inputs[1]
    if ind.producer is not None and ind.producer.name in ctx.group.names:
        raise CodegenError(f"{node.where}: indices {ind.name!r} are computed in the group")
    if ind.is_constant and ind.data is not None and id(ind) not in ctx.buf:
        check = IndexCheck(node.where, axis, x.shape[axis], None, np.asarray(ind.data))
    else:
        pos = next(i for i, v in enumerate(ctx.inputs) if v is ind)
        check = IndexCheck(node.where, axis, x.shape[axis], pos)
    ctx.index_checks.setdefault(node.name, check)


# -- legality for the planner -----------------------------------------------------------


def make_can_lower(graph: Graph) -> Callable[[Node], str | None]:
    """The planner's ``can_lower``: None when a node can be lowered, else the reason.

    A shape known only at run time (a dim a NonZero or a Reshape to a computed shape
    binds) is no reason: a kernel takes its dims as arguments, which the step computes
    from the symbols bound by the arrays produced before it: a symbol that first appears,
    as a dim of its own, in the output of a step that is not compiled (a NonZero's
    count). Any other run-time symbol is a reason (a Reshape or Split whose sizes are
    the values of a tensor read at run time, a dim computed from such a value):
    nothing before the kernel binds it, and its outputs must be allocated first."""
    first = first_binders(graph)

    def check(node: Node) -> str | None:
        if node.op_type not in RULES and node.op_type not in REDUCES:
            return f"no lowering rule for {node.op_type}"
        unbound = unbound_dim(node, first)
        if unbound is not None:
            return unbound
        for v in list(node.inputs) + list(node.outputs):
            if v is None:
                continue
            if v.shape is None:
                return f"{v.name!r} has unknown rank"
            if v.dtype not in CODEGEN_DTYPES:
                return f"{v.name!r} has dtype {dtypes.name(v.dtype)} (not compiled)"
        return _op_check(node, graph.symbols)

    return check


def unbound_dim(node: Node, first: dict) -> str | None:
    """Why a native step of ``node`` could not be sized before it runs (a dim of its
    inputs or outputs that no earlier step binds: see :func:`make_can_lower`), or None;
    ``first``: :func:`first_binders` of its graph."""
    for v in list(node.inputs) + list(node.outputs):
        for s in sorted(free_symbols(v.shape or ()) if v is not None else (), key=str):
            binder, lone = first.get(s, (None, True))
            compiled = binder is not None and (binder.op_type in RULES or binder.op_type in REDUCES)
            if binder is node or compiled or not lone:
                return f"dim {s} of {v.name!r} is known only from values read at run time"
    return None


def first_binders(graph: Graph) -> dict:
    """symbol -> (the node whose output is the first value, in graph order, to carry it
    in its shape, whether it is a dim of its own there); the node is None for a symbol
    of a graph input or a constant."""
    first: dict = {}
    for v in graph.inputs:
        for s in free_symbols(v.shape or ()):
            first.setdefault(s, (None, True))
    for node in graph.nodes:
        for v in node.inputs:
            if v is not None and v.producer is None:
                for s in free_symbols(v.shape or ()):
                    first.setdefault(s, (None, True))
        for v in node.outputs:
            lone = {d for d in v.shape or () if not isinstance(d, int) and d.is_Symbol}
            for s in free_symbols(v.shape or ()):
                first.setdefault(s, (node, s in lone))
    return first


def _op_check(node: Node, symbols: SymbolTable) -> str | None:
    out = node.outputs[0]
    if node.op_type in REDUCES:
        if reduce_axes(node) is None:
            return "reduce axes are not constant"
        return None
    od_broadcast = (
        node.op_type in _BINARY
        or node.op_type in ("Where", "Mod", "Max", "Min", "Sum", "Mean", "Clip")
        or node.op_type in _UNARY
    )
    if od_broadcast:
        for v in node.inputs:
            if v is None:
                continue
            off = len(out.shape) - len(v.shape)
            for j, d in enumerate(v.shape):
                if not broadcasts_to(d, out.shape[j + off], symbols):
                    return f"broadcast of {v.name!r} dim {j} ({d}) against {out.shape[j + off]} is ambiguous"
    if node.op_type == "Slice":
        if not all(v is None or v.is_constant for v in node.inputs[1:]):
            return "slice parameters are not constant"
        starts, _, axes, _ = _slice_params_safe(node)
        if starts is None:
            return "slice over a symbolic dim with a negative or clamped start"
    if node.op_type == "Expand":
        x, shape = node.inputs[0], node.inputs[1]
        if not shape.values_known:
            # inference assumed the shape's values keep x's static dims; the reference
            # kernel broadcasts by the values themselves and refuses those that do not
            return "expand shape known only at run time"
        off = len(out.shape) - len(x.shape)
        for j, d in enumerate(x.shape):
            if not broadcasts_to(d, out.shape[j + off], symbols):
                return "ambiguous expand"
    if node.op_type == "Squeeze" or node.op_type == "Unsqueeze":
        x = node.inputs[0]
        if [d for d in x.shape if d != 1] != [d for d in out.shape if d != 1]:
            return "squeeze of a symbolic dim that may be 1"
    return None


def _slice_params_safe(node: Node) -> tuple[list[int] | None, list[int], list[int], list[int]]:
    x = node.inputs[0]
    try:
        s, e, a, p = _slice_params(node)
    except TypeError:  # comparisons with symbolic dims
        return None, [], [], []
    for st, ax in zip(s, a):
        if not isinstance(x.shape[ax], int) and not isinstance(st, int):
            return None, [], [], []
    return s, e, a, p


# -- reductions -------------------------------------------------------------------------

REDUCES = {
    "ReduceSum": "+",
    "ReduceMean": "+",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceProd": "*",
}


def _identity_of(op: str, dtype: np.dtype) -> A.Const:
    if op == "+":
        return literal(0, dtype)
    if op == "*":
        return literal(1, dtype)
    if np.issubdtype(dtype, np.floating):
        return literal(-np.inf if op == "max" else np.inf, dtype)
    if dtype == np.bool_:  # the max of nothing is False, the min True (the reference's)
        return literal(op == "min", dtype)
    info = np.iinfo(dtype)
    return literal(info.min if op == "max" else info.max, dtype)


# -- the lowering driver ----------------------------------------------------------------


def _nest(
    ctx: LowerCtx,
    block: str,
    extents: list[A.Expr],
    kinds: list[str],
    body: list[A.Stmt],
    reduce_of: str | None = None,
) -> tuple[A.Stmt, list[A.Expr]]:
    """A loop nest with one block whose iter vars bind 1:1 to the loops."""
    loops = [ctx.name(f"{block}_i{k}") for k in range(len(extents))]
    ivs = [ctx.name(f"{block}_v{k}") for k in range(len(extents))]
    blk = A.Block(
        block,
        [A.IterVar(v, e, kd) for v, e, kd in zip(ivs, extents, kinds)],
        [A.Var(lv) for lv in loops],
        body,
        reduce_of=reduce_of,
    )
    stmt: A.Stmt = blk
    for lv, e in reversed(list(zip(loops, extents))):
        stmt = A.For(lv, e, [stmt])
    return stmt, [A.Var(v) for v in ivs]


def _nest_with(
    ctx: LowerCtx,
    block: str,
    extents: list[A.Expr],
    kinds: list[str],
    make_body: Callable[[list[A.Expr]], list[A.Stmt]],
    reduce_of: str | None = None,
) -> A.Stmt:
    stmt, ivs = _nest(ctx, block, extents, kinds, [], reduce_of)
    blk = next(b for b in A.walk_stmts([stmt]) if isinstance(b, A.Block))
    blk.body = make_body(ivs)
    return stmt


def lower_group(group: Group, graph: Graph, name: str) -> LoweredKernel:
    """Lower a fusion group to a Kernel (unscheduled: one block per op output)."""
    ctx = LowerCtx(group, graph)
    names = group.names
    outputs = group.outputs(graph)
    out_ids = {id(v) for v in outputs}
    out_bufs: dict[int, A.Buffer] = {}
    body: list[A.Stmt] = []
    quiet = nan_insensitive_reductions(group, graph)
    # group outputs first get names, so kernel args read well
    for v in outputs:
        nm = ctx.name(v.name)
        ctx.buf[id(v)] = nm
        out_bufs[id(v)] = A.Buffer(nm, dtypes.name(v.dtype), ctx.shape(v), "global")
    for node in lowering_order(group):
        for k, out in enumerate(node.outputs):
            used = id(out) in out_ids or any(c.name in names for c in out.consumers)
            if not used:
                continue
            if id(out) not in ctx.buf:
                nm = ctx.name(out.name)
                ctx.buf[id(out)] = nm
                ctx.temps.append(
                    A.Buffer(nm, dtypes.name(out.dtype), ctx.shape(out), "local", id(out) in quiet)
                )
            if node.op_type in REDUCES:
                body += _lower_reduce(ctx, node)
            else:
                rule = RULES.get(node.op_type)
                if rule is None:
                    raise CodegenError(f"no lowering rule for {node.where}")
                blk_name = ctx.block_name(
                    node.name if len(node.outputs) == 1 else f"{node.name}_o{k}"
                )
                buf = ctx.buf[id(out)]
                rank = len(out.shape)

                def make(
                    ivs: list[A.Expr],
                    node: Node = node,
                    k: int = k,
                    buf: str = buf,
                    rule: Rule = rule,
                ) -> list[A.Stmt]:
                    return [A.Store(buf, tuple(ivs), rule(ctx, node, k, list(ivs)))]

                body.append(
                    _nest_with(ctx, blk_name, list(ctx.shape(out)), ["spatial"] * rank, make)
                )
    kernel = A.Kernel(
        name, ctx.in_bufs, [out_bufs[id(v)] for v in outputs], list(ctx.dims), body, ctx.temps
    )
    return LoweredKernel(
        kernel, list(ctx.inputs), outputs, dict(ctx.dims), list(ctx.index_checks.values())
    )


def _lower_reduce(ctx: LowerCtx, node: Node) -> list[A.Stmt]:
    x = node.inputs[0]
    out = node.outputs[0]
    axes = set(reduce_axes(node) or ())
    keep = bool(node.attrs.get("keepdims", 1))
    op = REDUCES[node.op_type]
    final = ctx.buf[id(out)]
    acc = final
    if node.op_type == "ReduceMean":
        acc = ctx.name(f"{out.name}_sum")
        ctx.temps.append(A.Buffer(acc, dtypes.name(out.dtype), ctx.shape(out), "local"))
    out_ext = list(ctx.shape(out))
    base = ctx.block_name(node.name)
    init = _nest_with(
        ctx,
        f"{base}__init",
        out_ext,
        ["spatial"] * len(out_ext),
        lambda ivs: [A.Store(acc, tuple(ivs), _identity_of(op, out.dtype))],
        reduce_of=base,
    )
    x_ext = list(ctx.shape(x))
    spatial = [i for i in range(len(x_ext)) if i not in axes]
    red = sorted(axes)
    order = spatial + red
    kinds = ["spatial"] * len(spatial) + ["reduce"] * len(red)

    def upd(ivs: list[A.Expr]) -> list[A.Stmt]:
        pos = {ax: ivs[i] for i, ax in enumerate(order)}
        full = [pos[i] for i in range(len(x_ext))]
        oidx = [
            (A.Const(0) if i in axes else pos[i])
            for i in range(len(x_ext))
            if keep or i not in axes
        ]
        val = ctx.load(x, full)
        return [A.Store(acc, tuple(oidx), A.Bin(op, A.Load(acc, tuple(oidx)), val))]

    update = _nest_with(ctx, base, [x_ext[i] for i in order], kinds, upd)
    stmts = [init, update]
    if node.op_type == "ReduceMean":
        count: A.Expr = A.Const(1)
        for i in red:
            count = A.mul(count, x_ext[i])
        cnt = (
            A.Cast(dtypes.name(out.dtype), count)
            if not isinstance(count, A.Const)
            else literal(count.value, out.dtype)
        )
        stmts.append(
            _nest_with(
                ctx,
                ctx.block_name(f"{base}_mean"),
                out_ext,
                ["spatial"] * len(out_ext),
                lambda ivs: [A.Store(final, tuple(ivs), A.Bin("/", A.Load(acc, tuple(ivs)), cnt))],
            )
        )
    return stmts
