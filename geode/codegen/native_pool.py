"""Pooling nodes as native AI Core steps (the bind stage asks :func:`pool_interface` for
every MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool placed on AICPU).

A pool goes native (:mod:`geode.codegen.backends.llvm.pool`: a direct window reduction
per plane on the native pool) when, with the LLVM backend and codegen on: X and Y are
both float32 or both float64; X is 3-D or 4-D (1-D or 2-D pooling, NCHW); a MaxPool has
no second output (the Indices stay with the reference kernel; ``storage_order`` only
orders them); and Y's shape follows from the graph inputs' symbols. Otherwise it keeps
the reference kernel, and the placement records why.
"""

from __future__ import annotations

import numpy as np

from geode.codegen.backends.llvm.pool_spec import PoolSpec
from geode.codegen.driver import LibraryChoice, library_fallback, library_step, object_cache
from geode.compiler.ir import Graph, Node
from geode.compiler.ops.nn import window_attrs
from geode.compiler.shapes import free_symbols
from geode.config import Options
from geode.errors import CodegenError, GeodeError

__all__ = ["POOL_OPS", "pool_interface", "pool_spec", "start_pool"]

#: the pooling ops that may run natively, with their reduction and globality
POOL_OPS = {
    "MaxPool": ("max", False),
    "AveragePool": ("avg", False),
    "GlobalMaxPool": ("max", True),
    "GlobalAveragePool": ("avg", True),
}


def pool_spec(node: Node, g: Graph) -> PoolSpec | str:
    """The :class:`~geode.codegen.backends.llvm.pool_spec.PoolSpec` of a pooling node,
    or a string saying why it cannot run natively (see the module docstring)."""
    op, is_global = POOL_OPS[node.op_type]
    x = node.inputs[0] if node.inputs else None
    if len(node.outputs) > 1 and node.outputs[1] is not None:
        return "the Indices output (native: values only)"
    y = node.outputs[0] if node.outputs else None
    if x is None or y is None:
        return "no input or output"
    dtype = str(np.dtype(x.dtype))
    if dtype not in ("float32", "float64"):
        return f"{dtype} (native: float32, float64)"
    if y.dtype != x.dtype:
        return "mixed dtypes"
    if x.shape is None or len(x.shape) not in (3, 4):
        return "X is not 3-D or 4-D (native: 1-D and 2-D pooling)"
    if y.shape is None:
        return "Y's shape is unknown"
    known = set().union(*(free_symbols(v.shape) for v in g.inputs))
    if not free_symbols(y.shape) <= known:
        return "Y's shape is known only at run time"
    lift = len(x.shape) == 3  # a 1-D pool is the 2-D one with H = 1
    if is_global:
        return PoolSpec(dtype=dtype, spatial=2 - lift, op=op, is_global=True)
    try:
        kernel = [int(k) for k in node.attrs["kernel_shape"]]
        win = window_attrs(node.attrs, kernel)
        pads = [0, *win.begin, 0, *win.end] if lift else [*win.begin, *win.end]
        return PoolSpec(
            dtype=dtype,
            spatial=2 - lift,
            op=op,
            kernel=tuple([1] * lift + kernel),
            strides=tuple([1] * lift + win.strides),
            dilations=tuple([1] * lift + win.dilations),
            pads=tuple(pads),
            auto_pad=win.auto_pad,
            ceil_mode=bool(int(node.attrs.get("ceil_mode") or 0)),
            count_include_pad=bool(int(node.attrs.get("count_include_pad") or 0)),
        )
    except (GeodeError, KeyError, ValueError) as exc:
        return f"window attributes: {exc}"


def _native_pool(node: Node, opts: Options) -> bool:
    """Whether ``node`` is one of :data:`POOL_OPS` and native code is on."""
    if node.op_type not in POOL_OPS or node.domain not in ("", "ai.onnx"):
        return False
    return opts.backend == "llvm" and opts.codegen


def start_pool(node: Node, g: Graph, opts: Options) -> str | None:
    """Start LLVM, on the background threads, on the module :func:`pool_interface` will
    link for ``node`` (see ``native_conv.start_conv``): its IR, or None."""
    if not _native_pool(node, opts):
        return None
    spec = pool_spec(node, g)
    if isinstance(spec, str):
        return None
    from geode.codegen.backends.llvm.kernel import start_module
    from geode.codegen.backends.llvm.pool import pool_ir
    from geode.codegen.backends.llvm.target import host

    name, ir = pool_ir(spec, host().function_attrs)
    start_module(name, ir, object_cache(opts))
    return ir


def pool_interface(node: Node, g: Graph, opts: Options) -> LibraryChoice | None:
    """The native step of a pooling node (see the module docstring): a
    :class:`~geode.codegen.driver.LibraryChoice`, or None for a node that is not one of
    :data:`POOL_OPS` or when native code is off (LLVM backend and codegen both needed)."""
    if not _native_pool(node, opts):
        return None
    what = node.op_type
    spec = pool_spec(node, g)
    if isinstance(spec, str):
        return LibraryChoice(None, None, f"library op: reference kernel ({what}: {spec})")
    from geode.codegen.backends.llvm.pool import pool_kernel

    try:
        kernel = pool_kernel(spec, object_cache(opts))
    except CodegenError as exc:
        return library_fallback(node, exc)
    interface, info = library_step(node, kernel, 1, spec.describe(), opts)
    how = "whole-plane reduction" if spec.is_global else "direct window kernel"
    return LibraryChoice(interface, info, f"library op: {what}, {how}, native")
