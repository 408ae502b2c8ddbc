"""Legality of attention with a key-tiled (online) softmax (issue 38).

A fused attention ``softmax(f(Q K^T)) @ V`` can compute each panel of query rows a block
of key columns at a time, never holding a whole row of scores, when its epilogue is
*per element on the scores, then a softmax over the key axis, then P @ V*:

* the pre-softmax part ``x = f(s)``: every op that depends on the scores is elementwise
  (:data:`ELEMENTWISE`: a scale, an additive or ``Where`` mask of the scores' shape or
  broadcast, casts, a clamp or soft-cap), so ``x[i, j]`` depends on ``s[i, j]`` and on
  inputs at ``(i, j)`` only: a key block's ``x`` needs that block's scores alone;
* the softmax over the key axis exactly as the decomposition writes it
  (``geode.compiler.passes.decompose``): ``m = ReduceMax(x)`` (a value per row),
  ``d = x - m``, optionally ``Min(d, c)`` with a constant ``c >= 0`` (a no-op on
  ``d <= 0``), ``e = Exp(d)``, ``l = ReduceSum(e)`` (a value per row), ``p = e / l``,
  maybe cast; ``x`` read by the max and the difference only, and nothing else reading
  a value between the scores and ``p``;
* ``p`` the second MatMul's ``A`` alone (the fused epilogue's one output).

Then the rows can be computed in key blocks with a running max ``m`` and sum ``l``:
per block ``m' = max(m, rowmax(x_blk))``, ``a = exp(m - m')``, ``l = a l + rowsum(exp(x_blk
- m'))``, ``O = a O + exp(x_blk - m') @ V_blk``, and ``O / l`` at the end. The result
equals the row-panel path's within the float sums' bounds (the sums are regrouped: not
the same bits). A row whose ``x`` is all ``-inf`` gives ``m = -inf``, ``x - m`` NaN, and
NaN out, as the row-panel path does; a NaN score propagates through ``m`` likewise.

Anything not proven keeps the row-panel path; the reason goes to ``explain()``. Whether
the key-tiled form pays (a panel's rows of scores against the core's L2) is
:func:`geode.compiler.fusion.profit.online_plan`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geode.compiler.ir import Node, Value

__all__ = ["ELEMENTWISE", "OnlineSoftmax", "online_legality"]

#: ops that may compute the softmax's input from the scores: elementwise, any broadcast
ELEMENTWISE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Neg", "Where", "Cast", "Min", "Max", "Tanh", "Identity"}
)

#: item sizes of the running max, sum and output the key-tiled form keeps
_FLOATS = ("float32", "float64")


@dataclass(frozen=True)
class OnlineSoftmax:
    """A proven key-tiled attention epilogue: ``pre`` the per-element nodes from the
    scores to the softmax input ``x`` (in order; maybe none), ``softmax`` the softmax's
    nodes (max, difference, clamp if any, exp, sum, division, casts after) in order."""

    x: Value
    pre: tuple[Node, ...]
    softmax: tuple[Node, ...]

    def describe(self) -> str:
        """``key-tiled softmax over x (per element: Mul, Where)``."""
        ops = ", ".join(dict.fromkeys(n.op_type for n in self.pre)) or "none"
        return f"key-tiled softmax legal over {self.x.name} (per element before it: {ops})"


def _const(v: Value | None) -> np.ndarray | None:
    if v is None or not v.is_constant or v.data is None:
        return None
    return np.asarray(v.data)


def _only(v: Value, op: str, roles: dict[str, str], role: str | None = None) -> Node | str:
    """``v``'s producer when it is ``op`` (its output of ``role`` when given), else why
    not."""
    p = v.producer
    if p is None or p.op_type != op:
        got = "an input" if p is None else f"{p.op_type} {p.name}"
        return f"the softmax needs {op} where it has {got}"
    if role is not None and roles.get(v.name) != role:
        return f"{op} {p.name} is not one value per query row over the key axis"
    return p


def _strip_casts(v: Value, inside: set[int]) -> tuple[Value, list[Node]]:
    """``v`` followed back through the group's Casts: the value before them, the Casts."""
    casts: list[Node] = []
    while v.producer is not None and v.producer.op_type == "Cast" and id(v.producer) in inside:
        casts.insert(0, v.producer)
        v = v.producer.inputs[0]
    return v, casts


