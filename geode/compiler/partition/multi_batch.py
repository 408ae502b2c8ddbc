"""Bucketed (multi-batch) variants of a graph (GE's MultiBatchClonePass).

A *dynamic dim* is a symbol of the graph's input shapes (``batch``) that the user
gives a list of sizes (buckets). :func:`specialize` clones the graph with the symbol
replaced by one size in every input shape and in the recorded constraints: compiled,
every kernel of the clone has that size as a constant in its code. At run time a Case
picks the clone for the input's size (``geode/runtime/buckets.py``).

A size between two buckets can run on the larger one, its inputs padded along the
dim, when no op lets padded rows reach real ones (:func:`padding_blockers`): along
the padded axis an op must keep positions apart, as elementwise and broadcast ops,
reductions over other axes, a MatMul whose contraction is another axis, a Transpose
or a Reshape that keeps the axis as it is, do. Ops that mix along it refuse: a
reduction (softmax, normalization) over it, a MatMul contracting it, a Reshape that
merges it with another dim, a Gather, Concat, Slice or Split on it, a data-dependent
op reading padded values; so does using its size as a value (a ``Shape`` read into
arithmetic, where it would be the padded size), and any op geode does not know to keep
rows apart. The outputs then hold the padded rows at the end of their axis, which the
Case slices off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from geode.compiler.ir import Graph, Node, TensorDesc, Value
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.partition.placement import assign_engines
from geode.compiler.shapes import BroadcastDim, free_symbols, numel
from geode.errors import GeodeError, ShapeError
from geode.lazy import sympy

__all__ = [
    "dim_sites",
    "input_dim_names",
    "output_axes",
    "padding_blockers",
    "specialize",
    "unpaddable",
]


def input_dim_names(graph: Graph) -> list[str]:
    """The names of the symbols that are whole dims of the graph's inputs, in order."""
    names: dict[str, None] = {}
    for v in graph.inputs:
        for d in v.shape or ():
            if isinstance(d, sympy.Symbol):
                names.setdefault(d.name)
    return list(names)


def dim_sites(graph: Graph, name: str) -> list[tuple[str, int]]:
    """Where dim ``name`` is a whole input dim: ``(input name, axis)`` pairs. A
    GeodeError when it is none (naming the dims that are), or when an input holds it
    inside an expression (a bucket could not size that input)."""
    sites: list[tuple[str, int]] = []
    for v in graph.inputs:
        for axis, d in enumerate(v.shape or ()):
            if isinstance(d, sympy.Symbol) and d.name == name:
                sites.append((v.name, axis))
            elif name in {s.name for s in free_symbols((d,))}:
                raise GeodeError(
                    f"dynamic dim {name!r}: input {v.name!r} dim {axis} is {d}, an expression "
                    "of it; buckets need it as a whole dim"
                )
    if not sites:
        known = ", ".join(input_dim_names(graph)) or "none"
        raise GeodeError(
            f"dynamic dim {name!r} is not a dim of graph {graph.name!r}'s inputs "
            f"(their symbolic dims: {known})"
        )
    return sites


def specialize(graph: Graph, sizes: Mapping[str, int]) -> Graph:
    """A copy of ``graph`` with each dim of ``sizes`` fixed (MultiBatchClone): the
    inputs' shapes, the recorded constraints and broadcasts; named ``name@batch=4``.
    A ShapeError when a size contradicts a constraint of the graph."""
    g = graph.copy()
    subs = {g.symbols.named_dim(k): sympy.Integer(int(v)) for k, v in sizes.items()}
    label = ",".join(f"{k}={v}" for k, v in sizes.items())
    g.name = f"{graph.name}@{label}"

    def fix(d: object) -> object:
        if isinstance(d, int):
            return d
        e = sympy.sympify(d).xreplace(subs)
        return int(e) if e.is_Integer else e

    try:
        for v in g.inputs:
            if v.shape is not None:
                v.desc = TensorDesc(v.dtype, tuple(fix(d) for d in v.shape), v.desc.format)
        constraints = []
        for a, b, where in g.symbols.constraints:
            fa, fb = fix(a), fix(b)
            if isinstance(fa, int) and isinstance(fb, int) and fa != fb:
                raise ShapeError(f"{a} == {b} ({where}) is {fa} == {fb}")
            constraints.append((fa, fb, where))
        g.symbols.constraints = constraints
        g.symbols.broadcasts = [
            (tuple(fix(d) for d in dims), where) for dims, where in g.symbols.broadcasts
        ]
    except ShapeError as exc:
        raise ShapeError(f"bucket {label} of graph {graph.name!r}: {exc}") from None
    return g


