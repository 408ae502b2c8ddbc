"""Legality of causal attention: a fused attention whose scores are masked by a mask that
is provably causal at compile time computes, per panel of query rows, only the key
columns those rows can see.

The mask must be a triangle fixed at compile time (:func:`triangle`, a :class:`Triangle`):
one value where key column ``j`` and query row ``i`` have ``j - i >= k``, another
elsewhere: ``Trilu`` of a ``ConstantOfShape`` (or a constant) of one value (the ones of
``torch.triu(ones, diagonal=k)``, the ``-inf`` of ``torch.triu(full(-inf), k)``), through
any of ``Cast``, ``Not`` and ``Where`` between two constants (torch's ``scaled_dot_product_
attention(is_causal=True)`` bias ``where(not(tril(ones)), -inf, 0)``), or a constant whose
data is such a triangle. It must mask the scores with ``-inf`` exactly where ``j >= i + k``,
``k >= 1`` (every row sees column 0), through ``Where(mask, -inf, s)``, ``Where(mask, s,
-inf)`` or ``Add(s, mask)`` (``-inf`` past the diagonal, zeros before it).

The epilogue must then make exact zeros of the masked columns whatever the skipped
scores were, and read no other column of them (:func:`_flow`): from the masking node on,
the only ops on a masked value are a softmax's (the row max of that value subtracted,
``Min`` with a constant, ``Exp``, the row sum of that value divided by, a constant
factor), and its result is the second MatMul's ``A`` (``P @ V``) alone. ``exp(-inf) = 0``
exactly, so ``P`` is zero in the masked columns and ``P @ V`` sums only the visible ones.
A row whose visible scores are all ``-inf`` (or NaN) comes out NaN both ways. One
difference from the dense path: an inf or NaN in a *masked* row of ``V`` made the dense
path's ``0 * inf`` NaN there; skipped, it does not reach the row (as in a flash
attention's causal blocks; the visible rows' inf and NaN propagate as before). Anything
not proven keeps the dense path; the reason goes to ``explain()``. Whether it pays (the
panel height against the key length) is :func:`geode.compiler.fusion.profit.causal_plan`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geode.compiler.ir import Node, Value

__all__ = ["Causal", "Triangle", "causal_legality", "triangle"]

#: what a value of the epilogue is at the masked columns (:func:`_flow`)
_NEG, _ZERO, _ANY, _FREE = "-inf", "zero", "any", "free"


@dataclass(frozen=True)
class Causal:
    """A proven causal mask: ``mask`` (an epilogue input, role ``bfull``) masks key column
    ``j`` of query row ``i`` when ``j >= i + offset``; the entry builds each panel's mask
    itself, ``masked`` where masked, ``kept`` elsewhere (the mask's own values)."""

    mask: Value
    offset: int
    masked: float
    kept: float
    how: str

    def describe(self) -> str:
        """``causal (offset 1): <how>``."""
        return f"causal (offset {self.offset}): {self.how}"


def _constant(v: Value) -> np.ndarray | None:
    return np.asarray(v.data) if v.is_constant and v.data is not None else None


def _fill(v: Value) -> float | None:
    """The one value every element of ``v`` has (known at compile time), else None."""
    p = v.producer
    if p is not None and p.op_type == "ConstantOfShape":
        raw = p.attr("value")
        data = np.zeros(1, np.float32) if raw is None else np.asarray(raw).reshape(-1)
        return float(data[0]) if data.size == 1 else None
    if p is not None and p.op_type == "Cast":
        inner = _fill(p.inputs[0])
        return None if inner is None else _cast(inner, v)
    data = _constant(v)
    if data is None or data.size == 0 or not np.all(data == data.reshape(-1)[0]):
        return None
    return float(data.reshape(-1)[0])


def _cast(x: float, v: Value) -> float:
    return float(np.asarray(x).astype(np.dtype(v.dtype)))


@dataclass(frozen=True)
class Triangle:
    """A mask known at compile time: ``above`` where key column ``j`` and query row ``i``
    have ``j - i >= k``, ``below`` elsewhere, in every matrix; ``source`` for the plan."""

    k: int
    above: float
    below: float
    source: str


def _data_triangle(data: np.ndarray) -> Triangle | str:
    """The triangle a constant holds: every matrix the same, two values apart along a
    diagonal."""
    if data.ndim < 2 or data.shape[-1] < 2 or data.shape[-2] < 2:
        return "the mask constant is not a matrix of two rows and columns or more"
    mats = data.reshape(-1, *data.shape[-2:]).astype(np.float64)
    if np.isnan(mats).any():
        return "the mask constant holds NaN"
    if not np.all(mats == mats[:1]):
        return "the mask constant's matrices differ"
    m = mats[0]
    above, below = float(m[0, -1]), float(m[-1, 0])
    inside = m == above
    i, j = np.indices(m.shape)
    diff = j - i
    k = int(diff[inside].min())
    if above == below or not np.array_equal(inside, diff >= k) or np.any(m[~inside] != below):
        return "the mask constant is not a triangle"
    return Triangle(k, above, below, "a constant")


def _trilu(p: Node) -> Triangle | str:
    k_in = p.input(1)
    k_data = None if k_in is None else _constant(k_in)
    if k_in is not None and (k_data is None or k_data.size != 1):
        return f"{p.name}'s diagonal k is not a constant"
    fill = _fill(p.inputs[0])
    if fill is None or np.isnan(fill):
        return f"{p.name}'s input is not one value throughout"
    k = 0 if k_data is None else int(k_data.reshape(-1)[0])
    if int(p.attr("upper", 1)):
        return Triangle(k, fill, 0.0, f"{p.name}, upper, k={k}")
    return Triangle(k + 1, 0.0, fill, f"{p.name}, lower, k={k}")  # kept: j - i <= k


def triangle(v: Value, depth: int = 0) -> Triangle | str:
    """The :class:`Triangle` ``v`` is, known at compile time (``Trilu`` of one value, maybe
    through ``Cast``, ``Not``, ``Where`` between two constants, or a constant's data), or
    why not."""
    p = v.producer
    if depth > 8 or p is None or p.op_type not in ("Trilu", "Cast", "Not", "Where"):
        data = _constant(v)
        if data is None:
            return f"the mask {v.name} is not known at compile time"
        return _data_triangle(data)
    if p.op_type == "Trilu":
        return _trilu(p)
    inner = triangle(p.inputs[0], depth + 1)
    if isinstance(inner, str):
        return inner
    if np.isnan(inner.above) or np.isnan(inner.below):
        return "a NaN in the mask"
    src = f"{p.op_type} {p.name} of {inner.source}"
    if p.op_type == "Cast":
        return Triangle(inner.k, _cast(inner.above, v), _cast(inner.below, v), src)
    if p.op_type == "Not":
        return Triangle(inner.k, float(inner.above == 0), float(inner.below == 0), src)
    a, b = _fill(p.inputs[1]), _fill(p.inputs[2])
    if a is None or b is None:
        return f"{p.name} picks between values not known at compile time"
    pick = lambda c: a if c != 0 else b  # noqa: E731
    return Triangle(inner.k, pick(inner.above), pick(inner.below), src)


def _is_neg_inf(v: Value | None) -> bool:
    data = None if v is None else _constant(v)
    return data is not None and data.size >= 1 and bool(np.all(np.isneginf(data)))


def _scalar_const(v: Value) -> bool:
    data = _constant(v)
    return data is not None and data.size == 1 and bool(np.isfinite(data).all())


def _masking(node: Node, mask: Value) -> tuple[int, float, float, str] | str:
    """How ``node`` (a ``Where`` or an ``Add`` reading the mask) masks: ``(offset, masked,
    kept, how)``, or why it is not causal: ``-inf`` where ``j - i >= k``, the scores
    elsewhere."""
    tri = triangle(mask)
    if isinstance(tri, str):
        return tri
    up, low = tri.above, tri.below
    if np.isnan(up) or np.isnan(low):
        return "a NaN in the mask"
    if node.op_type == "Where" and node.inputs[0] is mask and mask not in node.inputs[1:]:
        a, b = node.inputs[1], node.inputs[2]
        past = (_is_neg_inf(a) and up != 0 and low == 0) or (
            _is_neg_inf(b) and up == 0 and low != 0
        )
        if not past:
            return f"{node.name} does not put -inf exactly where a key is past its query"
    elif node.op_type == "Add" and len(node.inputs) == 2 and node.inputs[0] is not node.inputs[1]:
        if not (np.isneginf(up) and low == 0):
            return f"{node.name} adds {up} past the diagonal and {low} before it, not -inf and 0"
    else:
        return f"{node.op_type} {node.name} reads the mask otherwise than to put -inf"
    if tri.k < 1:
        return f"offset {tri.k}: a query row would see no key column"
    if tri.k > 1 << 31:
        return f"offset {tri.k}: past any length"
    return tri.k, up, low, f"{mask.name} ({tri.source}) through {node.name}"


def _step(node: Node, st: dict[int, str], red: dict[int, int]) -> str | None:
    """The state of ``node``'s output from its inputs' (see :func:`_flow`), or None when the
    rule does not follow it."""
    op, ins = node.op_type, node.inputs
    kinds = [st.get(id(v), _FREE) if v is not None else _FREE for v in ins]
    if _NEG not in kinds and _ZERO not in kinds:
        if op.startswith("Reduce") and _ANY in kinds:
            return None  # a reduction over unmasked scores would read the skipped columns
        return _FREE if op.startswith("Reduce") or _ANY not in kinds else _ANY
    x = ins[0]
    if op in ("ReduceMax", "ReduceSum") and kinds[0] == (_NEG if op == "ReduceMax" else _ZERO):
        red[id(node.outputs[0])] = id(x)
        return _FREE
    if len(ins) == 2 and kinds[1] == _FREE:
        y = ins[1]
        shift = y.producer is not None and y.producer.op_type == "ReduceMax"
        if op == "Sub" and kinds[0] == _NEG and red.get(id(y)) == id(x) and shift:
            return _NEG  # the softmax's shift by its row max
        if op == "Min" and kinds[0] == _NEG and _scalar_const(y):
            return _NEG
        if op == "Div" and kinds[0] == _ZERO and red.get(id(y)) == id(x):
            return _ZERO  # the softmax's division by its row sum
        if op in ("Mul", "Div") and kinds[0] == _ZERO and _scalar_const(y):
            return _ZERO
    if op == "Exp" and kinds == [_NEG]:
        return _ZERO
    return None


def _flow(nodes: list[Node], acc: Value, mask: Value, p: Value) -> tuple[Node, str] | str:
    """Follow the epilogue's ``nodes`` from the product ``acc``: ``any`` values (a score at
    a visible column depends on visible columns only), ``free`` values (the same for every
    column, or not read from the scores: inputs other than the product, row reductions),
    ``-inf`` and ``zero`` values (exactly that at every masked column). Returns the masking
    node and ``p``'s state (``zero`` is needed), or why the rule does not follow."""
    st: dict[int, str] = {id(acc): _ANY}
    red: dict[int, int] = {}
    masking: Node | None = None
    for node in nodes:
        if any(v is mask for v in node.inputs):
            if masking is not None:
                return "the mask is read more than once"
            masking = node
            other = [v for v in node.inputs if v is not mask]
            if any(st.get(id(v)) in (_NEG, _ZERO) for v in other):
                return f"{node.name} masks a value already masked"
            out = _NEG
        else:
            got = _step(node, st, red)
            if got is None:
                return f"{node.op_type} {node.name} may read or keep a skipped column"
            out = got
        for o in node.outputs:
            st[id(o)] = out
    if masking is None:
        return "the mask is not read"
    return masking, st.get(id(p), _FREE)


def causal_legality(nodes: list[Node], roles: dict[str, str], acc: Value, p: Value) -> Causal | str:
    """The causal mask of an attention epilogue (``nodes`` in order, every value's role
    ``roles``, the product ``acc``, the result ``p`` the second MatMul reads), or why there
    is none (see the module docstring)."""
    inputs: dict[int, Value] = {}
    made = {id(o) for n in nodes for o in n.outputs}
    for n in nodes:
        for v in n.inputs:
            if v is not None and id(v) not in made and v is not acc:
                inputs[id(v)] = v
    full = [v for v in inputs.values() if roles.get(v.name) in ("full", "bfull")]
    if len(full) != 1:
        if not full:
            return "no mask of the scores' size (a mask per key, as for padding, is not causal)"
        return "more than one input of the scores' size"
    mask = full[0]
    if roles.get(mask.name) != "bfull":
        return f"the mask {mask.name} is not one matrix per batch of heads"
    flow = _flow(nodes, acc, mask, p)
    if isinstance(flow, str):
        return flow
    node, state = flow
    if state != _ZERO:
        return "the result is not zero at the masked columns"
    how = _masking(node, mask)
    if isinstance(how, str):
        return how
    off, masked, kept, text = how
    return Causal(mask, off, masked, kept, text)
