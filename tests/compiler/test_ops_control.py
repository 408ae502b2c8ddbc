"""Control flow (geode/compiler/ops/control.py): If, Loop and Scan imported from ONNX,
compiled by geode and compared with ``onnx.reference.ReferenceEvaluator``; subgraphs
read outer values (captures), nest, and are compiled once per input signature."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.compiler.ops import control
from geode.errors import ModelLoadError

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(2)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "cf", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def check(m, feeds, rtol=1e-6):
    """geode's outputs equal the reference evaluator's; returns the compiled model."""
    want = ReferenceEvaluator(m).run(None, feeds)
    compiled = geode.compile(m)
    got = compiled.run(feeds)
    for o, w in zip(m.graph.output, want):
        np.testing.assert_allclose(got[o.name], w, rtol=rtol, atol=1e-6, err_msg=o.name)
        assert got[o.name].dtype == w.dtype, o.name
    return compiled


def if_model():
    """y = cond ? relu(x) * w : -x  (the branches read x and w from the outer graph)."""
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["t"])],
        "then",
        [],
        [vi("t", F, ["N", 3])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, ["N", 3])]
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    w = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w")
    return model([node], [vi("c", B, []), vi("x", F, ["N", 3])], [vi("y", F, ["N", 3])], [w])


@pytest.mark.parametrize("cond", [True, False])
def test_if_reads_outer_values(cond):
    m = if_model()
    check(m, {"c": np.array(cond), "x": RNG.standard_normal((4, 3)).astype(np.float32)})


def test_if_node_inputs_carry_the_captures():
    from geode.compiler.frontend.onnx import import_model

    g = import_model(if_model())
    (node,) = [n for n in g.nodes if n.op_type == "If"]
    assert node.attrs["captures"] == ["x", "w"]
    assert [v.name for v in node.inputs] == ["c", "x", "w"]
    x = g.inputs[1]
    assert node.outputs[0].shape == x.shape  # the outer symbol N carries through both branches


def loop_model(with_cond=True):
    """Carried s += x * i for i < M (and while s.sum() < limit); scan output stacks s."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("Add", ["s_in", "xi"], ["s_out"]),
            helper.make_node("ReduceSum", ["s_out"], ["tot"], keepdims=0),
            helper.make_node("Less", ["tot", "limit"], ["c_out"]),
            helper.make_node("Identity", ["s_out"], ["scan"]),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", B, []), vi("s_in", F, None)],
        [vi("c_out", B, []), vi("s_out", F, None), vi("scan", F, None)],
    )
    node = helper.make_node(
        "Loop", ["M", "cond" if with_cond else "", "s0"], ["s", "stack"], body=body
    )
    inits = [numpy_helper.from_array(np.float32(20.0), "limit")]
    inputs = [vi("M", I64, []), vi("x", F, [2]), vi("s0", F, [2])]
    if with_cond:
        inputs.insert(1, vi("cond", B, []))
    return model([node], inputs, [vi("s", F, [2]), vi("stack", F, None)], inits)


@pytest.mark.parametrize("trips", [0, 1, 3, 10])
def test_loop_trip_count_and_condition(trips):
    m = loop_model()
    feeds = {
        "M": np.array(trips, np.int64),
        "cond": np.array(True),
        "x": np.array([1.0, 2.0], np.float32),
        "s0": np.zeros(2, np.float32),
    }
    if trips == 0:  # the evaluator cannot stack zero scan outputs: check by hand
        out = geode.compile(m).run(feeds)
        np.testing.assert_array_equal(out["s"], feeds["s0"])
        assert out["stack"].shape == (0,) or out["stack"].shape[0] == 0
        return
    check(m, feeds)


def test_loop_without_condition_ignores_the_body_condition():
    # (the evaluator runs no iteration when cond is omitted: expected values by hand)
    m = loop_model(with_cond=False)
    x = np.array([1.0, 2.0], np.float32)
    out = geode.compile(m).run({"M": np.array(6, np.int64), "x": x, "s0": np.zeros(2, np.float32)})
    want = np.cumsum([x * i for i in range(6)], axis=0)
    np.testing.assert_allclose(out["stack"], want)
    np.testing.assert_allclose(out["s"], want[-1])


def test_loop_body_is_compiled_once_per_signature():
    from geode.compiler.frontend.onnx import import_model

    g = import_model(loop_model())
    (node,) = [n for n in g.nodes if n.op_type == "Loop"]
    runner = control.body_runner(node.attrs["body"])
    compiled = geode.compile(g)
    for trips in (3, 5):
        compiled.run(
            {
                "M": np.array(trips, np.int64),
                "cond": np.array(True),
                "x": np.array([0.1, 0.2], np.float32),
                "s0": np.zeros(2, np.float32),
            }
        )
    assert len(runner.compiled) == 1


