"""One harness for op conformance: geode's reference kernel and InferShape against ONNX.

``check_op`` builds the same single node twice: as an ONNX model run by
``onnx.reference.ReferenceEvaluator``, and as a geode graph (inputs given symbolic
dims unless told otherwise, constant inputs marked so shape inference can read them).
It checks that

* the reference kernel's outputs match the evaluator's (values, dtype, shape);
* the inferred dtype equals the kernel's output dtype;
* the inferred (symbolic) shape, evaluated with the input dims, equals the output shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.compiler import dtypes
from geode.compiler.ops import registry
from geode.compiler.shapes import evaluate, sym

OPSET = 21

#: per-dtype tolerances for comparing float results (one policy for all op tests)
TOL = {
    np.dtype(np.float16): (1e-2, 1e-2),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float64): (1e-10, 1e-12),
}


def model_runner(path: str) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """A callable feeds -> outputs for the ONNX file ``path``: onnxruntime when it is
    installed, else ONNX's reference evaluator."""
    try:
        import onnxruntime as ort
    except ImportError:
        ref = ReferenceEvaluator(path)
        return lambda feeds: ref.run(None, feeds)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


def _onnx_attr(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return numpy_helper.from_array(v)
    return v


def onnx_reference(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any],
    n_outputs: int,
    opset: int = OPSET,
    domain: str = "",
) -> list[np.ndarray]:
    """Run one node through onnx.reference.ReferenceEvaluator."""
    in_names = ["" if x is None else f"in{i}" for i, x in enumerate(inputs)]
    out_names = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(
        op_type,
        in_names,
        out_names,
        domain=domain or None,
        **{k: _onnx_attr(v) for k, v in attrs.items()},
    )
    graph_inputs = [
        helper.make_tensor_value_info(n, dtypes.to_onnx(x.dtype), list(x.shape))
        for n, x in zip(in_names, inputs)
        if x is not None
    ]
    graph_outputs = [helper.make_empty_tensor_value_info(n) for n in out_names]
    graph = helper.make_graph([node], "check", graph_inputs, graph_outputs)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    feeds = {n: x for n, x in zip(in_names, inputs) if x is not None}
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


def geode_node(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any],
    n_outputs: int,
    const_inputs: Sequence[int] = (),
    symbolic: bool = True,
) -> tuple[geode.Graph, geode.Node, dict]:
    """The same node in a geode graph; returns graph, node and the symbol binding."""
    g = geode.Graph(f"check_{op_type}")
    vals = []
    env: dict = {}
    for i, x in enumerate(inputs):
        if x is None:
            vals.append(None)
        elif i in const_inputs:
            vals.append(g.constant(x, name=f"in{i}", dtype=x.dtype))
        else:
            dims: list[object] = list(x.shape)
            if symbolic:
                dims = [f"d{i}_{j}" for j in range(x.ndim)]
                env.update({sym(f"d{i}_{j}"): int(s) for j, s in enumerate(x.shape)})
            vals.append(g.input(f"in{i}", dims, x.dtype))
    node = g.add_node(op_type, vals, dict(attrs), n_outputs=n_outputs)
    return g, node, env


