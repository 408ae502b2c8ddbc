"""Scatter ops: ScatterElements, ScatterND and TensorScatter (ONNX opset-21 forms).

They are :attr:`OpKind.OPAQUE`: an output element may combine several updates, so
they cannot be written as an output-indexed map, and run on the reference engines.
"""

from __future__ import annotations

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import TensorDesc
from geode.compiler.ops.common import (
    check_const_indices,
    equate_dims,
    normalize_indices,
    same_as_input,
)
from geode.compiler.ops.reduce import (
    opt,
)
from geode.compiler.ops.registry import (
    Attr,
    In,
    InferContext,
    OpDef,
    OpKind,
    Out,
    register,
)
from geode.compiler.shapes import (
    dims_equal,
)
from geode.errors import ShapeError, VerifyError

_ALL = dtypes.ANY  # data movement carries the storage dtypes too
_I64 = frozenset([np.dtype(np.int64)])
_IND = dtypes.INDEX


# -- ScatterElements / ScatterND ------------------------------------------------------------------
_REDUCTIONS = ("none", "add", "mul", "max", "min")
_SCATTER_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(ctx_or_attrs: InferContext | dict) -> str:
    r = (
        ctx_or_attrs.attr("reduction")
        if isinstance(ctx_or_attrs, InferContext)
        else ctx_or_attrs["reduction"]
    )
    return r.decode() if isinstance(r, bytes) else r


def _verify_scatter(ctx: InferContext) -> None:
    """verify: a known reduction."""
    if _reduction(ctx) not in _REDUCTIONS:
        ctx.fail(f"reduction {_reduction(ctx)!r} is not one of {list(_REDUCTIONS)}", VerifyError)


def _infer_scatter_elements(ctx: InferContext) -> list[TensorDesc]:
    data, idx, upd = ctx.desc(0), ctx.desc(1), ctx.desc(2)
    ranks = {s.rank for s in (data, idx, upd)} - {None}
    if len(ranks) > 1:
        ctx.fail(
            f"data, indices and updates must have the same rank, got {data.rank}, {idx.rank}, {upd.rank}"
        )
    if data.shape is not None:
        if len(data.shape) == 0:
            ctx.fail("cannot scatter into a scalar")
        axis = ctx.axis(ctx.attr("axis"), len(data.shape))
        check_const_indices(ctx, 1, data.shape[axis], "indices")
    if idx.shape is not None and upd.shape is not None:
        for j, (a, b) in enumerate(zip(idx.shape, upd.shape)):
            equate_dims(ctx, a, b, f"dim {j} of indices and updates")
    return [TensorDesc(data.dtype, data.shape, data.format)]


def _scatter_elements(ins: list, attrs: dict) -> list[np.ndarray]:
    data, updates = np.asarray(ins[0]), np.asarray(ins[2])
    axis = int(attrs["axis"])
    axis = axis + data.ndim if axis < 0 else axis
    idx = normalize_indices(ins[1], data.shape[axis])
    where = list(np.indices(idx.shape, sparse=True))
    where[axis] = idx
    out = data.copy()
    red = _reduction(attrs)
    if red == "none":
        out[tuple(where)] = updates
    else:
        _SCATTER_UFUNC[red].at(out, tuple(where), updates)
    return [out]


register(
    OpDef(
        "ScatterElements",
        OpKind.OPAQUE,
        inputs=[In("data", "T"), In("indices", "Tind"), In("updates", "T")],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "Tind": _IND},
        attrs=[Attr("axis", "int", 0), Attr("reduction", "string", "none")],
        verify=_verify_scatter,
        infer=_infer_scatter_elements,
        kernel=_scatter_elements,
        doc="copy of data with updates written (or reduced) at indices along axis",
    )
)


def _infer_scatter_nd(ctx: InferContext) -> list[TensorDesc]:
    data, idx, upd = ctx.desc(0), ctx.desc(1), ctx.desc(2)
    if idx.shape is not None and len(idx.shape) < 1:
        ctx.fail("indices must have rank >= 1")
    if data.shape is not None and idx.shape is not None and isinstance(idx.shape[-1], int):
        m = idx.shape[-1]
        if m > len(data.shape):
            ctx.fail(f"the last dim of indices ({m}) exceeds the data rank {len(data.shape)}")
        want = tuple(idx.shape[:-1]) + tuple(data.shape[m:])
        if upd.shape is not None:
            if len(upd.shape) != len(want):
                ctx.fail(f"updates must have shape {list(want)}, got {list(upd.shape)}")
            for j, (a, b) in enumerate(zip(upd.shape, want)):
                equate_dims(ctx, a, b, f"dim {j} of updates")
    return [TensorDesc(data.dtype, data.shape, data.format)]


