"""ONNX text fields that are not valid UTF-8 (dim_param, value and node names) import
like the string attributes do: UTF-8 when valid, else Latin-1; never a TypeError."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import geode
from geode.compiler.frontend.onnx import import_model
from geode.compiler.frontend.onnx_text import decode_text, decoded
from geode.errors import GeodeError


def patched(model: onnx.ModelProto, old: bytes, new: bytes) -> bytes:
    """The model's bytes with ``old`` replaced by ``new`` (the same length, so every
    length prefix still holds): how a field gets bytes that are not valid UTF-8."""
    assert len(old) == len(new)
    raw = model.SerializeToString()
    assert old in raw
    return raw.replace(old, new)


def relu_model(dim: str = "DDDD", name: str = "x") -> onnx.ModelProto:
    x = helper.make_tensor_value_info(name, TensorProto.FLOAT, [dim, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [dim, 1])
    nodes = [
        helper.make_node("Relu", [name], ["y"], name="relu"),
        helper.make_node("ReduceSum", ["y", "axes"], ["z"], keepdims=1, name="sum"),
    ]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(nodes, "g", [x], [y, z], [axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def parsed(raw: bytes) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.ParseFromString(raw)
    return m


def test_decode_text() -> None:
    assert decode_text("already") == "already"
    assert decode_text("é".encode()) == "é"
    assert decode_text(b"\xff\xfeN") == "\xff\xfeN"
    assert decode_text(b"\xe9") != decode_text("é".encode() + b"x")


def test_invalid_utf8_dim_param_is_decoded_and_compiles() -> None:
    raw = patched(relu_model(), b"DDDD", b"D\xff\xfeD")
    proto = parsed(raw)
    dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert isinstance(dim.dim_param, bytes), "protobuf no longer hands such text back as bytes"
    for source in (proto, raw):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # compiled natively, no fallback warning
            model = geode.load(source)
        assert "D\xff\xfeD" in model.signature
        x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
        out = model(x=x)
        np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
        np.testing.assert_allclose(out["z"], np.maximum(x, 0).sum(1, keepdims=True), rtol=1e-6)
    # the dim is one symbol: input and outputs share it
    g = import_model(raw)
    assert g.inputs[0].shape[0] == g.outputs[0].shape[0] == g.outputs[1].shape[0]
    # the caller's proto is left as it was
    assert isinstance(proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param, bytes)


def test_invalid_utf8_names_are_decoded() -> None:
    raw = patched(relu_model(name="xxxx"), b"xxxx", b"x\xe9\xffx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = geode.load(raw)
    (name,) = model.input_names
    assert name == "x\xe9\xffx"
    x = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(model(**{name: x})["y"], np.maximum(x, 0))


def test_two_dims_that_differ_only_in_invalid_bytes_stay_distinct() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["AAAA", "BBBB"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["AAAA", "BBBB"])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [x], [y])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    raw = patched(m, b"AAAA", b"\xff\xfeAA")
    raw = raw.replace(b"BBBB", b"\xff\xfeBB")
    model = geode.load(raw)
    out = model(x=np.ones((2, 3), np.float32))["y"]
    assert out.shape == (2, 3) and (out == -1).all()


@pytest.mark.parametrize("old", [b"relu", b"Relu", b"DDDD"])
def test_invalid_utf8_anywhere_is_a_clean_result(old) -> None:
    """Garbage in the node name compiles; in the op type it is a clean GeodeError."""
    raw = patched(relu_model(), old, b"\xff" * len(old))
    try:
        model = geode.load(raw)
    except GeodeError:
        assert old == b"Relu"
        return
    assert old != b"Relu"
    x = np.ones((2, 4), np.float32)
    assert model(x=x)["y"].shape == (2, 4)


def test_a_clean_model_is_not_copied() -> None:
    m = relu_model()
    assert decoded(m) is m
