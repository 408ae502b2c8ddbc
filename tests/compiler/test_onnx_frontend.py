"""The ONNX front end: import, opset adapters, external data, hostile and broken files.

Every model is built with ``onnx.helper`` here, imported, compiled with ``geode.compile``
and compared with onnxruntime (the reference for ONNX semantics at each opset).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import geode
from geode.compiler.frontend import onnx_versions
from geode.compiler.frontend.onnx import SUPPORTED_OPSET_RANGE, external_loader, import_model
from geode.compiler.ir import ValueKind
from geode.errors import GeodeError, ModelLoadError, UnknownOpError

ort = pytest.importorskip("onnxruntime")

F32 = TensorProto.FLOAT
RTOL, ATOL = 1e-5, 1e-5  # float32, no fastmath: one op or a short chain


# -- helpers --------------------------------------------------------------------------------
def make_model(nodes, inputs, outputs, inits=(), opset=13, functions=(), extra_opsets=()):
    """A ModelProto at ``opset`` with an IR version that onnxruntime accepts for it."""
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    model = helper.make_model(
        graph, opset_imports=opsets, functions=list(functions), producer_name="test"
    )
    model.ir_version = max(helper.find_min_ir_version_for(opsets[:1]), 7)
    return model


def tin(name, shape, dtype=F32):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def run_ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def check_against_ort(model, feeds_list, **options):
    """Compile once with geode, run every feed dict, compare with onnxruntime."""
    compiled = geode.compile(model, **options)
    for feeds in feeds_list:
        want = run_ort(model, feeds)
        got = compiled(**feeds)
        assert set(got) == set(want)
        for k in want:
            assert got[k].shape == want[k].shape, (k, got[k].shape, want[k].shape)
            assert got[k].dtype == want[k].dtype, (k, got[k].dtype, want[k].dtype)
            np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)
    return compiled


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def mlp_model(opset=13):
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["h_bias"], name="bias1"),
        helper.make_node("Relu", ["h_bias"], ["h_relu"], name="relu1"),
        helper.make_node("MatMul", ["h_relu", "W2"], ["y"], name="fc2"),
    ]
    return make_model(
        nodes,
        [tin("x", ["batch", 8])],
        [tin("y", ["batch", 4])],
        [init("W1", w1), init("b1", b1), init("W2", w2)],
        opset=opset,
    )


# -- the basics ------------------------------------------------------------------------------
def test_mlp_imports_with_symbolic_batch_and_matches_ort(tmp_path):
    model = mlp_model()
    g = import_model(model)
    (x,) = g.inputs
    assert x.name == "x" and str(x.shape[0]) == "batch" and x.shape[1] == 8
    assert [o.name for o in g.outputs] == ["y"]
    assert str(g.outputs[0].shape[0]) == "batch" and g.outputs[0].shape[1] == 4
    assert {v.name for v in g.constants()} == {"W1", "b1", "W2"}
    assert [n.name for n in g.nodes] == ["fc1", "bias1", "relu1", "fc2"]
    path = tmp_path / "mlp.onnx"
    onnx.save_model(model, path)
    feeds = [{"x": rand(n, 8, seed=n)} for n in (1, 3, 8)]
    compiled = geode.compile(str(path))
    for f in feeds:
        np.testing.assert_allclose(compiled(**f)["y"], run_ort(model, f)["y"], rtol=RTOL, atol=ATOL)
    # bytes and PathLike work too
    assert [n.op_type for n in import_model(path.read_bytes()).nodes] == [
        "MatMul",
        "Add",
        "Relu",
        "MatMul",
    ]
    assert len(import_model(path).nodes) == 4


def test_dim_params_are_shared_and_missing_dims_fresh():
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])]
    c = helper.make_tensor_value_info("c", F32, None)  # no shape at all
    d = tin("d", [None, "seq"])  # a dim with neither value nor param
    model = make_model(
        nodes, [tin("a", ["batch", 8]), tin("b", ["batch", 8]), c, d], [tin("y", None)]
    )
    g = import_model(model)
    a, b, cv, dv = g.inputs
    assert a.shape[0] is b.shape[0] and str(a.shape[0]) == "batch"
    assert cv.shape is None
    assert dv.shape[0] not in (a.shape[0], dv.shape[1]) and str(dv.shape[1]) == "seq"
    f = {"a": rand(3, 8), "b": rand(3, 8, seed=1), "c": rand(8, seed=2), "d": rand(2, 5)}
    compiled = geode.compile(model)
    got = compiled(**f)["y"]
    np.testing.assert_allclose(got, (f["a"] + f["b"]) * f["c"], rtol=RTOL, atol=ATOL)


def test_dynamic_shape_chain_compiles_once_for_every_batch():
    """PyTorch's flatten: Shape -> Gather(0) -> Unsqueeze -> Concat(-1) -> Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch_1d"]),
        helper.make_node("Concat", ["batch_1d", "minus_one"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["x", "new_shape"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    inits = [
        init("zero", np.array(0, np.int64)),
        init("axes0", np.array([0], np.int64)),
        init("minus_one", np.array([-1], np.int64)),
    ]
    model = make_model(
        nodes, [tin("x", ["batch", 4, 6])], [tin("y", ["batch", 24])], inits, opset=13
    )
    g = import_model(model)
    assert str(g.outputs[0].shape[0]) == "batch" and g.outputs[0].shape[1] == 24
    check_against_ort(model, [{"x": rand(n, 4, 6, seed=n)} for n in (1, 2, 5, 9)])


# -- opset adapters: each op at the opset before and after its change --------------------------
def _reduce_sum(opset):
    if opset < 13:
        node = helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)
        return [node], []
    return [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], [
        init("axes", np.array([1], np.int64))
    ]


def _reduce_mean(opset):
    if opset < 18:
        return [helper.make_node("ReduceMean", ["x"], ["y"], axes=[-1, 1])], []
    return [helper.make_node("ReduceMean", ["x", "axes"], ["y"])], [
        init("axes", np.array([-1, 1], np.int64))
    ]


def _unsqueeze(opset):
    if opset < 13:
        return [helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0, 3])], []
    return [helper.make_node("Unsqueeze", ["x", "axes"], ["y"])], [
        init("axes", np.array([0, 3], np.int64))
    ]


