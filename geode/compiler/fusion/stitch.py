"""Stitch fusion: a row reduction and a column reduction of one input in one kernel.

``r = ReduceSum(x, axes=[1])`` and ``c = ReduceSum(x, axes=[0])`` of one ``x[N, M]``
reduce over different loop domains, so the plain rules (R+R only over the same domain
and axes) and the reduce-tree rules (one reduction reads the other's result) keep
them in two kernels that each read ``x``. A *stitch* group runs both in one kernel:
its domain is the shared input's shape, its ``branches`` the axes each reduction
reduces (in domain coordinates; ``axes`` is their union). The kernel walks ``x`` once:
rows in parallel blocks, and per row one loop over the columns that both adds into the
row's accumulator and into the block's private column accumulator; the column partials
of the blocks are reduced at the end (``codegen/autoschedule.py: _stitch_reduce``).

Legality (:func:`stitch_merge`), for two groups ``a`` and ``b``:

* both are plain reduction groups (no reduce tree, no stitch group already) over the
  same domain, with different axes that split the domain into a leading run of axes
  (the column reduction's) and the trailing rest (the row reduction's);
* they read the same full-domain value: a common input from outside, or a value one
  group computes before reducing (an elementwise prologue such as ``x * x``) that the
  other reads; neither reads what the other computes after reducing (that is a
  chain: a reduce tree). Pairs without such a value are no stitch case: the plain
  rules give their reason;
* the column side holds one reduction (the kernel keeps one set of column partials);
  the row side may hold several over the same axes (a row sum and a row max), and a
  further row reduction of the input may join a stitch group later; a stitch group
  merges with nothing else;
* neither writes values over its full domain after reducing (a broadcast epilogue
  such as ``x - mean`` is a ``reduce_broadcast`` kernel of its own);
* no path leads from one group to the other through nodes outside both (checked by
  the caller, ``rules.check_merge``, like every merge).

Whether a legal stitch pays (the shared input read once instead of twice, against
the column partials every row block writes and the final combine reads) is the
profitability model's call (``profit.py: stitch_work``, ``stitch_parallelism_lost``),
kept apart from legality.
"""

from __future__ import annotations

from dataclasses import dataclass

from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.patterns import (
    Pattern,
    pattern_of,
    placement_on,
    reduce_axes,
    same_shape,
)
from geode.compiler.fusion.reduce_tree import broadcast_epilogue, merged_group
from geode.compiler.ir import Node, Value
from geode.compiler.shapes import Dim, shape_str

#: column partials the stitch kernel keeps (one private column accumulator per block of
#: rows, at most one block per row): the schedule's default
#: (``codegen/autoschedule.py: Choices.stitch_partials``) and the profitability
#: model's assumption (``profit.py: stitch_work``)
STITCH_PARTIALS = 16


@dataclass(frozen=True)
class StitchMerge:
    """A legal stitch: the domain, the column and row branches' axes, the shared value
    and the reason."""

    domain: tuple[Dim, ...]
    columns: frozenset[int]
    rows: frozenset[int]
    shared: str
    reason: str

    @property
    def branches(self) -> tuple[frozenset[int], frozenset[int]]:
        """The branches in kernel order: the row reduction's axes, then the column's."""
        return (self.rows, self.columns)


def is_stitch(g: Group) -> bool:
    """Whether ``g`` is a stitch group (two reductions over different axes, side by side)."""
    return bool(g.branches)


def _pre_reduce_values(g: Group) -> dict[int, Value]:
    """Full-domain values ``g`` computes before any of its reductions (its prologue)."""
    after: set[str] = set()
    out: dict[int, Value] = {}
    for n in g.nodes:  # graph order
        downstream = pattern_of(n) is Pattern.REDUCE or any(
            v is not None and v.producer is not None and v.producer.name in after for v in n.inputs
        )
        if downstream:
            after.add(n.name)
            continue
        for o in n.outputs:
            if same_shape(o.shape, g.domain):
                out[id(o)] = o
    return out


def _post_reduce_names(g: Group) -> set[str]:
    after: set[str] = set()
    for n in g.nodes:
        if pattern_of(n) is Pattern.REDUCE or any(
            v is not None and v.producer is not None and v.producer.name in after for v in n.inputs
        ):
            after.add(n.name)
    return after


def _shared_value(a: Group, b: Group) -> Value | None:
    """The full-domain value both groups read (one reads it from the other's prologue,
    or both from outside); None when there is none, or when one reads what the other
    computes after reducing (a chain, not side by side: the reduce-tree and plain
    rules decide)."""
    for reader, writer in ((a, b), (b, a)):
        post = _post_reduce_names(writer)
        if any(v.producer is not None and v.producer.name in post for v in reader.inputs()):
            return None
    pre = {**_pre_reduce_values(a), **_pre_reduce_values(b)}
    ins_a = {id(v): v for v in a.inputs()}
    ins_b = {id(v): v for v in b.inputs()}
    for key, v in list(ins_a.items()) + list(ins_b.items()):
        full = same_shape(v.shape, a.domain) and not v.is_constant
        if full and (key in ins_a and key in ins_b or key in pre):
            return v
    return None


