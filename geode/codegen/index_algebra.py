"""Index differences decided without sympy, where sympy's verdict is certain.

:func:`geode.codegen.indexing.expr_difference` asks sympy for ``a - b`` expanded, and
the schedule's questions about it are only ever "is it a number, and which": equal,
``<=``, a constant stride. sympy answers in 0.1-50 ms a pair (its ``floor`` and
``Mod`` consult its assumptions system), which made index arithmetic most of a cold
compile's default schedules. :func:`difference_verdict` answers first, on geode's own
expressions, in one of three ways:

- a **number** ``c``: both expressions written as polynomials with integer
  coefficients over atoms (variables, and ``//`` and ``%`` of such a polynomial by a
  one-term one, compared by their operands' polynomials) cancel to ``c``. sympy's
  expansion is at least this strong (it expands the atoms' arguments too, so equal
  atoms here are equal sympy terms), and both are exact, so sympy says ``c`` too;
- :data:`NOT_CONSTANT`: ``a - b`` takes two different values at two points (variables
  and dims as positive integers, every divisor positive), so it is no constant, and
  sympy, being sound under its assumptions (integer, non-negative), cannot say one;
- :data:`UNKNOWN`: neither, and sympy decides.

The verdict is sympy's own in the first two cases, so the generated code is the same
byte for byte (checked by ``tests/codegen/test_index_algebra.py`` against sympy).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Mapping

from geode.codegen.ast import Bin, Const, Expr, Var

__all__ = ["NOT_CONSTANT", "UNKNOWN", "difference_verdict", "polynomial"]

#: the verdict for a difference that is provably not a constant
NOT_CONSTANT = "not constant"
#: the verdict when only sympy can tell
UNKNOWN = "unknown"

#: a polynomial: monomial (sorted atom keys, repeated for powers) -> coefficient
Poly = dict[tuple[str, ...], int]

_EVALUATED = frozenset(["+", "-", "*", "//", "%", "min", "max"])
#: random points a difference is evaluated at (seeded: the same verdicts in every
#: process), after the 16 diagonal ones
_RANDOM_POINTS = 20


class _NotIndex(Exception):
    """The expression is not integer index arithmetic (sympy has no form for it)."""


def _accumulate(out: Poly, m: tuple[str, ...], c: int) -> None:
    """Add ``c`` to the coefficient of monomial ``m`` in ``out``, dropping it at zero."""
    v = out.get(m, 0) + c
    if v:
        out[m] = v
    else:
        out.pop(m, None)


def _add(p: Poly, q: Poly, sign: int = 1) -> Poly:
    out = dict(p)
    for m, c in q.items():
        _accumulate(out, m, sign * c)
    return out


def _mul(p: Poly, q: Poly) -> Poly:
    out: Poly = {}
    for m1, c1 in p.items():
        for m2, c2 in q.items():
            _accumulate(out, tuple(sorted(m1 + m2)), c1 * c2)
    return out


def _key(p: Poly) -> str:
    """A canonical text of a polynomial (atoms of equal polynomials get equal keys)."""
    return "+".join(f"{c}*{'*'.join(m)}" for m, c in sorted(p.items()))


@functools.lru_cache(maxsize=8192)
def _poly(e: Expr) -> Poly:
    if isinstance(e, Var):
        return {(f"v:{e.name}",): 1}
    if isinstance(e, Const):
        if e.dtype not in ("int64", "int32"):
            raise _NotIndex
        v = int(e.value)
        return {(): v} if v else {}
    if not isinstance(e, Bin):
        raise _NotIndex
    a, b = _poly(e.a), _poly(e.b)
    if e.op == "+":
        return _add(a, b)
    if e.op == "-":
        return _add(a, b, -1)
    if e.op == "*":
        return _mul(a, b)
    if e.op in ("//", "%"):
        if isinstance(e.b, Const) and not b:
            # a static divisor of 0 (as :func:`geode.codegen.indexing.to_sympy` reads it)
            return {} if e.op == "//" else a
        if len(b) != 1:
            # a divisor of several terms (or a zero one): sympy's expansion of its
            # reciprocal depends on how it is written, so equal polynomials need not
            # give equal sympy terms
            raise _NotIndex
        return {(f"({e.op}|{_key(a)}|{_key(b)})",): 1}
    raise _NotIndex  # min, max (sympy evaluates them as written), not index arithmetic


def polynomial(e: Expr) -> Poly | None:
    """``e`` as a polynomial over atoms (see the module docstring), or None when it is
    not integer index arithmetic. Remembered per expression (they are immutable)."""
    try:
        return dict(_poly(e))  # a copy: the remembered one is shared
    except (_NotIndex, TypeError, ValueError):
        return None


def _polynomial_or_none(e: Expr) -> Poly | None:
    """:func:`polynomial` without the copy (for reading only)."""
    try:
        return _poly(e)
    except (_NotIndex, TypeError, ValueError):
        return None


def _evaluate(e: Expr, env: Mapping[str, int]) -> int:
    """The value of index expression ``e`` at ``env`` (floor division and modulo as
    sympy's ``floor`` and ``Mod``); ZeroDivisionError on a zero divisor."""
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Const):
        return int(e.value)
    assert isinstance(e, Bin)  # (checked by _variables)
    a, b = _evaluate(e.a, env), _evaluate(e.b, env)
    op = e.op
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op in ("//", "%") and isinstance(e.b, Const) and b == 0:
        return 0 if op == "//" else a  # as to_sympy reads a static 0
    if op == "//":
        return a // b
    if op == "%":
        return a % b
    return min(a, b) if op == "min" else max(a, b)


