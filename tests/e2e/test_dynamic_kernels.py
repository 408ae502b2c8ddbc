"""Native kernels in unknown-shape partitions (issue 37): the ops after a NonZero compile
into native kernels whose dims are bound at run time from the arrays produced before
them, checked against the reference engine at sizes including 0, with kernel counts
through ``model.kernels``; broadcasts between sizes known only at run time are checked
right after the step that binds them."""

import os

import numpy as np
import pytest

import geode
from geode import ops
from geode.compiler.interpret import run_reference
from geode.errors import ExecutionError

SIZES = [0, 1, 3, 50]


def native(model):
    return [k for k in model.kernels if k.engine == "aicore"]


def check(model, graph, feeds, rtol=1e-5, atol=1e-6):
    got = model(**feeds)
    want = run_reference(graph, feeds, check=True)
    for name, w in want.items():
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol, err_msg=name)
    return got


def mask(n, seed, cols=8):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, cols)) > 0.3).astype(np.float32)


def nonzero_chain():
    g = geode.Graph("nonzero_chain")
    x = g.input("x", ["N", 8])
    c = ops.cast(ops.transpose(ops.non_zero(x), perm=[1, 0]), to=1)  # [K, 2]
    y = ops.exp(c * 0.25) + c
    g.output(ops.sigmoid(y) * y, names=["z"])
    return g


@pytest.fixture(scope="module")
def chain():
    g = nonzero_chain()
    return g, geode.compile(g)


def test_elementwise_chain_after_nonzero_is_one_native_kernel(chain):
    _, model = chain
    assert [k.engine for k in model.kernels] == ["host", "aicore"]
    (k,) = native(model)
    assert sorted(n.op_type for n in k.ops) == sorted(
        ["Transpose", "Cast", "Mul", "Exp", "Add", "Sigmoid", "Mul"]
    )
    text = model.explain()
    assert "partition 0 [unknown-shape]" in text
    assert "unknown shape: 'nonzero_0' has dim _nnz1, bound at run time by node 'nonzero'" in text


@pytest.mark.parametrize("n", SIZES)
def test_elementwise_chain_after_nonzero_matches_reference(chain, n):
    g, model = chain
    got = check(model, g, {"x": mask(n, n)})
    assert got["z"].shape[1] == 2


def test_all_zero_input_gives_an_empty_result(chain):
    g, model = chain
    got = check(model, g, {"x": np.zeros((4, 8), np.float32)})
    assert got["z"].shape == (0, 2)


def test_reductions_softmax_and_matmul_after_nonzero_are_native():
    rng = np.random.default_rng(0)
    g = geode.Graph("nonzero_mlp")
    x = g.input("x", ["N", 8])
    w1 = g.constant(rng.standard_normal((2, 16)).astype(np.float32))
    w2 = g.constant(rng.standard_normal((16, 4)).astype(np.float32))
    c = ops.cast(ops.transpose(ops.non_zero(x), perm=[1, 0]), to=1)
    h = ops.relu(ops.matmul(c, w1) + 1.0)
    y = ops.softmax(ops.matmul(h, w2), axis=0)
    s = ops.reduce_sum(ops.exp(c * 0.1), axes=[1], keepdims=1)
    g.output(y, c * s, names=["y", "s"])
    model = geode.compile(g)
    assert [k.engine for k in model.kernels].count("aicore") == len(model.kernels) - 1
    assert {n.op_type for k in native(model) for n in k.ops} >= {"MatMul", "ReduceSum", "Exp"}
    for n in SIZES:
        check(model, g, {"x": mask(n, n + 1)}, rtol=1e-4, atol=1e-5)


def two_counts():
    g = geode.Graph("two_counts")
    x = g.input("x", [6])
    y = g.input("y", [6])
    a = ops.cast(ops.non_zero(x), to=1)  # [1, K1]
    b = ops.cast(ops.non_zero(y), to=1)  # [1, K2]
    g.output(ops.exp(a + b) * a, names=["z"])
    return g


@pytest.fixture(scope="module")
def counts():
    g = two_counts()
    return g, geode.compile(g)


def test_broadcast_of_two_run_time_sizes_is_one_kernel(counts):
    _, model = counts
    assert [k.engine for k in model.kernels] == ["host", "host", "aicore"]
    assert sorted(n.op_type for n in native(model)[0].ops) == sorted(
        ["Cast", "Cast", "Add", "Exp", "Mul"]
    )


@pytest.mark.parametrize(
    ("x", "y"),
    [([1, 0, 1, 0, 1, 0], [1, 1, 1, 0, 0, 0]), ([1, 0, 1, 0, 1, 0], [0, 0, 1, 0, 0, 0])],
)
def test_broadcast_of_run_time_sizes_matches_reference(counts, x, y):
    g, model = counts
    check(model, g, {"x": np.array(x, np.float32), "y": np.array(y, np.float32)})


def test_run_time_sizes_that_cannot_broadcast_raise_naming_both(counts):
    _, model = counts
    x = np.array([1, 0, 1, 0, 1, 0], np.float32)
    y = np.array([1, 1, 0, 0, 0, 0], np.float32)
    with pytest.raises(ExecutionError) as err:
        model(x=x, y=y)
    msg = str(err.value)
    assert "_nnz2 = 3" in msg and "_nnz3 = 2" in msg and "cannot broadcast" in msg
    assert "known after step 'nonzero_2'" in msg


def test_model_file_keeps_run_time_dims(chain, tmp_path):
    g, model = chain
    path = os.path.join(tmp_path, "m.geode")
    model.save(path)
    loaded = geode.load(path)
    assert [k.engine for k in loaded.kernels] == ["host", "aicore"]
    for n in (0, 7):
        check(loaded, g, {"x": mask(n, 10 + n)})


def test_sizes_read_from_values_at_run_time_are_not_compiled():
    """A Reshape to a shape given as an input tensor, then Exp, and a MatMul of that: the
    dims are the shape tensor's values, which no step binds before a kernel would need
    them, so those ops run on the reference engine (saying why) and give its results."""
    g = geode.Graph("reshape_by_value")
    x = g.input("x", [2, 12], "float32")
    shape = g.input("shape", [2], "int64")
    y = ops.exp(g.op("Reshape", x, shape))
    w = g.constant(np.ones((4, 5), np.float32), "w")
    g.output(y, g.op("MatMul", y, w), names=["y", "z"])
    model = geode.compile(g, progress=0)
    for s in ([6, 4], [3, 4]):
        feeds = {"x": np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 12),
                 "shape": np.array(s, np.int64)}  # fmt: skip
        if s == [3, 4]:
            with pytest.raises(geode.GeodeError):  # 24 elements cannot be 3 x 4
                model(**feeds)
            continue
        check(model, g, feeds)
    assert "known only from values read at run time" in model.explain()
