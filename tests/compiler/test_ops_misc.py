"""Ops and op changes added for the ONNX conformance suite, in the existing op families:
Cast/CastLike into and out of the narrow ml_dtypes (float8, int4/int2, float4, bfloat16),
BitCast, signed BitShift (opset 28), CumProd, Compress, Det, TensorScatter,
SpaceToDepth's CRD mode, Range's stash_type, Split into uneven chunks, Unsqueeze with a
scalar axis; plus the CSE fix that kept scalars and 1-element vectors apart."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from opcheck import check_op

import geode
from geode.compiler import dtypes
from geode.errors import DTypeError

RNG = np.random.default_rng(9)
SPECIAL = np.array([0.0, 0.3, -1.7, 448.0, 1e4, -1e6, np.inf, -np.inf, np.nan, 3e-3], np.float32)


@pytest.mark.parametrize(
    "to", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"]
)
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_float8(to, saturate):
    onnx_type = dtypes.to_onnx(np.dtype(getattr(ml_dtypes, to)))
    check_op("Cast", [SPECIAL], {"to": onnx_type, "saturate": saturate})


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_float8e8m0(round_mode, saturate):
    x = np.array([1.0, 1.5, 3.0, 0.7, 2.0**127 * 1.9, 1e-40, np.nan, np.inf], np.float32)
    onnx_type = dtypes.to_onnx(np.dtype(ml_dtypes.float8_e8m0fnu))
    check_op(
        "Cast", [x], {"to": onnx_type, "saturate": saturate, "round_mode": round_mode}, opset=25
    )


@pytest.mark.parametrize("to", ["int4", "uint4", "int2", "uint2", "float4_e2m1fn", "bfloat16"])
def test_cast_to_and_from_narrow_types(to):
    d = np.dtype(getattr(ml_dtypes, to))
    x = np.array([0, 1, -1, 2, 3, -2, 5, 7], np.float32)
    (narrow,) = check_op("Cast", [x], {"to": dtypes.to_onnx(d)}, opset=25)
    check_op("Cast", [narrow], {"to": 1}, opset=25)
    check_op("CastLike", [narrow, np.zeros(1, np.float16)], opset=25)


def test_cast_to_an_unknown_type_names_the_node():
    g = geode.Graph("c")
    x = g.input("x", [2])
    with pytest.raises(DTypeError, match="Cast"):
        g.op("Cast", x, to=8000)


@pytest.mark.parametrize(
    "src,dst",
    [
        (np.float32, np.int32),
        (np.int16, np.float16),
        (np.uint8, np.int8),
        (np.float64, np.uint64),
        (np.int8, np.bool_),
    ],
)
def test_bitcast(src, dst):
    x = (
        RNG.integers(0, 2, (2, 3)).astype(src)
        if dst == np.bool_
        else RNG.standard_normal((2, 3)).astype(src)
    )
    check_op("BitCast", [x], {"to": dtypes.to_onnx(dst)}, opset=26)
    check_op(
        "BitCast",
        [np.array(1.5, src) if src != np.int8 else np.array(1, src)],
        {"to": dtypes.to_onnx(dst)},
        opset=26,
    )


def test_bitcast_needs_equal_widths():
    g = geode.Graph("b")
    x = g.input("x", [2], "float32")
    with pytest.raises(DTypeError, match="bit widths"):
        g.op("BitCast", x, to=dtypes.to_onnx(np.float64))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_signed_and_out_of_range(dtype, direction):
    bits = np.dtype(dtype).itemsize * 8
    x = (
        np.array([1, -5, 100, -128, 7, 3], dtype)
        if np.dtype(dtype).kind == "i"
        else np.array([1, 5, 100, 128, 7, 3], dtype)
    )
    y = np.array([0, 1, 3, bits - 1, bits, bits + 3], dtype)
    check_op("BitShift", [x, y], {"direction": direction}, opset=28)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod(exclusive, reverse):
    x = RNG.uniform(0.5, 1.5, (3, 4)).astype(np.float32)
    check_op(
        "CumProd",
        [x, np.array(1, np.int64)],
        {"exclusive": exclusive, "reverse": reverse},
        const_inputs=[1],
        opset=26,
    )


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    cond = (
        np.array([True, False, True], bool) if axis in (None, 0) else np.array([0, 1, 1, 0], bool)
    )
    attrs = {} if axis is None else {"axis": axis}
    check_op("Compress", [x, cond], attrs)
    check_op("Compress", [x, cond], attrs, const_inputs=[1])


def test_det_batched():
    check_op("Det", [RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)])
    check_op("Det", [RNG.standard_normal((4, 4))])


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode):
    cache = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    update = RNG.standard_normal((2, 3, 2, 4)).astype(np.float32)
    idx = np.array([1, 3] if mode == "linear" else [4, 0], np.int64)
    check_op("TensorScatter", [cache, update, idx], {"mode": mode}, opset=24)
    check_op("TensorScatter", [cache, update], {"axis": 2}, opset=24)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_modes(mode):
    check_op(
        "SpaceToDepth",
        [RNG.standard_normal((1, 3, 4, 6)).astype(np.float32)],
        {"blocksize": 2, "mode": mode},
        opset=28,
    )


def test_range_float16_stash_type():
    ins = [np.array(1.0, np.float16), np.array(300.0, np.float16), np.array(0.7, np.float16)]
    check_op("Range", ins, {"stash_type": 1}, const_inputs=[0, 1, 2], opset=27)


def test_celu_float16():
    check_op("Celu", [RNG.standard_normal((5,)).astype(np.float16)], {"alpha": 0.5})


def test_split_into_more_outputs_than_chunks():
    # static shapes: the symbolic chunk sizes assume the ceil(d / n) chunks fit (d >= (n-1) * chunk)
    outs = check_op(
        "Split",
        [np.arange(5, dtype=np.float32)],
        {"num_outputs": 4},
        n_outputs=4,
        opset=18,
        symbolic=False,
    )
    assert [o.shape[0] for o in outs] == [2, 2, 1, 0]


def test_unsqueeze_scalar_axis():
    g = geode.Graph("u")
    x = g.input("x", ["N", 3])
    y = g.op("Unsqueeze", x, g.constant(np.int64(-1)))
    assert y.shape[2] == 1 and len(y.shape) == 3


def test_cse_keeps_a_scalar_and_a_one_element_vector_apart():
    g = geode.Graph("cse")
    x = g.input("x", [2])
    a = g.op("Add", x, g.constant(np.array(1.0, np.float32)))
    b = g.op("Concat", x, g.constant(np.array([1.0], np.float32)), axis=0)
    g.output(a, b, names=["a", "b"])
    out = geode.compile(g)(x=np.array([1.0, 2.0], np.float32))
    assert out["a"].shape == (2,) and out["b"].shape == (3,)
