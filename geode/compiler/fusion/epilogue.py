"""Legality of epilogue fusion: a dense op (MatMul) and the group that consumes its output
as one kernel, the group running on each row panel of the product while it is in cache.

The kernel computes the product ``Y [rows, N]`` a panel of rows at a time (its leading
dims flattened into rows) and runs the group on the panel before the next one, so the
group must be computable one panel of whole rows at a time. Every value the group reads,
computes or writes has one of these roles with respect to ``Y``'s shape ``[..., N]``:

============  ===============================================  ==================
role          shape                                             per panel
============  ===============================================  ==================
``acc``       the product ``Y`` itself                          the panel
``full``      ``Y``'s shape                                     its panel rows
``col``       ``Y``'s leading dims, then 1 (a value per row)    its panel rows
``row``       ``[N]`` or ``[1, ..., 1, N]`` (one row for all)   whole
``brow``      ``[batch..., 1, N]``, batch dims ``Y``'s or 1      its batch's row
``bfull``     ``[batch..., M, N]``, batch dims ``Y``'s or 1      its batch's rows
``scalar``    ``[]`` or all ones                                whole
============  ===============================================  ==================

(``brow`` and ``bfull`` only for a batched product: ``B`` of rank > 2; either may have
fewer batch dims than ``Y``, read as leading 1s like numpy's broadcasting, e.g. a causal
mask ``[M, N]`` against attention scores ``[batch, heads, M, N]``.)

The group qualifies when: ``Y`` is read by the group only (not a graph output);
its domain is ``Y``'s shape and it reduces nothing or only the last axis (keeping it);
its ops are elementwise, broadcasting or reductions (a layout op would mix rows); and
every value it touches has a role. How it runs (panels, or one panel when re-packing the
weights per panel costs more than it saves) is the cost model's call
(:func:`geode.compiler.fusion.profit.epilogue_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from geode.compiler.fusion.causal import Causal
from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.head_views import HeadView
from geode.compiler.fusion.online import OnlineSoftmax
from geode.compiler.fusion.patterns import reduce_axes
from geode.compiler.fusion.summed import (
    hoisted_products,
    narrow_width,
    slice_roles,
    split_roles,
)
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import same_dim

__all__ = [
    "Epilogue",
    "epilogue_legality",
    "StoreAdds",
    "rms_prologue",
    "second_gemm",
    "sibling_candidates",
    "sibling_gemm",
    "store_adds",
    "transposed_a",
    "value_role",
]

_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.REDUCE})


@dataclass
class RmsPrologue:
    """An RMSNorm's scale per row, ``scale = 1 / sqrt(mean(A * A) + eps)`` over ``A``'s last
    axis, read by the epilogue as a ``col`` input (after the row scale's fold,
    ``compiler/fusion/row_scale.py``): the kernel computes it from each panel's rows of
    ``A`` (in cache for the GEMM), so the norm's kernel goes. ``nodes``: ``Mul(A, A)``,
    ``ReduceMean``, ``Add``, ``Sqrt``, then ``Div(1, .)`` or ``Reciprocal``."""

    scale: Value
    eps: float
    nodes: list[Node]


@dataclass
class Epilogue:
    """A dense node fused with the group that consumes its product (and, optionally, the
    MatMul that reads the group's result: attention's ``P @ V``, an MLP's second layer)."""

    dense: Node
    group: Group
    #: role of every value the group touches (by value name): acc, full, col, row, brow,
    #: scalar
    roles: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    #: the group's nodes that do not depend on the product (run before, as their own group)
    hoisted: list[Node] = field(default_factory=list)
    #: the second MatMul (its A is the group's only output), or None
    second: Node | None = None
    #: a MatMul of the same ``A`` whose product is a ``full`` input (computed per panel
    #: beside the product: :func:`sibling_gemm`), or None
    sibling: Node | None = None
    #: the residual ``Add`` after the second MatMul, summed into its product
    #: (:func:`store_adds`), or None
    residual: Node | None = None
    #: the bias ``Add`` right after the second MatMul (a Linear layer's), added to each of
    #: its sums before the residual (:func:`store_adds`), or None
    bias: Node | None = None
    #: the Transpose (of the last two axes) that makes the dense node's ``A``, read in
    #: place by the GEMM (:func:`transposed_a`), or None
    a_transpose: Node | None = None
    #: an RMSNorm's scale per row of ``A``, computed by the kernel from ``A``'s panel
    #: (:func:`rms_prologue`), or None
    prologue: RmsPrologue | None = None
    #: operands read (``"A"``, ``"B"``, ``"V"``) and the result written (``"O"``) in place
    #: as heads of a wider array (:mod:`geode.compiler.fusion.head_views`)
    views: dict[str, HeadView] = field(default_factory=dict)
    #: a proven causal mask: each panel of rows computes only the key columns it sees
    #: (:mod:`geode.compiler.fusion.causal`), or None
    causal: Causal | None = None
    #: a narrow epilogue's domain width (column slices of the product,
    #: :mod:`geode.compiler.fusion.summed`), or None: the product's width
    width: int | None = None
    #: a MatMul of another ``A`` of the same rows whose product the epilogue reads,
    #: computed per panel beside the product (:func:`~geode.compiler.fusion.summed.
    #: partner_gemm`), or None
    partner: Node | None = None
    #: attention computed a block of key columns at a time with an online softmax
    #: (:mod:`geode.compiler.fusion.online`), or None
    online: OnlineSoftmax | None = None
    #: a symbolic key length: the key-tiled form's body beside the row panels' in one
    #: entry, chosen per call by the key length (``profit.online_switch_keys``), or None
    switch: OnlineSoftmax | None = None

    @property
    def a_value(self) -> Value:
        """The value the GEMM reads as ``A``: the MatMul's, or its Transpose's input."""
        if self.a_transpose is not None:
            return self.a_transpose.inputs[0]
        return self.dense.inputs[0]

    @property
    def batched(self) -> bool:
        """Whether the product is a batch of matrices (``B`` of rank > 2)."""
        return len(self.dense.inputs[1].shape) > 2


def _batch_broadcast(shape: tuple, ys: tuple, rows: object) -> bool:
    """``[batch..., rows, N]`` whose batch dims are ``Y``'s or 1, with fewer batch dims than
    ``Y`` read as leading 1s (numpy's broadcasting: a causal mask ``[M, N]`` against scores
    ``[batch, heads, M, N]``); checked after ``full`` and ``row``, which it would also
    match."""
    if len(shape) < 2 or len(shape) > len(ys) or len(ys) < 3:
        return False
    if not (same_dim(shape[-1], ys[-1]) and same_dim(shape[-2], rows)):
        return False
    batch = list(zip(shape[:-2], ys[len(ys) - len(shape) : -2]))
    return all(same_dim(a, b) or same_dim(a, 1) for a, b in batch)


def value_role(v: Value, y: Value, batched: bool = False, width: int | None = None) -> str | None:
    """``v``'s role with respect to the product ``y`` (see the module docstring); ``brow``
    only for a batched product; ``part`` (``y``'s rows, ``width`` columns) only in a narrow
    epilogue (:mod:`geode.compiler.fusion.summed`)."""
    if v is y:
        return "acc"
    if v.shape is None or y.shape is None:
        return None
    shape, ys = tuple(v.shape), tuple(y.shape)
    if width is not None and _is_part(shape, ys, width):
        return "part"
    if len(shape) == len(ys) and all(same_dim(a, b) for a, b in zip(shape, ys)):
        return "full"
    if (
        len(shape) == len(ys)
        and same_dim(shape[-1], 1)
        and all(same_dim(a, b) for a, b in zip(shape[:-1], ys[:-1]))
    ):
        return "col"  # before scalar: with one row, a value per row is what a reduction makes
    if all(same_dim(d, 1) for d in shape):
        return "scalar"
    if (
        len(shape) <= len(ys)
        and same_dim(shape[-1], ys[-1])
        and all(same_dim(d, 1) for d in shape[:-1])
    ):
        return "row"
    if batched and _batch_broadcast(shape, ys, 1):
        return "brow"
    if batched and _batch_broadcast(shape, ys, ys[-2]):
        return "bfull"
    return None


def _is_part(shape: tuple, ys: tuple, width: int) -> bool:
    """``shape`` is ``ys``'s leading dims, then ``width`` columns."""
    return (
        len(shape) == len(ys)
        and same_dim(shape[-1], width)
        and all(same_dim(a, b) for a, b in zip(shape[:-1], ys[:-1]))
    )


def _node_ok(node: Node, rank: int) -> str | None:
    """Why ``node`` cannot run per panel, or None."""
    if not registry.has(node.op_type, node.domain):
        return f"{node.op_type} is not registered"
    kind = registry.get(node.op_type, node.domain).kind
    if kind not in _KINDS:
        return f"{node.op_type} ({kind.value}) is not elementwise or a reduction"
    if kind is OpKind.REDUCE:
        axes = reduce_axes(node)
        if axes is None or set(axes) != {rank - 1}:
            return f"{node.op_type} {node.name} reduces other than the last axis"
        if not int(node.attrs.get("keepdims", 1)):
            return f"{node.op_type} {node.name} drops the reduced axis"
    return None


def split_dependent(
    group: Group, y: Value, also: tuple[Value, ...] = ()
) -> tuple[list[Node], list[Node]]:
    """The group's nodes that depend on the product ``y`` (or on a value of ``also``: the
    products of sibling GEMMs, computed per panel beside ``y``) and those that do not (in
    order)."""
    reached = {id(y), *(id(v) for v in also)}
    dep, rest = [], []
    for node in group.nodes:
        if any(v is not None and id(v) in reached for v in node.inputs):
            dep.append(node)
            reached.update(id(o) for o in node.outputs)
        else:
            rest.append(node)
    return dep, rest


def _hoistable(rest: list[Node], graph: Graph) -> str | None:
    """Why the independent nodes cannot run first as a group of their own, or None: their
    values read outside them must share one shape (one loop domain)."""
    names = {n.name for n in rest}
    outs = [
        o
        for n in rest
        for o in n.outputs
        if any(c.name not in names for c in o.consumers) or any(o is g for g in graph.outputs)
    ]
    shapes = {tuple(str(d) for d in (o.shape or ())) for o in outs}
    if len(shapes) > 1:
        return "the nodes that do not read the product have outputs of several shapes"
    return None


def epilogue_legality(
    dense: Node, group: Group, graph: Graph, siblings: tuple[Value, ...] = ()
) -> Epilogue | str:
    """The fused epilogue of ``dense`` (a native MatMul) and ``group``, or why not. Nodes of
    the group that depend neither on the product nor on a value of ``siblings`` (products
    of MatMuls of the same ``A``, candidates for :func:`sibling_gemm`: a gated MLP's up
    product, maybe scaled per row before the gate reads it) are hoisted
    (``Epilogue.hoisted``); the epilogue's group is then the rest."""
    if dense.op_type != "MatMul" or len(dense.outputs) != 1:
        return f"{dense.op_type} has no epilogue form"
    y = dense.outputs[0]
    b = dense.inputs[1]
    if y.shape is None or len(y.shape) < 2 or b is None or b.shape is None:
        return "the product's shape is unknown"
    batched = len(b.shape) > 2
    if any(o is y for o in graph.outputs):
        return "the product is a graph output"
    names = group.names
    if any(c.name not in names for c in y.consumers):
        return "the product is read outside the group"
    rank = len(y.shape)
    width = narrow_width(group, y, batched)
    if isinstance(width, str):
        return width
    if group.levels:
        return "the group is a reduce tree"
    if group.branches:
        return "the group is a stitch (a row and a column reduction side by side)"
    if group.axes and set(group.axes) != {rank - 1}:
        return "the group reduces other than the last axis"
    _, rest = split_dependent(group, y, siblings)
    roles: dict[str, str] = {}
    hoisted = rest  # they run first, as a group of their own; their results become inputs
    if hoisted:
        why = _hoistable(hoisted, graph)
        if why:
            return why
    kept = [n for n in group.nodes if n not in hoisted]
    for node in kept:
        why = _node_roles(node, roles, y, batched, width)
        if why:
            return why
    if "acc" not in roles.values():
        return "the group does not read the product"
    sub = Group(group.id, kept, group.domain, group.axes)
    why = "per-panel epilogue: elementwise and row reductions"
    if width is not None:
        why = f"per-panel epilogue: elementwise on {width}-column slices of the product"
    return Epilogue(dense, sub, roles, why, hoisted, width=width)


def _node_roles(
    node: Node, roles: dict[str, str], y: Value, batched: bool, width: int | None
) -> str | None:
    """Record the roles of ``node``'s values in ``roles``, or say why it cannot run per
    panel (a narrow epilogue's column Slices: :func:`~geode.compiler.fusion.summed.
    slice_roles`)."""
    rank = len(y.shape)
    if width is not None and node.op_type in ("Slice", "Split") and not node.domain:
        for v in node.inputs[:1]:
            role = value_role(v, y, batched, width)
            if role is not None:
                roles[v.name] = role
        cut = slice_roles if node.op_type == "Slice" else split_roles
        return cut(node, roles, rank, y.shape[-1], width)
    why = _node_ok(node, rank)
    if why:
        return why
    for v in [*node.inputs, *node.outputs]:
        if v is None:
            continue
        role = value_role(v, y, batched, width)
        if role is None:
            return f"value {v.name} of shape {list(v.shape or [])} has no per-panel role"
        roles[v.name] = role
    return None


def second_gemm(ep: Epilogue, graph: Graph, is_native: object) -> Node | str:
    """The MatMul that reads the epilogue's only result as its ``A`` (``P @ V``), when its
    product can be computed per panel too, else why not. ``is_native(node)`` says whether
    a MatMul runs natively."""
    outs = ep.group.outputs(graph)
    if len(outs) != 1:
        return "the epilogue has several results"
    p = outs[0]
    if any(o is p for o in graph.outputs) or len(p.consumers) != 1:
        return "the epilogue's result is read more than once"
    mm = p.consumers[0]
    if mm.op_type != "MatMul" or mm.inputs[0] is not p or not is_native(mm):  # type: ignore[operator]
        return "the epilogue's result does not feed a native MatMul as its A"
    if ep.roles.get(p.name) != "full":
        return "the second MatMul's A is not a full panel"
    v, y, o = mm.inputs[1], ep.dense.outputs[0], mm.outputs[0]
    if v.shape is None or o.shape is None or len(v.shape) < 2:
        return "the second MatMul's shapes are unknown"
    if not same_dim(v.shape[-2], y.shape[-1]):
        return "the second MatMul's depth is not the product's width"
    if not ep.batched and len(v.shape) != 2:
        return "a batched second MatMul after an unbatched product"
    if ep.batched:
        nb = len(y.shape) - 2
        vb = (1,) * (nb - (len(v.shape) - 2)) + tuple(v.shape[:-2])
        if len(v.shape) - 2 > nb or not all(
            same_dim(a, b) or same_dim(a, 1) for a, b in zip(vb, y.shape[:-2])
        ):
            return "the second MatMul's batch dims do not broadcast to the product's"
    want = (*y.shape[:-1], v.shape[-1])
    if len(o.shape) != len(want) or not all(same_dim(a, b) for a, b in zip(o.shape, want)):
        return "the second MatMul's result is not the product's rows times V's columns"
    return mm


def sibling_candidates(ep: Epilogue, is_native: object) -> tuple[Value, ...]:
    """Products of other native MatMuls of the dense node's ``A`` that the epilogue's hoisted
    nodes read (a gated MLP's up product, scaled per row before the gate's epilogue reads
    it): :func:`epilogue_legality` given them keeps those nodes in the epilogue, and
    :func:`sibling_gemm` may then compute the product per panel. ``is_native(node)`` says
    whether a MatMul runs natively."""
    a = ep.dense.inputs[0]
    for v, prod in hoisted_products(ep, is_native):
        if prod.inputs[0] is a:
            return (v,)
    return ()


def sibling_gemm(ep: Epilogue, graph: Graph, is_native: object) -> Node | str:
    """A MatMul that reads the dense node's ``A`` too, whose product is a ``full`` input
    of the epilogue read by it alone (a gated MLP's ``up`` beside its ``gate``): the
    kernel can compute that product per panel from the same rows of ``A`` (the panel's
    ``A`` read twice while in cache), so it never goes to memory. Else why not.
    ``is_native(node)`` says whether a MatMul runs natively."""
    if ep.batched:
        return "the product is batched"
    a, b = ep.dense.inputs
    found = "no full input of the epilogue is another MatMul of the same A"
    for v in ep.group.inputs():
        prod = v.producer
        if ep.roles.get(v.name) != "full" or prod is None or prod is ep.dense:
            continue
        if prod.op_type != "MatMul" or prod.inputs[0] is not a:
            continue
        w = prod.inputs[1]
        if (
            w.shape is None
            or len(w.shape) != 2
            or not all(same_dim(x, y) for x, y in zip(w.shape, b.shape))
        ):
            found = f"{prod.name}'s weight is not a matrix of B's shape"
            continue
        if any(o is v for o in graph.outputs) or any(
            c.name not in ep.group.names for c in v.consumers
        ):
            found = f"{prod.name}'s product is read outside the epilogue"
            continue
        if not is_native(prod):  # type: ignore[operator]
            found = f"{prod.name} is not a native MatMul"
            continue
        return prod
    return found


@dataclass(frozen=True)
class StoreAdds:
    """What the second GEMM adds to its sums as it stores them: a bias ``Add`` (a row of
    ``D`` values, a Linear layer's), then a residual ``Add`` (a value of the product's
    shape); either may be None, not both."""

    bias: Node | None
    residual: Node | None

    @property
    def last(self) -> Node:
        """The ``Add`` whose result the second GEMM then writes."""
        return self.residual if self.residual is not None else self.bias  # type: ignore[return-value]


def _other(add: Node, v: Value) -> Value | str:
    """The ``Add``'s input that is not ``v`` (which it reads once), or why not."""
    ins = list(add.inputs)
    if add.op_type != "Add" or len(ins) != 2 or sum(1 for x in ins if x is v) != 1:
        return "the Add does not read the second product once"
    return ins[1] if ins[0] is v else ins[0]


def _same_shape(shape: object, want: tuple) -> bool:
    return (
        shape is not None
        and len(shape) == len(want)  # type: ignore[arg-type]
        and all(same_dim(x, y) for x, y in zip(shape, want))  # type: ignore[call-overload]
    )


def _is_bias(b: Value, o: Value) -> bool:
    """``b`` is ``D`` values of ``o``'s type, one per column (``[D]`` or ``[1, ..., D]``)."""
    shape = b.shape
    if shape is None or not shape or len(shape) > len(o.shape) or b.dtype != o.dtype:
        return False
    return same_dim(shape[-1], o.shape[-1]) and all(same_dim(d, 1) for d in shape[:-1])


def _read_once(v: Value, graph: Graph) -> bool:
    return not any(x is v for x in graph.outputs) and len(v.consumers) == 1


def store_adds(ep: Epilogue, group: Group, graph: Graph) -> StoreAdds | str:
    """The ``Add`` nodes that ``group`` (the only reader of the second MatMul's result
    ``O``) is, when the second GEMM can add them to its sums as it stores them: a bias
    (``O + b``, ``b`` of ``D`` values: the GEMM adds ``b`` to each sum), a residual (``O +
    R``, ``R`` of ``O``'s exact shape and type: the GEMM starts from ``R``), or a bias then
    a residual (``(O + b) + R``, the bias's result read by the residual's ``Add`` alone).
    The same bits as adding after: each element is its sum, plus the bias, plus ``R``.
    Else why not."""
    if ep.second is None:
        return "no second MatMul"
    o = ep.second.outputs[0]
    if not _read_once(o, graph):
        return "the second product is read more than once"
    nodes = group.nodes
    if not 1 <= len(nodes) <= 2 or any(n.op_type != "Add" for n in nodes):
        return "the second product's reader is not one Add (or a bias Add, then one Add)"
    first = _other(nodes[0], o)
    if isinstance(first, str):
        return first
    bias = nodes[0] if _is_bias(first, o) else None
    if len(nodes) == 2:
        if bias is None:
            return "the first Add after the second product is not a bias of D values"
        mid = nodes[0].outputs[0]
        if not _read_once(mid, graph):
            return "the bias Add's result is read more than once"
        r = _other(nodes[1], mid)
        if isinstance(r, str):
            return "the second Add does not read the bias Add's result once"
    elif bias is not None:
        out = nodes[0].outputs[0]
        if out.dtype != o.dtype or not _same_shape(out.shape, tuple(o.shape)):
            return "the bias Add's result is not the second product's shape"
        return StoreAdds(nodes[0], None)
    else:
        r = first
    add = nodes[-1]
    out = add.outputs[0]
    if r.dtype != o.dtype or out.dtype != o.dtype:
        return "the residual's type is not the product's"
    for shape in (r.shape, out.shape):
        if not _same_shape(shape, tuple(o.shape)):
            return "the residual's shape is not the second product's"
    return StoreAdds(bias, add)


def transposed_a(ep: Epilogue, graph: Graph) -> Node | str:
    """The Transpose of the last two axes whose result is the dense node's ``A`` and is
    read by it alone, which the GEMM can read in place (``X [..., K, R]`` read as ``A
    [..., R, K]``: each row of ``A`` a column of ``X``; the same bits as the copy), else
    why not. An unbatched product (``B`` a matrix) without a sibling GEMM only."""
    a = ep.dense.inputs[0]
    t = a.producer
    if t is None or t.op_type != "Transpose":
        return "A is not a Transpose's result"
    x = t.inputs[0]
    if x.shape is None or len(x.shape) < 2 or a.shape is None:
        return "the Transpose's input shape is unknown"
    r = len(x.shape)
    perm = [int(p) for p in t.attrs.get("perm", list(reversed(range(r))))]
    if perm != [*range(r - 2), r - 1, r - 2]:
        return f"the Transpose's perm {perm} does not swap the last two axes alone"
    if any(o is a for o in graph.outputs) or len(a.consumers) != 1:
        return "the Transpose's result is read by more than the MatMul"
    if ep.batched:
        return "the product is batched"
    if ep.sibling is not None:
        return "a sibling GEMM reads A too"
    if ep.partner is not None:
        return "a partner GEMM is computed beside it"
    if x.dtype != a.dtype:
        return "the Transpose changes the type"
    return t


def _one_use(v: Value, graph: Graph) -> bool:
    return len(v.uses) == 1 and not any(o is v for o in graph.outputs)


def _scalar(v: Value | None) -> float | None:
    """The value of a constant float scalar (any rank, one element), else None."""
    if v is None or not v.is_constant or v.data is None:
        return None
    data = np.asarray(v.data)
    if data.size != 1 or data.dtype.kind != "f":
        return None
    return float(data.reshape(-1)[0])


def _rms_chain(c: Value, a: Value, graph: Graph) -> tuple[float, list[Node]] | str:
    """``(eps, nodes)`` when ``c = 1 / sqrt(mean(a * a, last axis) + eps)``, each
    intermediate read once, else why not."""
    p = c.producer
    if p is not None and p.op_type == "Reciprocal":
        s = p.inputs[0]
    elif p is not None and p.op_type == "Div" and _scalar(p.inputs[0]) == 1.0:
        s = p.inputs[1]
    else:
        return f"{c.name} is not a reciprocal"
    sq = s.producer
    if sq is None or sq.op_type != "Sqrt" or not _one_use(s, graph):
        return f"{c.name} is not the reciprocal of a square root"
    t = sq.inputs[0]
    add = t.producer
    if add is None or add.op_type != "Add" or not _one_use(t, graph):
        return f"{c.name} is not 1 / sqrt(m + eps)"
    eps = _scalar(add.inputs[1])
    ms = add.inputs[0]
    if eps is None:
        eps, ms = _scalar(add.inputs[0]), add.inputs[1]
    rm = ms.producer
    if eps is None or rm is None or rm.op_type != "ReduceMean" or not _one_use(ms, graph):
        return f"{c.name} is not 1 / sqrt(mean + eps)"
    rank = len(a.shape)
    axes = reduce_axes(rm)
    if axes is None or set(axes) != {rank - 1} or not int(rm.attrs.get("keepdims", 1)):
        return f"{rm.name} is not a mean over the last axis, kept"
    sqr = rm.inputs[0]
    mul = sqr.producer
    if mul is None or mul.op_type != "Mul" or not _one_use(sqr, graph):
        return f"{rm.name} does not average a square"
    if mul.inputs[0] is not a or mul.inputs[1] is not a:
        return f"{rm.name} does not average the squares of the GEMM's A"
    return eps, [mul, rm, add, sq, p]


def rms_prologue(ep: Epilogue, graph: Graph) -> RmsPrologue | str | None:
    """The RMSNorm scale per row of the dense node's ``A`` that the epilogue reads as a
    ``col`` input, which the kernel can compute from ``A``'s panel (:class:`RmsPrologue`),
    or why not; None when no ``col`` input is computed from ``A`` by a mean of its
    squares (:func:`_rms_chain` says why a candidate is not). The scale must be read by
    the epilogue only and be of ``A``'s float type."""
    if ep.batched:
        return None
    a = ep.dense.inputs[0]
    if a.shape is None or len(a.shape) < 2:
        return None
    if ep.a_transpose is not None:
        return "A is read transposed in place (the panel's rows are not contiguous)"
    for v in ep.group.inputs():
        if ep.roles.get(v.name) != "col" or v.producer is None:
            continue
        found = _rms_chain(v, a, graph)
        if isinstance(found, str):
            continue
        if any(o is v for o in graph.outputs) or any(
            c.name not in ep.group.names for c in v.consumers
        ):
            return f"the scale {v.name} is read outside the epilogue"
        if v.dtype != a.dtype:
            return f"the scale {v.name} is not of A's type"
        return RmsPrologue(v, found[0], found[1])
    return None
