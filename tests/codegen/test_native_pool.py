"""Pooling as native AI Core ops (backends/llvm/pool*.py, codegen/native_pool.py): the
compiled kernels against the reference kernels and onnx's ReferenceEvaluator, their
argument checks, and which pools models run natively (and why the others do not)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.codegen.backends.llvm.pool import PoolKernel, pool_kernel
from geode.codegen.backends.llvm.pool_spec import PoolSpec
from geode.compiler.ops.nn import avg_pool_nd, max_pool_nd
from geode.errors import ShapeError

TOL = {"float32": 2e-6, "float64": 1e-14}
OPS = {"max": "MaxPool", "avg": "AveragePool"}


def spec_of(nd: int, op: str, attrs: dict, dtype: str) -> PoolSpec:
    """The PoolSpec of an ``nd``-D pool with ONNX attrs."""
    lift = [1] * (2 - nd)
    pads = attrs.get("pads", [0] * (2 * nd))
    return PoolSpec(
        dtype=dtype,
        spatial=nd,
        op=op,
        kernel=tuple(lift + attrs["kernel_shape"]),
        strides=tuple(lift + attrs.get("strides", [1] * nd)),
        dilations=tuple(lift + attrs.get("dilations", [1] * nd)),
        pads=tuple([0] * (2 - nd) + pads[:nd] + [0] * (2 - nd) + pads[nd:]),
        auto_pad=attrs.get("auto_pad", "NOTSET"),
        ceil_mode=bool(attrs.get("ceil_mode", 0)),
        count_include_pad=bool(attrs.get("count_include_pad", 0)),
    )


def reference(op: str, x: np.ndarray, attrs: dict) -> np.ndarray:
    """The AICPU reference kernel's result."""
    return max_pool_nd(x, attrs)[0] if op == "max" else avg_pool_nd(x, attrs)


def run_native(xs, op, attrs, dtype="float32", x=None, threads=0):
    """(native result, reference result) on random data (or ``x``)."""
    if x is None:
        x = np.random.default_rng(0).standard_normal(xs).astype(dtype)
    want = reference(op, x, attrs)
    y = np.full(want.shape, 7.0, dtype)
    pool_kernel(spec_of(x.ndim - 2, op, attrs, dtype))(x, y, threads=threads)
    return y, want


FIXED = [
    ((2, 3, 9, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [2, 0, 1, 1]}),
    ((1, 2, 11, 10), {"kernel_shape": [3, 2], "dilations": [3, 2], "pads": [2, 1, 0, 1]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    (
        (1, 2, 8, 7),
        {"kernel_shape": [2, 3], "strides": [3, 2], "pads": [1, 0, 1, 2], "ceil_mode": 1},
    ),
    (
        (1, 2, 9, 9),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    ),
    (
        (1, 2, 8, 9),
        {
            "kernel_shape": [3, 2],
            "strides": [2, 2],
            "pads": [0, 1, 2, 1],
            "ceil_mode": 1,
            "count_include_pad": 1,
        },
    ),
    ((1, 2, 7, 6), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 6, 7), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 1]}),
    (
        (1, 2, 6, 7),
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "count_include_pad": 1},
    ),
    ((2, 3, 12), {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}),  # 1-D
    ((1, 2, 13), {"kernel_shape": [4], "dilations": [2], "ceil_mode": 1, "strides": [3]}),
    ((1, 2, 12, 11), {"kernel_shape": [9, 8], "pads": [1, 2, 0, 3]}),  # 72 taps: tap by tap
    ((1, 2, 13, 12), {"kernel_shape": [9, 8], "strides": [2, 3], "pads": [4, 0, 1, 2]}),
    ((1, 1, 5, 4), {"kernel_shape": [5, 4]}),  # the window is the whole image
    ((0, 3, 5, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # batch 0
    ((2, 0, 5, 5), {"kernel_shape": [2, 2]}),  # no channels
]


#: the cases also run in float64 (one per shape class)
FLOAT64 = (0, 4, 6, 8, 11, 13)


@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize(
    "case, dtype",
    [(k, "float32") for k in range(len(FIXED))] + [(k, "float64") for k in FLOAT64],
    ids=lambda v: str(FIXED[v][1]) if isinstance(v, int) else v,
)
def test_native_pool_matches_the_reference_kernel(case, dtype, op) -> None:
    """Every case in float32, some in float64: max exactly, averages to rounding."""
    xs, attrs = FIXED[case]
    y, want = run_native(xs, op, attrs, dtype)
    assert y.shape == want.shape and y.dtype == want.dtype
    if op == "max":
        np.testing.assert_array_equal(y, want)
    else:
        np.testing.assert_allclose(y, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("include", [0, 1])
def test_windows_entirely_in_padding(include) -> None:
    """Taps that all fall in padding (a 1x1 input, dilation 3, pads 2: each window
    straddles the one element): a max is -inf (the reference kernel's fill; its Indices
    are -1 there), an average
    that counts only real taps is 0/0 = NaN, one that counts the pads 0."""
    attrs = {
        "kernel_shape": [2, 2],
        "dilations": [3, 3],
        "pads": [2, 2, 2, 2],
        "count_include_pad": include,
    }
    x = np.full((1, 2, 1, 1), 5.0, np.float32)
    y, want = run_native(x.shape, "max", attrs, x=x)
    np.testing.assert_array_equal(y, np.full(y.shape, -np.inf, np.float32))
    np.testing.assert_array_equal(y, want)
    assert (max_pool_nd(x, attrs)[1] == -1).all()  # no element holds the max
    y, want = run_native(x.shape, "avg", attrs, x=x)
    np.testing.assert_array_equal(y, want)
    assert (np.isnan(y) if not include else y == 0).all()


@pytest.mark.parametrize("op", ["max", "avg"])
def test_nan_inputs_propagate_like_numpy(op) -> None:
    """A NaN in a window makes its result NaN (numpy's max propagates NaN), whatever
    tap it is; windows without one are unaffected."""
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 9)).astype(np.float32)
    x[0, 0, 0, 0] = x[1, 2, 5, 4] = x[0, 1, 7, 8] = np.nan
    x[1, 1, 3, :] = np.inf
    for attrs in (
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [9, 8], "pads": [1, 0, 0, 1]},
    ):
        y, want = run_native(x.shape, op, attrs, x=x)
        assert np.isnan(want).any()
        np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)  # NaNs at the same places


