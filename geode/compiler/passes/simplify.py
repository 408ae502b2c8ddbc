"""Algebraic simplification: remove ops that compute nothing, strength-reduce a few.

Every rewrite here checks legality first: the value that replaces an op's output
must have its dtype and provably its (symbolic) shape. ``x + zeros([N, 4])`` with
``x: [4]`` broadcasts, so it is not ``x`` and stays.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.passes.rewrite import (
    broadcast_keeps_shape,
    const_ints,
    const_value,
    has_ops,
    is_dead,
    is_splat,
    node_alive,
    remove_dead_nodes,
    replace_value,
    shapes_equal,
    try_rewrite,
)
from geode.compiler.shapes import dims_equal

#: ops that only reinterpret the shape of row-major data
RESHAPE_LIKE = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})

#: sweeps over the graph before giving up on reaching a fixed point
MAX_SWEEPS = 8

Rule = Callable[[Graph, Node], bool]


def simplify(graph: Graph) -> bool:
    """Apply algebraic identities until none applies (bounded sweeps).

    Rewrites (each only when dtype and shape provably stay the same):

    * ``x*1``, ``1*x``, ``x+0``, ``0+x``, ``x-0``, ``x/1``, ``x**1`` -> ``x``;
    * ``x**2`` -> ``x*x``; ``x**0.5`` -> ``Sqrt(x)`` (float ``x``);
    * ``Identity(x)``, ``Cast``/``CastLike`` to ``x``'s own dtype, ``Neg(Neg(x))``,
      ``Not(Not(x))``, inference ``Dropout`` -> ``x``;
    * ``Transpose(Transpose(x, p), q)`` -> ``Transpose(x, p∘q)``, or ``x`` when the
      composition (or a single perm) is the identity;
    * chains of Reshape/Squeeze/Unsqueeze/Flatten: ``x`` when the chain ends in
      ``x``'s shape or is a Squeeze/Unsqueeze pair over the same constant axes
      (they cancel, even at unknown rank); ``Reshape(Reshape(x, s1), s2)`` ->
      ``Reshape(x, s2)`` when ``s2`` is constant without 0 (a 0 copies a dim of the
      middle shape; -1 is fine: it depends only on the element count);
    * ``Expand(x, s)`` -> ``x`` when the result has ``x``'s shape;
    * ``Gather(x, i, axis)`` with a constant scalar ``i`` of 0 or -1 on an axis of size 1
      -> ``Squeeze(x, axis)`` (a view, which the Reshape-like rules may cancel further).

    Graph outputs keep their names. Returns True when the graph changed.
    """
    changed = False
    for _ in range(MAX_SWEEPS):
        swept = False
        for node in graph.toposort():
            if not node_alive(graph, node) or node.domain not in ("", "ai.onnx"):
                continue
            rule = RULES.get(node.op_type)
            if rule is not None and rule(graph, node):
                swept = True
        changed |= swept
        if not swept:
            break
    return changed


def _forward(graph: Graph, node: Node, x: Value, *, allow_identity: bool = True) -> bool:
    """Replace ``node``'s single output by ``x`` (legality already checked by the caller)."""
    out = node.outputs[0]
    if x.dtype != out.dtype:
        return False
    return replace_value(graph, out, x, allow_identity=allow_identity)


# -- rules ------------------------------------------------------------------------------
def _identity(graph: Graph, node: Node) -> bool:
    x = node.input(0)
    # an Identity that anchors an output name on an input/variable must stay
    return x is not None and _forward(graph, node, x, allow_identity=False)


_NEUTRAL: dict[str, list[tuple[int, int, float]]] = {
    # op -> [(index of x, index of the constant, neutral value)]
    "Add": [(0, 1, 0.0), (1, 0, 0.0)],
    "Sub": [(0, 1, 0.0)],
    "Mul": [(0, 1, 1.0), (1, 0, 1.0)],
    "Div": [(0, 1, 1.0)],
    "Pow": [(0, 1, 1.0)],
}


def _keeps_zero_sign(op_type: str, c: Value) -> bool:
    """Whether adding or subtracting the zero constant ``c`` returns -0.0 as it is: in IEEE
    arithmetic -0.0 + 0.0 is +0.0, so for floats only ``x + (-0.0)`` and ``x - (+0.0)``
    are the identity (integers: any zero)."""
    data = const_value(c)
    if op_type not in ("Add", "Sub") or data is None or data.dtype.kind != "f":
        return True
    negative = np.signbit(data)
    return bool(np.all(negative)) if op_type == "Add" else not bool(np.any(negative))


def _neutral(graph: Graph, node: Node) -> bool:
    out = node.outputs[0]
    for xi, ci, value in _NEUTRAL[node.op_type]:
        x, c = node.input(xi), node.input(ci)
        if x is None or c is None or x.dtype != out.dtype:
            continue
        if is_splat(c, value) and _keeps_zero_sign(node.op_type, c) and broadcast_keeps_shape(x, c):
            return _forward(graph, node, x)
    if node.op_type == "Pow":
        return _pow(graph, node)
    return False


