"""Fusion plan search: a beam of candidate plans scored by a kernel cost model.

The greedy planner (:mod:`.planner`) takes every legal merge the SOL model finds
worth it, in graph order, and never looks back. The search, after PAI's cost-based
fusion, explores: a *state* is a partition of the fusable nodes into groups, its
cost the sum of the predicted seconds of the kernels its groups become (``cost``:
injected by the caller, the projected model over each group's scheduled loop AST);
from every state of the beam, the ``top_k`` merges that save the most (vertical along
an edge, or horizontal between groups sharing an input) give the next states, of
which the ``beam`` cheapest are kept. The search ends when no state has a merge that
saves time. The beam starts from the greedy plan too (when given), so the winner,
the cheapest state seen, is never worse than greedy by the model; it and the
runner-up (the cheapest other state) are recorded with their costs for ``explain()``.

Merges that need no model (an elementwise group into its only reader over the same
loop space) are made first; the search starts from there and prices at most
``max_evaluations`` distinct groups (the compile time it may add).

Legality and profitability stay apart: a merge is first checked by the fusion rules
(``rules.check_merge``: the domain part once per pair, the cycle check per state)
and the view rule (``views.view_copy_reason``), then priced. Every merge of the
chosen plan is recorded with both reasons, and so is every pair still apart at the
end with the reason it stayed apart.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from geode.compiler.fusion.groups import Decision, FusionPlan, Group
from geode.compiler.fusion.patterns import same_shape
from geode.compiler.fusion.planner import (
    LowerCheck,
    PlanState,
    finish_plan,
    initial_state,
    sharing_pairs,
)
from geode.compiler.fusion.rules import check_merge, creates_cycle, rule_name
from geode.compiler.fusion.stitch import merge_groups
from geode.compiler.fusion.views import view_copy_reason
from geode.compiler.ir import Graph
from geode.compiler.partition.placement import Placement
from geode.compiler.shapes import Dim

#: ``cost(group) -> seconds`` of the kernel a group becomes (inf: cannot be compiled)
CostFn = Callable[[Group], float]

#: a merge must save at least this share of the pair's cost to count (noise guard)
MIN_GAIN = 0.01


@dataclass
class SearchReport:
    """What the search found: the chosen plan's and the runner-up's predicted
    seconds and names, how many group costs were evaluated, the states expanded and
    the seconds it took."""

    chosen: str
    chosen_s: float
    runner_up: str
    runner_up_s: float
    evaluations: int = 0
    states: int = 0
    seconds: float = 0.0

    def lines(self) -> list[str]:
        """The report as ``explain()`` shows it."""
        return [
            f"chosen: {self.chosen} plan, predicted {self.chosen_s * 1e6:.1f} us",
            f"runner-up: {self.runner_up} plan, predicted {self.runner_up_s * 1e6:.1f} us"
            if math.isfinite(self.runner_up_s)
            else "runner-up: none (no other plan was found)",
            f"searched {self.states} states, {self.evaluations} kernel costs, "
            f"in {self.seconds * 1e3:.0f} ms",
        ]


@dataclass(frozen=True)
class _Move:
    """A priced merge of two groups."""

    saved: float
    a: int
    b: int
    vertical: bool
    domain: tuple[Dim, ...]
    axes: frozenset[int]
    reason: str
    before: float
    after: float


@dataclass
class _Search:
    """Memos shared by every state: group costs and the state-independent legality."""

    graph: Graph
    cost: CostFn
    trees: bool = True
    costs: dict[frozenset[str], float] = field(default_factory=dict)
    legal: dict[tuple[frozenset[str], frozenset[str]], tuple] = field(default_factory=dict)

    def group_cost(self, st: PlanState, g: Group) -> float:
        key = frozenset(g.names)
        if key not in self.costs:
            views = all(st.is_view(n) is not None for n in g.nodes)
            self.costs[key] = 0.0 if views else float(self.cost(g))
        return self.costs[key]

    def domain_check(self, a: Group, b: Group) -> tuple:
        """``(domain or None, reason)`` of the rules without the state's other groups."""
        key = (frozenset(a.names), frozenset(b.names))
        if key not in self.legal:
            self.legal[key] = check_merge(a, b, None, self.trees)
        return self.legal[key]


