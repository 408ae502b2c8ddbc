"""Causal attention: a mask proven causal at compile time (``compiler/fusion/causal.py``)
lets each panel of query rows compute only the key columns it sees
(``backends/llvm/dense.py: CausalPanels``). The results match a float64 numpy reference
and, bit for bit, the plan that computes every column (``CAUSAL_ATTENTION`` off), over
random batches, heads, sequence lengths (one row, odd, not a multiple of the panel),
head depths, offsets, mask forms and float32 / float64; masks not proven causal keep the
full path with their reason in ``explain()``."""

from __future__ import annotations

import numpy as np
import pytest
from dense_helpers import attention_spec, dense_kernels
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import geode
import geode.codegen.epilogues as epilogues
from geode.codegen.backends.llvm.dense import CausalPanels, DenseSpec, dense_ir
from geode.errors import CodegenError

TYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}


def _mask_nodes(form: str, k: int, dtype: str, nodes: list, inits: list) -> str:
    """Nodes making the mask of ``form`` (``S x S`` from the scores' shape), its name."""
    nodes += [
        helper.make_node("Shape", ["q"], ["qs"]),
        helper.make_node("Gather", ["qs", "two"], ["s1"], axis=0),
        helper.make_node("Concat", ["s1", "s1"], ["ss"], axis=0),
    ]
    inits += [numpy_helper.from_array(np.array([2], np.int64), "two")]
    inits += [numpy_helper.from_array(np.array(k, np.int64), "k")]
    if form in ("upper", "lower"):
        one = helper.make_tensor("one", TensorProto.BOOL, [1], [True])
        nodes.append(helper.make_node("ConstantOfShape", ["ss"], ["ones"], value=one))
        upper = int(form != "lower")
        nodes.append(helper.make_node("Trilu", ["ones", "k"], ["mask"], upper=upper))
    elif form == "add":
        ninf = helper.make_tensor("ninf_v", TYPES[dtype], [1], [-np.inf])
        nodes.append(helper.make_node("ConstantOfShape", ["ss"], ["full"], value=ninf))
        nodes.append(helper.make_node("Trilu", ["full", "k"], ["mask"], upper=1))
    elif form in ("sdpa", "sdpa2"):  # torch's SDPA(is_causal): a bias from tril(ones, k - 1)
        one = helper.make_tensor("one", TensorProto.BOOL, [1], [True])
        nodes.append(helper.make_node("ConstantOfShape", ["ss"], ["ones"], value=one))
        inits += [numpy_helper.from_array(np.array(k - 1, np.int64), "km1")]
        inits += [numpy_helper.from_array(np.array(-np.inf, dtype), "ninf_b")]
        inits += [numpy_helper.from_array(np.array(0.0, dtype), "zero_b")]
        nodes.append(helper.make_node("Trilu", ["ones", "km1"], ["tril"], upper=0))
        if form == "sdpa":
            nodes.append(helper.make_node("Not", ["tril"], ["past"]))
            nodes.append(helper.make_node("Where", ["past", "ninf_b", "zero_b"], ["mask"]))
        else:
            nodes.append(helper.make_node("Where", ["tril", "zero_b", "ninf_b"], ["mask"]))
    elif form == "cast":
        one = helper.make_tensor("one", TYPES[dtype], [1], [1.0])
        nodes.append(helper.make_node("ConstantOfShape", ["ss"], ["ones"], value=one))
        nodes.append(helper.make_node("Trilu", ["ones", "k"], ["tri"], upper=1))
        nodes.append(helper.make_node("Cast", ["tri"], ["mask"], to=TensorProto.BOOL))
    return "mask"


