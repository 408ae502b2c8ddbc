"""Fusion legality: which groups *may* merge (profitability is decided elsewhere).

Rules, after CINN's Trivial/Reduce fusion:

* T+T, T+R, R+T: a Trivial group merges with a neighbour when every op of both sits
  on the merged domain (full, reduced or partial; see patterns.placement_on);
* R+R: two reducing groups merge only over the same domain and the same reduce axes;
* horizontal: unconnected groups merge when their domains agree;
* an op that remaps indices (Transpose, Slice, Gather, ...) may read an in-group value
  only when that value is a Trivial chain with no reduction upstream in the group
  (it is then recomputed at the remapped index);
* a Gather's indices come from outside its group (a group input), so the runtime can
  check them against the gathered axis before the kernel runs (a kernel reads memory
  unchecked);
* no merge may create a cycle between groups: there must be no path from one group
  to the other through a node outside both;
* ReduceTree: a reduction may join the reduction group it reads from when its input is
  that group's whole reduced result and the axes left lead the domain (see
  ``reduce_tree.py``); a tree's own nodes were checked when it formed, so with an
  elementwise group only the elementwise group's nodes are checked against its domain;
* Stitch: two reductions of one input over the same domain, one over its leading
  axes (columns), the other over the rest (rows), with no path between them, become
  one kernel that reads the input once (see ``stitch.py``); a stitch group merges
  with nothing further.

Reduce trees and stitches are both refused when the option ``stitch_fusion`` is off.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.patterns import (
    Pattern,
    broadcasts_into,
    pattern_of,
    placement_on,
    reduce_axes,
    remaps_index,
    same_shape,
)
from geode.compiler.fusion.reduce_tree import TreeMerge, tree_merge
from geode.compiler.fusion.stitch import StitchMerge, stitch_merge
from geode.compiler.ir import Node
from geode.compiler.shapes import Dim, shape_str


def merged_domain(a: Group, b: Group) -> tuple[tuple[Dim, ...], frozenset[int]] | str:
    """The domain of ``a`` and ``b`` merged, or the reason they have none."""
    if a.axes and b.axes:
        if same_shape(a.domain, b.domain) and a.axes == b.axes:
            return a.domain, a.axes
        return (
            f"reduce domains differ: {shape_str(a.domain)} axes {sorted(a.axes)} vs "
            f"{shape_str(b.domain)} axes {sorted(b.axes)}"
        )
    if a.axes or b.axes:
        r = a if a.axes else b
        return r.domain, r.axes
    if same_shape(a.domain, b.domain) or broadcasts_into(a.domain, b.domain):
        return b.domain, frozenset()
    if broadcasts_into(b.domain, a.domain):
        return a.domain, frozenset()
    return f"loop spaces {shape_str(a.domain)} and {shape_str(b.domain)} do not align"


def node_fits(node: Node, domain: tuple[Dim, ...], axes: frozenset[int]) -> str | None:
    """None when ``node`` can live on the domain, else why not."""
    if pattern_of(node) is Pattern.REDUCE:
        x = node.inputs[0]
        ax = reduce_axes(node)
        if ax is None or not same_shape(x.shape, domain) or frozenset(ax) != axes:
            return (
                f"{node.op_type} {node.name!r} reduces {shape_str(x.shape)} over {ax}, "
                f"group reduces {shape_str(domain)} over {sorted(axes)}"
            )
        return None
    for o in node.outputs:
        if placement_on(o.shape, domain, axes) is None:
            return f"{node.op_type} {node.name!r} output {shape_str(o.shape)} does not fit {shape_str(domain)}"
    return None


def _inline_only(nodes: list[Node], misfits: set[str]) -> set[str]:
    """Misfit Trivial nodes read in-group only by index-remapping ops (or by other such
    nodes): they are recomputed at the remapped index, so their own shape does not matter."""
    names = {n.name for n in nodes}
    ok: set[str] = set()
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.name not in misfits or n.name in ok or pattern_of(n) is not Pattern.TRIVIAL:
                continue
            readers = [c for o in n.outputs for c in o.consumers if c.name in names]
            if readers and all(remaps_index(c) or c.name in ok for c in readers):
                ok.add(n.name)
                changed = True
    return ok


def _remap_reason(nodes: list[Node]) -> str | None:
    names = {n.name for n in nodes}
    by_name = {n.name: n for n in nodes}
    reduce_tainted: dict[str, bool] = {}

    def tainted(n: Node) -> bool:
        if n.name in reduce_tainted:
            return reduce_tainted[n.name]
        t = pattern_of(n) is Pattern.REDUCE
        if not t:
            for v in n.inputs:
                if v is not None and v.producer is not None and v.producer.name in names:
                    t = t or tainted(by_name[v.producer.name])
        reduce_tainted[n.name] = t
        return t

    for n in nodes:
        if not remaps_index(n):
            continue
        if n.op_type == "Gather":
            ind = n.inputs[1]
            if ind is not None and ind.producer is not None and ind.producer.name in names:
                return (
                    f"Gather {n.name!r} reads indices {ind.name!r} computed in the group "
                    "(indices must be a kernel input, checked before the kernel runs)"
                )
        for v in n.inputs:
            if v is None or v.producer is None or v.producer.name not in names:
                continue
            if tainted(by_name[v.producer.name]):
                return f"{n.op_type} {n.name!r} remaps indices of {v.name!r}, which depends on a reduction"
    return None


def creates_cycle(a: Group, b: Group, unit_of: Callable[[Node], list[Node]] | None = None) -> bool:
    """True if some path leaves one group and re-enters the other through outside units.

    Other groups run as single units: reaching any member of a group means every
    output of that group depends on it, so the search continues from all of the
    group's members (``unit_of(node)`` gives them; a lone node is its own unit).
    """
    inside = a.names | b.names
    members = unit_of or (lambda n: [n])
    for src, dst in ((a, b), (b, a)):
        targets = dst.names
        queue: deque[Node] = deque()
        seen: set[str] = set()
        for n in src.nodes:
            for o in n.outputs:
                for c in o.consumers:
                    _enqueue(members(c), inside, seen, queue)
        while queue:
            n = queue.popleft()
            for o in n.outputs:
                for c in o.consumers:
                    if c.name in targets:
                        return True
                    _enqueue(members(c), inside, seen, queue)
    return False


def _enqueue(nodes: list[Node], inside: set[str], seen: set[str], queue: deque[Node]) -> None:
    for m in nodes:
        if m.name not in inside and m.name not in seen:
            seen.add(m.name)
            queue.append(m)


def _domain_candidates(a: Group, b: Group) -> list[tuple[tuple[Dim, ...], frozenset[int]]] | str:
    dom = merged_domain(a, b)
    cands: list[tuple[tuple[Dim, ...], frozenset[int]]] = []
    if not isinstance(dom, str):
        cands.append(dom)
    if not a.axes and not b.axes:
        # an elementwise pair whose spaces differ may still fuse on one side's space when
        # the other side's ops are read only through index remapping (Split, Transpose)
        for g in (b, a):
            if all(not same_shape(g.domain, c[0]) for c in cands):
                cands.append((g.domain, frozenset()))
    return cands if cands else dom  # type: ignore[return-value]


def check_merge(
    a: Group,
    b: Group,
    unit_of: Callable[[Node], list[Node]] | None = None,
    trees: bool = True,
) -> tuple[tuple[tuple[Dim, ...], frozenset[int]] | None, str]:
    """(merged domain, reason) when legal, (None, reason) when not; ``unit_of`` maps a
    node to the members of the unit (group) it runs in, for the cycle check;
    ``trees=False`` refuses reduce trees and stitches (option ``stitch_fusion``)."""
    stitch = stitch_merge(a, b)
    if isinstance(stitch, str):
        return None, stitch
    if isinstance(stitch, StitchMerge):
        return _check_stitch(a, b, stitch, unit_of, trees)
    tree = tree_merge(a, b)
    if isinstance(tree, str):
        return None, tree
    if isinstance(tree, TreeMerge):
        if not trees:
            return None, "reduce trees are off (option stitch_fusion)"
        remap = _remap_reason(a.nodes + b.nodes)
        if remap:
            return None, remap
        if creates_cycle(a, b, unit_of):
            return None, "merging would create a cycle through nodes outside both groups"
        return (tree.domain, tree.axes), tree.reason
    cands = _domain_candidates(a, b)
    if isinstance(cands, str):
        return None, cands
    nodes = a.nodes + b.nodes
    placed = a.names if a.levels else b.names if b.levels else set()
    why = ""
    for domain, axes in cands:
        misfits = {
            n.name: w for n in nodes if n.name not in placed and (w := node_fits(n, domain, axes))
        }
        inline_only = _inline_only(nodes, set(misfits)) if misfits else set()
        bad = [w for name, w in misfits.items() if name not in inline_only]
        if bad:
            why = bad[0]
            continue
        remap = _remap_reason(nodes)
        if remap:
            return None, remap
        if creates_cycle(a, b, unit_of):
            return None, "merging would create a cycle through nodes outside both groups"
        reason = f"domain {shape_str(domain)}" + (f" reduce axes {sorted(axes)}" if axes else "")
        if inline_only:
            reason += f", recomputing {sorted(inline_only)} at remapped indices"
        return (domain, axes), reason
    return None, why


def _check_stitch(
    a: Group,
    b: Group,
    stitch: StitchMerge,
    unit_of: Callable[[Node], list[Node]] | None,
    trees: bool,
) -> tuple[tuple[tuple[Dim, ...], frozenset[int]] | None, str]:
    if not trees:
        return None, "stitch fusion is off (option stitch_fusion)"
    remap = _remap_reason(a.nodes + b.nodes)
    if remap:
        return None, remap
    if creates_cycle(a, b, unit_of):
        return None, "stitch: a path leads from one reduction to the other through other nodes"
    return (stitch.domain, stitch.rows | stitch.columns), stitch.reason


def rule_name(a: Group, b: Group, vertical: bool) -> str:
    """T+T, T+R, R+T, R+R, ReduceTree, Stitch or horizontal, for the record."""
    if isinstance(stitch_merge(a, b), StitchMerge):
        return "Stitch"
    if isinstance(tree_merge(a, b), TreeMerge):
        return "ReduceTree"
    if not vertical:
        return "horizontal"
    ka = "R" if a.axes else "T"
    kb = "R" if b.axes else "T"
    return f"{ka}+{kb}"
