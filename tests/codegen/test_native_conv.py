"""Conv as a native AI Core op (backends/llvm/conv*.py, codegen/native_conv.py): the
compiled kernels against the reference kernel and onnx's ReferenceEvaluator, their
argument checks, and which Convs models run natively (and why the others do not)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import geode
from geode.codegen.backends.llvm.conv import ConvKernel, conv_kernel
from geode.codegen.backends.llvm.conv_spec import ConvSpec
from geode.codegen.backends.llvm.library import blas
from geode.compiler.ops.nn import conv_nd
from geode.errors import ShapeError

pytestmark = pytest.mark.skipif(blas() is None, reason="no BLAS in numpy's wheel or process")

TOL = {"float32": 2e-5, "float64": 1e-12}


def spec_of(xs: tuple, ws: tuple, attrs: dict, dtype: str, bias: bool) -> ConvSpec:
    """The ConvSpec of a conv with input shape ``xs``, weights ``ws`` and ONNX attrs."""
    nd = len(ws) - 2
    lift = [1] * (2 - nd)
    pads = attrs.get("pads", [0] * (2 * nd))
    return ConvSpec(
        dtype=dtype,
        spatial=nd,
        channels=xs[1],
        out_channels=ws[0],
        group=attrs.get("group", 1),
        kernel=tuple(lift + list(ws[2:])),
        strides=tuple(lift + attrs.get("strides", [1] * nd)),
        dilations=tuple(lift + attrs.get("dilations", [1] * nd)),
        pads=tuple([0] * (2 - nd) + pads[:nd] + [0] * (2 - nd) + pads[nd:]),
        auto_pad=attrs.get("auto_pad", "NOTSET"),
        bias=bias,
    )


def run_native(xs, ws, attrs, dtype="float32", bias=True, seed=0):
    """(native result, reference result, the kernel) on random data."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype) if bias else None
    want = conv_nd(x, w, b, attrs)
    k = conv_kernel(spec_of(xs, ws, attrs, dtype, bias))
    y = np.full(want.shape, np.nan, dtype)
    k(*((x, w, b, y) if bias else (x, w, y)))
    return y, want, k


FIXED = [
    # (x shape, w shape, attrs, method)
    ((2, 3, 7, 7), (4, 3, 3, 3), {}, "direct"),
    ((1, 3, 9, 8), (5, 3, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1]}, "im2col"),
    ((1, 2, 11, 10), (4, 2, 3, 2), {"dilations": [3, 2], "pads": [2, 1, 0, 1]}, "direct"),
    ((2, 4, 6, 5), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, "direct"),
    ((1, 6, 5, 7), (6, 2, 3, 1), {"group": 3, "strides": [1, 2]}, "direct"),
    ((2, 5, 6, 7), (3, 5, 1, 1), {}, "pointwise"),
    ((1, 6, 5, 5), (4, 3, 1, 1), {"group": 2}, "pointwise"),
    ((1, 3, 7, 6), (4, 3, 1, 1), {"strides": [2, 2]}, "direct"),  # 1x1 strided
    ((1, 3, 5, 5), (2, 3, 1, 1), {"pads": [1, 0, 0, 1]}, "im2col"),  # 1x1 padded
    ((2, 4, 9, 7), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, "depthwise"),
    ((1, 4, 8, 9), (8, 1, 3, 3), {"group": 4, "strides": [2, 2]}, "depthwise"),  # multiplier 2
    (
        (1, 3, 9, 10),
        (3, 1, 3, 2),
        {"group": 3, "dilations": [2, 3], "pads": [0, 2, 3, 1]},
        "depthwise",
    ),
    ((1, 3, 5, 4), (3, 3, 5, 4), {}, "direct"),  # the window is the whole image
    ((1, 2, 3, 3), (3, 2, 3, 3), {"pads": [3, 3, 3, 3]}, "direct"),  # rows of padding only
    ((3, 3, 11), (4, 3, 3), {"strides": [2], "pads": [1, 2]}, "direct"),  # 1-D
    ((1, 4, 13), (4, 2, 4), {"group": 2, "dilations": [2]}, "direct"),  # 1-D grouped
    ((1, 4, 10), (4, 1, 3), {"group": 4, "pads": [2, 0]}, "depthwise"),  # 1-D depthwise
    ((2, 4, 9), (5, 4, 1), {}, "pointwise"),  # 1-D pointwise
    ((2, 2, 12, 11), (2, 1, 9, 8), {"group": 2, "pads": [1, 2, 0, 3]}, "depthwise"),  # 72 taps
    (
        (1, 2, 13, 12),
        (2, 1, 9, 8),
        {"group": 2, "strides": [2, 3], "pads": [4, 0, 1, 2]},
        "depthwise",
    ),
    ((2, 3, 7, 8), (6, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}, "depthwise"),  # shared pad
    ((0, 3, 5, 5), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "direct"),  # batch 0
    ((0, 4, 5, 5), (4, 1, 3, 3), {"group": 4}, "depthwise"),
    ((0, 3, 5, 5), (4, 3, 1, 1), {}, "pointwise"),
]


