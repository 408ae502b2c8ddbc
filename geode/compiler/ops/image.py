"""Image and spatial-sampling ops: Resize, GridSample, RoiAlign, AffineGrid, Col2Im,
MaxUnpool.

Reference kernels follow ONNX semantics (Resize-19, GridSample-22, RoiAlign-16,
AffineGrid-20, Col2Im-18, MaxUnpool-22). They are vectorized numpy: Resize is separable
and resizes one axis at a time (every output position reads ``n`` input taps with
weights from the interpolation kernel), GridSample gathers the tensor product of the
per-dimension taps.

All of them run on the AICPU engine (OpKind.OPAQUE). Output shapes that depend on input
values (Resize's ``scales``/``sizes``, MaxUnpool's ``output_shape``) are computed at
compile time when those inputs are constants and are fresh symbols otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.nn import conv_shape
from geode.compiler.ops.registry import (
    REQUIRED,
    Attr,
    In,
    InferContext,
    OpDef,
    OpKind,
    Out,
    register,
)
from geode.compiler.shapes import Dim, as_dim, dims_equal
from geode.errors import ShapeError, VerifyError
from geode.lazy import sympy

_FLOATS = dtypes.FLOATS
_I64 = frozenset([np.dtype(np.int64)])
#: dtypes Resize reads and writes (floats and 8-bit images, as ONNX allows)
RESIZE_TYPES = dtypes.NUMERIC | dtypes.BOOL


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _saturate_to(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float result in ``dtype``: integers round half to even and saturate."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.rint(y), info.min, info.max).astype(dtype)
    if dtype == np.bool_:
        return y != 0
    return y.astype(dtype)


# == Resize ======================================================================================
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _cubic_kernel(x: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with parameter ``a`` (0 beyond |x| >= 2)."""
    x = np.abs(x)
    x2, x3 = x * x, x * x * x
    near = (a + 2) * x3 - (a + 3) * x2 + 1
    far = a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _linear_kernel(x: np.ndarray) -> np.ndarray:
    return np.clip(1 - np.abs(x), 0, None)


