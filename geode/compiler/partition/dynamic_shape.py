"""The known/unknown-shape split (GE's DynamicShapePartitioner), adapted to symbols.

A value's shape is *known* when its dims depend only on the symbols the graph's inputs
bind: the executor sizes it from the input shapes before anything runs, and it gets a
buffer in the static memory plan (the arena). A node is *unknown-shape* when, for one
of these reasons (:func:`unknown_reasons`, shown by ``model.explain()``):

* an output has unknown rank;
* it runs on the host engine (shape arithmetic and data-dependent ops, GE's Host CPU
  rule);
* an output's size depends on its input *values* (NonZero, Unique, a Reshape to a
  computed shape): it introduces a symbol that only its result binds (``_nnz1``);
* it reads or writes a value with such a dim, bound at run time by an earlier node;
* it lies on a path between two unknown-shape nodes (GE's path absorption: a dynamic
  region is one piece, with no static hole that would split it in two).

What that changes at run time: an unknown-shape node's kernel still compiles to native
code, with its dims as arguments the step computes from the symbols bound by the
arrays produced before it (``Slot.binds``); constraints and broadcasts over those
symbols are checked right after the step that binds them (``Plan.checks_after``); its
values whose size depends on run-time values are allocated when produced, outside the
arena.

Partitions (:func:`cluster`) follow GE's merge rules: every node starts as its own
cluster; adjacent clusters of the same kind merge when the merge creates no cycle
between clusters (no other path between them through a cluster of the other kind).
"""

from __future__ import annotations

from collections.abc import Mapping

from geode.compiler.ir import Graph, Node
from geode.compiler.partition.clusters import merge_clusters
from geode.compiler.shapes import free_symbols
from geode.lazy import sympy

__all__ = ["KNOWN", "UNKNOWN", "cluster", "input_symbols", "symbol_origins", "unknown_reasons"]

KNOWN = "known-shape"
UNKNOWN = "unknown-shape"


def input_symbols(graph: Graph) -> set[sympy.Symbol]:
    """Symbols bound by the graph's inputs."""
    out: set[sympy.Symbol] = set()
    for v in graph.inputs:
        out |= free_symbols(v.shape)
    return out


def symbol_origins(graph: Graph, bound: set[sympy.Symbol]) -> dict[sympy.Symbol, Node]:
    """Each symbol not bound by the inputs -> the first node (graph order) whose outputs
    hold it while none of its inputs do: the node whose result binds it."""
    origin: dict[sympy.Symbol, Node] = {}
    for node in graph.nodes:
        read: set[sympy.Symbol] = set()
        for v in node.inputs:
            if v is not None and v.shape is not None:
                read |= free_symbols(v.shape)
        for o in node.outputs:
            if o.shape is None:
                continue
            for s in free_symbols(o.shape) - bound - read:
                origin.setdefault(s, node)
    return origin


def _own_reason(
    node: Node, engine: str, bound: set[sympy.Symbol], origin: Mapping[sympy.Symbol, Node]
) -> str | None:
    """Why ``node`` itself is unknown-shape (before path absorption), or None."""
    for o in node.outputs:
        if o.shape is None:
            return f"output {o.name!r} has unknown rank"
    for o in node.outputs:
        late = sorted(free_symbols(o.shape) - bound, key=str)
        mine = [s for s in late if origin.get(s) is node]
        if mine:
            axis = next(i for i, d in enumerate(o.shape) if mine[0] in free_symbols((d,)))
            return (
                f"its output's size depends on its input values: {o.name!r} dim {axis} is "
                f"{mine[0]}, bound when it runs"
            )
    if engine == "host":
        return "runs on the host engine (shape arithmetic or a data-dependent op)"
    for v in [*node.inputs, *node.outputs]:
        if v is None or v.shape is None:
            continue
        late = sorted(free_symbols(v.shape) - bound, key=str)
        if late:
            src = origin.get(late[0])
            by = f" by {src.where}" if src is not None else ""
            return f"{v.name!r} has dim {late[0]}, bound at run time{by}"
    return None


def unknown_reasons(graph: Graph, engine: Mapping[str, str]) -> dict[str, str]:
    """For every unknown-shape node of the sorted ``graph``, why (see the module
    docstring); a node not in the result has a known shape. ``engine``: node name ->
    its engine."""
    bound = input_symbols(graph)
    origin = symbol_origins(graph, bound)
    reasons: dict[str, str] = {}
    for node in graph.nodes:
        why = _own_reason(node, engine.get(node.name, ""), bound, origin)
        if why is not None:
            reasons[node.name] = why
    _absorb_paths(graph, reasons)
    return reasons


def _absorb_paths(graph: Graph, reasons: dict[str, str]) -> None:
    """Mark the known-shape nodes on a path between two unknown-shape ones (GE's path
    absorption), naming the first unknown node above and the first below."""
    above: dict[str, str] = {}  # node -> an unknown node it depends on
    for node in graph.nodes:
        for v in node.inputs:
            p = None if v is None else v.producer
            if p is None:
                continue
            src = p.name if p.name in reasons else above.get(p.name)
            if src is not None:
                above.setdefault(node.name, src)
    below: dict[str, str] = {}  # node -> an unknown node that depends on it
    for node in reversed(graph.nodes):
        for o in node.outputs:
            for user, _ in o.uses:
                dst = user.name if user.name in reasons else below.get(user.name)
                if dst is not None:
                    below.setdefault(node.name, dst)
    for node in graph.nodes:
        n = node.name
        if n not in reasons and n in above and n in below:
            reasons[n] = (
                f"on a path between unknown-shape nodes {above[n]!r} and {below[n]!r} "
                "(a dynamic region is one partition)"
            )


def cluster(graph: Graph, unknown: Mapping[str, bool]) -> list[tuple[str, list[str]]]:
    """Partitions of the sorted ``graph``: ``(kind, node names in graph order)`` in a
    topological order of the partitions. Adjacent clusters of one kind merge unless that
    would make a cycle between clusters (GE's TryMerge, :func:`clusters.merge_clusters`)."""
    kind = {n.name: UNKNOWN if unknown[n.name] else KNOWN for n in graph.nodes}
    return merge_clusters(graph.nodes, kind)