def _softmax_nodes(p: Value, roles: dict[str, str], inside: set[int]) -> list[Node] | str:
    """The softmax producing ``p`` (see the module docstring), its nodes in order."""
    y, casts = _strip_casts(p, inside)
    div = _only(y, "Div", roles)
    if isinstance(div, str):
        return div
    e, den = div.inputs[0], div.inputs[1]
    red_sum = _only(den, "ReduceSum", roles, "col")
    if isinstance(red_sum, str):
        return red_sum
    if red_sum.inputs[0] is not e:
        return f"{div.name} divides by the row sum of another value"
    exp = _only(e, "Exp", roles)
    if isinstance(exp, str):
        return exp
    d = exp.inputs[0]
    clamp: list[Node] = []
    if d.producer is not None and d.producer.op_type == "Min":
        lim = _const(d.producer.inputs[1]) if len(d.producer.inputs) == 2 else None
        if lim is None or lim.size != 1 or not float(lim.reshape(-1)[0]) >= 0:
            return f"Min {d.producer.name} clamps other than at a constant >= 0"
        clamp = [d.producer]
        d = d.producer.inputs[0]
    sub = _only(d, "Sub", roles)
    if isinstance(sub, str):
        return sub
    x, m = sub.inputs[0], sub.inputs[1]
    red_max = _only(m, "ReduceMax", roles, "col")
    if isinstance(red_max, str):
        return red_max
    if red_max.inputs[0] is not x:
        return f"{sub.name} subtracts the row max of another value"
    nodes = [red_max, sub, *clamp, exp, red_sum, div, *casts]
    if any(id(n) not in inside for n in nodes):
        return "the softmax is not all in the fused epilogue"
    return nodes


def _depends(nodes: list[Node], acc: Value) -> set[int]:
    """Ids of the values computed from the scores ``acc`` (``acc`` included)."""
    dep = {id(acc)}
    for n in nodes:
        if any(v is not None and id(v) in dep for v in n.inputs):
            dep |= {id(o) for o in n.outputs}
    return dep


def _readers_ok(v: Value, allowed: set[int]) -> bool:
    return all(id(c) in allowed for c in v.consumers)


def online_legality(
    nodes: list[Node], roles: dict[str, str], acc: Value, p: Value
) -> OnlineSoftmax | str:
    """The key-tiled form of an attention epilogue (``nodes`` in order, every value's
    ``roles``, the scores ``acc``, the result ``p`` the second MatMul reads), or why not
    (see the module docstring)."""
    inside = {id(n) for n in nodes}
    sm = _softmax_nodes(p, roles, inside)
    if isinstance(sm, str):
        return sm
    x = sm[0].inputs[0]
    if str(x.dtype) not in _FLOATS:
        return f"the softmax's input {x.name} is {x.dtype}, not float32 or float64"
    dep = _depends(nodes, acc)
    if id(x) not in dep:
        return f"the softmax's input {x.name} does not depend on the scores"
    in_sm = {id(n) for n in sm}
    pre = [n for n in nodes if id(n) not in in_sm and any(id(o) in dep for o in n.outputs)]
    pre_ids = {id(n) for n in pre}
    for n in pre:
        if n.op_type not in ELEMENTWISE:
            return f"{n.op_type} {n.name} on the scores is not a per-element op the form takes"
        for o in n.outputs:
            if o is not x and not _readers_ok(o, pre_ids):
                return f"{o.name} (before the softmax) is read by more than its next op"
    if not _readers_ok(x, {id(sm[0]), id(sm[1])}):
        return f"the softmax's input {x.name} is read by more than its max and difference"
    if acc is not x and not _readers_ok(acc, pre_ids):
        return "the scores are read by more than the ops before the softmax"
    for a, b in zip(sm, sm[1:]):  # each softmax value read by the next step alone
        if a.op_type != "Exp" and not _readers_ok(a.outputs[0], {id(b)}):
            return f"{a.outputs[0].name} in the softmax is read elsewhere"
    exp = next(n for n in sm if n.op_type == "Exp")
    if not _readers_ok(exp.outputs[0], {id(n) for n in sm if n.op_type in ("ReduceSum", "Div")}):
        return f"{exp.outputs[0].name} (the exp) is read by more than the row sum and division"
    if len(p.consumers) != 1 or p.consumers[0].op_type != "MatMul":
        return f"{p.name} is read by more than the second MatMul"
    return OnlineSoftmax(x, tuple(pre), tuple(sm))