def test_nested_if_inside_loop_reads_two_scopes_out():
    inner_then = helper.make_graph(
        [helper.make_node("Add", ["acc", "bias"], ["t"])], "t", [], [vi("t", F, [2])]
    )
    inner_else = helper.make_graph(
        [helper.make_node("Sub", ["acc", "bias"], ["e"])], "e", [], [vi("e", F, [2])]
    )
    body = helper.make_graph(
        [
            helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.int64(2))),
            helper.make_node("Mod", ["i", "two"], ["r"]),
            helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.int64(0))),
            helper.make_node("Equal", ["r", "zero"], ["even"]),
            helper.make_node(
                "If", ["even"], ["acc_out"], then_branch=inner_then, else_branch=inner_else
            ),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", B, []), vi("acc", F, [2])],
        [vi("c_out", B, []), vi("acc_out", F, [2])],
    )
    node = helper.make_node("Loop", ["M", "", "a0"], ["a"], body=body)
    m = model([node], [vi("M", I64, []), vi("a0", F, [2]), vi("bias", F, [2])], [vi("a", F, [2])])
    bias = np.array([1.0, 0.5], np.float32)
    for trips in (4, 5):  # (the evaluator runs no iteration when cond is omitted)
        out = geode.compile(m).run(
            {"M": np.array(trips, np.int64), "a0": np.zeros(2, np.float32), "bias": bias}
        )
        np.testing.assert_allclose(out["a"], bias if trips % 2 else 0 * bias)


def scan_model(directions=(0, 1), out_dirs=(0,), out_axes=(0,)):
    """Running sum over the rows of x (forward) plus the rows of y (as directed)."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "xr"], ["t"]),
            helper.make_node("Add", ["t", "yr"], ["s_out"]),
            helper.make_node("Identity", ["s_out"], ["o"]),
        ],
        "body",
        [vi("s_in", F, [3]), vi("xr", F, [3]), vi("yr", F, [3])],
        [vi("s_out", F, [3]), vi("o", F, [3])],
    )
    node = helper.make_node(
        "Scan",
        ["s0", "x", "y"],
        ["s", "o"],
        body=body,
        num_scan_inputs=2,
        scan_input_directions=list(directions),
        scan_output_directions=list(out_dirs),
        scan_output_axes=list(out_axes),
        scan_input_axes=[0, 1],
    )
    return model(
        [node],
        [vi("s0", F, [3]), vi("x", F, ["T", 3]), vi("y", F, [3, "T"])],
        [vi("s", F, [3]), vi("o", F, None)],
    )


def _scan_expected(s0, x, y, directions, out_dirs, out_axes):
    xs = x[::-1] if directions[0] else x
    ys = y.T[::-1] if directions[1] else y.T
    s, outs = s0, []
    for xr, yr in zip(xs, ys):
        s = s + xr + yr
        outs.append(s)
    if out_dirs[0]:
        outs = outs[::-1]
    return s, np.stack(outs, axis=out_axes[0] % 2)


@pytest.mark.parametrize(
    "directions,out_dirs,out_axes",
    [((0, 0), (0,), (0,)), ((0, 1), (1,), (1,)), ((1, 1), (0,), (-1,))],
)
def test_scan_directions_and_axes(directions, out_dirs, out_axes):
    # (the evaluator implements forward scans only: expected values by hand)
    m = scan_model(directions, out_dirs, out_axes)
    compiled = geode.compile(m)
    for t in (4, 6):
        s0 = RNG.standard_normal(3).astype(np.float32)
        x = RNG.standard_normal((t, 3)).astype(np.float32)
        y = RNG.standard_normal((3, t)).astype(np.float32)
        out = compiled.run({"s0": s0, "x": x, "y": y})
        s, o = _scan_expected(s0, x, y, directions, out_dirs, out_axes)
        np.testing.assert_allclose(out["s"], s, rtol=1e-5)
        np.testing.assert_allclose(out["o"], o, rtol=1e-5)


def test_scan_forward_matches_the_evaluator():
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "xr"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "xr"], ["o"]),
        ],
        "body",
        [vi("s_in", F, [3]), vi("xr", F, [3])],
        [vi("s_out", F, [3]), vi("o", F, [3])],
    )
    node = helper.make_node("Scan", ["s0", "x"], ["s", "o"], body=body, num_scan_inputs=1)
    m = model(
        [node], [vi("s0", F, [3]), vi("x", F, ["T", 3])], [vi("s", F, [3]), vi("o", F, ["T", 3])]
    )
    check(m, {"s0": np.ones(3, np.float32), "x": RNG.standard_normal((5, 3)).astype(np.float32)})


def test_scan_opset8_is_refused_by_name():
    body = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["b"])], "b", [vi("a", F, [1])], [vi("b", F, [1])]
    )
    node = helper.make_node("Scan", ["", "x"], ["y"], body=body, num_scan_inputs=1)
    m = model([node], [vi("x", F, [1, 2, 1])], [vi("y", F, None)], opset=8)
    with pytest.raises(ModelLoadError, match="Scan"):
        geode.compile(m)


def test_loop_carried_shape_stays_symbolic_when_the_body_keeps_it():
    from geode.compiler.frontend.onnx import import_model

    body = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", B, []), vi("v_in", F, None)],
        [vi("c_out", B, []), vi("v_out", F, None)],
    )
    node = helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body)
    m = model(
        [node, helper.make_node("Relu", ["v"], ["y"])],
        [vi("M", I64, []), vi("v0", F, ["N", 4])],
        [vi("y", F, ["N", 4])],
    )
    g = import_model(m)
    loop = next(n for n in g.nodes if n.op_type == "Loop")
    assert loop.outputs[0].shape == g.inputs[1].shape
    out = geode.compile(m)(M=np.array(3, np.int64), v0=np.ones((2, 4), np.float32))
    np.testing.assert_allclose(out["y"], 8 * np.ones((2, 4)))
