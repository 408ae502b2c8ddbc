"""Trivial/Reduce classification and the loop domain each op lives on.

A fused group runs over one *domain*: a full iteration space ``D`` (a shape) and the
set ``A`` of its axes that the group's reductions reduce (empty for elementwise
groups). Each op of a group sits on that domain in one of three ways:

* ``full``: its output has shape ``D`` (elementwise work over the whole space);
* ``reduced``: its output has the shape of ``D`` reduced over ``A`` (keepdims or not),
  e.g. the mean of a LayerNorm row and the scalar math on it;
* ``partial``: its output broadcasts into ``D`` (a [K] bias computation inside an
  [N, K] group); it is recomputed wherever it is read.
"""

from __future__ import annotations

import enum

import numpy as np

from geode.compiler.ir import Node
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.shapes import Dim, Shape, broadcasts_to, dims_equal

#: reductions the code generator can fuse (after decomposition of the others)
FUSABLE_REDUCES = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"})

#: injective ops whose index map keeps every non-unit axis in place (they only cast,
#: broadcast, or insert/drop unit axes), so they may read a reduced value of the same row
ROW_PRESERVING = frozenset({"Identity", "Cast", "CastLike", "Expand", "Squeeze", "Unsqueeze"})


class Pattern(enum.Enum):
    """Fusion class of an op."""

    TRIVIAL = "trivial"
    REDUCE = "reduce"
    NONE = "none"


def pattern_of(node: Node) -> Pattern:
    """TRIVIAL for elementwise/broadcast/injective ops, REDUCE for fusable reductions."""
    od = registry.get(node.op_type, node.domain, node.where)
    if od.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE):
        return Pattern.TRIVIAL
    if od.kind is OpKind.REDUCE and node.op_type in FUSABLE_REDUCES:
        return Pattern.REDUCE
    return Pattern.NONE


def remaps_index(node: Node) -> bool:
    """True for injective ops whose output index maps to a different input index."""
    od = registry.get(node.op_type, node.domain, node.where)
    return od.kind is OpKind.INJECTIVE and node.op_type not in ROW_PRESERVING


def reduce_axes(node: Node) -> tuple[int, ...] | None:
    """Normalised reduce axes of a Reduce* node (None when not constant)."""
    x = node.inputs[0]
    if x is None or x.shape is None:
        return None
    rank = len(x.shape)
    axes = const_ints_of(node)
    if axes is None:
        return None
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return ()
        return tuple(range(rank))
    return tuple(sorted({a + rank if a < 0 else a for a in axes}))


def const_ints_of(node: Node) -> list[int] | None:
    """The constant ``axes`` input of a reduction (empty list when omitted)."""
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return []
    v = node.inputs[1]
    if not v.is_constant or v.data is None:
        return None
    return [int(x) for x in np.asarray(v.data).reshape(-1)]


def same_shape(a: Shape, b: Shape) -> bool:
    """Provably equal shapes."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(dims_equal(x, y) is True for x, y in zip(a, b))


def reduced_shapes(
    domain: tuple[Dim, ...], axes: frozenset[int]
) -> tuple[tuple[Dim, ...], tuple[Dim, ...]]:
    """The keepdims and squeezed shapes of ``domain`` reduced over ``axes``."""
    keep = tuple(1 if i in axes else d for i, d in enumerate(domain))
    squeeze = tuple(d for i, d in enumerate(domain) if i not in axes)
    return keep, squeeze


def broadcasts_into(small: Shape, big: tuple[Dim, ...]) -> bool:
    """``small`` broadcasts to ``big``: every dim a static 1, provably equal, or an
    operand of a symbolic broadcast (``N`` into ``bcast(M, N)``: N is that dim or 1 at
    run time; see :func:`geode.compiler.shapes.broadcasts_to`)."""
    if small is None or len(small) > len(big):
        return False
    return all(broadcasts_to(s, b) for s, b in zip(reversed(small), reversed(big)))


def placement_on(shape: Shape, domain: tuple[Dim, ...], axes: frozenset[int]) -> str | None:
    """How a value of ``shape`` sits on a group domain: full, reduced, partial or None."""
    if same_shape(shape, domain):
        return "full"
    if axes:
        keep, squeeze = reduced_shapes(domain, axes)
        if same_shape(shape, keep) or same_shape(shape, squeeze):
            return "reduced"
    if broadcasts_into(shape, domain):
        return "partial"
    return None
