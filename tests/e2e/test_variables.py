"""Variables through the whole pipeline: graphs that write them (an SGD loop), the order
of reads and writes, models of one session sharing them, format acceleration,
VarIsInitialized, checkpoints, and an ONNX model using geode's Assign."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import geode
from geode import ops
from geode.compiler.frontend.onnx import import_model
from geode.compiler.frontend.onnx_export import to_onnx
from geode.errors import CheckpointError, GeodeError, ShapeError
from geode.runtime import var_format
from geode.runtime.var_manager import VarManagerError

N, D, LR = 16, 4, 0.05
RNG = np.random.default_rng(7)
X = RNG.standard_normal((N, D)).astype(np.float32)
TRUE_W = RNG.standard_normal((D, 1)).astype(np.float32)
Y = (X @ TRUE_W + 0.01 * RNG.standard_normal((N, 1))).astype(np.float32)


def sgd_graph() -> geode.Graph:
    """Linear regression trained by SGD inside the graph: ``w <- w - lr * grad``."""
    g = geode.Graph("sgd")
    x = g.input("x", ["N", D])
    y = g.input("y", ["N", 1])
    w = g.variable(np.zeros((D, 1), np.float32), "w")
    err = ops.matmul(x, w) - y
    loss = ops.reduce_mean(err * err, axes=[0, 1], keepdims=0)
    grad = ops.matmul(ops.transpose(x, perm=[1, 0]), err) * (2.0 / N)
    g.assign(w, w - grad * LR)
    g.output(loss, names=["loss"])
    return g


def predict_graph() -> geode.Graph:
    g = geode.Graph("predict")
    x = g.input("x", ["N", D])
    g.output(ops.matmul(x, g.variable(np.zeros((D, 1), np.float32), "w")), names=["p"])
    return g


def numpy_sgd(w: np.ndarray) -> tuple[np.ndarray, float]:
    err = X @ w - Y
    return w - LR * (X.T @ err * (2.0 / N)), float(np.mean(err * err))


@pytest.mark.parametrize("options", [{}, {"codegen": False}], ids=["native", "reference"])
def test_sgd_loop_matches_numpy_and_other_models_see_the_update(options):
    with geode.Session(**options) as sess:
        train, predict = sess.compile(sgd_graph()), sess.compile(predict_graph())
        w = np.zeros((D, 1), np.float32)
        losses = []
        for _ in range(10):
            loss = float(train(x=X, y=Y)["loss"])
            w, want_loss = numpy_sgd(w)
            losses.append(loss)
            np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
            np.testing.assert_allclose(sess.get_variable("w"), w, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(predict(x=X)["p"], X @ w, rtol=1e-5, atol=1e-6)
        assert losses[-1] < losses[0] / 2  # it learns
        assert "variable writes (1)" in train.explain()


def test_reads_before_a_write_see_the_old_value_after_it_the_new():
    g = geode.Graph("order")
    x = g.input("x", [3])
    w = g.variable(np.full(3, 10.0, np.float32), "w")
    before = w * 1.0
    g.assign_add(w, x)
    after = w * 1.0
    g.assign_add(w, x)
    g.output(before, after, names=["before", "after"])
    with geode.Session() as sess:
        model = sess.compile(g)
        one = np.ones(3, np.float32)
        for k in range(3):  # the state carries over from run to run
            out = model(x=one)
            np.testing.assert_array_equal(out["before"], 10.0 + 2 * k)
            np.testing.assert_array_equal(out["after"], 11.0 + 2 * k)
        np.testing.assert_array_equal(sess.get_variable("w"), 16.0)


def test_commits_read_their_values_first_so_a_swap_swaps():
    g = geode.Graph("swap")
    x = g.input("x", [2])
    a = g.variable(np.array([1.0, 2.0], np.float32), "a")
    b = g.variable(np.array([3.0, 4.0], np.float32), "b")
    g.assign(a, b)
    g.assign(b, a)  # built after: reads a's new value, which is b's old one...
    g.output(ops.identity(x), names=["y"])
    h = geode.Graph("swap2")
    x = h.input("x", [2])
    a2 = h.variable(np.array([1.0, 2.0], np.float32), "a")
    b2 = h.variable(np.array([3.0, 4.0], np.float32), "b")
    old_a = ops.identity(a2)
    h.assign(a2, b2)
    h.assign(b2, old_a)  # ...so a real swap keeps a's old value first
    h.output(ops.identity(x), names=["y"])
    with geode.Session() as sess:
        sess.compile(g)(x=np.zeros(2, np.float32))
        np.testing.assert_array_equal(sess.get_variable("a"), [3.0, 4.0])
        np.testing.assert_array_equal(sess.get_variable("b"), [3.0, 4.0])
    with geode.Session() as sess:
        sess.compile(h)(x=np.zeros(2, np.float32))
        np.testing.assert_array_equal(sess.get_variable("a"), [3.0, 4.0])
        np.testing.assert_array_equal(sess.get_variable("b"), [1.0, 2.0])


def test_assign_mismatch_errors_name_the_variable():
    g = geode.Graph("bad")
    w = g.variable(np.zeros((2, 2), np.float32), "w")
    with pytest.raises(ShapeError, match=r"'w' is float32\[2, 2\].*float32\[4\]"):
        g.assign(w, g.input("x", [4]))
    with pytest.raises(GeodeError, match="'w'.*int32"):
        g.assign(w, g.input("i", [2, 2], "int32"))


def test_session_get_and_set_variable():
    with geode.Session() as sess:
        model = sess.compile(predict_graph())
        sess.set_variable("w", np.ones((D, 1), np.float32))
        np.testing.assert_allclose(model(x=X)["p"], X.sum(axis=1, keepdims=True), rtol=1e-5)
        assert sess.variable_names() == ["w"]
        with pytest.raises(VarManagerError, match="no variable 'nope'"):
            sess.get_variable("nope")
        with pytest.raises(VarManagerError, match=r"expected shape \(4, 1\)"):
            sess.set_variable("w", np.ones(4, np.float32))


# -- format acceleration ------------------------------------------------------------------
def _linear_graph(w0: np.ndarray) -> geode.Graph:
    """PyTorch's Linear as exported: ``x @ W^T + b``, W a variable [out, in]."""
    g = geode.Graph("linear")
    x = g.input("x", ["N", w0.shape[1]])
    w = g.variable(w0, "W")
    g.output(ops.matmul(x, ops.transpose(w, perm=[1, 0])) + 1.0, names=["y"])
    return g


