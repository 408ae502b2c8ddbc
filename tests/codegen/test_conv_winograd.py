"""The Winograd conv (runtime/native/winograd.c through backends/llvm/conv_winograd.py):
random shapes against the reference kernel (odd sizes, padding 0 and 1 or uneven, SAME
and VALID, channels that are no multiple of the vector width, batches, every epilogue, 1
to 3 threads, each vector path), the filter transform, the choice by shape and its record in ``explain()``, and the
convs it must not take."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import geode
from geode.codegen.backends.llvm.conv import conv_kernel
from geode.codegen.backends.llvm.conv_spec import WINOGRAD_MIN_CHANNELS, ConvSpec, f4_width
from geode.codegen.winograd_weights import transform_filters
from geode.compiler.ops.nn import conv_nd
from geode.runtime import native

TOL = 3e-5


def spec_of(c: int, m: int, pad, bias: bool, residual: bool, relu: bool, **kw) -> ConvSpec:
    """A float32 3x3 conv's spec (``pad``: one pad for every side, or the four;
    ``kw``: fields to change)."""
    base = ConvSpec(
        dtype="float32",
        spatial=2,
        channels=c,
        out_channels=m,
        group=1,
        kernel=(3, 3),
        strides=(1, 1),
        dilations=(1, 1),
        pads=tuple(pad) if isinstance(pad, (tuple, list)) else (pad,) * 4,
        auto_pad="NOTSET",
        bias=bias,
        residual=residual,
        activation="relu" if relu else "",
        choice="winograd",
    )
    return dataclasses.replace(base, **kw)


def run_case(n, c, m, h, w, pad, bias, residual, relu, seed, tile, threads=(1, 2, 3)) -> None:
    """The Winograd kernel of the case on every thread count: the reference's result,
    the same bits on each."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    attrs = {"pads": list(pad) if isinstance(pad, (tuple, list)) else [pad] * 4}
    want = conv_nd(x, wt, b, attrs)
    z = rng.standard_normal(want.shape).astype(np.float32) if residual else None
    if z is not None:
        want = want + z
    if relu:
        want = np.maximum(want, 0)
    spec = spec_of(c, m, pad, bias, residual, relu, winograd_tile=tile)
    assert spec.method == "winograd"
    k = conv_kernel(spec)
    u = np.concatenate([transform_filters(wt, t) for t in spec.winograd_tiles])
    first = None
    for t in threads:
        y = np.full(want.shape, np.nan, np.float32)
        k(*[a for a in (x, u, b, z, y) if a is not None], threads=t)
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(y, want, rtol=TOL, atol=TOL * scale)
        if first is None:
            first = y
        else:
            np.testing.assert_array_equal(y, first)  # the same bits on any thread count


@st.composite
def cases(draw):
    """A random Winograd conv: odd sizes (partial tiles), padding 0 or 1 or uneven pads,
    channels off the vector width, batch 1 to 3, each epilogue."""
    pad = draw(st.integers(0, 1))
    if draw(st.booleans()):  # or four pads of 0 to 2: top, left, bottom, right
        pad = tuple(draw(st.integers(0, 2)) for _ in range(4))
    pt, pl, pb, pr = pad if isinstance(pad, tuple) else (pad,) * 4
    return {
        "n": draw(st.integers(1, 3)),
        "c": draw(st.integers(1, 20)),
        "m": draw(st.integers(1, 19)),
        "h": draw(st.integers(max(1, 3 - pt - pb), 13)),
        "w": draw(st.integers(max(1, 3 - pl - pr), 110)),
        "tile": draw(st.sampled_from([2, 4, 0])),  # 0: both, by the width at run time
        "pad": pad,
        "bias": draw(st.booleans()),
        "residual": draw(st.booleans()),
        "relu": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)),
    }


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_winograd_matches_the_reference_over_random_shapes(case) -> None:
    """Random shapes, tiles and epilogues on 1, 2 and 3 threads."""
    run_case(**case)


