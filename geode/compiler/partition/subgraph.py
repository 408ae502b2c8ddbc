"""A part of a graph as a graph of its own (GE's BuildSubgraphWithNodes).

The stage partitioner (:mod:`~geode.compiler.partition.stages`) and the incremental
partitioner (:mod:`~geode.compiler.partition.binary`) cut a graph into parts that
compile and run apart: :func:`extract` copies some of its nodes into a new graph whose
inputs are the values those nodes read from outside (graph inputs, or values other
parts produce; named as before, with the same symbolic shapes), whose constants and
variables are the same, and whose outputs are the values the caller names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from geode.compiler.ir import Graph, TensorDesc, Value, ValueKind
from geode.compiler.ops import state
from geode.errors import GraphError
from geode.lazy import sympy

__all__ = ["extract", "with_input_shapes"]


def _dim(d: object) -> object:
    """A dim as :meth:`Graph.input` takes it: an int, a symbol's name, or an expression."""
    return d.name if isinstance(d, sympy.Symbol) else d


def extract(graph: Graph, names: Collection[str], outputs: Sequence[str], name: str) -> Graph:
    """A new graph of the nodes of ``graph`` named in ``names`` (in graph order), reading
    what they take from outside as inputs (in order of first use), its outputs the
    values named ``outputs``. GraphError when a node writes a variable (its write would
    land in one part while others read the variable)."""
    sub = Graph(name)
    sub.opset = graph.opset
    vmap: dict[int, Value] = {}

    def value(v: Value) -> Value:
        if id(v) in vmap:
            return vmap[id(v)]
        if v.kind is ValueKind.CONSTANT:
            nv = sub.constant(v.data, v.name)
        elif v.kind is ValueKind.VARIABLE:
            nv = (
                sub.variable(v.data, v.name)
                if v.data is not None
                else sub.variable(name=v.name, shape=list(v.shape), dtype=v.dtype)
            )
        else:
            shape = None if v.shape is None else [_dim(d) for d in v.shape]
            nv = sub.input(v.name, shape, v.dtype)
            nv.sym_value = v.sym_value
        vmap[id(v)] = nv
        return nv

    for node in graph.nodes:
        if node.name not in names:
            continue
        if state.is_write(node) or state.is_var_ref(node):
            raise GraphError(
                f"{node.where} writes a variable: a graph cut into parts (stages, an "
                "incremental compile) cannot write variables"
            )
        ins = [None if v is None else value(v) for v in node.inputs]
        new = sub.add_node(
            node.op_type,
            ins,
            node.attrs,
            n_outputs=len(node.outputs),
            name=node.name,
            domain=node.domain,
            output_names=[o.name for o in node.outputs],
        )
        for old, o in zip(node.outputs, new.outputs):
            vmap[id(old)] = o
    by_name = {v.name: v for v in graph.values.values()}
    for out in outputs:
        sub.outputs.append(value(by_name[out]))
    return sub


def with_input_shapes(graph: Graph, shapes: Mapping[str, Iterable[int]]) -> Graph:
    """A copy of ``graph`` whose inputs named in ``shapes`` have those static shapes (the
    other values' shapes follow when it is compiled)."""
    g = graph.copy()
    for v in g.inputs:
        if v.name in shapes:
            v.desc = TensorDesc(v.dtype, tuple(int(d) for d in shapes[v.name]), v.desc.format)
    return g
