"""An LSTM cell's step as one dense step (compiler/fusion/summed.py: narrow epilogues and
partner GEMMs; fusion/profit.py: partner_plan; codegen/epilogues.py, codegen/dense.py,
llvm/dense.py): ``gates = x Wx [+ b] + h Wh`` with the gates sliced out of the sum's
columns. The ``h Wh`` GEMM's epilogue is the gates' group on ``W``-column slices of its
panel, and ``x Wx`` is computed per panel from the same rows of ``x`` beside it (never in
memory). The epilogue's ops are the model's, in its order, so the result has the bits of
the unfused plan; checked against numpy (float64) within the float32 sum's bound too."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geode
from geode.compiler.fusion import summed
from geode.runtime import native

RNG = np.random.default_rng(38)
pytestmark = pytest.mark.skipif(
    native.pool_info()["gemm_packed_isa"] < 1, reason="the packed kernel needs AVX2 + FMA"
)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _cell(k1: int, k2: int, hid: int, bias: bool = True, dtype=np.float32) -> tuple:
    """An LSTM cell as torch's ``LSTMCell``-like module exports it: the weights, the graph
    and its numpy twin."""
    n = 4 * hid
    w = {
        "wx": _rand(k1, n, dtype=dtype) / np.sqrt(k1).astype(dtype),
        "wh": _rand(k2, n, dtype=dtype) / np.sqrt(k2).astype(dtype),
        "b": _rand(n, dtype=dtype) if bias else None,
    }
    g = geode.Graph("lstm_cell")
    x = g.input("x", ["B", k1], dtype)
    h = g.input("h", ["B", k2], dtype)
    c = g.input("c", ["B", hid], dtype)
    gx = g.op("MatMul", x, g.constant(w["wx"], name="wx"))
    if bias:
        gx = g.op("Add", gx, g.constant(w["b"], name="b"))
    gates = g.op("Add", gx, g.op("MatMul", h, g.constant(w["wh"], name="wh")))
    axes = g.constant(np.array([1], np.int64), name="axes")
    parts = []
    for i in range(4):
        lo = g.constant(np.array([i * hid], np.int64), name=f"lo{i}")
        hi = g.constant(np.array([(i + 1) * hid], np.int64), name=f"hi{i}")
        parts.append(g.op("Slice", gates, lo, hi, axes))
    i_, f_, g_, o_ = parts
    c2 = g.op(
        "Add",
        g.op("Mul", g.op("Sigmoid", f_), c),
        g.op("Mul", g.op("Sigmoid", i_), g.op("Tanh", g_)),
    )
    h2 = g.op("Mul", g.op("Sigmoid", o_), g.op("Tanh", c2))
    g.output(h2, c2, names=["h2", "c2"])
    return g, w


def _want(w: dict, x, h, c) -> tuple[np.ndarray, np.ndarray]:
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    x, h, c = (v.astype(np.float64) for v in (x, h, c))
    gates = x @ w["wx"].astype(np.float64) + h @ w["wh"].astype(np.float64)
    if w["b"] is not None:
        gates = gates + w["b"]
    i, f, g, o = np.split(gates, 4, axis=1)
    c2 = sig(f) * c + sig(i) * np.tanh(g)
    return sig(o) * np.tanh(c2), c2


def _compile(g: geode.Graph, threads: int = 2, **opts) -> geode.Model:
    return geode.compile(g, session=geode.Session(), model_cache=False, num_threads=threads, **opts)


def _feeds(rows: int, k1: int, k2: int, hid: int, dtype=np.float32) -> dict:
    return {
        "x": _rand(rows, k1, dtype=dtype),
        "h": _rand(rows, k2, dtype=dtype),
        "c": _rand(rows, hid, dtype=dtype),
    }


def _bound(w: dict, f: dict, eps: float) -> float:
    """A float sum bound on the gates (``K1 + K2 + 2`` terms of ``|x||Wx| + |h||Wh|``),
    which the gates' functions (Lipschitz 1) and ``c``'s update (factors at most 1, two
    terms) carry to the outputs at most twice over, plus an ulp per op."""
    k = f["x"].shape[1] + f["h"].shape[1] + 2
    mag = np.abs(f["x"]) @ np.abs(w["wx"]) + np.abs(f["h"]) @ np.abs(w["wh"])
    return float(2 * (k * eps * mag.max() + 16 * eps * (1 + np.abs(f["c"]).max())))


def _dense(model) -> list:
    return [k for k in model.kernels if k.kind == "dense"]


def test_the_cell_is_one_dense_step():
    """Both GEMMs, the bias, the sum and the gates: one dense step, no other kernel; the
    decision and its reason in explain()."""
    g, w = _cell(24, 16, 8)
    model = _compile(g)
    assert len(model.kernels) == 1, model.explain()
    (dense,) = _dense(model)
    assert [n.op_type for n in dense.ops][:2] == ["MatMul", "MatMul"]
    text = model.explain()
    line = next(t for t in text.splitlines() if "per panel beside" in t)
    assert "(its own A)" in line and "kernel launch" in line
    assert "8-column slices" in line
    f = _feeds(5, 24, 16, 8)
    h2, c2 = model(**f).values()
    want = _want(w, **f)
    np.testing.assert_allclose(h2, want[0], atol=_bound(w, f, 2**-24))
    np.testing.assert_allclose(c2, want[1], atol=_bound(w, f, 2**-24))


@pytest.mark.parametrize("rows", [1, 7, 8, 64, 129, 700])
def test_rows_have_the_bits_of_the_unfused_plan_and_of_one_thread(rows):
    """Every row split the entry takes: the same bits as the GEMMs apart (option off),
    as no epilogue at all, and as one thread (the packed kernel sums each element in one
    order; the epilogue runs the model's ops in its order)."""
    g, w = _cell(40, 24, 16)
    f = _feeds(rows, 40, 24, 16)
    got = list(_compile(g)(**f).values())
    for other in (
        _compile(g, summed_gemms=False),
        _compile(g, dense_epilogues=False),
        _compile(g, 1),
    ):
        for a, b in zip(got, other(**f).values()):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(got, _want(w, **f)):
        np.testing.assert_allclose(a, b, atol=_bound(w, f, 2**-24))


def test_the_option_off_keeps_the_gemm_apart_with_the_narrow_epilogue():
    g, _ = _cell(24, 16, 8)
    model = _compile(g, summed_gemms=False)
    assert len(model.kernels) == 2, model.explain()  # one GEMM apart, the dense step
    assert len(_dense(model)) == 1
    assert "per panel beside" not in model.explain()


def test_column_slices_switched_off_keep_the_group_apart(monkeypatch):
    monkeypatch.setattr(summed, "COLUMN_SLICES", False)
    g, _ = _cell(24, 16, 8)
    model = _compile(g)
    assert not _dense(model), model.explain()
    assert "column slices switched off" in model.explain()


def test_float64_weights_are_not_packed_so_the_partner_stays_apart():
    """float64: the weights are not packed, so no partner (the reason recorded); the
    result is still right."""
    g, w = _cell(12, 20, 4, dtype=np.float64)
    model = _compile(g)
    assert "a partner GEMM needs both weights packed once" in model.explain()
    f = _feeds(6, 12, 20, 4, dtype=np.float64)
    for a, b in zip(model(**f).values(), _want(w, **f)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_a_partner_read_elsewhere_stays_apart_with_its_reason():
    g, w = _cell(24, 16, 8, bias=False)
    mm = next(n for n in g.nodes if n.op_type == "MatMul" and n.inputs[1].name == "wx")
    g.output(mm.outputs[0], names=["gx"])
    model = _compile(g)
    assert "product is read outside the epilogue" in model.explain()
    f = _feeds(3, 24, 16, 8)
    out = model(**f)
    np.testing.assert_allclose(out["gx"], f["x"].astype(np.float64) @ w["wx"], atol=1e-5)
    np.testing.assert_allclose(out["h2"], _want(w, **f)[0], atol=_bound(w, f, 2**-24))


def test_a_weight_that_is_an_input_is_no_partner():
    """``h Wh`` with ``Wh`` fed at run time: not packed once, no partner."""
    g = geode.Graph("cell_input_weight")
    x = g.input("x", ["B", 8], np.float32)
    h = g.input("h", ["B", 8], np.float32)
    wh = g.input("wh", [8, 32], np.float32)
    wx = _rand(8, 32)
    s = g.op("Add", g.op("MatMul", x, g.constant(wx, name="wx")), g.op("MatMul", h, wh))
    g.output(g.op("Tanh", s), names=["y"])
    model = _compile(g)
    assert "per panel beside" not in model.explain()
    f = {"x": _rand(4, 8), "h": _rand(4, 8), "wh": _rand(8, 32)}
    want = np.tanh(f["x"].astype(np.float64) @ wx + f["h"].astype(np.float64) @ f["wh"])
    np.testing.assert_allclose(model(**f)["y"], want, atol=1e-5)


def test_a_slice_with_steps_refuses_the_narrow_epilogue():
    g = geode.Graph("strided")
    x = g.input("x", ["B", 8], np.float32)
    y = g.op("MatMul", x, g.constant(_rand(8, 32), name="w"))
    c = lambda v, n: g.constant(np.array([v], np.int64), name=n)  # noqa: E731
    s = g.op("Slice", y, c(0, "lo"), c(32, "hi"), c(1, "ax"), c(2, "st"))
    g.output(g.op("Tanh", s), names=["z"])
    model = _compile(g)
    assert "steps other than 1" in model.explain()
    x_ = _rand(3, 8)
    want = np.tanh((x_.astype(np.float64) @ g.nodes[0].inputs[1].data)[:, ::2])
    np.testing.assert_allclose(model(x=x_)["z"], want, atol=1e-5)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 80),
    k1=st.integers(1, 40),
    k2=st.integers(1, 40),
    hid=st.integers(1, 24),
    bias=st.booleans(),
    f64=st.booleans(),
)
def test_cells_match_numpy_and_the_unfused_plan(rows, k1, k2, hid, bias, f64):
    """Rows, ``K1 != K2`` (or equal), widths, a bias or none, float32 or float64: within
    the float sum's bound of numpy, and float32's bits those of the GEMMs apart."""
    dtype = np.float64 if f64 else np.float32
    g, w = _cell(k1, k2, hid, bias, dtype)
    f = _feeds(rows, k1, k2, hid, dtype)
    got = list(_compile(g)(**f).values())
    eps = 2.0**-53 if f64 else 2.0**-24
    for a, b in zip(got, _want(w, **f)):
        np.testing.assert_allclose(a, b, rtol=0, atol=_bound(w, f, eps))
    if not f64:
        for a, b in zip(got, _compile(g, summed_gemms=False)(**f).values()):
            np.testing.assert_array_equal(a, b)


