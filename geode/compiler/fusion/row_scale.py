"""Legality of a row scale folded into the GEMMs that read it (an RMSNorm before a gated
MLP's gate and up products).

An RMSNorm writes ``h = x * c * w``: ``x`` the rows ``[..., K]``, ``c`` a value per row
(``1 / sqrt(mean(x^2) + eps)``: shape ``[..., 1]``) and ``w`` a constant per column
(``[K]``). A MatMul of ``h`` by a constant ``B [K, N]`` is, in exact arithmetic,

    (x * c * w) @ B  =  c * (x @ (diag(w) B))

so ``w`` can be folded into a constant ``B' = diag(w) B`` at compile time and ``c`` applied
to the product's rows, where the product's reader (the gate's SiLU, the up product's
multiply: a fused GEMM epilogue, ``compiler/fusion/epilogue.py``) takes it as a ``col``
input. ``h`` (``[..., K]``) is then never written: the norm's kernel computes only ``c``
(``[..., 1]``), and the GEMMs read ``x``.

The fold is legal when: ``h`` is a product (``Mul`` nodes, each intermediate read only by
the next) of exactly one value of ``h``'s shape (``x``), values per row (rank at most
``h``'s, last dim 1, every other dim 1 or ``h``'s) and constants per column (last dim
``K``, the others 1: folded into ``B``); ``h`` is not a graph output and every reader of
``h`` is a MatMul reading it as ``A`` only, by a constant float matrix ``B`` of ``h``'s
type with ``K > 0`` rows (an empty row has no scale to move: ``c`` of an empty mean is
NaN, where ``h @ B`` is 0). Rounding differs from the unfused order by a few ulps of
each product (``w`` multiplies ``B`` instead of ``x``; ``c`` multiplies the sums instead
of their terms). Whether it pays is the cost model's call
(:func:`geode.compiler.fusion.profit.row_scale_plan`); the rewrite is
``compiler/passes/row_scale.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from geode.compiler.ir import Graph, Node, Value
from geode.compiler.shapes import same_dim

__all__ = ["RowScale", "row_scale_candidate"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ONNX = ("", "ai.onnx")
#: at most this many Mul nodes make up ``h`` (an RMSNorm has two)
MAX_FACTORS = 6


@dataclass
class RowScale:
    """A legal fold: ``value`` (``h``) = ``x`` times ``cols`` (values per row) times
    ``consts`` (constants per column, folded into each GEMM's ``B``), computed by ``muls``
    and read by ``gemms``."""

    value: Value
    x: Value
    cols: list[Value] = field(default_factory=list)
    consts: list[Value] = field(default_factory=list)
    muls: list[Node] = field(default_factory=list)
    gemms: list[Node] = field(default_factory=list)

    def column_scale(self) -> np.ndarray:
        """The product of the constants per column as a float64 ``[K]`` vector."""
        k = int(self.gemms[0].inputs[1].shape[0])
        out = np.ones(k, dtype=np.float64)
        for v in self.consts:
            out = out * np.asarray(v.data, dtype=np.float64).reshape(-1)
        return out

    def describe(self) -> str:
        """One line: what is folded into which GEMMs."""
        cols = ", ".join(v.name for v in self.cols) or "none"
        consts = ", ".join(v.name for v in self.consts) or "none"
        gemms = ", ".join(n.name for n in self.gemms)
        return (
            f"row scale of {self.value.name} (rows {self.x.name}, per row {cols}, per "
            f"column {consts}) into {gemms}"
        )


def _is_mul(v: Value) -> bool:
    p = v.producer
    return p is not None and p.op_type == "Mul" and p.domain in _ONNX and len(p.inputs) == 2


def _factors(h: Value, graph: Graph) -> tuple[list[Value], list[Node]] | str:
    """The leaves of the ``Mul`` tree computing ``h`` (each intermediate of ``h``'s shape
    and read by its one parent only) and the Mul nodes."""
    leaves: list[Value] = []
    muls: list[Node] = []
    work = [h]
    while work:
        v = work.pop()
        inner = v is h or (
            _is_mul(v)
            and len(v.uses) == 1
            and not any(o is v for o in graph.outputs)
            and _full(v, h)
        )
        if inner and _is_mul(v):
            if len(muls) == MAX_FACTORS:
                return f"{h.name} is a product of more than {MAX_FACTORS} Mul nodes"
            muls.append(v.producer)
            work.extend(reversed(v.producer.inputs))
        else:
            leaves.append(v)
    return leaves, muls


def _full(v: Value, h: Value) -> bool:
    return (
        v.shape is not None
        and len(v.shape) == len(h.shape)
        and all(same_dim(a, b) for a, b in zip(v.shape, h.shape))
    )


def _per_column(v: Value, k: int) -> bool:
    """A float constant varying along the last axis only (``[K]``, ``[1, K]``, a scalar:
    every dim but the last 1, the last ``K`` or 1)."""
    if not v.is_constant or v.data is None:
        return False
    data = np.asarray(v.data)
    if data.dtype.kind != "f" or data.size not in (1, k):
        return False
    return data.ndim == 0 or (data.shape[-1] in (1, k) and all(d == 1 for d in data.shape[:-1]))


def _per_row(v: Value, h: Value) -> bool:
    """A value of at most ``h``'s rank, last dim 1, every other dim 1 or ``h``'s."""
    if v.shape is None or len(v.shape) > len(h.shape):
        return False
    if len(v.shape) == 0:
        return True
    tail = h.shape[len(h.shape) - len(v.shape) :]
    if not same_dim(v.shape[-1], 1):
        return False
    return all(same_dim(a, 1) or same_dim(a, b) for a, b in zip(v.shape[:-1], tail[:-1]))


def _gemms(h: Value, graph: Graph) -> list[Node] | str:
    """The MatMuls reading ``h`` as ``A`` by a constant ``B [K, N]``, or why not."""
    if not h.consumers:
        return f"{h.name} is not read"
    out = []
    for mm in h.consumers:
        if mm.op_type != "MatMul" or mm.inputs[0] is not h or mm.inputs[1] is h:
            return f"{h.name} is read by {mm.op_type} {mm.name}, not as a MatMul's A"
        b = mm.inputs[1]
        data = None if not b.is_constant else b.data
        if data is None or np.asarray(data).ndim != 2:
            return f"{mm.name}'s B is not a constant matrix"
        if b.dtype != h.dtype or mm.outputs[0].dtype != h.dtype:
            return f"{mm.name}'s B is not of {h.name}'s type"
        if np.asarray(data).shape[0] == 0:
            return f"{mm.name}'s depth K is 0 (an empty row has no scale to move)"
        if mm not in out:
            out.append(mm)
    return out


def row_scale_candidate(graph: Graph, node: Node) -> RowScale | str | None:
    """The fold of the row scale ``node`` (a ``Mul``) computes into the GEMMs reading it,
    or why it is illegal; None when ``node`` is no candidate (not a ``Mul`` whose result
    some MatMul reads as ``A``, or not the product of one value of its shape and
    others)."""
    if node.op_type != "Mul" or node.domain not in _ONNX or len(node.outputs) != 1:
        return None
    h = node.outputs[0]
    if not any(c.op_type == "MatMul" and c.inputs[0] is h for c in h.consumers):
        return None
    if h.shape is None or len(h.shape) < 2 or h.dtype not in _DTYPES:
        return None
    found = _factors(h, graph)
    if isinstance(found, str):
        return found
    leaves, muls = found
    full = [v for v in leaves if _full(v, h) and not (v.is_constant and v.data is not None)]
    if len(full) != 1 or len(leaves) == 1:
        return None  # a product of several whole tensors (a gated MLP's): no row scale
    if any(o is h for o in graph.outputs):
        return f"{h.name} is a graph output"
    gemms = _gemms(h, graph)
    if isinstance(gemms, str):
        return gemms
    k = int(np.asarray(gemms[0].inputs[1].data).shape[0])
    rs = RowScale(h, full[0], muls=muls, gemms=gemms)
    for v in leaves:
        if v is rs.x:
            continue
        if _per_column(v, k) and len(v.shape or ()) <= len(h.shape):
            rs.consts.append(v)
        elif _per_row(v, h) and v.dtype == h.dtype:
            rs.cols.append(v)
        else:
            return f"factor {v.name} of {h.name} is neither per row nor a constant per column"
    return rs
