"""The direct conv kernel (backends/llvm/conv_direct.py) and the fused epilogues of the
native convs (residual add, Relu, MaxPool): random shapes against the reference kernels
(``conv_nd``, ``max_pool_nd``), every method with and without the epilogue, the forced
im2col choice, and the argument checks of the residual."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from geode.codegen.backends.llvm.conv import conv_kernel
from geode.codegen.backends.llvm.conv_spec import ConvSpec
from geode.codegen.backends.llvm.library import blas
from geode.compiler.ops.nn import conv_nd, max_pool_nd

pytestmark = pytest.mark.skipif(blas() is None, reason="no BLAS in numpy's wheel or process")

TOL = {"float32": 3e-5, "float64": 1e-11}


def make_spec(xs, ws, attrs, dtype, bias, residual=False, activation="", pool=(), choice="auto"):
    """The ConvSpec of a 2-D conv (``attrs``: ONNX Conv attributes)."""
    return ConvSpec(
        dtype=dtype,
        spatial=2,
        channels=xs[1],
        out_channels=ws[0],
        group=attrs.get("group", 1),
        kernel=tuple(ws[2:]),
        strides=tuple(attrs.get("strides", [1, 1])),
        dilations=tuple(attrs.get("dilations", [1, 1])),
        pads=tuple(attrs.get("pads", [0, 0, 0, 0])),
        auto_pad="NOTSET",
        bias=bias,
        residual=residual,
        activation=activation,
        pool=tuple(pool),
        choice=choice,
    )


def reference(x, w, b, z, attrs, activation, pool):
    """conv, + z, relu, maxpool by the reference kernels."""
    y = conv_nd(x, w, b, attrs)
    if z is not None:
        y = y + z
    if activation == "relu":
        y = np.maximum(y, 0)
    if pool:
        kp = {"kernel_shape": list(pool[:2]), "strides": list(pool[2:4]), "pads": list(pool[4:])}
        y = max_pool_nd(y, kp)[0]
    return y


def check(xs, ws, attrs, dtype="float32", bias=True, residual=False, activation="", pool=(),
          choice="auto", seed=0, method=None):  # fmt: skip
    """Run the native conv of the case and compare it with the reference."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype) if bias else None
    plain = conv_nd(x, w, b, attrs)
    z = rng.standard_normal(plain.shape).astype(dtype) if residual else None
    want = reference(x, w, b, z, attrs, activation, pool)
    spec = make_spec(xs, ws, attrs, dtype, bias, residual, activation, pool, choice)
    if method is not None:
        assert spec.method == method
    k = conv_kernel(spec)
    y = np.full(want.shape, np.nan, dtype)
    k(*[a for a in (x, w, b, z, y) if a is not None])
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=TOL[dtype], atol=TOL[dtype] * 10)
    return spec


@st.composite
def conv_cases(draw):
    """A random 2-D conv that is not depthwise: shapes, window, groups, dtype, epilogue."""
    group = draw(st.integers(1, 3))
    cg, mg = draw(st.integers(1, 5)), draw(st.integers(1, 11))
    assume(cg > 1 or group == 1)  # one input channel per group: the depthwise kernel's
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    n = draw(st.sampled_from([0, 1, 2]))
    h = draw(st.integers(1, 12)) + (kh - 1) * dh
    wd = draw(st.integers(1, 40)) + (kw - 1) * dw
    attrs = {"group": group, "strides": [sh, sw], "dilations": [dh, dw], "pads": pads}
    return {
        "xs": (n, cg * group, h, wd),
        "ws": (mg * group, cg, kh, kw),
        "attrs": attrs,
        "dtype": draw(st.sampled_from(["float32", "float64"])),
        "bias": draw(st.booleans()),
        "residual": draw(st.booleans()),
        "activation": draw(st.sampled_from(["", "relu"])),
        "seed": draw(st.integers(0, 1000)),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv_cases())
def test_native_convs_match_the_reference_over_random_shapes(case) -> None:
    """Random convs (groups, strides, dilations, padding, odd sizes, 1x1, batch 0/1/2,
    float32/float64) with a random epilogue, by the method the shape picks."""
    check(**case)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv_cases())
