"""The incremental (JIT) option end to end (issue 37): a graph with a data-dependent op
compiles up to it; the rest compiles for the shapes seen at run time, once per new
shape, and is reused; results match the same graph compiled whole."""

import numpy as np
import pytest

import geode
from geode import ops
from geode.errors import GeodeError, MissingInputError
from geode.runtime.incremental import IncrementalModel


def graph():
    g = geode.Graph("inc")
    x = g.input("x", ["N", 8])
    w = g.input("w", [2])
    a = ops.exp(x) * 0.5
    c = ops.cast(ops.transpose(ops.non_zero(a > 0.6), perm=[1, 0]), to=1)  # [K, 2]
    y = ops.sigmoid(c * w) * ops.reduce_sum(a, axes=[0, 1], keepdims=1)
    g.output(y, a, names=["y", "a"])
    return g


@pytest.fixture(scope="module")
def models():
    g = graph()
    return geode.compile(g, incremental=True), geode.compile(g)


def feeds(x):
    return {"x": x, "w": np.array([0.5, -1.0], np.float32)}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_the_tail_compiles_once_per_new_shape(models):
    inc, whole = models
    assert isinstance(inc, IncrementalModel) and inc.tail_compiles == 0
    assert {n.op_type for k in inc.head.kernels for n in k.ops} >= {"Exp", "NonZero"}
    x = np.zeros((4, 8), np.float32)
    x[0, :3] = 5.0  # 3 values above 0.6 after exp * 0.5
    y = x.copy()
    y[1, 5] = 5.0  # 4
    for arr, compiles in ((x, 1), (x, 1), (y, 2), (x, 2), (y, 2)):
        same(inc.run(feeds(arr)), whole.run(feeds(arr)))
        assert inc.tail_compiles == compiles
    assert inc.tail_inputs[0].startswith("nonzero") and len(inc.tails) == 2
    (tail,) = [m for key, m in inc.tails.items() if key[0] == (2, 3)]
    assert tail.plan.inputs[0].dims == (2, 3)  # compiled for that shape: static dims
    text = inc.explain()
    assert "head: compiled once" in text and "tails compiled: 2, kept: 2" in text


@pytest.mark.parametrize("n", [1, 3, 9])
def test_incremental_matches_the_whole_model(models, n):
    inc, whole = models
    x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
    same(inc.run(feeds(x)), whole.run(feeds(x)))


def test_bad_feeds_and_saving(models, tmp_path):
    inc, _ = models
    with pytest.raises(MissingInputError):
        inc.run({"x": np.zeros((1, 8), np.float32)})
    with pytest.raises(GeodeError, match="per shape"):
        inc.save(tmp_path / "m.geode")


def test_a_graph_without_data_dependent_ops_compiles_as_usual():
    g = geode.Graph("static")
    x = g.input("x", ["N", 8])
    g.output(ops.exp(x), names=["y"])
    model = geode.compile(g, incremental=True)
    assert not isinstance(model, IncrementalModel)
    np.testing.assert_allclose(model(x=np.ones((2, 8), np.float32))["y"], np.e, rtol=1e-6)
