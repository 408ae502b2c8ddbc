"""Conformance tests of the image ops (geode/compiler/ops/image.py) against ONNX:
Resize, GridSample, RoiAlign, Col2Im, MaxUnpool and DeformConv (``opcheck.check_op``:
reference kernel vs ``onnx.reference.ReferenceEvaluator``, inferred shapes vs kernel)."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import check_op, onnx_reference

import geode
from geode.errors import VerifyError

RNG = np.random.default_rng(11)


def _x(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# -- Resize ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize(
    "ctm",
    ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"],
)
def test_resize_scales(mode, ctm):
    x = _x((1, 2, 4, 5))
    scales = np.array([1, 1, 1.5, 0.6], np.float32)
    check_op(
        "Resize",
        [x, None, scales],
        {"mode": mode, "coordinate_transformation_mode": ctm},
        const_inputs=[2],
    )


@pytest.mark.parametrize(
    "nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
)
def test_resize_nearest_modes_to_sizes(nearest_mode):
    x = _x((1, 1, 3, 4))
    sizes = np.array([1, 1, 7, 9], np.int64)
    check_op("Resize", [x, None, None, sizes], {"nearest_mode": nearest_mode}, const_inputs=[3])


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio_with_axes(policy):
    x = _x((1, 1, 4, 6))
    sizes = np.array([5, 5], np.int64)
    check_op(
        "Resize",
        [x, None, None, sizes],
        {"axes": [2, 3], "keep_aspect_ratio_policy": policy, "mode": "linear"},
        const_inputs=[3],
    )


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_downsampling(mode):
    x = _x((1, 1, 8, 8))
    scales = np.array([1, 1, 0.4, 0.6], np.float32)
    check_op("Resize", [x, None, scales], {"mode": mode, "antialias": 1}, const_inputs=[2])


def test_resize_cubic_exclude_outside_and_coefficient():
    x = _x((1, 1, 4, 4))
    scales = np.array([1, 1, 2, 2], np.float32)
    check_op(
        "Resize",
        [x, None, scales],
        {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
        const_inputs=[2],
    )


def test_resize_tf_crop_and_resize():
    x = _x((1, 1, 4, 4))
    roi = np.array([0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7], np.float32)
    sizes = np.array([1, 1, 3, 3], np.int64)
    check_op(
        "Resize",
        [x, roi, None, sizes],
        {
            "mode": "linear",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 10.0,
        },
        const_inputs=[1, 3],
    )


def test_resize_uint8_rounds_and_saturates():
    x = RNG.integers(0, 255, (1, 1, 3, 3)).astype(np.uint8)
    check_op(
        "Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], {"mode": "cubic"}, const_inputs=[2]
    )


def test_resize_symbolic_shape_by_integral_scale():
    g = geode.Graph("r")
    x = g.input("x", ["N", 3, "H", "W"])
    y = g.op("Resize", x, None, g.constant(np.array([1, 1, 2, 2], np.float32)))
    assert str(y.shape) == "(N, 3, 2*H, 2*W)"


def test_resize_needs_scales_or_sizes():
    g = geode.Graph("r")
    x = g.input("x", [1, 1, 2, 2])
    with pytest.raises(VerifyError, match="scales"):
        g.op("Resize", x)


# -- GridSample ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    x = _x((2, 3, 4, 5))
    grid = RNG.uniform(-1.3, 1.3, (2, 3, 6, 2)).astype(np.float32)
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    if mode != "cubic":
        check_op("GridSample", [x, grid], attrs)
        return
    # the evaluator computes its cubic weights in float32 scalars (its float32 pixel
    # coordinates make them float32); geode's are double: compare at float32 precision
    (got,) = check_op("GridSample", [x, grid], attrs, compare=False)
    (want,) = onnx_reference("GridSample", [x, grid], attrs, 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_grid_sample_3d(mode):
    x = _x((1, 2, 3, 4, 5))
    grid = RNG.uniform(-1.2, 1.2, (1, 2, 3, 2, 3)).astype(np.float32)
    check_op("GridSample", [x, grid], {"mode": mode, "padding_mode": "border"})


# -- RoiAlign ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align(mode, ctm):
    x = _x((2, 3, 8, 8))
    rois = np.array([[0, 0, 7, 7], [1.5, 2.2, 6.1, 5.3], [4, 4, 12, 9]], np.float32)
    idx = np.array([0, 1, 1], np.int64)
    check_op(
        "RoiAlign",
        [x, rois, idx],
        {
            "mode": mode,
            "coordinate_transformation_mode": ctm,
            "output_height": 3,
            "output_width": 2,
            "sampling_ratio": 2,
            "spatial_scale": 0.9,
        },
    )


def test_roi_align_adaptive_sampling():
    x = _x((1, 2, 10, 10))
    rois = np.array([[1, 1, 9, 6]], np.float32)
    check_op(
        "RoiAlign", [x, rois, np.array([0], np.int64)], {"output_height": 2, "output_width": 3}
    )


# -- Col2Im / MaxUnpool -----------------------------------------------------------------------
def test_col2im_with_strides_pads_dilations():
    image, block = np.array([5, 6], np.int64), np.array([2, 3], np.int64)
    attrs = {"strides": [1, 2], "pads": [1, 0, 1, 1], "dilations": [2, 1]}
    # blocks: ((5 + 2 - 3) // 1 + 1) * ((6 + 1 - 3) // 2 + 1) = 5 * 3
    x = _x((2, 3 * 6, 15))
    check_op("Col2Im", [x, image, block], attrs, const_inputs=[1, 2])


def test_col2im_3d():
    x = _x((1, 2 * 8, 27))
    check_op(
        "Col2Im",
        [x, np.array([4, 4, 4], np.int64), np.array([2, 2, 2], np.int64)],
        const_inputs=[1, 2],
    )


def test_max_unpool_inverts_max_pool_with_output_shape():
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    idx = np.array([[[[5, 7], [13, 15]]]], np.int64)
    check_op("MaxUnpool", [x, idx], {"kernel_shape": [2, 2], "strides": [2, 2]})
    check_op(
        "MaxUnpool",
        [x, idx, np.array([1, 1, 5, 5], np.int64)],
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        const_inputs=[2],
    )


# -- DeformConv ------------------------------------------------------------------------------
def test_deform_conv_with_mask_groups_and_bias():
    x = _x((1, 4, 5, 5))
    w = _x((4, 2, 2, 2))
    offset = RNG.uniform(-1.5, 1.5, (1, 2 * 2 * 2 * 2, 4, 4)).astype(np.float32)
    mask = RNG.uniform(0, 1, (1, 2 * 2 * 2, 4, 4)).astype(np.float32)
    b = _x((4,))
    check_op(
        "DeformConv",
        [x, w, offset, b, mask],
        {"group": 2, "offset_group": 2, "kernel_shape": [2, 2]},
    )


def test_deform_conv_strides_pads_dilations():
    x = _x((2, 2, 6, 6))
    w = _x((3, 2, 3, 3))
    offset = RNG.uniform(-1, 1, (2, 18, 3, 3)).astype(np.float32)
    check_op(
        "DeformConv", [x, w, offset], {"strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1]}
    )
