"""Reduce trees compiled: chained reductions over different axes run as one kernel and
match the reference engine (numpy), on fixed and random shapes, symbolic dims, float32
and float64; the chains that must stay apart do, with the reason in explain()."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geode

NP = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min}


def fused(model):
    return [k for k in model.kernels if k.engine == "aicore"]


def chain(shape, levels, op="ReduceSum", keep=1, dtype="float32", square=False, also_mid=False):
    """``x`` reduced by ``op`` over each entry of ``levels`` in turn (axes of the value
    at that point); optionally squared first, and the first level's result an output."""
    gr = geode.Graph("chain")
    x = gr.input("x", shape, dtype)
    ints = lambda v: gr.constant(np.array(v, np.int64))  # noqa: E731
    v = gr.op("Mul", x, x) if square else x
    outs, names = [], []
    for k, axes in enumerate(levels):
        v = gr.op(op, v, ints(axes), keepdims=keep)
        if k == 0 and also_mid:
            outs.append(v)
            names.append("mid")
    gr.output(*outs, v, names=[*names, "y"])
    return gr


def reference(x, levels, op="ReduceSum", keep=1, square=False):
    v = x * x if square else x
    mids = []
    for axes in levels:
        v = NP[op](v, axis=tuple(axes), keepdims=bool(keep))
        mids.append(v)
    return mids


def tol(dtype):
    return (2e-5, 1e-5) if dtype == "float32" else (1e-12, 1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
@pytest.mark.parametrize("keep", [0, 1])
def test_two_level_chain_is_one_kernel_on_symbolic_rows(dtype, op, keep):
    model = geode.compile(chain(["N", 64, 49], [[2], [1]], op, keep, dtype))
    (k,) = fused(model)
    assert "parallel(" in k.trace and "compute_at" in k.trace
    rng = np.random.default_rng(0)
    rtol, atol = tol(dtype)
    for n in (1, 7, 33):
        x = rng.standard_normal((n, 64, 49)).astype(dtype)
        got = model.run({"x": x})["y"]
        want = reference(x, [[2], [1]], op, keep)[-1]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * 64 * 49)


def test_mean_over_hw_then_c_with_an_intermediate_output():
    """The intermediate is also a model output: written out from the tree's kernel."""
    model = geode.compile(chain(["N", "C", 49], [[2], [1]], "ReduceMean", also_mid=True))
    assert len(fused(model)) == 1
    x = np.random.default_rng(1).standard_normal((5, 24, 49)).astype(np.float32)
    out = model.run({"x": x})
    mid, y = reference(x, [[2], [1]], "ReduceMean")
    np.testing.assert_allclose(out["mid"], mid, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["y"], y, rtol=1e-5, atol=1e-6)


def test_three_levels_two_row_axes_and_a_prologue():
    """Rows over two leading axes (fused into one parallel loop), three levels."""
    levels = [[4], [3], [2]]
    model = geode.compile(chain(["N", 3, 5, 6, 7], levels, keep=0, square=True))
    (k,) = fused(model)
    assert "fuse(" in k.trace
    x = np.random.default_rng(2).standard_normal((4, 3, 5, 6, 7)).astype(np.float32)
    got = model.run({"x": x})["y"]
    want = reference(x, levels, keep=0, square=True)[-1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_tree_under_the_plan_search():
    model = geode.compile(chain(["N", 64, 49], [[2], [1]]), fusion_search="beam")
    assert len(fused(model)) == 1
    x = np.random.default_rng(3).standard_normal((6, 64, 49)).astype(np.float32)
    np.testing.assert_allclose(
        model.run({"x": x})["y"], reference(x, [[2], [1]])[-1], rtol=1e-5, atol=1e-3
    )


@pytest.mark.parametrize(
    "shape,levels,why",
    [
        ([1, 512, 256], [[2], [1]], "parallelism lost"),
        (["N", 8, 49], [[0], [1]], "do not lead"),
        (["N", 8, 49], [[2], [0, 1]], "reduces every axis"),
    ],
)
def test_chains_that_must_not_fuse(shape, levels, why):
    model = geode.compile(chain(shape, levels))
    assert len(fused(model)) == 2
    assert why in model.explain()
    dims = [4 if d == "N" else d for d in shape]
    x = np.random.default_rng(4).standard_normal(dims).astype(np.float32)
    np.testing.assert_allclose(
        model.run({"x": x})["y"], reference(x, levels)[-1], rtol=1e-4, atol=1e-3
    )


def test_option_off_gives_two_kernels(monkeypatch):
    monkeypatch.setenv("GEODE_STITCH_FUSION", "0")
    model = geode.compile(chain(["N", 64, 49], [[2], [1]]))
    assert len(fused(model)) == 2
    assert "reduce trees are off" in model.explain()
    on = geode.compile(chain(["N", 64, 49], [[2], [1]]), stitch_fusion=True)
    assert len(fused(on)) == 1


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    dims=st.lists(st.integers(2, 9), min_size=3, max_size=4),
    op=st.sampled_from(sorted(NP)),
    keep=st.integers(0, 1),
    dtype=st.sampled_from(["float32", "float64"]),
    data=st.data(),
)
def test_random_chains_match_numpy(dims, op, keep, dtype, data):
    """Random shapes and chains whose rows lead: one kernel (symbolic rows, so the
    model's nominal size decides), results equal to numpy's. (Sizes start at 2: a
    reduction over unit axes only is simplified into a view.)"""
    rank = len(dims)
    rows = data.draw(st.integers(1, rank - 2), label="rows")
    inner = list(range(rows, rank))
    first = sorted(data.draw(st.sets(st.sampled_from(inner), min_size=1, max_size=len(inner) - 1)))
    left = [a for a in inner if a not in first]
    kept = [a for a in range(rank) if a not in first]  # the first result's axes (keepdims=0)
    levels = [first, left if keep else [kept.index(a) for a in left]]
    shape = ["N", *dims[1:]]
    model = geode.compile(chain(shape, levels, op, keep, dtype))
    assert len(fused(model)) == 1, model.explain()
    x = np.random.default_rng(5).standard_normal(dims).astype(dtype)
    rtol, atol = tol(dtype)
    got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got, reference(x, levels, op, keep)[-1], rtol=rtol, atol=atol * 100)


