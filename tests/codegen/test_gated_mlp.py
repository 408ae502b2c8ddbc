"""A gated MLP as one dense step (codegen/epilogues.py, fusion/epilogue.py: sibling_gemm,
store_adds; fusion/profit.py: sibling_plan, store_plan; llvm/dense.py): the gate
GEMM's epilogue reads the up GEMM's product, which is computed per panel from the same
rows of A (never in memory), and the residual Add after the down GEMM is its starting
value. Checked against numpy (float64), against the unfused plan bit for bit, and across
thread counts bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geode
from geode.runtime import native

RNG = np.random.default_rng(38)
pytestmark = pytest.mark.skipif(
    native.pool_info()["gemm_packed_isa"] < 1, reason="the packed kernel needs AVX2 + FMA"
)
OFF = {"sibling_gemms": False, "residual_epilogues": False}


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _weights(k: int, n: int) -> dict[str, np.ndarray]:
    s, t = np.float32(1 / np.sqrt(k)), np.float32(1 / np.sqrt(n))
    return {
        "wg": _rand(k, n) * s,
        "wu": _rand(k, n) * s,
        "wd": _rand(n, k) * t,
        "gamma": np.float32(1) + np.float32(0.1) * _rand(k),
    }


def _gated(
    w: dict[str, np.ndarray],
    norm: bool = True,
    residual: bool = True,
    bias: object = None,
    up_first: bool = False,
) -> geode.Graph:
    """[RMSNorm] -> silu(x @ Wg) * (x @ Wu) -> @ Wd [+ x] [+ bias], as LLaMA writes it."""
    k = w["wg"].shape[0]
    g = geode.Graph("gated_mlp")
    x = g.input("x", ["B", "S", k], np.float32)
    h = x
    if norm:
        axes = g.constant(np.array([-1], np.int64), name="axes")
        ms = g.op("ReduceMean", g.op("Mul", x, x), axes, keepdims=1)
        inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, g.constant(np.float32(1e-6)))))
        h = g.op("Mul", g.op("Mul", x, inv), g.constant(w["gamma"], name="gamma"))
    if up_first:  # the graph's order: the planner decides gate's epilogue first anyway
        up = g.op("MatMul", h, g.constant(w["wu"], name="wu"))
        gate = g.op("MatMul", h, g.constant(w["wg"], name="wg"))
    else:
        gate = g.op("MatMul", h, g.constant(w["wg"], name="wg"))
        up = g.op("MatMul", h, g.constant(w["wu"], name="wu"))
    act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
    y = g.op("MatMul", act, g.constant(w["wd"], name="wd"))
    if residual:
        y = g.op("Add", x, y)
    if bias is not None:
        y = g.op("Add", y, g.constant(bias, name="bias"))
    g.output(y, names=["y"])
    return g


def _want(x: np.ndarray, w: dict, norm: bool = True, residual: bool = True) -> np.ndarray:
    x64 = x.astype(np.float64)
    h = x64
    if norm:
        h = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w["gamma"]
    gate, up = h @ w["wg"], h @ w["wu"]
    y = (gate / (1 + np.exp(-gate)) * up) @ w["wd"]
    return y + x64 if residual else y


def _close(got: np.ndarray, want: np.ndarray) -> None:
    scale = float(np.abs(want).max()) or 1.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


def _dense(model) -> list:
    return [k for k in model.kernels if k.kind == "dense"]


def _compile(g: geode.Graph, threads: int, **opts) -> geode.Model:
    """Without the norm's row scale folded into the GEMMs (``test_row_scale.py``), so the
    plans compared bit for bit here differ only in the sibling and the residual."""
    opts.setdefault("row_scale_gemms", False)
    return geode.compile(g, session=geode.Session(), model_cache=False, num_threads=threads, **opts)


W = _weights(40, 37)


def test_the_gated_mlp_is_one_dense_step_after_the_norm():
    """RMSNorm, then one dense step: gate and up GEMMs, SiLU, the product, the down GEMM
    and the residual; up's product and the down GEMM's result never a step's output.
    (With ``row_scale_gemms``, the norm is folded into the dense step too:
    ``tests/compiler/test_row_scale.py``.)"""
    model = _compile(_gated(W), 2)
    (dense,) = _dense(model)
    assert len(model.kernels) == 2, model.explain()
    ops = [n.op_type for n in dense.ops]
    assert ops == ["MatMul", "MatMul", "Sigmoid", "Mul", "Mul", "MatMul", "Add"], ops
    assert [n.name for n in dense.ops if n.op_type == "MatMul"][1] in model.explain()
    x = _rand(2, 9, 40)
    _close(model(x=x)["y"], _want(x, W))


def test_up_before_gate_in_the_graph_is_still_one_step():
    """With up first in graph order, its epilogue would hoist SiLU(gate): gate's is
    decided first instead, with up as its sibling."""
    g = _gated(W, up_first=True)
    model = _compile(g, 2)
    (dense,) = _dense(model)
    assert len(model.kernels) == 2, model.explain()
    assert [n.op_type for n in dense.ops][:3] == ["MatMul", "MatMul", "Sigmoid"]
    assert "wg" in next(t for t in model.explain().splitlines() if "weights:" in t).split(";")[0]
    x = _rand(2, 9, 40)
    got = model(x=x)["y"]
    _close(got, _want(x, W))
    np.testing.assert_array_equal(got, _compile(g, 2, **OFF)(x=x)["y"])


def test_explain_records_both_decisions_and_their_reasons():
    text = _compile(_gated(W), 2).explain()
    line = next(t for t in text.splitlines() if "per panel beside" in t)
    assert "saves" in line and "kernel launch" in line
    assert "summed into" in line and "panels" in line
    assert "beside it U:" in text and "summed into the second GEMM's panels" in text
    off = _compile(_gated(W), 2, **OFF).explain()
    assert "per panel beside" not in off and "summed into" not in off


@pytest.mark.parametrize("rows", [1, 7, 8, 31, 32, 65, 129, 700, 2048])
def test_rows_match_numpy_the_unfused_plan_and_one_thread(rows):
    """Every row split the entry takes (one row, a panel per thread, one panel of all rows,
    64-row panels on the pool): within 1e-5 of numpy, and the same bits as the unfused
    plan and as one thread (the packed kernel sums each element in one order)."""
    x = _rand(1, rows, 40)
    g = _gated(W)
    got = _compile(g, 2)(x=x)["y"]
    _close(got, _want(x, W))
    np.testing.assert_array_equal(got, _compile(g, 2, **OFF)(x=x)["y"])
    np.testing.assert_array_equal(got, _compile(g, 1)(x=x)["y"])


def test_each_panel_makes_three_packed_products_in_one_launch():
    from geode.codegen.backends.llvm.dense import BIG_ROWS

    model = _compile(_gated(W), 2)
    x = _rand(4, 512, 40)
    model(x=x)
    before = native.pool_info()
    model(x=x)
    after = native.pool_info()
    calls = after["gemm_packed_calls"] - before["gemm_packed_calls"]
    assert calls == 3 * (4 * 512 // BIG_ROWS), calls
    if native.get_num_threads() >= 2:
        # the norm's kernel and the dense step
        assert after["launches"] - before["launches"] <= 2


@pytest.mark.parametrize("norm,residual", [(False, True), (True, False), (False, False)])
def test_without_the_norm_or_the_residual(norm, residual):
    g = _gated(W, norm, residual)
    model = _compile(g, 2)
    (dense,) = _dense(model)
    assert "MatMul" in [n.op_type for n in dense.ops][1:2]
    assert ("Add" in [n.op_type for n in dense.ops]) == residual
    x = _rand(3, 11, 40)
    got = model(x=x)["y"]
    _close(got, _want(x, W, norm, residual))
    np.testing.assert_array_equal(got, _compile(g, 2, **OFF)(x=x)["y"])


def test_up_read_elsewhere_stays_apart_with_its_reason():
    """up's product also a graph output: not computed per panel, the reason recorded."""
    g = _gated(W, norm=False)
    up = next(n for n in g.nodes if n.op_type == "MatMul" and n.inputs[1].name == "wu")
    g.output(up.outputs[0], names=["up"])
    model = _compile(g, 2)
    assert "product is read outside the epilogue" in model.explain()
    x = _rand(2, 5, 40)
    out = model(x=x)
    _close(out["y"], _want(x, W, norm=False))
    _close(out["up"], x.astype(np.float64) @ W["wu"])


