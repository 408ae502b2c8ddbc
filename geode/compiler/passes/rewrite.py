"""Helpers shared by the graph passes: replacing values, legality checks, node builders.

The one rule every rewrite obeys: a graph output keeps its name. When a pass
replaces the value behind a graph output, :func:`replace_value` moves the output's
name onto the replacement (or, when the replacement cannot be renamed, anchors the
name on an ``Identity`` of it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from geode.compiler.ir import Graph, Node, TensorDesc, Value, ValueKind
from geode.compiler.ops import registry
from geode.compiler.ops.state import SIDE_EFFECT_OPS
from geode.compiler.shapes import Shape, dims_equal, is_static
from geode.errors import GeodeError

#: ops whose results are random; never folded or merged.
RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
    }
)


# -- queries ---------------------------------------------------------------------------
def is_output(graph: Graph, v: Value) -> bool:
    """Whether ``v`` is a graph output."""
    return any(o is v for o in graph.outputs)


def is_dead(graph: Graph, v: Value) -> bool:
    """No node reads ``v`` and it is not a graph output."""
    return not v.uses and not is_output(graph, v)


def has_graph_attr(node: Node) -> bool:
    """Whether a node carries a subgraph attribute (If/Loop/Scan bodies)."""
    return any(isinstance(a, Graph) for a in node.attrs.values())


def node_alive(graph: Graph, node: Node) -> bool:
    """Whether ``node`` is still in ``graph`` (its outputs are still the graph's values)."""
    if not node.outputs:
        return any(n is node for n in graph.nodes)
    out = node.outputs[0]
    return graph.values.get(out.name) is out


def shapes_equal(a: Shape, b: Shape) -> bool:
    """True only when two shapes are provably equal (same rank, every dim equal)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(dims_equal(x, y) is True for x, y in zip(a, b))


def broadcast_keeps_shape(x: Value, other: Value) -> bool:
    """Whether broadcasting ``other`` against ``x`` provably leaves ``x``'s shape unchanged.

    True when ``other`` is a scalar, or its rank is at most ``x``'s and each of its dims
    is 1 or provably equal to ``x``'s dim at the same (right-aligned) position.
    """
    if other.shape is None:
        return False
    if len(other.shape) == 0:
        return True
    if x.shape is None or len(other.shape) > len(x.shape):
        return False
    tail = x.shape[len(x.shape) - len(other.shape) :]
    return all(d == 1 or dims_equal(d, xd) is True for d, xd in zip(other.shape, tail))


def const_value(v: Value | None) -> np.ndarray | None:
    """The data of a constant value (None for anything else)."""
    if v is None or not v.is_constant or v.data is None:
        return None
    return np.asarray(v.data)


def const_ints(v: Value | None) -> list[int] | None:
    """A constant integer tensor as a flat list of ints (None when not constant)."""
    data = const_value(v)
    if data is None or not np.issubdtype(data.dtype, np.integer):
        return None
    return [int(x) for x in data.reshape(-1)]


def is_splat(v: Value | None, value: float) -> bool:
    """Whether ``v`` is a non-empty constant whose every element equals ``value``."""
    data = const_value(v)
    if data is None or data.size == 0 or data.dtype == np.bool_:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.all(data == value))


def static_nbytes(desc: TensorDesc) -> int | None:
    """Bytes of a tensor with a static shape (None when the shape is not static)."""
    if not is_static(desc.shape):
        return None
    n = 1
    for d in desc.shape:
        n *= int(d)
    return n * desc.dtype.itemsize


# -- editing ---------------------------------------------------------------------------
def can_rename(graph: Graph, v: Value) -> bool:
    """Whether ``v`` can take a graph output's name (intermediates and constants can)."""
    return v.kind in (ValueKind.INTERMEDIATE, ValueKind.CONSTANT) and not is_output(graph, v)


def replace_value(graph: Graph, old: Value, new: Value, *, allow_identity: bool = True) -> bool:
    """Make every reader of ``old`` read ``new``, keep graph output names, drop dead producers.

    When ``old`` is a graph output, ``new`` takes its name; when ``new`` cannot be
    renamed (a graph input, a variable, or already an output) an ``Identity`` of
    ``new`` carries the name instead, unless ``allow_identity`` is False, in which case
    nothing changes and False is returned. Returns True when the replacement was made.
    """
    if old is new:
        return False
    was_output = is_output(graph, old)
    if was_output and not can_rename(graph, new) and not allow_identity:
        return False
    for node, i in list(old.uses):
        node.set_input(i, new)
    if was_output:
        name = old.name
        graph.rename(old, graph.unique_name(f"{name}_replaced"))
        if can_rename(graph, new):
            graph.rename(new, name)
            anchor = new
        else:
            anchor = graph.add_node("Identity", [new], output_names=[name]).outputs[0]
        graph.outputs = [anchor if o is old else o for o in graph.outputs]
    if old.producer is not None:
        remove_dead_nodes(graph, [old.producer])
    return True


def remove_dead_nodes(graph: Graph, nodes: Iterable[Node]) -> int:
    """Remove the given nodes if all their outputs are dead, then their dead producers.

    Constants left without readers are forgotten too. Returns how many nodes went.
    """
    work = list(nodes)
    removed = 0
    while work:
        node = work.pop()
        if not node_alive(graph, node) or node.op_type in SIDE_EFFECT_OPS:
            continue
        if not all(is_dead(graph, o) for o in node.outputs):
            continue
        ins = [v for v in node.inputs if v is not None]
        graph.remove_node(node)
        removed += 1
        for v in ins:
            if v.uses or is_output(graph, v):
                continue
            if v.producer is not None:
                work.append(v.producer)
            elif v.kind is ValueKind.CONSTANT:
                graph.remove_value(v)
    return removed


class Rewriter:
    """Builds replacement nodes for one rewrite and can undo them.

    ``op`` adds a node (verified, shapes inferred), ``const`` a constant; ``rollback``
    removes everything built since the Rewriter was made, so a rewrite whose result
    turns out illegal leaves the graph as it was.
    """

    def __init__(self, graph: Graph, anchor: Node | None = None):
        self.graph = graph
        self.anchor = anchor
        self.nodes: list[Node] = []
        self.consts: list[Value] = []

    def op(self, op_type: str, *inputs: Value | None, n_outputs: int = 1, **attrs: Any) -> Any:
        """Add a node; returns its output (or a tuple of outputs)."""
        base = (
            f"{self.anchor.name}_{op_type.lower()}" if self.anchor is not None else op_type.lower()
        )
        node = self.graph.add_node(op_type, list(inputs), attrs, n_outputs=n_outputs, name=base)
        self.nodes.append(node)
        return node.outputs[0] if n_outputs == 1 else tuple(node.outputs)

    def const(self, data: object, dtype: object) -> Value:
        """A new constant with an explicit dtype."""
        arr = np.asarray(data, dtype=dtype)
        base = f"{self.anchor.name}_c" if self.anchor is not None else "const"
        v = self.graph.constant(arr, name=base, dtype=arr.dtype)
        self.consts.append(v)
        return v

    def ints(self, values: Sequence[int]) -> Value:
        """A new int64 1-D constant (axes, shapes, perms)."""
        return self.const(np.array(list(values), dtype=np.int64), np.int64)

    def scalar(self, value: float, like: Value) -> Value:
        """A rank-0 constant with ``like``'s dtype."""
        return self.const(np.array(value, dtype=like.dtype), like.dtype)

    def rollback(self) -> None:
        """Remove every node and constant this Rewriter built."""
        for node in reversed(self.nodes):
            for out in node.outputs:
                for user, i in list(out.uses):
                    user.set_input(i, None)
            self.graph.remove_node(node)
        for v in self.consts:
            if not v.uses:
                self.graph.remove_value(v)
        self.nodes.clear()
        self.consts.clear()


def has_ops(*op_types: str) -> bool:
    """Whether every op type is registered (rewrites that need an op skip without it)."""
    return all(registry.has(t) for t in op_types)


def try_rewrite(graph: Graph, node: Node, build: Any) -> bool:
    """Run ``build(rw)`` to make replacements for ``node``'s outputs and install them.

    ``build`` returns a list with one Value (or None: keep) per output of ``node``, or
    None to give up. The replacement is installed only when each new value has the
    old output's dtype and a shape that is provably equal, or equal in rank and not
    provably different; otherwise everything built is rolled back. Errors raised by
    shape inference while building also roll back (the node is left as it was).
    """
    rw = Rewriter(graph, node)
    try:
        repl = build(rw)
    except GeodeError:
        rw.rollback()
        return False
    if repl is None or not any(r is not None for r in repl):
        rw.rollback()
        return False
    for old, new in zip(node.outputs, repl):
        if new is None:
            continue
        if new.dtype != old.dtype or not _compatible_shapes(old.shape, new.shape):
            rw.rollback()
            return False
    for old, new in zip(node.outputs, repl):
        if new is not None:
            replace_value(graph, old, new)
    remove_dead_nodes(graph, [node])
    return True


def _compatible_shapes(old: Shape, new: Shape) -> bool:
    if old is None:
        return True
    if new is None or len(old) != len(new):
        return False
    return all(dims_equal(a, b) is not False for a, b in zip(old, new))


def reinfer_consumers(graph: Graph, values: Iterable[Value]) -> int:
    """Re-run shape inference below values that just became constants.

    A consumer's new output descs are kept only when they are strictly more precise
    (a rank where there was none, named or static dims where there were fresh
    symbols, a symbolic value where there was none); then its own consumers are
    revisited. Returns how many nodes learnt something.

    A node is queued again whenever one of its producers learns something: a node
    reached first through one input, while another input still had its old shape,
    learns nothing then but must not be left out when that other input improves.
    Every requeue follows a strict improvement, so the walk ends.
    """
    work: deque[Node] = deque()
    queued: set[int] = set()

    def enqueue(nodes: Iterable[Node]) -> None:
        for n in nodes:
            if id(n) not in queued:
                queued.add(id(n))
                work.append(n)

    enqueue(n for v in values for n in v.consumers)
    improved = 0
    while work:
        node = work.popleft()
        queued.discard(id(node))
        if all(_settled(o) for o in node.outputs):
            continue
        old = [(o.desc, getattr(o, "sym_value", None)) for o in node.outputs]
        try:
            registry.infer_node(graph, node)
        except GeodeError:
            _restore(node, old)
            continue
        if any(o.desc.dtype != d.dtype for o, (d, _) in zip(node.outputs, old)):
            _restore(node, old)
            continue
        better = False
        for o, (d, sv) in zip(node.outputs, old):
            new_sv = getattr(o, "sym_value", None)
            if _more_precise(d, o.desc) or (new_sv is not None and sv is None):
                better = True
                o.sym_value = new_sv if new_sv is not None else sv
            else:
                o.desc = d
                o.sym_value = sv
        if better:
            improved += 1
            enqueue(n for o in node.outputs for n in o.consumers)
    return improved


def _settled(v: Value) -> bool:
    """Nothing left to learn: a static shape, and a symbolic value if it is an int tensor."""
    return is_static(v.shape) and (
        v.dtype.kind not in "iu" or getattr(v, "sym_value", None) is not None
    )


def _restore(node: Node, old: list[tuple[TensorDesc, tuple | None]]) -> None:
    for o, (d, sv) in zip(node.outputs, old):
        o.desc = d
        o.sym_value = sv


def _known_dim(d: object) -> bool:
    """An int, or an expression over named symbols only (no fresh ``_s`` symbols)."""
    if isinstance(d, int):
        return True
    return not any(str(s).startswith("_") for s in d.free_symbols)


def _more_precise(old: TensorDesc, new: TensorDesc) -> bool:
    """``new`` knows every dim ``old`` knew, and more (or a rank where there was none)."""
    if new.shape is None:
        return False
    if old.shape is None:
        return True
    if len(old.shape) != len(new.shape):
        return False
    pairs = list(zip(old.shape, new.shape))
    if any(_known_dim(a) and not _known_dim(b) for a, b in pairs):
        return False
    return any(not _known_dim(a) and _known_dim(b) for a, b in pairs)
