"""Conformance tests of the recurrent ops (geode/compiler/ops/rnn.py): RNN, GRU and LSTM
against ONNX's reference evaluator, plus the parts the evaluator ignores
(``sequence_lens``, custom activations, ``clip``) against explicit expectations."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import check_op

from geode.compiler.ops.rnn import recurrent
from geode.errors import VerifyError

RNG = np.random.default_rng(5)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _inputs(op, t=3, b=2, i=4, h=5, dirs=1, bias=True, layout=0):
    g = GATES[op]
    x = RNG.standard_normal((b, t, i) if layout else (t, b, i)).astype(np.float32)
    w = (0.5 * RNG.standard_normal((dirs, g * h, i))).astype(np.float32)
    r = (0.5 * RNG.standard_normal((dirs, g * h, h))).astype(np.float32)
    ins = [x, w, r]
    if bias:
        ins.append((0.1 * RNG.standard_normal((dirs, 2 * g * h))).astype(np.float32))
    return ins


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_directions(op, direction):
    dirs = 2 if direction == "bidirectional" else 1
    ins = _inputs(op, dirs=dirs)
    n_out = 3 if op == "LSTM" else 2
    check_op(op, ins, {"hidden_size": 5, "direction": direction}, n_outputs=n_out)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_batch_first_layout_with_initial_state(op):
    ins = _inputs(op, layout=1)
    h0 = RNG.standard_normal((2, 1, 5)).astype(np.float32)  # (batch, dirs, hidden)
    extra = [None, h0]
    if op == "LSTM":
        extra.append(RNG.standard_normal((2, 1, 5)).astype(np.float32))
    n_out = 3 if op == "LSTM" else 2
    check_op(op, ins + extra, {"hidden_size": 5, "layout": 1}, n_outputs=n_out)


def test_gru_linear_before_reset():
    check_op("GRU", _inputs("GRU"), {"hidden_size": 5, "linear_before_reset": 1}, n_outputs=2)


def test_lstm_peepholes():
    ins = _inputs("LSTM")
    p = (0.3 * RNG.standard_normal((1, 15))).astype(np.float32)
    check_op("LSTM", [*ins, None, None, None, p], {"hidden_size": 5}, n_outputs=3)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_sequence_lens_match_truncated_runs(op, direction):
    """A batch entry of length L gives what running its first L steps alone gives, and
    zeros after (the evaluator ignores sequence_lens)."""
    ins = _inputs(op, t=4, b=2)
    lens = np.array([4, 2], np.int32)
    attrs = {"hidden_size": 5, "direction": direction}
    y, y_h = recurrent(op, [*ins, lens], attrs)[:2]
    x = ins[0]
    short = recurrent(op, [x[:2, 1:2], *ins[1:]], attrs)
    np.testing.assert_allclose(y[:2, :, 1:2], short[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y_h[:, 1:2], short[1], rtol=1e-6, atol=1e-6)
    assert not y[2:, :, 1].any()
    full = recurrent(op, [x[:, 0:1], *ins[1:]], attrs)
    np.testing.assert_allclose(y[:, :, 0:1], full[0], rtol=1e-6, atol=1e-6)


def test_activations_and_clip():
    x, w, r = _inputs("RNN", bias=False)
    y = recurrent("RNN", [x, w, r], {"hidden_size": 5, "activations": ["Relu"], "clip": 0.5})[0]
    h = np.zeros((2, 5), np.float32)
    for t in range(3):
        h = np.maximum(np.clip(x[t] @ w[0].T + h @ r[0].T, -0.5, 0.5), 0)
        np.testing.assert_allclose(y[t, 0], h, rtol=1e-6, atol=1e-6)
    hs = recurrent(
        "RNN",
        [x, w, r],
        {
            "hidden_size": 5,
            "activations": ["HardSigmoid"],
            "activation_alpha": [0.3],
            "activation_beta": [0.4],
        },
    )[1]
    h = np.zeros((2, 5), np.float32)
    for t in range(3):
        h = np.clip(0.3 * (x[t] @ w[0].T + h @ r[0].T) + 0.4, 0, 1)
    np.testing.assert_allclose(hs[0], h, rtol=1e-6, atol=1e-6)


def test_unknown_direction_and_activation_are_verify_errors():
    import geode

    g = geode.Graph("rnn")
    x, w, r = (g.input(n, s) for n, s in (("x", [3, 2, 4]), ("w", [1, 5, 4]), ("r", [1, 5, 5])))
    with pytest.raises(VerifyError, match="direction"):
        g.op("RNN", x, w, r, hidden_size=5, direction="sideways")
    with pytest.raises(VerifyError, match="activation"):
        g.op("RNN", x, w, r, hidden_size=5, activations=["Swoosh"])
