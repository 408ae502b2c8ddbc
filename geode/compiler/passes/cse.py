"""Common subexpression elimination."""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from geode.compiler.ir import Graph, Node, Value
from geode.compiler.ops import registry
from geode.compiler.passes.rewrite import (
    RANDOM_OPS,
    SIDE_EFFECT_OPS,
    has_graph_attr,
    is_output,
    node_alive,
    remove_dead_nodes,
    replace_value,
)

#: ops whose two inputs may be swapped (same dtype, symmetric broadcasting)
COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "And", "Or", "Xor", "Equal", "Sum", "Mean"})


def attr_key(value: Any) -> Hashable:
    """A hashable key equal for equal attribute values (arrays compared by content)."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(attr_key(v) for v in value))
    if isinstance(value, bytes):
        return ("bytes", value)
    if isinstance(value, (bool, np.bool_)):
        return ("bool", bool(value))
    if isinstance(value, (int, np.integer)):
        return ("num", int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if math.isnan(f):
            return ("nan",)
        return ("num", int(f)) if f.is_integer() else ("num", f)
    if isinstance(value, str):
        return ("str", value)
    return ("obj", id(value))


def node_key(node: Node) -> Hashable | None:
    """What two nodes must share to compute the same thing (None: never merge)."""
    if node.op_type in RANDOM_OPS or node.op_type in SIDE_EFFECT_OPS or has_graph_attr(node):
        return None
    ins = [None if v is None else id(v) for v in node.inputs]
    if node.op_type in COMMUTATIVE and None not in ins:
        dts = {v.dtype for v in node.inputs if v is not None}
        if len(dts) == 1:
            ins = sorted(ins)
    full = node.attrs
    if registry.has(node.op_type, node.domain):
        full = registry.get(node.op_type, node.domain).full_attrs(node.attrs)
    attrs = tuple(sorted((k, attr_key(v)) for k, v in full.items()))
    return (node.domain or "", node.op_type, tuple(ins), attrs, len(node.outputs))


def constant_key(v: Value) -> Hashable | None:
    """dtype, shape and bytes of a constant (None when it has no data)."""
    if v.data is None:
        return None
    arr = np.asarray(v.data)  # not ascontiguousarray: it makes a 0-d array 1-d
    return (arr.dtype.str, arr.shape, np.ascontiguousarray(arr).tobytes())


def cse(graph: Graph) -> bool:
    """Merge duplicate computations.

    * constants with the same dtype, shape and bytes become one;
    * nodes with the same op type, domain, inputs (after merging) and equal
      attributes (arrays by content; floats by value) become one. Inputs of
      commutative ops (Add, Mul, Max, Min, ...) are compared as a multiset. Random
      ops, ops that write state and ops with subgraphs are never merged.

    When the dropped duplicate was a graph output its name moves to the kept value
    (or to an Identity of it when the kept value already is an output). Returns True
    when anything was merged.
    """
    changed = _merge_constants(graph)
    seen: dict[Hashable, Node] = {}
    for node in graph.toposort():
        key = node_key(node)
        if key is None:
            continue
        first = seen.get(key)
        if first is None or not node_alive(graph, first):
            seen[key] = node
            continue
        for dup, keep in zip(node.outputs, first.outputs):
            replace_value(graph, dup, keep)
        remove_dead_nodes(graph, [node])
        changed = True
    return changed


def _merge_constants(graph: Graph) -> bool:
    seen: dict[Hashable, Value] = {}
    changed = False
    consts = sorted(graph.constants(), key=lambda v: not is_output(graph, v))
    for v in consts:
        key = constant_key(v)
        if key is None:
            continue
        keep = seen.get(key)
        if keep is None:
            seen[key] = v
            continue
        if is_output(graph, v) and is_output(graph, keep):
            continue
        replace_value(graph, v, keep, allow_identity=False)
        graph.remove_value(v)
        changed = True
    return changed
