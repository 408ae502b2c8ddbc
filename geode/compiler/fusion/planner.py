"""The fusion planner: grow groups by legal merges that the cost model finds worth it.

1. Every AI Core node that the code generator can lower starts as its own group;
   every other node is recorded as not fused, with the reason.
2. Vertical merges along producer -> consumer edges, in topological order, until
   nothing changes (T+T, T+R, R+T, R+R).
3. Horizontal merges of unconnected groups that read a common input and whose
   domains agree.
4. Groups left holding only view ops (Reshape, Squeeze, a contiguous Slice, ...; see
   ``views.py``) are dissolved: each view becomes an alias of its input in the memory
   plan, with no kernel.

Each candidate is checked by ``rules.check_merge`` (legality), then by
``views.view_copy_reason`` (no kernel copies a view whose input is in memory anyway:
apart, the view is an alias) and then by the ``profit`` callable (profitability);
every decision, taken or refused, is recorded.
"""

from __future__ import annotations

from collections.abc import Callable

from geode.compiler.fusion.groups import Decision, FusionPlan, Group, group_of_node
from geode.compiler.fusion.patterns import Pattern, pattern_of
from geode.compiler.fusion.rules import check_merge, rule_name
from geode.compiler.fusion.stitch import merge_groups
from geode.compiler.fusion.views import ViewSpec, alias_view, view_copy_reason
from geode.compiler.ir import Graph, Node
from geode.compiler.partition.placement import Placement, input_symbols
from geode.compiler.shapes import Dim
from geode.errors import GraphError

#: ``profit(a, b, merged, graph) -> (take, reason)``
ProfitFn = Callable[[Group, Group, Group, Graph], tuple[bool, str]]
#: ``can_lower(node) -> None`` when the code generator handles it, else the reason
LowerCheck = Callable[[Node], str | None]


def always_profitable(a: Group, b: Group, merged: Group, graph: Graph) -> tuple[bool, str]:
    """A profitability stand-in that takes every legal merge (used by tests of legality)."""
    return True, "legal merge (no cost model)"


class PlanState:
    """A partition in progress: the groups, which group each node is in, the decisions
    so far. ``copy()`` gives an independent state (groups are shared: a merge makes a
    new group rather than changing one)."""

    def __init__(self, graph: Graph, trees: bool = True):
        self.graph = graph
        #: whether reduce trees may form (option ``stitch_fusion``)
        self.trees = trees
        self._bound = input_symbols(graph)
        self._views: dict[str, ViewSpec | None] = {}
        self.groups: dict[int, Group] = {}
        self.of: dict[str, int] = {}
        self.decisions: list[Decision] = []
        self.refused: set[tuple[frozenset[str], frozenset[str]]] = set()

    def is_view(self, node: Node) -> ViewSpec | None:
        """The view ``node`` is when it can be an alias (see ``views.alias_view``)."""
        if node.name not in self._views:
            self._views[node.name] = alias_view(node, self._bound)
        return self._views[node.name]

    def unit_of(self, node: Node) -> list[Node]:
        """The members of the group a node belongs to (or the node alone)."""
        gid = self.of.get(node.name)
        return self.groups[gid].nodes if gid is not None else [node]

    def add(self, g: Group) -> None:
        """Put group ``g`` in the state."""
        self.groups[g.id] = g
        for n in g.nodes:
            self.of[n.name] = g.id

    def copy(self) -> PlanState:
        """An independent copy (the graph and the view cache shared)."""
        st = PlanState.__new__(PlanState)
        st.graph, st._bound, st._views = self.graph, self._bound, self._views
        st.trees = self.trees
        st.groups, st.of = dict(self.groups), dict(self.of)
        st.decisions, st.refused = list(self.decisions), set(self.refused)
        return st

    def merge(self, a: Group, b: Group, domain: tuple[Dim, ...], axes: frozenset[int]) -> Group:
        """Replace ``a`` and ``b`` by their union over ``domain`` and ``axes``."""
        order = {n.name: i for i, n in enumerate(self.graph.nodes)}
        merged = merge_groups(min(a.id, b.id), a, b, domain, axes)
        merged.nodes.sort(key=lambda n: order[n.name])
        del self.groups[a.id]
        del self.groups[b.id]
        self.add(merged)
        return merged


def _try(st: PlanState, a: Group, b: Group, vertical: bool, profit: ProfitFn) -> bool:
    key = (frozenset(a.names), frozenset(b.names))
    if key in st.refused:
        return False
    rule = rule_name(a, b, vertical)
    dom, reason = check_merge(a, b, st.unit_of, st.trees)
    if dom is None:
        st.decisions.append(Decision(a.id, b.id, rule, False, f"illegal: {reason}"))
        st.refused.add(key)
        return False
    candidate = merge_groups(min(a.id, b.id), a, b, dom[0], dom[1])
    copy = view_copy_reason(candidate, st.graph, st.is_view)
    if copy is not None:
        st.decisions.append(Decision(a.id, b.id, rule, False, f"{reason}; {copy}"))
        st.refused.add(key)
        return False
    take, why = profit(a, b, candidate, st.graph)
    st.decisions.append(Decision(a.id, b.id, rule, take, f"{reason}; {why}"))
    if not take:
        st.refused.add(key)
        return False
    st.merge(a, b, dom[0], dom[1])
    return True


def plan_fusion(
    graph: Graph,
    placement: Placement,
    can_lower: LowerCheck,
    profit: ProfitFn = always_profitable,
    horizontal: bool = True,
    trees: bool = True,
) -> FusionPlan:
    """Plan fusion groups for the AI Core nodes of a (sorted) graph (``trees``: whether
    chained reductions may form reduce trees, see ``reduce_tree.py``)."""
    st, plan = initial_state(graph, placement, can_lower, trees)
    _vertical(st, profit)
    if horizontal:
        _horizontal(st, profit)
    return finish_plan(st, plan)