def _pairs(st: PlanState, horizontal: bool) -> Iterator[tuple[Group, Group, bool]]:
    """Candidate pairs of a state: producer -> consumer, then groups sharing an input
    (or a loop space, when there are few groups)."""
    seen: set[tuple[int, int]] = set()
    for node in st.graph.nodes:
        if node.name not in st.of:
            continue
        b = st.of[node.name]
        for v in node.inputs:
            if v is None or v.producer is None or v.producer.name not in st.of:
                continue
            a = st.of[v.producer.name]
            if a != b and (a, b) not in seen:
                seen.add((a, b))
                yield st.groups[a], st.groups[b], True
    if not horizontal:
        return
    for key in sharing_pairs(st):
        if key not in seen and (key[1], key[0]) not in seen:
            seen.add(key)
            yield st.groups[key[0]], st.groups[key[1]], False


def _price(s: _Search, st: PlanState, a: Group, b: Group, vertical: bool) -> _Move | str:
    """The priced merge of ``a`` and ``b`` (state-independent legality only), or why not."""
    dom, reason = s.domain_check(a, b)
    if dom is None:
        return f"illegal: {reason}"
    merged = merge_groups(min(a.id, b.id), a, b, dom[0], dom[1])
    copy = view_copy_reason(merged, st.graph, st.is_view)
    if copy is not None:
        return f"{reason}; {copy}"
    before = s.group_cost(st, a) + s.group_cost(st, b)
    after = s.group_cost(st, merged)
    return _Move(before - after, a.id, b.id, vertical, dom[0], dom[1], reason, before, after)


def _moves(s: _Search, st: PlanState, horizontal: bool, top_k: int) -> list[_Move]:
    """The ``top_k`` merges of a state that save the most, legal in this state."""
    priced = []
    for a, b, vertical in _pairs(st, horizontal):
        m = _price(s, st, a, b, vertical)
        if isinstance(m, _Move) and m.saved > MIN_GAIN * m.before:
            priced.append(m)
    priced.sort(key=lambda m: -m.saved)
    out = []
    for m in priced:
        if not creates_cycle(st.groups[m.a], st.groups[m.b], st.unit_of):
            out.append(m)
            if len(out) >= top_k:
                break
    return out


def _apply(st: PlanState, m: _Move) -> PlanState:
    nxt = st.copy()
    a, b = nxt.groups[m.a], nxt.groups[m.b]
    why = f"{m.reason}; projected: saves {_us(m.saved)} ({_us(m.before)} -> {_us(m.after)})"
    nxt.decisions.append(Decision(a.id, b.id, rule_name(a, b, m.vertical), True, why))
    nxt.merge(a, b, m.domain, m.axes)
    return nxt


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def _key(st: PlanState) -> frozenset[frozenset[str]]:
    return frozenset(frozenset(g.names) for g in st.groups.values())


def _total(s: _Search, st: PlanState) -> float:
    return sum(s.group_cost(st, g) for g in st.groups.values())


def _record_apart(s: _Search, st: PlanState, horizontal: bool) -> None:
    """Why each pair of the final state's groups that could meet stayed apart."""
    for a, b, vertical in _pairs(st, horizontal):
        m = _price(s, st, a, b, vertical)
        if isinstance(m, str):
            why = m
        elif creates_cycle(a, b, st.unit_of):
            why = "illegal: merging would create a cycle through nodes outside both groups"
        else:
            verdict = "loses" if m.saved < 0 else "saves only"
            why = (
                f"{m.reason}; projected: {verdict} {_us(abs(m.saved))} "
                f"({_us(m.before)} -> {_us(m.after)})"
            )
        st.decisions.append(Decision(a.id, b.id, rule_name(a, b, vertical), False, why))