@pytest.mark.parametrize("stitch", [True, False])
def test_short_reduction_loops_stay_vector_loops(stitch):
    """Rows of 56: LLVM would unroll the vectorized reduction loop fully and vectorize
    the loop over rows with gathers instead; the backend marks such loops (directly in
    a serial loop or a parallel chunk) not to be unrolled."""
    from geode.codegen.backends.llvm import jit
    from geode.codegen.backends.llvm.target import host

    model = geode.compile(chain(["N", 8, 56, 56], [[3], [2]], square=True), stitch_fusion=stitch)
    # fused: the tree; unfused: the first kernel, the row reduction over W (the second
    # reduces [N, 8, 56, 1] over its axis 2, a column reduction)
    for k in fused(model)[:1]:
        assert "llvm.loop.unroll.disable" in k.llvm
        assert "masked.gather" not in jit.optimized_ir(k.llvm, host())
    gr = geode.Graph("ew")
    x = gr.input("x", ["N", 56])
    gr.output(gr.op("Mul", x, x), names=["y"])
    (k,) = fused(geode.compile(gr))
    assert "llvm.loop.unroll.disable" not in k.llvm  # elementwise loops: LLVM decides


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_one_vector_reduction_loops_stay_vector_loops(name):
    """Rows of exactly 16 elements: LLVM would unroll the reduction loops fully before
    vectorizing them, and vectorize the straight-line code only in part; the backend
    marks them not to be unrolled, and the optimized kernel (O2: no vmath call) reduces
    whole vectors."""
    from geode import examples
    from geode.codegen.backends.llvm import jit
    from geode.codegen.backends.llvm.target import host

    ex = getattr(examples, name)(hidden=16)
    model = geode.compile(ex.graph)
    (k,) = fused(model)
    assert "llvm.loop.unroll.disable" in k.source
    assert "llvm.vector.reduce.fadd.v16f32" in jit.optimized_ir(k.source, host(), 2)
    inputs = ex.make_inputs(np.random.default_rng(2), 37)
    got, want = model(**inputs), ex.numpy(**inputs)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_vector_inner_loops_stay_loops(dtype):
    """A residual Add and its mean over the sequence on ``[N, S, 16]`` (a GPT-2 block of
    hidden 16): LLVM would unroll each 16-element inner loop fully and vectorize the
    loop around it with gathers and scatters; the backend keeps every innermost loop of
    exactly 16 elements a loop, and the results match numpy for any N and S."""
    from geode.codegen.backends.llvm import jit
    from geode.codegen.backends.llvm.target import host

    gr = geode.Graph("resid_mean")
    x, r = gr.input("x", ["N", "S", 16], dtype), gr.input("r", ["N", "S", 16], dtype)
    bias = np.linspace(-1, 1, 16).astype(dtype)
    y = gr.op("Add", r, gr.op("Add", x, gr.constant(bias)))
    m = gr.op("ReduceMean", y, gr.constant(np.array([1], np.int64)), keepdims=0)
    gr.output(y, m, names=["y", "m"])
    model = geode.compile(gr)
    (k,) = fused(model)
    assert "llvm.loop.unroll.disable" in k.llvm
    optimized = jit.optimized_ir(k.llvm, host(), 2)
    assert "masked.gather" not in optimized and "masked.scatter" not in optimized
    rng = np.random.default_rng(3)
    rtol, atol = tol(dtype)
    for n, s in ((1, 1), (3, 7), (2, 33)):
        xs, rs = (rng.standard_normal((n, s, 16)).astype(dtype) for _ in range(2))
        got = model.run({"x": xs, "r": rs})
        want = rs + (xs + bias)
        np.testing.assert_allclose(got["y"], want, rtol=rtol, atol=atol)
        np.testing.assert_allclose(got["m"], want.mean(axis=1), rtol=rtol, atol=atol)