def attention(
    form: str, k: int = 1, dtype: str = "float32", fill: float = -np.inf, after: str = ""
) -> object:
    """``softmax(mask(Q K^T / sqrt(d))) V`` over inputs ``q, k, v [B, H, S, D]``; ``form``
    the mask: ``upper`` (``Where(triu(ones, k), fill, s)``), ``lower`` (``Where(tril(ones,
    k), s, fill)``), ``add`` (``s + triu(full(-inf), k)``), ``cast`` (a float triangle cast
    to bool), ``constNN`` (a constant bool ``triu(ones, k)``, ``S = NN`` static;
    ``sdpa``: ``s + where(not(tril(ones, k - 1)), -inf, 0)``, ``sdpa2``: ``s + where(tril(ones,
    k - 1), 0, -inf)``, ``constNNr``: random bools, ``constNNa``: an additive float triangle of -inf), ``input``
    (a runtime bool input). ``after``: a unary op between the mask and the softmax."""
    t = TYPES[dtype]
    nodes, inits = [], []
    dims: list = (
        ["B", "H", int(form[5:7]), "D"] if form.startswith("const") else ["B", "H", "S", "D"]
    )
    ins = [helper.make_tensor_value_info(n, t, dims) for n in ("q", "kk", "v")]
    inits.append(numpy_helper.from_array(np.array(fill, dtype), "fill"))
    inits.append(numpy_helper.from_array(np.array(0.125, dtype), "scale"))
    nodes.append(helper.make_node("Transpose", ["kk"], ["kt"], perm=[0, 1, 3, 2]))
    nodes.append(helper.make_node("MatMul", ["q", "kt"], ["sc"]))
    nodes.append(helper.make_node("Mul", ["sc", "scale"], ["sd"]))
    if form == "input":
        ins.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, ["S", "S"]))
    elif form.startswith("const"):
        s = int(form[5:7])
        tri = np.triu(np.ones((s, s), bool), k)
        if form.endswith("r"):
            tri = np.random.default_rng(3).random((s, s)) > 0.5
        if form.endswith("a"):  # additive: -inf in the triangle, zeros elsewhere
            tri = np.where(tri, -np.inf, 0.0).astype(dtype)
        inits.append(numpy_helper.from_array(tri, "mask"))
    else:
        _mask_nodes(form, k, dtype, nodes, inits)
    if form in ("add", "sdpa", "sdpa2") or form.endswith("a"):
        nodes.append(helper.make_node("Add", ["sd", "mask"], ["sw"]))
    elif form == "lower":
        nodes.append(helper.make_node("Where", ["mask", "sd", "fill"], ["sw"]))
    else:
        nodes.append(helper.make_node("Where", ["mask", "fill", "sd"], ["sw"]))
    if after:
        nodes.append(helper.make_node(after, ["sw"], ["sa"]))
    nodes.append(helper.make_node("Softmax", ["sa" if after else "sw"], ["p"], axis=-1))
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    out = helper.make_tensor_value_info("y", t, dims)
    graph = helper.make_graph(nodes, "attn", ins, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(q: np.ndarray, kk: np.ndarray, v: np.ndarray, offset: int) -> np.ndarray:
    """float64 causal attention: column ``j`` of row ``i`` masked when ``j >= i + offset``."""
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), kk.astype(np.float64)) * 0.125
    i, j = np.indices(s.shape[-2:])
    s = np.where(j >= i + offset, -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v.astype(np.float64)


def _compile(proto: object, causal: bool, threads: int = 2) -> geode.Model:
    """``proto`` with causal panels on or off; the key-tiled softmax off (the plan without
    causal panels is the one that computes every column on row panels)."""
    saved = epilogues.CAUSAL_ATTENTION, epilogues.ONLINE_ATTENTION
    epilogues.CAUSAL_ATTENTION, epilogues.ONLINE_ATTENTION = causal, False
    try:
        return geode.compile(proto, session=geode.Session(), model_cache=False, num_threads=threads)
    finally:
        epilogues.CAUSAL_ATTENTION, epilogues.ONLINE_ATTENTION = saved


_MODELS: dict[tuple, tuple[geode.Model, geode.Model]] = {}


def _models(form: str, k: int, dtype: str) -> tuple[geode.Model, geode.Model]:
    key = (form, k, dtype)
    if key not in _MODELS:
        proto = attention(form, k, dtype)
        _MODELS[key] = (_compile(proto, True), _compile(proto, False))
    return _MODELS[key]


def _offset(form: str, k: int) -> int:
    return k + 1 if form == "lower" else k


def _check(form: str, k: int, dtype: str, b: int, h: int, s: int, d: int, seed: int) -> None:
    on, off = _models(form, k, dtype)
    assert "causal (offset" in on.explain(), on.explain()
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((b, h, s, d)).astype(dtype) for n in ("q", "kk", "v")}
    got, old = on.run(feeds)["y"], off.run(feeds)["y"]
    want = reference(feeds["q"], feeds["kk"], feeds["v"], _offset(form, k))
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert got.dtype == np.dtype(dtype)
    assert np.array_equal(got, old), np.abs(got - old).max()  # the same bits


@pytest.mark.parametrize("s", [1, 2, 63, 64, 65, 130, 200])
def test_causal_panels_fixed_lengths(s):
    """One row, a panel's height and one row either side, several panels with a short last."""
    _check("upper", 1, "float32", 2, 3, s, 16, s)