def test_forced_im2col_matches_the_reference(case) -> None:
    """``choice="im2col"``: the GEMM path with the epilogue as a pass after it."""
    spec = check(**case, choice="im2col")
    assert spec.method in ("im2col", "pointwise")


@st.composite
def pooled_cases(draw):
    """A random conv (horizontal stride 1 or 2) followed by a random MaxPool."""
    case = draw(conv_cases())
    case["residual"] = False
    pkh, pkw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pool = [pkh, pkw, draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    pool += [draw(st.integers(0, k - 1)) for k in (pkh, pkw, pkh, pkw)]
    xs, ws, a = case["xs"], case["ws"], case["attrs"]
    oh = xs[2] + a["pads"][0] + a["pads"][2] - a["dilations"][0] * (ws[2] - 1) - 1
    ow = xs[3] + a["pads"][1] + a["pads"][3] - a["dilations"][1] * (ws[3] - 1) - 1
    oh, ow = oh // a["strides"][0] + 1, ow // a["strides"][1] + 1
    assume(oh + pool[4] + pool[6] >= pkh and ow + pool[5] + pool[7] >= pkw)
    case["pool"] = tuple(pool)
    return case


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=pooled_cases())
def test_conv_with_max_pool_matches_the_reference(case) -> None:
    """Conv (+ Relu) + MaxPool in one direct kernel: any window, stride and pads of the
    pool, bands of conv rows cut anywhere."""
    check(**case, method="direct")


