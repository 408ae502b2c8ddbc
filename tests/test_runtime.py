"""Runtime integration: the session's VarManager, the activation memory plan, engines."""

import numpy as np
import pytest

import geode
from geode import ops
from geode.runtime.var_manager import VarManagerError


def chain_graph(n_ops=6, hidden=64):
    g = geode.Graph("chain")
    x = g.input("x", ["N", hidden])
    y = x
    for i in range(n_ops):
        y = ops.exp(ops.tanh(y)) if i % 2 else ops.sigmoid(y) * 1.5
    g.output(y, names=["y"])
    return g


def test_activation_buffers_are_reused_by_liveness():
    model = geode.compile(chain_graph(), fusion=False)  # every op its own step
    plan = model.plan
    assert len(plan.steps) >= 6
    assert len(plan.arena_slots) >= 4
    layout = plan.memory.layout({"N": 128})
    # a chain needs two live buffers at a time, whatever its length
    assert layout.total < layout.peak_naive
    assert layout.total <= 2 * 128 * 64 * 4 + 2 * 64
    x = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    fused = geode.compile(chain_graph())
    np.testing.assert_allclose(model(x=x)["y"], fused(x=x)["y"], rtol=1e-5, atol=1e-6)


def test_constants_deduplicated_across_models_of_a_session():
    w = np.arange(1024, dtype=np.float32)
    graphs = []
    for name in ("a", "b"):
        g = geode.Graph(name)
        x = g.input("x", [1024])
        g.output(x * g.constant(w.copy(), name="w"), names=["y"])
        graphs.append(g)
    with geode.Session() as sess:
        m1, m2 = sess.compile(graphs[0]), sess.compile(graphs[1])
        vm = sess.var_manager
        keys = [k for k in vm if k.name.endswith("/w")]
        assert len(keys) == 2
        assert vm.logic_address(keys[0]) == vm.logic_address(keys[1])
        assert vm.dedup_saved_bytes >= w.nbytes
        x = np.ones(1024, np.float32)
        np.testing.assert_array_equal(m1(x=x)["y"], m2(x=x)["y"])


def test_variables_live_in_the_session_and_are_shared():
    def graph(name):
        g = geode.Graph(name)
        x = g.input("x", [4])
        v = g.variable("scale", np.full(4, 2.0, np.float32))
        g.output(x * v, names=["y"])
        return g

    with geode.Session() as sess:
        m1, m2 = sess.compile(graph("a")), sess.compile(graph("b"))
        x = np.ones(4, np.float32)
        np.testing.assert_array_equal(m1(x=x)["y"], 2.0)
        key = sess.var_manager.lookup("scale")
        sess.var_manager.assign(key, np.full(4, 3.0, np.float32))
        np.testing.assert_array_equal(m1(x=x)["y"], 3.0)
        np.testing.assert_array_equal(m2(x=x)["y"], 3.0)


@pytest.mark.parametrize(
    "second",
    [np.full(4, 5.0, np.float32), np.full((2, 4), 2.0, np.float32)],
    ids=["value", "shape"],
)
def test_same_variable_name_with_another_initial_value_is_refused(second):
    """A second graph of the session declaring variable 'scale' with another initial value
    or shape is refused at compile time, naming the variable and the way out (it silently
    used the first graph's value, or failed at run time in a kernel); the first graph
    keeps working."""

    def graph(name, init):
        g = geode.Graph(name)
        x = g.input("x", [4])
        g.output(x * g.variable("scale", init), names=["y"])
        return g

    with geode.Session() as sess:
        m1 = sess.compile(graph("a", np.full(4, 2.0, np.float32)))
        with pytest.raises(VarManagerError, match="'scale'.*own geode.Session"):
            sess.compile(graph("b", second))
        np.testing.assert_array_equal(m1(x=np.ones(4, np.float32))["y"], 2.0)
    with geode.Session() as other:
        out = other.compile(graph("b", np.full(4, 5.0, np.float32)))(x=np.ones(4, np.float32))
        np.testing.assert_array_equal(out["y"], 5.0)


def test_engines_in_plan():
    g = geode.Graph("engines")
    x = g.input("x", ["N", 8])
    w = g.constant(np.eye(8, dtype=np.float32))
    s = ops.shape(x)
    y = ops.reshape(ops.matmul(x, w) * 2.0, s)
    g.output(y, ops.cast(s, to=1), names=["y", "s"])
    model = geode.compile(g)
    engines = {st.engine for st in model.plan.steps}
    assert engines == {"host", "aicpu", "aicore"}, model.explain()
    out = model(x=np.ones((3, 8), np.float32))
    np.testing.assert_array_equal(out["y"], 2.0)
    np.testing.assert_array_equal(out["s"], [3, 8])


def test_output_pool_reuses_memory_only_after_release():
    g = geode.Graph("big")
    x = g.input("x", ["N", 1024])
    g.output(x * 2.0, names=["y"])
    model = geode.compile(g)
    x = np.ones((512, 1024), np.float32)
    first = model(x=x)["y"]
    second = model(x=x)["y"]
    assert not np.shares_memory(first, second)  # first is still alive: never reused
    addr = second.ctypes.data
    del second
    third = model(x=x)["y"]
    assert third.ctypes.data == addr  # freed memory comes back from the pool
    np.testing.assert_array_equal(first, 2.0)
    np.testing.assert_array_equal(third, 2.0)
