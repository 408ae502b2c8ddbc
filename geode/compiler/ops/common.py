"""Shared building blocks for op prototypes: infer-shape helpers and registration factories."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.registry import Attr, In, InferContext, OpDef, OpKind, Out, register
from geode.compiler.shapes import Dim, broadcast_shapes
from geode.errors import ShapeError


def same_as_input(i: int = 0, dtype: object = None) -> Callable[[InferContext], list[TensorDesc]]:
    """Infer: one output with input ``i``'s shape (and dtype unless ``dtype`` is given)."""

    def infer(ctx: InferContext) -> list[TensorDesc]:
        d = ctx.desc(i)
        return [TensorDesc(dtype if dtype is not None else d.dtype, d.shape, d.format)]

    return infer


def broadcast_infer(dtype: object = None) -> Callable[[InferContext], list[TensorDesc]]:
    """Infer: one output whose shape broadcasts every given input."""

    def infer(ctx: InferContext) -> list[TensorDesc]:
        shapes = [v.shape for v in ctx.node.inputs if v is not None]
        out_dtype = dtype if dtype is not None else ctx.dtype(0)
        return [
            TensorDesc(
                out_dtype, broadcast_shapes(*shapes, where=ctx.where, symbols=ctx.graph.symbols)
            )
        ]

    return infer


def const_ints(ctx: InferContext, i: int) -> list[int] | None:
    """A constant int input as a Python list (None when omitted or not constant)."""
    if not ctx.has(i):
        return None
    v = ctx.value(i)
    return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


def unary(
    op_type: str,
    fn: Callable[..., np.ndarray],
    types: frozenset = dtypes.FLOATS,
    attrs: Sequence[Attr] = (),
    kind: OpKind = OpKind.ELEMENTWISE,
    out_dtype: object = None,
    doc: str = "",
) -> OpDef:
    """Register a one-input elementwise op; ``fn(x, attrs)`` is its reference kernel."""
    return register(
        OpDef(
            op_type,
            kind,
            inputs=[In("X", "T")],
            outputs=[Out("Y", "T")],
            types={"T": types},
            attrs=list(attrs),
            infer=same_as_input(0, out_dtype),
            kernel=lambda ins, a: [
                np.asarray(
                    fn(ins[0], a), dtype=out_dtype if out_dtype is not None else ins[0].dtype
                )
            ],
            doc=doc,
        )
    )


def binary(
    op_type: str,
    fn: Callable[..., np.ndarray],
    types: frozenset = dtypes.NUMERIC,
    out_dtype: object = None,
    attrs: Sequence[Attr] = (),
    doc: str = "",
) -> OpDef:
    """Register a two-input broadcasting op; ``fn(a, b, attrs)`` is its reference kernel."""

    def kernel(ins: list, a: dict) -> list[np.ndarray]:
        res = fn(ins[0], ins[1], a)
        return [np.asarray(res, dtype=out_dtype if out_dtype is not None else ins[0].dtype)]

    return register(
        OpDef(
            op_type,
            OpKind.BROADCAST,
            inputs=[In("A", "T"), In("B", "T")],
            outputs=[Out("C", "T1" if out_dtype is not None else "T")],
            types={
                "T": types,
                **({"T1": frozenset([np.dtype(out_dtype)])} if out_dtype is not None else {}),
            },
            attrs=list(attrs),
            infer=broadcast_infer(out_dtype),
            kernel=kernel,
            doc=doc,
        )
    )


def normalize_indices(idx: np.ndarray, size: int) -> np.ndarray:
    """Map negative indices into ``[0, size)`` (ONNX accepts ``[-size, size)``)."""
    idx = np.asarray(idx).astype(np.int64)
    return np.where(idx < 0, idx + size, idx)


def equate_dims(ctx: InferContext, a: Dim, b: Dim, what: str) -> Dim:
    """Record that two dims are equal (ShapeError naming the node when they provably differ)."""
    try:
        return ctx.graph.symbols.equate(a, b, where=f"{ctx.where}, {what}")
    except ShapeError as exc:
        raise ShapeError(f"{ctx.where}: {what}: dims {a} and {b} must be equal") from exc


def check_const_indices(ctx: InferContext, i: int, size: Dim, what: str) -> None:
    """When input ``i`` is constant and ``size`` static, every index must be in [-size, size)."""
    idx = ctx.value(i)
    if idx is None or not isinstance(size, int) or np.asarray(idx).size == 0:
        return
    lo, hi = int(np.min(idx)), int(np.max(idx))
    if lo < -size or hi >= size:
        ctx.fail(f"{what} hold {lo if lo < -size else hi}, out of range for a dim of {size}")