@pytest.mark.parametrize(
    "shape, tile",
    [
        ((2, 32, 32, 17, 33, 1), 2),  # 17 tiles a row: a vector of 8 and a partial one
        ((1, 64, 64, 16, 16, 1), 2),  # the small cnn's 64-channel conv
        ((1, 3, 9, 50, 50, 0), 2),  # 24 tiles a row: one item of three vectors, its tail
        ((3, 17, 13, 7, 130, 1), 2),  # 65 tiles a row: three items, one lane in the last
        ((2, 32, 32, 17, 33, 1), 4),  # 9 tiles a row: a vector of 8 and one lane
        ((1, 32, 32, 32, 32, 1), 4),  # the small cnn's 32-channel convs
        ((1, 5, 9, 14, 98, 0), 4),  # 24 tiles a row: one item of three vectors
        ((2, 17, 13, 9, 230, 1), 4),  # 58 tiles a row: three items, two lanes in the last
        ((1, 16, 16, 8, 12, 1), 0),  # both transforms: 12 columns take F(2x2)
        ((1, 16, 16, 8, 24, 1), 0),  # and 24 F(4x4)
        ((1, 16, 16, 8, 16, 1), 0),  # 16 F(4x4) in row groups
        ((1, 16, 16, 8, 3, 1), 0),  # 3 F(2x2)
        ((2, 16, 16, 8, 7, 1), 0),  # 7 F(4x4) in row groups
        ((1, 32, 32, 64, 70, 1), 4),  # over 1 MB of X, Y (and Z): the prefetching path
        ((1, 64, 64, 16, 16, 1), 4),  # 4 tiles a row: row groups of 2, the small cnn's b2
        ((2, 24, 17, 15, 14, 1), 4),  # 4 tiles a row, 4 tile rows, batch 2: 2 groups each
        ((3, 19, 9, 13, 13, 1), 4),  # 4 tiles a row, the last one partial, a group's row out
        ((2, 16, 33, 11, 7, 1), 4),  # 2 tiles a row: row groups of 4, the last half out
        ((1, 17, 16, 40, 8, 1), 4),  # 2 tiles a row, 10 tile rows: 3 groups, several items
        ((1, 8, 8, 9, 8, 0), 4),  # no padding: 6 columns, 2 tiles a row, 7 rows
        ((2, 9, 10, 21, 29, 1), 4),  # 8 tiles a row: a vector a tile row, items of rows
        ((1, 33, 8, 40, 34, 0), 4),  # 32 columns unpadded, 10 tile rows: 8 x 3 products
        ((1, 20, 24, 9, 26, 1), 4),  # 7 tiles a row: a vector a tile row, one lane empty
        ((2, 16, 17, 14, 20, 0), 4),  # 18 columns unpadded: 5 tiles a row, the last partial
        # the zmm path's layouts (16 lanes), where the CPU runs it
        ((1, 20, 24, 18, 32, 1), 4),  # 8 tiles a row: groups of 2 tile rows, the last half out
        ((2, 16, 20, 13, 15, 1), 4),  # 4 tiles a row, the last partial: groups of 4 rows
        ((1, 24, 40, 16, 16, 1), 4),  # one item of 16 tiles split by output channels
        ((1, 9, 21, 10, 66, 1), 4),  # 17 tiles a row: 2 vectors of 16, one lane in the last
        ((1, 7, 11, 9, 36, 0), 4),  # 9 tiles a row unpadded: a vector a tile row
    ],
)
def test_winograd_on_resnet_shapes(shape, tile) -> None:
    """Rows of several items, every epilogue, both tiles."""
    n, c, m, h, w, pad = shape
    run_case(n, c, m, h, w, pad, True, True, True, seed=1, tile=tile)
    run_case(n, c, m, h, w, pad, False, False, False, seed=2, tile=tile, threads=(2,))


