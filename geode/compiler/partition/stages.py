"""Pipeline stages (GE's StagePartitioner).

Nodes made inside ``with graph.stage(k):`` carry stage ``k`` (``Node.stage``, GE's
ATTR_STAGE_LEVEL). :func:`assign_stages` gives every other node one: the earliest
stage of the nodes that read its outputs (GE propagates stage levels upstream), or
the last stage when nothing staged reads it (GE's SplitTailStage). Data must flow
forward: a node may not read a value of a later stage. :func:`split_stages` then cuts
the graph into one graph per stage (:func:`~geode.compiler.partition.subgraph.extract`):
its inputs are the graph inputs and earlier stages' values it reads, its outputs the
values later stages read and the graph outputs it produces.
"""

from __future__ import annotations

from dataclasses import dataclass

from geode.compiler.ir import Graph
from geode.compiler.partition.subgraph import extract
from geode.errors import GraphError

__all__ = ["Stage", "assign_stages", "has_stages", "split_stages"]


@dataclass
class Stage:
    """One stage: its graph, the names of what it reads (``inputs``: graph inputs and
    earlier stages' outputs) and of what it hands on (``outputs``)."""

    index: int
    graph: Graph
    inputs: list[str]
    outputs: list[str]
    nodes: list[str]


def has_stages(graph: Graph) -> bool:
    """Whether any node of ``graph`` was given a stage."""
    return any(n.stage is not None for n in graph.nodes)


def assign_stages(graph: Graph) -> dict[str, int]:
    """Every node's stage (see the module docstring); GraphError naming the node and
    the value when a node reads a value of a later stage."""
    g_nodes = graph.toposort()
    last = max((n.stage for n in g_nodes if n.stage is not None), default=0)
    stage: dict[str, int] = {}
    for node in reversed(g_nodes):
        if node.stage is not None:
            stage[node.name] = node.stage
            continue
        readers = [stage[u.name] for o in node.outputs for u, _ in o.uses if u.name in stage]
        stage[node.name] = min(readers, default=last)
    for node in g_nodes:
        for v in node.inputs:
            p = None if v is None else v.producer
            if p is not None and stage[p.name] > stage[node.name]:
                raise GraphError(
                    f"{node.where} in stage {stage[node.name]} reads {v.name!r} of stage "
                    f"{stage[p.name]}: a stage reads only the graph's inputs and earlier stages"
                )
    return stage


def split_stages(graph: Graph) -> list[Stage]:
    """One graph per stage that holds nodes, in stage order (module docstring)."""
    stage = assign_stages(graph)
    nodes = graph.toposort()
    out_names = {v.name for v in graph.outputs}
    stages = []
    for k in sorted(set(stage.values())):
        mine = [n.name for n in nodes if stage[n.name] == k]
        members = set(mine)
        produced = [o for n in nodes if n.name in members for o in n.outputs]
        outputs = [
            o.name
            for o in produced
            if o.name in out_names or any(stage[u.name] > k for u, _ in o.uses)
        ]
        sub = extract(graph, members, outputs, f"{graph.name}/stage{k}")
        inputs = [v.name for v in sub.inputs]
        stages.append(Stage(k, sub, inputs, outputs, mine))
    return stages