def test_a_bias_after_the_down_gemm_is_added_in_its_store():
    """A bias ``[D]`` right after the down GEMM is added to its sums as it stores them
    (tests/codegen/test_store_adds.py has the rest)."""
    bias = _rand(40)
    g = _gated(W, norm=False, residual=False, bias=bias)
    model = _compile(g, 2)
    assert "summed into the second GEMM's panels" in model.explain()
    (dense,) = _dense(model)
    assert [n.op_type for n in dense.ops][-2:] == ["MatMul", "Add"]
    x = _rand(2, 5, 40)
    got = model(x=x)["y"]
    _close(got, _want(x, W, norm=False, residual=False) + bias)
    np.testing.assert_array_equal(got, _compile(g, 2, **OFF)(x=x)["y"])


def test_a_bias_after_the_residual_stays_apart_with_its_reason():
    """``(x + down) + bias``: the residual first, then the bias; the store adds a bias
    before the residual only (the other order has other bits), so both stay apart."""
    bias = _rand(40)
    g = _gated(W, norm=False, residual=True, bias=bias)
    model = _compile(g, 2)
    assert "the first Add after the second product is not a bias of D values" in model.explain()
    x = _rand(2, 5, 40)
    _close(model(x=x)["y"], _want(x, W, norm=False) + bias)


