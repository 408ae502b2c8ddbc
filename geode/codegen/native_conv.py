"""Conv nodes as native AI Core steps (the bind stage asks :func:`conv_interface` for
every Conv and geode FusedConv placed on AICPU).

A Conv goes native (:mod:`geode.codegen.backends.llvm.conv`: the Winograd kernel, the
direct register-blocked kernel, im2col + BLAS GEMM, pointwise GEMM, or the direct
depthwise kernel; the option ``conv_method="im2col"`` trades the direct kernel for im2col,
``direct`` never takes Winograd, ``winograd`` takes it wherever it runs) when, with the LLVM
backend and codegen
on: X, W (and B) and Y are all float32 or all float64; X is 3-D or 4-D (1-D or 2-D
conv, NCHW); W's shape is static (so are the channels, group and window); and Y's shape
follows from the graph inputs' symbols (a dim known only once a value is computed
cannot size a native step's output). A FusedConv (the ``fuse_conv`` pass's Conv with
its residual add, Relu and MaxPool) goes native the same way, its epilogue in the
kernel; the placement's reason names the method, the epilogue and why the method was
chosen (``explain()``). A Winograd conv's step reads its weight's transform, computed
once (:mod:`geode.codegen.winograd_weights`).
Otherwise it keeps the reference kernel, and the placement records why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from geode.codegen.backends.llvm.conv_spec import ConvSpec
from geode.codegen.driver import LibraryChoice, library_fallback, library_step, object_cache
from geode.compiler.ir import GEODE_DOMAIN, Graph, Node
from geode.compiler.ops.nn import FUSED_CONV, pool_attrs, window_attrs
from geode.compiler.shapes import free_symbols
from geode.config import Options
from geode.errors import CodegenError, GeodeError

if TYPE_CHECKING:
    pass

__all__ = ["conv_interface", "conv_spec", "start_conv"]

#: what each method is called in the placement's reasons
_METHODS = {
    "im2col": "im2col + BLAS GEMM",
    "pointwise": "1x1 BLAS GEMM",
    "depthwise": "direct depthwise kernel",
    "direct": "direct register-blocked kernel",
    "winograd": "Winograd kernel",
}


def conv_spec(node: Node, g: Graph, choice: str = "auto") -> ConvSpec | str:
    """The :class:`~geode.codegen.backends.llvm.conv_spec.ConvSpec` of a Conv or
    FusedConv node, or a string saying why it cannot run natively (see the module
    docstring); ``choice``: the option ``conv_method``."""
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    z = node.inputs[3] if len(node.inputs) > 3 else None
    y = node.outputs[0] if len(node.outputs) == 1 else None
    if y is None or x is None or w is None:
        return "not a single-output Conv"
    dtype = str(np.dtype(x.dtype))
    if dtype not in ("float32", "float64"):
        return f"{dtype} (native: float32, float64)"
    if any(v is not None and v.dtype != x.dtype for v in (w, bias, z, y)):
        return "mixed dtypes"
    if x.shape is None or len(x.shape) not in (3, 4):
        return "X is not 3-D or 4-D (native: 1-D and 2-D convs)"
    if (
        w.shape is None
        or not all(isinstance(d, int) for d in w.shape)
        or len(w.shape) != len(x.shape)
    ):
        return "W's shape is not static"
    if y.shape is None:
        return "Y's shape is unknown"
    known = set().union(*(free_symbols(v.shape) for v in g.inputs))
    if not free_symbols(y.shape) <= known:
        return "Y's shape is known only at run time"
    try:
        win = window_attrs(node.attrs, list(w.shape[2:]))
    except GeodeError as exc:
        return f"window attributes: {exc}"
    group = int(node.attrs.get("group") or 1)
    lift = len(x.shape) == 3  # a 1-D conv is the 2-D one with H = 1
    pads = [0, *win.begin, 0, *win.end] if lift else [*win.begin, *win.end]
    try:
        return ConvSpec(
            dtype=dtype,
            spatial=2 - lift,
            channels=w.shape[1] * group,
            out_channels=w.shape[0],
            group=group,
            kernel=tuple([1] * lift + list(w.shape[2:])),
            strides=tuple([1] * lift + win.strides),
            dilations=tuple([1] * lift + win.dilations),
            pads=tuple(pads),
            auto_pad=win.auto_pad,
            bias=bias is not None,
            residual=z is not None,
            activation=str(node.attrs.get("activation") or "").lower(),
            choice=_choice(choice),
            pool=_pool_of(node.attrs),
            constant_weight=w.is_constant
            and (w.data is not None or getattr(w, "external_loader", None) is not None),
            out_width=y.shape[-1] if isinstance(y.shape[-1], int) else 0,
        )
    except ValueError as exc:
        return str(exc)


def _choice(choice: str) -> str:
    """The option ``conv_method`` as ``ConvSpec.choice``: ``auto`` without Winograd
    (``direct``) on a CPU without AVX2 + FMA, where the Winograd kernel runs its plain C
    path (not measured faster than the direct kernel there)."""
    from geode.runtime import native

    if choice == "auto" and int(native.pool_info()["winograd_isa"]) < 1:
        return "direct"
    return choice


def _pool_of(attrs: dict) -> tuple[int, ...]:
    """A FusedConv's pooling as ``ConvSpec.pool`` (``()`` without one)."""
    pool = pool_attrs(attrs)
    if pool is None:
        return ()
    (kh, kw), (sh, sw) = pool["kernel_shape"], pool["strides"]
    return (kh, kw, sh, sw, *pool["pads"])