@pytest.mark.parametrize("op", ["max", "avg"])
def test_native_pool_runs_planes_on_the_pool(op) -> None:
    """Enough work for the native pool's threads: one and two threads agree with the
    reference."""
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    x = np.random.default_rng(2).standard_normal((2, 16, 40, 41)).astype(np.float32)
    for threads in (1, 2):
        y, want = run_native(x.shape, op, attrs, x=x, threads=threads)
        np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["max", "avg"])
def test_native_global_pools(op, dtype) -> None:
    rng = np.random.default_rng(3)
    for xs in ((2, 3, 7, 9), (3, 2, 11), (1, 4, 1, 1), (2, 70, 15, 40), (0, 3, 4, 4)):
        x = rng.standard_normal(xs).astype(dtype)
        axes = tuple(range(2, x.ndim))
        want = x.max(axis=axes, keepdims=True) if op == "max" and x.size else None
        if op == "avg":
            want = x.mean(axis=axes, keepdims=True)
        elif want is None:
            want = np.zeros((0, 3, 1, 1), dtype)
        y = np.full(want.shape, 7.0, dtype)
        spec = PoolSpec(dtype, x.ndim - 2, op, is_global=True)
        pool_kernel(spec)(x, y, threads=2)
        np.testing.assert_allclose(y, want, rtol=TOL[dtype] * 10, atol=TOL[dtype])
    x = np.array([[[1.0, np.nan, 3.0]]], dtype)
    y = np.zeros((1, 1, 1), dtype)
    pool_kernel(PoolSpec(dtype, 1, op, is_global=True))(x, y)
    assert np.isnan(y).all()


def test_native_pool_checks_its_arguments() -> None:
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    k = pool_kernel(spec_of(2, "max", attrs, "float32"))
    x = np.ones((1, 3, 7, 7), np.float32)
    with pytest.raises(ValueError, match=r"argument Y must have shape \(N, C, OH, OW\)"):
        k(x, np.zeros((1, 3, 3, 4), np.float32))
    with pytest.raises(ValueError, match="argument Y must have shape"):
        k(x, np.zeros((1, 2, 4, 4), np.float32))  # channels differ
    with pytest.raises(TypeError, match="must be a float32 array of rank 4"):
        k(x.astype(np.float64), np.zeros((1, 3, 4, 4), np.float32))
    valid = pool_kernel(spec_of(2, "avg", {"kernel_shape": [3, 3]}, "float32"))
    with pytest.raises(ShapeError, match="too small for the window.*k=3x3"):
        valid(np.ones((1, 3, 2, 5), np.float32), np.zeros((1, 3, 0, 3), np.float32))
    gmax = pool_kernel(PoolSpec("float32", 2, "max", is_global=True))
    with pytest.raises(ShapeError, match="too small"):  # the max of nothing
        gmax(np.ones((1, 3, 0, 5), np.float32), np.zeros((1, 3, 1, 1), np.float32))
    y = np.zeros((1, 3, 4, 4), np.float32)
    k(np.asfortranarray(x), y)  # a strided input is copied
    np.testing.assert_array_equal(y, max_pool_nd(x, attrs)[0])
    assert isinstance(k, PoolKernel) and "llvm.maximum" in k.source