def _scatter_nd(ins: list, attrs: dict) -> list[np.ndarray]:
    data, indices, updates = np.asarray(ins[0]), np.asarray(ins[1]), np.asarray(ins[2])
    m = indices.shape[-1]
    flat = indices.reshape(-1, m)
    upd = updates.reshape((flat.shape[0],) + data.shape[m:])
    where = tuple(normalize_indices(flat[:, j], data.shape[j]) for j in range(m))
    out = data.copy()
    red = _reduction(attrs)
    if red == "none":
        out[where] = upd
    else:
        _SCATTER_UFUNC[red].at(out, where, upd)
    return [out]


register(
    OpDef(
        "ScatterND",
        OpKind.OPAQUE,
        inputs=[In("data", "T"), In("indices", "I"), In("updates", "T")],
        outputs=[Out("output", "T")],
        types={"T": _ALL, "I": _I64},
        attrs=[Attr("reduction", "string", "none")],
        verify=_verify_scatter,
        infer=_infer_scatter_nd,
        kernel=_scatter_nd,
        doc="copy of data with slices addressed by indices replaced (or reduced) by updates",
    )
)


# -- TensorScatter ------------------------------------------------------------------------------
def _tensor_scatter_verify(ctx: InferContext) -> None:
    """verify: a known mode; update matches the cache except along axis."""
    mode = ctx.attr("mode")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("linear", "circular"):
        ctx.fail(f"mode {mode!r} is not 'linear' or 'circular'", VerifyError)
    c, u = ctx.shape(0), ctx.shape(1)
    if c is None or u is None:
        return
    if len(c) != len(u):
        ctx.fail(f"update of shape {list(u)} must have the cache's rank {len(c)}")
    if len(c) < 2:
        ctx.fail(f"the cache must have rank >= 2 (batch, ..., sequence, ...), got {list(c)}")
    axis = ctx.axis(int(ctx.attr("axis")), len(c))
    if axis == 0:
        ctx.fail("axis may not be the batch axis 0")
    for i, (a, b) in enumerate(zip(c, u)):
        if i != axis and dims_equal(a, b) is False:
            ctx.fail(f"update dim {i} ({b}) differs from the cache's ({a})")


def _tensor_scatter(ins: list, attrs: dict) -> list[np.ndarray]:
    cache = np.asarray(ins[0])
    update = np.asarray(ins[1])
    axis = int(attrs["axis"]) % cache.ndim
    mode = attrs["mode"].decode() if isinstance(attrs["mode"], bytes) else attrs["mode"]
    batch = cache.shape[0]
    idx = opt(ins, 2)
    starts = (
        np.zeros(batch, np.int64) if idx is None else np.asarray(idx).reshape(-1).astype(np.int64)
    )
    if starts.size != batch:
        raise ShapeError(
            f"TensorScatter: write_indices has {starts.size} entries, batch is {batch}"
        )
    out = cache.copy()
    max_len, seq = cache.shape[axis], update.shape[axis]
    pos = starts[:, None] + np.arange(seq)[None, :]  # (batch, seq)
    if mode == "circular":
        pos = pos % max_len
    elif pos.size and (pos.min() < 0 or pos.max() >= max_len):
        raise ShapeError(
            f"TensorScatter: writes positions {pos.min()}..{pos.max()} past the cache length {max_len}"
        )
    moved_out = np.moveaxis(out, axis, 1)  # (batch, max_len, ...) view of out
    moved_up = np.moveaxis(update, axis, 1)
    moved_out[np.arange(batch)[:, None], pos] = moved_up
    return [out]


register(
    OpDef(
        "TensorScatter",
        OpKind.OPAQUE,
        inputs=[In("past_cache", "T"), In("update", "T"), In("write_indices", "I", optional=True)],
        outputs=[Out("present_cache", "T")],
        types={"T": _ALL, "I": _I64},
        attrs=[Attr("mode", "string", "linear"), Attr("axis", "int", -2)],
        verify=_tensor_scatter_verify,
        infer=same_as_input(0),
        kernel=_tensor_scatter,
        doc="write update into the cache along axis at each batch's write index (KV-cache update)",
    )
)