def _pow(graph: Graph, node: Node) -> bool:
    x, e = node.input(0), node.input(1)
    if x is None or e is None or not broadcast_keeps_shape(x, e):
        return False
    if is_splat(e, 2.0) and has_ops("Mul"):
        return try_rewrite(graph, node, lambda rw: [rw.op("Mul", x, x)])
    if is_splat(e, 0.5) and x.dtype in dtypes.FLOATS and has_ops("Sqrt"):
        return try_rewrite(graph, node, lambda rw: [rw.op("Sqrt", x)])
    return False


def _cast(graph: Graph, node: Node) -> bool:
    x = node.input(0)
    if x is None:
        return False
    if node.op_type == "Cast":
        to = node.attr("to")
        if to is None or dtypes.to_numpy(to) != x.dtype:
            return False
    else:  # CastLike
        like = node.input(1)
        if like is None or like.dtype != x.dtype:
            return False
    return _forward(graph, node, x)


def _involution(graph: Graph, node: Node) -> bool:
    x = node.input(0)
    p = x.producer if x is not None else None
    if p is None or p.op_type != node.op_type or p.domain != node.domain:
        return False
    return _forward(graph, node, p.inputs[0])


def _dropout(graph: Graph, node: Node) -> bool:
    if any(not is_dead(graph, o) for o in node.outputs[1:]):
        return False  # the mask is read
    training = node.input(2)
    if training is not None:
        t = const_value(training)
        if t is None or bool(t.reshape(-1)[0]):
            return False
    return _forward(graph, node, node.inputs[0])


def _perm(node: Node, rank: int | None) -> list[int] | None:
    perm = node.attr("perm")
    if perm is None:
        return None if rank is None else list(range(rank - 1, -1, -1))
    return [int(p) for p in perm]


def _transpose(graph: Graph, node: Node) -> bool:
    x = node.input(0)
    perm = _perm(node, x.rank)
    if perm is None:
        return False
    if perm == list(range(len(perm))):
        return _forward(graph, node, x)
    p = x.producer
    if p is None or p.op_type != "Transpose" or p.domain != node.domain:
        return False
    src = p.inputs[0]
    inner = _perm(p, src.rank)
    if inner is None or len(inner) != len(perm):
        return False
    composed = [inner[i] for i in perm]
    if composed == list(range(len(composed))):
        return _forward(graph, node, src)
    return try_rewrite(graph, node, lambda rw: [rw.op("Transpose", src, perm=composed)])


def _reshape_like(graph: Graph, node: Node) -> bool:
    x = node.input(0)
    out = node.outputs[0]
    if x is None or len(node.outputs) != 1:
        return False
    if shapes_equal(out.shape, x.shape):
        return _forward(graph, node, x)
    p = x.producer
    if p is None or p.op_type not in RESHAPE_LIKE or p.domain != node.domain or len(p.outputs) != 1:
        return False
    src = p.inputs[0]
    if src is None:
        return False
    if shapes_equal(out.shape, src.shape) or _squeeze_pair(node, p):
        return _forward(graph, node, src)
    if node.op_type == "Reshape":
        shape = const_ints(node.input(1))
        if shape is not None and (0 not in shape or node.attr("allowzero", 0)):
            node.set_input(0, src)
            remove_dead_nodes(graph, [p])
            return True
    return False


def _squeeze_pair(node: Node, producer: Node) -> bool:
    """Squeeze(Unsqueeze(x, a), a) or Unsqueeze(Squeeze(x, a), a): x, whatever its rank.

    Both ops read negative axes against the same tensor (the one between them), so
    equal constant axis sets name the same dims.
    """
    if {node.op_type, producer.op_type} != {"Squeeze", "Unsqueeze"}:
        return False
    a, b = const_ints(node.input(1)), const_ints(producer.input(1))
    return bool(a) and a is not None and b is not None and sorted(a) == sorted(b)


def _expand(graph: Graph, node: Node) -> bool:
    x, shape = node.input(0), node.input(1)
    if x is None or not shapes_equal(node.outputs[0].shape, x.shape):
        return False
    if shape is not None and not shape.values_known:
        return False  # values known only at run time: the Expand checks that they broadcast
    return _forward(graph, node, x)


def _gather(graph: Graph, node: Node) -> bool:
    x, index = node.input(0), node.input(1)
    if x is None or x.shape is None or index is None or index.rank != 0:
        return False
    at = const_ints(index)
    rank = len(x.shape)
    axis = int(node.attr("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if at is None or at[0] not in (0, -1) or not 0 <= axis < rank:
        return False
    if dims_equal(x.shape[axis], 1) is not True:
        return False
    return try_rewrite(graph, node, lambda rw: [rw.op("Squeeze", x, rw.ints([axis]))])


RULES: dict[str, Rule] = {
    "Identity": _identity,
    "Add": _neutral,
    "Sub": _neutral,
    "Mul": _neutral,
    "Div": _neutral,
    "Pow": _neutral,
    "Cast": _cast,
    "CastLike": _cast,
    "Neg": _involution,
    "Not": _involution,
    "Dropout": _dropout,
    "Transpose": _transpose,
    "Reshape": _reshape_like,
    "Squeeze": _reshape_like,
    "Unsqueeze": _reshape_like,
    "Flatten": _reshape_like,
    "Expand": _expand,
    "Gather": _gather,
}
