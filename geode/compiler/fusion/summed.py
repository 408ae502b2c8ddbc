"""Legality of two GEMM epilogue forms that a recurrent cell's step needs (an LSTM or GRU
cell: ``gates = x Wx [+ b] + h Wh``, then the gates sliced out of the sum's columns).

**Column slices** (a *narrow* epilogue). An epilogue group whose domain is the product
``Y [..., N]``'s rows times a constant ``W < N`` columns, reading ``Y`` (or a ``full``
value) through ``Slice`` nodes of the last axis (constant starts and ends, step 1) or a
``Split`` of it into equal pieces of ``W`` (``torch.chunk``'s export of the gates). Its
values of the domain's shape have the role ``part`` (``Y``'s rows, ``W`` columns: a panel
reads its rows); the Slices' starts, ends and axes are ``param`` (constants kept as they
are). No reductions (the domain is not the product's). Unbatched products only.

**A summed partner GEMM**. ``Y2 = A2 @ B2``, a ``full`` input of the epilogue read by it
alone, ``A2`` another value than the dense node's ``A`` but of the same rows (its shape
but the last dim), ``B2`` a matrix of ``N`` columns: the kernel computes ``Y2``'s panel
from the same rows of ``A2`` right after the product's, and the epilogue reads it from
the thread's cache, so ``Y2`` never goes to memory and its GEMM is no step of its own.
The epilogue's ops are unchanged (``(A B + b) + A2 B2`` in the order the model wrote it):
the same bits as running the GEMMs apart. Both weights constant and packed once (the
caller checks the packing; :func:`partner_gemm` the rest).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from geode.compiler.fusion.groups import Group
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.shapes import same_dim

__all__ = [
    "COLUMN_SLICES",
    "hoisted_products",
    "narrow_width",
    "partner_candidates",
    "partner_gemm",
    "slice_roles",
    "split_roles",
]


#: a switch for measuring: off, no epilogue takes column slices of its product (a module
#: switch, not an option: the results are the same, only the steps differ)
COLUMN_SLICES = True


def narrow_width(group: Group, y: Value, batched: bool) -> int | str | None:
    """The constant width ``W`` of a narrow epilogue's domain (``Y``'s leading dims, then
    ``W < N``), None when the domain is ``Y``'s shape, else why the domain cannot be
    computed per panel."""
    dom, ys = tuple(group.domain), tuple(y.shape)
    if len(dom) == len(ys) and all(same_dim(a, b) for a, b in zip(dom, ys)):
        return None
    no = "the group's domain is not the product's shape"
    if len(dom) != len(ys) or not all(same_dim(a, b) for a, b in zip(dom[:-1], ys[:-1])):
        return no
    w, n = dom[-1], ys[-1]
    if not (isinstance(w, int) and isinstance(n, int) and 0 < w < n):
        return no
    if not COLUMN_SLICES:
        return f"{no} (column slices switched off)"
    if batched:
        return f"{no} (column slices of a batched product)"
    if group.axes or group.levels or group.branches:
        return f"{no} (column slices with a reduction)"
    return w


def _const_ints(v: Value | None) -> list[int] | None:
    if v is None or not v.is_constant or v.data is None:
        return None
    data = np.asarray(v.data)
    if data.dtype.kind not in "iu" or data.ndim != 1:
        return None
    return [int(x) for x in data]


def _slice_why(node: Node, rank: int, n: int, w: int) -> str | None:
    """Why ``node`` (a Slice in a narrow epilogue) is not ``W`` columns of a value of ``N``
    columns cut out along the last axis, constant bounds and step 1, or None."""
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends, axes, steps = (_const_ints(v) for v in ins[1:5])
    if starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
        return f"Slice {node.name}: its bounds are not one constant start and end"
    if axes is None or len(axes) != 1 or axes[0] not in (rank - 1, -1):
        return f"Slice {node.name} does not cut the last axis alone"
    if ins[4] is not None and steps != [1]:
        return f"Slice {node.name} steps other than 1"
    lo, hi = starts[0], ends[0]
    lo, hi = (lo + n if lo < 0 else lo), (hi + n if hi < 0 else hi)
    if not (lo >= 0 and min(hi, n) - lo == w):
        return f"Slice {node.name} does not cut {w} of its {n} columns"
    return None


def slice_roles(node: Node, roles: dict[str, str], rank: int, n: int, w: int) -> str | None:
    """Record the roles of a narrow epilogue's Slice (its data ``acc`` or ``full``, its
    bounds ``param``, its result ``part``) in ``roles``, or say why it does not qualify."""
    why = _slice_why(node, rank, n, w)
    if why:
        return why
    data = node.inputs[0]
    if roles.get(data.name) not in ("acc", "full"):
        return f"Slice {node.name} does not cut the product or a value of its shape"
    for v in node.inputs[1:]:
        if v is not None:
            roles[v.name] = "param"
    roles[node.outputs[0].name] = "part"
    return None


def _split_why(node: Node, rank: int, n: int, w: int) -> str | None:
    """Why ``node`` (a Split in a narrow epilogue) does not cut a value of ``N`` columns
    into ``N / W`` pieces of ``W`` along the last axis, or None."""
    axis = int(node.attrs.get("axis", 0))
    if axis not in (rank - 1, -1):
        return f"Split {node.name} does not cut the last axis"
    sizes = _const_ints(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    if sizes is None and "split" in node.attrs:
        sizes = [int(x) for x in node.attrs["split"]]
    if sizes is None:
        sizes = [n // len(node.outputs)] * len(node.outputs) if n % len(node.outputs) == 0 else []
    if not sizes or any(x != w for x in sizes) or w * len(sizes) != n:
        return f"Split {node.name} does not cut its {n} columns into pieces of {w}"
    return None


def split_roles(node: Node, roles: dict[str, str], rank: int, n: int, w: int) -> str | None:
    """Record the roles of a narrow epilogue's Split (its data ``acc`` or ``full``, its
    sizes ``param``, its results ``part``: ``torch.chunk``'s export of the gates) in
    ``roles``, or say why it does not qualify."""
    why = _split_why(node, rank, n, w)
    if why:
        return why
    if roles.get(node.inputs[0].name) not in ("acc", "full"):
        return f"Split {node.name} does not cut the product or a value of its shape"
    for v in node.inputs[1:]:
        if v is not None:
            roles[v.name] = "param"
    for o in node.outputs:
        roles[o.name] = "part"
    return None


def _same_rows(a: Value, a2: Value) -> bool:
    sa, s2 = a.shape, a2.shape
    if sa is None or s2 is None or len(sa) != len(s2) or len(sa) < 2:
        return False
    return all(same_dim(x, y) for x, y in zip(sa[:-1], s2[:-1]))


def _partner_why(ep: Any, prod: Node, v: Value, graph: Graph, is_native: Any) -> str | None:
    """Why ``prod`` (whose product ``v`` the epilogue reads as ``full``) cannot be the
    partner GEMM, or None."""
    a, b = ep.dense.inputs
    a2, b2 = prod.inputs[0], prod.inputs[1]
    if a2 is a:
        return f"{prod.name} reads the same A (a sibling, not a partner)"
    if not _same_rows(a, a2):
        return f"{prod.name}'s A is not of the same rows as {ep.dense.name}'s"
    if a2.dtype != a.dtype or b2.dtype != b.dtype or v.dtype != ep.dense.outputs[0].dtype:
        return f"{prod.name}'s types are not {ep.dense.name}'s"
    if b2.shape is None or len(b2.shape) != 2 or not same_dim(b2.shape[-1], b.shape[-1]):
        return f"{prod.name}'s weight is not a matrix of B's columns"
    if not same_dim(b2.shape[0], a2.shape[-1]):
        return f"{prod.name}'s weight's rows are not its A's depth"
    if not (b.is_constant and b2.is_constant):
        return "both weights must be constants"
    if any(o is v for o in graph.outputs) or any(c.name not in ep.group.names for c in v.consumers):
        return f"{prod.name}'s product is read outside the epilogue"
    if not is_native(prod):
        return f"{prod.name} is not a native MatMul"
    return None


def partner_gemm(ep: Any, graph: Graph, is_native: Any) -> Node | str:
    """The MatMul of another ``A`` of the same rows whose product is a ``full`` input of
    the epilogue ``ep`` (an :class:`~geode.compiler.fusion.epilogue.Epilogue`) read by it
    alone: its panel can be computed in the kernel beside the product's (see the module
    docstring). Else why not. ``is_native(node)`` says whether a MatMul runs natively."""
    if ep.batched:
        return "the product is batched"
    if ep.sibling is not None or ep.second is not None:
        return "the epilogue has a sibling or a second GEMM"
    found = "no full input of the epilogue is another MatMul's product"
    for v in ep.group.inputs():
        prod = v.producer
        if ep.roles.get(v.name) != "full" or prod is None or prod is ep.dense:
            continue
        if prod.op_type != "MatMul" or len(prod.inputs) != 2:
            continue
        why = _partner_why(ep, prod, v, graph, is_native)
        if why is None:
            return prod
        found = why
    return found


def hoisted_products(ep: Any, is_native: Any) -> Iterator[tuple[Value, Node]]:
    """The products of native MatMuls other than the dense node's that the epilogue's
    hoisted nodes read, with their MatMuls, in the order the nodes read them: the
    candidates for a sibling GEMM (the same ``A``) and a partner GEMM (another ``A``).
    ``is_native(node)`` says whether a MatMul runs natively."""
    for node in ep.hoisted:
        for v in node.inputs:
            prod = None if v is None else v.producer
            if (
                prod is not None
                and prod is not ep.dense
                and prod.op_type == "MatMul"
                and is_native(prod)
            ):
                yield v, prod


def partner_candidates(ep: Any, is_native: Any) -> tuple[Value, ...]:
    """The product of another native MatMul, of another ``A`` of the same rows, that the
    epilogue's hoisted nodes read (an LSTM cell's ``x Wx + b`` beside ``h Wh``):
    :func:`~geode.compiler.fusion.epilogue.epilogue_legality` given it keeps those nodes
    in the epilogue, and :func:`partner_gemm` may then compute the product per panel."""
    if ep.batched:
        return ()
    a = ep.dense.inputs[0]
    for v, prod in hoisted_products(ep, is_native):
        if prod.inputs[0] is not a and _same_rows(a, prod.inputs[0]):
            return (v,)
    return ()