def _squeeze(opset):
    pre = helper.make_node(
        "Unsqueeze",
        ["x"] if opset < 13 else ["x", "ax"],
        ["x1"],
        **({"axes": [1]} if opset < 13 else {}),
    )
    inits = [] if opset < 13 else [init("ax", np.array([1], np.int64))]
    if opset < 13:
        return [pre, helper.make_node("Squeeze", ["x1"], ["y"], axes=[1])], inits
    return [pre, helper.make_node("Squeeze", ["x1", "ax"], ["y"])], inits


def _split(opset):
    outs = ["y0", "y1"]
    if opset < 13:
        return [helper.make_node("Split", ["x"], outs, axis=1, split=[1, 3])], []
    if opset < 18:
        return [helper.make_node("Split", ["x", "split"], outs, axis=1)], [
            init("split", np.array([1, 3], np.int64))
        ]
    return [helper.make_node("Split", ["x"], outs, axis=1, num_outputs=2)], []


def _split_even(opset):
    return [helper.make_node("Split", ["x"], ["y0", "y1"], axis=1)], []


def _slice(opset):
    if opset < 10:
        return [
            helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[3, 100], axes=[1, 2])
        ], []
    inits = [
        init("s", np.array([1, 0], np.int64)),
        init("e", np.array([3, 100], np.int64)),
        init("a", np.array([1, 2], np.int64)),
    ]
    return [helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], inits


def _pad(opset):
    pads = [0, 1, 2, 0, 2, 1]
    if opset < 11:
        return [helper.make_node("Pad", ["x"], ["y"], pads=pads, value=1.5)], []
    inits = [init("pads", np.array(pads, np.int64)), init("v", np.array(1.5, np.float32))]
    return [helper.make_node("Pad", ["x", "pads", "v"], ["y"])], inits


def _clip(opset):
    if opset < 11:
        return [helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.75)], []
    inits = [init("lo", np.array(-0.5, np.float32)), init("hi", np.array(0.75, np.float32))]
    return [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], inits


def _clip_min_only(opset):
    if opset < 11:
        return [helper.make_node("Clip", ["x"], ["y"], min=0.1)], []
    return [helper.make_node("Clip", ["x", "lo"], ["y"])], [init("lo", np.array(0.1, np.float32))]


def _softmax(opset):
    # before 13: coerce to 2-D at axis 1, i.e. normalise over the last two dims together
    return [helper.make_node("Softmax", ["x"], ["y"], axis=1)], []


def _log_softmax_default(opset):
    return [helper.make_node("LogSoftmax", ["x"], ["y"])], []  # default axis: 1 before 13, -1 after


def _hardmax_last(opset):
    return [helper.make_node("Hardmax", ["x"], ["y"], axis=2)], []


