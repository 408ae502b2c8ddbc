"""What the LLVM backend (the default) makes of the fused kernels: the generated IR holds
the fast paths the schedules ask for (vmath calls, the guarded NaN-exact min/max, frozen
NaN-insensitive reductions, prefetches, non-temporal stores fenced once per chunk, the
thread pool), and every model matches numpy with one compile for all sizes."""

import numpy as np
import pytest
from test_fused_kernels import aicore, minmax_rows, run_sizes
from test_nan_flow import _log_softmax, _softmax

import geode
from geode import examples, ops
from geode.runtime import native


def test_kernel_exposes_ir_optimized_ir_asm_and_trace():
    model = geode.compile(examples.rmsnorm(hidden=32).graph)
    (k,) = aicore(model)
    assert "define i32 @" in k.source and "geode_parallel_for" in k.source
    assert "define" in k.llvm and k.asm.strip()
    assert "compute_inline" in k.trace and "parallel" in k.trace


def test_one_compile_serves_every_shape():
    ex = examples.layernorm(hidden=40)
    model = geode.compile(ex.graph)
    run_sizes(model, ex, sizes=(1, 2, 7, 64))
    assert "%N" in model.kernels[0].source  # the batch dim is a kernel argument


@pytest.mark.parametrize("how", ["primitives", "Gelu op"])
def test_tanh_gelu_gate_is_one_vmath_division(how):
    if how == "primitives":
        graph = examples.gelu(hidden=200, approximate="tanh", with_bias=True).graph
        bias = np.linspace(-0.5, 0.5, 200, dtype=np.float32)
    else:
        graph = geode.Graph("gelu_op")
        x = graph.input("x", ["N", 200])
        graph.output(ops.gelu(x, approximate="tanh"), names=["y"])
        bias = np.zeros(200, np.float32)
    model = geode.compile(graph)
    (k,) = model.kernels
    assert "@geode.vm.div_one_plus_exp.f32(" in k.source and "tanh" not in k.source
    x = np.random.default_rng(1).standard_normal((37, 200)).astype(np.float32) * 4
    h = x.astype(np.float64) + bias
    want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose(model(x=x)["y"], want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_min_use_the_guarded_fast_path_and_match_numpy(dtype):
    g = geode.Graph(f"minmax_{dtype}")
    x = g.input("x", ["N", "M"], dtype)
    g.output(
        ops.reduce_max(x, axes=[-1], keepdims=0) * 2.0,
        ops.reduce_min(x, axes=[-1], keepdims=0) * 2.0,
        names=["mx", "mn"],
    )
    model = geode.compile(g)
    (k,) = aicore(model)
    sfx = "f32" if dtype == "float32" else "f64"
    assert f"call nnan nsz {'float' if sfx == 'f32' else 'double'} @llvm.maxnum.{sfx}" in k.source
    assert "@llvm.minnum." in k.source and "@llvm.umax." in k.source  # the NaN guard
    rng = np.random.default_rng(0)
    for m in (1, 7, 33, 257):
        xs = minmax_rows(m, dtype, rng)
        out = model(x=xs)
        with np.errstate(invalid="ignore"):  # inf * 2 of the probe rows
            want_mx, want_mn = xs.max(axis=1) * 2, xs.min(axis=1) * 2
        np.testing.assert_array_equal(out["mx"], want_mx)
        np.testing.assert_array_equal(out["mn"], want_mn)


@pytest.mark.parametrize("which", ["softmax", "log_softmax"])
def test_softmax_max_is_unguarded_and_nan_exact(which):
    g = geode.Graph(which)
    x = g.input("x", ["N", 1030])
    g.output(_softmax(x) if which == "softmax" else _log_softmax(x), names=["y"])
    model = geode.compile(g)
    (k,) = aicore(model)
    assert 'asm ""' in k.source and "@llvm.umax." not in k.source  # frozen, no NaN guard
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((9, 1030)).astype(np.float32)
    xs[1, 5], xs[2, :] = np.nan, np.nan
    xs[3, 7], xs[4, 9], xs[5, :] = np.inf, -np.inf, -np.inf
    x64 = xs.astype(np.float64)
    with np.errstate(all="ignore"):
        d = x64 - x64.max(axis=1, keepdims=True)
        e = np.exp(d)
        s = e.sum(axis=1, keepdims=True)
        want = e / s if which == "softmax" else d - np.log(s)
    np.testing.assert_allclose(model(x=xs)["y"], want, rtol=2e-5, atol=1e-6)


def test_softmax_prefetches_and_streams_scaled_rows():
    ex = examples.softmax(hidden=1024)
    model = geode.compile(ex.graph, streaming="0")
    (k,) = aicore(model)
    assert "@llvm.prefetch.p0(" in k.source
    # e / sum divided on the way (a subnormal sum's reciprocal would be inf)
    assert "geode.stream.float32.divided" in k.source and "!nontemporal" in k.source
    assert "@llvm.x86.sse.sfence" in k.source or "fence seq_cst" in k.source
    run_sizes(model, ex, sizes=(1, 2, 7, 16, 17, 130))


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm", "softmax", "gelu"])
def test_streamed_outputs_match_numpy(name):
    ex = getattr(examples, name)(hidden=512)
    model = geode.compile(ex.graph, streaming="0")
    run_sizes(model, ex, sizes=(1, 3, 64))


def test_each_model_runs_on_its_own_thread_count():
    """``num_threads`` is passed with every call: a one-thread model never uses the
    pool, an all-cores model does, whatever ran before."""
    if native.get_num_threads() < 2:
        pytest.skip("a one-thread pool: all cores and one core are the same here")
    ex = examples.softmax(hidden=256)
    one = geode.compile(ex.graph, num_threads=1)
    every = geode.compile(ex.graph)
    x = np.random.default_rng(0).standard_normal((4096, 256), dtype=np.float32)
    before = native.pool_info()["launches"]
    y1 = one(x=x)["y"]
    assert native.pool_info()["launches"] == before
    y2 = every(x=x)["y"]
    assert native.pool_info()["launches"] > before
    np.testing.assert_array_equal(y1, y2)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_of_a_fused_product_never_overflows(op):
    """``softmax(a * b)``: the product is recomputed for the max and for the difference;
    rounded apart (a fused multiply-add in one pass), a product of 3e29 came out 2e22
    above its own max, and exp of that made the column NaN (found by geode.fuzz). The
    decomposition clamps ``x - max`` at 0."""
    from geode.compiler.interpret import run_reference

    g = geode.Graph("softmax_product")
    a, b = g.input("a", [9, 3]), g.input("b", [9, 3])
    g.output(g.op(op, g.op("Mul", a, b), axis=0), names=["y"])
    rng = np.random.default_rng(0)
    av = rng.standard_normal((9, 3)).astype(np.float32)
    bv = rng.standard_normal((9, 3)).astype(np.float32)
    av[8, 2], bv[8, 2] = np.float32(1e30), np.float32(0.3080566)
    model = geode.compile(g)
    assert len([k for k in model.kernels if k.engine == "aicore"]) == 1
    got = model.run({"a": av, "b": bv})["y"]
    want = run_reference(g, {"a": av, "b": bv})["y"]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 0, 3), (0, 2, 3), (2, 3, 0)])