#: the cases also run in float64 (one per method and shape class)
FLOAT64 = (1, 3, 5, 11, 14, 16, 18, 19)


@pytest.mark.parametrize(
    "k, dtype",
    [(k, "float32") for k in range(len(FIXED))] + [(k, "float64") for k in FLOAT64],
    ids=lambda v: str(FIXED[v]) if isinstance(v, int) else v,
)
def test_native_conv_matches_the_reference_kernel(k, dtype) -> None:
    """Every case in float32, some in float64, with a bias or not (alternating)."""
    xs, ws, attrs, method = FIXED[k]
    bias = (k % 2 == 0) == (dtype == "float32")
    y, want, k = run_native(xs, ws, attrs, dtype, bias)
    assert spec_of(xs, ws, attrs, dtype, bias).method == method
    assert y.shape == want.shape and y.dtype == want.dtype
    np.testing.assert_allclose(y, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("strides", [[1, 1], [2, 3]])
def test_native_conv_auto_pad(auto_pad, depthwise, strides) -> None:
    """SAME pads are computed from the input's size at run time; odd totals put the
    extra pad at the end (UPPER) or the start (LOWER)."""
    ws = (4, 1, 3, 2) if depthwise else (5, 4, 3, 2)
    attrs = {"auto_pad": auto_pad, "strides": strides, "group": 4 if depthwise else 1}
    for size in ((7, 8), (6, 5), (1, 2)):
        if auto_pad == "VALID" and size[0] < 3:
            continue
        y, want, _ = run_native((2, 4, *size), ws, attrs)
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)


def test_native_conv_without_input_channels() -> None:
    """C = 0: K = 0, every output is the bias (or zero)."""
    for bias in (True, False):
        y, want, _ = run_native((2, 0, 4, 4), (3, 0, 3, 3), {"pads": [1, 1, 1, 1]}, bias=bias)
        np.testing.assert_array_equal(y, want)


def test_native_conv_large_image_uses_several_bands(monkeypatch) -> None:
    """An image whose column matrix exceeds the band budget is done band by band (the
    last band shorter); the budget made small so a small image needs five bands."""
    from geode.codegen.backends.llvm import conv_gemm

    monkeypatch.setattr(conv_gemm, "COL_BUDGET_BYTES", 64 << 10)
    xs, ws, attrs = (2, 16, 20, 23), (8, 16, 3, 3), {"pads": [1, 2, 0, 1]}
    band_rows = (64 << 10) // (16 * 9 * 4) // 24  # K * item, OW
    assert (band_rows, 19 % band_rows) == (4, 3)  # OH = 19: bands of 4, 4, 4, 4, 3 rows
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    spec = dataclasses.replace(spec_of(xs, ws, attrs, "float32", False), choice="im2col")
    k = conv_kernel.__wrapped__(spec)  # not the cached one
    assert "sdiv i64 113," in k.source  # 113 output positions per band
    y = np.full((2, 8, 19, 24), np.nan, np.float32)
    k(x, w, y)
    np.testing.assert_allclose(y, conv_nd(x, w, None, attrs), rtol=1e-4, atol=1e-4)


