"""The key-tiled (online) softmax's decision on compiled attention (``codegen/epilogues.py:
_online``): every non-causal fused attention says in ``explain()`` whether its epilogue is
the key-tiled form (``compiler/fusion/online.py``) and whether that would pay
(``profit.py: online_plan``), or why not. No key-tiled kernel is built yet (issue 38): the
attention stays one dense step on row panels and its results stay the reference's."""

from __future__ import annotations

import numpy as np
import pytest
from dense_helpers import dense_kernels
from onnx import TensorProto, helper, numpy_helper
from test_causal_attention import _compile, attention

TYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}


def padded(dtype: str = "float32", seq: object = "S", pre: str = "", out_p: bool = False) -> object:
    """``softmax(pre(Q K^T * 0.125) + mask[B, 1, 1, S]) V`` (a padding mask per key);
    ``pre`` a unary op on the scaled scores; ``out_p``: the probabilities a model output
    too."""
    t = TYPES[dtype]
    dims = ["B", "H", seq, "D"]
    ins = [helper.make_tensor_value_info(n, t, dims) for n in ("q", "kk", "v")]
    ins.append(helper.make_tensor_value_info("mask", t, ["B", 1, 1, seq]))
    nodes = [
        helper.make_node("Transpose", ["kk"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["sc"]),
        helper.make_node("Mul", ["sc", "scale"], ["sd"]),
    ]
    if pre:
        nodes.append(helper.make_node(pre, ["sd"], ["sp"]))
    nodes.append(helper.make_node("Add", ["sp" if pre else "sd", "mask"], ["sm"]))
    nodes.append(helper.make_node("Softmax", ["sm"], ["p"], axis=-1))
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    outs = [helper.make_tensor_value_info("y", t, dims)]
    if out_p:
        outs.append(helper.make_tensor_value_info("p", t, ["B", "H", seq, seq]))
    init = [numpy_helper.from_array(np.array(0.125, dtype), "scale")]
    graph = helper.make_graph(nodes, "padded", ins, outs, init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(feeds: dict, pre: str = "") -> np.ndarray:
    q, k, v = (feeds[n].astype(np.float64) for n in ("q", "kk", "v"))
    s = np.einsum("bhid,bhjd->bhij", q, k) * 0.125
    s = np.abs(s) if pre == "Abs" else s
    s = s + feeds["mask"].astype(np.float64)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _line(model: object) -> str:
    return next(x for x in model.explain().splitlines() if "per panel" in x)


def _feeds(dtype: str, b: int, h: int, s: int, d: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((b, h, s, d)).astype(dtype) for n in ("q", "kk", "v")}
    feeds["mask"] = np.where(rng.random((b, 1, 1, s)) < 0.2, -1e4, 0.0).astype(dtype)
    return feeds


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_padding_mask_is_the_key_tiled_form(dtype):
    """Symbolic lengths count at the nominal 512: past half the L2, it would pay."""
    model = _compile(padded(dtype), True)
    line = _line(model)
    assert "key-tiled softmax legal over" in line and "(per element before it: Mul, Add)" in line
    assert "would pay" in line and "no key-tiled kernel yet" in line, line
    assert len(dense_kernels(model)) == 1  # (and the Transpose of K, a kernel of its own)
    for s in (1, 7, 100):
        feeds = _feeds(dtype, 2, 3, s, 16, s)
        tol = 1e-4 if dtype == "float32" else 1e-10
        got = model.run(feeds)["y"]
        np.testing.assert_allclose(got, reference(feeds), rtol=tol, atol=tol)


def test_a_short_static_sequence_keeps_row_panels():
    """A panel of 64 x 64 scores fits the L2 many times over: row panels, and why."""
    model = _compile(padded(seq=64), True)
    line = _line(model)
    assert "key-tiled softmax legal" in line and "row panels: a panel of 64 query rows" in line
    assert "would pay" not in line, line


@pytest.mark.parametrize(
    ("proto", "why"),
    [
        (lambda: padded(pre="Abs"), "Abs"),
        (lambda: attention("upper", after="Relu"), "Relu"),
    ],
)
def test_refusals_say_why(proto, why):
    line = _line(_compile(proto(), True))
    assert f"row panels, not key-tiled: {why}" in line, line
    assert "not a per-element op the form takes" in line, line


def test_a_non_causal_mask_of_the_scores_shape():
    """A random constant mask (no triangle): not causal, the key-tiled form legal."""
    line = _line(_compile(attention("const99r", k=1), True))
    assert "not causal: the mask constant is not a triangle" in line
    assert "key-tiled softmax legal over sw (per element before it: Mul, Where)" in line, line


def test_causal_attention_takes_causal_panels_first():
    """A causal attention that takes causal panels is not asked about the key-tiled form."""
    line = _line(_compile(attention("upper"), True))
    assert "causal (offset 1)" in line and "key-tiled" not in line, line
    off = _line(_compile(attention("upper"), False))
    assert "not causal: switched off" in off and "key-tiled softmax legal" in off, off


def test_probabilities_read_outside_keep_the_row_panels():
    """``P`` a model output: no second GEMM in the epilogue, so no online decision either."""
    model = _compile(padded(out_p=True), True)
    assert "key-tiled" not in model.explain()
    feeds = _feeds("float32", 1, 2, 9, 8, 3)
    np.testing.assert_allclose(model.run(feeds)["y"], reference(feeds), rtol=1e-4, atol=1e-4)
