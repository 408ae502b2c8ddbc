"""Attention reading Q, K, V in place as heads of their projections and writing its result
in place through the transpose back to rows (``in_place_heads``): the plan has no layout
copy kernels, and the results match the reference path (numpy kernels) and the plan with
the copies, over random shapes: one row, odd head depths, one head, padding and causal
masks, a fused qkv projection (a Split) or three, an output projection or none."""

from __future__ import annotations

import numpy as np
import pytest
from dense_helpers import close, dense_kernels
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import geode

RNG = np.random.default_rng(11)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _heads(nodes: list, src: str, name: str, h: int, d: int, perm: list[int]) -> str:
    """``src`` ``[B, S, h * d]`` reshaped to heads and transposed by ``perm``."""
    nodes.append(helper.make_node("Reshape", [src, "heads_shape"], [f"{name}_r"]))
    nodes.append(helper.make_node("Transpose", [f"{name}_r"], [f"{name}_t"], perm=perm))
    return f"{name}_t"


def attention_proto(
    h: int, d: int, width: int, fused: bool, mask: str, out_proj: bool
) -> tuple[object, list[str]]:
    """A BERT/GPT-2 attention block as exporters write it: a qkv projection (one MatMul,
    its bias Add and a Split, or three), heads by Reshape + Transpose (K to ``[B, h, d,
    S]``), scale, a mask (``none``, ``pad``: from int64 ids, ``causal``: a bool ``[S, S]``
    input), softmax, @ V, the heads back to rows, optionally an output projection. Returns
    the model and its extra input names."""
    hd = h * d
    nodes, inits, extra = [], [], []
    inits.append(numpy_helper.from_array(np.array([0, 0, h, d], np.int64), "heads_shape"))
    inits.append(numpy_helper.from_array(np.array([0, 0, hd], np.int64), "rows_shape"))
    if fused:
        inits.append(numpy_helper.from_array(_rand(width, 3 * hd), "w_qkv"))
        inits.append(numpy_helper.from_array(_rand(3 * hd), "b_qkv"))
        inits.append(numpy_helper.from_array(np.array([hd] * 3, np.int64), "sizes"))
        nodes.append(helper.make_node("MatMul", ["x", "w_qkv"], ["qkv_mm"]))
        nodes.append(helper.make_node("Add", ["qkv_mm", "b_qkv"], ["qkv"]))
        nodes.append(helper.make_node("Split", ["qkv", "sizes"], ["q0", "k0", "v0"], axis=2))
    else:
        for n in "qkv":
            inits.append(numpy_helper.from_array(_rand(width, hd), f"w_{n}"))
            inits.append(numpy_helper.from_array(_rand(hd), f"b_{n}"))
            nodes.append(helper.make_node("MatMul", ["x", f"w_{n}"], [f"{n}_mm"]))
            nodes.append(helper.make_node("Add", [f"{n}_mm", f"b_{n}"], [f"{n}0"]))
    q = _heads(nodes, "q0", "q", h, d, [0, 2, 1, 3])
    kt = _heads(nodes, "k0", "k", h, d, [0, 2, 3, 1])
    v = _heads(nodes, "v0", "v", h, d, [0, 2, 1, 3])
    inits.append(numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "scale"))
    nodes.append(helper.make_node("MatMul", [q, kt], ["sc"]))
    nodes.append(helper.make_node("Div", ["sc", "scale"], ["sd"]))
    last = "sd"
    if mask == "pad":
        inits.append(numpy_helper.from_array(np.array([1, 2], np.int64), "ax"))
        inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
        inits.append(numpy_helper.from_array(np.array(-10000.0, np.float32), "big"))
        nodes += [
            helper.make_node("Unsqueeze", ["mask", "ax"], ["m4"]),
            helper.make_node("Cast", ["m4"], ["mf"], to=1),
            helper.make_node("Sub", ["one", "mf"], ["inv"]),
            helper.make_node("Mul", ["inv", "big"], ["bias"]),
            helper.make_node("Add", ["sd", "bias"], ["sm"]),
        ]
        extra.append(helper.make_tensor_value_info("mask", TensorProto.INT64, ["B", "S"]))
        last = "sm"
    elif mask == "causal":
        inits.append(numpy_helper.from_array(np.array(-1e9, np.float32), "ninf"))
        nodes.append(helper.make_node("Where", ["causal", "sd", "ninf"], ["sw"]))
        extra.append(helper.make_tensor_value_info("causal", TensorProto.BOOL, ["S", "S"]))
        last = "sw"
    nodes.append(helper.make_node("Softmax", [last], ["p"], axis=-1))
    nodes.append(helper.make_node("MatMul", ["p", v], ["o"]))
    nodes.append(helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]))
    nodes.append(helper.make_node("Reshape", ["ot", "rows_shape"], ["rows"]))
    out = "rows"
    if out_proj:
        inits.append(numpy_helper.from_array(_rand(hd, width), "w_o"))
        nodes.append(helper.make_node("MatMul", ["rows", "w_o"], ["y"]))
        out = "y"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", width])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "attn", [x, *extra], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, [e.name for e in extra]


