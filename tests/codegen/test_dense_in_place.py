"""The dense entry's GEMM writing an elementwise epilogue's output in place (DenseSpec.in_place)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import geode
import geode.codegen.dense as dense_codegen
from geode.codegen.backends.llvm.dense import DenseSpec, InnerArg, OuterArg, dense_ir
from geode.codegen.dense import DenseKernel
from geode.errors import CodegenError

RNG = np.random.default_rng(11)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _bias_relu(k: int, n: int, w: np.ndarray | None = None, b: np.ndarray | None = None):
    g = geode.Graph("bias_relu")
    x = g.input("x", ["M", k])
    w = _rand(k, n) if w is None else w
    b = _rand(n) if b is None else b
    y = g.op("Add", g.op("MatMul", x, g.constant(w, "w")), g.constant(b, "b"))
    g.output(g.op("Relu", y), names=["y"])
    return g


def _dense(model):
    found = [k for k in model.kernels if k.kind == "dense"]
    assert len(found) == 1, model.explain()
    return found[0]


def _compile(g, **opts):
    return geode.compile(g, model_cache=False, progress=0, **opts)


def _runs(g, feeds, monkeypatch, **opts):
    """The fused model's outputs in place, through the scratch panel, and the reference's."""
    fused = _compile(g, **opts)
    got = fused.run(feeds)
    with monkeypatch.context() as mp:
        mp.setattr(dense_codegen, "_in_place", lambda *a: -1)
        scratch = _compile(g, **opts).run(feeds)
    want = _compile(g, codegen=False).run(feeds)
    return fused, got, scratch, want


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("rows,threads", [(5, 1), (300, 2), (1100, 2), (1100, 1)])
def test_bias_relu_is_written_in_place_with_the_same_bits(monkeypatch, packed, rows, threads):
    """A few rows, a panel per thread, and 64-row panels on the pool (with a short last
    one): the GEMM's sums stored in the output and rewritten there give the bits of the
    scratch panel's path, and the reference's values; explain() says so."""
    g = _bias_relu(24, 40)
    feeds = {"x": _rand(rows, 24)}
    fused, got, scratch, want = _runs(
        g, feeds, monkeypatch, num_threads=threads, packed_weights=packed
    )
    assert "rewrites them in place" in fused.explain()
    np.testing.assert_array_equal(got["y"], scratch["y"])
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 700), k=st.integers(1, 40), n=st.integers(1, 50))
def test_random_shapes_match_the_reference(rows, k, n):
    g = _bias_relu(k, n)
    feeds = {"x": _rand(rows, k)}
    got = _compile(g, num_threads=2).run(feeds)["y"]
    want = _compile(g, codegen=False).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_an_output_over_a_falls_back_to_the_scratch_panel():
    """The output passed as A itself (N == K): every panel re-reads its rows of A while its
    GEMM runs, so the entry takes the scratch panel; the result is the product of A's values
    before the call (each panel reads only its own rows, then writes them)."""
    w, b = _rand(96, 96), _rand(96)
    model = _compile(_bias_relu(96, 96, w, b), num_threads=2, packed_weights=False)
    x = _rand(700, 96)
    want = model.run({"x": x})["y"]
    assert "rewrites them in place" in model.explain()
    (step,) = model.plan.steps
    cells = [c.cell_contents for c in step.fn.__closure__ or ()]
    (kernel,) = [c for c in cells if isinstance(c, DenseKernel)]
    assert kernel.in_place
    a = x.copy()
    kernel.call((a, w, b, a), (2,))
    np.testing.assert_array_equal(a, want)


def _not_in_place(g, feeds):
    model = _compile(g, num_threads=2)
    assert "rewrites them in place" not in model.explain()
    got = model.run(feeds)
    want = _compile(g, codegen=False).run(feeds)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5, err_msg=key)


def test_a_reducing_epilogue_keeps_the_scratch_panel():
    g = geode.Graph("softmax")
    x = g.input("x", ["M", 16])
    y = g.op("Softmax", g.op("MatMul", x, g.constant(_rand(16, 24), "w")), axis=-1)
    g.output(y, names=["y"])
    _not_in_place(g, {"x": _rand(300, 16)})


def test_a_full_input_keeps_the_scratch_panel():
    """A residual of the product's shape may be stored where the output goes: it is read
    after the GEMM would have overwritten it."""
    g = geode.Graph("residual")
    x, r = g.input("x", ["M", 16]), g.input("r", ["M", 24])
    y = g.op("Add", g.op("MatMul", x, g.constant(_rand(16, 24), "w")), r)
    g.output(g.op("Tanh", y), names=["y"])
    _not_in_place(g, {"x": _rand(300, 16), "r": _rand(300, 24)})


def test_two_outputs_keep_the_scratch_panel():
    g = geode.Graph("two")
    x = g.input("x", ["M", 16])
    y = g.op("Add", g.op("MatMul", x, g.constant(_rand(16, 24), "w")), g.constant(_rand(24), "b"))
    g.output(g.op("Tanh", y), g.op("Sigmoid", y), names=["t", "s"])
    _not_in_place(g, {"x": _rand(300, 16)})


def _spec(**kw) -> DenseSpec:
    outer = (OuterArg("row", 1, 4), OuterArg("full", 2, 4))
    inner = (InnerArg(-1, "acc", 4), InnerArg(0, "row", 4), InnerArg(1, "full", 4))
    base = dict(
        name="geode_dense_t",
        dtype="float32",
        a_rank=2,
        b_rank=2,
        outer=outer,
        inner=inner,
        inner_dims=("rows", "cols"),
        epilogue="ep",
        panel_bytes=1 << 16,
        min_rows=8,
    )
    return DenseSpec(**{**base, **kw})


def test_the_entry_refuses_an_in_place_output_it_cannot_use():
    assert "geode_dense_t" in dense_ir(_spec(in_place=1))
    for bad in (dict(in_place=0), dict(in_place=2), dict(in_place=1, b_rank=3, a_rank=3)):
        with pytest.raises(CodegenError, match="in-place"):
            dense_ir(_spec(**bad))
