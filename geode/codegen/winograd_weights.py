"""Winograd-transformed conv weights: the constant a Winograd conv multiplies by.

A conv that runs the Winograd kernel (``ConvSpec.method == "winograd"``,
``runtime/native/winograd.c``) takes, instead of its weight ``g`` (float32
``M x C x 3 x 3``), the weight's F(t x t, 3x3) transform ``U = G g G^T`` (``t`` the
output tile's side, 2 or 4): ``(t + 2)^2`` matrices ``M x C``, one per position of the
transformed tile, shape ``((t + 2)^2, M, C)``. It is computed once, here, when the model
is compiled or loaded (in float64, then rounded to float32), and the step reads it as a
constant of its own (:class:`WinogradWeight`, named ``<W>#winograd<t>``) that the plan
registers in the session's VarManager like any other weight. A model file keeps the
original weight and transforms it again when loaded (its units name the input
``{"winograd": <W's name>, "tiles": "4"}``). A kernel that picks its tile at run time
takes both transforms, F(2x2)'s then F(4x4)'s, as one constant ``(52, M, C)``.
"""

from __future__ import annotations

import numpy as np

from geode.compiler.ir import TensorDesc, Value, ValueKind
from geode.errors import CodegenError

__all__ = ["WINOGRAD_SUFFIX", "WinogradWeight", "transform_filters", "winograd_value"]

#: the transformed copy's name: its weight's name then this and the tile side
WINOGRAD_SUFFIX = "#winograd"

#: the filter transforms G by tile side: F(2x2, 3x3) (4 x 3, points 0, 1, -1) and
#: F(4x4, 3x3) (6 x 3, points 0, 1, -1, 2, -2)
G = {
    2: np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]]),
    4: np.array(
        [
            [1 / 4, 0.0, 0.0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0.0, 0.0, 1.0],
        ]
    ),
}


def transform_filters(w: np.ndarray, tile: int = 2) -> np.ndarray:
    """``U = G g G^T`` of every filter of ``w`` (``M x C x 3 x 3``) for tile side
    ``tile`` (2 or 4), as float32 of shape ``(P, M, C)``, ``P = (tile + 2)^2``:
    ``U[(tile + 2) i + j, m, c] = (G w[m, c] G^T)[i, j]``."""
    g = G[tile]
    m, c = w.shape[:2]
    u = np.einsum("ik,mckl,jl->ijmc", g, np.asarray(w, dtype=np.float64), g)
    return np.ascontiguousarray(u.reshape(-1, m, c).astype(np.float32))


class WinogradWeight(Value):
    """A conv's constant weight ``source`` in its Winograd transforms for tile sides
    ``tiles``, one after the other: a derived constant of shape ``(P, M, C)`` (``P`` the
    sum of ``(tile + 2)^2``), not a node's value in the graph (only a step reads it)."""

    def __init__(self, source: Value, data: np.ndarray, tiles: tuple[int, ...]):
        desc = TensorDesc(np.float32, tuple(int(d) for d in data.shape))
        name = f"{source.name}{WINOGRAD_SUFFIX}{'+'.join(map(str, tiles))}"
        super().__init__(source.graph, name, desc, ValueKind.CONSTANT)
        self.data = data
        self.source = source
        self.tiles = tiles


#: the attribute of a weight's Value holding its transforms (one per weight and tile)
_WINOGRAD_ATTR = "_geode_winograd_copies"


def winograd_value(w: Value, tiles: tuple[int, ...]) -> WinogradWeight:
    """``w`` (a float32 constant ``M x C x 3 x 3``, its data in the graph or in an
    external file) transformed for the tile sides ``tiles`` (2 and/or 4, in order): its
    :class:`WinogradWeight`, made on the first call and the same object on the next.
    Raises :class:`~geode.errors.CodegenError` when ``w`` has no such data or a tile
    is not 2 or 4."""
    tiles = tuple(tiles)
    if not tiles or any(t not in G for t in tiles):
        raise CodegenError(f"weight {w.name!r}: no Winograd transform for tiles {tiles}")
    done = getattr(w, _WINOGRAD_ATTR, None)
    if done is None:
        done = {}
        setattr(w, _WINOGRAD_ATTR, done)
    if tiles in done:
        return done[tiles]
    loader = getattr(w, "external_loader", None)
    data = w.data if w.data is not None or loader is None else loader()
    arr = None if data is None else np.asarray(data)
    if arr is None or arr.dtype != np.float32 or arr.ndim != 4 or arr.shape[2:] != (3, 3):
        raise CodegenError(
            f"weight {w.name!r} cannot take the Winograd transform: not a constant float32 "
            "M x C x 3 x 3 array"
        )
    data = np.concatenate([transform_filters(arr, t) for t in tiles])
    out = done[tiles] = WinogradWeight(w, data, tiles)
    return out