def _transposes(model) -> int:
    return sum(n.op_type == "Transpose" for st in model.kernels for n in st.ops)


def test_format_acceleration_converts_a_weight_once():
    w0 = RNG.standard_normal((6, D)).astype(np.float32)
    with geode.Session() as sess:
        start = var_format.conversions()
        model = sess.compile(_linear_graph(w0))
        assert var_format.conversions() == start + 1  # the initial value, at compile time
        info = sess.var_manager.info("W")
        assert info.key.format == "TRANSPOSED(1,0)" and info.shape == (D, 6)
        assert _transposes(model) == 0  # no per-call Transpose
        for _ in range(5):
            np.testing.assert_allclose(model(x=X)["y"], X @ w0.T + 1.0, rtol=1e-5, atol=1e-5)
        assert var_format.conversions() == start + 1  # none per call
        np.testing.assert_array_equal(sess.get_variable("W"), w0)  # the user's layout
        assert var_format.conversions() == start + 2  # read out: converted back once
        # a write from another model of the session is converted on its way in
        g = geode.Graph("update")
        new = g.input("new", [6, D])
        g.output(g.assign(g.variable(w0, "W"), new), names=["out"])
        update = sess.compile(g)
        w1 = w0 * 3.0
        update(new=w1)
        assert var_format.conversions() == start + 4  # compile-time initial value, commit
        np.testing.assert_allclose(model(x=X)["y"], X @ w1.T + 1.0, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(sess.get_variable("W"), w1)
        # a graph that reads W plainly reads it converted back
        plain = geode.Graph("plain")
        plain.output(plain.variable(w0, "W") * 1.0, names=["w"])
        np.testing.assert_array_equal(sess.compile(plain)()["w"], w1)


# -- VarIsInitialized and declared variables ------------------------------------------------
def test_var_is_initialized_is_asked_at_run_time_for_a_declared_variable():
    q = geode.Graph("query")
    d = q.variable(name="d", shape=[2], dtype="float32")
    q.output(q.var_is_initialized(d), names=["ok"])
    r = geode.Graph("read")
    r.output(r.variable(name="d", shape=[2], dtype="float32") * 2.0, names=["y"])
    s = geode.Graph("set")
    v = s.input("v", [2])
    s.output(s.assign(s.variable(name="d", shape=[2], dtype="float32"), v), names=["out"])
    with geode.Session() as sess:
        query, read, setter = sess.compile(q), sess.compile(r), sess.compile(s)
        assert not bool(query()["ok"])
        with pytest.raises(VarManagerError, match="'d' is read before it has a value"):
            read()
        setter(v=np.array([1.0, 2.0], np.float32))
        assert bool(query()["ok"])
        np.testing.assert_array_equal(read()["y"], [2.0, 4.0])
        # compiled now, the answer is known: a constant
        assert not sess.compile(q).plan.steps


# -- checkpoints ---------------------------------------------------------------------------
def test_variables_survive_save_and_restore(tmp_path):
    path = tmp_path / "w.ckpt"
    with geode.Session() as sess:
        train = sess.compile(sgd_graph())
        for _ in range(3):
            train(x=X, y=Y)
        saved = sess.get_variable("w")
        assert sess.save_variables(path) == ["w"]
        train(x=X, y=Y)
        assert not np.array_equal(sess.get_variable("w"), saved)
        assert sess.restore_variables(path) == ["w"]
        np.testing.assert_array_equal(sess.get_variable("w"), saved)
    with geode.Session() as fresh:  # restored before any graph names w: the graph keeps it
        fresh.restore_variables(str(path))
        predict = fresh.compile(predict_graph())
        np.testing.assert_allclose(predict(x=X)["p"], X @ saved, rtol=1e-6)
    w0 = RNG.standard_normal((6, D)).astype(np.float32)
    with geode.Session() as plain:  # a plain checkpoint into a transposed variable
        g = geode.Graph("wplain")
        g.output(g.variable(w0, "W") * 1.0, names=["w"])
        plain.compile(g)
        plain.save_variables(tmp_path / "plain.ckpt")
    with geode.Session() as accel:
        model = accel.compile(_linear_graph(np.zeros_like(w0)))
        accel.restore_variables(tmp_path / "plain.ckpt")
        np.testing.assert_array_equal(accel.get_variable("W"), w0)
        np.testing.assert_allclose(model(x=X)["y"], X @ w0.T + 1.0, rtol=1e-5, atol=1e-5)


def test_bad_checkpoints_are_refused_and_change_nothing(tmp_path):
    path = tmp_path / "w.ckpt"
    with geode.Session() as sess:
        sess.compile(sgd_graph())(x=X, y=Y)
        sess.save_variables(path)
        good = sess.get_variable("w")
        blob = path.read_bytes()
        flipped = bytearray(blob)
        flipped[-32 - 64 + 3] ^= 0x01  # inside w's data (16 bytes, padded to 64)
        (tmp_path / "flipped.ckpt").write_bytes(bytes(flipped))
        (tmp_path / "short.ckpt").write_bytes(blob[:-7])
        sess.set_variable("w", np.zeros((D, 1), np.float32))
        with pytest.raises(
            CheckpointError, match=r"altered: checksum mismatch in the data of \['w'\]"
        ):
            sess.restore_variables(tmp_path / "flipped.ckpt")
        with pytest.raises(CheckpointError, match="truncated"):
            sess.restore_variables(tmp_path / "short.ckpt")
        with pytest.raises(CheckpointError, match="is a directory"):
            sess.save_variables(tmp_path)
        np.testing.assert_array_equal(sess.get_variable("w"), 0.0)
    with geode.Session() as other:  # the same name, another description
        g = geode.Graph("other")
        g.output(g.variable(np.zeros((D, 2), np.float32), "w") * 1.0, names=["y"])
        other.compile(g)
        with pytest.raises(CheckpointError, match=r"'w' differs.*float32\[4, 1\].*float32\[4, 2\]"):
            other.restore_variables(path)
        np.testing.assert_array_equal(other.get_variable("w"), 0.0)
    assert good.shape == (D, 1)


# -- ONNX ----------------------------------------------------------------------------------
def _counter_model() -> onnx.ModelProto:
    """An ONNX model whose geode-domain AssignAdd counts its runs in an initializer."""
    nodes = [
        helper.make_node("AssignAdd", ["count", "x"], ["count_new"], domain="geode"),
        helper.make_node("Mul", ["count_new", "x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "counter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.zeros(2, np.float32), "count")],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("geode", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_an_onnx_model_with_geodes_assign_imports_and_runs():
    g = import_model(_counter_model())
    assert g.values["count"].kind.value == "variable"
    with geode.Session() as sess:
        model = geode.compile(g, session=sess)
        two = np.full(2, 2.0, np.float32)
        for k in range(1, 4):
            np.testing.assert_array_equal(model(x=two)["y"], 2.0 * k * 2.0)
        np.testing.assert_array_equal(sess.get_variable("count"), 6.0)
        # exported and imported again: still a variable and its write
        again = import_model(to_onnx(g))
        assert again.values["count"].kind.value == "variable"
        assert [n.op_type for n in again.nodes] == ["AssignAdd", "Mul"]


def test_an_onnx_assign_of_a_graph_input_is_refused():
    model = _counter_model()
    model.graph.node[0].input[0] = "x"
    with pytest.raises(GeodeError, match="not a variable"):
        import_model(model)


def test_writes_need_the_prepare_pass():
    g = geode.Graph("nopass")
    x = g.input("x", [2])
    g.output(g.assign(g.variable(np.zeros(2, np.float32), "w"), x), names=["y"])
    with (
        geode.Session(disabled_passes=("variable_prepare",)) as sess,
        pytest.raises(GeodeError, match="variable_prepare pass"),
    ):
        sess.compile(g)
