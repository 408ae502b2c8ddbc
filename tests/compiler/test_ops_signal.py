"""Conformance tests of the signal ops (geode/compiler/ops/signal.py): DFT, STFT and
MelWeightMatrix against ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import check_op

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("axis", [1, 2, -2])
def test_dft_real_input(onesided, axis):
    x = RNG.standard_normal((2, 6, 5, 1)).astype(np.float32)
    check_op(
        "DFT",
        [x, None, np.array(axis, np.int64)],
        {"onesided": onesided},
        const_inputs=[2],
        opset=20,
    )


def test_dft_complex_inverse_and_length():
    x = RNG.standard_normal((1, 8, 2)).astype(np.float64)
    check_op(
        "DFT",
        [x, np.array(5, np.int64), np.array(1, np.int64)],
        {"inverse": 1},
        const_inputs=[1, 2],
        opset=20,
    )
    check_op("DFT", [x, np.array(12, np.int64)], const_inputs=[1], opset=20)


def test_dft_inverse_onesided_is_irfft():
    spectrum = np.fft.rfft(RNG.standard_normal((1, 8)), axis=1)
    x = np.stack([spectrum.real, spectrum.imag], axis=-1).astype(np.float32)
    (y,) = check_op(
        "DFT",
        [x, None, np.array(1, np.int64)],
        {"inverse": 1, "onesided": 1},
        const_inputs=[2],
        opset=20,
        compare=False,
    )
    np.testing.assert_allclose(y[..., 0], np.fft.irfft(spectrum, n=8, axis=1), rtol=1e-5, atol=1e-5)


def test_dft_opset17_axis_attribute():
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    import geode

    node = helper.make_node("DFT", ["x"], ["y"], axis=2)
    model = helper.make_model(
        helper.make_graph(
            [node],
            "dft17",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 4, 1])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    x = RNG.standard_normal((1, 3, 4, 1)).astype(np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(geode.compile(model)(x=x)["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_with_window(onesided):
    x = RNG.standard_normal((2, 32, 1)).astype(np.float32)
    window = np.hanning(8).astype(np.float32)
    check_op("STFT", [x, np.array(4, np.int64), window], {"onesided": onesided}, const_inputs=[1])


def test_stft_frame_length_without_window():
    x = RNG.standard_normal((1, 20, 2)).astype(np.float32)
    check_op(
        "STFT",
        [x, np.array(3, np.int64), None, np.array(6, np.int64)],
        {"onesided": 0},
        const_inputs=[1, 3],
    )


def test_mel_weight_matrix():
    ins = [
        np.array(8, np.int64),
        np.array(64, np.int64),
        np.array(16000, np.int64),
        np.array(0.0, np.float32),
        np.array(8000.0, np.float32),
    ]
    check_op("MelWeightMatrix", ins, const_inputs=[0, 1, 2, 3, 4])
