"""The reference interpreter: runs a graph with the registry's numpy reference kernels.

It is the ground truth that compiled paths and graph passes are checked against,
and the engine constant folding uses. Nodes run in topological order (the graph's
order where it is one); constants and variables read their ``Value.data``;
intermediates are freed after their last use. A write of a variable (geode's Assign
ops) changes what later nodes read of it, in that order: the semantics the compiled
model has (``geode/compiler/passes/variable_prepare.py``). ``VarIsInitialized`` is
True for a variable with data or written before it. ::

    out = run_reference(g, {"x": np.ones((4, 768), np.float32)})["y"]
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import sympy

from geode.compiler import dtypes
from geode.compiler.ir import Graph, Value, ValueKind
from geode.compiler.ops import registry, state
from geode.compiler.shapes import evaluate_dim
from geode.errors import (
    ExecutionError,
    GeodeError,
    InputDTypeError,
    InputShapeError,
    MissingInputError,
    UnexpectedInputError,
)


def bind_inputs(graph: Graph, feeds: Mapping[str, object]) -> dict[sympy.Symbol, int]:
    """Check feeds against the graph's inputs and bind the symbols of their dims.

    Raises :class:`MissingInputError`, :class:`UnexpectedInputError`,
    :class:`InputDTypeError` or :class:`InputShapeError` (all ``InputError``) naming
    the input. Returns the symbol binding.
    """
    names = {v.name for v in graph.inputs}
    missing = [v.name for v in graph.inputs if v.name not in feeds]
    if missing:
        raise MissingInputError(f"graph {graph.name!r}: missing input(s) {missing}")
    extra = sorted(k for k in feeds if k not in names)
    if extra:
        raise UnexpectedInputError(
            f"graph {graph.name!r}: {extra} are not inputs (inputs: {sorted(names)})"
        )
    env: dict[sympy.Symbol, int] = {}
    for v in graph.inputs:
        arr = as_input_array(v, feeds[v.name])
        if arr.dtype != v.dtype:
            raise InputDTypeError(
                f"input {v.name!r}: dtype {dtypes.name(arr.dtype)}, expected {dtypes.name(v.dtype)}"
            )
        _bind_shape(v, arr.shape, env, InputShapeError, f"input {v.name!r}")
    return env


def as_input_array(v: Value, x: object) -> np.ndarray:
    """A feed as an array: numpy arrays as they are, Python scalars/lists in ``v``'s dtype."""
    if isinstance(x, (np.ndarray, np.generic)):
        return np.asarray(x)
    try:
        return np.asarray(x, dtype=v.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputDTypeError(
            f"input {v.name!r}: cannot read {type(x).__name__} as {dtypes.name(v.dtype)}"
        ) from exc


def _bind_shape(
    v: Value, shape: tuple[int, ...], env: dict, exc: type[GeodeError], what: str
) -> None:
    if v.shape is None:
        return
    if len(shape) != len(v.shape):
        raise exc(f"{what}: rank {len(shape)}, expected {len(v.shape)} ({list(v.shape)})")
    for axis, (d, n) in enumerate(zip(v.shape, shape)):
        if isinstance(d, int):
            if d != n:
                raise exc(f"{what}: dim {axis} is {n}, expected {d}")
        elif isinstance(d, sympy.Symbol):
            if d in env and env[d] != n:
                raise exc(f"{what}: dim {axis} ({d}) is {n}, but {d} is already {env[d]}")
            env.setdefault(d, n)
        elif d.free_symbols <= set(env):
            want = evaluate_dim(d, env)
            if want != n:
                raise exc(f"{what}: dim {axis} ({d}) is {n}, expected {want}")


def _at_node(exc: GeodeError, where: str) -> GeodeError:
    """``exc`` with its message prefixed by ``where`` (the node whose kernel raised it),
    as the same class; ``exc`` itself when it names the node already or its class builds
    its own message."""
    if where in str(exc) or type(exc).__init__ is not GeodeError.__init__:
        return exc
    return type(exc)(f"{where}: {exc}")


def run_reference(
    graph: Graph,
    feeds: Mapping[str, object],
    *,
    check: bool = False,
    keep_all: bool = False,
) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` on ``feeds`` with the reference kernels; returns output name -> array.

    With ``check`` every node's results are compared with its inferred dtype and
    (symbolic) shape, and an :class:`ExecutionError` names the first mismatch; this is
    how tests catch a pass that builds a node whose desc lies. With ``keep_all`` the
    result holds every computed value, not only the graph outputs.
    """
    env = bind_inputs(graph, feeds)
    vals: dict[int, np.ndarray] = {}
    for v in graph.inputs:
        vals[id(v)] = as_input_array(v, feeds[v.name])
    order = graph.toposort()
    remaining: dict[int, int] = {}
    for n in order:
        for v in n.inputs:
            if v is not None:
                remaining[id(v)] = remaining.get(id(v), 0) + 1
    keep = {id(v) for v in graph.outputs}
    result: dict[str, np.ndarray] = {}

    def fetch(v: Value) -> np.ndarray:
        if id(v) in vals:
            return vals[id(v)]
        if v.kind in (ValueKind.CONSTANT, ValueKind.VARIABLE):
            if v.data is None:
                raise ExecutionError(f"{v.kind.value} {v.name!r} has no data")
            return np.asarray(v.data)
        raise ExecutionError(f"value {v.name!r} is read before it is computed")

    for node in order:
        if state.is_var_query(node):
            var = node.inputs[0]
            known = id(var) in vals or var.kind is not ValueKind.VARIABLE or var.data is not None
            vals[id(node.outputs[0])] = np.array(known)
            if keep_all:
                result[node.outputs[0].name] = vals[id(node.outputs[0])]
            continue
        overwrite = state.is_write(node) and node.op_type == "Assign"  # reads no old value
        args = [
            None if v is None or (overwrite and i == 0) else fetch(v)
            for i, v in enumerate(node.inputs)
        ]
        od = registry.get(node.op_type, node.domain, where=node.where)
        try:
            outs = od.run(args, node.attrs)
        except GeodeError as exc:
            named = _at_node(exc, node.where)
            if named is exc:
                raise
            raise named from exc
        except Exception as exc:
            raise ExecutionError(
                f"{node.where}: reference kernel failed: {type(exc).__name__}: {exc}"
            ) from exc
        if len(outs) < len(node.outputs):
            raise ExecutionError(
                f"{node.where}: reference kernel gave {len(outs)} outputs, node has {len(node.outputs)}"
            )
        for out, arr in zip(node.outputs, outs):
            if check:
                _check_result(out, arr, env)
            vals[id(out)] = arr
            if keep_all:
                result[out.name] = arr
        for v in node.inputs:
            if v is None:
                continue
            remaining[id(v)] -= 1
            if remaining[id(v)] == 0 and id(v) not in keep and not keep_all:
                vals.pop(id(v), None)
        if state.is_write(node):  # later readers of the variable see the new value
            vals[id(node.inputs[0])] = vals[id(node.outputs[0])]
    for v in graph.outputs:
        result[v.name] = fetch(v)
    return result


def _check_result(out: Value, arr: np.ndarray, env: dict) -> None:
    what = f"value {out.name!r} of {out.producer.where if out.producer else 'graph'}"
    if arr.dtype != out.dtype:
        raise ExecutionError(
            f"{what}: kernel gave dtype {dtypes.name(arr.dtype)}, inferred {dtypes.name(out.dtype)}"
        )
    _bind_shape(out, arr.shape, env, ExecutionError, what)
