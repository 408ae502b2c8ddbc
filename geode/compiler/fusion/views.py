"""View ops: the nodes that run as *aliases* in the memory plan, not as kernels.

A view op changes only how a C-contiguous buffer is read: Reshape, Flatten, Squeeze,
Unsqueeze and Identity keep every element where it is and give it a new shape; a Slice
that keeps a contiguous leading range (step 1 on one axis, every axis before it a
static 1, every axis after it whole) keeps a contiguous run of it. Such a node's output
can share its input's storage: the plan gives it no buffer and no step (see
``geode/plan_builder.py`` and ``geode/runtime/plan.py``: ``Alias``).

A node is an alias *candidate* (:func:`alias_view`) when, besides being such an op,
its output shape is known from the graph's inputs alone (the executor computes it from
the symbol binding), its input is not a variable (an assignment could change a
variable under the view) and the view keeps the dtype.

Inside a fusion group a view costs nothing (the kernel reads through the index map),
so fusion still sees through views; :func:`view_copy_reason` refuses only the merges
that would make a kernel *write* a view's output while its input is in memory anyway
(a copy the alias avoids), and a group left holding nothing but views runs no kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from geode.compiler.ir import Graph, Node, ValueKind
from geode.compiler.shapes import free_symbols

if TYPE_CHECKING:
    from geode.compiler.fusion.groups import Group

__all__ = ["RESHAPE_VIEWS", "ViewSpec", "alias_view", "view_copy_reason"]

#: ops whose output is their input with another shape (the elements keep their order)
RESHAPE_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})

#: an ``end`` at least this large reads to the end of its axis (what exporters write for
#: "to the end" when the axis is symbolic)
_TO_END = 2**31 - 1


@dataclass(frozen=True)
class ViewSpec:
    """How an alias reads its input: ``kind`` "reshape" (the output shape, same
    elements) or "slice" (``input[:, ..., start:end]`` on ``axis``, step 1; the axes
    before it are static 1s, so the range is contiguous)."""

    kind: str
    axis: int = 0
    start: int = 0
    end: int = 0

    def describe(self) -> str:
        """``reshape`` or ``slice axis 1 [2:5]``."""
        if self.kind == "slice":
            return f"slice axis {self.axis} [{self.start}:{self.end}]"
        return self.kind


def alias_view(node: Node, bound: set) -> ViewSpec | None:
    """The view ``node`` is when it can be an alias of its input, else None.

    ``bound``: the symbols the graph's inputs bind (the output shape must be a function
    of them alone)."""
    if len(node.outputs) != 1 or not node.inputs or node.inputs[0] is None:
        return None
    x, out = node.inputs[0], node.outputs[0]
    if x.kind is ValueKind.VARIABLE or x.dtype != out.dtype:
        return None
    if x.shape is None or out.shape is None or not free_symbols(out.shape) <= bound:
        return None
    if not free_symbols(x.shape) <= bound:
        return None
    if node.op_type in RESHAPE_VIEWS:
        if node.op_type in ("Squeeze", "Unsqueeze") and _non_units(x.shape) != _non_units(
            out.shape
        ):
            return None  # a symbolic dim that may be 1: the shapes may not agree at run time
        return ViewSpec("reshape")
    if node.op_type == "Slice":
        return _slice_view(node)
    return None


def _non_units(shape: tuple) -> list:
    return [d for d in shape if d != 1]


def _const_ints(node: Node, i: int) -> list[int] | None:
    v = node.input(i)
    if v is None:
        return None
    if not v.is_constant or v.data is None:
        raise ValueError("not constant")
    return [int(t) for t in np.asarray(v.data).reshape(-1)]


def _slice_view(node: Node) -> ViewSpec | None:
    """A Slice that keeps one contiguous run of its C-contiguous input, else None."""
    x = node.inputs[0]
    rank = len(x.shape)
    try:
        starts, ends = _const_ints(node, 1), _const_ints(node, 2)
        axes, steps = _const_ints(node, 3), _const_ints(node, 4)
    except ValueError:
        return None
    if starts is None or ends is None or len(starts) != len(ends):
        return None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if len(axes) != len(starts) or len(steps) != len(starts) or rank == 0:
        return None
    cut: list[tuple[int, int, int]] = []
    for s, e, a, p in zip(starts, ends, axes, steps):
        if not -rank <= a < rank:
            return None
        a %= rank
        if _whole(s, e, x.shape[a]) and p == 1:
            continue
        if p != 1:
            return None
        cut.append((a, s, e))
    if len(cut) > 1:
        return None
    if not cut:
        return ViewSpec("slice", 0, 0, _TO_END)  # every axis whole: the input itself
    a, s, e = cut[0]
    if any(d != 1 for d in x.shape[:a]):
        return None
    return ViewSpec("slice", a, s, e)


def _whole(start: int, end: int, dim: object) -> bool:
    """Whether ``[start:end]`` covers an axis of ``dim`` (int, or symbolic)."""
    if isinstance(dim, int):
        s = start + dim if start < 0 else start
        e = end + dim if end < 0 else end
        return s <= 0 and e >= dim
    return start == 0 and end >= _TO_END


def view_copy_reason(
    group: Group, graph: Graph, is_view: Callable[[Node], ViewSpec | None]
) -> str | None:
    """Why ``group`` (a merge candidate) should not be one kernel, or None.

    The kernel would write the output of one of its views while that view's input is
    in memory anyway (read from outside the group, or written by it too): a copy that
    the view, left on its own as an alias, does not make."""
    names = group.names
    written = {id(v) for v in group.outputs(graph)}
    for n in group.nodes:
        if is_view(n) is None or id(n.outputs[0]) not in written:
            continue
        x = n.inputs[0]
        outside = x.producer is None or x.producer.name not in names
        if outside or id(x) in written:
            return (
                f"the kernel would copy view {n.op_type} {n.name!r} of {x.name!r} into a "
                "buffer of its own; apart, it is an alias of its input (no copy)"
            )
    return None
