"""Attention with a key-tiled (online) softmax (``compiler/fusion/online.py``,
``codegen/epilogues.py: _online``, ``backends/llvm/attention_tiled.py``): per panel of
query rows the scores a block of keys at a time, a running max and sum, ``O`` rescaled.

The tiled form is forced at small lengths (``ONLINE_FORCE``, with small panels and key
blocks through ``profit.ONLINE_ROWS`` / ``ONLINE_KEYS``) so lengths of one, odd, and not
a multiple of the block stay fast. Results match a float64 numpy reference within the
float sums' bounds and the row-panel path (``ONLINE_ATTENTION`` off) likewise: not bit
for bit (the sums are regrouped per block); NaN where the row-panel path has NaN (rows
all masked, NaN scores). Forms the kernel cannot run keep the row panels with their
reason in ``explain()``. A symbolic key length's entry holds the row panels and chooses per
call, its key-tiled body compiled on the first call taking it (``_per_call``: the limit
forced low so 33 keys take the key-tiled body; ``test_lazy_tiled.py``): each length gives
the bits of the path it chose."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from dense_helpers import attention_spec, dense_kernels
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import geode
import geode.codegen.epilogues as epilogues
from geode.compiler.fusion import profit

TYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}
MASKS = ("none", "pad", "full", "where", "causal")


def model(mask: str, dtype: str = "float32", seq: object = "S", pre: str = "") -> object:
    """``softmax(mask(pre(Q K^T) * 0.125)) V`` over ``q, k, v [B, H, S, D]``; ``mask``:
    ``none``; ``pad`` an additive ``[B, 1, 1, S]`` input; ``full`` an additive ``[B, H, S,
    S]`` input; ``where`` ``Where(m, -inf, s)`` of a bool ``[S, S]`` input; ``causal``
    ``Where(triu(ones, 1), -inf, s)`` made in the graph. ``pre``: a unary op on the
    scores."""
    t = TYPES[dtype]
    dims = ["B", "H", seq, "D"]
    ins = [helper.make_tensor_value_info(n, t, dims) for n in ("q", "kk", "v")]
    nodes = [
        helper.make_node("Transpose", ["kk"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["sc"]),
    ]
    last = "sc"
    if pre:
        nodes.append(helper.make_node(pre, ["sc"], ["sp"]))
        last = "sp"
    nodes.append(helper.make_node("Mul", [last, "scale"], ["sd"]))
    init = [
        numpy_helper.from_array(np.array(0.125, dtype), "scale"),
        numpy_helper.from_array(np.array(-np.inf, dtype), "ninf"),
    ]
    last = "sd"
    if mask in ("pad", "full"):
        shape = ["B", 1, 1, seq] if mask == "pad" else ["B", "H", seq, seq]
        ins.append(helper.make_tensor_value_info("mask", t, shape))
        nodes.append(helper.make_node("Add", ["sd", "mask"], ["sm"]))
        last = "sm"
    elif mask == "where":
        ins.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [seq, seq]))
        nodes.append(helper.make_node("Where", ["mask", "ninf", "sd"], ["sm"]))
        last = "sm"
    elif mask == "causal":
        one = helper.make_tensor("one", TensorProto.BOOL, [1], [True])
        init += [numpy_helper.from_array(np.array([2], np.int64), "two")]
        nodes += [
            helper.make_node("Shape", ["q"], ["qs"]),
            helper.make_node("Gather", ["qs", "two"], ["s1"], axis=0),
            helper.make_node("Concat", ["s1", "s1"], ["ss"], axis=0),
            helper.make_node("ConstantOfShape", ["ss"], ["ones"], value=one),
            helper.make_node("Trilu", ["ones"], ["tri"], upper=1),
            helper.make_node("Trilu", ["tri", "k1"], ["cm"], upper=1),
            helper.make_node("Where", ["cm", "ninf", "sd"], ["sm"]),
        ]
        init += [numpy_helper.from_array(np.array(1, np.int64), "k1")]
        last = "sm"
    nodes.append(helper.make_node("Softmax", [last], ["p"], axis=-1))
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    out = helper.make_tensor_value_info("y", t, dims)
    graph = helper.make_graph(nodes, "attn", ins, [out], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds_for(mask: str, dtype: str, b: int, h: int, s: int, d: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((b, h, s, d)).astype(dtype) for n in ("q", "kk", "v")}
    if mask == "pad":
        feeds["mask"] = np.where(rng.random((b, 1, 1, s)) < 0.3, -1e4, 0.0).astype(dtype)
        feeds["mask"][..., 0] = 0.0  # every row sees a key (else -1e4 + s rounds in float32)
    elif mask == "full":
        feeds["mask"] = (rng.standard_normal((b, h, s, s)) * 3).astype(dtype)
    elif mask == "where":
        feeds["mask"] = rng.random((s, s)) < 0.3
        feeds["mask"][:, 0] = False  # every row sees a key (rows all masked: their own test)
    return feeds


def reference(mask: str, feeds: dict, pre: str = "") -> np.ndarray:
    """float64 attention of :func:`model`."""
    q, k, v = (feeds[n].astype(np.float64) for n in ("q", "kk", "v"))
    s = np.einsum("bhid,bhjd->bhij", q, k)
    s = np.abs(s) if pre == "Abs" else s
    s = s * 0.125
    if mask in ("pad", "full"):
        s = s + feeds["mask"].astype(np.float64)
    elif mask in ("where", "causal"):
        n = s.shape[-1]
        m = feeds["mask"] if mask == "where" else np.triu(np.ones((n, n), bool), 1)
        s = np.where(m, -np.inf, s)
    with np.errstate(invalid="ignore"):  # rows all masked: NaN, as the kernels give
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v


def compile_with(proto: object, tiled: bool, rows: int = 8, keys: int = 16) -> geode.Model:
    """``proto`` key-tiled (forced, panels of ``rows``, blocks of ``keys``) or on row
    panels (the switch off)."""
    saved = (
        epilogues.ONLINE_ATTENTION,
        epilogues.ONLINE_FORCE,
        epilogues.CAUSAL_ATTENTION,
        profit.ONLINE_ROWS,
        profit.ONLINE_KEYS,
    )
    epilogues.ONLINE_ATTENTION, epilogues.ONLINE_FORCE = tiled, tiled
    epilogues.CAUSAL_ATTENTION = False  # the causal mask as any mask
    profit.ONLINE_ROWS, profit.ONLINE_KEYS = rows, keys
    try:
        return geode.compile(proto, session=geode.Session(), model_cache=False, num_threads=2)
    finally:
        (
            epilogues.ONLINE_ATTENTION,
            epilogues.ONLINE_FORCE,
            epilogues.CAUSAL_ATTENTION,
            profit.ONLINE_ROWS,
            profit.ONLINE_KEYS,
        ) = saved


_MODELS: dict[tuple, tuple[geode.Model, geode.Model]] = {}


def models(mask: str, dtype: str) -> tuple[geode.Model, geode.Model]:
    """(key-tiled, row panels) for ``mask`` and ``dtype``, compiled once."""
    key = (mask, dtype)
    if key not in _MODELS:
        proto = model(mask, dtype)
        _MODELS[key] = (compile_with(proto, True), compile_with(proto, False))
    return _MODELS[key]


def _line(m: geode.Model) -> str:
    return next(x for x in m.explain().splitlines() if "per panel" in x)


def check(mask: str, dtype: str, b: int, h: int, s: int, d: int, seed: int) -> None:
    tiled, rows = models(mask, dtype)
    assert "; key-tiled: forced" in _line(tiled), _line(tiled)
    feeds = feeds_for(mask, dtype, b, h, s, d, seed)
    got, old = tiled.run(feeds)["y"], rows.run(feeds)["y"]
    assert got.dtype == np.dtype(dtype) and got.shape == (b, h, s, d)
    tol = 2e-5 if dtype == "float32" else 1e-12
    want = reference(mask, feeds)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(got, old, rtol=tol, atol=tol)  # not the same bits


@pytest.mark.parametrize("s", [1, 2, 7, 15, 16, 17, 33, 100])
def test_lengths_around_the_block(s):
    """One key, fewer than a block, a block and one either side, several with a short
    last; panels of 8 rows, the last short."""
    check("pad", "float32", 2, 3, s, 8, s)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_masks_and_types(mask, dtype):
    check(mask, dtype, 2, 2, 45, 12, 7)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    mask=st.sampled_from(MASKS),
    dtype=st.sampled_from(["float32", "float64"]),
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    s=st.integers(1, 70),
    d=st.integers(1, 24),
    seed=st.integers(0, 1000),
)
def test_random_attention(mask, dtype, b, h, s, d, seed):
    check(mask, dtype, b, h, s, d, seed)


def test_one_fused_kernel():
    """The attention stays one dense step (the Transpose of K its own kernel, as on row
    panels)."""
    tiled, rows = models("pad", "float32")
    assert len(dense_kernels(tiled)) == 1
    assert len(tiled.kernels) == len(rows.kernels)


def test_rows_all_masked_are_nan_as_on_row_panels():
    """A query row whose every key is ``-inf`` comes out NaN both ways; a row masked in
    its first blocks only (its keys seen late) comes out right."""
    tiled, rows = models("where", "float32")
    feeds = feeds_for("where", "float32", 1, 2, 40, 8, 1)
    feeds["mask"][3, :] = True  # row 3: all masked
    feeds["mask"][5, :35] = True  # row 5: only keys from the third block
    got, old = tiled.run(feeds)["y"], rows.run(feeds)["y"]
    assert np.isnan(got[:, :, 3]).all() and np.isnan(old[:, :, 3]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(old))
    keep = ~np.isnan(old)
    np.testing.assert_allclose(got[keep], reference("where", feeds)[keep], rtol=2e-5, atol=2e-5)


def test_nan_and_inf_propagate_as_on_row_panels():
    """A NaN query row, a NaN key (every row), a ``+inf`` score: NaN where the row panels
    have it."""
    tiled, rows = models("none", "float64")
    feeds = feeds_for("none", "float64", 1, 2, 37, 4, 2)
    feeds["q"][0, 0, 4, 1] = np.nan
    feeds["kk"][0, 1, 30, 0] = np.nan
    feeds["q"][0, 0, 9] = [np.inf, 0, 0, 0]
    feeds["kk"][0, 0, 20] = [1.0, 0, 0, 0]
    got, old = tiled.run(feeds)["y"], rows.run(feeds)["y"]
    assert np.isnan(old).any() and not np.isnan(old).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(old))
    keep = ~np.isnan(old)
    np.testing.assert_allclose(got[keep], old[keep], rtol=1e-12, atol=1e-12)


def test_default_blocks_and_the_profit_rule():
    """Default panels and blocks (256 x 1024) over a static length of three blocks: the
    rule takes the key-tiled form; a symbolic length keeps the row panels."""
    m = geode.compile(model("pad", seq=2100), session=geode.Session(), model_cache=False)
    line = _line(m)
    assert "key-tiled softmax legal over sm (per element before it: Mul, Add)" in line, line
    assert "; key-tiled: a panel of 2100 query rows x 2100 keys" in line, line
    sym = _line(geode.compile(model("pad"), session=geode.Session(), model_cache=False))
    assert "row panels: the key length is symbolic" in sym, sym
    assert "; chosen per call: row panels below " in sym, sym
    feeds = feeds_for("pad", "float32", 1, 1, 2100, 8, 4)
    np.testing.assert_allclose(m.run(feeds)["y"], reference("pad", feeds), rtol=2e-5, atol=2e-5)


def test_a_short_static_length_keeps_row_panels():
    m = geode.compile(model("pad", seq=64), session=geode.Session(), model_cache=False)
    line = _line(m)
    assert "key-tiled softmax legal" in line and "row panels: a panel of 64 query rows" in line
    assert "key-tiled:" not in line, line


def test_the_switch_keeps_row_panels():
    assert "the key-tiled softmax switched off" in _line(compile_with(model("pad"), False))


def _refusal(proto: object, why: str) -> None:
    line = _line(compile_with(proto, True))
    assert why in line, line
    assert "; key-tiled:" not in line, line


def test_refusals_say_why():
    _refusal(model("none", pre="Abs"), "row panels, not key-tiled: Abs")
    _refusal(model("none", pre="Abs"), "not a per-element op the form takes")


def test_kernel_limits_say_why():
    """Legal forms the kernel does not run: no op before the softmax, a constant V."""
    t = TensorProto.FLOAT
    dims = ["B", "H", "S", "D"]
    ins = [helper.make_tensor_value_info("q", t, dims)]
    ins.append(helper.make_tensor_value_info("kt", t, ["B", "H", "D", "S"]))
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["sc"]),
        helper.make_node("Softmax", ["sc"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    v_in = [helper.make_tensor_value_info("v", t, dims)]
    graph = helper.make_graph(nodes, "a", ins + v_in, [helper.make_tensor_value_info("y", t, dims)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _refusal(proto, "row panels: no per-element op before the softmax")
    nodes.insert(1, helper.make_node("Mul", ["sc", "half"], ["sh"]))
    nodes[2] = helper.make_node("Softmax", ["sh"], ["p"], axis=-1)
    v = numpy_helper.from_array(np.ones((8, 4), np.float32), "v")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    ins[1] = helper.make_tensor_value_info("kt", t, ["B", "H", "D", 8])
    out = helper.make_tensor_value_info("y", t, ["B", "H", "S", 4])
    graph = helper.make_graph(nodes, "a", ins, [out], [v, half])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _refusal(proto, "row panels: a constant K or V")


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("mask", ["none", "pad", "causal"])
@pytest.mark.parametrize("threads", [1, 2])
def test_heads_read_in_place(fused, mask, threads):
    """Q, K^T (the GEMM's transB: a block is rows of K), V read and O written in place as
    heads of their projections (``test_dense_heads.py``'s block), key-tiled."""
    from dense_helpers import close
    from test_dense_heads import _feeds, attention_proto

    proto, names = attention_proto(3, 8, 32, fused, mask, True)
    saved = (epilogues.ONLINE_FORCE, profit.ONLINE_ROWS, profit.ONLINE_KEYS)
    epilogues.ONLINE_FORCE, profit.ONLINE_ROWS, profit.ONLINE_KEYS = True, 8, 16
    try:
        m = geode.compile(proto, session=geode.Session(), model_cache=False, num_threads=threads)
    finally:
        epilogues.ONLINE_FORCE, profit.ONLINE_ROWS, profit.ONLINE_KEYS = saved
    text = m.explain()
    assert "; key-tiled: forced" in text and "O written in place into rows" in text, text
    assert "transposed" in text
    ref = geode.compile(proto, codegen=False)
    for b, s in ((1, 1), (2, 37)):
        feeds = _feeds(names, b, s, 32)
        got, want = m.run(feeds), ref.run(feeds)
        (key,) = want
        close(got[key], want[key], rtol=2e-5)


def _spec(online: object, **kw: object) -> object:
    return attention_spec(online=online, **kw)


def test_the_entry_refuses_key_tiled_panels_it_cannot_run():
    from geode.codegen.backends.llvm.attention_tiled import OnlinePanels
    from geode.codegen.backends.llvm.dense import dense_ir
    from geode.errors import CodegenError

    ir = dense_ir(_spec(OnlinePanels(8, 16, 1)))
    assert "@geode.vm.exp.f32" in ir and "llvm.maximum.f32" in ir
    assert "geode.vm.exp" not in dense_ir(_spec(None, inner=_spec(None).inner))
    for bad in (
        _spec(OnlinePanels(8, 16, -1)),  # the mask not named
        _spec(OnlinePanels(8, 16, 0)),  # the product, not the mask
        _spec(OnlinePanels(0, 16, 1)),  # no rows
        _spec(OnlinePanels(8, 0, 1)),  # no keys
        _spec(OnlinePanels(8, 16, 1), v_rank=0),  # no second GEMM
        _spec(OnlinePanels(8, 16, 1), b_rank=2, a_rank=2, v_rank=2),  # unbatched
    ):
        with pytest.raises(CodegenError, match="no key-tiled panels"):
            dense_ir(bad)


def _per_call(monkeypatch: pytest.MonkeyPatch, limit: int = 4096) -> geode.Model:
    """``model("pad")`` (a symbolic key length) with the key-tiled body beside the row
    panels, taken past ``limit`` bytes of a row panel's scores (forced low: the body runs
    from 33 keys with as many query rows), panels of 8 rows, blocks of 16 keys."""
    monkeypatch.setattr(profit, "online_limit", lambda spec: limit)
    monkeypatch.setattr(profit, "ONLINE_ROWS", 8)
    monkeypatch.setattr(profit, "ONLINE_KEYS", 16)
    return geode.compile(model("pad"), session=geode.Session(), model_cache=False, num_threads=2)


def test_a_symbolic_length_chooses_per_call(monkeypatch):
    """One compiled model: at 16 keys the row-panel body (the bits of the row-panel path
    alone), at 48 and 70 the key-tiled one (the bits of the key-tiled form forced; the two
    forms' bits differ, so the match says which body ran); both near float64."""
    both = _per_call(monkeypatch)
    line = _line(both)
    assert "chosen per call: row panels below 33 keys, key-tiled from 33" in line, line
    note = "one entry: row panels below 33 keys; key-tiled body compiled on the first call from 33"
    assert note in both.explain()
    assert len(dense_kernels(both)) == 1
    assert "label %key_tiled" in dense_kernels(both)[0].source
    tiled, rows = compile_with(model("pad"), True), compile_with(model("pad"), False)
    for s, same in ((16, rows), (32, rows), (33, tiled), (70, tiled)):
        feeds = feeds_for("pad", "float32", 2, 3, s, 8, s)
        got = both.run(feeds)["y"]
        np.testing.assert_array_equal(got, same.run(feeds)["y"])
        np.testing.assert_allclose(got, reference("pad", feeds), rtol=2e-5, atol=2e-5)
        if s > 32:
            assert not np.array_equal(got, rows.run(feeds)["y"])


def test_the_per_call_choice_without_the_body(monkeypatch):
    """The switch off, or a form the kernel cannot run: the row panels alone, as before."""
    monkeypatch.setattr(epilogues, "ONLINE_PER_CALL", False)
    line = _line(_per_call(monkeypatch))
    assert line.endswith(
        "row panels: the key length is symbolic (the key-tiled form pays on long rows only)"
    ), line
    monkeypatch.setattr(epilogues, "ONLINE_PER_CALL", True)
    assert "key_tiled" not in dense_kernels(compile_with(model("pad"), False))[0].source
    t = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(n, t, d) for n, d in (("q", "BHSD"), ("kt", "BHDS"))]
    ins.append(helper.make_tensor_value_info("v", t, list("BHSD")))
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["sc"]),
        helper.make_node("Softmax", ["sc"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    out = [helper.make_tensor_value_info("y", t, list("BHSD"))]
    graph = helper.make_graph(nodes, "a", ins, out)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = geode.compile(proto, session=geode.Session(), model_cache=False)
    assert "; not key-tiled per call: no per-element op before the softmax" in _line(m)
    assert "key_tiled" not in dense_kernels(m)[0].source


def test_the_per_call_entry_saves_and_loads(monkeypatch, tmp_path):
    both = _per_call(monkeypatch)
    both.save(tmp_path / "a.geode")
    back = geode.load(tmp_path / "a.geode")
    for s in (16, 48):
        feeds = feeds_for("pad", "float32", 1, 2, s, 8, s)
        np.testing.assert_array_equal(back.run(feeds)["y"], both.run(feeds)["y"])


def test_the_entry_refuses_a_key_tiled_body_of_other_arguments():
    from geode.codegen.backends.llvm.attention_tiled import OnlinePanels
    from geode.codegen.backends.llvm.dense import dense_ir, tiled_ir
    from geode.errors import CodegenError

    body = _spec(OnlinePanels(8, 16, 1), name="d_tiled", epilogue="ep2")
    entry = _spec(None, tiled=body, tiled_limit=4096)
    ir = dense_ir(entry)
    assert "@d.tiled_fn = external global ptr" in ir and "load atomic ptr, ptr @d.tiled_fn" in ir
    assert "@ep2" not in ir and "d_tiled" not in ir  # the body is a module of its own
    body_ir = tiled_ir(entry)
    assert "declare i32 @ep2(ptr, ptr, ptr)" in body_ir and "define i32 @d_tiled(" in body_ir
    assert "tiled_fn" not in body_ir
    for bad in (
        _spec(None, tiled=dataclasses.replace(body, a_rank=3), tiled_limit=1),
        _spec(None, tiled=dataclasses.replace(body, online=None), tiled_limit=1),
        _spec(None, tiled=dataclasses.replace(body, name="x"), tiled_limit=1),
        _spec(OnlinePanels(8, 16, 1), tiled=body, tiled_limit=1),
    ):
        with pytest.raises(CodegenError, match="key-tiled body"):
            dense_ir(bad)


_PER_CALL: list = []


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    s=st.integers(1, 70),
    d=st.integers(1, 16),
    seed=st.integers(0, 1000),
)
def test_random_lengths_choose_per_call(b, h, s, d, seed):
    """Any length: below 33 keys the row panels' bits, from 33 the key-tiled form's."""
    if not _PER_CALL:
        with pytest.MonkeyPatch.context() as mp:
            _PER_CALL.append(_per_call(mp))
        _PER_CALL.extend([compile_with(model("pad"), True), compile_with(model("pad"), False)])
    both, tiled, rows = _PER_CALL
    feeds = feeds_for("pad", "float32", b, h, s, d, seed)
    got = both.run(feeds)["y"]
    np.testing.assert_array_equal(got, (tiled if s >= 33 else rows).run(feeds)["y"])
    np.testing.assert_allclose(got, reference("pad", feeds), rtol=2e-5, atol=2e-5)


def test_the_per_call_entry_compiles_in_the_background(monkeypatch, tmp_path, llvm_runs):
    """The entry that chooses per call is started on the background LLVM threads at the
    schedule stage (off the compile's critical path) and claimed at emit: compiled once,
    nothing left pending; its key-tiled body is neither started nor compiled
    (``test_lazy_tiled.py``: it is, on the first long call); right on long rows."""
    from geode.codegen.backends.llvm import background

    started, compiled = llvm_runs
    before = background.pending()
    monkeypatch.setattr(profit, "online_limit", lambda spec: 4096)
    monkeypatch.setattr(profit, "ONLINE_ROWS", 8)
    monkeypatch.setattr(profit, "ONLINE_KEYS", 16)
    m = geode.compile(
        model("pad"), session=geode.Session(), model_cache=False, cache_dir=str(tmp_path)
    )
    entry = [ir for ir in started if "label %key_tiled" in ir]
    assert len(entry) == 1 and compiled.count(entry[0]) == 1
    assert not [ir for ir in started + compiled if "_tiled.par" in ir]
    assert entry[0] in dense_kernels(m)[0].source
    assert background.pending() == before
    feeds = feeds_for("pad", "float32", 2, 3, 70, 8, 70)
    np.testing.assert_allclose(m.run(feeds)["y"], reference("pad", feeds), rtol=2e-5, atol=2e-5)