def _native_conv(node: Node, opts: Options) -> bool:
    """Whether ``node`` is a Conv or FusedConv and native code is on (LLVM and codegen)."""
    plain = node.op_type == "Conv" and node.domain in ("", "ai.onnx")
    if not plain and (node.op_type, node.domain) != (FUSED_CONV, GEODE_DOMAIN):
        return False
    return opts.backend == "llvm" and opts.codegen


def start_conv(node: Node, g: Graph, opts: Options) -> str | None:
    """Start LLVM, on the background threads, on the module :func:`conv_interface` will
    link for ``node`` (``driver.start_library``'s counterpart for convs): its IR, for
    ``driver.abandon_library``, or None when ``node`` gets no native conv module."""
    if not _native_conv(node, opts):
        return None
    spec = conv_spec(node, g, opts.conv_method)
    if isinstance(spec, str):
        return None
    from geode.codegen.backends.llvm.conv import conv_ir
    from geode.codegen.backends.llvm.kernel import start_module
    from geode.codegen.backends.llvm.library import blas
    from geode.codegen.backends.llvm.target import host

    if spec.method in ("im2col", "pointwise") and blas() is None:
        return None  # conv_kernel links no module
    name, ir = conv_ir(spec, host().function_attrs)
    start_module(name, ir, object_cache(opts))
    return ir


def conv_interface(node: Node, g: Graph, opts: Options) -> LibraryChoice | None:
    """The native step of a Conv node (see the module docstring): a :class:`LibraryChoice`,
    or None for a node that is not a Conv or when native code is off (LLVM backend and
    codegen both needed)."""
    if not _native_conv(node, opts):
        return None
    spec = conv_spec(node, g, opts.conv_method)
    if isinstance(spec, str):
        return LibraryChoice(None, None, f"library op: reference kernel (Conv: {spec})")
    from geode.codegen.backends.llvm.conv import conv_kernel

    try:
        kernel = conv_kernel(spec, object_cache(opts))
    except CodegenError as exc:
        return library_fallback(node, exc)
    if kernel is None:
        return LibraryChoice(None, None, "library op: reference kernel (Conv: no BLAS found)")
    interface, info = library_step(node, kernel, len(spec.arrays) - 1, spec.describe(), opts)
    parts = (("residual add", spec.residual), (spec.activation, spec.activation))
    epilogue = "".join(f" + {e}" for e, on in (*parts, ("max pool", spec.pool)) if on)
    why = f" ({spec.reason})" if spec.reason else ""
    return LibraryChoice(
        interface,
        info,
        f"library op: {node.op_type}, {_METHODS[spec.method]}{epilogue}, native{why}",
    )
