"""Fold an inference BatchNormalization, or a per-channel constant Mul or Add, into
the Conv before it: the Conv's weights and bias absorb the affine map, and the
normalization disappears from the graph (one pass over the output fewer).

``BN(Conv(x, W, Bc))`` with constant scale ``s``, shift ``b``, mean ``m``, variance
``v`` and ``epsilon``: with ``a = s / sqrt(v + epsilon)`` per output channel it is
``Conv(x, W * a, a * (Bc - m) + b)`` (``Bc = 0`` without a bias). ``Conv(...) * c`` and
``Conv(...) + c`` with ``c`` a constant that only varies along the channel axis (shape
``[M, 1, 1]``, ``[1, M, 1, 1]``, a scalar ...) fold the same way: that is also the form
:mod:`~.decompose` leaves a constant-statistics BatchNormalization in, so a Conv whose
weights became constant only after that pass (const_fold of a DequantizeLinear, say) is
still folded in a later round.

Folded only when it is exact up to rounding and changes nothing else: the Conv's
weights (and bias) are constants (not variables), its output feeds nothing but the
normalization and is not a graph output, the dtype is float32 or float64 (the folded
weights are computed in float64 and rounded once), and the normalization is in
inference mode with a single output. epsilon is read at ONNX's float32 precision, as
the reference kernel reads it. The new Conv replaces the normalization's output (a
graph output keeps its name); the old Conv and unused constants go.
"""

from __future__ import annotations

import numpy as np

from geode.compiler.ir import Graph, Node, Value
from geode.compiler.passes.rewrite import (
    Rewriter,
    const_value,
    is_output,
    node_alive,
    try_rewrite,
)

__all__ = ["fold_batch_norm"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ONNX = ("", "ai.onnx")


def fold_batch_norm(graph: Graph) -> bool:
    """Fold every foldable normalization into its Conv (see the module docstring).
    Returns True when the graph changed."""
    changed = False
    for node in graph.toposort():
        if node.domain not in _ONNX or not node_alive(graph, node):
            continue
        found = _affine(graph, node)
        if found is None:
            continue
        conv, scale, shift = found
        if try_rewrite(graph, node, lambda rw, c=conv, a=scale, b=shift: _fold(rw, c, a, b)):
            changed = True
    return changed


def _conv_before(graph: Graph, v: Value | None) -> Node | None:
    """The Conv producing ``v`` when it may absorb what follows: constant weights (and
    bias), float32/float64, ``v`` read by one node only and not a graph output."""
    conv = None if v is None else v.producer
    if conv is None or conv.op_type != "Conv" or conv.domain not in _ONNX:
        return None
    if len(v.uses) != 1 or is_output(graph, v) or v.dtype not in _DTYPES:
        return None
    w = conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    wd = const_value(w)
    if wd is None or wd.ndim < 3 or wd.dtype != v.dtype:
        return None
    if bias is not None and (const_value(bias) is None or bias.dtype != v.dtype):
        return None
    return conv


def _channel_vector(data: np.ndarray | None, rank: int, m: int) -> np.ndarray | None:
    """A constant that varies along axis 1 only of a rank-``rank`` tensor with ``m``
    channels, as a float64 ``[m]`` vector (None for any other constant)."""
    if data is None or data.ndim > rank or data.dtype.kind != "f":
        return None
    full = data.reshape((1,) * (rank - data.ndim) + data.shape)
    if any(d != 1 for i, d in enumerate(full.shape) if i != 1) or full.shape[1] not in (1, m):
        return None
    return np.broadcast_to(full.reshape(-1).astype(np.float64), (m,))


def _affine(graph: Graph, node: Node) -> tuple[Node, np.ndarray | None, np.ndarray | None] | None:
    """``(conv, a, c)`` when ``node`` computes ``a * conv_out + c`` per channel (either
    may be None: 1 or 0) and may be folded into ``conv``; else None."""
    if node.op_type == "BatchNormalization":
        conv = _conv_before(graph, node.inputs[0])
        if conv is None or int(node.attr("training_mode", 0)) != 0 or len(node.outputs) != 1:
            return None
        m = int(const_value(conv.inputs[1]).shape[0])
        params = [const_value(p) for p in node.inputs[1:5]]
        if any(p is None or p.dtype.kind != "f" or p.shape != (m,) for p in params):
            return None
        s, b, mean, var = (p.astype(np.float64) for p in params)
        eps = float(np.float32(node.attr("epsilon", 1e-5)))
        a = s / np.sqrt(var + eps)
        return conv, a, b - mean * a
    if node.op_type not in ("Mul", "Add") or len(node.inputs) != 2:
        return None
    for i in (0, 1):
        conv = _conv_before(graph, node.inputs[i])
        if conv is None:
            continue
        out = conv.outputs[0]
        if out.shape is None or node.outputs[0].dtype != out.dtype:
            return None
        m = int(const_value(conv.inputs[1]).shape[0])
        vec = _channel_vector(const_value(node.inputs[1 - i]), len(out.shape), m)
        if vec is None:
            return None
        return (conv, vec, None) if node.op_type == "Mul" else (conv, None, vec)
    return None


def _fold(
    rw: Rewriter, conv: Node, a: np.ndarray | None, c: np.ndarray | None
) -> list[Value | None]:
    """A new Conv computing ``a * conv(x) + c`` (its weights and bias folded)."""
    x, w = conv.inputs[0], conv.inputs[1]
    dtype = w.dtype
    wd = const_value(w).astype(np.float64)
    m = wd.shape[0]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    bd = np.zeros(m) if bias is None else const_value(bias).astype(np.float64).reshape(m)
    if a is not None:
        wd = wd * a.reshape((m,) + (1,) * (wd.ndim - 1))
        bd = bd * a
    if c is not None:
        bd = bd + c
    w_new = rw.const(wd.astype(dtype), dtype)
    b_new = rw.const(bd.astype(dtype), dtype)
    node = rw.graph.add_node("Conv", [x, w_new, b_new], dict(conv.attrs), name=f"{conv.name}_bn")
    rw.nodes.append(node)  # rolled back with the rest if the rewrite is refused
    return [node.outputs[0]]
