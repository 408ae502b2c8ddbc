"""A Linear layer's bias (and the residual after it) added by the second GEMM of a dense
step as it stores its sums (fusion/epilogue.py: store_adds, fusion/profit.py: store_plan,
codegen/epilogues.py, llvm/dense.py, runtime/native/sgemm_packed.c): an MLP block
``x + (gelu(LN(x) @ W1 + b1) @ W2 + b2)`` as PyTorch exports it is the norm's kernel and
one dense step. Checked against numpy (float64), against the unfused plan bit for bit,
across thread counts, on random and degenerate shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dense_helpers import close, compile_fresh, dense_kernels, needs_packed, rand
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geode

RNG = np.random.default_rng(83)
pytestmark = needs_packed
OFF = {"residual_epilogues": False}


def _weights(c: int, h: int, bias_shape: tuple | None = None) -> dict[str, np.ndarray]:
    return {
        "w1": rand(RNG, c, h) / np.float32(math.sqrt(max(c, 1))),
        "b1": rand(RNG, h),
        "w2": rand(RNG, h, c) / np.float32(math.sqrt(max(h, 1))),
        "b2": rand(RNG, *(bias_shape or (c,))),
        "gamma": np.float32(1) + np.float32(0.1) * rand(RNG, c),
        "beta": np.float32(0.1) * rand(RNG, c),
    }


def _mlp(w: dict[str, np.ndarray], norm: bool = True, residual: bool = True) -> geode.Graph:
    """[LayerNorm] -> @ W1 + b1 -> GELU (erf) -> @ W2 + b2 [-> + x], PyTorch's export."""
    c = w["w1"].shape[0]
    g = geode.Graph("mlp")
    x = g.input("x", ["B", "S", c], np.float32)
    h = x
    if norm:
        axes = g.constant(np.array([-1], np.int64), name="axes")
        mean = g.op("ReduceMean", x, axes, keepdims=1)
        d = g.op("Sub", x, mean)
        var = g.op("ReduceMean", g.op("Mul", d, d), axes, keepdims=1)
        inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.constant(np.float32(1e-5)))))
        scaled = g.op("Mul", g.op("Mul", d, inv), g.constant(w["gamma"]))
        h = g.op("Add", scaled, g.constant(w["beta"]))
    u = g.op("Add", g.op("MatMul", h, g.constant(w["w1"], name="w1")), g.constant(w["b1"]))
    erf = g.op("Erf", g.op("Div", u, g.constant(np.float32(math.sqrt(2)))))
    act = g.op("Mul", u, g.op("Add", erf, g.constant(np.float32(1))))
    act = g.op("Mul", act, g.constant(np.float32(0.5)))
    y = g.op("Add", g.op("MatMul", act, g.constant(w["w2"], name="w2")), g.constant(w["b2"]))
    if residual:
        y = g.op("Add", x, y)
    g.output(y, names=["y"])
    return g


def _want(x: np.ndarray, w: dict, norm: bool = True, residual: bool = True) -> np.ndarray:
    erf = np.vectorize(math.erf)
    x64 = x.astype(np.float64)
    h = x64
    if norm:
        d = x64 - x64.mean(-1, keepdims=True)
        h = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w["gamma"] + w["beta"]
    u = h @ w["w1"] + w["b1"]
    y = (0.5 * u * (1 + erf(u / math.sqrt(2)))) @ w["w2"] + w["b2"]
    return y + x64 if residual else y


W = _weights(48, 96)


def test_the_block_is_the_norm_and_one_dense_step():
    """Both GEMMs, GELU, the bias and the residual in one dense step after the norm; the
    second product and its sum with the bias never a step's output."""
    model = compile_fresh(_mlp(W))
    assert len(model.kernels) == 2, model.explain()
    (dense,) = dense_kernels(model)
    ops = [n.op_type for n in dense.ops]
    assert ops[0] == "MatMul" and ops[-3:] == ["MatMul", "Add", "Add"], ops
    x = rand(RNG, 2, 9, 48)
    close(model(x=x)["y"], _want(x, W))