def _topk(opset):
    outs = ["y", "idx"]
    if opset < 10:
        return [helper.make_node("TopK", ["x"], outs, axis=-1, k=2)], []
    return [helper.make_node("TopK", ["x", "k"], outs, axis=-1)], [
        init("k", np.array([2], np.int64))
    ]


def _dropout(opset):
    kw = {"ratio": 0.3} if opset < 12 else {}
    return [helper.make_node("Dropout", ["x"], ["y"], **kw)], []


ADAPTER_CASES = {
    "reduce_sum": (_reduce_sum, (11, 13)),
    "reduce_mean": (_reduce_mean, (13, 18)),
    "unsqueeze": (_unsqueeze, (11, 13)),
    "squeeze": (_squeeze, (11, 13)),
    "split": (_split, (11, 13, 18)),
    "split_even": (_split_even, (11, 13)),
    "slice": (_slice, (9, 10)),
    "pad": (_pad, (10, 11)),
    "clip": (_clip, (10, 11)),
    "clip_min_only": (_clip_min_only, (10, 11)),
    "softmax_axis1": (_softmax, (11, 13)),
    "log_softmax_default_axis": (_log_softmax_default, (11, 13)),
    "hardmax_last_axis": (_hardmax_last, (11, 13)),
    "topk": (_topk, (9, 10)),
    "dropout": (_dropout, (10, 12)),
}

PARAMS = [(name, opset) for name, (_, opsets) in ADAPTER_CASES.items() for opset in opsets]


@pytest.mark.parametrize(("case", "opset"), PARAMS, ids=[f"{c}-opset{o}" for c, o in PARAMS])
def test_opset_adapter_matches_ort(case, opset):
    build, _ = ADAPTER_CASES[case]
    nodes, inits = build(opset)
    outs = [o for n in nodes[-1:] for o in n.output]
    model = make_model(
        nodes,
        [tin("x", ["batch", 4, 5])],
        [onnx.ValueInfoProto(name=o) for o in outs],
        inits,
        opset=opset,
    )
    g = import_model(model)
    assert [o.name for o in g.outputs] == outs
    for n in g.nodes:  # geode form: no attribute the opset-21 schema does not have
        assert not ({"axes", "split", "starts", "pads", "min", "k", "ratio"} & set(n.attrs)), n
    check_against_ort(model, [{"x": rand(n, 4, 5, seed=n)} for n in (2, 3)], codegen=False)


def test_softmax_before_13_is_rewritten_to_flatten_and_reshape():
    model = make_model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)],
        [tin("x", [2, 3, 4])],
        [tin("y", [2, 3, 4])],
        opset=11,
    )
    g = import_model(model)
    assert [n.op_type for n in g.nodes] == ["Shape", "Flatten", "Softmax", "Reshape"]
    assert g.outputs[0].name == "y" and g.outputs[0].shape == (2, 3, 4)
    # axis on the last dim needs no rewrite
    last = make_model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=2)],
        [tin("x", [2, 3, 4])],
        [tin("y", [2, 3, 4])],
        opset=11,
    )
    assert [(n.op_type, n.attrs) for n in import_model(last).nodes] == [("Softmax", {"axis": -1})]


def test_softmax_before_13_with_unknown_rank():
    model = make_model(
        [helper.make_node("LogSoftmax", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F32, None)],
        [tin("y", None)],
        opset=11,
    )
    g = import_model(model)
    assert [n.op_type for n in g.nodes] == ["Shape", "Flatten", "LogSoftmax", "Reshape"]
    check_against_ort(model, [{"x": rand(2, 3, 4)}, {"x": rand(5, 2)}], codegen=False)