def _split(domain: tuple[Dim, ...], a: frozenset[int], b: frozenset[int]) -> int | None:
    """``s`` when one of ``a``, ``b`` is the axes ``[0, s)`` and the other ``[s, rank)``."""
    rank = len(domain)
    for lead, trail in ((a, b), (b, a)):
        s = len(lead)
        if 0 < s < rank and lead == frozenset(range(s)) and trail == frozenset(range(s, rank)):
            return s
    return None


def stitch_merge(a: Group, b: Group) -> StitchMerge | str | None:
    """The stitch of ``a`` and ``b``; a string saying why they cannot be stitched when
    both reduce the same domain over different axes (or one is a stitch group already);
    None when this is no stitch case (the other rules decide)."""
    if not (a.axes and b.axes):
        return None
    if a.branches or b.branches:
        return _join(a, b) if a.branches else _join(b, a)
    if a.levels or b.levels:
        return None  # reduce trees: their own rules
    if not same_shape(a.domain, b.domain) or a.axes == b.axes:
        return None
    s = _split(a.domain, a.axes, b.axes)
    if s is None:
        return (
            f"stitch: axes {sorted(a.axes)} and {sorted(b.axes)} of {shape_str(a.domain)} "
            "do not split it into leading (column) and trailing (row) axes"
        )
    shared = _shared_value(a, b)
    if shared is None:
        return None  # nothing read by both, or a chain: the other rules say why
    columns, rows = (a.axes, b.axes) if len(a.axes) == s and 0 in a.axes else (b.axes, a.axes)
    col_group = a if a.axes == columns else b
    count = sum(1 for n in col_group.nodes if pattern_of(n) is Pattern.REDUCE)
    if count != 1:
        return (
            f"stitch: group {col_group.id} holds {count} column reductions "
            "(a stitch kernel holds one)"
        )
    for g in (a, b):
        why = _side_reason(g)
        if why:
            return why
    reason = (
        f"stitch over {shape_str(a.domain)}: rows reduced over {sorted(rows)} and columns "
        f"over {sorted(columns)} in one pass over {shared.name!r} (column partials per row block)"
    )
    return StitchMerge(a.domain, columns, rows, shared.name, reason)


def _side_reason(g: Group) -> str | None:
    """Why ``g`` cannot be a side of a stitch, or None."""
    if broadcast_epilogue(g):
        return f"stitch: group {g.id} writes values over its full domain after reducing"
    for n in g.nodes:
        if pattern_of(n) is Pattern.NONE:
            return f"{n.op_type} {n.name!r} is not fusable"
        if pattern_of(n) is not Pattern.REDUCE and any(
            placement_on(o.shape, g.domain, g.axes) is None for o in n.outputs
        ):
            return f"stitch: {n.op_type} {n.name!r} does not sit on {shape_str(g.domain)}"
    return None


def _join(st: Group, g: Group) -> StitchMerge | str:
    """A plain row reduction ``g`` of the stitch group ``st``'s input joining it (a row
    sum and a row max of ``x`` next to its column sum), or why not."""
    rows, columns = st.branches
    if g.branches or g.levels or not same_shape(g.domain, st.domain) or g.axes != rows:
        return "a stitch group merges only with another row reduction of its input"
    shared = _shared_value(st, g)
    if shared is None:
        return "stitch: the row reduction shares no full-domain input with the stitch"
    why = _side_reason(g)
    if why:
        return why
    reason = (
        f"stitch over {shape_str(st.domain)}: another row reduction over {sorted(rows)} "
        f"joins the pass over {shared.name!r}"
    )
    return StitchMerge(st.domain, columns, rows, shared.name, reason)


def lowering_order(g: Group) -> list[Node]:
    """A stitch group's nodes in the order its kernel lowers them: the prologue (what
    no reduction precedes), then the column reduction and what follows it, then the
    row reduction and what follows it (each part in graph order). The row reduction's
    nests come last so the schedule can move them into the column reduction's row
    loop without passing a nest that reads them (a mean's division)."""
    if not g.branches:
        return list(g.nodes)
    columns = g.branches[1]
    part: dict[str, int] = {}
    for n in g.nodes:  # graph order: a node follows the reduction it reads
        if pattern_of(n) is Pattern.REDUCE and n.inputs[0] is not None:
            axes = frozenset(reduce_axes(n) or ())
            part[n.name] = 1 if axes == columns else 2
            continue
        ups = {
            part.get(v.producer.name, 0)
            for v in n.inputs
            if v is not None and v.producer is not None
        }
        part[n.name] = max(ups, default=0)
    return sorted(g.nodes, key=lambda n: part[n.name])  # stable: graph order inside


def merge_groups(
    gid: int, a: Group, b: Group, domain: tuple[Dim, ...], axes: frozenset[int]
) -> Group:
    """The union of ``a`` and ``b`` over ``domain`` and ``axes``: a stitch group (with
    its branches) when they stitch, else ``reduce_tree.merged_group``'s union (with the
    levels of the tree it forms, if any)."""
    st = stitch_merge(a, b)
    if isinstance(st, StitchMerge):
        return Group(gid, a.nodes + b.nodes, domain, axes, branches=st.branches)
    return merged_group(gid, a, b, domain, axes)