def assert_close(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Compare with the per-dtype tolerance policy (exact for ints and bools)."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype in TOL:
        rtol, atol = TOL[want.dtype]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    elif want.dtype in dtypes.STORAGE:  # narrow ml_dtypes: exact, NaN equal to NaN
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32), err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check_op(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    n_outputs: int = 1,
    const_inputs: Sequence[int] = (),
    symbolic: bool = True,
    opset: int = OPSET,
    compare: bool = True,
) -> list[np.ndarray]:
    """Check one op's reference kernel and InferShape against ONNX; returns geode's outputs.

    ``compare=False`` skips the value comparison (for ops whose outputs are random or
    implementation-defined) but still checks dtypes and shapes.
    """
    attrs = dict(attrs or {})
    inputs = [None if x is None else np.asarray(x) for x in inputs]
    g, node, env = geode_node(op_type, inputs, attrs, n_outputs, const_inputs, symbolic)
    od = registry.get(op_type, node.domain)
    got = od.run(list(inputs), attrs)
    assert len(got) >= n_outputs, f"{op_type}: kernel gave {len(got)} outputs, expected {n_outputs}"
    if compare:
        want = onnx_reference(op_type, inputs, attrs, n_outputs, opset)
        for i in range(n_outputs):
            assert_close(got[i], want[i], f"{op_type} output {i}")
    for i, out in enumerate(node.outputs):
        assert out.dtype == got[i].dtype, (
            f"{op_type} output {i}: inferred {out.dtype}, kernel {got[i].dtype}"
        )
        if out.shape is not None:
            shape = (
                evaluate(out.shape, env)
                if all(
                    s in env for d in out.shape if not isinstance(d, int) for s in d.free_symbols
                )
                else None
            )
            if shape is not None:
                assert shape == got[i].shape, (
                    f"{op_type} output {i}: inferred {out.shape} -> {shape}, kernel {got[i].shape}"
                )
            else:
                assert len(out.shape) == got[i].ndim, (
                    f"{op_type} output {i}: inferred rank {len(out.shape)}"
                )
    return got


def check_model_valid(model: onnx.ModelProto) -> None:
    """Run onnx's checker (used by tests that build models)."""
    onnx.checker.check_model(model)


def onnx_node_cases(module: str, op_type: str) -> list:
    """ONNX's generated single-node test cases of one op (importing their module runs them)."""
    import importlib

    import onnx.backend.test.case.node as node_cases

    importlib.import_module(f"onnx.backend.test.case.node.{module}")
    return [
        c
        for c in node_cases._NodeTestCases
        if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type == op_type
    ]


def run_onnx_node_case(case: object, const: bool = False) -> str | None:
    """Run one ONNX node test case through geode's kernel and InferShape; returns why it
    was skipped, or None. With ``const`` the op's shape-giving inputs are constants.
    Tolerances are the ONNX backend runner's (some expected values have four digits)."""
    node = case.model.graph.node[0]
    opset = next(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
    if node.op_type == "Dropout" and opset < 12:
        return "Dropout before opset 12 has a ratio attribute (the frontend converts versions)"
    attrs = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        attrs[a.name] = numpy_helper.to_array(v) if a.type == onnx.AttributeProto.TENSOR else v
        if isinstance(attrs[a.name], bytes):
            attrs[a.name] = attrs[a.name].decode()
    names = [i.name for i in case.model.graph.input]
    value_inputs = registry.get(node.op_type).value_inputs if const else ()
    for feeds, wants in case.data_sets:
        arrays = dict(zip(names, (np.asarray(f) for f in feeds)))
        ins = [arrays[n] if n else None for n in node.input]
        if any(x is not None and x.dtype.name == "bfloat16" for x in ins):
            return "bfloat16 is not a geode dtype"
        g = geode.Graph(case.name)
        vals = [
            None
            if x is None
            else g.constant(x, name=f"in{i}", dtype=x.dtype)
            if i in value_inputs
            else g.input(f"in{i}", list(x.shape), x.dtype)
            for i, x in enumerate(ins)
        ]
        out_vals = g.add_node(node.op_type, vals, attrs, n_outputs=len(node.output)).outputs
        got = registry.get(node.op_type).run(ins, attrs)
        for i, want in enumerate(np.asarray(w) for w in wants):
            what = f"{case.name} output {i}"
            assert got[i].dtype == want.dtype == out_vals[i].dtype, what
            assert got[i].shape == want.shape, what
            if all(isinstance(d, int) for d in out_vals[i].shape or ()):
                assert tuple(out_vals[i].shape) == want.shape, (
                    f"{what}: inferred {out_vals[i].shape}"
                )
            if want.dtype.kind == "f":
                np.testing.assert_allclose(got[i], want, rtol=1e-3, atol=1e-6, err_msg=what)
            else:
                np.testing.assert_array_equal(got[i], want, err_msg=what)
    return None
