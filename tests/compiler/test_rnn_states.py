"""The rnn_zero_states pass (compiler/passes/rnn_states.py): a recurrent op whose initial
state is provably zeros of the state's shape reads none; the graph computes the same
values (reference interpreter; the compiled model against onnx's ReferenceEvaluator),
and the steps that made the zeros are gone; states that are not such zeros stay."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.compiler.frontend.onnx import import_model
from geode.compiler.interpret import run_reference
from geode.compiler.passes.dce import dce
from geode.compiler.passes.rnn_states import drop_zero_states, is_zeros

HIDDEN, INPUT = 6, 4


def zero_state_model(op: str = "LSTM", value: float | None = None, state_dims=None):  # noqa: ANN001, ANN201
    """PyTorch's export of a recurrent op with no states: ``ConstantOfShape(Concat(1,
    Gather(Shape(x), 1), H))`` (``value``: its value attribute, None for the default 0)
    as initial_h (and initial_c); ``state_dims``: a constant of those dims instead."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    rng = np.random.default_rng(0)
    shapes = {"W": (1, gates * HIDDEN, INPUT), "R": (1, gates * HIDDEN, HIDDEN)}
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n)
        for n, s in shapes.items()
    ]
    inits += [
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([HIDDEN], np.int64), "hid"),
        numpy_helper.from_array(np.array(1, np.int64), "batch_axis"),
    ]
    nodes = []
    if state_dims is None:
        attrs = {} if value is None else {"value": helper.make_tensor("v", 1, [1], [value])}
        nodes += [
            helper.make_node("Shape", ["x"], ["xs"]),
            helper.make_node("Gather", ["xs", "batch_axis"], ["n"], axis=0),
            helper.make_node("Unsqueeze", ["n", "zero_axis"], ["n1"]),
            helper.make_node("Concat", ["one", "n1", "hid"], ["dims"], axis=0),
            helper.make_node("ConstantOfShape", ["dims"], ["h0"], **attrs),
        ]
        inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero_axis"))
    else:
        inits.append(numpy_helper.from_array(np.zeros(state_dims, np.float32), "h0"))
    ins = ["x", "W", "R", "", "", "h0"] + (["h0"] if op == "LSTM" else [])
    outs = ["y", "y_h"]
    nodes.append(helper.make_node(op, ins, outs, hidden_size=HIDDEN))
    graph_in = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", INPUT])]
    graph_out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs]
    g = helper.make_graph(nodes, "zero_states", graph_in, graph_out, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _x(batch: int = 3, seq: int = 5) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((seq, batch, INPUT)).astype(np.float32)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_zero_states_are_dropped(op) -> None:
    """The states go and, after dce, the steps that made them; the same values."""
    g = import_model(zero_state_model(op))
    before = g.copy()
    assert drop_zero_states(g)
    dce(g)
    g.verify()
    assert [n.op_type for n in g.nodes] == [op]
    (node,) = g.nodes
    assert all(v is None for v in node.inputs[5:])
    for batch in (1, 3):
        feeds = {"x": _x(batch)}
        for a, b in zip(run_reference(before, feeds), run_reference(g, feeds)):
            np.testing.assert_array_equal(a, b)


def test_compiled_lstm_with_zero_states_is_one_kernel() -> None:
    model = zero_state_model()
    compiled = geode.compile(model)
    assert [k.name for k in compiled.kernels] == [compiled.kernels[0].name]
    assert "rnn_zero_states: changed" in compiled.explain()
    x = _x(4)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = compiled(x=x)
    for name, w in zip(("y", "y_h"), want):
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "model",
    [
        zero_state_model(value=1.0),  # not zeros
        zero_state_model(value=-0.0),  # -0: an output's bits could show it
        zero_state_model(state_dims=(1, 1, HIDDEN)),  # zeros of batch 1, batch symbolic
    ],
    ids=["ones", "minus-zero", "other-shape"],
)
def test_states_that_stay(model) -> None:
    g = import_model(model)
    assert not drop_zero_states(g)


def test_zeros_through_views_and_constants() -> None:
    g = geode.Graph("zeros")
    z = g.constant(np.zeros((1, 2, 3), np.float32), name="z")
    view = g.op(
        "Unsqueeze", g.op("Squeeze", z, g.constant(np.array([0]))), g.constant(np.array([1]))
    )
    assert is_zeros(z) and is_zeros(view)
    assert not is_zeros(g.op("Add", z, g.constant(np.ones(3, np.float32))))
    assert not is_zeros(g.constant(np.zeros((0,), np.float32), name="empty"))
    assert not is_zeros(g.input("free", [2], np.float32))
