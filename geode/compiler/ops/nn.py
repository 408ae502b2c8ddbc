"""Neural-network library ops: MatMul, Gemm, Conv, ConvTranspose, pooling, normalization,
LRN, Einsum and Dropout.

Reference kernels follow ONNX opset-21 semantics. Convolution and pooling read their
input through a strided window view (``as_strided``) so no Python loop runs per output
element: Conv is an im2col copy plus one batched matmul per group, ConvTranspose one
batched matmul plus a strided scatter-add per kernel offset, pooling a reduction over
the window axes.

Output spatial dims are inferred over symbolic shapes with :func:`conv_out_dim` and
:func:`pool_out_dim`: ``floor((H + pad_begin + pad_end - dilation*(k-1) - 1)/stride) + 1``
as a sympy expression (affine for stride 1), ``ceil(H/stride)`` for SAME padding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
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
from geode.compiler.shapes import Dim, Shape, as_dim, broadcast_shapes, dims_equal
from geode.errors import GeodeError, ShapeError, VerifyError
from geode.lazy import sympy

#: dtypes of MatMul and Gemm (ONNX: float16/32/64, int32/64, uint32/64)
MATMUL_TYPES = dtypes.FLOATS | frozenset(
    np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64)
)
#: dtypes of MaxPool (ONNX: floats, int8, uint8)
MAXPOOL_TYPES = dtypes.FLOATS | frozenset([np.dtype(np.int8), np.dtype(np.uint8)])

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

Fail = Callable[[str], Any]


def _raise_shape(msg: str) -> None:
    raise ShapeError(msg)


# -- symbolic dim arithmetic ----------------------------------------------------------------


def floordiv(a: Dim, s: int) -> Dim:
    """``floor(a / s)`` for an int or symbolic dim ``a`` and a positive int ``s``."""
    if isinstance(a, int):
        return a // s
    if s == 1:
        return a
    return as_dim(sympy.floor(a / s))


def ceildiv(a: Dim, s: int) -> Dim:
    """``ceil(a / s)`` for an int or symbolic dim ``a`` and a positive int ``s``."""
    if isinstance(a, int):
        return -((-a) // s)
    if s == 1:
        return a
    return as_dim(sympy.ceiling(a / s))


def _dim(expr: Dim) -> Dim:
    """Normalise an int or sympy expression to a Dim."""
    return expr if isinstance(expr, int) else as_dim(expr)


def _add(*terms: Dim) -> Dim:
    total: Dim = 0
    for t in terms:
        total = total + t
    return total if isinstance(total, int) else as_dim(total)


def conv_out_dim(size: Dim, k: Dim, s: int, d: int, pb: int, pe: int, auto_pad: str) -> Dim:
    """One output spatial dim of a convolution (ONNX Conv formula, any auto_pad)."""
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return ceildiv(size, s)
    if auto_pad == "VALID":
        pb = pe = 0
    return _add(floordiv(_add(size, pb + pe - d * (k - 1) - 1), s), 1)


def pool_out_dim(
    size: Dim, k: int, s: int, d: int, pb: int, pe: int, auto_pad: str, ceil_mode: bool
) -> Dim:
    """One output spatial dim of a pooling op, with ONNX's ceil_mode rule.

    With ``ceil_mode`` the size is rounded up, but a last window that would start in
    the end padding is dropped (``(out - 1) * stride >= size + pad_begin``). auto_pad
    modes ignore ceil_mode (their floor and ceil forms agree).
    """
    if auto_pad != "NOTSET" or not ceil_mode:
        return conv_out_dim(size, k, s, d, pb, pe, auto_pad)
    dk = d * (k - 1) + 1
    c = _add(ceildiv(_add(size, pb + pe - dk), s), 1)
    if isinstance(c, int) and isinstance(size, int):
        return c - 1 if (c - 1) * s >= size + pb else c
    if s + pe <= dk:  # the last window always starts inside the input or begin padding
        return c
    # exact while pe <= dk: the first window count whose start stays before size + pb
    return as_dim(sympy.Min(c, floordiv(_add(size, pb - 1), s) + 1))


def same_pads(size: int, out: int, k: int, s: int, d: int, mode: str) -> tuple[int, int]:
    """(begin, end) padding of SAME_UPPER / SAME_LOWER (the odd one at the end / start)."""
    total = max(0, (out - 1) * s + d * (k - 1) + 1 - size)
    small = total // 2
    return (small, total - small) if mode == "SAME_UPPER" else (total - small, small)


# -- attribute helpers ----------------------------------------------------------------------


def attr_float(v: Any) -> float:
    """A float attribute at ONNX's precision: AttributeProto floats are 32-bit."""
    return float(np.float32(v))


