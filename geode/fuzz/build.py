"""A :class:`~geode.fuzz.spec.Case` as a geode :class:`~geode.compiler.ir.Graph`.

Graph inputs get the case's dims: a symbolic dim's name, a static dim's size.
Each node is applied with the Python builder; its output value is renamed to the
node's ``out`` so that graph printouts, reference results and reproducers all use
the case's names. Node parameters that depend on shapes (a Reshape that merges or
splits axes, an Expand target) are worked out here from the input's current shape,
so a case whose dims the shrinker made smaller still builds when it can;
:class:`SpecError` says when it cannot.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import sympy

from geode.compiler import dtypes
from geode.compiler.frontend import builder
from geode.compiler.ir import Graph, Value
from geode.errors import GeodeError
from geode.fuzz.spec import Case, NodeSpec


class FuzzError(GeodeError):
    """A fuzzer failure: a case file that cannot be read, an option out of range."""


class SpecError(FuzzError):
    """A case that no graph realizes (e.g. a Reshape split of a dim the shrinker made
    indivisible): the shrinker skips such candidates."""


def input_dims(case: Case, dims: list[str | int]) -> list[str | int]:
    """An input's graph dims: symbolic dims by name, static ones by size."""
    out: list[str | int] = []
    for d in dims:
        if isinstance(d, str):
            spec = case.dim(d)
            out.append(d if spec.symbolic else spec.sizes[0])
        else:
            out.append(int(d))
    return out


def build_graph(case: Case, name: str | None = None) -> Graph:
    """The geode graph of ``case`` (GeodeError from geode when it refuses a node,
    :class:`SpecError` when the case cannot be realized)."""
    g = Graph(name or f"fuzz_{case.seed}_{case.index}")
    env: dict[str, Value] = {}
    for spec in case.inputs:
        env[spec.name] = g.input(spec.name, input_dims(case, spec.dims), spec.dtype)
    for node in case.nodes:
        out = apply_node(g, env, node)
        g.rename(out, node.out)
        env[node.out] = out
    for name_ in case.outputs:
        if name_ not in env:
            raise SpecError(f"output {name_!r} is no value of the case")
    g.output(*[env[o] for o in case.outputs], names=list(case.outputs))
    return g


def _ints(g: Graph, values: list[int]) -> Value:
    return g.constant(np.asarray(values, dtype=np.int64))


def apply_node(g: Graph, env: dict[str, Value], node: NodeSpec) -> Value:
    """Add one node of a case to ``g`` (its arguments already in ``env``); returns its
    output value."""
    p = node.params
    args = [env[a] if a else None for a in node.args]  # "": an omitted optional input
    name = f"n_{node.out}"
    op = node.op
    if op == "Const":
        return g.constant(np.asarray(p["value"], dtype=dtypes.to_numpy(p["dtype"])))
    if op == "Cast":
        return g.op("Cast", args[0], to=dtypes.to_onnx(p["to"]), name=name)
    if op.startswith("Reduce"):
        ins: list[Any] = [args[0]]
        if p.get("axes") is not None:
            ins.append(_ints(g, p["axes"]))
        attrs = {"keepdims": int(p.get("keepdims", 1))}
        if p.get("noop"):
            attrs["noop_with_empty_axes"] = 1
        return g.op(op, *ins, name=name, **attrs)
    if op in ("Transpose", "Softmax", "LogSoftmax", "Concat", "Flatten"):
        return g.op(op, *args, name=name, **p.get("attrs", {}))
    if op == "Slice":
        return g.op(
            "Slice",
            args[0],
            _ints(g, p["starts"]),
            _ints(g, p["ends"]),
            _ints(g, p["axes"]),
            _ints(g, p["steps"]),
            name=name,
        )
    if op in ("Squeeze", "Unsqueeze"):
        return g.op(op, args[0], _ints(g, p["axes"]), name=name)
    if op == "Gather":
        idx = g.constant(np.asarray(p["indices"], dtype=np.int64))
        return g.op("Gather", args[0], idx, name=name, axis=int(p["axis"]))
    if op == "Reshape":
        target, allowzero = reshape_target(args[0], p)
        return g.op("Reshape", args[0], _ints(g, target), name=name, allowzero=allowzero)
    if op == "Expand":
        return g.op("Expand", args[0], _ints(g, expand_target(args[0], p)), name=name)
    return builder.apply(op, *args, name=name, **p.get("attrs", {}))


