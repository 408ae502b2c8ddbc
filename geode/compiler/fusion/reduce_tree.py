"""ReduceTree fusion: chained reductions over different axes of one input in one kernel.

``x[N, C, HW] -> mean over HW -> [N, C] -> mean over C -> [N]`` is two reductions with
different reduce domains, so the plain rules (R+R only over the same domain and axes)
keep them in two kernels: the first writes ``[N, C]`` to memory, the second reads it
back. A *reduce tree* group runs both in one kernel: its domain is the first
reduction's input, its ``axes`` every axis the chain reduces and its ``levels`` the
axes of each reduction in turn (domain coordinates). The kernel has one parallel loop
over the *rows* (the leading axes no level reduces); per row, the first reduction
fills a row buffer that the next one reduces, so the intermediate stays in cache (or
in registers) unless something outside also reads it, when it is written out as well.

Legality (:func:`tree_merge`), for a producer group ``p`` and a consumer group ``c``:

* both reduce (either may already be a tree: a chain grows from either end);
* ``c`` reads a value that ``p`` computes, and ``c``'s domain is ``p``'s domain reduced
  over ``p``'s axes (keepdims or not): the second reduction's input is produced whole,
  row by row, inside the kernel;
* neither computes values over its full domain from its reductions (a broadcast
  epilogue such as ``x - mean``: such a group is a ``reduce_broadcast`` kernel of its
  own); an elementwise prologue (``x * x`` summed) is fine;
* the axes left unreduced (the rows) are not empty and lead the domain, so every
  loop nest of the kernel starts with the same row loop.

A tree merges further only with elementwise groups (before or after it, over its
domain or its reduced shape) and with the next reduction of its chain. Whether a
legal tree pays (traffic saved against parallelism lost: the fused kernel runs rows in
parallel, the first reduction alone ran rows times its other kept axes) is the
profitability model's call (``profit.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from geode.compiler.fusion.groups import Group
from geode.compiler.fusion.patterns import Pattern, pattern_of, placement_on, same_shape
from geode.compiler.shapes import Dim, shape_str


@dataclass(frozen=True)
class TreeMerge:
    """A legal reduce-tree merge: the merged domain, axes, levels and the reason."""

    domain: tuple[Dim, ...]
    axes: frozenset[int]
    levels: tuple[frozenset[int], ...]
    reason: str


def levels_of(g: Group) -> tuple[frozenset[int], ...]:
    """The reduce levels of a group: its ``levels`` for a tree, ``(axes,)`` for a plain
    reduction group, empty for an elementwise one."""
    if g.levels:
        return g.levels
    return (g.axes,) if g.axes else ()


def row_axes(domain: tuple[Dim, ...], axes: frozenset[int]) -> list[int]:
    """The axes of ``domain`` no level reduces (the tree's rows), in order."""
    return [i for i in range(len(domain)) if i not in axes]


def _reads_from(consumer: Group, producer: Group) -> bool:
    names = producer.names
    return any(v.producer is not None and v.producer.name in names for v in consumer.inputs())


def broadcast_epilogue(g: Group) -> bool:
    """Whether ``g`` computes a value on its full domain from one of its reductions (a
    broadcast epilogue such as ``x - mean``; a prologue such as ``x * x`` is fine)."""
    names = g.names
    after: set[str] = set()  # nodes downstream of a reduction, inside the group
    for n in g.nodes:  # graph order
        if pattern_of(n) is Pattern.REDUCE or any(
            v is not None and v.producer is not None and v.producer.name in after for v in n.inputs
        ):
            after.add(n.name)
    return any(
        n.name in after
        and pattern_of(n) is not Pattern.REDUCE
        and any(placement_on(o.shape, g.domain, g.axes) == "full" for o in n.outputs)
        for n in g.nodes
        if n.name in names
    )


def _map_axes(axes: frozenset[int], consumer: Group, producer: Group) -> frozenset[int]:
    """Axes of the consumer's domain in the producer's domain coordinates (the consumer's
    domain is the producer's reduced shape, with the reduced axes kept as 1 or dropped)."""
    if len(consumer.domain) == len(producer.domain):
        return axes
    kept = row_axes(producer.domain, producer.axes)
    return frozenset(kept[j] for j in axes)


def tree_merge(a: Group, b: Group) -> TreeMerge | str | None:
    """The reduce tree of ``a`` and ``b``; a string saying why they cannot form one
    when a tree is involved or both reduce over different domains and one reads the
    other; None when this is no tree case (the plain rules decide)."""
    if not (a.axes and b.axes):
        return None  # elementwise with anything: the plain rules (a tree side's nodes fit)
    plain = not a.levels and not b.levels
    if plain and same_shape(a.domain, b.domain) and a.axes == b.axes:
        return None  # an ordinary R+R merge
    if _reads_from(b, a) and not _reads_from(a, b):
        producer, consumer = a, b
    elif _reads_from(a, b) and not _reads_from(b, a):
        producer, consumer = b, a
    elif plain:
        return None  # unrelated reductions over different domains: the plain rules say why
    else:
        return "a reduce tree merges only with elementwise groups and the next reduction it feeds"
    if plain and placement_on(consumer.domain, producer.domain, producer.axes) != "reduced":
        return None  # not a chain (the reader reduces a full-domain value): plain rules
    return _chain(producer, consumer)


def _chain(producer: Group, consumer: Group) -> TreeMerge | str:
    if placement_on(consumer.domain, producer.domain, producer.axes) != "reduced":
        return (
            f"the second reduction's input {shape_str(consumer.domain)} is not the first's "
            f"whole result ({shape_str(producer.domain)} reduced over {sorted(producer.axes)})"
        )
    for g in (producer, consumer):
        if broadcast_epilogue(g):
            return f"group {g.id} writes values over its full domain after reducing"
    for n in consumer.nodes:
        if pattern_of(n) is Pattern.NONE:
            return f"{n.op_type} {n.name!r} is not fusable"
    added: list[frozenset[int]] = []
    for lv in levels_of(consumer):
        new = _map_axes(lv, consumer, producer) - producer.axes
        if not new:
            return "the second reduction reduces only axes the first already reduced"
        added.append(new)
    axes = producer.axes.union(*added)
    rows = row_axes(producer.domain, axes)
    if not rows:
        return "the chain reduces every axis: no row loop for its reductions to share"
    if rows != list(range(len(rows))):
        return (
            f"the axes left {rows} do not lead {shape_str(producer.domain)}: "
            "the reductions' loop nests share no outer row loop"
        )
    levels = levels_of(producer) + tuple(added)
    text = " then ".join(str(sorted(lv)) for lv in levels)
    reason = (
        f"reduce tree over {shape_str(producer.domain)}: axes {text} in one kernel, "
        f"rows {rows} in parallel, the intermediate kept per row"
    )
    return TreeMerge(producer.domain, axes, levels, reason)


def merged_group(
    gid: int, a: Group, b: Group, domain: tuple[Dim, ...], axes: frozenset[int]
) -> Group:
    """The union of ``a`` and ``b`` over ``domain`` and ``axes`` (node order as given),
    with the levels of the tree it forms, if any."""
    levels: tuple[frozenset[int], ...] = ()
    tree = tree_merge(a, b)
    if isinstance(tree, TreeMerge):
        levels = tree.levels
    elif a.levels or b.levels:
        levels = a.levels or b.levels  # an elementwise group joins a tree
    return Group(gid, a.nodes + b.nodes, domain, axes, levels)
