"""Engine placement (GE's EnginePlacer) and the known/unknown-shape split.

Engines:

* ``host``: shape computations (OpKind.HOST: Shape, Size, Range, ...) and the small
  int64 tensors computed from them (a Gather/Concat/Unsqueeze over a shape vector);
* ``aicore``: ops the fusion planner may compile (Trivial and Reduce kinds), when
  codegen is on;
* ``aicpu``: everything else, on reference kernels.

The shape split (which nodes are unknown-shape, and why; the partitions) is
:mod:`geode.compiler.partition.dynamic_shape`, GE's DynamicShapePartitioner adapted to
symbolic dims.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from geode.compiler.ir import Graph, Node, Value
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.partition import dynamic_shape
from geode.compiler.partition.dynamic_shape import input_symbols

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
    #: why each unknown-shape node is one (see ``dynamic_shape.unknown_reasons``)
    unknown_reason: dict[str, str] = field(default_factory=dict)
    partitions: list[tuple[str, list[str]]] = field(default_factory=list)

    def describe(self) -> str:
        """Readable partition table: per node its engine and why, and for an
        unknown-shape node why its shapes are known only at run time."""
        lines = []
        for i, (kind, names) in enumerate(self.partitions):
            lines.append(f"partition {i} [{kind}] ({len(names)} nodes)")
            for n in names:
                lines.append(f"  {n}: {self.engine[n]} ({self.reason[n]})")
                if n in self.unknown_reason:
                    lines.append(f"    unknown shape: {self.unknown_reason[n]}")
        return "\n".join(lines)

    def partition_of(self) -> dict[str, int]:
        """Node name -> the index of its partition."""
        return {n: i for i, (_, names) in enumerate(self.partitions) for n in names}


__all__ = ["Placement", "assign_engines", "input_symbols", "place", "split_partitions"]


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


def place(graph: Graph, codegen: bool = True) -> Placement:
    """Assign an engine to every node (graph must be sorted) and split by shape kind."""
    p = assign_engines(graph, codegen)
    split_partitions(graph, p)
    return p


def assign_engines(graph: Graph, codegen: bool = True) -> Placement:
    """Assign an engine to every node of a sorted graph, with the reason, and record
    which nodes are unknown-shape and why (:func:`dynamic_shape.unknown_reasons`)."""
    p = Placement()
    host_values: set[str] = set()
    for node in graph.nodes:
        engine, why = _place_node(node, host_values, codegen)
        p.engine[node.name] = engine
        p.reason[node.name] = why
        if engine == "host":
            host_values.update(o.name for o in node.outputs)
    p.unknown_reason = dynamic_shape.unknown_reasons(graph, p.engine)
    p.unknown_shape = {n.name: n.name in p.unknown_reason for n in graph.nodes}
    return p


def split_partitions(graph: Graph, p: Placement) -> None:
    """Split the placed graph into known-shape and unknown-shape partitions
    (``p.partitions``, in a topological order; :func:`dynamic_shape.cluster`)."""
    p.partitions = dynamic_shape.cluster(graph, p.unknown_shape)