def _feeds(names: list[str], b: int, s: int, width: int) -> dict[str, np.ndarray]:
    feeds = {"x": _rand(b, s, width)}
    if "mask" in names:
        feeds["mask"] = (RNG.random((b, s)) > 0.3).astype(np.int64)
    if "causal" in names:
        feeds["causal"] = np.tril(np.ones((s, s), bool))
    return feeds


def _attention_kernel(model: object) -> object:
    found = [k for k in dense_kernels(model) if [n.op_type for n in k.ops].count("Transpose") == 4]
    assert len(found) == 1, model.explain()
    return found[0]


@pytest.mark.parametrize("fused", [True, False])
def test_no_layout_copies_are_left(fused):
    """The three head transposes and the transpose back are the attention kernel's; the
    qkv bias runs in its projection's GEMM; no kernel but a dense one is left."""
    proto, names = attention_proto(4, 8, 32, fused, "pad", True)
    model = geode.compile(proto)
    att = _attention_kernel(model)
    ops = [n.op_type for n in att.ops]
    assert ops.count("Reshape") == 4 and ops.count("MatMul") == 2, ops
    assert ("Split" in ops) == fused
    kinds = [k.kind for k in model.kernels if k.name != f"{att.name}_pre"]
    assert set(kinds) <= {"dense", "library"}, model.explain()  # no copy kernel
    assert len(kinds) == (3 if fused else 5), model.explain()  # qkv(s), attention, out
    text = model.explain()
    assert "heads in place: saves" in text
    assert "A read in place from" in text and "O written in place into rows" in text
    assert "transposed" in text  # K^T through the GEMM's transB
    off = geode.compile(proto, in_place_heads=False)
    assert len(off.kernels) > len(model.kernels)
    assert not any("Transpose" in [n.op_type for n in k.ops] for k in dense_kernels(off))
    feeds = _feeds(names, 2, 7, 32)
    close(model.run(feeds)["y"], off.run(feeds)["y"], rtol=1e-5)


def test_the_option_keeps_the_copies():
    proto, _ = attention_proto(2, 4, 8, True, "none", False)
    model = geode.compile(proto, in_place_heads=False)
    assert "heads in place" not in model.explain()
    assert any(k.kind != "dense" for k in model.kernels)


