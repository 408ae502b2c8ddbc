"""The incremental (JIT) cut (GE's BinaryPartitioner).

A graph whose shapes depend on values computed at run time (a NonZero's count, a
Reshape to a computed shape) splits in two: the *head*, every node whose shapes the
inputs' shapes give, up to and including the data-dependent ops (they run, and their
results fix the sizes), and the *tail*, everything downstream of them. The head
compiles once; the tail compiles for the shapes its inputs have at run time, with every
dim static (``geode/incremental.py`` caches it by those shapes). GE's
CheckNodesContainsCycle holds by construction: the tail is closed downstream, so no
head node reads a tail value.
"""

from __future__ import annotations

from dataclasses import dataclass

from geode.compiler.ir import Graph, Node
from geode.compiler.partition.dynamic_shape import input_symbols, symbol_origins
from geode.compiler.partition.subgraph import extract

__all__ = ["BinaryCut", "binary_cut"]


@dataclass
class BinaryCut:
    """A graph cut in two: the head (compiled once), the tail (symbolic: compiled per
    shape of its ``tail_inputs``), the data-dependent ops that end the head, and what
    crosses (head values the tail reads)."""

    head: Graph
    tail: Graph
    origins: list[str]
    crossing: list[str]
    tail_inputs: list[str]


def binary_cut(graph: Graph) -> BinaryCut | None:
    """The cut of ``graph`` (shapes inferred) after its data-dependent ops, or None when
    it has none (its shapes all follow from the inputs')."""
    nodes = graph.toposort()
    origin = symbol_origins(graph, input_symbols(graph))
    origins = {n.name for n in origin.values()}
    if not origins:
        return None
    tail: set[str] = set()
    for node in nodes:
        if any(_reads_from(node, origins | tail)):
            tail.add(node.name)
    if not tail:
        return None
    head = [n.name for n in nodes if n.name not in tail]
    by_name = {n.name: n for n in nodes}
    outputs = {v.name for v in graph.outputs}
    crossing: list[str] = []
    for name in head:
        for o in by_name[name].outputs:
            if any(u.name in tail for u, _ in o.uses) and o.name not in crossing:
                crossing.append(o.name)
    head_out = crossing + [
        o.name
        for n in head
        for o in by_name[n].outputs
        if o.name in outputs and o.name not in crossing
    ]
    tail_out = [v.name for v in graph.outputs if v.producer is not None and v.producer.name in tail]
    head_graph = extract(graph, set(head), head_out, f"{graph.name}/head")
    tail_graph = extract(graph, tail, tail_out, f"{graph.name}/tail")
    return BinaryCut(
        head_graph,
        tail_graph,
        [n for n in head if n in origins],
        crossing,
        [v.name for v in tail_graph.inputs],
    )


def _reads_from(node: Node, names: set[str]) -> list[str]:
    """The producers among ``names`` of what ``node`` reads."""
    return [
        v.producer.name
        for v in node.inputs
        if v is not None and v.producer is not None and v.producer.name in names
    ]