@pytest.mark.parametrize("form", ["upper", "lower", "add", "cast", "sdpa", "sdpa2"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_causal_mask_forms(form, dtype):
    _check(form, 1, dtype, 1, 2, 97, 8, 5)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    form=st.sampled_from(["upper", "lower", "add"]),
    k=st.integers(1, 3),
    dtype=st.sampled_from(["float32", "float64"]),
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    s=st.integers(1, 150),
    d=st.integers(1, 40),
    seed=st.integers(0, 1000),
)
def test_random_causal_attention(form, k, dtype, b, h, s, d, seed):
    _check(form, k, dtype, b, h, s, d, seed)


@pytest.mark.parametrize("form", ["const99", "const99a"])
def test_a_constant_triangle_is_causal(form):
    """A constant ``[S, S]`` triangle (``torch.triu(ones, 2)`` stored as data, or an
    additive mask of -inf)."""
    model = _compile(attention(form, k=2), True)
    assert "causal (offset 2)" in model.explain(), model.explain()
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 2, 99, 8)).astype(np.float32) for n in ("q", "kk", "v")}
    want = reference(feeds["q"], feeds["kk"], feeds["v"], 2)
    np.testing.assert_allclose(model.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("form", "k", "fill", "why"),
    [
        ("upper", 0, -np.inf, "offset 0: a query row would see no key column"),
        ("upper", -1, -np.inf, "offset -1"),
        ("lower", 0, -np.inf, None),  # offset 1: causal (the control)
        ("lower", -1, -np.inf, "offset 0"),
        ("upper", 1, -1e9, "does not put -inf"),
        ("input", 1, -np.inf, "is not known at compile time"),
        ("const99r", 1, -np.inf, "not a triangle"),
    ],
)
def test_masks_not_proven_causal_keep_every_column(form, k, fill, why):
    proto = attention(form, k, fill=fill)
    model = _compile(proto, True)
    text = model.explain()
    if why is None:
        assert "causal (offset 1)" in text, text
        return
    assert "not causal: " in text and why in text, text
    rng = np.random.default_rng(2)
    feeds = {n: rng.standard_normal((1, 2, 99, 8)).astype(np.float32) for n in ("q", "kk", "v")}
    if form == "input":
        feeds["mask"] = np.triu(np.ones((99, 99), bool), 1)
    full = _compile(proto, False).run(feeds)["y"]
    np.testing.assert_array_equal(model.run(feeds)["y"], full)


def test_an_op_between_the_mask_and_the_softmax_keeps_every_column():
    """``softmax(relu(masked))``: the masked scores become 0, not -inf."""
    text = _compile(attention("upper", after="Relu"), True).explain()
    assert "not causal: Relu" in text and "may read or keep a skipped column" in text, text


def test_the_switch_keeps_every_column():
    text = _compile(attention("upper"), False).explain()
    assert "not causal: switched off" in text


def test_a_short_query_keeps_every_column():
    """Few query rows (static): one panel sees every key column, so no causal panels."""
    proto = attention("const40", k=1)
    model = _compile(proto, True)
    assert "causal (offset 1)" in model.explain()
    assert "all key columns: 40 query rows" in model.explain()
    assert len(dense_kernels(model)) == 1


def _spec(causal: CausalPanels, **kw: object) -> DenseSpec:
    return attention_spec(causal=causal, **kw)  # type: ignore[return-value]


def test_the_entry_refuses_causal_panels_it_cannot_run():
    assert "cm_row" in dense_ir(_spec(CausalPanels(1, 1, 1.0, 0.0, 64)))
    for bad in (
        CausalPanels(0, 1, 1.0, 0.0, 64),  # offset 0
        CausalPanels(1, 0, 1.0, 0.0, 64),  # the product, not the mask
        CausalPanels(1, 1, 1.0, 0.0, 0),  # no rows
        CausalPanels(1, 5, 1.0, 0.0, 64),  # no such argument
    ):
        with pytest.raises(CodegenError, match="no causal panels"):
            dense_ir(_spec(bad))
    with pytest.raises(CodegenError, match="no causal panels"):
        dense_ir(_spec(CausalPanels(1, 1, 1.0, 0.0, 64), v_rank=0))


@pytest.mark.slow  # exports bench's GPT-2 block with torch (in a subprocess): about 10 s
def test_the_exported_gpt2_block(tmp_path):
    """bench/models.py's GPT-2 block as torch exports it (``Trilu`` of ``ConstantOfShape``
    through ``Where``): causal, the same bits as the full path, onnxruntime's result within
    float32 rounding, at an odd length over several panels."""
    pytest.importorskip("torch", reason="torch is not installed: the model is exported with it")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from bench import models; "
        "models.export(models._model_specs()['gpt2'], sys.argv[2], seed=1)"
    )
    subprocess.run([sys.executable, "-c", code, str(root), str(tmp_path)], check=True)
    path = str(tmp_path / "gpt2.onnx")
    on, off = _compile(path, True), _compile(path, False)
    assert "causal (offset 1)" in on.explain(), on.explain()
    x = np.random.default_rng(4).standard_normal((2, 150, 256)).astype(np.float32)
    got, old = on.run({"x": x}), off.run({"x": x})
    want = ort.InferenceSession(path).run(None, {"x": x})
    for name, ref in zip(("y", "pooled"), want):
        assert np.array_equal(got[name], old[name])
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4)