def test_unfused_it_is_three_steps():
    model = compile_fresh(_mlp(W), **OFF)
    assert len(model.kernels) == 3, model.explain()
    assert "summed into" not in model.explain()


def test_explain_records_the_decision_and_its_reason():
    text = compile_fresh(_mlp(W)).explain()
    line = next(t for t in text.splitlines() if "summed into" in t and "saves" in t)
    assert "kernel launch" in line and " and " in line  # the bias and the residual Adds
    assert "summed into the second GEMM's panels" in text  # the kernel's weights line


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 31, 65, 196, 700, 2048])
def test_rows_match_numpy_the_unfused_plan_and_one_thread(rows, residual):
    """Every row split of the entry: within tolerance of numpy, the same bits as the
    unfused plan (the bias, then the residual, added to each sum in that order) and as
    one thread."""
    g = _mlp(W, residual=residual)
    x = rand(RNG, 1, rows, 48)
    got = compile_fresh(g)(x=x)["y"]
    close(got, _want(x, W, residual=residual))
    np.testing.assert_array_equal(got, compile_fresh(g, **OFF)(x=x)["y"])
    np.testing.assert_array_equal(got, compile_fresh(g, 1)(x=x)["y"])


def test_a_bias_of_shape_1_1_d():
    w = _weights(24, 40, bias_shape=(1, 1, 24))
    g = _mlp(w, norm=False)
    model = compile_fresh(g)
    assert "summed into the second GEMM's panels" in model.explain()
    x = rand(RNG, 3, 5, 24)
    got = model(x=x)["y"]
    close(got, _want(x, w, norm=False))
    np.testing.assert_array_equal(got, compile_fresh(g, **OFF)(x=x)["y"])


def test_the_biased_sum_read_elsewhere_stays_apart_with_its_reason():
    """The bias Add's result also a graph output: the residual is not taken with it."""
    g = _mlp(W, norm=False)
    biased = [n for n in g.nodes if n.op_type == "Add"][-2]
    g.output(biased.outputs[0], names=["biased"])
    model = compile_fresh(g)
    assert "the bias Add's result is read more than once" in model.explain()
    x = rand(RNG, 2, 5, 48)
    out = model(x=x)
    close(out["y"], _want(x, W, norm=False))
    close(out["biased"], _want(x, W, norm=False, residual=False))


def test_not_packed_keeps_them_apart():
    model = compile_fresh(_mlp(W), packed_weights=False)
    assert "summed into" not in model.explain()
    x = rand(RNG, 2, 5, 48)
    close(model(x=x)["y"], _want(x, W))


def test_model_file_round_trip(tmp_path):
    model = compile_fresh(_mlp(W))
    x = rand(RNG, 2, 33, 48)
    want = model(x=x)["y"]
    path = tmp_path / "mlp.geode"
    model.save(path)
    loaded = geode.load(path, session=geode.Session())
    np.testing.assert_array_equal(loaded(x=x)["y"], want)
    assert len(dense_kernels(loaded)) == 1


def test_no_rows():
    g = _mlp(W, norm=False)
    got = compile_fresh(g)(x=rand(RNG, 2, 0, 48))["y"]
    assert got.shape == (2, 0, 48)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 300),
    c=st.integers(1, 40),
    h=st.integers(1, 50),
    norm=st.booleans(),
    residual=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_random_shapes_match_numpy_and_the_unfused_plan(rows, c, h, norm, residual, threads):
    w = _weights(c, h)
    g = _mlp(w, norm, residual)
    x = rand(RNG, 1, rows, c)
    got = compile_fresh(g, threads)(x=x)["y"]
    close(got, _want(x, w, norm, residual))
    np.testing.assert_array_equal(got, compile_fresh(g, threads, **OFF)(x=x)["y"])