def test_upsample_and_old_resize_adapt_to_resize_21_form():
    """The Resize adapters, checked on the NodeSpec (whether or not Resize is registered)."""
    g = geode.Graph("resize")
    x = g.input("x", [1, 1, 2, 2])
    scales = g.constant(np.array([1, 1, 2, 2], np.float32), name="scales")
    empty = g.constant(np.zeros(0, np.float32), name="empty")

    def adapt(op, version, inputs, attrs):
        spec = onnx_versions.NodeSpec(op, "", version, inputs, attrs, ["y"], f"{op}{version}")
        return onnx_versions.adapt(spec, onnx_versions.AdaptContext(g, spec.name))

    up9 = adapt("Upsample", 9, [x, scales], {"mode": "nearest"})
    assert up9.op_type == "Resize" and up9.inputs == [x, None, scales]
    assert up9.attrs == {
        "mode": "nearest",
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor",
    }
    up7 = adapt("Upsample", 7, [x], {"mode": "linear", "scales": [1.0, 1.0, 2.0, 3.0]})
    assert up7.inputs[2].data.tolist() == [1.0, 1.0, 2.0, 3.0] and "scales" not in up7.attrs
    assert (
        up7.attrs["coordinate_transformation_mode"] == "asymmetric"
        and "nearest_mode" not in up7.attrs
    )
    r10 = adapt("Resize", 10, [x, scales], {"mode": "linear"})
    assert (
        r10.inputs == [x, None, scales]
        and r10.attrs["coordinate_transformation_mode"] == "asymmetric"
    )
    sizes = g.constant(np.array([1, 1, 4, 4], np.int64), name="sizes")
    r11 = adapt("Resize", 11, [x, empty, empty, sizes], {"mode": "nearest"})
    assert r11.inputs == [x, None, None, sizes]
    r13 = adapt("Resize", 13, [x, None, scales], {"mode": "nearest"})
    assert r13.inputs == [x, None, scales] and r13.attrs == {"mode": "nearest"}


def test_batchnorm_spatial_attribute_at_opset_7_matches_ort():
    rng = np.random.default_rng(3)
    c = 3
    stats = [
        init(n, rng.uniform(0.5, 1.5, c).astype(np.float32))
        for n in ("scale", "bias", "mean", "var")
    ]
    node = helper.make_node(
        "BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], spatial=1, epsilon=1e-3
    )
    model = make_model(
        [node], [tin("x", ["N", c, 4, 4])], [tin("y", ["N", c, 4, 4])], stats, opset=7
    )
    g = import_model(model)
    assert "spatial" not in g.nodes[0].attrs
    check_against_ort(model, [{"x": rand(2, c, 4, 4)}], codegen=False)


def test_opset_6_legacy_broadcast_and_prelu():
    """Before opset 7, B matches A's dims from ``axis``; a 1-D PRelu slope is per channel."""
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    nodes = [
        helper.make_node("Add", ["x", "b"], ["s"], broadcast=1, axis=1),
        helper.make_node("Mul", ["s", "two"], ["t"], broadcast=1),  # scalar-like tail broadcast
        helper.make_node("PRelu", ["t", "slope"], ["y"]),
    ]
    inits = [init("b", b), init("two", np.array([2.0], np.float32)), init("slope", slope)]
    model = make_model(
        nodes, [tin("x", ["N", 3, 4, 5])], [tin("y", ["N", 3, 4, 5])], inits, opset=6
    )
    g = import_model(model)
    assert all(
        "broadcast" not in n.attrs and "axis" not in n.attrs
        for n in g.nodes
        if n.op_type in ("Add", "Mul")
    )
    x = rand(2, 3, 4, 5)
    t = (x + b[None, :, :, None]) * 2.0
    want = np.where(t >= 0, t, t * slope[None, :, None, None])
    np.testing.assert_allclose(
        geode.compile(model, codegen=False)(x=x)["y"], want, rtol=1e-6, atol=1e-6
    )


def test_reduce_adapter_in_geode_form():
    nodes, inits = _reduce_sum(11)
    model = make_model(nodes, [tin("x", [2, 4, 5])], [tin("y", None)], inits, opset=11)
    (node,) = import_model(model).nodes
    assert node.op_type == "ReduceSum" and node.attrs == {"keepdims": 0}
    assert node.inputs[1].is_constant and node.inputs[1].data.tolist() == [1]
    assert node.inputs[1].dtype == np.int64


def test_scatter_becomes_scatter_elements():
    nodes = [helper.make_node("Scatter", ["x", "idx", "upd"], ["y"], axis=1)]
    inits = [
        init("idx", np.array([[1, 0], [2, 3]], np.int64)),
        init("upd", np.ones((2, 2), np.float32)),
    ]
    model = make_model(nodes, [tin("x", [2, 5])], [tin("y", [2, 5])], inits, opset=9)
    assert [n.op_type for n in import_model(model).nodes] == ["ScatterElements"]
    check_against_ort(model, [{"x": rand(2, 5)}], codegen=False)