@st.composite
def gemm_convs(draw):
    """A pointwise or im2col conv (1x1, maybe strided or padded, or a small window at
    stride 2) whose products fall on either side of ``conv_gemm.SPLIT_MIN_MACS``."""
    n, c, m = draw(st.integers(1, 3)), draw(st.integers(1, 48)), draw(st.integers(1, 96))
    h, w = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    k = draw(st.sampled_from([1, 1, 3]))
    s = draw(st.sampled_from([1, 2])) if k == 1 else 2
    p = draw(st.integers(0, 1)) if k == 3 else draw(st.sampled_from([0, 0, 1]))
    assume(h + 2 * p >= k and w + 2 * p >= k)
    attrs = {"strides": [s, s], "pads": [p] * 4}
    return (n, c, h, w), (m, c, k, k), attrs, draw(st.booleans())


@settings(max_examples=25, deadline=None)
@given(gemm_convs())
def test_gemm_convs_on_any_thread_count(cfg) -> None:
    """A GEMM conv (pointwise, im2col) matches the reference at 1, 2 and the pool's
    threads, with the same bits on each: a product under ``SPLIT_MIN_MACS``
    multiply-adds runs on the calling thread, a larger one is split over the pool."""
    xs, ws, attrs, bias = cfg
    spec = spec_of(xs, ws, attrs, "float32", bias)
    assume(spec.method in ("pointwise", "im2col"))
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    want = conv_nd(x, w, b, attrs)
    k = conv_kernel(spec)
    got = []
    for threads in (1, 2, 0):
        y = np.full(want.shape, np.nan, np.float32)
        k(*((x, w, b, y) if bias else (x, w, y)), threads=threads)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        got.append(y)
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])


def test_small_gemm_convs_stay_on_the_calling_thread() -> None:
    """The kernel passes one thread to ``geode_gemm`` below ``SPLIT_MIN_MACS``."""
    from geode.codegen.backends.llvm import conv_gemm

    spec = spec_of((1, 32, 32, 32), (64, 32, 1, 1), {"strides": [2, 2]}, "float32", True)
    assert spec.method == "direct"  # a strided 1x1 conv, unless im2col is asked for
    spec = dataclasses.replace(spec, choice="im2col")
    assert spec.method == "im2col"
    k = conv_kernel.__wrapped__(spec)
    assert re.search(rf"icmp slt i64 %macs[.\w]*, {conv_gemm.SPLIT_MIN_MACS}\b", k.source)
    assert re.search(r"select i1 %alone[.\w]*, i64 1, ", k.source)


def test_native_conv_checks_its_arguments() -> None:
    xs, ws, attrs = (1, 3, 7, 7), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}
    _, _, k = run_native(xs, ws, attrs)
    x, w, b = np.ones(xs, np.float32), np.ones(ws, np.float32), np.ones(4, np.float32)
    y = np.zeros((1, 4, 7, 7), np.float32)
    with pytest.raises(ValueError, match="argument X must have shape"):
        k(np.ones((1, 2, 7, 7), np.float32), w, b, y)  # wrong channels
    with pytest.raises(ValueError, match="argument W must have shape"):
        k(x, np.ones((4, 3, 2, 3), np.float32), b, y)
    with pytest.raises(ValueError, match="argument B must have shape"):
        k(x, w, np.ones(5, np.float32), y)
    with pytest.raises(ValueError, match="argument Y must have shape"):
        k(x, w, b, np.zeros((1, 4, 6, 7), np.float32))
    with pytest.raises(ShapeError, match="too small for the window.*k=3x3"):  # no output
        k(np.ones((1, 3, 0, 5), np.float32), w, b, np.zeros((1, 4, 0, 5), np.float32))
    with pytest.raises(TypeError, match="must be a float32 array of rank 4"):
        k(x.astype(np.float64), w, b, y)
    k(np.asfortranarray(x), w, b, y)  # a strided input is copied
    np.testing.assert_allclose(y, conv_nd(x, w, b, attrs), rtol=1e-5)
    assert isinstance(k, ConvKernel) and "geode_conv_direct" in k.source