def _variables(e: Expr, out: set[str]) -> set[str]:
    """The variables of ``e``; _NotIndex when it is not integer index arithmetic."""
    if isinstance(e, Var):
        out.add(e.name)
    elif isinstance(e, Const):
        if e.dtype not in ("int64", "int32"):
            raise _NotIndex
    elif isinstance(e, Bin) and e.op in _EVALUATED:
        _variables(e.a, out)
        _variables(e.b, out)
    else:
        raise _NotIndex
    return out


def _points(names: list[str]) -> Iterator[dict[str, int]]:
    """The seeded points a difference is evaluated at: every variable ``k`` for ``k`` in
    1..16 (digits of small bases roll over there), then random positive values of
    several magnitudes."""
    for k in range(1, 17):
        yield dict.fromkeys(names, k)
    rng = random.Random(0x6E0DE)
    for k in range(_RANDOM_POINTS):
        hi = (7, 16, 100, 1000, 12345)[k % 5]
        yield {n: rng.randint(1, hi) for n in names}


def _varies(a: Expr, b: Expr) -> bool:
    """Whether ``a - b`` takes two different values at the seeded points (variables
    positive integers; points with a zero divisor skipped)."""
    names = sorted(_variables(b, _variables(a, set())))
    if not names:
        return False
    seen: set[int] = set()
    for env in _points(names):
        try:
            seen.add(_evaluate(a, env) - _evaluate(b, env))
        except ZeroDivisionError:
            continue
        if len(seen) > 1:
            return True
    return False


@functools.lru_cache(maxsize=8192)
def _verdict(a: Expr, b: Expr) -> int | str:
    pa, pb = _polynomial_or_none(a), _polynomial_or_none(b)
    if pa is not None and pb is not None:
        d = _add(pa, pb, -1)
        if not d:
            return 0
        if len(d) == 1 and () in d:
            return d[()]
    try:
        return NOT_CONSTANT if _varies(a, b) else UNKNOWN
    except _NotIndex:
        return UNKNOWN


def difference_verdict(a: Expr, b: Expr) -> int | str:
    """What sympy would say of ``a - b`` expanded, where that is certain without it: the
    number (an int), :data:`NOT_CONSTANT`, or :data:`UNKNOWN` (ask sympy). Remembered
    per pair."""
    try:
        return _verdict(a, b)
    except TypeError:  # an unhashable constant: not remembered
        return _verdict.__wrapped__(a, b)