# -- graph structure -----------------------------------------------------------------------------
def test_constants_unsorted_nodes_names_and_pass_through_outputs():
    nodes = [
        helper.make_node("Add", ["h", "c"], ["y"]),  # out of order, no name
        helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Relu", ["x"], ["h"], name="dup"),
        helper.make_node("Neg", ["h"], ["z"], name="dup"),  # duplicate node name
    ]
    w = init("w", np.arange(3, dtype=np.float32))
    outs = [tin("y", [2, 3]), tin("z", [2, 3]), tin("x", [2, 3]), tin("w", [3])]
    model = make_model(nodes, [tin("x", [2, 3])], outs, [w])
    g = import_model(model)
    names = [n.name for n in g.nodes]
    assert len(set(names)) == len(names) and all(names)
    c = g.values["c"]
    assert c.kind is ValueKind.CONSTANT and c.data.tolist() == [1.0, 2.0, 3.0]
    out_names = [o.name for o in g.outputs]
    assert out_names == ["y", "z", "x", "w"]  # the ONNX names, in order
    assert g.outputs[2] is g.values["x"] and g.outputs[2].kind is ValueKind.INPUT
    assert g.outputs[3].producer.op_type == "Identity"
    x = rand(2, 3)
    got = geode.compile(model, codegen=False)(x=x)  # (onnxruntime refuses duplicate node names)
    assert list(got) == ["y", "z", "x", "w"]
    np.testing.assert_allclose(got["y"], np.maximum(x, 0) + [1.0, 2.0, 3.0], rtol=RTOL)
    np.testing.assert_allclose(got["z"], -np.maximum(x, 0), rtol=RTOL)
    np.testing.assert_array_equal(got["w"], [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(got["x"], x)


def test_repeated_graph_output_is_one_output():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    outs = [tin("y", [2, 3]), tin("x", [2, 3]), tin("y", [2, 3]), tin("x", [2, 3])]
    g = import_model(make_model(nodes, [tin("x", [2, 3])], outs))
    assert [o.name for o in g.outputs] == ["y", "x"]
    assert g.outputs[1] is g.values["x"]


def test_initializer_inputs_are_constants_unless_overridable():
    nodes = [helper.make_node("Add", ["x", "b"], ["y"])]
    model = make_model(
        nodes, [tin("x", [2]), tin("b", [2])], [tin("y", [2])], [init("b", np.ones(2, np.float32))]
    )
    g = import_model(model)
    assert [v.name for v in g.inputs] == ["x"] and g.values["b"].is_constant
    g2 = import_model(model, overridable_initializers=True)
    assert [v.name for v in g2.inputs] == ["x", "b"]
    assert g2.values["b"].default.tolist() == [1.0, 1.0]


def test_model_local_function_is_expanded():
    fn = helper.make_function(
        "custom",
        "Scaled",
        ["a"],
        ["out"],
        [
            helper.make_node("Mul", ["a", "a"], ["sq"]),
            helper.make_node("Add", ["sq", "a"], ["out"]),
        ],
        opset_imports=[helper.make_opsetid("", 13)],
    )
    nodes = [helper.make_node("Scaled", ["x"], ["y"], domain="custom", name="call")]
    model = make_model(
        nodes,
        [tin("x", [4])],
        [tin("y", [4])],
        functions=[fn],
        extra_opsets=[helper.make_opsetid("custom", 1)],
    )
    g = import_model(model)
    assert [n.op_type for n in g.nodes] == ["Mul", "Add"] and g.outputs[0].name == "y"
    x = rand(4)
    np.testing.assert_allclose(geode.compile(model, codegen=False)(x=x)["y"], x * x + x, rtol=RTOL)


def test_onnx_function_op_is_expanded_when_not_registered():
    if geode.compiler.ops.has("Shrink"):
        pytest.skip("Shrink is registered now")
    model = make_model(
        [helper.make_node("Shrink", ["x"], ["y"], lambd=0.5, bias=0.25)],
        [tin("x", ["N", 6])],
        [tin("y", ["N", 6])],
        opset=13,
    )
    assert "Shrink" not in {n.op_type for n in import_model(model).nodes}
    check_against_ort(model, [{"x": rand(3, 6)}], codegen=False)


# -- errors ---------------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    path = tmp_path / "nope.onnx"
    with pytest.raises(ModelLoadError, match="nope.onnx"):
        import_model(str(path))
    with pytest.raises(ModelLoadError, match="nope.onnx"):
        geode.compile(path)


def test_load_takes_a_path_a_model_proto_or_a_graph_and_names_anything_else(tmp_path):
    """geode.load(ModelProto) raised a bare TypeError from os.fspath; it now compiles the
    model as geode.compile does, and a value of another type is a GeodeError naming it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    v = np.array([[-1.0, 0.5, 2.0]], np.float32)
    for source in (model, path, str(path)):
        (out,) = geode.load(source, codegen=False)(x=v).values()
        np.testing.assert_array_equal(out, np.maximum(v, 0))
    with pytest.raises(GeodeError, match="cannot compile a int"):
        geode.load(3)


def test_initializer_with_negative_dims_is_refused(tmp_path):
    """A stored tensor with dims [-1] was read as shape (0,), and the error came later
    from Add's broadcast, naming neither the tensor nor the cause."""
    bad = numpy_helper.from_array(np.ones(3, np.float32), "w")
    del bad.dims[:]
    bad.dims.append(-1)
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [tin("x", [3])],
        [tin("y", [3])],
        inits=[bad],
    )
    with pytest.raises(ModelLoadError, match=r"initializer 'w' has dims \[-1\]"):
        import_model(model)


@pytest.mark.parametrize("cut", [10, 0.5, -3])
def test_truncated_file(tmp_path, cut):
    data = mlp_model().SerializeToString()
    n = int(len(data) * cut) if isinstance(cut, float) else cut % len(data)
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[:n])
    with pytest.raises(ModelLoadError, match="cut.onnx"):
        import_model(path)
    with pytest.raises(ModelLoadError):
        import_model(data[:n])