def test_native_conv_out_of_memory_is_a_geode_error() -> None:
    """A scratch buffer malloc cannot give (the address space capped) returns the
    out-of-memory status, raised as ExecutionError; the process lives on. The im2col
    band here needs 4.8 GB; the depthwise conv's padded plane (a huge stride and end
    pad over a one-column input) 12 GB."""
    script = textwrap.dedent(
        """
        import resource, numpy as np
        from geode.codegen.backends.llvm.conv import conv_kernel
        from geode.codegen.backends.llvm.conv_spec import ConvSpec
        from geode.errors import ExecutionError
        gemm = conv_kernel(ConvSpec("float32", 1, 1, 1, 1, (1, 20000), (1, 1), (1, 1),
                                    (0, 0, 0, 0), "NOTSET", False))
        depthwise = conv_kernel(ConvSpec("float32", 1, 2, 2, 2, (1, 1), (1, 1500000000),
                                         (1, 1), (0, 0, 0, 3000000000), "NOTSET", False))
        calls = [
            (gemm, np.ones((1, 1, 80000), np.float32), np.ones((1, 1, 20000), np.float32),
             np.zeros((1, 1, 60001), np.float32)),
            (depthwise, np.ones((1, 2, 1), np.float32), np.ones((2, 1, 1), np.float32),
             np.zeros((1, 2, 3), np.float32)),
        ]
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, hard))
        for k, x, w, y in calls:
            try:
                k(x, w, y, threads=1)
            except ExecutionError as exc:
                print("raised:", exc)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert (
        lines[0] == "raised: kernel conv_im2col: out of memory allocating its im2col column buffer"
    )
    assert (
        lines[1]
        == "raised: kernel conv_depthwise: out of memory allocating its padded plane buffer"
    )


# -- models -------------------------------------------------------------------------
def conv_model(xs, ws, attrs, dtype=np.float32, bias=True, dims=None, seed=0):
    """An ONNX model of one Conv with constant weights (and bias); returns it and W, B."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if bias else [])
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", et, list(dims or xs))],
        [helper.make_tensor_value_info("y", et, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@st.composite
def conv_configs(draw):
    nd = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, mg = draw(st.sampled_from([1, 1, 2, 3])), draw(st.integers(1, 3))
    if group == 1 and cg == 1:
        cg = draw(st.integers(1, 4))
    attrs = {
        "group": group,
        "strides": [draw(st.integers(1, 3)) for _ in range(nd)],
        "dilations": [draw(st.integers(1, 2)) for _ in range(nd)],
        "auto_pad": draw(
            st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
        ),
    }
    if attrs["auto_pad"] == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, 2)) for _ in range(2 * nd)]
    ks = [draw(st.integers(1, 3)) for _ in range(nd)]
    xs = (draw(st.integers(0, 2)), cg * group, *(draw(st.integers(1, 9)) for _ in range(nd)))
    ws = (mg * group, cg, *ks)
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float64]))
    return xs, ws, attrs, dtype, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=15, deadline=None)
@given(conv_configs())
def test_native_conv_models_match_onnx_reference(cfg) -> None:
    """Random convs compiled to native steps (static or symbolic input dims) against
    onnx's ReferenceEvaluator and geode's AICPU path."""
    xs, ws, attrs, dtype, bias, symbolic = cfg
    nd = len(xs) - 2
    for i in range(nd):
        span = attrs["dilations"][i] * (ws[2 + i] - 1) + 1
        pad = sum(attrs["pads"][i::nd]) if "pads" in attrs else 0
        if attrs["auto_pad"] in ("NOTSET", "VALID"):
            assume(xs[2 + i] + pad >= span)
    dims = ["N", xs[1], *(f"S{i}" for i in range(nd))] if symbolic else None
    model = conv_model(xs, ws, attrs, dtype, bias, dims)
    native = geode.compile(model)
    assert [(k.kind, k.engine) for k in native.kernels] == [("library", "aicore")]
    x = np.random.default_rng(1).standard_normal(xs).astype(dtype)
    got = native(x=x)["y"]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    aicpu = geode.compile(model, codegen=False)(x=x)["y"]
    np.testing.assert_allclose(got, aicpu, rtol=tol, atol=tol)