def test_a_residual_that_is_another_products_result():
    """``act @ Wd + x @ W2``: the Add is the down GEMM's residual, so the other MatMul
    cannot take it as its epilogue too (it runs plain, before)."""
    w2 = _rand(40, 40)
    g = _gated(W, norm=False, residual=False)
    y = g.outputs[0]
    x = g.inputs[0]
    g.outputs.clear()
    g.output(g.op("Add", y, g.op("MatMul", x, g.constant(w2, name="w2"))), names=["z"])
    model = _compile(g, 2)
    assert "summed into" in model.explain()
    (dense,) = _dense(model)
    assert [n.op_type for n in dense.ops][-1] == "Add"
    xs = _rand(2, 9, 40)
    got = model(x=xs)["z"]
    _close(got, _want(xs, W, norm=False, residual=False) + xs.astype(np.float64) @ w2)
    np.testing.assert_array_equal(got, _compile(g, 2, **OFF)(x=xs)["z"])


def test_not_packed_keeps_up_apart():
    model = _compile(_gated(W), 2, packed_weights=False)
    assert "needs both weights packed once" in model.explain()
    assert len(model.kernels) > 2
    x = _rand(2, 5, 40)
    _close(model(x=x)["y"], _want(x, W))


def test_model_file_round_trip(tmp_path):
    model = _compile(_gated(W), 2)
    x = _rand(2, 33, 40)
    want = model(x=x)["y"]
    path = tmp_path / "gated.geode"
    model.save(path)
    loaded = geode.load(path, session=geode.Session())
    np.testing.assert_array_equal(loaded(x=x)["y"], want)
    assert len(_dense(loaded)) == 1


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 300),
    k=st.integers(1, 48),
    n=st.integers(1, 50),
    norm=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_random_shapes_match_numpy_and_the_unfused_plan(rows, k, n, norm, threads):
    w = _weights(k, n)
    g = _gated(w, norm)
    model = _compile(g, threads)
    x = _rand(1, rows, k)
    got = model(x=x)["y"]
    _close(got, _want(x, w, norm))
    np.testing.assert_array_equal(got, _compile(g, threads, **OFF)(x=x)["y"])
