"""The rnn_layout pass (compiler/passes/rnn_layout.py): a one-direction LSTM fed by a
batch/sequence Transpose reads its input batch-first (layout 1); the graph computes the
same values (reference interpreter, two batch sizes; the compiled model against onnx's
ReferenceEvaluator) and, after simplify, holds no Transpose."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.compiler.frontend.onnx import import_model
from geode.compiler.interpret import run_reference
from geode.compiler.passes.rnn_layout import absorb_lstm_transposes
from geode.compiler.passes.simplify import simplify

HIDDEN, INPUT = 5, 3


def batch_first_lstm(direction: str, states: bool, outputs: int = 3, seed: int = 0):
    """PyTorch's export of a batch-first LSTM: Transpose, LSTM (layout 0), then Y
    squeezed and transposed back; ``states``: initial_h/initial_c as graph inputs."""
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(seed)
    shapes = {"W": (d, 4 * HIDDEN, INPUT), "R": (d, 4 * HIDDEN, HIDDEN), "B": (d, 8 * HIDDEN)}
    inits = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)
        for name, shape in shapes.items()
    ]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes1"))
    ins = ["xt", "W", "R", "B", "", "h0" if states else "", "c0" if states else ""]
    outs = ["Y", "Y_h", "Y_c"][:outputs]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ins, outs, hidden_size=HIDDEN, direction=direction),
        helper.make_node(
            "Squeeze" if d == 1 else "Identity", ["Y"] + (["axes1"] if d == 1 else []), ["ys"]
        ),
        helper.make_node("Transpose", ["ys"], ["y"], perm=[1, 0, 2] if d == 1 else [2, 0, 1, 3]),
    ]
    graph_ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", INPUT])]
    if states:
        graph_ins += [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [d, "batch", HIDDEN])
            for n in ("h0", "c0")
        ]
    graph_outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph_outs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs[1:]]
    g = helper.make_graph(nodes, "lstm", graph_ins, graph_outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(model, batch: int, seq: int = 4, seed: int = 1) -> dict[str, np.ndarray]:
    """Random inputs for ``batch_first_lstm``'s model."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        dims = [
            d.dim_value or {"batch": batch, "seq": seq}[d.dim_param]
            for d in v.type.tensor_type.shape.dim
        ]
        out[v.name] = rng.standard_normal(dims).astype(np.float32)
    return out


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("outputs", [1, 3])
def test_batch_first_lstm_reads_its_input_untransposed(direction, states, outputs) -> None:
    """Forward and reverse, with and without initial states, with Y alone or every
    output: the pass and simplify leave no Transpose, the same values."""
    model = batch_first_lstm(direction, states, outputs)
    g = import_model(model)
    before = g.copy()
    assert absorb_lstm_transposes(g)
    simplify(g)
    g.verify()
    ops = [n.op_type for n in g.nodes]
    assert "Transpose" not in ops
    (lstm,) = [n for n in g.nodes if n.op_type == "LSTM"]
    assert lstm.attrs["layout"] == 1 and lstm.input(0).name == "x"
    assert [v.name for v in g.outputs] == [v.name for v in before.outputs]
    for batch in (1, 3):
        f = feeds(model, batch)
        want = run_reference(before, f, check=True)
        got = run_reference(g, f, check=True)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)


def test_compiled_batch_first_lstm_matches_onnx() -> None:
    """Through geode.compile (the pass in the pipeline, the LSTM native): the values of
    onnx's reference evaluator, and no Transpose step left."""
    model = batch_first_lstm("forward", True)
    compiled = geode.compile(model, num_threads=2, progress=0)
    labels = [step.label for step in compiled.plan.steps]
    assert "LSTM" in labels and not any("Transpose" in label for label in labels)
    ref = ReferenceEvaluator(model)
    for batch in (1, 2):
        f = feeds(model, batch, seq=5)
        got = compiled.run(f)
        want = dict(zip([o.name for o in model.graph.output], ref.run(None, f)))
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


def test_other_lstms_are_left_as_they_are() -> None:
    """A bidirectional LSTM keeps its Transpose and layout 0."""
    g = import_model(batch_first_lstm("bidirectional", False))
    assert not absorb_lstm_transposes(g)
    assert "Transpose" in [n.op_type for n in g.nodes]