def test_a_head_read_elsewhere_keeps_its_copy():
    """V's transposed heads are also a graph output: V keeps its copy, and the Split it
    shares with Q and K cannot go, so they keep theirs (reasons in explain()); the
    result is still written in place."""
    proto, names = attention_proto(2, 4, 8, True, "none", False)
    proto.graph.output.append(helper.make_tensor_value_info("v_t", TensorProto.FLOAT, None))
    model = geode.compile(proto)
    text = model.explain()
    assert "not in place: V is not a transpose read by the product alone" in text
    assert "A not in place:" in text and "read elsewhere" in text
    assert "A read in place" not in text and "O written in place into rows" in text
    ref = geode.compile(proto, codegen=False)
    feeds = _feeds(names, 2, 5, 8)
    got, want = model.run(feeds), ref.run(feeds)
    for k in want:
        close(got[k], want[k], rtol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 3),
    s=st.sampled_from([1, 2, 5, 17, 40]),
    h=st.integers(1, 4),
    d=st.sampled_from([1, 3, 5, 8, 13]),
    width=st.sampled_from([3, 16]),
    fused=st.booleans(),
    mask=st.sampled_from(["none", "pad", "causal"]),
    out_proj=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_random_attention_in_place_matches_the_reference(
    b, s, h, d, width, fused, mask, out_proj, threads
):
    proto, names = attention_proto(h, d, width, fused, mask, out_proj)
    model = geode.compile(proto, num_threads=threads)
    _attention_kernel(model)
    ref = geode.compile(proto, codegen=False)
    feeds = _feeds(names, b, s, width)
    got, want = model.run(feeds), ref.run(feeds)
    (key,) = want
    close(got[key], want[key], rtol=2e-5)


@pytest.mark.parametrize("lead", [[], ["B", "C"]])
def test_no_batch_dim_or_two(lead):
    """Heads of a root with no batch dim (``[S, W]``) or two (``[B, C, S, W]``): the
    strides per batch dim come from the root's own dims."""
    g = geode.Graph("lead")
    h, d, rank = 3, 5, len(lead)
    x = g.input("x", [*lead, "S", 3 * h * d], np.float32)
    sizes = g.constant(np.array([h * d] * 3, np.int64), "sizes")
    q0, k0, v0 = g.op("Split", x, sizes, axis=rank + 1, n_outputs=3)
    shape = g.constant(np.array([0] * (rank + 1) + [h, d], np.int64), "heads")
    base = list(range(rank))

    def heads(v, perm):
        return g.op("Transpose", g.op("Reshape", v, shape), perm=perm)

    q = heads(q0, [*base, rank + 1, rank, rank + 2])
    kt = heads(k0, [*base, rank + 1, rank + 2, rank])
    v = heads(v0, [*base, rank + 1, rank, rank + 2])
    o = g.op("MatMul", g.op("Softmax", g.op("MatMul", q, kt), axis=-1), v)
    back = g.op("Transpose", o, perm=[*base, rank + 1, rank, rank + 2])
    rows = g.op("Reshape", back, g.constant(np.array([0] * (rank + 1) + [h * d], np.int64), "r"))
    g.output(g.op("Relu", rows), names=["y"])
    model = geode.compile(g, num_threads=2)
    _attention_kernel(model)
    ref = geode.compile(g, codegen=False)
    feeds = {"x": _rand(*[{"B": 2, "C": 3}[n] for n in lead], 7, 3 * h * d)}
    close(model.run(feeds)["y"], ref.run(feeds)["y"], rtol=1e-5)


def test_an_epilogue_refused_after_the_heads_left_their_groups(monkeypatch):
    """Should the attention take no epilogue once its layout nodes left their groups,
    they run again, each on its own, where their readers need them: same results."""
    from geode.codegen import epilogues

    real = epilogues._decide

    def refuse_attention(node, job, g, spec, native, opts, views=None):
        if views:
            return "refused by the test"
        return real(node, job, g, spec, native, opts, views)

    monkeypatch.setattr(epilogues, "_decide", refuse_attention)
    proto, names = attention_proto(2, 4, 8, True, "pad", True)
    model = geode.compile(proto, model_cache=False)
    text = model.explain()
    assert "refused by the test" in text and "heads are copied again" in text
    ref = geode.compile(proto, codegen=False)
    feeds = _feeds(names, 2, 5, 8)
    close(model.run(feeds)["y"], ref.run(feeds)["y"], rtol=1e-5)
