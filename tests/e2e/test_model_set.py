"""Issue 2's model set: build through the Python API with symbolic batch dims, compile,
and match numpy for several batch sizes with one compile."""

import numpy as np
import pytest

import geode
from geode import examples

NAMES = sorted(examples.ALL)
BATCHES = (1, 3, 17)


@pytest.fixture(scope="module", params=[True, False], ids=["codegen", "reference"])
def codegen(request):
    return request.param


@pytest.mark.parametrize("name", NAMES)
def test_example_matches_numpy(name, codegen):
    ex = examples.ALL[name]()
    model = geode.compile(ex.graph, codegen=codegen)
    rng = np.random.default_rng(1)
    for n in BATCHES:
        feeds = ex.make_inputs(rng, n)
        got = model(**feeds)
        want = ex.numpy(**feeds)
        assert set(got) == set(want)
        for k in want:
            assert got[k].shape == want[k].shape, (name, n, k)
            assert got[k].dtype == want[k].dtype, (name, n, k)
            np.testing.assert_allclose(
                got[k], want[k], rtol=2e-4, atol=2e-5, err_msg=f"{name} N={n} {k}"
            )


def test_symbolic_batch_is_one_signature():
    ex = examples.layernorm(hidden=32)
    x = ex.graph.inputs[0]
    assert str(x.shape[0]) == "N"
    model = geode.compile(ex.graph)
    assert "N" in model.signature


def test_compile_leaves_user_graph_untouched():
    ex = examples.softmax(hidden=16)
    before = str(ex.graph)
    geode.compile(ex.graph)
    assert str(ex.graph) == before


def test_outputs_are_fresh_arrays():
    ex = examples.silu(hidden=8)
    model = geode.compile(ex.graph)
    feeds = ex.make_inputs(np.random.default_rng(0), 4)
    a = model(**feeds)["y"]
    b = model(**feeds)["y"]
    assert a is not b and not np.shares_memory(a, b)
    a[:] = 0
    np.testing.assert_allclose(b, ex.numpy(**feeds)["y"], rtol=1e-5, atol=1e-6)


def test_output_that_is_an_input_or_constant_is_copied():
    g = geode.Graph("passthrough")
    x = g.input("x", ["N"])
    c = g.constant(np.arange(3, dtype=np.float32), name="c")
    g.output(x, c, names=["x_out", "c_out"])
    model = geode.compile(g)
    xs = np.ones(5, np.float32)
    out = model(x=xs)
    assert not np.shares_memory(out["x_out"], xs)
    out["c_out"][:] = 42
    np.testing.assert_array_equal(model(x=xs)["c_out"], np.arange(3, dtype=np.float32))
