"""The Python builder's op functions: ``geode.ops.<snake_case op>(...)``.

Every registered op is callable as a snake_case function (``ReduceMean`` ->
``reduce_mean``, ``MatMul`` -> ``matmul``). Positional arguments are the op's inputs;
keyword arguments that name a schema input (``axes=[-1]`` for ReduceMean, ``shape=``
for Reshape) become constant inputs; other keywords are attributes::

    y = ops.reduce_mean(x * x, axes=[-1], keepdims=1)
    z = ops.reshape(y, [0, -1])
    a, b = ops.split(x, axis=1, num_outputs=2)
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import Value
from geode.compiler.ops import registry
from geode.errors import GraphError, UnknownOpError

_ALIASES = {
    "matmul": "MatMul",
    "argmax": "ArgMax",
    "argmin": "ArgMin",
    "layer_norm": "LayerNormalization",
    "batch_norm": "BatchNormalization",
    "where": "Where",
    "identity": "Identity",
}


def snake(op_type: str) -> str:
    """``ReduceMean`` -> ``reduce_mean``."""
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", op_type)
    s = re.sub(r"(?<=[A-Z])([A-Z][a-z])", r"_\1", s)
    return s.lower()


def _op_type(fn_name: str) -> str | None:
    if fn_name in _ALIASES:
        return _ALIASES[fn_name]
    for od in registry.all_ops():
        if od.domain == "" and snake(od.op_type) == fn_name:
            return od.op_type
    return None


def _as_input(graph: Any, x: object, like: Value | None) -> Value | None:
    if x is None or isinstance(x, Value):
        return x
    if isinstance(x, (list, tuple)) and all(
        isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in x
    ):
        return graph.constant(np.array(x, dtype=np.int64))
    return graph.lift(x, like=like)


def apply(
    op_type: str, *inputs: object, n_outputs: int | None = None, name: str | None = None, **kw: Any
) -> Any:
    """Apply op ``op_type`` to inputs; returns one Value or a tuple for several outputs."""
    od = registry.get(op_type)
    values = [x for x in inputs if isinstance(x, Value)]
    like = next((v for v in values if v.dtype != np.bool_), values[0] if values else None)
    if like is None:
        like = next((x for x in kw.values() if isinstance(x, Value)), None)
    if like is None:
        raise GraphError(f"{op_type}: needs at least one graph Value among its inputs")
    graph = like.graph
    ins: list[object] = list(inputs)
    names = [s.name for s in od.inputs]
    for key in list(kw):
        if key in names and not od.inputs[names.index(key)].variadic:
            idx = names.index(key)
            ins.extend([None] * (idx + 1 - len(ins)))
            if ins[idx] is not None:
                raise GraphError(f"{op_type}: input {key!r} given twice")
            ins[idx] = kw.pop(key)
    while ins and ins[-1] is None:
        ins.pop()
    vals = []
    for i, x in enumerate(ins):
        spec = od.inputs[min(i, len(od.inputs) - 1)] if od.inputs else None
        allowed = od.types.get(spec.type) if spec is not None else None
        if (
            allowed
            and allowed <= dtypes.INTS
            and isinstance(x, (int, np.integer))
            and not isinstance(x, bool)
        ):
            x = graph.constant(
                np.array(
                    x,
                    dtype=np.int64
                    if np.dtype(np.int64) in allowed
                    else sorted(allowed, key=str)[0],
                )
            )
        vals.append(_as_input(graph, x, like))
    attrs = {}
    for k, v in kw.items():
        spec = od.attr_spec(k)
        if spec is not None and spec.kind == "tensor" and not isinstance(v, np.ndarray):
            v = np.array(v)
        if spec is not None and spec.kind == "int" and isinstance(v, str) and k in ("to", "dtype"):
            v = dtypes.to_onnx(v)
        attrs[k] = v
    if n_outputs is None:
        n_outputs = _default_outputs(od, vals, attrs)
    node = graph.add_node(op_type, vals, attrs, n_outputs=n_outputs, name=name)
    return node.outputs[0] if n_outputs == 1 else tuple(node.outputs)


def _default_outputs(od: registry.OpDef, vals: list[Value | None], attrs: dict[str, Any]) -> int:
    if od.outputs and od.outputs[-1].variadic:
        if "num_outputs" in attrs:
            return int(attrs["num_outputs"])
        if len(vals) > 1 and vals[1] is not None and vals[1].is_constant:
            return int(vals[1].data.size)
        raise GraphError(f"{od.op_type}: say how many outputs with n_outputs=")
    return max(1, sum(1 for o in od.outputs if not o.optional))


class NoSuchOpError(UnknownOpError, AttributeError):
    """``geode.ops.<name>`` for a name that is no op: an :class:`UnknownOpError` that is
    also the AttributeError ``getattr`` and ``hasattr`` expect of a missing attribute."""


def __getattr__(name: str) -> Any:
    op_type = _op_type(name)
    if op_type is None:
        raise NoSuchOpError(name, where="geode.ops")

    def fn(*inputs: object, **kw: Any) -> Any:
        return apply(op_type, *inputs, **kw)

    fn.__name__ = name
    fn.__doc__ = f"Apply ONNX op {op_type} (see geode.compiler.ops.registry.get({op_type!r}))."
    return fn