def source_coords(
    mode: str, out_size: int, in_size: int, scale: float, roi: tuple[float, float] | None
) -> np.ndarray:
    """Input coordinate of every output position along one axis (Resize's
    ``coordinate_transformation_mode``)."""
    y = np.arange(out_size, dtype=np.float64)
    length = scale * in_size  # the unrounded output length
    if mode == "align_corners":
        return np.zeros(out_size) if length == 1 else y * (in_size - 1) / (length - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "pytorch_half_pixel":
        return np.full(out_size, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / length)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "tf_crop_and_resize":
        lo, hi = roi if roi is not None else (0.0, 1.0)
        if length == 1:
            x = np.full(out_size, (hi - lo) * (in_size - 1) / 2)
        else:
            x = y * (hi - lo) * (in_size - 1) / (length - 1)
        return x + lo * (in_size - 1)
    raise ShapeError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _nearest_index(x: np.ndarray, nearest_mode: str) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        r = np.ceil(x - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        r = np.floor(x + 0.5)
    elif nearest_mode == "floor":
        r = np.floor(x)
    elif nearest_mode == "ceil":
        r = np.ceil(x)
    else:
        raise ShapeError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    return r.astype(np.int64)


def resize_axis(
    data: np.ndarray,
    axis: int,
    out_size: int,
    scale: float,
    attrs: dict[str, Any],
    roi: tuple[float, float] | None,
) -> np.ndarray:
    """Resize ``data`` (float64) along one axis to ``out_size`` positions."""
    in_size = data.shape[axis]
    shape = list(data.shape)
    shape[axis] = out_size
    if out_size == 0 or in_size == 0:
        return np.zeros(shape, dtype=np.float64)
    ctm = _s(attrs["coordinate_transformation_mode"])
    mode = _s(attrs["mode"])
    x = source_coords(ctm, out_size, in_size, scale, roi)
    if mode == "nearest":
        idx = np.clip(_nearest_index(x, _s(attrs["nearest_mode"])), 0, in_size - 1)
        out = np.take(data, idx, axis=axis)
    else:
        antialias = bool(attrs.get("antialias")) and scale < 1
        support = 1.0 if mode == "linear" else 2.0  # the kernel's half-width
        s_eff = min(scale, 1.0) if antialias else 1.0
        half = int(math.ceil(support / s_eff))  # taps on each side of x
        base = np.floor(x).astype(np.int64)
        taps = base[:, None] + np.arange(1 - half, half + 1)[None, :]  # (out, 2 * half)
        dist = (taps - x[:, None]) * s_eff
        if mode == "linear":
            w = _linear_kernel(dist)
        elif mode == "cubic":
            w = _cubic_kernel(dist, float(attrs["cubic_coeff_a"]))
        else:
            raise ShapeError(f"Resize: unknown mode {mode!r}")
        if antialias:
            w = w / w.sum(axis=1, keepdims=True)
        if attrs.get("exclude_outside"):
            w = np.where((taps < 0) | (taps >= in_size), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        gathered = np.take(data, np.clip(taps, 0, in_size - 1), axis=axis)  # (.., out, taps, ..)
        wshape = (1,) * axis + w.shape + (1,) * (data.ndim - axis - 1)
        out = (gathered * w.reshape(wshape)).sum(axis=axis + 1)
    if ctm == "tf_crop_and_resize":
        outside = (x < 0) | (x > in_size - 1)
        if outside.any():
            mshape = (1,) * axis + (out_size,) + (1,) * (data.ndim - axis - 1)
            out = np.where(outside.reshape(mshape), float(attrs["extrapolation_value"]), out)
    return out


def resize_geometry(
    in_shape: Sequence[int],
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    axes: Sequence[int] | None,
    policy: str,
) -> tuple[list[int], list[float]]:
    """(output shape, scale per axis) of a Resize."""
    r = len(in_shape)
    ax = list(range(r)) if axes is None else [a % r for a in axes]
    out = list(in_shape)
    scl = [1.0] * r
    if sizes is not None:
        sz = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(sz) != len(ax):
            raise ShapeError(f"Resize: sizes has {len(sz)} values for {len(ax)} axes")
        ratios = [sz[i] / in_shape[a] if in_shape[a] else 1.0 for i, a in enumerate(ax)]
        if policy == "stretch":
            for i, a in enumerate(ax):
                out[a], scl[a] = sz[i], ratios[i]
        elif policy in ("not_larger", "not_smaller"):
            s = min(ratios) if policy == "not_larger" else max(ratios)
            for a in ax:
                out[a], scl[a] = int(s * in_shape[a] + 0.5), s
        else:
            raise ShapeError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
        return out, scl
    if scales is None:
        raise ShapeError("Resize: one of 'scales' and 'sizes' is required")
    sc = [float(v) for v in np.asarray(scales).reshape(-1)]
    if len(sc) != len(ax):
        raise ShapeError(f"Resize: scales has {len(sc)} values for {len(ax)} axes")
    for i, a in enumerate(ax):
        if sc[i] <= 0:
            raise ShapeError(f"Resize: scales must be positive, got {sc}")
        out[a], scl[a] = int(math.floor(sc[i] * in_shape[a])), sc[i]
    return out, scl


def _given(x: np.ndarray | None) -> np.ndarray | None:
    """An optional tensor input; an empty one counts as not given."""
    return None if x is None or np.asarray(x).size == 0 else np.asarray(x)


def resize(
    x: np.ndarray,
    roi: np.ndarray | None,
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    attrs: dict[str, Any],
) -> np.ndarray:
    """ONNX Resize on numpy arrays (computed in float64, one axis at a time)."""
    x = np.asarray(x)
    axes = attrs.get("axes")
    out_shape, scl = resize_geometry(
        x.shape, _given(scales), _given(sizes), axes, _s(attrs["keep_aspect_ratio_policy"])
    )
    r = x.ndim
    ax = list(range(r)) if axes is None else [a % r for a in axes]
    roi_v = _given(roi)
    rois: dict[int, tuple[float, float]] = {}
    if roi_v is not None:
        vals = [float(v) for v in roi_v.reshape(-1)]
        k = len(ax)
        if len(vals) != 2 * k:
            raise ShapeError(f"Resize: roi has {len(vals)} values, expected {2 * k}")
        rois = {a: (vals[i], vals[k + i]) for i, a in enumerate(ax)}
    y = x.astype(np.float64)
    crop = _s(attrs["coordinate_transformation_mode"]) == "tf_crop_and_resize"
    for a in ax:
        same = out_shape[a] == y.shape[a] and math.isclose(scl[a], 1.0)
        if same and (not crop or rois.get(a, (0.0, 1.0)) == (0.0, 1.0)):
            continue
        y = resize_axis(
            y, a, out_shape[a], scl[a], attrs, rois.get(a, (0.0, 1.0)) if crop else None
        )
    return _saturate_to(y, x.dtype)


def _resize_verify(ctx: InferContext) -> None:
    a = ctx.attrs
    checks = [
        ("mode", ("nearest", "linear", "cubic")),
        ("coordinate_transformation_mode", COORDINATE_MODES),
        ("nearest_mode", NEAREST_MODES),
        ("keep_aspect_ratio_policy", ("stretch", "not_larger", "not_smaller")),
    ]
    for name, allowed in checks:
        if _s(a[name]) not in allowed:
            ctx.fail(f"attribute {name}={_s(a[name])!r} is not one of {list(allowed)}", VerifyError)
    has_scales = ctx.has(2) and (ctx.shape(2) is None or ctx.shape(2) != (0,))
    has_sizes = ctx.has(3) and (ctx.shape(3) is None or ctx.shape(3) != (0,))
    if has_scales and has_sizes:
        ctx.fail("give only one of 'scales' and 'sizes'", VerifyError)
    if not has_scales and not has_sizes:
        ctx.fail("one of 'scales' and 'sizes' is required", VerifyError)


def _resize_infer(ctx: InferContext) -> list[TensorDesc]:
    d = ctx.desc(0)
    if d.shape is None:
        return [TensorDesc(d.dtype, None)]
    r = len(d.shape)
    axes = ctx.attr("axes")
    ax = list(range(r)) if axes is None else [ctx.axis(int(v), r) for v in axes]
    sizes = ctx.value(3) if ctx.has(3) else None
    scales = ctx.value(2) if ctx.has(2) else None
    sizes = None if sizes is not None and sizes.size == 0 else sizes
    scales = None if scales is not None and scales.size == 0 else scales
    out: list[Dim] = list(d.shape)
    policy = _s(ctx.attr("keep_aspect_ratio_policy"))
    if sizes is not None and (policy == "stretch" or all(isinstance(d.shape[a], int) for a in ax)):
        if policy == "stretch":
            for i, a in enumerate(ax):
                out[a] = int(sizes.reshape(-1)[i])
        else:
            static, _ = resize_geometry([int(v) for v in d.shape], None, sizes, ax, policy)
            out = [static[i] if i in ax else out[i] for i in range(r)]
        return [TensorDesc(d.dtype, tuple(out))]
    if scales is not None:
        for i, a in enumerate(ax):
            s = float(scales.reshape(-1)[i])
            dim = d.shape[a]
            if isinstance(dim, int):
                out[a] = int(math.floor(s * dim))
            elif float(s).is_integer():
                out[a] = as_dim(dim * int(s))
            else:
                out[a] = as_dim(sympy.floor(dim * sympy.Rational(str(s))))
        return [TensorDesc(d.dtype, tuple(out))]
    for a in ax:
        out[a] = ctx.fresh("resize")
    return [TensorDesc(d.dtype, tuple(out))]


register(
    OpDef(
        "Resize",
        OpKind.OPAQUE,
        inputs=[
            In("X", "T1"),
            In("roi", "T2", optional=True),
            In("scales", "TS", optional=True),
            In("sizes", "TI", optional=True),
        ],
        outputs=[Out("Y", "T1")],
        types={
            "T1": RESIZE_TYPES,
            "T2": _FLOATS,
            "TS": frozenset([np.dtype(np.float32)]),
            "TI": _I64,
        },
        attrs=[
            Attr("antialias", "int", 0),
            Attr("axes", "ints", None),
            Attr("coordinate_transformation_mode", "string", "half_pixel"),
            Attr("cubic_coeff_a", "float", -0.75),
            Attr("exclude_outside", "int", 0),
            Attr("extrapolation_value", "float", 0.0),
            Attr("keep_aspect_ratio_policy", "string", "stretch"),
            Attr("mode", "string", "nearest"),
            Attr("nearest_mode", "string", "round_prefer_floor"),
        ],
        verify=_resize_verify,
        infer=_resize_infer,
        kernel=lambda ins, a: [
            resize(
                ins[0],
                ins[1] if len(ins) > 1 else None,
                ins[2] if len(ins) > 2 else None,
                ins[3] if len(ins) > 3 else None,
                a,
            )
        ],
        value_inputs=(2, 3),
        doc="nearest / (bi)linear / (bi)cubic resampling by scales or to sizes, any axes",
    )
)


# == GridSample ==================================================================================
def reflect_coords(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates at the borders ``lo`` and ``hi`` until they lie inside."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below = x < lo
    above = x > hi
    dx = np.where(below, lo - x, np.where(above, x - hi, 0.0))
    n = np.floor(dx / span)
    r = dx - n * span
    even = (n % 2) == 0
    from_lo = np.where(even, lo + r, hi - r)
    from_hi = np.where(even, hi - r, lo + r)
    return np.where(below, from_lo, np.where(above, from_hi, x))


def _grid_taps(
    x: np.ndarray, size: int, mode: str, padding: str, align: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-point taps along one dim: (indices, weights, in-range mask), each (..., k)."""
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if mode == "nearest":
        x = np.rint(x)
    if padding == "border":
        x = np.where((x < lo) | (x > hi), np.clip(x, 0, size - 1), x)
    elif padding == "reflection":
        x = reflect_coords(x, lo, hi)
    if mode == "nearest":
        taps = np.trunc(x)[..., None]
        w = np.ones_like(taps)
    else:
        base = np.floor(x)
        t = x - base
        if mode == "linear":
            taps = base[..., None] + np.arange(2)
            w = np.stack([1 - t, t], axis=-1)
        else:
            taps = base[..., None] + np.arange(-1, 3)
            w = _cubic_kernel(taps - x[..., None], -0.75)
    if padding == "border":
        taps = np.clip(taps, 0, size - 1)
    elif padding == "reflection":
        taps = np.trunc(reflect_coords(taps, lo, hi))
    inside = (taps >= 0) & (taps <= size - 1)
    return np.clip(taps, 0, max(size - 1, 0)).astype(np.int64), w, inside


def grid_sample(x: np.ndarray, grid: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """ONNX GridSample (any number of spatial dims) on numpy arrays."""
    x = np.asarray(x)
    grid = np.asarray(grid).astype(np.float64)
    mode = _s(attrs["mode"])
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = _s(attrs["padding_mode"])
    align = bool(attrs["align_corners"])
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    nd = len(sizes)
    out_sp = grid.shape[1:-1]
    if grid.shape[-1] != nd:
        raise ShapeError(f"GridSample: grid's last dim is {grid.shape[-1]}, expected {nd}")
    y = np.zeros((n, c, *out_sp), dtype=np.float64)
    if y.size == 0:
        return y.astype(x.dtype)
    xf = x.astype(np.float64).reshape(n, c, -1)
    per_dim = []
    for d in range(nd):
        g = grid[..., nd - 1 - d]  # the grid lists coordinates innermost dim first
        size = sizes[d]
        pos = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
        pos = pos.astype(np.float32).astype(
            np.float64
        )  # pixel coordinates in float, as ONNX's reference
        per_dim.append(_grid_taps(pos, size, mode, padding, align))
    strides = [int(np.prod(sizes[d + 1 :], dtype=np.int64)) for d in range(nd)]
    k = per_dim[0][0].shape[-1]
    for combo in np.ndindex(*([k] * nd)):
        flat = np.zeros((n, *out_sp), dtype=np.int64)
        weight = np.ones((n, *out_sp))
        valid = np.ones((n, *out_sp), dtype=bool)
        for d, j in enumerate(combo):
            idx, w, inside = per_dim[d]
            flat += idx[..., j] * strides[d]
            weight = weight * w[..., j]
            valid &= inside[..., j]
        if padding == "zeros":
            weight = np.where(valid, weight, 0.0)
        vals = np.take_along_axis(xf, flat.reshape(n, 1, -1).repeat(c, axis=1), axis=2)
        y += vals.reshape(y.shape) * weight[:, None]
    return y.astype(x.dtype)


def _grid_verify(ctx: InferContext) -> None:
    a = ctx.attrs
    if _s(a["mode"]) not in ("nearest", "linear", "cubic", "bilinear", "bicubic"):
        ctx.fail(f"mode {_s(a['mode'])!r} is not nearest, linear or cubic", VerifyError)
    if _s(a["padding_mode"]) not in ("zeros", "border", "reflection"):
        ctx.fail(
            f"padding_mode {_s(a['padding_mode'])!r} is not zeros, border or reflection",
            VerifyError,
        )
    x, g = ctx.shape(0), ctx.shape(1)
    if x is not None and g is not None:
        if len(g) != len(x):
            ctx.fail(f"grid of shape {list(g)} must have X's rank {len(x)}")
        if isinstance(g[-1], int) and g[-1] != len(x) - 2:
            ctx.fail(f"grid's last dim is {g[-1]}, expected {len(x) - 2} (one per spatial dim)")
        if dims_equal(x[0], g[0]) is False:
            ctx.fail(f"batch of X ({x[0]}) and grid ({g[0]}) differ")


def _grid_infer(ctx: InferContext) -> list[TensorDesc]:
    x, g = ctx.shape(0), ctx.shape(1)
    if x is None or g is None:
        return [TensorDesc(ctx.dtype(0), None)]
    return [TensorDesc(ctx.dtype(0), (x[0], x[1], *g[1:-1]))]


register(
    OpDef(
        "GridSample",
        OpKind.OPAQUE,
        inputs=[In("X", "T1"), In("grid", "T2")],
        outputs=[Out("Y", "T1")],
        types={"T1": dtypes.NUMERIC, "T2": _FLOATS},
        attrs=[
            Attr("align_corners", "int", 0),
            Attr("mode", "string", "linear"),
            Attr("padding_mode", "string", "zeros"),
        ],
        verify=_grid_verify,
        infer=_grid_infer,
        kernel=lambda ins, a: [grid_sample(ins[0], ins[1], a)],
        doc="sample X at the normalized grid locations (nearest, linear or cubic; zeros/border/reflection)",
    )
)


# == RoiAlign ====================================================================================
def _roi_samples(
    start: float, bin_size: float, bins: int, grid: int, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sample positions along one axis of a RoI: (low index, high index, low weight, high
    weight, valid), each of shape (bins, grid), with RoiAlign's border rules."""
    b = np.arange(bins)[:, None]
    g = np.arange(grid)[None, :]
    pos = start + b * bin_size + (g + 0.5) * bin_size / grid
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    pos = np.where(at_end, low.astype(np.float64), pos)
    frac = pos - low
    return low, high, np.where(valid, 1.0 - frac, 0.0), np.where(valid, frac, 0.0)


def roi_align(
    x: np.ndarray, rois: np.ndarray, batch_indices: np.ndarray, attrs: dict[str, Any]
) -> np.ndarray:
    """ONNX RoiAlign (avg or max over bilinear samples of each bin)."""
    x = np.asarray(x)
    rois = np.asarray(rois).astype(np.float64)
    bidx = np.asarray(batch_indices).reshape(-1).astype(np.int64)
    n_rois = bidx.shape[0]
    c, h, w = x.shape[1:]
    oh, ow = int(attrs["output_height"]), int(attrs["output_width"])
    scale = float(np.float32(attrs["spatial_scale"]))
    ratio = int(attrs["sampling_ratio"])
    half = _s(attrs["coordinate_transformation_mode"]).lower() == "half_pixel"
    mode = _s(attrs["mode"]).lower()
    y = np.zeros((n_rois, c, oh, ow), dtype=np.float64)
    xf = x.astype(np.float64)
    offset = 0.5 if half else 0.0
    for r in range(n_rois):
        x1, y1, x2, y2 = (float(v) * scale - offset for v in rois[r, :4])
        rw, rh = x2 - x1, y2 - y1
        if not half:  # legacy mode: malformed RoIs become 1x1
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio if ratio > 0 else int(np.ceil(rh / oh))
        gw = ratio if ratio > 0 else int(np.ceil(rw / ow))
        count = max(gh * gw, 1)
        if gh <= 0 or gw <= 0:
            continue
        yl, yh, wyl, wyh = _roi_samples(y1, bh, oh, gh, h)  # (oh, gh)
        xl, xh, wxl, wxh = _roi_samples(x1, bw, ow, gw, w)  # (ow, gw)
        img = xf[bidx[r]]  # (c, h, w)

        def tap(yi: np.ndarray, xi: np.ndarray, img: np.ndarray = img) -> np.ndarray:
            """The samples at rows yi and columns xi of every channel."""
            # (c, oh, gh, ow, gw)
            return img[:, yi[:, :, None, None], xi[None, None, :, :]]

        w1 = wyl[:, :, None, None] * wxl[None, None]
        w2 = wyl[:, :, None, None] * wxh[None, None]
        w3 = wyh[:, :, None, None] * wxl[None, None]
        w4 = wyh[:, :, None, None] * wxh[None, None]
        terms = (w1 * tap(yl, xl), w2 * tap(yl, xh), w3 * tap(yh, xl), w4 * tap(yh, xh))
        if mode == "avg":
            y[r] = sum(terms).sum(axis=(2, 4)) / count
        else:  # ONNX's max: the largest weighted corner over all samples of the bin
            y[r] = np.maximum.reduce(terms).max(axis=(2, 4))
    return y.astype(x.dtype)


def _roi_verify(ctx: InferContext) -> None:
    if _s(ctx.attr("mode")).lower() not in ("avg", "max"):
        ctx.fail(f"mode {_s(ctx.attr('mode'))!r} is not avg or max", VerifyError)
    if _s(ctx.attr("coordinate_transformation_mode")).lower() not in (
        "half_pixel",
        "output_half_pixel",
    ):
        ctx.fail(
            "coordinate_transformation_mode must be half_pixel or output_half_pixel", VerifyError
        )
    x, r = ctx.shape(0), ctx.shape(1)
    if x is not None and len(x) != 4:
        ctx.fail(f"X must be 4-D (N, C, H, W), got shape {list(x)}")
    if r is not None and (len(r) != 2 or (isinstance(r[1], int) and r[1] != 4)):
        ctx.fail(f"rois must have shape (num_rois, 4), got {list(r)}")


def _roi_infer(ctx: InferContext) -> list[TensorDesc]:
    x, b = ctx.shape(0), ctx.shape(2)
    n = b[0] if b is not None and len(b) == 1 else ctx.fresh("rois")
    c = x[1] if x is not None else ctx.fresh()
    return [
        TensorDesc(
            ctx.dtype(0), (n, c, int(ctx.attr("output_height")), int(ctx.attr("output_width")))
        )
    ]


register(
    OpDef(
        "RoiAlign",
        OpKind.OPAQUE,
        inputs=[In("X", "T1"), In("rois", "T1"), In("batch_indices", "T2")],
        outputs=[Out("Y", "T1")],
        types={"T1": _FLOATS, "T2": _I64},
        attrs=[
            Attr("coordinate_transformation_mode", "string", "half_pixel"),
            Attr("mode", "string", "avg"),
            Attr("output_height", "int", 1),
            Attr("output_width", "int", 1),
            Attr("sampling_ratio", "int", 0),
            Attr("spatial_scale", "float", 1.0),
        ],
        verify=_roi_verify,
        infer=_roi_infer,
        kernel=lambda ins, a: [roi_align(ins[0], ins[1], ins[2], a)],
        doc="pool each RoI into (output_height, output_width) bins of bilinear samples",
    )
)


# == Col2Im ======================================================================================
def _ints_attr(attrs: dict[str, Any], name: str, n: int, default: int) -> list[int]:
    v = attrs.get(name)
    return [default] * n if v is None or len(v) == 0 else [int(x) for x in v]


def col2im(
    data: np.ndarray, image_shape: Sequence[int], block_shape: Sequence[int], attrs: dict[str, Any]
) -> np.ndarray:
    """ONNX Col2Im: sum every column block back into its place in the image."""
    data = np.asarray(data)
    img = [int(v) for v in image_shape]
    blk = [int(v) for v in block_shape]
    nd = len(img)
    dil = _ints_attr(attrs, "dilations", nd, 1)
    strides = _ints_attr(attrs, "strides", nd, 1)
    pads = _ints_attr(attrs, "pads", 2 * nd, 0)
    n, ck, length = data.shape
    k = int(np.prod(blk))
    if ck % k:
        raise ShapeError(f"Col2Im: input dim 1 ({ck}) is not divisible by the block size {k}")
    c = ck // k
    cols = [
        (img[i] + pads[i] + pads[nd + i] - dil[i] * (blk[i] - 1) - 1) // strides[i] + 1
        for i in range(nd)
    ]
    if int(np.prod(cols)) != length:
        raise ShapeError(
            f"Col2Im: input dim 2 is {length}, the blocks tile {cols} = {int(np.prod(cols))} positions"
        )
    out = np.zeros(
        (n, c, int(np.prod(img))), dtype=np.float64 if data.dtype.kind == "f" else data.dtype
    )
    blocks = data.reshape(n, c, k, length)
    col_idx = np.indices(cols).reshape(nd, -1)  # (nd, L)
    for off, kidx in enumerate(np.ndindex(*blk)):
        pos = [col_idx[i] * strides[i] - pads[i] + kidx[i] * dil[i] for i in range(nd)]
        inside = np.all([(p >= 0) & (p < img[i]) for i, p in enumerate(pos)], axis=0)
        flat = np.ravel_multi_index(tuple(np.where(inside, p, 0) for p in pos), img)
        np.add.at(out, (slice(None), slice(None), flat[inside]), blocks[:, :, off, inside])
    return out.reshape(n, c, *img).astype(data.dtype)


def _col2im_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    img = ctx.sym_ints(1)
    blk = ctx.value(2)
    n: Dim = x[0] if x is not None else ctx.fresh()
    c: Dim = ctx.fresh()
    if x is not None and blk is not None and isinstance(x[1], int):
        c = x[1] // int(np.prod(blk))
    if img is not None:
        return [TensorDesc(ctx.dtype(0), (n, c, *(as_dim(d) for d in img)))]
    k = ctx.shape(1)
    if k is not None and len(k) == 1 and isinstance(k[0], int):
        return [TensorDesc(ctx.dtype(0), (n, c, *(ctx.fresh() for _ in range(k[0]))))]
    return [TensorDesc(ctx.dtype(0), None)]


register(
    OpDef(
        "Col2Im",
        OpKind.OPAQUE,
        inputs=[In("input", "T"), In("image_shape", "I"), In("block_shape", "I")],
        outputs=[Out("output", "T")],
        types={"T": dtypes.NUMERIC, "I": _I64},
        attrs=[
            Attr("dilations", "ints", None),
            Attr("pads", "ints", None),
            Attr("strides", "ints", None),
        ],
        infer=_col2im_infer,
        kernel=lambda ins, a: [
            col2im(ins[0], np.asarray(ins[1]).reshape(-1), np.asarray(ins[2]).reshape(-1), a)
        ],
        value_inputs=(1, 2),
        doc="fold column blocks (N, C*prod(block), L) back into an image (N, C, *image_shape)",
    )
)


# == MaxUnpool ===================================================================================
def _unpool_shape(x_shape: Sequence[Dim], attrs: dict[str, Any]) -> list[Dim]:
    ks = [int(k) for k in attrs["kernel_shape"]]
    nd = len(ks)
    strides = _ints_attr(attrs, "strides", nd, 1)
    pads = _ints_attr(attrs, "pads", 2 * nd, 0)
    out = list(x_shape[:2])
    for i in range(nd):
        d = x_shape[2 + i]
        v = (d - 1) * strides[i] - (pads[i] + pads[nd + i]) + ks[i]
        out.append(v if isinstance(v, int) else as_dim(v))
    return out


def max_unpool(
    x: np.ndarray, indices: np.ndarray, output_shape: np.ndarray | None, attrs: dict[str, Any]
) -> np.ndarray:
    """ONNX MaxUnpool: scatter X to its (flat) indices in a zero tensor of the inferred
    shape, then place that at the start of ``output_shape`` (when given)."""
    x = np.asarray(x)
    full = [int(d) for d in _unpool_shape(x.shape, attrs)]
    y = np.zeros(int(np.prod(full)), dtype=x.dtype)
    y[np.asarray(indices).reshape(-1).astype(np.int64)] = x.reshape(-1)
    y = y.reshape(full)
    if output_shape is None:
        return y
    shape = [int(v) for v in np.asarray(output_shape).reshape(-1)]
    out = np.zeros(shape, dtype=x.dtype)
    out[tuple(slice(0, min(a, b)) for a, b in zip(full, shape))] = y[
        tuple(slice(0, min(a, b)) for a, b in zip(full, shape))
    ]
    return out


def _unpool_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    if ctx.has(2):
        vals = ctx.sym_ints(2)
        if vals is not None:
            return [TensorDesc(ctx.dtype(0), tuple(as_dim(v) for v in vals))]
        r = len(x) if x is not None else None
        return [
            TensorDesc(ctx.dtype(0), None if r is None else tuple(ctx.fresh() for _ in range(r)))
        ]
    if x is None:
        return [TensorDesc(ctx.dtype(0), None)]
    if len(x) != len(ctx.attr("kernel_shape")) + 2:
        ctx.fail(
            f"X of rank {len(x)} needs {len(x) - 2} kernel dims, kernel_shape is {ctx.attr('kernel_shape')}"
        )
    return [TensorDesc(ctx.dtype(0), tuple(_unpool_shape(x, ctx.attrs)))]


register(
    OpDef(
        "MaxUnpool",
        OpKind.OPAQUE,
        inputs=[In("X", "T1"), In("I", "T2"), In("output_shape", "T2", optional=True)],
        outputs=[Out("output", "T1")],
        types={"T1": dtypes.NUMERIC, "T2": _I64},
        attrs=[
            Attr("kernel_shape", "ints", REQUIRED),
            Attr("pads", "ints", None),
            Attr("strides", "ints", None),
        ],
        infer=_unpool_infer,
        kernel=lambda ins, a: [max_unpool(ins[0], ins[1], ins[2] if len(ins) > 2 else None, a)],
        value_inputs=(2,),
        doc="partial inverse of MaxPool: values at their indices, zeros elsewhere",
    )
)


# == DeformConv ==================================================================================
def _bilinear_zero(img: np.ndarray, py: np.ndarray, px: np.ndarray) -> np.ndarray:
    """Bilinear samples of ``img`` (n, c, h, w) at positions (n, *p) -> (n, c, *p); taps
    outside the image count as zero."""
    n, c, h, w = img.shape
    y0, x0 = np.floor(py), np.floor(px)
    fy, fx = py - y0, px - x0
    out = np.zeros((n, c, *py.shape[1:]), dtype=np.float64)
    flat = img.reshape(n, c, h * w).astype(np.float64)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            yy, xx = (y0 + dy).astype(np.int64), (x0 + dx).astype(np.int64)
            inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            idx = np.where(inside, yy * w + xx, 0).reshape(n, 1, -1)
            vals = np.take_along_axis(flat, np.broadcast_to(idx, (n, c, idx.shape[-1])), axis=2)
            weight = np.where(inside, wy * wx, 0.0).reshape(n, 1, -1)
            out += (vals * weight).reshape(out.shape)
    return out


def deform_conv(ins: list, attrs: dict[str, Any]) -> np.ndarray:
    """ONNX DeformConv (2-D): a convolution whose taps sample X, bilinearly, at positions
    moved by ``offset`` (and weighted by ``mask``)."""
    x, w, offset = (np.asarray(v) for v in ins[:3])
    b = None if len(ins) < 4 or ins[3] is None else np.asarray(ins[3])
    mask = None if len(ins) < 5 or ins[4] is None else np.asarray(ins[4])
    if x.ndim != 4:
        raise ShapeError(
            f"DeformConv: only 2-D convolution (4-D X) is supported, X has shape {list(x.shape)}"
        )
    n, ic, _, _ = x.shape
    oc, icg, kh, kw = w.shape
    group = int(attrs.get("group") or 1)
    og = int(attrs.get("offset_group") or 1)
    sth, stw = _ints_attr(attrs, "strides", 2, 1)
    dh, dw = _ints_attr(attrs, "dilations", 2, 1)
    pads = _ints_attr(attrs, "pads", 4, 0)
    oh, ow = offset.shape[2:]
    if ic != icg * group or oc % group or ic % og or offset.shape[1] != og * kh * kw * 2:
        raise ShapeError(
            f"DeformConv: X{list(x.shape)}, W{list(w.shape)}, offset{list(offset.shape)} do not agree "
            f"with group={group}, offset_group={og}"
        )
    off = offset.astype(np.float64).reshape(n, og, kh, kw, 2, oh, ow)
    m = (
        np.ones((n, og, kh, kw, oh, ow))
        if mask is None
        else mask.astype(np.float64).reshape(n, og, kh, kw, oh, ow)
    )
    base_y = (-pads[0] + sth * np.arange(oh))[None, None, None, :, None] + (dh * np.arange(kh))[
        None, :, None, None, None
    ]
    base_x = (-pads[1] + stw * np.arange(ow))[None, None, None, None, :] + (dw * np.arange(kw))[
        None, None, :, None, None
    ]
    per = ic // og
    cols = np.empty((n, ic, kh, kw, oh, ow), dtype=np.float64)
    for g in range(og):
        py = base_y + off[:, g, :, :, 0]
        px = base_x + off[:, g, :, :, 1]
        sampled = _bilinear_zero(x[:, g * per : (g + 1) * per], py, px)  # (n, per, kh, kw, oh, ow)
        cols[:, g * per : (g + 1) * per] = sampled * m[:, g][:, None]
    ocg = oc // group
    y = np.empty((n, oc, oh, ow), dtype=np.float64)
    for g in range(group):
        y[:, g * ocg : (g + 1) * ocg] = np.einsum(
            "nckhij,ockh->noij",
            cols[:, g * icg : (g + 1) * icg],
            w[g * ocg : (g + 1) * ocg].astype(np.float64),
        )
    if b is not None:
        y += b.astype(np.float64).reshape(1, -1, 1, 1)
    return y.astype(x.dtype)


def _deform_infer(ctx: InferContext) -> list[TensorDesc]:
    return [TensorDesc(ctx.dtype(0), conv_shape(ctx, ctx.shape(0), ctx.shape(1)))]


register(
    OpDef(
        "DeformConv",
        OpKind.LIBRARY,
        inputs=[
            In("X", "T"),
            In("W", "T"),
            In("offset", "T"),
            In("B", "T", optional=True),
            In("mask", "T", optional=True),
        ],
        outputs=[Out("Y", "T")],
        types={"T": _FLOATS},
        attrs=[
            Attr("dilations", "ints", None),
            Attr("group", "int", 1),
            Attr("kernel_shape", "ints", None),
            Attr("offset_group", "int", 1),
            Attr("pads", "ints", None),
            Attr("strides", "ints", None),
        ],
        infer=_deform_infer,
        kernel=lambda ins, a: [deform_conv(ins, a)],
        doc="deformable 2-D convolution: taps sampled at learned offsets (optionally masked)",
    )
)


__all__ = [
    "COORDINATE_MODES",
    "NEAREST_MODES",
    "col2im",
    "deform_conv",
    "grid_sample",
    "max_unpool",
    "reflect_coords",
    "resize",
    "resize_axis",
    "resize_geometry",
    "roi_align",
    "source_coords",
]
