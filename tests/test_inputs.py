"""Bad inputs to a compiled model raise GeodeError subclasses naming what and where."""

import numpy as np
import pytest

import geode
import geode.compiler.shapes
from geode import ops
from geode.errors import (
    GeodeError,
    InputDTypeError,
    InputError,
    InputShapeError,
    MissingInputError,
    UnexpectedInputError,
)


@pytest.fixture(scope="module")
def model():
    g = geode.Graph("two_inputs")
    x = g.input("x", ["N", 4], "float32")
    y = g.input("y", ["N", 4], "float32")
    z = g.input("z", [2, "K"], "int64")
    g.output(x + y, ops.cast(z, to=1), names=["s", "zc"])
    return geode.compile(g)


def feeds(n=3, m=None, k=5):
    return {
        "x": np.zeros((n, 4), np.float32),
        "y": np.zeros((n if m is None else m, 4), np.float32),
        "z": np.zeros((2, k), np.int64),
    }


def test_good_inputs_run(model):
    out = model(**feeds())
    assert out["s"].shape == (3, 4) and out["zc"].dtype == np.float32


def test_missing_input(model):
    f = feeds()
    del f["y"]
    with pytest.raises(MissingInputError, match=r"missing input\(s\) y: float32\[N, 4\]"):
        model(**f)


def test_extra_input(model):
    with pytest.raises(UnexpectedInputError, match=r"unexpected input\(s\) \['w'\]"):
        model(**feeds(), w=np.zeros(1))


def test_wrong_dtype(model):
    f = feeds()
    f["x"] = f["x"].astype(np.float64)
    with pytest.raises(InputDTypeError, match=r"input 'x': dtype float64, expected float32"):
        model(**f)


def test_wrong_rank(model):
    f = feeds()
    f["z"] = np.zeros((2, 5, 1), np.int64)
    with pytest.raises(InputShapeError, match=r"input 'z': rank 3 .* expected rank 2"):
        model(**f)


def test_static_dim_contradicts(model):
    f = feeds()
    f["x"] = np.zeros((3, 5), np.float32)
    with pytest.raises(InputShapeError, match=r"input 'x': dim 1 is 5, expected 4"):
        model(**f)


def test_symbol_uses_disagree(model):
    with pytest.raises(
        InputShapeError,
        match=r"input 'y': dim 0 is 7, but symbol N is already 3 from input 'x' dim 0",
    ):
        model(**feeds(n=3, m=7))


def test_not_an_array(model):
    f = feeds()
    f["x"] = "hello"
    with pytest.raises(InputError, match=r"input 'x': expected a numpy array, got str"):
        model(**f)


def test_errors_are_geode_errors(model):
    for bad in (dict(feeds(), w=1), {"x": 1}):
        with pytest.raises(GeodeError):
            model(**bad)


def test_expression_dim_checked():
    n = geode.compiler.shapes.sym("N")
    g = geode.Graph("expr_dim")
    a = g.input("a", ["N"])
    b = g.input("b", [2 * n])
    g.output(ops.concat(a, a, axis=0) + b, names=["y"])
    model = geode.compile(g)
    out = model(a=np.ones(3, np.float32), b=np.ones(6, np.float32))["y"]
    assert out.shape == (6,)
    with pytest.raises(InputShapeError, match=r"input 'b': dim 0 is 5, expected 2\*N = 6"):
        model(a=np.ones(3, np.float32), b=np.ones(5, np.float32))