def test_native_pool_out_of_memory_is_a_geode_error() -> None:
    """A scratch plane malloc cannot give (the address space capped; a huge stride and
    end pad over a one-column input need a 12 GB plane) returns the out-of-memory status,
    raised as ExecutionError; the process lives on."""
    script = textwrap.dedent(
        """
        import resource, numpy as np
        from geode.codegen.backends.llvm.pool import pool_kernel
        from geode.codegen.backends.llvm.pool_spec import PoolSpec
        from geode.errors import ExecutionError
        k = pool_kernel(PoolSpec("float32", 1, "max", (1, 1), (1, 1500000000), (1, 1),
                                 (0, 0, 0, 3000000000)))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, hard))
        try:
            k(np.ones((1, 2, 1), np.float32), np.zeros((1, 2, 3), np.float32), threads=1)
        except ExecutionError as exc:
            print("raised:", exc)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "raised: kernel maxpool: out of memory allocating its padded plane"


def test_maxpool_storage_order_without_indices_goes_native() -> None:
    """storage_order only orders the Indices: a MaxPool without them runs natively."""
    attrs = {"kernel_shape": [2, 2], "storage_order": 1, "pads": [1, 0, 0, 1]}
    model = pool_model("MaxPool", (1, 2, 5, 4), attrs)
    native = geode.compile(model)
    assert [(k.kind, k.engine) for k in native.kernels] == [("library", "aicore")]
    x = np.random.default_rng(5).standard_normal((1, 2, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(native(x=x)["y"], max_pool_nd(x, attrs)[0])


# -- models -------------------------------------------------------------------------
def pool_model(op_type: str, xs, attrs: dict, dtype=np.float32, dims=None):
    """An ONNX model of one pooling node."""
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op_type, ["x"], ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", et, list(dims or xs))],
        [helper.make_tensor_value_info("y", et, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@st.composite
def pool_configs(draw):
    nd = draw(st.integers(1, 2))
    op = draw(st.sampled_from(["max", "avg"]))
    ks = [draw(st.integers(1, 3)) for _ in range(nd)]
    attrs = {
        "kernel_shape": ks,
        "strides": [draw(st.integers(1, 3)) for _ in range(nd)],
        "auto_pad": draw(
            st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
        ),
    }
    if op == "max":
        attrs["dilations"] = [draw(st.integers(1, 2)) for _ in range(nd)]
    else:
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    if attrs["auto_pad"] == "NOTSET":
        span = [attrs.get("dilations", [1] * nd)[i] * (ks[i] - 1) + 1 for i in range(nd)]
        attrs["pads"] = [draw(st.integers(0, span[i % nd] - 1)) for i in range(2 * nd)]
        attrs["ceil_mode"] = draw(st.integers(0, 1))
    xs = (
        draw(st.integers(0, 2)),
        draw(st.integers(1, 3)),
        *(draw(st.integers(1, 9)) for _ in range(nd)),
    )
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float64]))
    return op, xs, attrs, dtype, draw(st.booleans())


@settings(max_examples=20, deadline=None)
@given(pool_configs())
def test_native_pool_models_match_onnx_reference(cfg) -> None:
    """Random pools compiled to native steps (static or symbolic input dims) against
    onnx's ReferenceEvaluator and geode's AICPU path."""
    op, xs, attrs, dtype, symbolic = cfg
    nd = len(xs) - 2
    for i in range(nd):
        span = attrs.get("dilations", [1] * nd)[i] * (attrs["kernel_shape"][i] - 1) + 1
        pad = sum(attrs["pads"][i::nd]) if "pads" in attrs else 0
        if attrs["auto_pad"] in ("NOTSET", "VALID"):
            assume(xs[2 + i] + pad >= span)
    dims = ["N", "C", *(f"S{i}" for i in range(nd))] if symbolic else None
    model = pool_model(OPS[op], xs, attrs, dtype, dims)
    native = geode.compile(model)
    assert [(k.kind, k.engine) for k in native.kernels] == [("library", "aicore")]
    x = np.random.default_rng(1).standard_normal(xs).astype(dtype)
    got = native(x=x)["y"]
    tol = 2e-6 if dtype == np.float32 else 1e-14
    # onnx's evaluator pads SAME negatively (stride > kernel), drops 1-D end pads, sizes
    # ceil_mode outputs without dropping a last window that starts in the end padding,
    # gives windows lying wholly in the padding 0 (and raises on empty batches)
    # (onnxruntime agrees with geode there); those compare with the AICPU path only
    spans = [
        attrs.get("dilations", [1] * nd)[i] * (attrs["kernel_shape"][i] - 1) + 1 for i in range(nd)
    ]
    in_data = all(xs[2 + i] >= spans[i] for i in range(nd))  # every window reads data
    plain = not attrs["auto_pad"].startswith("SAME") and not attrs.get("ceil_mode", 0)
    if nd == 2 and plain and in_data and xs[0] > 0:
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    aicpu = geode.compile(model, codegen=False)(x=x)["y"]
    np.testing.assert_allclose(got, aicpu, rtol=tol, atol=tol)


def test_pools_are_placed_on_aicore_as_library_ops() -> None:
    g = geode.Graph("net")
    x = g.input("x", ["N", 4, "H", "W"])
    y = g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="mp")
    z = g.op("AveragePool", y, kernel_shape=[2, 2], ceil_mode=1, name="ap")
    g.output(
        g.op("GlobalAveragePool", z, name="gap"),
        g.op("GlobalMaxPool", y, name="gmp"),
        names=["avg", "max"],
    )
    model = geode.compile(g)
    kinds = {k.name: (k.kind, k.engine) for k in model.kernels}
    assert all(kinds[n] == ("library", "aicore") for n in ("mp", "ap", "gap", "gmp")), kinds
    text = model.explain()
    assert "mp: aicore (library op: MaxPool, direct window kernel, native)" in text
    assert "ap: aicore (library op: AveragePool, direct window kernel, native)" in text
    assert "gap: aicore (library op: GlobalAveragePool, whole-plane reduction, native)" in text
    assert "gmp: aicore (library op: GlobalMaxPool, whole-plane reduction, native)" in text
    info = {k.name: k for k in model.kernels}
    assert (
        info["mp"].trace.startswith("maxpool 2-D float32 k=3x3") and "define" in info["mp"].source
    )
    assert info["gap"].trace == "global avgpool 2-D float32"
    rng = np.random.default_rng(4)
    for shape in ((2, 4, 11, 10), (1, 4, 5, 6)):  # one compiled model, several input sizes
        xv = rng.standard_normal(shape).astype(np.float32)
        h = max_pool_nd(xv, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4})[0]
        a = avg_pool_nd(h, {"kernel_shape": [2, 2], "ceil_mode": 1})
        out = model(x=xv)
        np.testing.assert_allclose(out["avg"], a.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
        np.testing.assert_array_equal(out["max"], h.max(axis=(2, 3), keepdims=True))


@pytest.mark.parametrize(
    "op_type, dtype, xs, extra_out, reason",
    [
        ("MaxPool", TensorProto.FLOAT, [1, 2, 5, 5], True, "the Indices output"),
        ("MaxPool", TensorProto.FLOAT16, [1, 2, 5, 5], False, "float16"),
        ("MaxPool", TensorProto.INT8, [1, 2, 5, 5], False, "int8"),
        ("AveragePool", TensorProto.FLOAT, [1, 2, 4, 5, 5], False, "X is not 3-D or 4-D"),
        ("GlobalMaxPool", TensorProto.FLOAT, [1, 2, 4, 5, 5], False, "X is not 3-D or 4-D"),
    ],
    ids=["indices", "float16", "int8", "3-D", "global 3-D"],
)
def test_pools_that_stay_on_aicpu_say_why(op_type, dtype, xs, extra_out, reason) -> None:
    attrs = {} if op_type.startswith("Global") else {"kernel_shape": [2] * (len(xs) - 2)}
    outs = ["y", "i"] if extra_out else ["y"]
    node = helper.make_node(op_type, ["x"], outs, name="p", **attrs)
    g = helper.make_graph(
        [node],
        "stay",
        [helper.make_tensor_value_info("x", dtype, xs)],
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, (dtype, 7))],
    )
    model = geode.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    assert [k.engine for k in model.kernels] == ["aicpu"]
    assert f"p: aicpu (library op: reference kernel ({op_type}: {reason}" in model.explain()