def output_axes(graph: Graph, name: str) -> dict[str, int | None]:
    """Each output's axis that is dim ``name`` (None: the output has no such axis)."""
    out: dict[str, int | None] = {}
    for v in graph.outputs:
        axes = _padded_axes(v, name)
        out[v.name] = axes[0] if axes else None
    return out


def padding_blockers(graph: Graph, name: str) -> list[str]:
    """Why inputs padded along dim ``name`` could change the real rows of the outputs:
    one line per op that would mix padded rows into real ones (see the module
    docstring); empty when padding is safe. ``graph`` is the model after its graph
    passes (shapes inferred, composite ops decomposed) and sorted."""
    sym = graph.symbols.named_dim(name)
    engine = assign_engines(graph).engine
    leaks: set[int] = set()  # values whose contents hold the dim's size
    problems: list[str] = []
    for node in graph.nodes:
        why = _dims_problem(node, sym)
        if why is None:
            why = _leak_problem(node, sym, leaks, engine[node.name] == "host")
        if why is None and any(_padded_axes(v, name) for v in node.inputs if v is not None):
            why = _op_problem(node, name)
        if why is not None:
            problems.append(f"{node.where}: {why}")
    for v in graph.outputs:
        if id(v) in leaks:
            problems.append(f"output {v.name!r} holds the size of {name} as a value")
    return problems


def _padded_axes(v: Value | None, name: str) -> list[int]:
    if v is None or v.shape is None:
        return []
    return [i for i, d in enumerate(v.shape) if isinstance(d, sympy.Symbol) and d.name == name]


def _dims_problem(node: Node, sym: sympy.Symbol) -> str | None:
    """A value of ``node`` whose dims hold the dim other than as one whole dim."""
    for v in [*node.inputs, *node.outputs]:
        if v is None:
            continue
        if v.shape is None:
            continue
        whole = [d for d in v.shape if d == sym]
        mixed = [d for d in v.shape if d != sym and sym in free_symbols((d,))]
        if mixed:
            what = "broadcasts it with another dim" if isinstance(mixed[0], BroadcastDim) else ""
            return f"{v.name!r} has dim {mixed[0]}: {what or 'merges it with other dims'}"
        if len(whole) > 1:
            return f"{v.name!r} has it on {len(whole)} axes"
    return None


#: inputs of ops that take a shape (Reshape's, Expand's): the dim's size there makes
#: the output's dims, checked like any other
_SHAPE_INPUTS = {"Reshape": {1}, "Expand": {1}, "ConstantOfShape": {0}, "Range": {1}}


def _leak_problem(node: Node, sym: sympy.Symbol, leaks: set[int], host: bool) -> str | None:
    """Track values holding the dim's size (``Shape`` of a padded value, shape arithmetic
    on the host); a node reading one other than as a shape uses the padded size."""
    if node.op_type in ("Shape", "Size"):
        x = node.inputs[0]
        if x is not None and x.shape is not None and sym in free_symbols(x.shape):
            out = node.outputs[0]
            if node.op_type == "Size" or out.sym_value is None or _holds(out, sym):
                leaks.add(id(out))
        return None
    shapes = _SHAPE_INPUTS.get(node.op_type, set())
    read = [
        (i, v)
        for i, v in enumerate(node.inputs)
        if v is not None and (id(v) in leaks or _holds(v, sym))
    ]
    read = [(i, v) for i, v in read if i not in shapes]
    if not read:
        return None
    small = all(o.shape is not None and len(o.shape) <= 1 for o in node.outputs)
    if host and small:  # shape arithmetic: its results hold the size too
        leaks.update(id(o) for o in node.outputs)
        return None
    return f"uses the size of {sym} as a value ({read[0][1].name!r}), which padding would change"


def _holds(v: Value, sym: sympy.Symbol) -> bool:
    """Whether ``v``'s known symbolic contents hold ``sym``."""
    return v.sym_value is not None and any(sym in free_symbols((e,)) for e in v.sym_value)


#: ops that compute each element from the elements at the same position (besides the
#: elementwise and broadcast kinds)
_POSITIONWISE = frozenset({"Dropout", "Identity", "Where", "Cast", "CastLike"})