@pytest.mark.parametrize("isa", [0, 1, 2, 3])
@pytest.mark.parametrize("tile", [2, 4])
def test_each_vector_path(isa, tile) -> None:
    """The plain C, AVX2, AVX-512VL and AVX-512 zmm paths (those this CPU runs) give the
    reference's result (F(4x4) on 14 columns: row groups; on 27 columns the zmm path
    takes its 8-lane layout)."""
    try:
        old = native._ext._set_winograd_isa(isa)
    except ValueError:
        pytest.skip(f"this CPU cannot run path {isa}")
    try:
        assert native.pool_info()["winograd_isa"] == isa
        run_case(2, 19, 21, 11, 37, 1, True, True, True, seed=3, tile=tile)
        run_case(2, 19, 21, 11, 14, 1, True, True, True, seed=4, tile=tile)  # row groups
        run_case(1, 19, 21, 13, 27, 1, True, True, True, seed=5, tile=tile)  # 7 tiles a row
    finally:
        native._ext._set_winograd_isa(old)


@pytest.mark.parametrize(
    "shape",
    [
        (2, 19, 21, 11, 37, 1),  # 10 tiles a row: a vector of 16 a tile row
        (1, 32, 32, 32, 32, 1),  # 8 tiles a row: row groups of 2
        (1, 64, 64, 16, 16, 1),  # 4 tiles a row: row groups of 4, split by output channels
        (2, 17, 13, 9, 230, 1),  # 58 tiles a row: items of 2 vectors of 16, a partial one
        (1, 13, 18, 21, 27, 1),  # 7 tiles a row: the 8-lane layout
    ],
)
def test_zmm_path_gives_the_8_lane_bits(shape) -> None:
    """The AVX-512 zmm path (16 lanes) and the AVX-512VL one (8) compute every output the
    same way (fused products and sums, in the same order): the same bits, on 1 to 3
    threads."""
    try:
        old = native._ext._set_winograd_isa(3)
    except ValueError:
        pytest.skip("this CPU cannot run the zmm path")
    n, c, m, h, w, pad = shape
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    z = rng.standard_normal((n, m, h, w)).astype(np.float32)
    k = conv_kernel(spec_of(c, m, pad, True, True, True, winograd_tile=4))
    u = transform_filters(wt, 4)
    got = {}
    try:
        for isa in (3, 2):
            native._ext._set_winograd_isa(isa)
            for t in (1, 2, 3):
                y = np.full((n, m, h, w), np.nan, np.float32)
                k(x, u, b, z, y, threads=t)
                got[isa, t] = y
    finally:
        native._ext._set_winograd_isa(old)
    for key, y in got.items():
        np.testing.assert_array_equal(y, got[2, 1], err_msg=str(key))


@pytest.mark.parametrize("tile", [2, 4])
def test_relu_keeps_nan_and_transform_is_exact(tile) -> None:
    """NaN in the input reaches every output the reference's NaN reaches, through the
    fused Relu (Winograd spreads it further, to the whole output tiles whose input
    windows hold it: a limitation of the method, docs/performance.md); the filter
    transform is G g G^T."""
    g = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    big = {
        2: np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
        4: np.array(
            [
                [1 / 4, 0, 0],
                [-1 / 6, -1 / 6, -1 / 6],
                [-1 / 6, 1 / 6, -1 / 6],
                [1 / 24, 1 / 12, 1 / 6],
                [1 / 24, -1 / 12, 1 / 6],
                [0, 0, 1],
            ]
        ),
    }[tile]
    want_u = (big @ g[0, 0] @ big.T).ravel()
    np.testing.assert_allclose(transform_filters(g, tile)[:, 0, 0], want_u, rtol=1e-6)
    k = conv_kernel(spec_of(2, 3, 1, False, False, True, winograd_tile=tile))
    x = np.ones((1, 2, 6, 6), np.float32)
    x[0, 0, 2, 2] = np.nan
    y = np.zeros((1, 3, 6, 6), np.float32)
    k(x, transform_filters(np.ones((3, 2, 3, 3), np.float32), tile), y)
    want = np.maximum(conv_nd(x, np.ones((3, 2, 3, 3), np.float32), None, {"pads": [1] * 4}), 0)
    assert np.isnan(want).any() and np.isnan(y)[np.isnan(want)].all()
    clean = ~np.isnan(y)
    np.testing.assert_allclose(y[clean], want[clean], rtol=TOL)
    # the NaN at row and column 2 lies in the windows of output tiles 0 and 1 (F(2x2):
    # outputs 0..3) or tile 0 (F(4x4): outputs 0..3); the last output row and column
    # are NaN-free either way
    assert not np.isnan(y[..., 5, :]).any() and not np.isnan(y[..., :, 5]).any()


