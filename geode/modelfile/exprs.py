"""Dim expressions as JSON data, and back.

A model file keeps every symbolic dim (``N``, ``N*256``, ``Max(M, N)``,
``floor((H - 3)/2) + 1``, ``bcast(M, N)``) as ``{"t": text, "e": tree}``: the text the
compiler printed and a JSON tree (an int is itself, a symbol ``["s", name]``, a
rational ``["q", p, q]`` and anything else ``[op, *args]`` with ``op`` one of
:data:`~geode.compiler.stored_dims.OPS`). Reading gives
:class:`~geode.compiler.stored_dims.StoredDim` values: checked trees that the runtime
evaluates exactly, without sympy (loading a model file never imports it) and without
parsing anything as code.
"""

from __future__ import annotations

import functools
from typing import Any

from geode.compiler.stored_dims import StoredDim, stored_dim
from geode.errors import ModelFileError
from geode.lazy import sympy


@functools.cache
def _names() -> dict[Any, str]:
    """sympy function -> the operator name a file gives it."""
    from geode.compiler.shapes import BroadcastDim

    return {
        sympy.Add: "+",
        sympy.Mul: "*",
        sympy.Pow: "^",
        sympy.Max: "Max",
        sympy.Min: "Min",
        sympy.floor: "floor",
        sympy.ceiling: "ceiling",
        sympy.Mod: "Mod",
        sympy.Abs: "Abs",
        BroadcastDim: "bcast",
    }


def encode(e: Any) -> Any:
    """The JSON form of a dim: an int, or ``{"t": text, "e": tree}`` for a sympy
    expression or a dim read from a file."""
    if isinstance(e, bool):
        raise ModelFileError(f"a dim cannot be a bool ({e!r})")
    if isinstance(e, int):
        return e
    if isinstance(e, StoredDim):
        return {"t": e.text, "e": e.expr}
    if isinstance(e, sympy.Integer):
        return int(e)
    return {"t": str(e), "e": _tree(e)}


def _tree(e: Any) -> Any:
    if isinstance(e, int | sympy.Integer):
        return int(e)
    if isinstance(e, sympy.Symbol):
        return ["s", e.name]
    if isinstance(e, sympy.Rational):
        return ["q", int(e.p), int(e.q)]
    op = _names().get(e.func)
    if op is None:
        raise ModelFileError(
            f"the dim expression {e} uses {e.func}, which a model file cannot hold"
        )
    if op == "^" and not isinstance(e.args[1], sympy.Integer):
        raise ModelFileError(f"the dim expression {e} has a power a model file cannot hold")
    return [op, *(_tree(a) for a in e.args)]


class Decoder:
    """Turns JSON dims back into ints and :class:`StoredDim` values; equal JSON decodes
    to one value once (a shape's dims repeat across values). Symbols are the loaded
    graph's (``symbols``: name -> StoredDim), so equal names are equal dims."""

    def __init__(self, symbols: dict[str, StoredDim]):
        self._symbols = symbols
        self._memo: dict[str, Any] = {}

    def __call__(self, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        key = repr(data)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._build(data)
        return hit

    def _build(self, data: Any) -> Any:
        if not isinstance(data, dict) or set(data) != {"t", "e"}:
            raise ModelFileError(f"not a dim: {data!r}"[:200])
        try:
            d = stored_dim(data["e"], data["t"])
        except ValueError as exc:
            raise ModelFileError(f"bad dim ({exc}): {data!r}"[:300]) from None
        if isinstance(d, StoredDim) and d.is_Symbol:
            return self._symbols.setdefault(d.name, d)
        return d

    def shape(self, data: Any) -> tuple | None:
        """A shape: None, or a list of dims."""
        if data is None:
            return None
        if not isinstance(data, list):
            raise ModelFileError(f"not a shape: {data!r}"[:200])
        return tuple(self(d) for d in data)


def encode_shape(shape: Any) -> Any:
    """The JSON form of a shape (None stays None)."""
    return None if shape is None else [encode(d) for d in shape]
