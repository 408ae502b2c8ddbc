"""``geode.onnx_backend``: the onnx Backend/BackendRep interface (fast checks; the ONNX
suite itself runs in the slow ``test_onnx_backend.py``)."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.base import Backend, BackendRep

import geode
from geode.config import OptionError
from geode.errors import GeodeError, InputError, ModelLoadError
from geode.onnx_backend import GeodeBackend, GeodeRep
from geode.runtime.var_manager import VarManagerPool


def mlp() -> onnx.ModelProto:
    """y = relu(x @ w + b), z = sum(y); w and b are initializers."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["z"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
        ],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_is_an_onnx_backend():
    assert issubclass(GeodeBackend, Backend) and issubclass(GeodeRep, BackendRep)
    assert geode.onnx_backend.GeodeBackend is GeodeBackend


def test_prepare_and_run_in_the_models_output_order():
    m = mlp()
    rep = GeodeBackend.prepare(m, "CPU")
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    z, y = rep.run([x])
    w = numpy_helper.to_array(m.graph.initializer[0])
    b = numpy_helper.to_array(m.graph.initializer[1])
    want_y = np.maximum(x @ w + b, 0)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z, want_y.sum(), rtol=1e-5)
    assert rep.output_names == ["z", "y"] and rep.input_names == ["x"]
    (z2, _) = rep.run({"x": x})
    np.testing.assert_allclose(z2, z)
    assert any(k.engine == "aicore" for k in rep.model.kernels), "default options compile kernels"


def test_prepare_accepts_paths_bytes_and_options(tmp_path):
    m = mlp()
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    x = np.ones((2, 4), np.float32)
    a = GeodeBackend.prepare(str(path)).run([x])
    b = GeodeBackend.prepare(m.SerializeToString(), fusion=False, codegen=False).run([x])
    np.testing.assert_allclose(a[1], b[1], rtol=1e-6)
    with pytest.raises(OptionError, match="bogus"):
        GeodeBackend.prepare(m, bogus=1)
    GeodeBackend.prepare(m, rtol=1e-3, atol=1e-7)  # the test runner's keywords are accepted


def test_run_model_and_run_node():
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    z, _ = GeodeBackend.run_model(mlp(), [x])
    assert z.shape == ()
    node = helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.5)
    (y,) = geode.onnx_backend.run_node(node, [x])
    np.testing.assert_allclose(y, np.where(x > 0, x, 0.5 * x))
    (s,) = GeodeBackend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), {"a": x, "b": x})
    np.testing.assert_allclose(s, 2 * x)
    (t,) = GeodeBackend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x], opset_version=6)
    np.testing.assert_allclose(t, np.maximum(x, 0))


def test_devices():
    assert GeodeBackend.supports_device("CPU") and GeodeBackend.supports_device("CPU:0")
    assert not GeodeBackend.supports_device("CUDA")
    assert not GeodeBackend.supports_device("TPU")
    with pytest.raises(GeodeError, match="CUDA"):
        GeodeBackend.prepare(mlp(), "CUDA")


def test_bad_inputs_are_input_errors():
    rep = GeodeBackend.prepare(mlp())
    with pytest.raises(InputError):
        rep.run([np.ones((2, 4), np.float32), np.ones(1, np.float32)])
    with pytest.raises(InputError):
        rep.run([np.ones((2, 5), np.float32)])


def test_a_collected_rep_frees_its_session_memory():
    rep = GeodeBackend.prepare(mlp())
    sid = rep.session.id
    assert sid in VarManagerPool.instance()
    del rep
    gc.collect()
    assert sid not in VarManagerPool.instance()


def _relu_model(outputs: list[str]) -> onnx.ModelProto:
    """y = relu(x) with the given graph outputs (names among x and y, repeats allowed)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "pass",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3]) for n in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_prepare_refuses_what_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match=r"ONNX model bytes \(9 bytes\): not a readable ONNX"):
        GeodeBackend.prepare(b"\x00\x01garbage")
    with pytest.raises(ModelLoadError, match="cannot import a int as an ONNX model"):
        GeodeBackend.prepare(5)
    with pytest.raises(ModelLoadError, match="missing.onnx'?: no such file"):
        GeodeBackend.prepare(str(tmp_path / "missing.onnx"))


@pytest.mark.parametrize(
    "outputs", [["y", "x"], ["x"], ["y", "y"], ["x", "y", "x", "y"]], ids="-".join
)
def test_outputs_keep_their_onnx_names_and_order(outputs):
    """Graph inputs as outputs and repeated outputs come back under the model's names."""
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    want = {"x": x, "y": np.maximum(x, 0)}
    rep = GeodeBackend.prepare(_relu_model(outputs))
    got = rep.run([x])
    assert rep.output_names == outputs and len(got) == len(outputs)
    for name, arr in zip(outputs, got):
        np.testing.assert_array_equal(arr, want[name])
        assert not np.shares_memory(arr, x)  # an input passed through is a copy
    for i in range(len(got)):  # a repeated output is a copy at each position
        for j in range(i):
            assert not np.shares_memory(got[i], got[j])
    compiled = geode.compile(_relu_model(outputs))
    assert compiled.output_names == list(dict.fromkeys(outputs))  # a dict holds a name once
    res = compiled(x=x)
    for name in outputs:
        np.testing.assert_array_equal(res[name], want[name])


def test_run_node_opset_version_must_be_an_integer():
    x = np.ones((1, 2), np.float32)
    node = helper.make_node("Relu", ["x"], ["y"])
    for bad in ("abc", 1.5, True, None):
        with pytest.raises(
            OptionError, match=rf"run_node: opset_version={bad!r}: expected an integer"
        ):
            GeodeBackend.run_node(node, [x], opset_version=bad)
    (y,) = GeodeBackend.run_node(node, [x], opset_version="13")
    np.testing.assert_array_equal(y, x)
