"""Fusion groups, fusion decisions, and the fusion plan with its text form."""

from __future__ import annotations

from dataclasses import dataclass, field

from geode.compiler.fusion.patterns import Pattern, pattern_of, placement_on, reduce_axes
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.shapes import Dim, shape_str


@dataclass
class Group:
    """Nodes that become one kernel, over one domain (shape ``domain``, reduced ``axes``).

    A *reduce tree* (chained reductions over different axes, see ``reduce_tree.py``)
    also has ``levels``: the axes each reduction of the chain reduces, in turn, in
    domain coordinates (``axes`` is their union); empty for every other group. A
    *stitch* group (a row and a column reduction of one input side by side, see
    ``stitch.py``) has ``branches``: the row reduction's axes, then the column
    reduction's (``axes`` is their union)."""

    id: int
    nodes: list[Node]
    domain: tuple[Dim, ...]
    axes: frozenset[int] = frozenset()
    levels: tuple[frozenset[int], ...] = ()
    branches: tuple[frozenset[int], ...] = ()

    @property
    def names(self) -> set[str]:
        """Names of the member nodes."""
        return {n.name for n in self.nodes}

    @property
    def kind(self) -> str:
        """``reduce`` when the group reduces, else ``elementwise``."""
        return (
            "reduce" if any(pattern_of(n) is Pattern.REDUCE for n in self.nodes) else "elementwise"
        )

    def inputs(self) -> list[Value]:
        """Values read by the group and produced outside it (order of first use)."""
        names = self.names
        seen: dict[int, Value] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None and (v.producer is None or v.producer.name not in names):
                    seen.setdefault(id(v), v)
        return list(seen.values())

    def outputs(self, graph: Graph) -> list[Value]:
        """Values produced by the group and read outside it (or graph outputs)."""
        names = self.names
        graph_outs = {id(v) for v in graph.outputs}
        outs = []
        for n in self.nodes:
            for o in n.outputs:
                if id(o) in graph_outs or any(c.name not in names for c in o.consumers):
                    outs.append(o)
        return outs

    def pattern_name(self) -> str:
        """The schedule pattern: elementwise, row_reduce, column_reduce, reduce_broadcast,
        reduce_tree, stitch_reduce."""
        if not self.axes:
            return "elementwise"
        if self.branches:
            return "stitch_reduce"
        if self.levels:
            return "reduce_tree"
        rank = len(self.domain)
        trailing = self.axes == frozenset(range(rank - len(self.axes), rank))
        if not trailing:
            return "column_reduce"
        full_outputs = any(
            placement_on(o.shape, self.domain, self.axes) == "full"
            for n in self.nodes
            for o in n.outputs
            if pattern_of(n) is not Pattern.REDUCE
        )
        return "reduce_broadcast" if full_outputs else "row_reduce"

    def describe(self) -> str:
        """One line: id, pattern, domain and op types."""
        axes = f" reduce axes {sorted(self.axes)}" if self.axes else ""
        if self.levels:
            axes += " in turn " + " then ".join(str(sorted(lv)) for lv in self.levels)
        if self.branches:
            axes += " side by side " + " and ".join(str(sorted(b)) for b in self.branches)
        ops = ", ".join(f"{n.op_type}:{n.name}" for n in self.nodes)
        return (
            f"group {self.id} [{self.pattern_name()}] domain {shape_str(self.domain)}{axes}: {ops}"
        )


def group_of_node(gid: int, node: Node) -> Group:
    """A singleton group for a Trivial or Reduce node."""
    if pattern_of(node) is Pattern.REDUCE:
        x = node.inputs[0]
        axes = reduce_axes(node) or ()
        return Group(gid, [node], tuple(x.shape), frozenset(axes))
    return Group(gid, [node], tuple(node.outputs[0].shape))


@dataclass
class Decision:
    """One fusion decision, taken or refused, with its rule and reason."""

    producer: int
    consumer: int
    rule: str
    taken: bool
    reason: str

    def __str__(self) -> str:
        verdict = "merge" if self.taken else "keep apart"
        return (
            f"{verdict} group {self.producer} -> group {self.consumer} ({self.rule}): {self.reason}"
        )


@dataclass
class FusionPlan:
    """The result of fusion planning: groups in execution order, and every decision."""

    groups: list[Group] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    unfused: dict[str, str] = field(default_factory=dict)  # node name -> why it is not in a group
    #: dense ops and their epilogues: one line per decision, taken or not, with its reason
    epilogues: list[str] = field(default_factory=list)
    #: the plan search's report (chosen plan, runner-up, their predicted costs); empty
    #: for the greedy planner alone
    search: list[str] = field(default_factory=list)
    #: the device spec the decisions were costed on (``DeviceSpec.source()``: the
    #: machine, and measured or nominal rates); empty when not known
    device: str = ""

    def group_of(self, node_name: str) -> Group | None:
        """The group holding a node, if any."""
        for g in self.groups:
            if node_name in g.names:
                return g
        return None

    def describe(self) -> str:
        """Readable plan: groups, then decisions with reasons, then unfused nodes."""
        lines = [f"{len(self.groups)} fusion groups"]
        lines += ["  " + g.describe() for g in self.groups]
        if self.search:
            lines.append("plan search (projected cost model):")
            lines += ["  " + line for line in self.search]
        if self.decisions:
            lines.append("decisions:")
            lines += ["  " + str(d) for d in self.decisions]
        if self.epilogues:
            lines.append("dense epilogues:")
            lines += ["  " + e for e in self.epilogues]
        if self.unfused:
            lines.append("not fused:")
            lines += [f"  {n}: {why}" for n, why in self.unfused.items()]
        if self.device:
            lines.append(f"device spec: {self.device}")
        return "\n".join(lines)