def test_a_second_gemm_of_another_dense_op_is_no_partner():
    """``tanh(x W1) W3 + x W2``: ``W3``'s GEMM runs as the second GEMM of ``x W1``'s dense
    op (its ``A`` never in memory), so ``x W2``'s epilogue cannot take it as its partner;
    the result is still right."""
    w1, w2, w3 = _rand(8, 16), _rand(8, 32), _rand(16, 32)
    g = geode.Graph("second_not_partner")
    x = g.input("x", ["B", 8], np.float32)
    t = g.op("Tanh", g.op("MatMul", x, g.constant(w1, name="w1")))
    y = g.op("MatMul", t, g.constant(w3, name="w3"))
    z = g.op("Add", y, g.op("MatMul", x, g.constant(w2, name="w2")))
    g.output(g.op("Tanh", z), names=["z"])
    model = _compile(g, residual_epilogues=False)
    assert "per panel beside" not in model.explain()
    x_ = _rand(5, 8).astype(np.float64)
    want = np.tanh(np.tanh(x_ @ w1) @ w3 + x_ @ w2)
    np.testing.assert_allclose(model(x=x_.astype(np.float32))["z"], want, atol=1e-5)


def test_model_file_round_trip(tmp_path):
    """A saved cell loads as one dense step with the same results (A2 and the packed
    ``Wx`` among its inputs)."""
    g, _ = _cell(24, 16, 8)
    model = _compile(g)
    f = _feeds(9, 24, 16, 8)
    want = model(**f)
    path = tmp_path / "cell.geode"
    model.save(path)
    loaded = geode.load(path, session=geode.Session())
    for name, value in loaded(**f).items():
        np.testing.assert_array_equal(value, want[name])
    assert len(loaded.kernels) == 1 and len(_dense(loaded)) == 1


