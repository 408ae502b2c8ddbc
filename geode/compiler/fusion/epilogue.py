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
``scalar``    ``[]`` or all ones                                whole
============  ===============================================  ==================

The group qualifies when: ``Y`` is read by the group only (not a graph output);
its domain is ``Y``'s shape and it reduces nothing or only the last axis (keeping it);
its ops are elementwise, broadcasting or reductions (a layout op would mix rows); and
every value it touches has a role. Whether the fusion pays is the cost model's call
(:func:`geode.compiler.fusion.profit.epilogue_profit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.patterns import reduce_axes
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import dims_equal

__all__ = ["Epilogue", "epilogue_legality", "value_role"]

_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.REDUCE})


@dataclass
class Epilogue:
    """A dense node fused with the group that consumes its product."""

    dense: Node
    group: Group
    #: role of every value the group touches (by value name): acc, full, col, row, scalar
    roles: dict[str, str] = field(default_factory=dict)
    reason: str = ""


def _same(a: object, b: object) -> bool:
    return dims_equal(a, b) is True


def value_role(v: Value, y: Value) -> str | None:
    """``v``'s role with respect to the product ``y`` (see the module docstring)."""
    if v is y:
        return "acc"
    if v.shape is None or y.shape is None:
        return None
    shape, ys = tuple(v.shape), tuple(y.shape)
    if all(_same(d, 1) for d in shape):
        return "scalar"
    if len(shape) == len(ys) and all(_same(a, b) for a, b in zip(shape, ys)):
        return "full"
    if (
        len(shape) == len(ys)
        and _same(shape[-1], 1)
        and all(_same(a, b) for a, b in zip(shape[:-1], ys[:-1]))
    ):
        return "col"
    if len(shape) <= len(ys) and _same(shape[-1], ys[-1]) and all(_same(d, 1) for d in shape[:-1]):
        return "row"
    return None


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


def epilogue_legality(dense: Node, group: Group, graph: Graph) -> Epilogue | str:
    """The fused epilogue of ``dense`` (a native MatMul) and ``group``, or why not."""
    if dense.op_type != "MatMul" or len(dense.outputs) != 1:
        return f"{dense.op_type} has no epilogue form"
    y = dense.outputs[0]
    if y.shape is None or len(y.shape) < 2:
        return "the product's shape is unknown"
    b = dense.inputs[1]
    if b is None or b.shape is None or len(b.shape) != 2:
        return "a batched product (B is not a matrix) has no panel form"
    if any(o is y for o in graph.outputs):
        return "the product is a graph output"
    names = group.names
    if any(c.name not in names for c in y.consumers):
        return "the product is read outside the group"
    rank = len(y.shape)
    if len(group.domain) != rank or not all(_same(a, b) for a, b in zip(group.domain, y.shape)):
        return "the group's domain is not the product's shape"
    if group.axes and set(group.axes) != {rank - 1}:
        return "the group reduces other than the last axis"
    roles: dict[str, str] = {}
    for node in group.nodes:
        why = _node_ok(node, rank)
        if why:
            return why
        for v in [*node.inputs, *node.outputs]:
            if v is None:
                continue
            role = value_role(v, y)
            if role is None:
                return f"value {v.name} of shape {list(v.shape or [])} has no per-panel role"
            roles[v.name] = role
    if "acc" not in roles.values():
        return "the group does not read the product"
    return Epilogue(dense, group, roles, "per-panel epilogue: elementwise and row reductions")
