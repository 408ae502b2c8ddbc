"""Engine placement (GE's EnginePlacer) and the known/unknown-shape split.

Engines:

* ``host``: shape computations (OpKind.HOST: Shape, Size, Range, ...) and the small
  int64 tensors computed from them (a Gather/Concat/Unsqueeze over a shape vector);
* ``aicore``: ops the fusion planner may compile (Trivial and Reduce kinds), when
  codegen is on;
* ``aicpu``: everything else, on reference kernels.

The shape split follows GE's DynamicShapePartitioner, adapted to symbolic dims: a
value has a *known* shape when its dims depend only on symbols bound by the graph's
inputs (so the executor can size it before running anything); a node is *unknown*
when an output's shape depends on a value computed at run time (NonZero, Reshape to a
computed shape) or has unknown rank. Adjacent nodes of one kind merge into partitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from geode.compiler.ir import Graph, Node, Value
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import free_symbols

#: Op kinds that the AI Core engine compiles.
AICORE_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE, OpKind.REDUCE})

#: Largest shape-vector length still treated as host work.
HOST_VECTOR_LIMIT = 64


@dataclass
class Placement:
    """Engine and reason per node, and the known/unknown-shape partitions."""

    engine: dict[str, str] = field(default_factory=dict)
    reason: dict[str, str] = field(default_factory=dict)
    unknown_shape: dict[str, bool] = field(default_factory=dict)
    partitions: list[tuple[str, list[str]]] = field(default_factory=list)

    def describe(self) -> str:
        """Readable partition table."""
        lines = []
        for i, (kind, names) in enumerate(self.partitions):
            lines.append(f"partition {i} [{kind}] ({len(names)} nodes)")
            for n in names:
                lines.append(f"  {n}: {self.engine[n]} ({self.reason[n]})")
        return "\n".join(lines)


def input_symbols(graph: Graph) -> set:
    """Symbols bound by the graph's inputs."""
    out: set = set()
    for v in graph.inputs:
        out |= free_symbols(v.shape)
    return out


def _is_shape_value(v: Value | None, host_values: set[str]) -> bool:
    if v is None:
        return True
    if v.is_constant:
        return v.dtype == np.int64 and v.data is not None and v.data.size <= HOST_VECTOR_LIMIT
    return v.name in host_values


def _place_node(node: Node, host_values: set[str], codegen: bool) -> tuple[str, str]:
    od = registry.get(node.op_type, node.domain, node.where)
    if od.kind is OpKind.HOST:
        return "host", "host op (shape or data-dependent)"
    ins = [v for v in node.inputs if v is not None]
    if (
        ins
        and all(_is_shape_value(v, host_values) for v in node.inputs)
        and any(v.name in host_values for v in ins)
    ):
        outs_small = all(
            o.shape is not None and len(o.shape) <= 1 and o.dtype in (np.int64, np.int32, np.bool_)
            for o in node.outputs
        )
        if outs_small:
            return "host", "computes on shape values"
    if codegen and od.kind in AICORE_KINDS:
        return "aicore", f"{od.kind.value} op: compiled"
    if od.kind in AICORE_KINDS:
        return "aicpu", f"{od.kind.value} op: codegen off"
    return "aicpu", f"{od.kind.value} op: reference kernel"


def _unknown(node: Node, engine: str, bound: set) -> bool:
    if engine == "host":
        return True
    return any(o.shape is None or not free_symbols(o.shape) <= bound for o in node.outputs)


def place(graph: Graph, codegen: bool = True) -> Placement:
    """Assign an engine to every node (graph must be sorted) and split by shape kind."""
    p = assign_engines(graph, codegen)
    split_partitions(graph, p)
    return p


def assign_engines(graph: Graph, codegen: bool = True) -> Placement:
    """Assign an engine to every node of a sorted graph, with the reason, and record
    which nodes' output shapes are unknown before the run (host ops, unbound symbols)."""
    p = Placement()
    host_values: set[str] = set()
    bound = input_symbols(graph)
    for node in graph.nodes:
        engine, why = _place_node(node, host_values, codegen)
        p.engine[node.name] = engine
        p.reason[node.name] = why
        p.unknown_shape[node.name] = _unknown(node, engine, bound)
        if engine == "host":
            host_values.update(o.name for o in node.outputs)
    return p


def split_partitions(graph: Graph, p: Placement) -> None:
    """Split the placed graph into runs of known-shape and unknown-shape nodes
    (``p.partitions``, in graph order)."""
    p.partitions.clear()
    kind_of = {
        n.name: ("unknown-shape" if p.unknown_shape[n.name] else "known-shape") for n in graph.nodes
    }
    for node in graph.nodes:
        kind = kind_of[node.name]
        if p.partitions and p.partitions[-1][0] == kind:
            p.partitions[-1][1].append(node.name)
        else:
            p.partitions.append((kind, [node.name]))