def test_zero_size_dims_merged_by_a_view_compile(shape):
    """A Flatten that merges a static 0 into another dim gave index arithmetic ``i % 0``:
    sympy raised ZeroDivisionError and the group fell back to AICPU (found by
    geode.fuzz). The loops over a 0 never run, so such an index is never computed."""
    import warnings

    from geode.codegen.driver import CodegenWarning

    g = geode.Graph("zero")
    x = g.input("x", list(shape))
    y = g.op("Exp", g.op("Flatten", x, axis=1))
    g.output(g.op("Add", y, y), names=["y"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)
        model = geode.compile(g)
    assert [k.engine for k in model.kernels] == ["aicore"]
    out = model.run({"x": np.zeros(shape, np.float32)})["y"]
    assert out.shape == (shape[0], shape[1] * shape[2])


@pytest.mark.parametrize("dtype, rtol", [("float32", 1e-6), ("float64", 2e-15)])
def test_elu_and_selu_are_accurate_near_zero(dtype, rtol):
    """Elu and Selu compute ``exp(x) - 1`` as Kahan's expm1: near 0 the plain difference
    kept a few bits (2e-4 relative at x = -4e-5 in float32, found by geode.fuzz). Swept
    over 32 decades, with 0, the smallest subnormal, large negatives and -inf."""
    from geode.compiler.interpret import run_reference

    g = geode.Graph("expm1")
    x = g.input("x", ["N"], dtype)
    g.output(g.op("Elu", x, alpha=0.7), g.op("Selu", x), names=["elu", "selu"])
    model = geode.compile(g)
    assert [k.engine for k in model.kernels] == ["aicore"]
    tiny = np.finfo(dtype).smallest_subnormal
    xs = -np.concatenate([np.logspace(-30, 2.5, 2000), [0.0, tiny, 200, 1000, np.inf]])
    xs = xs.astype(dtype)
    got, want = model.run({"x": xs}), run_reference(g, {"x": xs})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=0, err_msg=name)


def test_slices_and_sums_over_a_static_zero_dim_compile():
    """A Slice and a full sum over ``[7, 0, 7]`` folded an index ``i // 0`` in Python
    (ZeroDivisionError: the group fell back to AICPU; found by geode.fuzz, seed 1 case
    1538). A division by a constant 0 folds to 0: its loops never run."""
    import warnings

    from geode.codegen.driver import CodegenWarning

    g = geode.Graph("zero_dim")
    x = g.input("x", [7, 0, 7], "float64")
    a = g.op("Atanh", x)
    ints = lambda v: g.constant(np.array(v, np.int64))  # noqa: E731
    s = g.op("Slice", a, ints([-9]), ints([-3]), ints([0]), ints([1]))
    r = g.op("ReduceSum", a, ints([0, 1, -1]), keepdims=1)
    g.output(s, r, g.op("Add", a, g.constant(np.array(2.0))), names=["s", "r", "y"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CodegenWarning)
        model = geode.compile(g)
    out = model.run({"x": np.zeros((7, 0, 7))})
    assert out["s"].shape == (4, 0, 7) and out["y"].shape == (7, 0, 7)
    np.testing.assert_array_equal(out["r"], np.zeros((1, 1, 1)))