def initial_state(
    graph: Graph, placement: Placement, can_lower: LowerCheck, trees: bool = True
) -> tuple[PlanState, FusionPlan]:
    """Every fusable AI Core node in a group of its own; the plan records the others
    as not fused, with the reason."""
    st = PlanState(graph, trees)
    plan = FusionPlan()
    for node in graph.nodes:
        if placement.engine.get(node.name) != "aicore":
            plan.unfused[node.name] = f"placed on {placement.engine.get(node.name)}"
            continue
        if pattern_of(node) is Pattern.NONE:
            plan.unfused[node.name] = f"{node.op_type} is neither Trivial nor a fusable Reduce"
            continue
        why = can_lower(node)
        if why:
            plan.unfused[node.name] = why
            continue
        st.add(group_of_node(len(st.of), node))
    return st, plan


def finish_plan(st: PlanState, plan: FusionPlan) -> FusionPlan:
    """The plan of a final state: view-only groups dissolved, groups in graph order
    and numbered, the decisions recorded."""
    dissolve_views(st, plan)
    plan.groups = _ordered(st, st.graph)
    for i, g in enumerate(plan.groups):
        g.id = i
    plan.decisions = st.decisions
    return plan


def dissolve_views(st: PlanState, plan: FusionPlan) -> None:
    """Groups of nothing but views run no kernel: each view is an alias of its input."""
    for gid, g in list(st.groups.items()):
        if all(st.is_view(n) is not None for n in g.nodes):
            del st.groups[gid]
            for n in g.nodes:
                del st.of[n.name]
                plan.unfused[n.name] = (
                    f"view of {n.inputs[0].name!r}: an alias in the memory plan (no kernel)"
                )


def _vertical(st: PlanState, profit: ProfitFn) -> None:
    changed = True
    while changed:
        changed = False
        for node in st.graph.nodes:
            if node.name not in st.of:
                continue
            for v in node.inputs:
                if v is None or v.producer is None or v.producer.name not in st.of:
                    continue
                a = st.groups[st.of[v.producer.name]]
                b = st.groups[st.of[node.name]]
                if a.id != b.id and _try(st, a, b, True, profit):
                    changed = True


#: horizontal fusion of unrelated groups is tried only below this many groups (pairs grow
#: quadratically)
MAX_HORIZONTAL_GROUPS = 256


def sharing_pairs(st: PlanState) -> list[tuple[int, int]]:
    """The ids of every two groups of ``st`` that read a common input (not a constant:
    sharing one saves nothing worth a merge) or, with few groups, share a loop space;
    the horizontal merges to try, in a fixed order."""
    readers: dict[object, list[int]] = {}
    for g in st.groups.values():
        for v in g.inputs():
            if not v.is_constant:
                readers.setdefault(id(v), []).append(g.id)
        if not g.axes and len(st.groups) <= MAX_HORIZONTAL_GROUPS:
            readers.setdefault(("space", str(g.domain)), []).append(g.id)
    pairs = []
    for ids in readers.values():
        ids = sorted(set(ids))
        pairs += [(ids[i], ids[j]) for i in range(len(ids)) for j in range(i + 1, len(ids))]
    return pairs


def _horizontal(st: PlanState, profit: ProfitFn) -> None:
    """Merge unconnected groups that read a common input, or that share a loop space."""
    changed = True
    while changed:
        changed = False
        for ia, ib in sharing_pairs(st):
            a, b = st.groups.get(ia), st.groups.get(ib)
            if a is None or b is None or a.id == b.id:
                continue
            if _try(st, a, b, False, profit):
                changed = True  # the groups changed: pair them again
                break


def _ordered(st: PlanState, graph: Graph) -> list[Group]:
    """Groups in the order of their first member (execution order comes from schedule_units)."""
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    return sorted(st.groups.values(), key=lambda g: min(pos[n.name] for n in g.nodes))


def schedule_units(graph: Graph, plan: FusionPlan) -> list[Group | Node]:
    """Groups and unfused nodes in a dependency-respecting order (Kahn's algorithm)."""
    unit_of: dict[str, int] = {}
    units: list[Group | Node] = []
    for g in plan.groups:
        for n in g.nodes:
            unit_of[n.name] = len(units)
        units.append(g)
    for n in graph.nodes:
        if n.name not in unit_of:
            unit_of[n.name] = len(units)
            units.append(n)
    deps: list[set[int]] = [set() for _ in units]
    users: list[set[int]] = [set() for _ in units]
    for n in graph.nodes:
        u = unit_of[n.name]
        for v in n.inputs:
            if v is not None and v.producer is not None:
                p = unit_of[v.producer.name]
                if p != u:
                    deps[u].add(p)
                    users[p].add(u)
    pos = {n.name: i for i, n in enumerate(graph.nodes)}

    def first(u: int) -> int:
        x = units[u]
        return min(pos[n.name] for n in x.nodes) if isinstance(x, Group) else pos[x.name]

    import heapq

    ready = [(first(u), u) for u in range(len(units)) if not deps[u]]
    heapq.heapify(ready)
    order: list[Group | Node] = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append(units[u])
        for w in users[u]:
            deps[w].discard(u)
            if not deps[w]:
                heapq.heappush(ready, (first(w), w))
    if len(order) != len(units):
        raise GraphError("fusion plan has a cycle between units (a bug in the fusion rules)")
    return order
