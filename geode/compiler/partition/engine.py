"""Per-engine subgraphs with PlaceHolder/End boundary nodes (GE's EnginePartitioner).

Once every node has the engine it runs on (the ``bind`` stage settles library ops,
views and variable writes), the compiled graph is cut into subgraphs of one engine
each: adjacent nodes of one engine merge unless a path through another engine joins
them (:func:`geode.compiler.partition.clusters.merge_clusters`); a view (an alias: no
step) or a variable write (a commit: no step) joins the subgraph it meets first.
Subgraph 0 is GE's unified input subgraph: the graph's inputs (its Data nodes).

Every value that crosses from one subgraph to another is a boundary: an *End* in the
subgraph that produces it and a *PlaceHolder* in the subgraph that reads it, paired by
a ``peer_index`` (one pair per value and reading subgraph). A model output leaves its
subgraph through an End whose peer is the NetOutput. ``model.explain()`` prints the
subgraphs with their boundaries, and the DOT picture draws each subgraph as a box with
its PlaceHolder and End nodes (:mod:`geode.viz`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from geode.compiler.ir import Graph, Node
from geode.compiler.partition.clusters import ANY, merge_clusters

__all__ = [
    "DATA",
    "NET_OUTPUT",
    "Boundary",
    "EnginePartition",
    "EngineSubgraph",
    "partition_engines",
]

#: the engine of subgraph 0, which holds the graph's inputs
DATA = "data"
#: the peer of an End that hands a model output out
NET_OUTPUT = -1


@dataclass(frozen=True)
class Boundary:
    """A PlaceHolder/End pair: ``value`` leaves subgraph ``source`` through End
    ``peer_index`` and enters subgraph ``target`` through PlaceHolder ``peer_index``
    (``target`` :data:`NET_OUTPUT`: it is a model output)."""

    peer_index: int
    value: str
    source: int
    target: int


@dataclass
class EngineSubgraph:
    """One engine's subgraph: its nodes (graph order), the steps that run them, and its
    boundaries (PlaceHolders in, Ends out)."""

    index: int
    engine: str
    nodes: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    placeholders: list[Boundary] = field(default_factory=list)
    ends: list[Boundary] = field(default_factory=list)


@dataclass
class EnginePartition:
    """The engine subgraphs of a compiled graph, in a topological order (subgraph 0
    holds the inputs), and every PlaceHolder/End pair between them."""

    subgraphs: list[EngineSubgraph]
    boundaries: list[Boundary]

    def subgraph_of(self) -> dict[str, int]:
        """Node name -> the index of its subgraph."""
        return {n: sg.index for sg in self.subgraphs for n in sg.nodes}

    def describe(self) -> str:
        """The subgraphs as ``explain()`` prints them: each with its engine, its
        PlaceHolders (where from), its steps and its Ends (where to)."""
        pairs = [b for b in self.boundaries if b.target != NET_OUTPUT]
        lines = [
            f"engine partition: {len(self.subgraphs)} subgraphs, {len(pairs)} PlaceHolder/End pairs"
        ]
        for sg in self.subgraphs:
            what = f"{len(sg.nodes)} inputs" if sg.engine == DATA else f"{len(sg.nodes)} nodes"
            lines.append(f"  subgraph {sg.index} [{sg.engine}] ({what})")
            for b in sg.placeholders:
                lines.append(f"    PlaceHolder #{b.peer_index} {b.value} <- subgraph {b.source}")
            if sg.engine == DATA:
                lines.append(f"    Data: {', '.join(sg.nodes)}")
            elif sg.steps:
                lines.append(f"    steps: {', '.join(sg.steps)}")
            for b in sg.ends:
                dest = "NetOutput" if b.target == NET_OUTPUT else f"subgraph {b.target}"
                lines.append(f"    End #{b.peer_index} {b.value} -> {dest}")
        return "\n".join(lines)


def partition_engines(
    graph: Graph, engine_of: Mapping[str, str], step_of: Mapping[str, str], no_step: Sequence[str]
) -> EnginePartition:
    """Cut the sorted ``graph`` into engine subgraphs. ``engine_of``: node name -> the
    engine it runs on, for the nodes that run (others are left out: dead after fusion);
    ``step_of``: node name -> the step (unit) that runs it; ``no_step``: engines that
    are no step (views, variable writes), which join a neighbouring subgraph."""
    nodes = [n for n in graph.nodes if n.name in engine_of]
    kind = {n.name: ANY if engine_of[n.name] in no_step else engine_of[n.name] for n in nodes}
    clusters = merge_clusters(nodes, kind)
    subgraphs = [EngineSubgraph(0, DATA, [v.name for v in graph.inputs])]
    for i, (k, names) in enumerate(clusters, start=1):
        label = engine_of[names[0]] if k == ANY else k
        steps = list(dict.fromkeys(step_of[n] for n in names if n in step_of))
        subgraphs.append(EngineSubgraph(i, label, names, steps))
    where = {n: sg.index for sg in subgraphs[1:] for n in sg.nodes}
    where.update({v.name: 0 for v in graph.inputs})  # an input comes from subgraph 0
    by_name = {n.name: n for n in nodes}
    boundaries = _boundaries(graph, subgraphs, where, by_name)
    for b in boundaries:
        subgraphs[b.source].ends.append(b)
        if b.target != NET_OUTPUT:
            subgraphs[b.target].placeholders.append(b)
    return EnginePartition(subgraphs, boundaries)


def _boundaries(
    graph: Graph,
    subgraphs: list[EngineSubgraph],
    where: Mapping[str, int],
    by_name: Mapping[str, Node],
) -> list[Boundary]:
    """One PlaceHolder/End pair per value and subgraph reading it from another, in the
    order of the reading subgraphs and their nodes; then an End per model output."""

    def source(v: object) -> int | None:
        p = getattr(v, "producer", None)
        if p is not None:
            return where.get(p.name)
        return where.get(getattr(v, "name", ""))

    out: list[Boundary] = []
    seen: set[tuple[str, int]] = set()
    for sg in subgraphs[1:]:
        for name in sg.nodes:
            for v in by_name[name].inputs:
                src = None if v is None else source(v)
                if src is None or src == sg.index or (v.name, sg.index) in seen:
                    continue
                seen.add((v.name, sg.index))
                out.append(Boundary(len(out), v.name, src, sg.index))
    for v in graph.outputs:
        src = source(v)
        if src is not None:
            out.append(Boundary(len(out), v.name, src, NET_OUTPUT))
    return out
