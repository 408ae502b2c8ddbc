"""geode's state ops (compiler/ops/state.py), the builder's variable API and the
reference interpreter's order of writes."""

import warnings

import numpy as np
import pytest

import geode
from geode import ops
from geode.compiler.interpret import run_reference
from geode.compiler.ir import GEODE_DOMAIN, ValueKind
from geode.compiler.ops import registry, state
from geode.errors import DTypeError, GraphError, ShapeError


def test_ops_are_registered_in_the_geode_domain():
    for op in ("Assign", "AssignAdd", "AssignSub", "VarIsInitialized", "VarRef"):
        assert registry.has(op, GEODE_DOMAIN)
        assert not registry.has(op)  # not ONNX ops


def test_variable_takes_data_first_like_constant():
    g = geode.Graph("v")
    w = g.variable(np.ones((2, 3), np.float32), "w")
    assert w.kind is ValueKind.VARIABLE and w.name == "w" and w.shape == (2, 3)
    c = g.constant(np.ones(2, np.float32), "c")
    assert c.name == "c"
    i = g.variable([1, 2], "i", "int32")
    assert i.dtype == np.int32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.variable(np.zeros(1), "new_order")  # no warning
    with pytest.warns(DeprecationWarning, match=r"variable\(data, 'old'\)"):
        old = g.variable("old", np.zeros(3, np.float32))
    assert old.name == "old" and old.shape == (3,)
    s = g.variable("hello", "text")  # two strings: the new order (string data)
    assert s.name == "text"
    with pytest.raises(GraphError, match="needs a name"):
        g.variable(np.zeros(2))
    with pytest.raises(GraphError, match="shape= says"):
        g.variable(np.zeros(2), "bad", shape=[3])


def test_declared_variable_without_data():
    g = geode.Graph("d")
    d = g.variable(name="d", shape=[2, 3], dtype="float32")
    assert d.data is None and d.shape == (2, 3) and d.dtype == np.float32
    with pytest.raises(GraphError, match="give its shape= and dtype="):
        g.variable(name="e", shape=[2])
    with pytest.raises(GraphError, match="must be static"):
        g.variable(name="f", shape=["N"], dtype="float32")


def test_assign_builders_return_the_new_value():
    g = geode.Graph("a")
    x = g.input("x", [3])
    w = g.variable(np.zeros(3, np.float32), "w")
    a = g.assign(w, x)
    b = g.assign_add(w, 1)  # a scalar: a constant of w's dtype and shape
    assert b.producer.inputs[1].shape == (3,) and b.producer.inputs[1].dtype == np.float32
    with pytest.raises(GraphError, match="does not broadcast"):
        g.assign(w, [1.0, 2.0])
    for v, op in ((a, "Assign"), (b, "AssignAdd")):
        assert v.producer.op_type == op and v.producer.domain == GEODE_DOMAIN
        assert v.desc.dtype == np.float32 and v.shape == (3,)
    assert state.written_variable(a.producer) == "w" and state.is_write(a.producer)
    q = g.var_is_initialized(w)
    assert q.dtype == np.bool_ and q.shape == ()


def test_assign_checks_dtype_and_shape_naming_the_variable():
    g = geode.Graph("bad")
    w = g.variable(np.zeros((2, 3), np.float32), "w")
    x = g.input("x", [3, 2])
    with pytest.raises(
        ShapeError, match=r"variable 'w' is float32\[2, 3\].*'x' is float32\[3, 2\]"
    ):
        g.assign(w, x)
    with pytest.raises(DTypeError, match=r"variable 'w' is float32\[2, 3\].*float64\[2, 3\]"):
        g.assign(w, g.constant(np.zeros((2, 3))))
    n = g.input("n", ["N", 3])
    with pytest.raises(ShapeError, match="shapes must match"):  # not provably [2, 3]
        g.assign_sub(w, n)
    with pytest.raises(DTypeError, match="not a variable"):
        g.assign(x, x)
    with pytest.raises(DTypeError, match="not a variable"):
        g.assign(g.constant(np.zeros(2, np.float32)), np.zeros(2, np.float32))
    with pytest.raises(GraphError, match="must be a variable Value"):
        g.assign(np.zeros(2), x)


def test_reference_interpreter_follows_graph_order():
    g = geode.Graph("order")
    x = g.input("x", [2])
    w = g.variable(np.full(2, 10.0, np.float32), "w")
    before = w * 1.0
    g.assign(w, x)
    after = w + 0.0
    g.assign_add(w, x)
    last = w * 1.0
    g.output(before, after, last, names=["before", "after", "last"])
    out = run_reference(g, {"x": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out["before"], [10.0, 10.0])
    np.testing.assert_array_equal(out["after"], [1.0, 2.0])
    np.testing.assert_array_equal(out["last"], [2.0, 4.0])


def test_reference_var_is_initialized():
    g = geode.Graph("init")
    x = g.input("x", [2])
    d = g.variable(name="d", shape=[2], dtype="float32")
    w = g.variable(np.ones(2, np.float32), "w")
    q0 = g.var_is_initialized(d)
    g.assign(d, x)
    q1 = g.var_is_initialized(d)
    g.output(q0, q1, g.var_is_initialized(w), ops.identity(x), names=["q0", "q1", "qw", "y"])
    out = run_reference(g, {"x": np.zeros(2, np.float32)})
    assert [bool(out[k]) for k in ("q0", "q1", "qw")] == [False, True, True]