@pytest.mark.parametrize("kind", ["random", "text", "textproto", "tensor", "graph", "empty"])
def test_not_an_onnx_model(tmp_path, kind):
    contents = {
        "random": np.random.default_rng(0).bytes(512),
        "text": b"this is not an onnx model, just some words\n" * 10,
        "textproto": b"hello world",
        "tensor": numpy_helper.from_array(np.arange(12, dtype=np.float32), "t").SerializeToString(),
        "graph": mlp_model().graph.SerializeToString(),
        "empty": b"",
    }[kind]
    path = tmp_path / ("model.txt" if kind == "textproto" else f"{kind}.onnx")
    path.write_bytes(contents)
    with pytest.raises(ModelLoadError, match=path.name):
        import_model(path)


def test_not_a_model_object():
    with pytest.raises(ModelLoadError):
        import_model(12345)  # type: ignore[arg-type]


def test_opset_out_of_range():
    model = mlp_model()
    model.opset_import[0].version = 99
    with pytest.raises(ModelLoadError, match=r"ai\.onnx.*99"):
        import_model(model)
    model.opset_import[0].version = SUPPORTED_OPSET_RANGE[0] - 1
    with pytest.raises(ModelLoadError, match="older"):
        import_model(model)
    assert SUPPORTED_OPSET_RANGE == onnx_versions.SUPPORTED_OPSET_RANGE == (6, 28)


def test_unknown_op_names_op_domain_and_opset():
    model = make_model(
        [helper.make_node("FooBar", ["x"], ["y"], name="weird")],
        [tin("x", [2])],
        [tin("y", [2])],
        opset=13,
    )
    with pytest.raises(UnknownOpError) as info:
        import_model(model)
    msg = str(info.value)
    assert "FooBar" in msg and "ai.onnx" in msg and "13" in msg and "weird" in msg
    assert info.value.op_type == "FooBar" and info.value.opset == 13


