"""Symbolic dims read from a model file, kept as data: no sympy at load or run time.

A model file holds each symbolic dim as its printed text and a JSON tree (see
:mod:`geode.modelfile.exprs`): an int is itself, a symbol ``["s", name]``, a rational
``["q", p, q]``, anything else ``[op, *args]`` with ``op`` one of :data:`OPS`. Loading
a model must not import sympy (a third of a second), so the graph it rebuilds carries
these trees as :class:`StoredDim` values, which do what the runtime asks of a dim:

- evaluate with exact arithmetic once the symbols are bound (:meth:`StoredDim.evaluate`,
  :func:`compile_stored_shape`): the same ints the compiler's shape functions give
  (rationals as :class:`fractions.Fraction`, ``floor``/``ceiling`` exact, the final
  ``int()`` as theirs);
- name their symbols (``free_symbols``: the symbols as StoredDims; ``is_Symbol`` and
  ``name`` for a lone symbol), print as the compiler printed them (the recorded text),
  and compare and hash by their tree.

They support no arithmetic: symbolic work (inference, fusion, scheduling) runs on sympy
expressions in the compiler, never on a loaded graph. A tree is checked when it is made
(:func:`stored_dim`): only the operators of :data:`OPS`, bounded depth, well-formed
symbols and rationals; nothing is ever parsed or run as code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from geode.errors import ShapeError

__all__ = [
    "MAX_DEPTH",
    "OPS",
    "StoredDim",
    "broadcast_value",
    "compile_stored_shape",
    "stored_dim",
]

#: deeper trees than this are refused (a file cannot exhaust the stack)
MAX_DEPTH = 64

if TYPE_CHECKING:  # at run time fractions is imported where a rational is made (2 ms)
    from fractions import Fraction

    Value = int | Fraction
else:
    Value = Any  # an int or a fractions.Fraction
Env = Mapping[str, int]
Eval = Callable[[Env], Value]


def broadcast_value(*values: int) -> int:
    """The broadcast of concrete sizes (ONNX: those other than 1 must be equal; 0 with 1
    is 0); :class:`ShapeError` naming two that differ."""
    out = 1
    for v in values:
        if v != 1:
            if out not in (1, v):
                raise ShapeError(f"cannot broadcast dims {out} and {v}")
            out = v
    return out


def _bcast(*values: Value) -> Value:
    return broadcast_value(*(int(v) for v in values))


def _mod(a: Value, b: Value) -> Value:
    if b == 0:
        raise ShapeError(f"a dim computes {a} modulo 0")
    return a % b  # Python's floor modulo is sympy's Mod for rationals


def _product(*values: Value) -> Value:
    return math.prod(values)


def _power(a: Value, b: Value) -> Value:
    if a == 0 and b < 0:
        raise ShapeError("a dim divides by 0")
    from fractions import Fraction

    return Fraction(a) ** int(b)


#: operator -> (its exact evaluation over ints and Fractions, its arity: None for 1 or more)
OPS: dict[str, tuple[Callable[..., Value], int | None]] = {
    "+": (lambda *v: sum(v), None),
    "*": (_product, None),
    "^": (_power, 2),
    "Max": (lambda *v: max(v), None),
    "Min": (lambda *v: min(v), None),
    "floor": (math.floor, 1),
    "ceiling": (math.ceil, 1),
    "Mod": (_mod, 2),
    "Abs": (abs, 1),
    "bcast": (_bcast, None),
}


class StoredDim:
    """One symbolic dim of a loaded graph (see the module docstring): ``expr`` its checked
    JSON tree, ``text`` how the compiler printed it."""

    __slots__ = ("expr", "text", "_key", "_symbols", "_eval")

    is_Integer = False
    is_number = False

    def __init__(self, expr: list, text: str, symbols: frozenset[str], fn: Eval) -> None:
        self.expr, self.text = expr, text
        self._key = json.dumps(expr, separators=(",", ":"))
        self._symbols, self._eval = symbols, fn

    @classmethod
    def symbol(cls, name: str) -> StoredDim:
        """The dim that is just the symbol ``name``."""
        return cls(["s", name], name, frozenset((name,)), lambda env: env[name])

    @property
    def is_Symbol(self) -> bool:  # noqa: N802 - the name sympy's expressions answer to
        """Whether this dim is a lone symbol."""
        return self.expr[0] == "s"

    @property
    def name(self) -> str:
        """A lone symbol's name (AttributeError for an expression, as for sympy's)."""
        if self.expr[0] != "s":
            raise AttributeError(f"dim {self.text} is an expression, not a symbol")
        return self.expr[1]

    @property
    def free_symbols(self) -> set[StoredDim]:
        """The symbols this dim depends on."""
        return {StoredDim.symbol(n) for n in self._symbols}

    def evaluate(self, env: Env) -> int:
        """The dim's value once ``env`` (symbol name -> int) binds its symbols (KeyError
        for one it does not)."""
        return int(self._eval(env))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoredDim) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"StoredDim({self.text})"


def stored_dim(expr: Any, text: str) -> int | StoredDim:
    """The dim of a JSON tree read from a file, printed ``text``: an int when the tree
    is an int; ValueError saying what is wrong with a malformed tree."""
    if isinstance(expr, int) and not isinstance(expr, bool):
        return expr
    if not isinstance(text, str):
        raise ValueError(f"the text of a dim is not a string: {text!r}"[:200])
    symbols: set[str] = set()
    fn = _compile(expr, 0, symbols)
    return StoredDim(expr, text, frozenset(symbols), fn)


def _compile(expr: Any, depth: int, symbols: set[str]) -> Eval:
    """A checked tree as a closure over its children's closures."""
    if depth > MAX_DEPTH:
        raise ValueError("a dim expression nests too deeply")
    if isinstance(expr, int) and not isinstance(expr, bool):
        return lambda env: expr
    if not isinstance(expr, list) or not expr or not isinstance(expr[0], str):
        raise ValueError(f"not a dim expression: {expr!r}"[:200])
    op, args = expr[0], expr[1:]
    if op == "s":
        if len(args) != 1 or not isinstance(args[0], str):
            raise ValueError(f"bad symbol in a dim expression: {expr!r}"[:200])
        name = args[0]
        symbols.add(name)
        return lambda env: env[name]
    if op == "q":
        ok = len(args) == 2 and all(isinstance(a, int) and not isinstance(a, bool) for a in args)
        if not ok or args[1] == 0:
            raise ValueError(f"bad rational in a dim expression: {expr!r}"[:200])
        from fractions import Fraction

        q = Fraction(args[0], args[1])
        return lambda env: q
    entry = OPS.get(op)
    if entry is None:
        raise ValueError(f"unknown operator {op!r} in a dim expression")
    fn, arity = entry
    if (arity is None and not args) or (arity is not None and len(args) != arity):
        raise ValueError(f"operator {op!r} with {len(args)} operand(s) in a dim expression")
    if op == "^" and not (isinstance(args[1], int) and not isinstance(args[1], bool)):
        raise ValueError(f"a dim's power must have an integer exponent: {expr!r}"[:200])
    parts = [_compile(a, depth + 1, symbols) for a in args]
    if len(parts) == 1:
        (one,) = parts
        return lambda env: fn(one(env))
    if len(parts) == 2:
        a, b = parts
        return lambda env: fn(a(env), b(env))
    return lambda env: fn(*(p(env) for p in parts))


def compile_stored_shape(shape: Sequence[int | StoredDim]) -> Callable[[Env], tuple[int, ...]]:
    """``env -> tuple[int, ...]`` for a shape of ints and StoredDims (the loaded graph's
    counterpart of :func:`geode.compiler.shapes.compile_shape_fn`)."""
    parts: list[Callable[[Env], int]] = []
    for d in shape:
        if isinstance(d, StoredDim):
            parts.append(d.evaluate)
        elif isinstance(d, int):
            parts.append(lambda env, v=d: v)
        else:
            raise TypeError(f"a loaded graph's shape holds {d!r} ({type(d).__name__})")
    return lambda env: tuple(p(env) for p in parts)