@pytest.mark.parametrize(
    "xs, ws, attrs",
    [
        ((1, 3, 64, 64), (32, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # the 3-channel stem
        ((2, 32, 17, 33), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((1, 32, 16, 16), (64, 32, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
        ((1, 32, 15, 15), (64, 32, 1, 3), {"strides": [2, 2], "pads": [0, 1, 0, 1]}),
        ((1, 12, 9, 70), (20, 12, 3, 5), {"pads": [2, 1, 0, 3], "dilations": [2, 3]}),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_direct_kernel_on_resnet_shapes(xs, ws, attrs, dtype) -> None:
    """Channel blocks with a remainder (20 = 2 * 8 + 4), several tiles per row and a
    masked tail, stride 2's even lanes, with every epilogue."""
    check(xs, ws, attrs, dtype, choice="direct", method="direct")
    check(xs, ws, attrs, dtype, residual=True, activation="relu", choice="direct", method="direct")
    check(xs, ws, attrs, dtype, activation="relu", pool=(3, 3, 2, 2, 1, 1, 1, 1))


def test_direct_kernel_band_budget(monkeypatch) -> None:
    """A tiny band budget: one output row per item, each item its own padded band."""
    from geode.codegen.backends.llvm import conv_direct

    monkeypatch.setattr(conv_direct, "BAND_BUDGET_BYTES", 64)
    check((2, 6, 11, 19), (9, 6, 3, 3), {"pads": [1, 1, 1, 1]}, residual=True, seed=3)
    check((2, 6, 11, 19), (9, 6, 3, 3), {"pads": [1, 1, 1, 1]}, pool=(2, 3, 2, 2, 0, 1, 1, 0))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("pool", [(), (3, 3, 2, 2, 1, 1, 1, 1)])
def test_bands_per_thread_count(pool, dtype) -> None:
    """One image on one thread is one band (on two, 4 items a thread: bands of 3, 3, 3, 2
    output rows, or pooled rows sharing conv rows at their edges); every cut gives the
    reference's result, stride 2 and odd sizes included."""
    rng = np.random.default_rng(5)
    xs, ws = (1, 5, 23, 21), (9, 5, 3, 3)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 2]} if not pool else {"pads": [1, 0, 1, 2]}
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in (xs, ws, ws[:1]))
    want = reference(x, w, b, None, attrs, "relu", pool)
    k = conv_kernel(make_spec(xs, ws, attrs, dtype, True, activation="relu", pool=pool))
    for threads in (1, 2, 0):
        y = np.full(want.shape, np.nan, dtype)
        k(x, w, b, y, threads=threads)
        np.testing.assert_allclose(y, want, rtol=TOL[dtype], atol=TOL[dtype] * 10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "pool", [(3, 3, 1, 1, 1, 1, 1, 1), (2, 2, 2, 2, 0, 0, 0, 0), (3, 2, 2, 1, 0, 1, 1, 0)]
)
def test_pooled_columns_as_vectors(pool, dtype) -> None:
    """Rows of 37 columns: the pooled columns a vector at a time, then the rest one by
    one (stride 1, stride 2, a 2-wide window), pads on either side."""
    check((2, 5, 9, 37), (7, 5, 3, 3), {"pads": [1, 1, 1, 1]}, dtype, activation="relu", pool=pool)


def test_relu_keeps_nan() -> None:
    """The fused Relu and MaxPool let NaN through, as the ops' kernels do."""
    spec = make_spec((1, 2, 6, 6), (3, 2, 3, 3), {"pads": [1, 1, 1, 1]}, "float32", False,
                     activation="relu", pool=(2, 2, 2, 2, 0, 0, 0, 0))  # fmt: skip
    x = np.ones((1, 2, 6, 6), np.float32)
    x[0, 0, 2, 2] = np.nan
    w = np.ones((3, 2, 3, 3), np.float32)
    y = np.zeros((1, 3, 3, 3), np.float32)
    conv_kernel(spec)(x, w, y)
    want = reference(x, w, None, None, {"pads": [1, 1, 1, 1]}, "relu", spec.pool)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    # 40 columns: pooled columns as vectors, NaN in lanes of the vector part
    spec = make_spec((1, 2, 6, 40), (3, 2, 3, 3), {"pads": [1, 1, 1, 1]}, "float32", False,
                     activation="relu", pool=(2, 2, 2, 2, 0, 0, 0, 0))  # fmt: skip
    x = np.ones((1, 2, 6, 40), np.float32)
    x[0, 1, 3, 5] = x[0, 0, 1, 30] = np.nan
    y = np.zeros((1, 3, 3, 20), np.float32)
    conv_kernel(spec)(x, w, y)
    want = reference(x, w, None, None, {"pads": [1, 1, 1, 1]}, "relu", spec.pool)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    assert np.isnan(y).any()


def test_residual_of_the_wrong_shape_is_refused() -> None:
    """Z must have Y's shape: the entry names the argument."""
    spec = make_spec((1, 4, 6, 6), (5, 4, 3, 3), {}, "float32", True, residual=True)
    k = conv_kernel(spec)
    x = np.zeros((1, 4, 6, 6), np.float32)
    w = np.zeros((5, 4, 3, 3), np.float32)
    b = np.zeros(5, np.float32)
    y = np.zeros((1, 5, 4, 4), np.float32)
    with pytest.raises(ValueError, match="argument Z"):
        k(x, w, b, np.zeros((1, 5, 4, 3), np.float32), y)


def test_spec_rejects_pooling_it_cannot_do() -> None:
    """Pooling needs the direct kernel: not with a residual, a 1-D conv or stride 3."""
    base = make_spec((1, 4, 6, 6), (5, 4, 3, 3), {}, "float32", True)
    for bad in (
        {"pool": (2, 2, 2, 2, 0, 0, 0, 0), "residual": True},
        {"pool": (2, 2, 2, 2, 0, 0, 0, 0), "strides": (1, 3)},
        {"pool": (2, 2, 0, 2, 0, 0, 0, 0)},
        {"activation": "gelu"},
        {"choice": "fft"},
    ):
        with pytest.raises(ValueError):
            dataclasses.replace(base, **bad)


def test_narrow_rows_take_more_channels_per_tile() -> None:
    """Rows of one or two vectors get tiles of 2 rows with the wide tile's 16
    accumulators (8 channels x 1 vector, 4 x 2; AVX2 4 x 1 x 2); chosen at run time by the
    output width, or the one blocking that holds a width known at compile time."""
    from geode.codegen.backends.llvm.conv_direct import NARROW_ROWS, blockings

    assert NARROW_ROWS == 2
    spec = make_spec((1, 32, 16, 16), (64, 32, 3, 3), {"strides": [2, 2]}, "float32", True)
    wide = (0, 4, 4, 1)
    assert blockings(spec, "+avx2,+avx512f") == [(1, 8, 1, 2), (2, 4, 2, 2), wide]
    assert blockings(spec, "+avx2,-avx512f") == [(1, 4, 1, 2), (0, 4, 2, 1)]
    few = dataclasses.replace(spec, out_channels=3)
    assert blockings(few, "+avx512f") == [(1, 3, 1, 2), (2, 3, 2, 2), (0, 3, 4, 1)]
    assert blockings(dataclasses.replace(spec, out_width=16), "+avx512f") == [(0, 8, 1, 2)]
    assert blockings(dataclasses.replace(spec, out_width=17), "+avx512f") == [(0, 4, 2, 2)]
    assert blockings(dataclasses.replace(spec, out_width=33), "+avx512f") == [wide]
    assert blockings(dataclasses.replace(spec, dtype="float64", out_width=17), "+avx512f") == [wide]


@pytest.mark.parametrize("vectors", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stride", [1, 2])
def test_narrow_and_wide_tiles_give_the_same_bits(stride, dtype, vectors) -> None:
    """The same conv on a narrow input (one or two vectors of output columns: the narrow
    tiles, 20 channels = 2 x 8 + 4 or 5 x 4, 2 rows a tile and an odd last row) and on a
    wider one whose first columns are the
    narrow one's (the wide tiles): the columns they share have the same bits, on any
    thread count; both match the reference."""
    rng = np.random.default_rng(11)
    lanes = 16 if dtype == "float32" else 8
    wide_x = rng.standard_normal((2, 6, 9, 4 * lanes * stride + 2)).astype(dtype)
    narrow_x = np.ascontiguousarray(wide_x[..., : vectors * lanes * stride + 1])
    w = rng.standard_normal((20, 6, 3, 3)).astype(dtype)
    b = rng.standard_normal(20).astype(dtype)
    attrs = {"pads": [1, 1, 1, 0], "strides": [stride, stride]}
    outs = []
    for x in (narrow_x, wide_x):
        spec = make_spec(x.shape, w.shape, attrs, dtype, True, activation="relu", choice="direct")
        want = reference(x, w, b, None, attrs, "relu", ())
        k = conv_kernel(spec)
        for threads in (1, 2, 0):
            y = np.full(want.shape, np.nan, dtype)
            k(x, w, b, y, threads=threads)
            np.testing.assert_allclose(y, want, rtol=TOL[dtype], atol=TOL[dtype] * 10)
            outs.append(y)
    ow = outs[0].shape[-1]
    assert ow == vectors * lanes
    for y in outs[1:3]:
        np.testing.assert_array_equal(y, outs[0])
    for y in outs[3:]:
        np.testing.assert_array_equal(y[..., :ow], outs[0])


@pytest.mark.parametrize(
    "ws, attrs",
    [
        ((64, 32, 1, 1), {"strides": [2, 2]}),  # the cnn's shortcut
        ((9, 5, 1, 1), {"strides": [3, 2], "pads": [1, 0, 2, 1]}),
        ((9, 5, 2, 1), {"strides": [3, 1]}),  # two rows a window, every third row
        ((9, 5, 1, 2), {"strides": [2, 2], "dilations": [1, 2]}),  # even columns only
        ((9, 6, 1, 1), {"strides": [2, 2], "group": 3}),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_strided_1x1_and_row_skipping_convs(ws, attrs, dtype) -> None:
    """Strided 1x1 convs run the direct kernel (``auto``); windows shorter than the
    vertical stride copy only the rows they read, a window that reads no odd column
    only the even half; any thread count, with the residual epilogue too."""
    xs = (2, ws[1] * attrs.get("group", 1), 19, 23)
    spec = check(xs, ws, attrs, dtype, method="direct")
    check(xs, ws, attrs, dtype, residual=True, activation="relu", method="direct")
    assert spec.method == "direct" and ("strided 1x1" in spec.reason) == (ws[2:] == (1, 1))
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    want = conv_nd(x, w, None, attrs)
    k = conv_kernel(make_spec(xs, ws, attrs, dtype, False))
    got = []
    for threads in (1, 2, 0):
        y = np.full(want.shape, np.nan, dtype)
        k(x, w, y, threads=threads)
        np.testing.assert_allclose(y, want, rtol=TOL[dtype], atol=TOL[dtype] * 10)
        got.append(y)
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])


@pytest.mark.parametrize("stride", [1, 2])
def test_scratch_copies_prefetch_rows_ahead(stride) -> None:
    """The band copy (stride 1's and stride 2's split halves) prefetches the input
    ``PREFETCH_ROWS`` rows below the row it copies."""
    from geode.codegen.backends.llvm.conv_depthwise import PREFETCH_ROWS

    spec = make_spec((1, 4, 9, 40), (8, 4, 3, 3), {"strides": [stride, stride]}, "float32", True)
    source = conv_kernel(dataclasses.replace(spec, choice="direct")).source
    pad = source[source.index(".pad(") :]
    pad = pad[: pad.index("\n}\n")]
    assert PREFETCH_ROWS > 0 and "call void @llvm.prefetch.p0(ptr %pf" in pad


def test_tiles_written_once_and_only_the_tails_a_row_reaches() -> None:
    """A body for any width (AVX-512, float32, 20 channels) writes each tile function
    once, however many row functions call it, and only the tails the rows of its
    blocking reach: whole vectors (the last one's store masked), 1 vector on the 1-vector
    rows, 2 on the 2-vector rows (17 to 32 columns), any on the wide rows."""
    import re

    from geode.codegen.backends.llvm.conv import conv_ir

    spec = make_spec((1, 6, 9, 40), (20, 6, 3, 3), {"pads": [1, 1, 1, 1]}, "float32", True)
    attrs = '"target-features"="+avx2,+fma,+avx512f"'
    _, ir = conv_ir(dataclasses.replace(spec, choice="direct"), attrs)
    tiles = re.findall(r"define internal void @\S+\.run\.(tile[\w.]+)\(", ir)
    assert len(tiles) == len(set(tiles))
    assert sorted(tiles) == sorted(
        [
            "tile8x2.16",  # 1-vector rows: 8 channels x 2 rows, and their 4 left over
            "tile4x2.16",
            "tile8x1.16",  # an odd last row
            "tile4x1.16",  # the odd row's 4 left over, the wide rows' 1-vector tail
            "tile4x2.16_16",  # 2-vector rows: only their 2-vector tile
            "tile4x1.16_16",  # shared by the 2-vector rows' odd row and the wide tails
            "tile4x1.16_16_16",
            "tile4x1.16_16_16_16",
        ]
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stride", [1, 2])
def test_every_row_width_takes_its_tiles(stride, dtype) -> None:
    """One kernel (the width unknown at compile time: every blocking) on rows of 1 to 70
    output columns: every blocking, every tail tile, masked and whole last vectors, 20
    channels (a remainder block) and odd row counts; against the reference, the same
    bits on 1 and 2 threads."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((20, 3, 3, 3)).astype(dtype)
    b = rng.standard_normal(20).astype(dtype)
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride]}
    spec = make_spec((1, 3, 7, 9), w.shape, attrs, dtype, True, activation="relu", choice="direct")
    k = conv_kernel(spec)
    for ow in range(1, 71):
        x = rng.standard_normal((1, 3, 7, ow * stride)).astype(dtype)
        want = reference(x, w, b, None, attrs, "relu", ())
        assert want.shape[-1] == ow
        outs = []
        for threads in (1, 2):
            y = np.full(want.shape, np.nan, dtype)
            k(x, w, b, y, threads=threads)
            outs.append(y)
        np.testing.assert_allclose(outs[0], want, rtol=TOL[dtype], atol=TOL[dtype] * 10)
        np.testing.assert_array_equal(outs[1], outs[0])