def test_convs_are_placed_on_aicore_as_library_ops() -> None:
    g = geode.Graph("net")
    rng = np.random.default_rng(0)
    x = g.input("x", ["N", 8, "H", "W"])
    w1 = g.constant(rng.standard_normal((16, 8, 3, 3)).astype(np.float32))
    b1 = g.constant(rng.standard_normal(16).astype(np.float32))
    y = g.op("Conv", x, w1, b1, pads=[1, 1, 1, 1], strides=[2, 2], name="c1")  # + its Relu
    w2 = g.constant(rng.standard_normal((16, 1, 3, 3)).astype(np.float32))
    z = g.op("Conv", geode.ops.relu(y), w2, pads=[1, 1, 1, 1], group=16, name="c2")
    w3 = g.constant(rng.standard_normal((4, 16, 1, 1)).astype(np.float32))
    g.output(g.op("Conv", z, w3, name="c3"), names=["out"])
    model = geode.compile(g)
    kinds = {k.name: (k.kind, k.engine) for k in model.kernels}
    assert all(kinds[n] == ("library", "aicore") for n in ("c1_fused", "c2", "c3")), kinds
    text = model.explain()
    fused = "library op: FusedConv, direct register-blocked kernel + relu, native"
    assert f"c1_fused: aicore ({fused} (not Winograd: strides (2, 2)" in text
    assert "c2: aicore (library op: Conv, direct depthwise kernel, native)" in text
    assert "c3: aicore (library op: Conv, 1x1 BLAS GEMM, native)" in text
    info = {k.name: k for k in model.kernels}
    assert info["c2"].trace.startswith("depthwise 2-D float32") and "define" in info["c2"].source
    vals = {v.name: v.data for v in g.values.values() if v.data is not None}
    for shape in ((2, 8, 9, 11), (1, 8, 4, 4)):  # one compiled model, several input sizes
        xv = rng.standard_normal(shape).astype(np.float32)
        h = np.maximum(
            conv_nd(xv, vals[w1.name], vals[b1.name], {"pads": [1] * 4, "strides": [2, 2]}), 0
        )
        h = conv_nd(h, vals[w2.name], None, {"pads": [1] * 4, "group": 16})
        want = conv_nd(h, vals[w3.name], None, {})
        np.testing.assert_allclose(model(x=xv)["out"], want, rtol=1e-4, atol=1e-4)


def test_weights_given_at_run_time_with_a_static_shape_go_native() -> None:
    g = geode.Graph("wconv")
    x, w = g.input("x", ["N", 3, 6, 6]), g.input("w", [5, 3, 3, 3])
    g.output(g.op("Conv", x, w, pads=[1, 1, 1, 1], name="c"), names=["y"])
    model = geode.compile(g)
    assert [k.kind for k in model.kernels] == ["library"]
    rng = np.random.default_rng(3)
    xv, wv = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((5, 3, 3, 3))
    xv, wv = xv.astype(np.float32), wv.astype(np.float32)
    want = conv_nd(xv, wv, None, {"pads": [1, 1, 1, 1]})
    np.testing.assert_allclose(model(x=xv, w=wv)["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "build, reason",
    [
        (
            lambda g: (g.input("x", [1, 2, 5, 5], "float16"), np.ones((3, 2, 3, 3), np.float16)),
            "float16",
        ),
        (
            lambda g: (g.input("x", [1, 2, 4, 5, 5]), np.ones((3, 2, 3, 3, 3), np.float32)),
            "X is not 3-D or 4-D",
        ),
        (
            lambda g: (g.input("x", [1, 2, 5, 5]), g.input("w", [3, 2, "K", "K"])),
            "W's shape is not static",
        ),
    ],
    ids=["float16", "3-D", "symbolic W"],
)
def test_convs_that_stay_on_aicpu_say_why(build, reason) -> None:
    g = geode.Graph("stay")
    x, w = build(g)
    w = w if isinstance(w, geode.Value) else g.constant(w)
    g.output(g.op("Conv", x, w, name="c"), names=["y"])
    model = geode.compile(g)
    assert [k.engine for k in model.kernels] == ["aicpu"]
    assert f"c: aicpu (library op: reference kernel (Conv: {reason}" in model.explain()
    off = geode.compile(g, codegen=False)
    assert "Conv, " not in off.explain() and [k.engine for k in off.kernels] == ["aicpu"]
