"""Export a geode Graph to an ONNX ModelProto (opset 21), e.g. to run it on onnxruntime.

geode's IR already follows ONNX's op set and attribute conventions, so export is a
direct translation: inputs and outputs with symbolic dims as ``dim_param``,
constants as initializers, nodes as they are. Variables export as initializers too
(ONNX has no mutable state; their initial values), and geode's own ops (Assign, ...)
under their domain ``"geode"``, which the importer reads back as variable writes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from geode.compiler import dtypes
from geode.compiler.ir import Graph, Value, ValueKind
from geode.errors import GeodeError

OPSET = 21


def _value_info(v: Value) -> onnx.ValueInfoProto:
    shape = None if v.shape is None else [d if isinstance(d, int) else str(d) for d in v.shape]
    return helper.make_tensor_value_info(v.name, dtypes.to_onnx(v.dtype), shape)


def _attr(v: object) -> object:
    if isinstance(v, np.ndarray):
        return numpy_helper.from_array(v)
    if isinstance(v, Graph):
        return to_onnx(v).graph
    return v


def to_onnx(graph: Graph, opset: int = OPSET) -> onnx.ModelProto:
    """The ONNX model of a graph; GeodeError when an op has no ONNX form."""
    g = graph.copy()
    g.sort()
    empty = [v.name for v in g.variables() if v.data is None]
    if empty:
        raise GeodeError(
            f"graph {graph.name!r}: variables {empty} have no initial value; ONNX stores "
            "one per initializer"
        )
    inits = [
        numpy_helper.from_array(np.asarray(v.data), v.name)
        for v in g.values.values()
        if v.kind in (ValueKind.CONSTANT, ValueKind.VARIABLE)
    ]
    nodes = []
    domains = {""}
    for n in g.nodes:
        if n.domain:
            domains.add(n.domain)
        nodes.append(
            helper.make_node(
                n.op_type,
                ["" if v is None else v.name for v in n.inputs],
                [o.name for o in n.outputs],
                name=n.name,
                domain=n.domain or None,
                **{k: _attr(v) for k, v in n.attrs.items()},
            )
        )
    ins = [_value_info(v) for v in g.inputs]
    outs = [_value_info(v) for v in g.outputs]
    opsets = [helper.make_opsetid(d, opset if d == "" else 1) for d in sorted(domains)]
    model = helper.make_model(
        helper.make_graph(nodes, g.name, ins, outs, inits),
        opset_imports=opsets,
        producer_name="geode",
    )
    model.ir_version = min(model.ir_version, 10)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise GeodeError(f"graph {graph.name!r} does not export to valid ONNX: {exc}") from exc
    return model