def test_the_onnx_cell_on_a_file(tmp_path):
    """The cell through ONNX (a Gemm with its bias: decomposed into MatMul + Add) is one
    dense step too."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k, hid = 16, 8
    wx, wh, b = _rand(4 * hid, k), _rand(k, 4 * hid), _rand(4 * hid)
    nodes = [
        helper.make_node("Gemm", ["x", "wx", "b"], ["gx"], transB=1),
        helper.make_node("MatMul", ["h", "wh"], ["gh"]),
        helper.make_node("Add", ["gx", "gh"], ["gates"]),
        helper.make_node("Split", ["gates", "split"], ["i", "f", "g", "o"], axis=1),
        helper.make_node("Sigmoid", ["i"], ["si"]),
        helper.make_node("Sigmoid", ["f"], ["sf"]),
        helper.make_node("Tanh", ["g"], ["tg"]),
        helper.make_node("Sigmoid", ["o"], ["so"]),
        helper.make_node("Mul", ["sf", "c"], ["fc"]),
        helper.make_node("Mul", ["si", "tg"], ["ig"]),
        helper.make_node("Add", ["fc", "ig"], ["c2"]),
        helper.make_node("Tanh", ["c2"], ["tc"]),
        helper.make_node("Mul", ["so", "tc"], ["h2"]),
    ]
    inits = [
        numpy_helper.from_array(wx, "wx"),
        numpy_helper.from_array(wh, "wh"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array([hid] * 4, np.int64), "split"),
    ]
    ins = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", d])
        for n, d in (("x", k), ("h", k), ("c", hid))
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("h2", "c2")]
    graph = helper.make_graph(nodes, "cell", ins, outs, inits)
    path = tmp_path / "cell.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = geode.compile(str(path), session=geode.Session(), model_cache=False)
    f = _feeds(6, k, k, hid)
    w = {"wx": wx.T.copy(), "wh": wh, "b": b}
    got = model(**f)
    want = _want(w, **f)
    np.testing.assert_allclose(got["h2"], want[0], atol=_bound(w, f, 2**-24))
    np.testing.assert_allclose(got["c2"], want[1], atol=_bound(w, f, 2**-24))
    assert len(model.kernels) == 1, model.explain()


def _gru(k: int, hid: int) -> tuple:
    """A GRU cell as torch writes it: both products with their biases, each split into
    three gates (``chunk``), the reset gate scaling ``h``'s candidate part."""
    wi, wh = _rand(k, 3 * hid) / np.float32(4), _rand(hid, 3 * hid) / np.float32(4)
    bi, bh = _rand(3 * hid), _rand(3 * hid)
    g = geode.Graph("gru_cell")
    x = g.input("x", ["B", k], np.float32)
    h = g.input("h", ["B", hid], np.float32)
    gi = g.op("Add", g.op("MatMul", x, g.constant(wi, name="wi")), g.constant(bi, name="bi"))
    gh = g.op("Add", g.op("MatMul", h, g.constant(wh, name="wh")), g.constant(bh, name="bh"))
    sizes = g.constant(np.array([hid] * 3, np.int64), name="sizes")
    ir, iz, i_n = g.op("Split", gi, sizes, n_outputs=3, axis=1)
    hr, hz, h_n = g.op("Split", gh, sizes, n_outputs=3, axis=1)
    r = g.op("Sigmoid", g.op("Add", ir, hr))
    z = g.op("Sigmoid", g.op("Add", iz, hz))
    n = g.op("Tanh", g.op("Add", i_n, g.op("Mul", r, h_n)))
    one = g.constant(np.float32(1), name="one")
    g.output(g.op("Add", g.op("Mul", g.op("Sub", one, z), n), g.op("Mul", z, h)), names=["h2"])

    def want(x_, h_):
        x64, h64 = x_.astype(np.float64), h_.astype(np.float64)
        a, b = x64 @ wi + bi, h64 @ wh + bh
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        r_ = sig(a[:, :hid] + b[:, :hid])
        z_ = sig(a[:, hid : 2 * hid] + b[:, hid : 2 * hid])
        n_ = np.tanh(a[:, 2 * hid :] + r_ * b[:, 2 * hid :])
        return (1 - z_) * n_ + z_ * h64

    return g, want


