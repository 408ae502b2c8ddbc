"""A dense step whose GEMM reads its A through a Transpose of the last two axes in place
(fusion/epilogue.py: transposed_a, fusion/profit.py: transpose_plan, codegen/epilogues.py,
llvm/dense.py, runtime/native/sgemm_packed.c: geode_sgemm_packed_at): an MLP-Mixer's
token mixing, ``x + (gelu(x^T @ W1 + b1) @ W2 + b2)^T``, has no Transpose kernel. Checked
against numpy (float64), against the plan with the Transpose's copy bit for bit, across
thread counts, on random and degenerate shapes (row tiles that cross a batch)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dense_helpers import close, compile_fresh, dense_kernels, needs_packed, rand
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geode

RNG = np.random.default_rng(196)
pytestmark = needs_packed
OFF = {"transposed_operands": False}


def _weights(t: int, h: int) -> dict[str, np.ndarray]:
    return {
        "w1": rand(RNG, t, h) / np.float32(math.sqrt(max(t, 1))),
        "b1": rand(RNG, h),
        "w2": rand(RNG, h, t) / np.float32(math.sqrt(max(h, 1))),
        "b2": rand(RNG, t),
    }


def _mixing(w: dict[str, np.ndarray], c: int, second: bool = True) -> geode.Graph:
    """x [B, T, C] -> Transpose -> @ W1 + b1 -> GELU [-> @ W2 + b2 -> Transpose -> + x]."""
    t = w["w1"].shape[0]
    g = geode.Graph("token_mixing")
    x = g.input("x", ["B", t, c], np.float32)
    xt = g.op("Transpose", x, perm=[0, 2, 1])
    u = g.op("Add", g.op("MatMul", xt, g.constant(w["w1"], name="w1")), g.constant(w["b1"]))
    erf = g.op("Erf", g.op("Div", u, g.constant(np.float32(math.sqrt(2)))))
    y = g.op("Mul", u, g.op("Add", erf, g.constant(np.float32(1))))
    y = g.op("Mul", y, g.constant(np.float32(0.5)))
    if second:
        y = g.op("Add", g.op("MatMul", y, g.constant(w["w2"], name="w2")), g.constant(w["b2"]))
        y = g.op("Add", x, g.op("Transpose", y, perm=[0, 2, 1]))
    g.output(y, names=["y"])
    return g


def _want(x: np.ndarray, w: dict, second: bool = True) -> np.ndarray:
    erf = np.vectorize(math.erf)
    x64 = x.astype(np.float64)
    u = x64.transpose(0, 2, 1) @ w["w1"] + w["b1"]
    y = 0.5 * u * (1 + erf(u / math.sqrt(2))) if u.size else u
    if not second:
        return y
    return x64 + (y @ w["w2"] + w["b2"]).transpose(0, 2, 1)


W = _weights(28, 24)


@pytest.mark.parametrize("second", [True, False])
def test_the_transpose_is_read_in_place(second):
    """The Transpose is the dense step's first op, no kernel of its own: one kernel
    fewer than with the copy."""
    g = _mixing(W, 40, second)
    model = compile_fresh(g)
    (dense,) = dense_kernels(model)
    assert [n.op_type for n in dense.ops][:2] == ["Transpose", "MatMul"]
    assert len(model.kernels) == len(compile_fresh(g, **OFF).kernels) - 1, model.explain()
    x = rand(RNG, 3, 28, 40)
    close(model(x=x)["y"], _want(x, W, second))


def test_explain_records_the_decision_and_its_reason():
    text = compile_fresh(_mixing(W, 40)).explain()
    line = next(t for t in text.splitlines() if "read in place by" in t)
    assert "(A transposed)" in line and "saves" in line and "kernel launch" in line
    assert "A read in place through" in text  # the kernel's weights line
    assert "read in place" not in compile_fresh(_mixing(W, 40), **OFF).explain()


@pytest.mark.parametrize("batch,c", [(1, 256), (8, 256), (4, 196), (3, 13), (2, 1), (1, 700)])
def test_sizes_match_numpy_the_copy_and_one_thread(batch, c):
    """Every row split (one panel of all rows, 64-row panels whose row tiles cross a
    batch when ``C`` is not a multiple of their rows): the same bits as the plan that
    copies the Transpose out, and as one thread."""
    g = _mixing(W, c)
    x = rand(RNG, batch, 28, c)
    got = compile_fresh(g)(x=x)["y"]
    close(got, _want(x, W))
    np.testing.assert_array_equal(got, compile_fresh(g, **OFF)(x=x)["y"])
    np.testing.assert_array_equal(got, compile_fresh(g, 1)(x=x)["y"])


def test_degenerate_dims():
    """No batch, no rows, one token."""
    g = _mixing(W, 40)
    model = compile_fresh(g)
    assert model(x=rand(RNG, 0, 28, 40))["y"].shape == (0, 28, 40)
    assert compile_fresh(_mixing(W, 0))(x=rand(RNG, 2, 28, 0))["y"].shape == (2, 28, 0)
    w1 = _weights(1, 5)
    g1 = _mixing(w1, 9)
    x = rand(RNG, 2, 1, 9)
    got = compile_fresh(g1)(x=x)["y"]
    close(got, _want(x, w1))
    np.testing.assert_array_equal(got, compile_fresh(g1, **OFF)(x=x)["y"])


def test_a_transpose_of_other_axes_is_copied_with_its_reason():
    g = geode.Graph("other_perm")
    x = g.input("x", [6, 5, 7], np.float32)
    xt = g.op("Transpose", x, perm=[1, 0, 2])  # [5, 6, 7]
    y = g.op("Relu", g.op("MatMul", xt, g.constant(rand(RNG, 7, 9), name="w")))
    g.output(y, names=["y"])
    model = compile_fresh(g)
    assert "does not swap the last two axes alone" in model.explain()
    xs = rand(RNG, 6, 5, 7)
    w = g.nodes[1].inputs[1].data
    close(model(x=xs)["y"], np.maximum(xs.transpose(1, 0, 2).astype(np.float64) @ w, 0))


def test_a_transpose_read_twice_is_copied_with_its_reason():
    g = _mixing(W, 12, second=False)
    xt = next(n for n in g.nodes if n.op_type == "Transpose").outputs[0]
    g.output(xt, names=["xt"])
    model = compile_fresh(g)
    assert "the Transpose's result is read by more than the MatMul" in model.explain()
    x = rand(RNG, 2, 28, 12)
    out = model(x=x)
    close(out["y"], _want(x, W, second=False))
    np.testing.assert_array_equal(out["xt"], x.transpose(0, 2, 1))


def test_not_packed_copies_it():
    model = compile_fresh(_mixing(W, 40), packed_weights=False)
    assert "read in place by" not in model.explain()
    x = rand(RNG, 2, 28, 40)
    close(model(x=x)["y"], _want(x, W))


def test_model_file_round_trip(tmp_path):
    model = compile_fresh(_mixing(W, 40))
    x = rand(RNG, 3, 28, 40)
    want = model(x=x)["y"]
    path = tmp_path / "mixing.geode"
    model.save(path)
    loaded = geode.load(path, session=geode.Session())
    np.testing.assert_array_equal(loaded(x=x)["y"], want)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(1, 4),
    t=st.integers(1, 40),
    c=st.integers(1, 70),
    h=st.integers(1, 30),
    second=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_random_shapes_match_numpy_and_the_copy(batch, t, c, h, second, threads):
    w = _weights(t, h)
    g = _mixing(w, c, second)
    x = rand(RNG, batch, t, c)
    got = compile_fresh(g, threads)(x=x)["y"]
    close(got, _want(x, w, second))
    np.testing.assert_array_equal(got, compile_fresh(g, threads, **OFF)(x=x)["y"])