def search_fusion(
    graph: Graph,
    placement: Placement,
    can_lower: LowerCheck,
    cost: CostFn,
    greedy: FusionPlan | None = None,
    *,
    beam: int = 4,
    top_k: int = 3,
    horizontal: bool = True,
    max_evaluations: int = 400,
    trees: bool = True,
) -> FusionPlan:
    """The cheapest fusion plan a beam search scored by ``cost`` finds. The beam starts
    from the sure merges and, when given, from ``greedy`` (the greedy planner's plan of
    the same graph), so the result is never worse than greedy by the model; the
    search stops expanding once it has priced ``max_evaluations`` distinct groups (each
    a lowering and a schedule: the compile time it may add). ``plan.search`` reports
    the chosen plan and the runner-up (the best other plan seen) with their costs."""
    if beam < 1 or top_k < 1:
        raise ValueError(f"beam and top_k must be >= 1, got {beam}, {top_k}")
    t0 = time.perf_counter()
    start, plan = initial_state(graph, placement, can_lower, trees)
    _sure_merges(start)
    s = _Search(graph, cost, trees)
    seeded = None if greedy is None else _state_of(start, greedy)
    frontier = [start] if seeded is None else [start, seeded]
    seen = {_key(st) for st in frontier}
    top = _Top(seeded)
    for st in frontier:
        top.offer(_total(s, st), st)
    states = len(frontier)
    while frontier and len(s.costs) < max_evaluations:
        children = []
        for st in frontier:
            for m in _moves(s, st, horizontal, top_k):
                nxt = _apply(st, m)
                k = _key(nxt)
                if k not in seen:
                    seen.add(k)
                    children.append((_total(s, nxt), len(children), nxt))
        states += len(children)
        children.sort(key=lambda c: c[:2])
        frontier = [c[2] for c in children[:beam]]
        for c, _, st in children[:2]:
            top.offer(c, st)
    best_cost, best, best_name = top.best[0]
    runner_cost, _, runner_name = top.best[1] if len(top.best) > 1 else (math.inf, None, "none")
    report = SearchReport(best_name, best_cost, runner_name, runner_cost)
    if best is seeded:
        chosen = greedy  # nothing beat the greedy plan: it stays, with its decisions
    else:
        _record_apart(s, best, horizontal)
        chosen = finish_plan(best, plan)
        for name, why in (greedy.unfused if greedy else {}).items():
            if chosen.group_of(name) is None:  # views the greedy plan dissolved
                chosen.unfused.setdefault(name, why)
    report.evaluations, report.states = len(s.costs), states
    report.seconds = time.perf_counter() - t0
    chosen.search = report.lines()
    return chosen


class _Top:
    """The two cheapest distinct states seen, named ``greedy`` (the seeded greedy plan)
    or ``beam search``."""

    def __init__(self, seeded: PlanState | None):
        self.seeded = seeded
        self.best: list[tuple[float, PlanState, str]] = []

    def offer(self, c: float, st: PlanState) -> None:
        name = "greedy" if st is self.seeded else "beam search"
        self.best = sorted([*self.best, (c, st, name)], key=lambda t: t[0])[:2]


def _state_of(start: PlanState, plan: FusionPlan) -> PlanState:
    """A state holding ``plan``'s groups (copies: finishing a state renumbers them)."""
    st = PlanState(start.graph, start.trees)
    for g in plan.groups:
        st.add(Group(g.id, list(g.nodes), g.domain, g.axes, g.levels, g.branches))
    st.decisions = [
        Decision(d.producer, d.consumer, d.rule, d.taken, f"greedy: {d.reason}")
        for d in plan.decisions
        if d.taken
    ]
    return st


def _sure_merges(st: PlanState) -> None:
    """Merge what needs no model: an elementwise group whose every reader is one
    elementwise consumer over the same loop space (nothing is recomputed, the
    intermediate and a launch are saved). Fewer states for the search to price."""
    changed = True
    while changed:
        changed = False
        for a, b, vertical in list(_pairs(st, False)):
            if a.id not in st.groups or b.id not in st.groups or a.axes or b.axes:
                continue
            if not same_shape(a.domain, b.domain) or not _only_reader(st, a, b):
                continue
            dom, reason = check_merge(a, b, st.unit_of, st.trees)
            if dom is None or view_copy_reason(
                Group(a.id, a.nodes + b.nodes, dom[0], dom[1]), st.graph, st.is_view
            ):
                continue
            why = f"{reason}; sure: its only reader, same loop space (no recompute)"
            st.decisions.append(Decision(a.id, b.id, rule_name(a, b, vertical), True, why))
            st.merge(a, b, dom[0], dom[1])
            changed = True


def _only_reader(st: PlanState, a: Group, b: Group) -> bool:
    """Whether every value ``a`` produces is read by ``b`` alone (and no graph output)."""
    outs = {id(v) for v in st.graph.outputs}
    for n in a.nodes:
        for o in n.outputs:
            if id(o) in outs:
                return False
            for c in o.consumers:
                if c.name not in a.names and c.name not in b.names:
                    return False
    return True