def _static(d: object) -> int | None:
    return int(d) if isinstance(d, (int, np.integer)) else None


def reshape_target(x: Value, p: dict[str, Any]) -> tuple[list[int], int]:
    """The shape input and ``allowzero`` of a fuzz Reshape: ``merge`` axes [start, stop)
    into one, or ``split`` axis ``axis`` into (``factor``, rest). Symbolic dims before
    the change are copied (0), at most one other unknown dim is inferred (-1), a zero
    size after the change needs ``allowzero``; SpecError when none of that works."""
    shape = list(x.shape)
    kind = p["kind"]
    if kind == "merge":
        a, b = int(p["start"]), int(p["stop"])
        if not 0 <= a < b <= len(shape):
            raise SpecError(f"merge [{a}, {b}) out of range for rank {len(shape)}")
        sizes = [_static(d) for d in shape[a:b]]
        new = [-1] if None in sizes else [math.prod(sizes)]
        tail = shape[b:]
    elif kind == "split":
        a, f = int(p["axis"]), int(p["factor"])
        if not 0 <= a < len(shape):
            raise SpecError(f"split axis {a} out of range for rank {len(shape)}")
        d = _static(shape[a])
        if d is None or f <= 0 or d % f:
            raise SpecError(f"cannot split dim {shape[a]} by {f}")
        new = [f, d // f]
        tail = shape[a + 1 :]
    else:
        raise SpecError(f"unknown reshape kind {kind!r}")
    head = [_static(d) for d in shape[:a]]
    rest = new + [-1 if _static(t) is None else int(t) for t in tail]
    if rest.count(-1) > 1:
        raise SpecError(f"reshape of {shape} ({p}) needs more than one inferred dim")
    if 0 not in rest:
        return [0 if h is None else h for h in head] + rest, 0
    if None in head or -1 in rest:
        raise SpecError(f"reshape of {shape} ({p}): a zero size next to an unknown dim")
    return [int(h) for h in head] + rest, 1


def expand_target(x: Value, p: dict[str, Any]) -> list[int]:
    """The shape input of a fuzz Expand: ``lead`` new leading dims, and each unit dim of
    ``x`` listed in ``grow`` (axis -> size) expanded; other dims stay (1 in the target)."""
    grow = {int(k): int(v) for k, v in p.get("grow", {}).items()}
    target = [int(s) for s in p.get("lead", [])]
    for axis, d in enumerate(x.shape):
        if axis in grow:
            if d != 1:
                raise SpecError(f"expand of dim {axis} ({d}), which is not 1")
            target.append(grow[axis])
        else:
            target.append(1)
    return target


def shape_tokens(case: Case, shape: tuple[object, ...]) -> list[str | int] | None:
    """A geode shape in the case's terms (dim names or literal ints), for a new input
    the shrinker cuts in; None when a dim is a compound expression."""
    static = {d.sizes[0]: d.name for d in case.dims if not d.symbolic}
    counts: dict[int, int] = {}
    for d in case.dims:
        if not d.symbolic:
            counts[d.sizes[0]] = counts.get(d.sizes[0], 0) + 1
    out: list[str | int] = []
    for d in shape:
        if isinstance(d, (int, np.integer)):
            size = int(d)
            out.append(static[size] if size != 1 and counts.get(size) == 1 else size)
        elif isinstance(d, sympy.Symbol):
            out.append(d.name)
        else:
            return None
    return out