@pytest.mark.parametrize("width", [4, 5, 8, 9, 12, 13, 16, 17, 23, 24])
def test_run_time_tile_follows_the_rule(width) -> None:
    """With the width known only at run time the kernel picks the tile
    ``conv_spec.f4_width`` gives: the same bits as the kernel of that tile alone (the
    two tiles round differently)."""
    rng = np.random.default_rng(width)
    x = rng.standard_normal((1, 16, 9, width)).astype(np.float32)
    wt = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    want_tile = 4 if f4_width(width) else 2
    outs = []
    for tile in (0, want_tile, 6 - want_tile):
        spec = spec_of(16, 16, 1, False, False, False, winograd_tile=tile)
        u = np.concatenate([transform_filters(wt, t) for t in spec.winograd_tiles])
        y = np.empty((1, 16, 9, width), np.float32)
        conv_kernel(spec)(x, u, y, threads=1)
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pads(auto_pad) -> None:
    """SAME pads (computed at run time) and VALID, against the reference."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 9, 30)).astype(np.float32)
    w = rng.standard_normal((6, 5, 3, 3)).astype(np.float32)
    want = conv_nd(x, w, None, {"auto_pad": auto_pad})
    spec = spec_of(5, 6, 0, False, False, False, auto_pad=auto_pad)
    y = np.full(want.shape, np.nan, np.float32)
    conv_kernel(spec)(x, np.concatenate([transform_filters(w, t) for t in (2, 4)]), y)
    np.testing.assert_allclose(y, want, rtol=TOL, atol=TOL * 10)


def test_the_raw_weight_is_refused() -> None:
    """The entry takes the transform (16, M, C), not the weight: a clear argument error."""
    k = conv_kernel(spec_of(4, 5, 1, False, False, False))
    x = np.zeros((1, 4, 6, 6), np.float32)
    y = np.zeros((1, 5, 6, 6), np.float32)
    with pytest.raises(ValueError, match="argument U"):
        k(x, np.zeros((5, 4, 3, 3), np.float32), y)
    with pytest.raises(ValueError, match="argument U"):  # F(2x2)'s transform for F(4x4)
        k(x, np.zeros((16, 5, 4), np.float32), y)


def test_which_convs_take_winograd() -> None:
    """By shape under ``auto``; never for stride 2, dilation, groups, other windows,
    float64, a fused MaxPool or ``choice="direct"``; each with its reason."""
    big = WINOGRAD_MIN_CHANNELS
    spec = spec_of(big, big, 1, True, True, True, choice="auto")
    assert spec.method == "winograd" and "measured faster" in spec.reason
    small = spec_of(big - 1, big, 1, True, False, True, choice="auto")
    assert small.method == "direct" and "not Winograd" in small.reason
    assert spec_of(3, 3, 1, True, False, False).method == "winograd"  # forced
    # narrow outputs (9-12 and below 5 columns): F(2x2,3x3), from 32 channels and 4 columns
    narrow = spec_of(32, 64, 1, True, False, True, choice="auto", out_width=12)
    assert narrow.method == "winograd" and narrow.tile_side == 2
    assert "F(2x2,3x3)" in narrow.reason and "width 12" in narrow.reason
    for c, width in ((16, 12), (31, 10), (64, 3), (15, 16)):
        s = spec_of(c, c, 1, True, False, True, choice="auto", out_width=width)
        assert s.method == "direct" and "not Winograd" in s.reason, s.reason
    # F(4x4,3x3) from 13 columns and at 5-8, from 16 channels; row groups up to 32
    rows = ((16, "4 tiles a row, 2 tile rows"), (13, "4 tiles a row, 2 tile rows"))
    rows += ((8, "2 tiles a row, 4 tile rows"), (5, "2 tiles a row, 4 tile rows"))
    for width, group in (*rows, (20, "5 tiles a row, one tile row")):
        s = spec_of(16, 16, 1, True, False, True, choice="auto", out_width=width)
        assert s.method == "winograd" and s.tile_side == 4, (width, s.reason)
        assert f"F(4x4,3x3) in row groups ({group} a vector)" in s.reason
    for width in (4, 9, 12):
        assert spec_of(32, 32, 1, True, False, True, out_width=width).tile_side == 2
    for width in (5, 8, 13, 17, 23, 24, 100):
        assert spec_of(32, 32, 1, True, False, True, out_width=width).tile_side == 4
    assert spec.tile_side == 0 and spec.winograd_tiles == (2, 4)  # width known at run time
    assert "F(4x4,3x3), F(2x2,3x3) below 13 columns but at 5-8" in spec.reason
    blocked = {
        "strides": dict(strides=(2, 2)),
        "dilations": dict(dilations=(2, 2)),
        "group": dict(group=2),
        "window": dict(kernel=(5, 5)),
        "float64": dict(dtype="float64"),
        "MaxPool": dict(pool=(2, 2, 2, 2, 0, 0, 0, 0)),
        "constant": dict(constant_weight=False),
    }
    for word, change in blocked.items():
        s = spec_of(big, big, 1, True, False, True, **change)
        assert s.method != "winograd" and word in s.reason, (word, s.reason)
    assert spec_of(big, big, 1, True, True, True, choice="direct").method == "direct"


def cnn_block(c: int, m: int, stride: int) -> onnx.ModelProto:
    """Conv (3x3, pads 1) + BatchNormalization + residual Add + Relu, as in the cnn."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((m, c, 3, 3)) * 0.1).astype(np.float32), "W"),
        numpy_helper.from_array(rng.random(m).astype(np.float32) + 0.5, "scale"),
        numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.random(m).astype(np.float32) + 0.5, "var"),
    ]
    out = 28 // stride
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1] * 4, strides=[stride] * 2),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
        helper.make_node("Add", ["bn", "Z"], ["a"]),
        helper.make_node("Relu", ["a"], ["Y"]),
    ]
    ins = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, c, 28, 28]),
        helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2, m, out, out]),
    ]
    outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, m, out, out])]
    graph = helper.make_graph(nodes, "block", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("stride", [1, 2])
def test_cnn_conv_picks_winograd_and_explain_says_so(stride, tmp_path) -> None:
    """The cnn's 32->32 conv with its folded BN, residual and Relu runs Winograd (its
    result the reference's, also from a saved model file); stride 2 keeps the direct
    kernel; explain() says which and why."""
    model = cnn_block(32, 32, stride)
    m = geode.compile(model)
    text = m.explain()
    rng = np.random.default_rng(1)
    out = 28 // stride
    feeds = {
        "X": rng.standard_normal((2, 32, 28, 28)).astype(np.float32),
        "Z": rng.standard_normal((2, 32, out, out)).astype(np.float32),
    }
    ref = geode.compile(model, codegen=False)
    want = ref(**feeds)["Y"]
    got = m(**feeds)["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if stride == 1:
        assert "Winograd kernel + residual add + relu" in text
        why = "Winograd F(4x4,3x3) in row groups (7 tiles a row, one tile row a vector): C=32"
        assert why in text and "measured faster" in text
        path = tmp_path / "block.geode"
        m.save(path)
        np.testing.assert_array_equal(geode.load(path)(**feeds)["Y"], got)
    else:
        assert "direct register-blocked kernel" in text
        assert "not Winograd: strides (2, 2)" in text