@pytest.mark.parametrize("rows", [1, 5, 70])
def test_a_gru_cell_is_one_dense_step(rows):
    """Any ``x W + h U`` over the same rows: a GRU cell (Splits, each product with its
    bias, the reset gate between them) is one dense step with the bits of the GEMMs
    apart."""
    g, want = _gru(16, 8)
    model = _compile(g)
    assert len(model.kernels) == 1 and len(_dense(model)) == 1, model.explain()
    x_, h_ = _rand(rows, 16), _rand(rows, 8)
    got = model(x=x_, h=h_)["h2"]
    np.testing.assert_allclose(got, want(x_, h_), atol=1e-5)
    np.testing.assert_array_equal(got, _compile(g, summed_gemms=False)(x=x_, h=h_)["h2"])


def test_the_sum_also_an_output_is_written_by_the_dense_step():
    """The gates' sum read outside too (a graph output): still one dense step, which
    writes its panels of all ``N`` columns beside ``h'`` and ``c'``."""
    g, w = _cell(24, 16, 8)
    total = [n for n in g.nodes if n.op_type == "Add"][1]
    g.output(total.outputs[0], names=["gates"])
    model = _compile(g)
    assert [k.kind for k in model.kernels] == ["dense"], model.explain()
    f = _feeds(70, 24, 16, 8)
    out = model(**f)
    x64, h64 = f["x"].astype(np.float64), f["h"].astype(np.float64)
    np.testing.assert_allclose(
        out["gates"], x64 @ w["wx"] + w["b"] + h64 @ w["wh"], atol=_bound(w, f, 2**-24)
    )
    np.testing.assert_allclose(out["h2"], _want(w, **f)[0], atol=_bound(w, f, 2**-24))
    off = _compile(g, dense_epilogues=False)(**f)
    for name in ("gates", "h2", "c2"):
        np.testing.assert_array_equal(out[name], off[name])
