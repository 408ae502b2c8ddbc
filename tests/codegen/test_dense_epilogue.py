"""MatMul/Gemm with fused epilogues: one native step (BLAS per panel of rows, then the
compiled epilogue on the panel), checked against the reference path (numpy kernels that
follow ONNX semantics) and onnx.reference.ReferenceEvaluator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.codegen.dense import DenseKernel
from geode.compiler.fusion import profit
from geode.errors import ExecutionError

RNG = np.random.default_rng(7)


def _rand(*shape, dtype=np.float32):
    return (RNG.standard_normal(shape)).astype(dtype)


def _run_both(g, feeds, **opts):
    fused = geode.compile(g, **opts)
    ref = geode.compile(g, codegen=False)
    return fused, fused.run(feeds), ref.run(feeds)


def _dense_kernels(model):
    return [k for k in model.kernels if k.kind == "dense"]


def _close(a, b, dtype=np.float32):
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=tol * 10, atol=tol * 10, err_msg=k)


def _mlp(dtype=np.float32, k=16, n=24, act="Relu"):
    g = geode.Graph("mlp")
    x = g.input("x", ["B", "S", k], dtype)
    r = g.input("r", ["B", "S", n], dtype)
    w = g.constant(_rand(k, n, dtype=dtype), "w")
    bias = g.constant(_rand(n, dtype=dtype), "bias")
    y = g.op(act, g.op("Add", g.op("Add", g.op("MatMul", x, w), bias), r))
    g.output(y, names=["y"])
    return g


def test_bias_residual_activation_is_one_dense_step():
    g = _mlp()
    feeds = {"x": _rand(2, 5, 16), "r": _rand(2, 5, 24)}
    model, got, want = _run_both(g, feeds)
    assert len(model.kernels) == 1 and len(_dense_kernels(model)) == 1, model.explain()
    assert [n.op_type for n in model.kernels[0].ops] == ["MatMul", "Add", "Add", "Relu"]
    assert "dense epilogues:" in model.explain() and "panels of" in model.explain()
    _close(got, want)


def test_gemm_bias_gelu_is_one_kernel():
    """Gemm + bias + GELU (erf form, as PyTorch exports it) is one kernel."""
    m, k, n = 7, 12, 10
    w = _rand(n, k)  # transB: PyTorch's Linear weight layout
    b = _rand(n)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
        helper.make_node("Div", ["h", "sqrt2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["he"]),
        helper.make_node("Mul", ["he", "half"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm_gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = geode.compile(proto)
    assert len(model.kernels) == 1 and model.kernels[0].kind == "dense", model.explain()
    x = _rand(m, k)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x})
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (1, 5), (4, 5), (4, 1)])
def test_gemm_matches_reference_evaluator(trans_a, trans_b, c_shape):
    m, k, n = 4, 3, 5
    a = _rand(*((k, m) if trans_a else (m, k)))
    b = _rand(*((n, k) if trans_b else (k, n)))
    inputs = ["a", "b"] + ([] if c_shape is None else ["c"])
    node = helper.make_node(
        "Gemm", inputs, ["y"], alpha=0.75, beta=1.5, transA=trans_a, transB=trans_b
    )
    inits = [numpy_helper.from_array(b, "b")]
    if c_shape is not None:
        inits.append(numpy_helper.from_array(_rand(*c_shape), "c"))
    graph = helper.make_graph(
        [node],
        "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(proto)
    (want,) = ReferenceEvaluator(proto).run(None, {"a": a})
    model = geode.compile(proto)
    np.testing.assert_allclose(model.run({"a": a})["y"], want, rtol=1e-5, atol=1e-5)


def test_layer_norm_epilogue_reduces_each_row_of_the_panel():
    """MatMul + bias + residual + LayerNorm (a row reduction) is one dense kernel."""
    g = geode.Graph("ln")
    x = g.input("x", ["B", "S", 16])
    r = g.input("r", ["B", "S", 32])
    w = g.constant(_rand(16, 32), "w")
    h = g.op("Add", g.op("Add", g.op("MatMul", x, w), g.constant(_rand(32), "b")), r)
    y = g.op("LayerNormalization", h, g.constant(_rand(32), "gamma"), g.constant(_rand(32), "beta"))
    g.output(y, names=["y"])
    feeds = {"x": _rand(3, 70, 16), "r": _rand(3, 70, 32)}
    model, got, want = _run_both(g, feeds)
    dense = _dense_kernels(model)
    assert len(dense) == 1 and len(model.kernels) == 1, model.explain()
    _close(got, want)


def test_many_panels_with_a_remainder(monkeypatch):
    """Tiny panels (3 rows): every panel, and the short last one, lands in its place."""
    monkeypatch.setattr(profit, "DENSE_MIN_ROWS", 3)
    monkeypatch.setattr(profit, "panel_bytes", lambda spec: 16)
    g = geode.Graph("panels")
    x = g.input("x", ["M", 8])
    col = g.input("c", ["M", 1])
    w = g.constant(_rand(8, 6), "w")
    y = g.op("Sub", g.op("MatMul", x, w), col)
    s = g.op("ReduceSum", y, g.constant(np.array([-1], np.int64)), keepdims=1)
    g.output(g.op("Tanh", y), s, names=["y", "s"])
    feeds = {"x": _rand(17, 8), "c": _rand(17, 1)}
    model, got, want = _run_both(g, feeds)
    assert len(_dense_kernels(model)) == 1, model.explain()
    _close(got, want)


@pytest.mark.parametrize("dims", [(0, 4, 5), (3, 0, 5), (3, 4, 0), (1, 1, 1)])
def test_degenerate_dims(dims):
    m, k, n = dims
    g = geode.Graph("degenerate")
    x = g.input("x", ["M", k])
    w = g.constant(_rand(k, n), "w")
    y = g.op("Sigmoid", g.op("Add", g.op("MatMul", x, w), g.constant(_rand(n), "b")))
    total = g.op("ReduceMax", y, g.constant(np.array([1], np.int64)), keepdims=1)
    g.output(y, total, names=["y", "t"])
    feeds = {"x": _rand(m, k)}
    model, got, want = _run_both(g, feeds)
    assert len(_dense_kernels(model)) == 1, model.explain()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_float64_and_a_float16_cast_output():
    g = geode.Graph("dtypes")
    x = g.input("x", ["M", 9], np.float64)
    w = g.constant(_rand(9, 11, dtype=np.float64), "w")
    y = g.op("Mul", g.op("MatMul", x, w), g.constant(np.array(0.5), "s", dtype=np.float64))
    g.output(y, g.op("Cast", y, to=10), names=["y", "h"])
    model, got, want = _run_both(g, {"x": _rand(13, 9, dtype=np.float64)})
    assert len(_dense_kernels(model)) == 1, model.explain()
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-12)
    assert got["h"].dtype == np.float16
    np.testing.assert_array_equal(got["h"], want["h"])


def test_the_option_turns_it_off():
    g = _mlp()
    model = geode.compile(g, dense_epilogues=False)
    assert not _dense_kernels(model)
    assert {k.kind for k in model.kernels} == {"library", "fused"}, model.explain()


def test_kept_apart_when_the_product_is_a_graph_output():
    g = geode.Graph("out")
    x = g.input("x", ["M", 4])
    y = g.op("MatMul", x, g.constant(_rand(4, 4), "w"))
    g.output(y, g.op("Relu", y), names=["y", "r"])
    model, got, want = _run_both(g, {"x": _rand(5, 4)})
    assert not _dense_kernels(model)
    assert "keep apart from group" in model.explain()
    assert "the product is a graph output" in model.explain()
    _close(got, want)


def test_kept_apart_when_the_group_reduces_another_axis():
    g = geode.Graph("colsum")
    x = g.input("x", ["M", 4])
    y = g.op("Exp", g.op("MatMul", x, g.constant(_rand(4, 6), "w")))
    g.output(g.op("ReduceSum", y, g.constant(np.array([0], np.int64)), keepdims=1), names=["s"])
    model, got, want = _run_both(g, {"x": _rand(5, 4)})
    assert not _dense_kernels(model), model.explain()
    _close(got, want)


def test_a_refusing_status_is_a_clear_error():
    """The entry's statuses: no memory for the panel, an epilogue refusing its panel
    arguments, and a bad argument (the entry kernel's own message)."""
    from geode.codegen.backends.llvm.dense import EPILOGUE_STATUS, NO_MEMORY

    class Entry:
        address = 0

        def _bad_argument(self, i):
            raise ValueError(f"kernel k: argument {i} must have shape (M, K)")

    class Epilogue:
        source = ""

    dense = DenseKernel("mm", Entry(), Epilogue(), "")
    with pytest.raises(ExecutionError, match="out of memory"):
        dense._bad_argument(NO_MEMORY - 1)
    with pytest.raises(ExecutionError, match="epilogue refused argument 2"):
        dense._bad_argument(EPILOGUE_STATUS + 2)
    with pytest.raises(ValueError, match="argument 1 must have shape"):
        dense._bad_argument(1)


_EPILOGUE_OPS = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs"]
_BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(0, 5), min_size=1, max_size=2),
    k=st.integers(1, 9),
    n=st.integers(1, 12),
    steps=st.lists(
        st.tuples(
            st.sampled_from(_EPILOGUE_OPS + _BINARY), st.sampled_from(["full", "row", "col"])
        ),
        min_size=1,
        max_size=4,
    ),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_random_epilogues_match_the_reference(lead, k, n, steps, dtype):
    g = geode.Graph("rand")
    names = [f"d{i}" for i in range(len(lead))]
    x = g.input("x", [*names, k], dtype)
    w = g.constant(_rand(k, n, dtype=dtype), "w")
    h = g.op("MatMul", x, w)
    feeds = {"x": _rand(*lead, k, dtype=dtype)}
    for i, (op, role) in enumerate(steps):
        if op in _EPILOGUE_OPS:
            h = g.op(op, h if op != "Exp" else g.op("Tanh", h))
            continue
        shape = {"full": [*names, n], "row": [n], "col": [*names, 1]}[role]
        data_shape = {"full": [*lead, n], "row": [n], "col": [*lead, 1]}[role]
        other = g.input(f"o{i}", shape, dtype)
        feeds[f"o{i}"] = _rand(*data_shape, dtype=dtype)
        h = g.op(op, h, other)
    g.output(h, names=["y"])
    model, got, want = _run_both(g, feeds)
    assert len(_dense_kernels(model)) == 1, model.explain()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got["y"], want["y"], rtol=tol, atol=tol)
