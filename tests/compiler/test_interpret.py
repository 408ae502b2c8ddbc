"""The reference interpreter: values, input checking, result checking."""

import numpy as np
import pytest

import geode
from geode import ops
from geode.compiler.interpret import bind_inputs, run_reference
from geode.compiler.shapes import sym
from geode.errors import (
    ExecutionError,
    InputDTypeError,
    InputError,
    InputShapeError,
    MissingInputError,
    UnexpectedInputError,
)

rng = np.random.default_rng(0)


def _rmsnorm() -> geode.Graph:
    g = geode.Graph("rmsnorm")
    x = g.input("x", ["N", 8])
    w = g.constant(rng.standard_normal(8).astype(np.float32), name="w")
    ms = ops.reduce_mean(x * x, axes=[-1], keepdims=1)
    g.output(x / ops.sqrt(ms + 1e-6) * w, names=["y"])
    return g


def test_values_match_numpy():
    g = _rmsnorm()
    w = g.values["w"].data
    for n in (1, 5):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        out = run_reference(g, {"x": x}, check=True)
        want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6)) * w
        assert list(out) == ["y"]
        np.testing.assert_allclose(out["y"], want, rtol=1e-6, atol=1e-6)


def test_variables_constants_and_passthrough_outputs():
    g = geode.Graph("vars")
    x = g.input("x", [3])
    v = g.variable(np.array([1.0, 2.0, 3.0], np.float32), "v")
    c = g.constant(np.float32(10.0))
    g.output(x * v + c, x, names=["y", "x_out"])
    x_in = np.ones(3, np.float32)
    out = run_reference(g, {"x": x_in})
    np.testing.assert_array_equal(out["y"], [11.0, 12.0, 13.0])
    np.testing.assert_array_equal(out["x_out"], x_in)


def test_multi_output_nodes_and_keep_all():
    g = geode.Graph("split")
    x = g.input("x", ["N", 4])
    a, b = ops.split(x, axis=1, num_outputs=2)
    g.output(a - b, names=["d"])
    x_in = rng.standard_normal((3, 4)).astype(np.float32)
    out = run_reference(g, {"x": x_in}, keep_all=True, check=True)
    np.testing.assert_array_equal(out["d"], x_in[:, :2] - x_in[:, 2:])
    assert out[a.name].shape == (3, 2)


def test_missing_and_unexpected_inputs():
    g = _rmsnorm()
    with pytest.raises(MissingInputError, match="'x'"):
        run_reference(g, {})
    with pytest.raises(UnexpectedInputError, match="'z'"):
        run_reference(g, {"x": np.ones((2, 8), np.float32), "z": np.ones(1)})
    assert issubclass(MissingInputError, InputError)


def test_bad_dtype_and_shape():
    g = _rmsnorm()
    with pytest.raises(InputDTypeError, match="float64"):
        run_reference(g, {"x": np.ones((2, 8))})
    with pytest.raises(InputDTypeError, match="str"):
        run_reference(g, {"x": "abc"})
    out = run_reference(g, {"x": [[1.0] * 8]})  # Python lists take the input's dtype
    assert out["y"].dtype == np.float32 and out["y"].shape == (1, 8)
    with pytest.raises(InputShapeError, match="rank"):
        run_reference(g, {"x": np.ones((2, 8, 1), np.float32)})
    with pytest.raises(InputShapeError, match="dim 1"):
        run_reference(g, {"x": np.ones((2, 7), np.float32)})


def test_shared_symbol_must_agree():
    g = geode.Graph("shared")
    a = g.input("a", ["N", 2])
    b = g.input("b", ["N", 2])
    g.output(a + b, names=["y"])
    env = bind_inputs(g, {"a": np.ones((3, 2), np.float32), "b": np.ones((3, 2), np.float32)})
    assert env == {sym("N"): 3}
    with pytest.raises(InputShapeError, match="N"):
        run_reference(g, {"a": np.ones((3, 2), np.float32), "b": np.ones((4, 2), np.float32)})


def test_check_catches_a_lying_desc():
    g = geode.Graph("lie")
    x = g.input("x", ["N", 4])
    y = ops.exp(x)
    g.output(y, names=["y"])
    feeds = {"x": np.zeros((2, 4), np.float32)}
    run_reference(g, feeds, check=True)
    y.desc = geode.TensorDesc(np.float64, y.shape)
    with pytest.raises(ExecutionError, match="dtype"):
        run_reference(g, feeds, check=True)
    y.desc = geode.TensorDesc(np.float32, (sym("N"), 5))
    with pytest.raises(ExecutionError, match="dim 1"):
        run_reference(g, feeds, check=True)
    run_reference(g, feeds)  # without check the desc is not looked at


def test_kernel_failure_names_the_node():
    g = geode.Graph("bad")
    x = g.input("x", [4])
    idx = g.input("i", [1], "int64")
    g.output(ops.gather(x, idx), names=["y"])
    with pytest.raises(ExecutionError, match="Gather"):
        run_reference(g, {"x": np.ones(4, np.float32), "i": np.array([10], np.int64)})
