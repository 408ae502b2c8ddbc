"""Winograd-transformed conv weights: the constant a Winograd conv multiplies by.

A conv that runs the Winograd kernel (``ConvSpec.method == "winograd"``,
``runtime/native/winograd.c``) takes, instead of its weight ``g`` (float32
``M x C x 3 x 3``), the weight's F(2x2, 3x3) transform ``U = G g G^T``: 16 matrices
``M x C`` (one per position of the 4x4 transformed tile), shape ``(16, M, C)``. It is
computed once, here, when the model is compiled or loaded (in float64, then rounded to
float32), and the step reads it as a constant of its own (:class:`WinogradWeight`, named
``<W>#winograd``) that the plan registers in the session's VarManager like any other
weight. A model file keeps the original weight and transforms it again when loaded (its
units name the input ``{"winograd": <W's name>}``).
"""

from __future__ import annotations

import numpy as np

from geode.compiler.ir import TensorDesc, Value, ValueKind
from geode.errors import CodegenError

__all__ = ["WINOGRAD_SUFFIX", "WinogradWeight", "transform_filters", "winograd_value"]

#: the transformed copy's name: its weight's name then this
WINOGRAD_SUFFIX = "#winograd"

#: F(2x2, 3x3)'s filter transform G (4 x 3)
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def transform_filters(w: np.ndarray) -> np.ndarray:
    """``U = G g G^T`` of every filter of ``w`` (``M x C x 3 x 3``), as float32 of shape
    ``(16, M, C)``: ``U[4 i + j, m, c] = (G w[m, c] G^T)[i, j]``."""
    m, c = w.shape[:2]
    u = np.einsum("ik,mckl,jl->ijmc", G, np.asarray(w, dtype=np.float64), G)
    return np.ascontiguousarray(u.reshape(16, m, c).astype(np.float32))


class WinogradWeight(Value):
    """A conv's constant weight ``source`` in its Winograd transform: a derived constant
    of shape ``(16, M, C)``, not a node's value in the graph (only a step reads it)."""

    def __init__(self, source: Value, data: np.ndarray):
        desc = TensorDesc(np.float32, tuple(int(d) for d in data.shape))
        super().__init__(source.graph, source.name + WINOGRAD_SUFFIX, desc, ValueKind.CONSTANT)
        self.data = data
        self.source = source


#: the attribute of a weight's Value holding its transform (one per weight)
_WINOGRAD_ATTR = "_geode_winograd_copy"


def winograd_value(w: Value) -> WinogradWeight:
    """``w`` (a float32 constant ``M x C x 3 x 3``, its data in the graph or in an
    external file) transformed: its :class:`WinogradWeight`, made on the first call and
    the same object on the next. Raises :class:`~geode.errors.CodegenError` when ``w``
    has no such data."""
    done = getattr(w, _WINOGRAD_ATTR, None)
    if done is not None:
        return done
    loader = getattr(w, "external_loader", None)
    data = w.data if w.data is not None or loader is None else loader()
    arr = None if data is None else np.asarray(data)
    if arr is None or arr.dtype != np.float32 or arr.ndim != 4 or arr.shape[2:] != (3, 3):
        raise CodegenError(
            f"weight {w.name!r} cannot take the Winograd transform: not a constant float32 "
            "M x C x 3 x 3 array"
        )
    out = WinogradWeight(w, transform_filters(arr))
    setattr(w, _WINOGRAD_ATTR, out)
    return out