def _op_problem(node: Node, name: str) -> str | None:
    """Why ``node``, which reads a value padded along ``name``, would mix padded rows
    into real ones; None when it keeps them apart."""
    kind = registry.get(node.op_type, node.domain, node.where).kind
    op = node.op_type
    x = node.inputs[0]
    p = set(_padded_axes(x, name))
    if kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST) or op in _POSITIONWISE:
        return None
    if op in ("Shape", "Size"):
        return None
    if kind is OpKind.REDUCE:
        axes = _reduce_axes(node) if op.startswith("Reduce") else (_axis(node, "axis", 0),)
        if axes is None:
            return "reduces over axes known only at run time"
        return f"reduces over {name}" if p & set(axes) else None
    if op in ("MatMul", "Gemm"):
        return _matmul_problem(node, name)
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return f"normalizes over {name}" if _axis(node, "axis", -1) in p else None
    if op == "LayerNormalization":
        first = _axis(node, "axis", -1)
        return f"normalizes over {name}" if any(a >= first for a in p) else None
    if op in ("Transpose", "Expand", "Concat", "Split", "Gather", "Trilu", "Tile"):
        return _layout_problem(node, name, p)
    if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        return _reshape_problem(node, name)
    if op in ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"):
        return None if p <= {0} and not _padded_axes(node.input(1), name) else "convolves over it"
    if op in ("BatchNormalization", "InstanceNormalization"):
        training = node.attr("training_mode", 0)
        return None if p <= {0} and not training else f"normalizes over {name}"
    return f"{op} is not known to keep the rows of {name} apart"


def _reduce_axes(node: Node) -> tuple[int, ...] | None:
    """The axes a Reduce* node reduces (every axis when its ``axes`` input is omitted or
    empty, none then with ``noop_with_empty_axes``), None when not constant."""
    rank = len(node.inputs[0].shape)
    v = node.input(1)
    if v is None:
        axes: list[int] = []
    elif v.is_constant and v.data is not None:
        axes = [int(a) for a in np.asarray(v.data).reshape(-1)]
    else:
        return None
    if not axes:
        return () if node.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(a + rank if a < 0 else a for a in axes)


def _axis(node: Node, attr: str, default: int) -> int:
    rank = len(node.inputs[0].shape)
    a = int(node.attr(attr, default))
    return a + rank if a < 0 else a


def _matmul_problem(node: Node, name: str) -> str | None:
    a, b = node.inputs[0], node.inputs[1]
    if node.op_type == "Gemm":
        ka = 0 if node.attr("transA", 0) else 1
        kb = 1 if node.attr("transB", 0) else 0
    else:
        ka = len(a.shape) - 1
        kb = max(len(b.shape) - 2, 0)
    if ka in _padded_axes(a, name) or kb in _padded_axes(b, name):
        return f"contracts over {name}"
    return None


def _layout_problem(node: Node, name: str, p: set[int]) -> str | None:
    op = node.op_type
    if op in ("Transpose", "Expand"):
        return None
    if op == "Concat" or op == "Split" or op == "Gather":
        axis = _axis(node, "axis", 0)
        if op == "Concat":
            hit = any(axis in _padded_axes(v, name) for v in node.inputs)
        else:
            hit = axis in p
        return f"{op.lower()}s along {name}" if hit else None
    if op == "Trilu":
        rank = len(node.inputs[0].shape)
        return f"masks along {name}" if p & {rank - 1, rank - 2} else None
    reps = node.input(1)
    known = reps is not None and reps.is_constant and reps.data is not None
    if known and all(int(np.asarray(reps.data).reshape(-1)[a]) == 1 for a in p):
        return None
    return f"repeats along {name}"


def _reshape_problem(node: Node, name: str) -> str | None:
    """A reshape keeps the rows apart when the padded axis keeps its place in the
    elements' order: the dims before it and the dims after it hold as many elements on
    both sides (then element ``i`` of a row stays in that row)."""
    x, y = node.inputs[0], node.outputs[0]
    (px,) = _padded_axes(x, name) or (None,)
    (py,) = _padded_axes(y, name) or (None,)
    if px is None or py is None:
        return f"merges {name} with other dims"
    before = sympy.simplify(numel(x.shape[:px]) - numel(y.shape[:py]))
    after = sympy.simplify(numel(x.shape[px + 1 :]) - numel(y.shape[py + 1 :]))
    return None if before == 0 and after == 0 else f"moves elements across rows of {name}"


def unpaddable(problems: Sequence[str]) -> str:
    """The first reason of :func:`padding_blockers`, with how many more there are."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more