def test_unknown_domain():
    nodes = [helper.make_node("Relu", ["x"], ["y"], domain="com.example")]
    model = make_model(
        nodes,
        [tin("x", [2])],
        [tin("y", [2])],
        extra_opsets=[helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(UnknownOpError, match="com.example"):
        import_model(model)
    nodes = [helper.make_node("FusedGelu", ["x"], ["y"], domain="com.microsoft")]
    model = make_model(
        nodes,
        [tin("x", [2])],
        [tin("y", [2])],
        extra_opsets=[helper.make_opsetid("com.microsoft", 1)],
    )
    with pytest.raises(UnknownOpError, match="com.microsoft"):
        import_model(model)


def test_if_model_imports_and_runs_both_branches():
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [], [tin("t", [2])]
    )
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [tin("e", [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    model = make_model([node], [tin("c", [], TensorProto.BOOL), tin("x", [2])], [tin("y", [2])])
    compiled = geode.compile(model)
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(compiled(c=np.array(True), x=x)["y"], [0.0, 2.0])
    np.testing.assert_array_equal(compiled(c=np.array(False), x=x)["y"], [1.0, -2.0])


def test_subgraph_attributes_become_geode_graphs_with_captures():
    """If/Loop/Scan bodies import as geode Graphs; outer values they read become inputs."""
    from geode.compiler.ops import registry

    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [], [tin("t", [2])]
    )
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [tin("e", [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    model = make_model([node], [tin("c", [], TensorProto.BOOL), tin("x", [2])], [tin("y", [2])])
    added = not registry.has("If")
    if added:  # a stand-in prototype, removed again below
        registry.register(
            registry.OpDef(
                "If",
                registry.OpKind.OPAQUE,
                inputs=[registry.In("cond", "B")],
                outputs=[registry.Out("outputs", "V", variadic=True)],
                attrs=[
                    registry.Attr("then_branch", "graph", registry.REQUIRED),
                    registry.Attr("else_branch", "graph", registry.REQUIRED),
                ],
                infer=lambda ctx: [o.desc for o in ctx.attr("then_branch").outputs],
                kernel=None,
            )
        )
    try:
        g = import_model(model)
    finally:
        if added:
            registry._REGISTRY.pop(("", "If"), None)
    (if_node,) = g.nodes
    then_b, else_b = if_node.attrs["then_branch"], if_node.attrs["else_branch"]
    assert isinstance(then_b, geode.Graph) and isinstance(else_b, geode.Graph)
    assert [n.op_type for n in then_b.nodes] == ["Relu"] and [o.name for o in then_b.outputs] == [
        "t"
    ]
    assert then_b.captures == ["x"] and [v.name for v in then_b.inputs] == ["x"]
    assert then_b.inputs[0].shape == (2,)
    assert g.outputs[0].name == "y"


def test_upsample_needs_resize():
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    inits = [init("scales", np.array([1, 1, 2, 2], np.float32))]
    model = make_model([node], [tin("x", [1, 1, 2, 2])], [tin("y", [1, 1, 4, 4])], inits, opset=9)
    if geode.compiler.ops.has("Resize"):
        g = import_model(model)
        (n,) = g.nodes
        assert n.op_type == "Resize" and n.attrs["coordinate_transformation_mode"] == "asymmetric"
        return
    with pytest.raises(UnknownOpError, match="Upsample"):
        import_model(model)


def test_batchnorm_before_opset_9_spatial0_and_training_outputs():
    rng = np.random.default_rng(4)
    shape = (3, 4)  # per-activation statistics: (C, D1)
    stats = {
        n: rng.uniform(0.5, 1.5, shape).astype(np.float32) for n in ("scale", "bias", "mean", "var")
    }
    node = helper.make_node(
        "BatchNormalization",
        ["x", "scale", "bias", "mean", "var"],
        ["y", "m", "v", "sm", "sv"],
        spatial=0,
        epsilon=1e-3,
    )
    model = make_model(
        [node],
        [tin("x", ["N", 3, 4])],
        [tin("y", ["N", 3, 4])],
        [init(k, v) for k, v in stats.items()],
        opset=7,
    )
    g = import_model(model)
    assert "BatchNormalization" not in {n.op_type for n in g.nodes}
    x = rand(2, 3, 4)
    want = (x - stats["mean"]) / np.sqrt(stats["var"] + 1e-3) * stats["scale"] + stats["bias"]
    np.testing.assert_allclose(
        geode.compile(model, codegen=False)(x=x)["y"], want, rtol=1e-5, atol=1e-5
    )
    # a training-only statistic that the model reads cannot be honoured
    used = make_model(
        [node, helper.make_node("Identity", ["m"], ["m_out"])],
        [tin("x", ["N", 3, 4])],
        [tin("y", None), tin("m_out", None)],
        [init(k, v) for k, v in stats.items()],
        opset=7,
    )
    with pytest.raises(ModelLoadError, match="training"):
        import_model(used)


def test_graph_input_without_type():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [onnx.ValueInfoProto(name="x")], [tin("y", [2])])
    with pytest.raises(ModelLoadError, match="'x'.*no type"):
        import_model(model)


def test_undefined_value_is_reported():
    model = make_model(
        [helper.make_node("Relu", ["ghost"], ["y"])], [tin("x", [2])], [tin("y", [2])]
    )
    with pytest.raises(ModelLoadError, match="ghost"):
        import_model(model)


def test_errors_are_geode_errors():
    assert issubclass(ModelLoadError, GeodeError) and issubclass(UnknownOpError, GeodeError)


# -- external data -------------------------------------------------------------------------------
def _save_external(model, folder, location="weights.bin"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=0,
    )
    return path


def test_external_data_round_trip(tmp_path):
    model = mlp_model()
    path = _save_external(mlp_model(), tmp_path / "m")
    assert (tmp_path / "m" / "weights.bin").exists()
    g = import_model(path)
    ext = {v.name: v.external for v in g.constants()}
    assert set(ext) == {"W1", "b1", "W2"}
    for v in g.constants():
        file, offset, length = v.external
        assert os.path.samefile(file, tmp_path / "m" / "weights.bin")
        assert length == v.data.nbytes and offset >= 0
        np.testing.assert_array_equal(external_loader(v)(), v.data)
    assert len({off for _, off, _ in ext.values()}) == 3
    want = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(g.values["W1"].data, want)
    f = {"x": rand(3, 8)}
    np.testing.assert_allclose(
        geode.compile(path, codegen=False)(**f)["y"], run_ort(model, f)["y"], rtol=RTOL, atol=ATOL
    )


def test_external_data_lazy_loading(tmp_path):
    """With load_external=False, large tensors keep a loader; small ones (shapes) load now."""
    w = rand(64, 64)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Reshape", ["h", "shape"], ["y"]),
    ]
    inits = [init("W", w), init("shape", np.array([-1, 8, 8], np.int64))]
    model = make_model(nodes, [tin("x", ["N", 64])], [tin("y", ["N", 8, 8])], inits)
    (tmp_path / "lazy" / "data").mkdir(parents=True)
    path = _save_external(model, tmp_path / "lazy", location="data/w.bin")
    lazy = import_model(path, load_external=False)
    wv, sv = lazy.values["W"], lazy.values["shape"]
    assert wv.data is None and wv.shape == (64, 64) and wv.dtype == np.float32
    np.testing.assert_array_equal(external_loader(wv)(), w)
    assert sv.data.tolist() == [-1, 8, 8] and sv.external[1] > 0  # after W in the same file
    assert os.path.samefile(wv.external[0], tmp_path / "lazy" / "data" / "w.bin")
    assert str(lazy.outputs[0].shape[0]) == "N"
    eager = import_model(path)
    np.testing.assert_array_equal(eager.values["W"].data, w)


def test_external_data_shared_range_is_loaded_once(tmp_path):
    """Two initializers naming the same (file, offset, length) share one array."""
    w = rand(4, 4)
    nodes = [helper.make_node("Add", ["A", "B"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    model = make_model(
        nodes, [tin("x", [4, 4])], [tin("y", [4, 4])], [init("A", w), init("B", w + 1)]
    )
    path = _save_external(model, tmp_path / "shared")
    proto = onnx.load(str(path), load_external_data=False)
    a, b = proto.graph.initializer
    del b.external_data[:]
    for e in a.external_data:
        b.external_data.add().CopyFrom(e)
    onnx.save_model(proto, str(path))
    g = import_model(path)
    va, vb = g.values["A"], g.values["B"]
    assert va.external == vb.external and va.data is vb.data
    np.testing.assert_array_equal(vb.data, w)


def test_external_data_from_bytes_needs_a_folder(tmp_path):
    path = _save_external(mlp_model(), tmp_path / "m")
    with pytest.raises(ModelLoadError, match="W1"):
        import_model(path.read_bytes())
    g = import_model(path.read_bytes(), external_data_dir=tmp_path / "m")
    assert g.values["W1"].data.shape == (8, 16)


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink", "nested_parent"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, where):
    model = mlp_model()
    folder = tmp_path / "m"
    path = _save_external(model, folder)
    # a file outside the folder that holds perfectly valid data for every tensor
    outside = tmp_path / "outside.bin"
    outside.write_bytes((folder / "weights.bin").read_bytes())
    location = {
        "parent": "../outside.bin",
        "absolute": str(outside),
        "symlink": "link.bin",
        "nested_parent": "sub/../../outside.bin",
    }[where]
    if where == "symlink":
        os.symlink(outside, folder / "link.bin")
    hostile = onnx.load(str(path), load_external_data=False)
    for t in hostile.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    (folder / "weights.bin").unlink()
    onnx.save_model(hostile, str(path))
    with pytest.raises(ModelLoadError) as info:
        import_model(path)
    msg = str(info.value)
    assert "W1" in msg or "b1" in msg or "W2" in msg
    assert location in msg
    with pytest.raises(ModelLoadError):
        import_model(path, load_external=False)


def test_missing_external_file(tmp_path):
    path = _save_external(mlp_model(), tmp_path / "m")
    (tmp_path / "m" / "weights.bin").unlink()
    with pytest.raises(ModelLoadError, match="weights.bin"):
        import_model(path)
