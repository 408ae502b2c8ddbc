"""Which max/min reductions of a fused group need not track NaN themselves.

A float max/min reduction follows numpy: a NaN anywhere in a row makes the row's
result NaN. The fast vector max (``vmaxps``) ignores NaN, so the numba backend keeps
an integer NaN guard beside the reduction (two more instructions per vector, about 6%
of softmax at [4096, 4096]). The guard is redundant when the NaN reaches every output
of that row another way, which is softmax's shape::

    m = ReduceMax(x)            every consumer of m is x - m
    e = Exp(x - m)              NaN-propagating, elementwise
    s = ReduceSum(e)            over the same axes as the max: a NaN in x makes s NaN
    y = e / s                   every output depends on s through NaN-propagating ops

If a row holds a NaN, the guarded kernel computes ``m = NaN`` and every output of the
row is NaN; the unguarded one computes some ``m``, and every output is still NaN
because it depends on ``s``, which summed ``exp(NaN - m)``. Without a NaN both compute
the same ``m``. :func:`nan_insensitive_reductions` finds such reductions by their
output values; the lowering marks their buffers
(:attr:`geode.codegen.ast.Buffer.nan_insensitive`).
"""

from __future__ import annotations

from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.patterns import reduce_axes
from geode.compiler.ir import Graph, Node, Value

__all__ = ["NAN_PROPAGATING", "nan_insensitive_reductions"]

#: Elementwise ops whose result is NaN whenever any input is (geode's Max/Min
#: propagate NaN like numpy's maximum/minimum; Pow is excluded: pow(1, NaN) = 1); a
#: Cast to a float type also keeps NaN.
NAN_PROPAGATING = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Neg",
        "Abs",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Tanh",
        "Sigmoid",
        "Erf",
        "Max",
        "Min",
        "Identity",
    }
)


def _depends_on(v: Value, sources: set[int], members: set[str]) -> bool:
    """Whether ``v`` is NaN whenever a value in ``sources`` is: it is one of them, or a
    NaN-propagating group op made it from at least one input that is."""
    memo: dict[int, bool] = {}

    def visit(x: Value) -> bool:
        if id(x) in sources:
            return True
        if id(x) in memo:
            return memo[id(x)]
        memo[id(x)] = False  # cycles cannot occur; this also stops re-walks
        p = x.producer
        ok = (
            p is not None
            and p.name in members
            and (p.op_type in NAN_PROPAGATING or (p.op_type == "Cast" and _is_float(x)))
            and any(i is not None and visit(i) for i in p.inputs)
        )
        memo[id(x)] = ok
        return ok

    return visit(v)


def _is_float(v: Value) -> bool:
    return str(v.dtype).startswith("float")


def nan_insensitive_reductions(group: Group, graph: Graph) -> set[int]:
    """``id`` of every ReduceMax/ReduceMin output in ``group`` whose NaN propagation is
    redundant (see the module docstring): it is not a group output, every consumer is
    ``x - m`` with ``x`` the reduction's own input, some ReduceSum over the same axes
    sums a NaN-propagating function of such an ``x - m``, and every group output depends
    NaN-propagatingly on one of those sums."""
    members = group.names
    outputs = group.outputs(graph)
    out_ids = {id(v) for v in outputs}
    found: set[int] = set()
    for n in group.nodes:
        if n.op_type not in ("ReduceMax", "ReduceMin"):
            continue
        m, x = n.outputs[0], n.inputs[0]
        if id(m) in out_ids or not _is_float(m) or not m.consumers:
            continue
        axes = reduce_axes(n)
        if axes is None:
            continue
        subs: list[Node] = list(m.consumers)
        if not all(
            c.name in members and c.op_type == "Sub" and c.inputs[0] is x and c.inputs[1] is m
            for c in subs
        ):
            continue
        diffs = {id(c.outputs[0]) for c in subs}
        sums = [
            s.outputs[0]
            for s in group.nodes
            if s.op_type == "ReduceSum"
            and reduce_axes(s) == axes
            and s.inputs[0] is not None
            and _depends_on(s.inputs[0], diffs, members)
        ]
        if not sums:
            continue
        sum_ids = {id(s) for s in sums}
        if all(_depends_on(o, sum_ids, members) for o in outputs):
            found.add(id(m))
    return found
