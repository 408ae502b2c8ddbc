"""Dim expressions as JSON data, and back.

A model file keeps every symbolic dim (``N``, ``N*256``, ``Max(M, N)``,
``floor((H - 3)/2) + 1``, ``bcast(M, N)``) as nested JSON lists: an int is itself, a symbol is
``["s", name]``, a rational ``["q", p, q]`` and anything else ``[op, *args]`` with
``op`` one of :data:`OPS`. Decoding builds the expression with sympy's constructors
from that whitelist only: nothing in a file is parsed as code (``sympify`` would
``eval`` it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from geode.compiler.shapes import BroadcastDim
from geode.errors import ModelFileError

#: operator name -> sympy constructor (the only functions a file may name)
OPS: dict[str, Callable[..., Any]] = {
    "+": sympy.Add,
    "*": sympy.Mul,
    "^": sympy.Pow,
    "Max": sympy.Max,
    "Min": sympy.Min,
    "floor": sympy.floor,
    "ceiling": sympy.ceiling,
    "Mod": sympy.Mod,
    "Abs": sympy.Abs,
    "bcast": BroadcastDim,
}
_NAMES = {
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
#: deeper expressions than this are refused when read (a file cannot exhaust the stack)
MAX_DEPTH = 64


def encode(e: Any) -> Any:
    """The JSON form of a dim (an int or a sympy expression)."""
    if isinstance(e, bool):
        raise ModelFileError(f"a dim cannot be a bool ({e!r})")
    if isinstance(e, int):
        return e
    if isinstance(e, sympy.Integer):
        return int(e)
    if isinstance(e, sympy.Symbol):
        return ["s", e.name]
    if isinstance(e, sympy.Rational):
        return ["q", int(e.p), int(e.q)]
    op = _NAMES.get(e.func)
    if op is None:
        raise ModelFileError(
            f"the dim expression {e} uses {e.func}, which a model file cannot hold"
        )
    return [op, *(encode(a) for a in e.args)]


class Decoder:
    """Turns JSON dims back into expressions over ``symbol(name)``'s symbols; equal
    JSON decodes to the same expression once (a shape's dims repeat across values)."""

    def __init__(self, symbol: Callable[[str], sympy.Symbol]):
        self._symbol = symbol
        self._memo: dict[str, Any] = {}

    def __call__(self, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        key = repr(data)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._build(data, 0)
        return hit

    def _build(self, data: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ModelFileError("a dim expression nests too deeply")
        if isinstance(data, int) and not isinstance(data, bool):
            return sympy.Integer(data)
        if not isinstance(data, list) or not data or not isinstance(data[0], str):
            raise ModelFileError(f"not a dim expression: {data!r}"[:200])
        op, args = data[0], data[1:]
        if op == "s":
            if len(args) != 1 or not isinstance(args[0], str):
                raise ModelFileError(f"bad symbol in a dim expression: {data!r}"[:200])
            return self._symbol(args[0])
        if op == "q":
            if len(args) != 2 or not all(isinstance(a, int) for a in args) or args[1] == 0:
                raise ModelFileError(f"bad rational in a dim expression: {data!r}"[:200])
            return sympy.Rational(args[0], args[1])
        fn = OPS.get(op)
        if fn is None:
            raise ModelFileError(f"unknown operator {op!r} in a dim expression")
        built = [self._build(a, depth + 1) for a in args]
        try:
            out = fn(*built)
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            raise ModelFileError(f"bad dim expression {data!r}: {exc}"[:300]) from None
        return int(out) if isinstance(out, sympy.Integer) else out

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