def _str_attr(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _int_list(v: Any, n: int, default: int, name: str, fail: Fail) -> list[int]:
    """An ints attribute of length ``n`` (``default`` repeated when absent or empty)."""
    out = [] if v is None else [int(x) for x in np.asarray(v).reshape(-1)]
    if not out:
        return [default] * n
    if len(out) != n:
        fail(f"attribute {name!r} has {len(out)} values, expected {n}")
    return out


@dataclass
class Window:
    """Sliding-window attributes of Conv / ConvTranspose / pooling, normalised to lists."""

    kernel: list[Dim]  # static at run time; may be symbolic in infer (W's dims)
    strides: list[int]
    dilations: list[int]
    pads: list[int]  # begin values then end values
    auto_pad: str

    @property
    def rank(self) -> int:
        """Number of spatial dims."""
        return len(self.kernel)

    @property
    def begin(self) -> list[int]:
        """Explicit begin pads."""
        return self.pads[: self.rank]

    @property
    def end(self) -> list[int]:
        """Explicit end pads."""
        return self.pads[self.rank :]


def window_attrs(attrs: dict[str, Any], kernel: Sequence[Dim], fail: Fail = _raise_shape) -> Window:
    """Read kernel/strides/dilations/pads/auto_pad attributes and check them."""
    n = len(kernel)
    w = Window(
        kernel=[as_dim(k) for k in kernel],
        strides=_int_list(attrs.get("strides"), n, 1, "strides", fail),
        dilations=_int_list(attrs.get("dilations"), n, 1, "dilations", fail),
        pads=_int_list(attrs.get("pads"), 2 * n, 0, "pads", fail),
        auto_pad=_str_attr(attrs.get("auto_pad") or "NOTSET"),
    )
    if w.auto_pad not in AUTO_PADS:
        fail(f"auto_pad {w.auto_pad!r} is not one of {list(AUTO_PADS)}")
    if any(isinstance(k, int) and k < 1 for k in w.kernel):
        fail(f"kernel_shape {w.kernel} must be positive")
    if any(s < 1 for s in w.strides):
        fail(f"strides {w.strides} must be positive")
    if any(d < 1 for d in w.dilations):
        fail(f"dilations {w.dilations} must be positive")
    if any(p < 0 for p in w.pads):
        fail(f"pads {w.pads} must not be negative")
    if w.auto_pad == "VALID":
        w.pads = [0] * (2 * n)
    return w


def _ctx_fail(ctx: InferContext, exc: type[GeodeError] = VerifyError) -> Fail:
    return lambda msg: ctx.fail(msg, exc)


def _equate(ctx: InferContext, a: Dim, b: Dim, what: str) -> None:
    """Record ``a == b`` (a ShapeError naming the node when they provably differ)."""
    if dims_equal(a, b) is False:
        ctx.fail(f"{what}: {a} != {b}")
    ctx.graph.symbols.equate(a, b, ctx.where)


def _spatial_out(
    ctx: InferContext, sizes: Sequence[Dim], w: Window, ceil_mode: bool | None
) -> list[Dim]:
    """Output spatial dims (conv formula when ``ceil_mode`` is None); checks static ones."""
    out: list[Dim] = []
    for i, size in enumerate(sizes):
        args = (size, w.kernel[i], w.strides[i], w.dilations[i], w.begin[i], w.end[i], w.auto_pad)
        o = conv_out_dim(*args) if ceil_mode is None else pool_out_dim(*args, ceil_mode)
        if isinstance(o, int) and o < 1:
            ctx.fail(
                f"spatial dim {i} of size {size} gives output size {o}: the window "
                f"(kernel {w.kernel[i]}, dilation {w.dilations[i]}) does not fit the padded input"
            )
        out.append(o)
    return out


def _static_geometry(
    sizes: Sequence[int], w: Window, ceil_mode: bool | None
) -> tuple[list[int], list[int], list[int]]:
    """Run-time output sizes and (begin, end) pads, SAME pads resolved."""
    outs, begin, end = [], [], []
    for i, size in enumerate(sizes):
        k, s, d = w.kernel[i], w.strides[i], w.dilations[i]
        args = (size, k, s, d, w.begin[i], w.end[i], w.auto_pad)
        o = conv_out_dim(*args) if ceil_mode is None else pool_out_dim(*args, bool(ceil_mode))
        if o < 1:
            raise ShapeError(
                f"spatial dim {i} of size {size} gives output size {o} "
                f"(kernel {k}, stride {s}, dilation {d}, pads {w.pads})"
            )
        if w.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pb, pe = same_pads(size, o, k, s, d, w.auto_pad)
        else:
            pb, pe = w.begin[i], w.end[i]
        outs.append(int(o))
        begin.append(pb)
        end.append(pe)
    return outs, begin, end


# -- windowed views -------------------------------------------------------------------------


def _pad_for_windows(
    x: np.ndarray,
    out: Sequence[int],
    w: Window,
    begin: Sequence[int],
    end: Sequence[int],
    fill: Any,
) -> np.ndarray:
    """Pad the spatial dims so every window lies inside (extra end padding for ceil_mode)."""
    widths = [(0, 0)] * (x.ndim - w.rank)
    for i in range(w.rank):
        need = (out[i] - 1) * w.strides[i] + w.dilations[i] * (w.kernel[i] - 1) + 1
        have = x.shape[x.ndim - w.rank + i] + begin[i] + end[i]
        widths.append((begin[i], end[i] + max(0, need - have)))
    if all(a == 0 and b == 0 for a, b in widths):
        return x
    return np.pad(x, widths, mode="constant", constant_values=fill)


def _windows(xp: np.ndarray, out: Sequence[int], w: Window) -> np.ndarray:
    """A read-only view ``(*lead, *out, *kernel)`` of the windows of a padded array."""
    lead = xp.ndim - w.rank
    st = xp.strides
    shape = xp.shape[:lead] + tuple(out) + tuple(w.kernel)
    strides = (
        st[:lead]
        + tuple(st[lead + i] * w.strides[i] for i in range(w.rank))
        + tuple(st[lead + i] * w.dilations[i] for i in range(w.rank))
    )
    return np.lib.stride_tricks.as_strided(xp, shape, strides, writeable=False)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16 math runs in float32 (then rounds back); other dtypes run as they are."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


# == MatMul ==================================================================================


def _matmul_infer(ctx: InferContext) -> list[TensorDesc]:
    return [TensorDesc(ctx.dtype(0), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def matmul_shape(ctx: InferContext, a: Shape, b: Shape) -> Shape:
    """numpy matmul's output shape for operand shapes ``a`` and ``b`` (None when unknown)."""
    if a is None or b is None:
        return None
    if len(a) == 0 or len(b) == 0:
        ctx.fail(f"inputs must have rank >= 1, got shapes {list(a)} and {list(b)}")
    ka = a[-1]
    kb = b[0] if len(b) == 1 else b[-2]
    _equate(ctx, ka, kb, "inner dims differ (A[-1] vs B[-2])")
    batch = broadcast_shapes(
        tuple(a[:-2]), tuple(b[:-2]), where=ctx.where, symbols=ctx.graph.symbols
    )
    out = list(batch)
    if len(a) >= 2:
        out.append(a[-2])
    if len(b) >= 2:
        out.append(b[-1])
    return tuple(out)


def _matmul_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    a, b = ins[0], ins[1]
    ct = _compute_dtype(a.dtype)
    y = np.asarray(np.matmul(a.astype(ct, copy=False), b.astype(ct, copy=False)))
    return [y.astype(a.dtype, copy=False)]  # a new array already: no second copy


register(
    OpDef(
        "MatMul",
        OpKind.LIBRARY,
        inputs=[In("A", "T"), In("B", "T")],
        outputs=[Out("Y", "T")],
        types={"T": MATMUL_TYPES},
        infer=_matmul_infer,
        kernel=_matmul_kernel,
        doc="numpy matmul: 1-D operands are promoted and squeezed, batch dims broadcast",
    )
)


# == Gemm ====================================================================================


def _gemm_verify(ctx: InferContext) -> None:
    for i in (0, 1):
        r = ctx.rank(i)
        if r is not None and r != 2:
            ctx.fail(f"input {i} must be 2-D, got shape {list(ctx.shape(i))}")
    if ctx.has(2) and ctx.rank(2) is not None and ctx.rank(2) > 2:
        ctx.fail(f"C must have rank <= 2, got shape {list(ctx.shape(2))}")


def _gemm_infer(ctx: InferContext) -> list[TensorDesc]:
    a, b = ctx.shape(0), ctx.shape(1)
    dtype = ctx.dtype(0)
    if a is None or b is None:
        return [TensorDesc(dtype, None)]
    m, ka = (a[1], a[0]) if ctx.attr("transA") else (a[0], a[1])
    kb, n = (b[1], b[0]) if ctx.attr("transB") else (b[0], b[1])
    _equate(ctx, ka, kb, "inner dims of A and B differ")
    if ctx.has(2) and ctx.shape(2) is not None:
        c = tuple(ctx.shape(2))
        for cd, od in zip(reversed(c), (n, m)):
            if isinstance(cd, int) and cd != 1 and dims_equal(cd, od) is False:
                ctx.fail(f"C of shape {list(c)} does not broadcast to [{m}, {n}]")
    return [TensorDesc(dtype, (m, n))]


def _is_integral(v: float) -> bool:
    return float(v).is_integer()


def _gemm_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = attr_float(attrs["alpha"]), attr_float(attrs["beta"])
    if attrs["transA"]:
        a = a.T
    if attrs["transB"]:
        b = b.T
    ct = _compute_dtype(a.dtype)
    if np.issubdtype(ct, np.integer) and _is_integral(alpha) and _is_integral(beta):
        alpha_s, beta_s = ct.type(int(alpha)), ct.type(int(beta))  # exact integer Gemm
    else:
        alpha_s, beta_s = alpha, beta
    y = np.matmul(a.astype(ct, copy=False), b.astype(ct, copy=False))
    if alpha != 1.0:
        y = y * alpha_s
    if c is not None and beta != 0.0:
        y = y + (c.astype(ct, copy=False) if beta == 1.0 else c.astype(ct, copy=False) * beta_s)
    return [np.asarray(y).astype(ins[0].dtype, copy=False)]  # y is a new array: no copy


register(
    OpDef(
        "Gemm",
        OpKind.LIBRARY,
        inputs=[In("A", "T"), In("B", "T"), In("C", "T", optional=True)],
        outputs=[Out("Y", "T")],
        types={"T": MATMUL_TYPES},
        attrs=[
            Attr("alpha", "float", 1.0),
            Attr("beta", "float", 1.0),
            Attr("transA", "int", 0),
            Attr("transB", "int", 0),
        ],
        verify=_gemm_verify,
        infer=_gemm_infer,
        kernel=_gemm_kernel,
        doc="Y = alpha * A' @ B' + beta * C, C broadcast to [M, N]",
    )
)


# == Conv ====================================================================================

#: attributes of Conv, ConvTranspose and the quantized convolutions
CONV_ATTRS = [
    Attr("auto_pad", "string", "NOTSET"),
    Attr("dilations", "ints", None),
    Attr("group", "int", 1),
    Attr("kernel_shape", "ints", None),
    Attr("pads", "ints", None),
    Attr("strides", "ints", None),
]


def _conv_common_verify(ctx: InferContext) -> tuple[Shape, Shape]:
    """Checks shared by Conv and ConvTranspose; returns (X shape, W shape)."""
    x, w = ctx.shape(0), ctx.shape(1)
    group = int(ctx.attr("group"))
    if group < 1:
        ctx.fail(f"group must be >= 1, got {group}", VerifyError)
    if x is not None and len(x) < 3:
        ctx.fail(f"X must have rank >= 3 (N, C, spatial...), got shape {list(x)}")
    if w is not None and len(w) < 3:
        ctx.fail(f"W must have rank >= 3, got shape {list(w)}")
    if x is not None and w is not None and len(x) != len(w):
        ctx.fail(f"X of shape {list(x)} and W of shape {list(w)} must have the same rank")
    if w is not None:
        ks = ctx.attr("kernel_shape")
        if ks is not None:
            ks = [int(k) for k in ks]
            if len(ks) != len(w) - 2:
                ctx.fail(f"kernel_shape {ks} must have {len(w) - 2} values")
            for i, k in enumerate(ks):
                _equate(ctx, w[2 + i], k, f"kernel_shape[{i}] differs from W's spatial dim")
    return x, w


def _kernel_dims(ctx: InferContext, w: Shape, n: int) -> list[Dim] | None:
    """Kernel spatial dims, from kernel_shape or W (symbolic when W's are); None if unknown."""
    ks = ctx.attr("kernel_shape")
    if ks is not None:
        return [int(k) for k in ks]
    return None if w is None else list(w[2:])


def _conv_verify(ctx: InferContext) -> None:
    x, w = _conv_common_verify(ctx)
    group = int(ctx.attr("group"))
    if x is not None and w is not None:
        _equate(
            ctx,
            x[1],
            as_dim(w[1] * group),
            f"input channels X[1] must equal W[1] * group ({group})",
        )
    if w is not None and isinstance(w[0], int) and w[0] % group:
        ctx.fail(f"output channels W[0]={w[0]} are not divisible by group={group}")
    if ctx.has(2) and w is not None:
        b = ctx.shape(2)
        if b is not None:
            if len(b) != 1:
                ctx.fail(f"bias B must be 1-D, got shape {list(b)}")
            _equate(ctx, b[0], w[0], "bias length B[0] must equal output channels W[0]")


def _conv_infer(ctx: InferContext) -> list[TensorDesc]:
    return [TensorDesc(ctx.dtype(0), conv_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def conv_shape(ctx: InferContext, x: Shape, w: Shape) -> Shape:
    """Conv's output shape for input shape ``x`` and weight shape ``w`` under the node's
    window attributes (None when ``x``'s rank is unknown)."""
    if x is None:
        return None
    n = len(x) - 2
    kernel = _kernel_dims(ctx, w, n)
    m = w[0] if w is not None else ctx.fresh()
    if kernel is None:
        return (x[0], m, *(ctx.fresh() for _ in range(n)))
    win = window_attrs(ctx.attrs, kernel, _ctx_fail(ctx))
    return (x[0], m, *_spatial_out(ctx, x[2:], win, None))


def conv_nd(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]
) -> np.ndarray:
    """ONNX Conv on numpy arrays: im2col through a strided view, one batched matmul."""
    n_sp = x.ndim - 2
    win = window_attrs(attrs, w.shape[2:])
    group = int(attrs.get("group") or 1)
    out, begin, end = _static_geometry(x.shape[2:], win, None)
    nb, c = x.shape[:2]
    m = w.shape[0]
    if c != w.shape[1] * group or m % group:
        raise ShapeError(
            f"Conv: X{list(x.shape)} and W{list(w.shape)} do not agree with group={group}"
        )
    cg, mg = c // group, m // group
    ct = _compute_dtype(x.dtype)
    xp = _pad_for_windows(x.astype(ct, copy=False), out, win, begin, end, 0)
    view = _windows(xp, out, win)  # (N, C, *out, *k)
    view = view.reshape((nb, group, cg) + view.shape[2:])
    sp_out = tuple(range(3, 3 + n_sp))
    sp_k = tuple(range(3 + n_sp, 3 + 2 * n_sp))
    n_pos, n_k = math.prod(out), math.prod(win.kernel)
    cols = view.transpose((1, 0, 2, *sp_k, *sp_out)).reshape(group, nb, cg * n_k, n_pos)
    wm = w.astype(ct, copy=False).reshape(group, 1, mg, cg * n_k)
    y = np.matmul(wm, cols)  # (G, N, Mg, P)
    y = y.transpose(1, 0, 2, 3).reshape((nb, m, *out))
    if b is not None:
        y = y + b.astype(ct, copy=False).reshape((1, m) + (1,) * n_sp)
    return np.ascontiguousarray(y, dtype=x.dtype)


def _conv_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    return [conv_nd(ins[0], ins[1], ins[2] if len(ins) > 2 else None, attrs)]


register(
    OpDef(
        "Conv",
        OpKind.LIBRARY,
        inputs=[In("X", "T"), In("W", "T"), In("B", "T", optional=True)],
        outputs=[Out("Y", "T")],
        types={"T": dtypes.FLOATS},
        attrs=list(CONV_ATTRS),
        verify=_conv_verify,
        infer=_conv_infer,
        kernel=_conv_kernel,
        doc="N-D convolution (cross-correlation) with groups, strides, dilations and padding",
    )
)


# == FusedConv (geode) =======================================================================

#: the op a Conv with its epilogue becomes (``compiler/passes/fuse_conv.py``)
FUSED_CONV = "FusedConv"
#: FusedConv's activations ("": none)
FUSED_ACTIVATIONS = ("", "Relu")


def pool_attrs(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """The MaxPool attributes of a FusedConv's pooling (None without one)."""
    kernel = attrs.get("pool_kernel")
    if not kernel:
        return None
    n = len(kernel)
    return {
        "kernel_shape": [int(k) for k in kernel],
        "strides": [int(k) for k in attrs.get("pool_strides") or [1] * n],
        "pads": [int(k) for k in attrs.get("pool_pads") or [0] * (2 * n)],
    }


def _fused_conv_verify(ctx: InferContext) -> None:
    _conv_verify(ctx)
    act = ctx.attr("activation")
    if act not in FUSED_ACTIVATIONS:
        ctx.fail(f"activation must be one of {FUSED_ACTIVATIONS}, got {act!r}", VerifyError)
    pool = pool_attrs(ctx.attrs)
    if pool is not None and ctx.has(3):
        ctx.fail("a FusedConv with pooling takes no residual Z", VerifyError)
    if ctx.has(3):
        z, y = ctx.shape(3), conv_shape(ctx, ctx.shape(0), ctx.shape(1))
        if z is not None and y is not None:
            if len(z) != len(y):
                ctx.fail(f"Z of shape {list(z)} must have Y's shape {list(y)}")
            for i, (a, b) in enumerate(zip(z, y)):
                _equate(ctx, a, b, f"Z's dim {i} must equal Y's")


def _fused_conv_infer(ctx: InferContext) -> list[TensorDesc]:
    y = conv_shape(ctx, ctx.shape(0), ctx.shape(1))
    pool = pool_attrs(ctx.attrs)
    if pool is not None and y is not None:
        win = window_attrs(pool, pool["kernel_shape"], _ctx_fail(ctx))
        y = (y[0], y[1], *_spatial_out(ctx, y[2:], win, False))
    return [TensorDesc(ctx.dtype(0), y)]


def fused_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    attrs: dict[str, Any],
) -> np.ndarray:
    """FusedConv on numpy arrays: ``maxpool(act(conv_nd(x, w, b) + z))`` (the pooling
    when ``pool_kernel`` is given)."""
    y = conv_nd(x, w, b, attrs)
    if z is not None:
        if z.shape != y.shape:
            raise ShapeError(f"FusedConv: Z{list(z.shape)} is not Y's shape {list(y.shape)}")
        y = np.add(y, z, dtype=y.dtype)
    if attrs.get("activation") == "Relu":
        y = np.maximum(y, y.dtype.type(0))  # NaN stays NaN, as Relu's kernel
    pool = pool_attrs(attrs)
    if pool is not None:
        y = max_pool_nd(y, pool)[0]
    return y


def _fused_conv_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    get = lambda i: ins[i] if len(ins) > i else None  # noqa: E731
    return [fused_conv(ins[0], ins[1], get(2), get(3), attrs)]


register(
    OpDef(
        FUSED_CONV,
        OpKind.LIBRARY,
        inputs=[
            In("X", "T"),
            In("W", "T"),
            In("B", "T", optional=True),
            In("Z", "T", optional=True),
        ],
        outputs=[Out("Y", "T")],
        types={"T": dtypes.FLOATS},
        attrs=[
            *CONV_ATTRS,
            Attr("activation", "string", ""),
            Attr("pool_kernel", "ints", None),
            Attr("pool_strides", "ints", None),
            Attr("pool_pads", "ints", None),
        ],
        verify=_fused_conv_verify,
        infer=_fused_conv_infer,
        kernel=_fused_conv_kernel,
        domain="geode",
        doc="Conv with its epilogue: MaxPool(activation(Conv(X, W, B) + Z)), Z of the "
        "conv's output shape, the pooling optional (pool_kernel, pool_strides, pool_pads; "
        "made by the fuse_conv pass from Conv, Add, Relu and MaxPool)",
    )
)


# == ConvTranspose ===========================================================================


def _convt_verify(ctx: InferContext) -> None:
    x, w = _conv_common_verify(ctx)
    group = int(ctx.attr("group"))
    if x is not None and w is not None:
        _equate(ctx, x[1], w[0], "input channels X[1] must equal W[0]")
    if x is not None and isinstance(x[1], int) and x[1] % group:
        ctx.fail(f"input channels X[1]={x[1]} are not divisible by group={group}")
    if ctx.has(2) and w is not None:
        b = ctx.shape(2)
        if b is not None:
            if len(b) != 1:
                ctx.fail(f"bias B must be 1-D, got shape {list(b)}")
            _equate(ctx, b[0], as_dim(w[1] * group), "bias length must equal W[1] * group")


def _convt_output_shape(attrs: dict[str, Any], n: int, fail: Fail) -> list[int] | None:
    os_ = attrs.get("output_shape")
    if os_ is None:
        return None
    vals = [int(v) for v in np.asarray(os_).reshape(-1)]
    if len(vals) == n + 2:  # a full [N, C, spatial...] shape: keep the spatial part
        vals = vals[2:]
    if len(vals) != n:
        fail(f"output_shape {vals} must have {n} values")
    return vals


def _convt_geometry(
    sizes: Sequence[Dim], win: Window, out_pad: Sequence[int], out_shape: list[int] | None
) -> tuple[list[Dim], list[Dim]]:
    """Output spatial sizes and begin pads of ConvTranspose (ONNX formulas).

    With ``output_shape`` the total padding is ``s*(in-1) + output_padding + (k-1)*d + 1
    - out``, split with the larger half at the start except for SAME_UPPER; a negative
    total (an output larger than the full result) is clamped to 0, as onnxruntime does,
    so the extra positions are zeros at the end.
    """
    outs: list[Dim] = []
    begins: list[Dim] = []
    for i, size in enumerate(sizes):
        k, s, d = win.kernel[i], win.strides[i], win.dilations[i]
        full = _dim(s * (size - 1) + out_pad[i] + d * (k - 1) + 1)
        if out_shape is not None or win.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = out_shape[i] if out_shape is not None else _dim(size * s)
            total = _dim(full - o)
            if isinstance(total, int):
                total = max(0, total)
                small = total // 2
                begin: Dim = small if win.auto_pad == "SAME_UPPER" else total - small
            else:  # only the output size matters before run time
                tot = sympy.Max(0, total)
                small_s = floordiv(tot, 2)
                begin = small_s if win.auto_pad == "SAME_UPPER" else _dim(tot - small_s)
        else:
            o = _dim(full - win.begin[i] - win.end[i])
            begin = win.begin[i]
        outs.append(o)
        begins.append(begin)
    return outs, begins


def _convt_infer(ctx: InferContext) -> list[TensorDesc]:
    x, w = ctx.shape(0), ctx.shape(1)
    dtype = ctx.dtype(0)
    if x is None:
        return [TensorDesc(dtype, None)]
    n = len(x) - 2
    fail = _ctx_fail(ctx)
    kernel = _kernel_dims(ctx, w, n)
    group = int(ctx.attr("group"))
    m = as_dim(w[1] * group) if w is not None else ctx.fresh()
    if kernel is None:
        return [TensorDesc(dtype, (x[0], m, *(ctx.fresh() for _ in range(n))))]
    win = window_attrs(ctx.attrs, kernel, fail)
    out_pad = _int_list(ctx.attr("output_padding"), n, 0, "output_padding", fail)
    for p, s, d in zip(out_pad, win.strides, win.dilations):
        if not 0 <= p < max(s, d):
            fail(f"output_padding {out_pad} must be in [0, max(stride, dilation)) per dim")
    outs, _ = _convt_geometry(x[2:], win, out_pad, _convt_output_shape(ctx.attrs, n, fail))
    for i, o in enumerate(outs):
        if isinstance(o, int) and o < 1:
            ctx.fail(f"spatial dim {i} gives output size {o}")
    return [TensorDesc(dtype, (x[0], m, *outs))]


def conv_transpose_nd(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]
) -> np.ndarray:
    """ONNX ConvTranspose on numpy arrays: batched matmul, then a strided scatter-add."""
    n_sp = x.ndim - 2
    win = window_attrs(attrs, w.shape[2:])
    group = int(attrs.get("group") or 1)
    out_pad = _int_list(attrs.get("output_padding"), n_sp, 0, "output_padding", _raise_shape)
    outs, begins = _convt_geometry(
        x.shape[2:], win, out_pad, _convt_output_shape(attrs, n_sp, _raise_shape)
    )
    nb, c = x.shape[:2]
    if c != w.shape[0] or c % group:
        raise ShapeError(
            f"ConvTranspose: X{list(x.shape)} and W{list(w.shape)} do not agree with group={group}"
        )
    cg, mg = c // group, w.shape[1]
    m = mg * group
    ins = x.shape[2:]
    n_pos, n_k = math.prod(ins), math.prod(win.kernel)
    ct = _compute_dtype(x.dtype)
    xt = x.astype(ct, copy=False).reshape(nb, group, cg, n_pos).transpose(1, 0, 3, 2)
    wm = w.astype(ct, copy=False).reshape(group, 1, cg, mg * n_k)
    cols = np.matmul(xt, wm)  # (G, N, P, Mg*K)
    cols = cols.reshape((group, nb, *ins, mg, *win.kernel))
    sp_in = tuple(range(2, 2 + n_sp))
    sp_k = tuple(range(3 + n_sp, 3 + 2 * n_sp))
    cols = cols.transpose((1, 0, 2 + n_sp, *sp_k, *sp_in)).reshape((nb, m, *win.kernel, *ins))
    y = np.zeros((nb, m, *outs), dtype=ct)
    for kidx in itertools.product(*(range(k) for k in win.kernel)):
        dst, src = [], []
        for i in range(n_sp):
            s = win.strides[i]
            off = kidx[i] * win.dilations[i] - begins[i]  # output position of input 0
            lo = 0 if off >= 0 else ceildiv(-off, s)
            hi = min(ins[i] - 1, (outs[i] - 1 - off) // s)
            if lo > hi:
                break
            dst.append(slice(lo * s + off, hi * s + off + 1, s))
            src.append(slice(lo, hi + 1))
        else:
            y[(slice(None), slice(None), *dst)] += cols[(slice(None), slice(None), *kidx, *src)]
    if b is not None:
        y += b.astype(ct, copy=False).reshape((1, m) + (1,) * n_sp)
    return y.astype(x.dtype, copy=False)


def _convt_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    return [conv_transpose_nd(ins[0], ins[1], ins[2] if len(ins) > 2 else None, attrs)]


register(
    OpDef(
        "ConvTranspose",
        OpKind.LIBRARY,
        inputs=[In("X", "T"), In("W", "T"), In("B", "T", optional=True)],
        outputs=[Out("Y", "T")],
        types={"T": dtypes.FLOATS},
        attrs=[
            *CONV_ATTRS,
            Attr("output_padding", "ints", None),
            Attr("output_shape", "ints", None),
        ],
        verify=_convt_verify,
        infer=_convt_infer,
        kernel=_convt_kernel,
        doc="N-D transposed convolution with groups, strides, dilations, output_padding/shape",
    )
)


# == pooling =================================================================================


def _pool_verify(ctx: InferContext) -> None:
    x = ctx.shape(0)
    ks = [int(k) for k in ctx.attr("kernel_shape")]
    if x is not None and len(x) != len(ks) + 2:
        ctx.fail(f"X of shape {list(x)} must have rank 2 + len(kernel_shape) = {len(ks) + 2}")
    win = window_attrs(ctx.attrs, ks, _ctx_fail(ctx))
    for name in ("ceil_mode", "storage_order", "count_include_pad"):
        if name in ctx.attrs and int(ctx.attr(name)) not in (0, 1):
            ctx.fail(f"{name} must be 0 or 1, got {ctx.attr(name)}", VerifyError)
    if win.auto_pad == "NOTSET":
        for i in range(win.rank):
            span = win.dilations[i] * (win.kernel[i] - 1) + 1
            if win.begin[i] >= span or win.end[i] >= span:
                ctx.fail(f"pads {win.pads} must be smaller than the window in every spatial dim")


def _pool_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    dtype = ctx.dtype(0)
    shape: Shape = None
    if x is not None:
        win = window_attrs(ctx.attrs, ctx.attr("kernel_shape"), _ctx_fail(ctx))
        ceil = bool(ctx.attr("ceil_mode") or 0)
        shape = (x[0], x[1], *_spatial_out(ctx, x[2:], win, ceil))
    descs = [TensorDesc(dtype, shape)]
    if ctx.n_outputs > 1:
        descs.append(TensorDesc(np.int64, shape))
    return descs


@dataclass
class _Pooled:
    """A pooling input prepared for the kernels: geometry and the window view."""

    win: Window
    out: list[int]
    begin: list[int]
    end: list[int]
    view: np.ndarray  # (N, C, *out, *kernel)


def _pool_prepare(x: np.ndarray, attrs: dict[str, Any], fill: Any) -> _Pooled:
    """Window attributes, output sizes, pads and the window view of ``x``."""
    win = window_attrs(attrs, attrs["kernel_shape"])
    out, begin, end = _static_geometry(x.shape[2:], win, bool(attrs.get("ceil_mode") or 0))
    xp = _pad_for_windows(x, out, win, begin, end, fill)
    return _Pooled(win, out, begin, end, _windows(xp, out, win))


def _tap_counts(
    out: Sequence[int], win: Window, lo: Sequence[int], hi: Sequence[int]
) -> np.ndarray:
    """Per output position, how many window taps fall in ``[lo, hi)`` (padded coordinates)."""
    total = np.ones((), dtype=np.int64)
    for i in range(win.rank):
        starts = np.arange(out[i]) * win.strides[i]
        taps = starts[:, None] + np.arange(win.kernel[i])[None, :] * win.dilations[i]
        cnt = ((taps >= lo[i]) & (taps < hi[i])).sum(axis=1)
        total = np.multiply.outer(total, cnt)
    return total


def _tap_mask(
    sizes: Sequence[int], out: Sequence[int], win: Window, begin: Sequence[int]
) -> np.ndarray:
    """Boolean ``(*out, *kernel)``: whether each window tap reads a real input element."""
    n = win.rank
    mask = np.ones((1,) * (2 * n), dtype=bool)
    for i in range(n):
        taps = (
            (np.arange(out[i]) * win.strides[i])[:, None]
            + (np.arange(win.kernel[i]) * win.dilations[i])[None, :]
            - begin[i]
        )
        m = (taps >= 0) & (taps < sizes[i])
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = out[i], win.kernel[i]
        mask = mask & m.reshape(shape)
    return mask


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def max_pool_nd(x: np.ndarray, attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """ONNX MaxPool: values and int64 flat indices (row- or column-major spatial order)."""
    pp = _pool_prepare(x, attrs, _lowest(x.dtype))
    win, out, begin, view = pp.win, pp.out, pp.begin, pp.view
    n = win.rank
    nb, c = x.shape[:2]
    n_k = math.prod(win.kernel)
    flat = view.reshape((nb, c, *out, n_k))
    y = flat.max(axis=-1)
    mask = _tap_mask(x.shape[2:], out, win, begin).reshape((*out, n_k))
    top = y[..., None]
    hit = ((flat == top) | (np.isnan(flat) & np.isnan(top))) & mask  # a NaN max: its tap
    first = hit.argmax(axis=-1)  # first tap holding the max, in kernel row-major order
    kidx = np.unravel_index(first, win.kernel)
    coords = []
    for i in range(n):
        o = np.arange(out[i]).reshape([out[i] if j == i else 1 for j in range(n)])
        coords.append(o * win.strides[i] + kidx[i] * win.dilations[i] - begin[i])
    coords = [np.broadcast_to(cd, first.shape) for cd in coords]
    order = "F" if int(attrs.get("storage_order") or 0) else "C"
    sp = x.shape[2:]
    local = np.ravel_multi_index(tuple(coords), sp, order=order, mode="clip")
    base = (np.arange(nb * c, dtype=np.int64) * math.prod(sp)).reshape((nb, c) + (1,) * n)
    index = np.where(hit.any(axis=-1), base + local, -1)  # -1: a window of padding only
    return y.astype(x.dtype, copy=False), index.astype(np.int64)


def _maxpool_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    return list(max_pool_nd(ins[0], attrs))


def avg_pool_nd(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """ONNX AveragePool: window sum over the count of real (or, with count_include_pad, padded) taps."""
    ct = _compute_dtype(x.dtype)
    pp = _pool_prepare(x.astype(ct, copy=False), attrs, 0)
    n = pp.win.rank
    sums = pp.view.sum(axis=tuple(range(2 + n, 2 + 2 * n)))
    sizes = x.shape[2:]
    if int(attrs.get("count_include_pad") or 0):  # taps inside the padded input
        hi = [sizes[i] + pp.begin[i] + pp.end[i] for i in range(n)]
        counts = _tap_counts(pp.out, pp.win, [0] * n, hi)
    else:  # taps on real elements (never the extra ceil_mode padding)
        hi = [sizes[i] + pp.begin[i] for i in range(n)]
        counts = _tap_counts(pp.out, pp.win, pp.begin, hi)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = sums / counts.astype(ct)
    return y.astype(x.dtype, copy=False)


def lp_pool_nd(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """ONNX LpPool: ``(sum |x|^p)^(1/p)`` over each window (padding contributes 0)."""
    ct = _compute_dtype(x.dtype)
    p = float(attrs.get("p", 2))
    pp = _pool_prepare(np.abs(x.astype(ct, copy=False)) ** p, attrs, 0)
    n = pp.win.rank
    sums = pp.view.sum(axis=tuple(range(2 + n, 2 + 2 * n)))
    return (sums ** (1.0 / p)).astype(x.dtype, copy=False)


_POOL_ATTRS = [
    Attr("auto_pad", "string", "NOTSET"),
    Attr("ceil_mode", "int", 0),
    Attr("dilations", "ints", None),
    Attr("kernel_shape", "ints", REQUIRED),
    Attr("pads", "ints", None),
    Attr("strides", "ints", None),
]

register(
    OpDef(
        "MaxPool",
        OpKind.LIBRARY,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T"), Out("Indices", "I", optional=True)],
        types={"T": MAXPOOL_TYPES},
        attrs=[*_POOL_ATTRS, Attr("storage_order", "int", 0)],
        verify=_pool_verify,
        infer=_pool_infer,
        kernel=_maxpool_kernel,
        doc="max over sliding windows; optional int64 flat indices of the maxima",
    )
)

register(
    OpDef(
        "AveragePool",
        OpKind.LIBRARY,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T")],
        types={"T": dtypes.FLOATS},
        attrs=[*_POOL_ATTRS, Attr("count_include_pad", "int", 0)],
        verify=_pool_verify,
        infer=_pool_infer,
        kernel=lambda ins, attrs: [avg_pool_nd(ins[0], attrs)],
        doc="mean over sliding windows (padding counted with count_include_pad=1)",
    )
)

register(
    OpDef(
        "LpPool",
        OpKind.LIBRARY,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T")],
        types={"T": dtypes.FLOATS},
        attrs=[*_POOL_ATTRS, Attr("p", "int", 2)],
        verify=_pool_verify,
        infer=_pool_infer,
        kernel=lambda ins, attrs: [lp_pool_nd(ins[0], attrs)],
        doc="Lp norm over sliding windows",
    )
)


def _global_pool_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    if x is not None and len(x) < 2:
        ctx.fail(f"X must have rank >= 2 (N, C, spatial...), got shape {list(x)}")
    shape = None if x is None else (x[0], x[1], *([1] * (len(x) - 2)))
    return [TensorDesc(ctx.dtype(0), shape)]


def _global_avg(ins: list, attrs: dict) -> list[np.ndarray]:
    x = ins[0]
    axes = tuple(range(2, x.ndim))
    y = x.astype(_compute_dtype(x.dtype), copy=False).mean(axis=axes, keepdims=True)
    return [y.astype(x.dtype)]


def _global_max(ins: list, attrs: dict) -> list[np.ndarray]:
    x = ins[0]
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


for _name, _fn, _doc in (
    ("GlobalAveragePool", _global_avg, "mean over all spatial dims (kept as size 1)"),
    ("GlobalMaxPool", _global_max, "max over all spatial dims (kept as size 1)"),
):
    register(
        OpDef(
            _name,
            OpKind.LIBRARY,
            inputs=[In("X", "T")],
            outputs=[Out("Y", "T")],
            types={"T": dtypes.FLOATS},
            infer=_global_pool_infer,
            kernel=_fn,
            doc=_doc,
        )
    )


# == normalization ===========================================================================


def _channel_params_verify(ctx: InferContext, first: int, last: int) -> None:
    """Inputs ``first..last`` must be 1-D of length C = X[1]."""
    x = ctx.shape(0)
    if x is not None and len(x) < 2:
        ctx.fail(f"X must have rank >= 2 (N, C, ...), got shape {list(x)}")
    for i in range(first, last + 1):
        if not ctx.has(i):
            continue
        s = ctx.shape(i)
        if s is None:
            continue
        if len(s) != 1:
            ctx.fail(f"input {i} ({ctx.opdef.inputs[i].name}) must be 1-D, got shape {list(s)}")
        if x is not None:
            _equate(
                ctx,
                s[0],
                x[1],
                f"input {i} ({ctx.opdef.inputs[i].name}) length must equal channels X[1]",
            )


def _bn_verify(ctx: InferContext) -> None:
    _channel_params_verify(ctx, 1, 4)
    tm = int(ctx.attr("training_mode"))
    if tm not in (0, 1):
        ctx.fail(f"training_mode must be 0 or 1, got {tm}", VerifyError)
    if ctx.n_outputs > 1 and not tm:
        ctx.fail("running_mean / running_var outputs exist only with training_mode=1", VerifyError)


def _bn_infer(ctx: InferContext) -> list[TensorDesc]:
    descs = [TensorDesc(ctx.dtype(0), ctx.shape(0))]
    for i in (3, 4)[: max(0, ctx.n_outputs - 1)]:
        descs.append(TensorDesc(ctx.dtype(i), ctx.shape(i)))
    return descs


def _bn_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x, scale, bias, mean, var = ins[:5]
    ct = _compute_dtype(np.result_type(x.dtype, scale.dtype, mean.dtype))
    eps = attr_float(attrs["epsilon"])
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xc = x.astype(ct, copy=False)
    outs: list[np.ndarray] = []
    if int(attrs["training_mode"]):
        axes = tuple(i for i in range(x.ndim) if i != 1)
        bmean, bvar = xc.mean(axis=axes), xc.var(axis=axes)
        mom = attr_float(attrs["momentum"])
        run_mean = mean.astype(ct) * mom + bmean * (1 - mom)
        run_var = var.astype(ct) * mom + bvar * (1 - mom)
        outs = [run_mean.astype(mean.dtype), run_var.astype(var.dtype)]
        use_mean, use_var = bmean, bvar
    else:
        use_mean, use_var = mean.astype(ct, copy=False), var.astype(ct, copy=False)
    inv = (scale.astype(ct, copy=False) / np.sqrt(use_var + ct.type(eps))).reshape(shape)
    shift = bias.astype(ct, copy=False).reshape(shape)
    y = (xc - use_mean.reshape(shape)) * inv + shift
    return [y.astype(x.dtype), *outs]


register(
    OpDef(
        "BatchNormalization",
        OpKind.OPAQUE,
        inputs=[
            In("X", "T"),
            In("scale", "T1"),
            In("B", "T1"),
            In("input_mean", "T2"),
            In("input_var", "T2"),
        ],
        outputs=[
            Out("Y", "T"),
            Out("running_mean", "T2", optional=True),
            Out("running_var", "T2", optional=True),
        ],
        types={"T": dtypes.FLOATS, "T1": dtypes.FLOATS, "T2": dtypes.FLOATS},
        attrs=[
            Attr("epsilon", "float", 1e-5),
            Attr("momentum", "float", 0.9),
            Attr("training_mode", "int", 0),
        ],
        verify=_bn_verify,
        infer=_bn_infer,
        kernel=_bn_kernel,
        doc="per-channel normalization with given statistics (batch ones with training_mode=1)",
    )
)


def _in_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x, scale, bias = ins[:3]
    ct = _compute_dtype(x.dtype)
    xc = x.astype(ct, copy=False)
    axes = tuple(range(2, x.ndim))
    mean = xc.mean(axis=axes, keepdims=True)
    var = xc.var(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (xc - mean) / np.sqrt(var + ct.type(attr_float(attrs["epsilon"])))
    y = y * scale.astype(ct).reshape(shape) + bias.astype(ct).reshape(shape)
    return [y.astype(x.dtype)]


def _in_verify(ctx: InferContext) -> None:
    x = ctx.shape(0)
    if x is not None and len(x) < 3:
        ctx.fail(f"X must have rank >= 3 (N, C, spatial...), got shape {list(x)}")
    _channel_params_verify(ctx, 1, 2)


register(
    OpDef(
        "InstanceNormalization",
        OpKind.OPAQUE,
        inputs=[In("input", "T"), In("scale", "T"), In("B", "T")],
        outputs=[Out("output", "T")],
        types={"T": dtypes.FLOATS},
        attrs=[Attr("epsilon", "float", 1e-5)],
        verify=_in_verify,
        infer=lambda ctx: [TensorDesc(ctx.dtype(0), ctx.shape(0))],
        kernel=_in_kernel,
        doc="normalizes each (N, C) plane over its spatial dims, then scale and bias",
    )
)


def _lrn_verify(ctx: InferContext) -> None:
    if int(ctx.attr("size")) < 1:
        ctx.fail(f"size must be >= 1, got {ctx.attr('size')}", VerifyError)
    x = ctx.shape(0)
    if x is not None and len(x) < 3:
        ctx.fail(f"X must have rank >= 3 (N, C, spatial...), got shape {list(x)}")


def _lrn_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x = ins[0]
    size = int(attrs["size"])
    alpha, beta, bias = (attr_float(attrs[k]) for k in ("alpha", "beta", "bias"))
    ct = _compute_dtype(x.dtype)
    xc = x.astype(ct, copy=False)
    c = x.shape[1]
    before = (size - 1) // 2  # channels c - floor((size-1)/2) .. c + ceil((size-1)/2)
    widths = [(0, 0)] * x.ndim
    widths[1] = (before, size - 1 - before)
    sq = np.pad(xc * xc, widths)
    square_sum = np.zeros_like(xc)
    for j in range(size):
        square_sum += sq[:, j : j + c]
    coef = np.float32(alpha) / np.float32(size)  # a float attribute over an int, in float32
    y = xc / (ct.type(bias) + ct.type(coef) * square_sum) ** ct.type(beta)
    return [y.astype(x.dtype)]


register(
    OpDef(
        "LRN",
        OpKind.OPAQUE,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T")],
        types={"T": dtypes.FLOATS},
        attrs=[
            Attr("alpha", "float", 1e-4),
            Attr("beta", "float", 0.75),
            Attr("bias", "float", 1.0),
            Attr("size", "int", REQUIRED),
        ],
        verify=_lrn_verify,
        infer=lambda ctx: [TensorDesc(ctx.dtype(0), ctx.shape(0))],
        kernel=_lrn_kernel,
        doc="local response normalization across channels",
    )
)


# == Einsum ==================================================================================


@dataclass
class EinsumSpec:
    """A parsed einsum equation: per-input terms and the output term (``'.'`` is the ellipsis)."""

    inputs: list[str]
    output: str


def parse_einsum(equation: str, n_inputs: int, fail: Fail = _raise_shape) -> EinsumSpec:
    """Parse an einsum equation; the implicit output is the ellipsis then once-used labels, sorted."""
    eq = _str_attr(equation).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        fail(f"equation {equation!r} has {len(terms)} operands, node has {n_inputs} inputs")
    norm = []
    for t in terms + ([rhs] if arrow else []):
        if t.count("...") > 1:
            fail(f"equation {equation!r}: more than one ellipsis in a term")
        s = t.replace("...", ".")
        if any(not (ch.isalpha() or ch == ".") for ch in s):
            fail(f"equation {equation!r}: term {t!r} has characters other than letters and '...'")
        norm.append(s)
    ins = norm[:n_inputs]
    if arrow:
        out = norm[n_inputs]
        for ch in out:
            if ch != "." and not any(ch in t for t in ins):
                fail(f"equation {equation!r}: output label {ch!r} is in no input")
    else:
        counts: dict[str, int] = {}
        for t in ins:
            for ch in t:
                if ch != ".":
                    counts[ch] = counts.get(ch, 0) + 1
        ell = "." if any("." in t for t in ins) else ""
        out = ell + "".join(sorted(ch for ch, k in counts.items() if k == 1))
    return EinsumSpec(ins, out)


def _einsum_infer(ctx: InferContext) -> list[TensorDesc]:
    spec = parse_einsum(ctx.attr("equation"), ctx.n_inputs, _ctx_fail(ctx))
    dtype = ctx.dtype(0)
    labels: dict[str, Dim] = {}
    ellipses: list[tuple[Dim, ...]] = []
    for i, term in enumerate(spec.inputs):
        shape = ctx.shape(i)
        if shape is None:
            return [TensorDesc(dtype, None)]
        n_named = len(term.replace(".", ""))
        if ("." in term and len(shape) < n_named) or ("." not in term and len(shape) != n_named):
            ctx.fail(f"input {i} of shape {list(shape)} does not match term {term!r}")
        pos = 0
        for ch in term:
            if ch == ".":
                k = len(shape) - n_named
                ellipses.append(tuple(shape[pos : pos + k]))
                pos += k
                continue
            d = shape[pos]
            pos += 1
            if ch not in labels or labels[ch] == 1:
                labels[ch] = d
            elif d != 1:
                _equate(ctx, labels[ch], d, f"label {ch!r} has different sizes")
    ell = (
        broadcast_shapes(*ellipses, where=ctx.where, symbols=ctx.graph.symbols) if ellipses else ()
    )
    out: list[Dim] = []
    for ch in spec.output:
        out.extend(ell if ch == "." else [labels[ch]])
    return [TensorDesc(dtype, tuple(out))]


def _einsum_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    dtype = ins[0].dtype
    ct = _compute_dtype(dtype)
    eq = _str_attr(attrs["equation"]).replace(" ", "")
    args = [np.asarray(x).astype(ct, copy=False) for x in ins]
    return [np.asarray(np.einsum(eq, *args, optimize=len(args) > 2)).astype(dtype)]


register(
    OpDef(
        "Einsum",
        OpKind.LIBRARY,
        inputs=[In("Inputs", "T", variadic=True)],
        outputs=[Out("Output", "T")],
        types={"T": dtypes.NUMERIC},
        attrs=[Attr("equation", "string", REQUIRED)],
        infer=_einsum_infer,
        kernel=_einsum_kernel,
        doc="Einstein summation (numpy einsum semantics, implicit and explicit output)",
    )
)


# == Dropout =================================================================================


def _dropout_infer(ctx: InferContext) -> list[TensorDesc]:
    if ctx.has(1) and ctx.rank(1) not in (None, 0):
        ctx.fail(f"ratio must be a scalar, got shape {list(ctx.shape(1))}")
    if ctx.has(2) and ctx.rank(2) not in (None, 0):
        ctx.fail(f"training_mode must be a scalar, got shape {list(ctx.shape(2))}")
    d = ctx.desc(0)
    return [TensorDesc(d.dtype, d.shape), TensorDesc(np.bool_, d.shape)]


def _dropout_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x = ins[0]
    ratio = float(np.asarray(ins[1])) if len(ins) > 1 and ins[1] is not None else 0.5
    training = bool(np.asarray(ins[2])) if len(ins) > 2 and ins[2] is not None else False
    if not training or ratio == 0.0:
        return [x.copy(), np.ones(x.shape, dtype=np.bool_)]
    seed = attrs.get("seed")
    # the generator and draw order of ONNX's reference (and its backend tests), so a
    # seeded Dropout reproduces their masks
    rng = np.random.RandomState(None if seed is None else int(seed))
    mask = rng.uniform(0.0, 1.0, x.shape) >= ratio
    scale = 0.0 if ratio >= 1.0 else 1.0 / (1.0 - ratio)
    return [(mask * x * scale).astype(x.dtype), mask]


register(
    OpDef(
        "Dropout",
        OpKind.OPAQUE,
        inputs=[
            In("data", "T"),
            In("ratio", "T1", optional=True),
            In("training_mode", "T2", optional=True),
        ],
        outputs=[Out("output", "T"), Out("mask", "T2", optional=True)],
        types={"T": dtypes.FLOATS, "T1": dtypes.FLOATS, "T2": dtypes.BOOL},
        attrs=[Attr("seed", "int", None)],
        infer=_dropout_infer,
        kernel=_dropout_kernel,
        doc="identity in inference (mask all True); random mask and 1/(1-ratio) scale in training",
    )
)


# == Det =====================================================================================


def _det_infer(ctx: InferContext) -> list[TensorDesc]:
    x = ctx.shape(0)
    if x is None:
        return [TensorDesc(ctx.dtype(0), None)]
    if len(x) < 2:
        ctx.fail(f"input must have rank >= 2 ([*, M, M]), got shape {list(x)}")
    _equate(ctx, x[-1], x[-2], "the matrices must be square")
    return [TensorDesc(ctx.dtype(0), tuple(x[:-2]))]


def _det_kernel(ins: list, attrs: dict) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    ct = _compute_dtype(x.dtype)
    return [np.asarray(np.linalg.det(x.astype(ct, copy=False))).astype(x.dtype)]


register(
    OpDef(
        "Det",
        OpKind.LIBRARY,
        inputs=[In("X", "T")],
        outputs=[Out("Y", "T")],
        types={"T": dtypes.FLOATS},
        infer=_det_infer,
        kernel=_det_kernel,
        doc="determinant of each square matrix [*, M, M] -> [*]",
    )
)
