"""Conformance tests of the quantization ops (geode/compiler/ops/quant.py) against ONNX.

Every case goes through ``opcheck.check_op``: geode's reference kernel against
``onnx.reference.ReferenceEvaluator`` and the inferred (symbolic) shape and dtype
against the kernel's output.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from opcheck import check_op

import geode
from geode.errors import DTypeError, GeodeError, ShapeError, VerifyError

RNG = np.random.default_rng(7)


def _x(shape, lo=-4.0, hi=4.0, dtype=np.float32):
    return RNG.uniform(lo, hi, shape).astype(dtype)


# -- QuantizeLinear ------------------------------------------------------------------------------
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_tensor(zp_dtype):
    x = _x((3, 5), -300, 300)
    check_op("QuantizeLinear", [x, np.float32(2.5), np.array(3, zp_dtype)], const_inputs=[1, 2])


def test_quantize_default_uint8_and_ties_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, 300.0, -3.0], np.float32)
    (y,) = check_op("QuantizeLinear", [x, np.float32(1.0)], const_inputs=[1])
    assert y.dtype == np.uint8 and list(y) == [0, 2, 2, 0, 255, 0]


def test_quantize_per_axis_and_blocked():
    x = _x((2, 3, 4), -20, 20)
    check_op(
        "QuantizeLinear",
        [x, np.array([0.5, 1.0, 2.0], np.float32), np.array([1, 2, 3], np.int8)],
        {"axis": 1},
        const_inputs=[1, 2],
    )
    scale = RNG.uniform(0.5, 2, (2, 3, 2)).astype(np.float32)
    zp = RNG.integers(0, 10, (2, 3, 2)).astype(np.uint8)
    check_op("QuantizeLinear", [x, scale, zp], {"axis": 2, "block_size": 2}, const_inputs=[1, 2])


def test_quantize_output_dtype_attribute_and_float16_input():
    x = _x((4, 4), dtype=np.float16)
    check_op("QuantizeLinear", [x, np.float16(0.25)], {"output_dtype": 3}, const_inputs=[1])


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_quantize_float8(name, saturate):
    x = np.array([0.0, 1.0, -3.5, 1e5, -1e6, np.inf, np.nan], np.float32)
    zp = np.zeros((), getattr(ml_dtypes, name))
    check_op(
        "QuantizeLinear", [x, np.float32(2.0), zp], {"saturate": saturate}, const_inputs=[1, 2]
    )


@pytest.mark.parametrize("name", ["int4", "uint4"])
def test_quantize_int4(name):
    x = _x((3, 4), -20, 20)
    zp = np.array(1, getattr(ml_dtypes, name))
    check_op("QuantizeLinear", [x, np.float32(1.5), zp], const_inputs=[1, 2])


def test_quantize_errors_name_the_node():
    g = geode.Graph("q")
    x = g.input("x", [2, 3])
    with pytest.raises(VerifyError, match="output_dtype"):
        g.op(
            "QuantizeLinear", x, g.constant(np.float32(1)), g.constant(np.uint8(0)), output_dtype=3
        )
    with pytest.raises(DTypeError, match="cannot quantize"):
        g.op("QuantizeLinear", x, g.constant(np.float32(1)), output_dtype=1)
    with pytest.raises(ShapeError, match="1-D"):
        g.op("QuantizeLinear", x, g.constant(np.ones((2, 3), np.float32)))


# -- DequantizeLinear ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16])
def test_dequantize_per_tensor(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (3, 5), endpoint=True).astype(dtype)
    check_op("DequantizeLinear", [x, np.float32(0.5), np.array(4, dtype)], const_inputs=[1, 2])


def test_dequantize_int32_per_axis_blocked():
    x = RNG.integers(-1000, 1000, (2, 3, 4)).astype(np.int32)
    check_op(
        "DequantizeLinear",
        [x, np.array([0.5, 1.0, 2.0], np.float32)],
        {"axis": 1},
        const_inputs=[1],
    )
    x8 = RNG.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    scale = RNG.uniform(0.5, 2, (2, 3, 2)).astype(np.float32)
    zp = RNG.integers(0, 10, (2, 3, 2)).astype(np.uint8)
    check_op(
        "DequantizeLinear", [x8, scale, zp], {"axis": -1, "block_size": 2}, const_inputs=[1, 2]
    )


def test_dequantize_float8_and_int4():
    x = np.array([0.0, 1.5, -448.0, 3.0], ml_dtypes.float8_e4m3fn)
    check_op("DequantizeLinear", [x, np.float32(2.0)], const_inputs=[1])
    x4 = np.array([[-8, 7], [1, -1]], ml_dtypes.int4)
    check_op(
        "DequantizeLinear", [x4, np.float32(0.5), np.array(2, ml_dtypes.int4)], const_inputs=[1, 2]
    )


def test_dequantize_output_dtype():
    x = RNG.integers(0, 255, (4,)).astype(np.uint8)
    check_op(
        "DequantizeLinear", [x, np.float32(0.25)], {"output_dtype": 10}, const_inputs=[1], opset=23
    )


def test_dequantize_zero_point_dtype_must_match():
    g = geode.Graph("dq")
    x = g.input("x", [4], "uint8")
    with pytest.raises(DTypeError, match="x_zero_point"):
        g.op("DequantizeLinear", x, g.constant(np.float32(1)), g.constant(np.int8(0)))


# -- DynamicQuantizeLinear ---------------------------------------------------------------------
@pytest.mark.parametrize("lo,hi", [(-3.0, 5.0), (1.0, 9.0), (-7.0, -2.0), (0.0, 0.0)])
def test_dynamic_quantize(lo, hi):
    x = _x((3, 4), lo, hi) if lo != hi else np.zeros((3, 4), np.float32)
    check_op("DynamicQuantizeLinear", [x], n_outputs=3)


# -- integer matmul / conv --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_matmul_integer(dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (2, 3, 4), endpoint=True).astype(dtype)
    b = RNG.integers(info.min, info.max, (4, 5), endpoint=True).astype(dtype)
    check_op("MatMulInteger", [a, b, np.array(3, dtype), np.array(5, dtype)], const_inputs=[2, 3])
    check_op("MatMulInteger", [a, b])


def test_matmul_integer_per_row_and_column_zero_points():
    a = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    b = RNG.integers(0, 255, (4, 2)).astype(np.uint8)
    za = np.array([1, 2, 3], np.uint8)
    zb = np.array([4, 5], np.uint8)
    (got,) = check_op("MatMulInteger", [a, b, za, zb], const_inputs=[2, 3], compare=False)
    want = (a.astype(np.int32) - za[:, None]) @ (b.astype(np.int32) - zb[None, :])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape_a,shape_b", [((2, 4), (4, 3)), ((2, 2, 4), (2, 4, 3))])
def test_qlinear_matmul(dtype, shape_a, shape_b):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, shape_a, endpoint=True).astype(dtype)
    b = RNG.integers(info.min, info.max, shape_b, endpoint=True).astype(dtype)
    ins = [
        a,
        np.float32(0.05),
        np.array(2, dtype),
        b,
        np.float32(0.02),
        np.array(1, dtype),
        np.float32(0.3),
        np.array(5, dtype),
    ]
    check_op("QLinearMatMul", ins, const_inputs=[1, 2, 4, 5, 6, 7])


def test_conv_integer_with_pads_and_zero_points():
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    check_op(
        "ConvInteger",
        [x, w, np.array(7, np.uint8), np.array(9, np.uint8)],
        {"pads": [1, 1, 1, 1], "strides": [2, 1]},
        const_inputs=[1, 2, 3],
    )


def test_qlinear_conv_with_bias_and_per_channel_scale():
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    ins = [
        x,
        np.float32(0.02),
        np.array(3, np.uint8),
        w,
        np.array([0.01, 0.02, 0.03], np.float32),
        np.array(2, np.uint8),
        np.float32(0.5),
        np.array(10, np.uint8),
        RNG.integers(-100, 100, (3,)).astype(np.int32),
    ]
    check_op("QLinearConv", ins, {"pads": [1, 1, 1, 1]}, const_inputs=[1, 2, 3, 4, 5, 6, 7, 8])


def test_quantized_model_through_the_pipeline():
    """Quantize -> QLinearMatMul -> Dequantize compiles and matches the reference."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    w = RNG.integers(0, 255, (4, 3)).astype(np.uint8)
    inits = [
        numpy_helper.from_array(np.array(v, dtype=d), n)
        for n, v, d in (
            ("s", 0.05, np.float32),
            ("z", 128, np.uint8),
            ("ws", 0.02, np.float32),
            ("wz", 120, np.uint8),
            ("ys", 0.1, np.float32),
            ("yz", 100, np.uint8),
        )
    ]
    inits.append(numpy_helper.from_array(w, "w"))
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("QLinearMatMul", ["xq", "s", "z", "w", "ws", "wz", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qmm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    compiled = geode.compile(model)
    for n in (1, 5):
        x = _x((n, 4))
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
        np.testing.assert_allclose(compiled(x=x)["y"], want, rtol=1e-6, atol=1e-6)


def test_blocked_scale_that_does_not_cover_the_input_is_an_error():
    from geode.compiler.ops.quant import quant_param

    with pytest.raises(GeodeError, match="blocked"):
        quant_param(np.ones((2, 1), np.float32), (2, 6), 1, 2)
