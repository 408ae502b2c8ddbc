"""Index differences decided without sympy (:mod:`geode.codegen.index_algebra`): every
verdict given is sympy's own (the generated code is the same), and the index API built
on it (:func:`exprs_equal`, :func:`provably_le`, :func:`constant_difference`) answers as
sympy alone did."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geode.codegen import ast as A
from geode.codegen.index_algebra import NOT_CONSTANT, UNKNOWN, difference_verdict, polynomial
from geode.codegen.indexing import (
    constant_difference,
    expr_difference,
    exprs_equal,
    provably_le,
    steps_along,
    to_sympy,
)

I, J, N, M = A.Var("i"), A.Var("j"), A.Var("n"), A.Var("m")


def _sympy_verdict(a: A.Expr, b: A.Expr) -> int | str | None:
    d = expr_difference(a, b)
    if d is None:
        return None
    return int(d) if d.is_Integer else NOT_CONSTANT


def _index_exprs() -> st.SearchStrategy[A.Expr]:
    leaves = st.one_of(st.sampled_from([I, J, N, M]), st.integers(-3, 40).map(lambda v: A.Const(v)))

    def grow(children: st.SearchStrategy[A.Expr]) -> st.SearchStrategy[A.Expr]:
        divisor = st.one_of(st.sampled_from([N, M]), st.integers(1, 9).map(A.Const))
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-", "*", "min", "max"]), children, children).map(
                lambda t: A.Bin(*t)
            ),
            st.tuples(st.sampled_from(["//", "%"]), children, divisor).map(lambda t: A.Bin(*t)),
        )

    return st.recursive(leaves, grow, max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(_index_exprs(), _index_exprs())
def test_every_verdict_is_sympys(a: A.Expr, b: A.Expr) -> None:
    verdict = difference_verdict(a, b)
    if verdict is not UNKNOWN:
        assert verdict == _sympy_verdict(a, b), (a, b)


@settings(max_examples=100, deadline=None)
@given(_index_exprs(), _index_exprs())
def test_a_shifted_expression_agrees_with_sympy(a: A.Expr, shift: A.Expr) -> None:
    """Pairs that differ by little (a stride, an offset) are the common case."""
    for b in (A.Bin("+", a, A.Const(1)), A.Bin("+", shift, a), A.Bin("*", a, A.Const(2))):
        verdict = difference_verdict(b, a)
        if verdict is not UNKNOWN:
            assert verdict == _sympy_verdict(b, a), (b, a)


def test_polynomial_form_cancels_what_sympy_cancels() -> None:
    eight = A.Const(8)
    shifted = A.Bin("+", A.Bin("*", A.Bin("+", I, A.Const(1)), eight), J)
    assert difference_verdict(shifted, A.Bin("+", J, A.Bin("*", I, eight))) == 8
    quotient = A.Bin("//", A.Bin("+", A.Bin("*", N, A.Const(2)), I), A.Const(4))
    same = A.Bin("//", A.Bin("+", I, A.Bin("*", A.Const(2), N)), A.Const(4))
    assert difference_verdict(A.Bin("+", quotient, A.Const(3)), same) == 3
    assert polynomial(A.Const(1.5, "float32")) is None


def test_a_varying_difference_is_not_constant_and_the_rest_left_to_sympy() -> None:
    eight = A.Const(8)
    # (i + 1) // 8 - i // 8 is 1 only where i % 8 == 7: found at i = 7
    step = A.Bin("//", A.Bin("+", I, A.Const(1)), eight)
    assert difference_verdict(step, A.Bin("//", I, eight)) is NOT_CONSTANT
    # (2i + 1) // 2 == i: constant, but not as polynomials: sympy decides (and says 0)
    half = A.Bin("//", A.Bin("+", A.Bin("*", A.Const(2), I), A.Const(1)), A.Const(2))
    assert difference_verdict(half, I) is UNKNOWN
    assert exprs_equal(half, I) and constant_difference(half, I) == 0
    # min and max are never cancelled here (sympy evaluates them as written)
    low = A.Bin("min", I, N)
    assert difference_verdict(low, A.Bin("min", N, I)) is UNKNOWN
    assert exprs_equal(low, A.Bin("min", N, I))
    # a divisor of several terms is not an atom here
    several = A.Bin("//", I, A.Bin("+", N, A.Const(1)))
    assert polynomial(several) is None


def test_the_index_api_answers_as_sympy_did() -> None:
    ceil = A.Bin("//", A.Bin("+", N, A.Const(31)), A.Const(32))
    assert provably_le(A.Bin("+", ceil, A.Const(0)), ceil)
    assert not provably_le(A.Bin("*", ceil, A.Const(2)), ceil)
    assert not provably_le(A.Bin("+", ceil, A.Const(1)), ceil)
    assert constant_difference(A.Bin("+", I, A.Const(5)), I) == 5
    assert constant_difference(A.Bin("*", I, A.Const(2)), I) is None
    assert not exprs_equal(N, A.Bin("*", N, M))
    assert constant_difference(A.Un("exp", I), I) is None  # not index arithmetic


def _sympy_steps(e: A.Expr, var: str) -> bool:
    d = expr_difference(e, A.Var(var))
    return d is not None and to_sympy(A.Var(var)) not in d.free_symbols


@settings(max_examples=150, deadline=None)
@given(_index_exprs(), _index_exprs())
def test_steps_along_is_sympys_verdict(x: A.Expr, y: A.Expr) -> None:
    """Read off the expression or left to sympy, the verdict is sympy's: for the forms
    read off (``i``, ``x + i``, ``i + x``) and for any other."""
    for e in (I, A.Bin("+", x, I), A.Bin("+", I, x), A.Bin("+", x, y), x):
        assert steps_along(e, "i") == _sympy_steps(e, "i"), e
    assert steps_along(A.Bin("+", N, I), "i") and not steps_along(A.Bin("*", I, A.Const(2)), "i")
    # no sympy form (a float constant): not stepping, either way
    f = A.Bin("+", A.Const(0.5, "float32"), I)
    assert not steps_along(f, "i") and not _sympy_steps(f, "i")


def _polynomial_offsets() -> st.SearchStrategy[A.Expr]:
    """Offsets of variables and dims with +, -, * (and some // and %, left to sympy)."""
    leaves = st.one_of(
        st.sampled_from([I, J, N, M, A.Var("S"), A.Var("T")]),
        st.integers(-3, 70).map(lambda v: A.Const(v)),
    )

    def grow(children: st.SearchStrategy[A.Expr]) -> st.SearchStrategy[A.Expr]:
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-", "*", "*"]), children, children).map(
                lambda t: A.Bin(*t)
            ),
            st.tuples(st.sampled_from(["//", "%"]), children, st.just(N)).map(lambda t: A.Bin(*t)),
        )

    return st.recursive(leaves, grow, max_leaves=7)


@settings(max_examples=200, deadline=None)
@given(_polynomial_offsets(), st.sampled_from([1, 2, 4, 8]), st.sets(st.sampled_from("nmST")))
def test_line_aligned_without_sympy_is_sympys(offset: A.Expr, itemsize: int, dims: set) -> None:
    """:func:`line_aligned`'s polynomial path gives the very expression the sympy path
    gives (the generated code is the same), where it answers."""
    from geode.codegen import indexing

    quick = indexing._line_aligned_polynomial(offset, itemsize, dims)
    if quick is None:
        return
    original = indexing._line_aligned_polynomial
    try:
        indexing._line_aligned_polynomial = lambda *_: None
        slow = indexing.line_aligned(offset, itemsize, dims)
    finally:
        indexing._line_aligned_polynomial = original
    assert quick == slow, (offset, itemsize, dims)


@pytest.mark.parametrize(
    "offset",
    [
        A.Bin("*", N, A.Bin("*", M, M)),  # n * m**2: sympy lists n before the power
        A.Bin("*", A.Bin("*", A.Var("S"), A.Var("S")), A.Bin("*", I, N)),
        A.Bin("*", A.Bin("*", M, M), A.Bin("*", N, N)),
    ],
)
def test_line_aligned_orders_powers_as_sympy(offset: A.Expr, monkeypatch) -> None:
    """A term with a power: its factors in sympy's order (a symbol before a power), so
    the polynomial path's test is the sympy path's expression (found by the property
    test above: ``n*(m*m)``)."""
    from geode.codegen import indexing

    dims = {"m", "n", "S"}
    quick = indexing._line_aligned_polynomial(offset, 1, dims)
    assert quick is not None and quick != A.Const(True, "bool")
    monkeypatch.setattr(indexing, "_line_aligned_polynomial", lambda *_: None)
    assert quick == indexing.line_aligned(offset, 1, dims)


def test_line_aligned_polynomial_path_answers_common_offsets() -> None:
    """A chunk's offset ``i * S * 16 + j`` over dims answers without sympy; one with two
    distinct run-time tests, or a floor division, is left to sympy."""
    from geode.codegen.ast import expr_str
    from geode.codegen.indexing import _line_aligned_polynomial

    s = A.Var("S")
    off = A.Bin("+", A.Bin("*", A.Bin("*", I, s), A.Const(16)), A.Bin("*", J, A.Const(16)))
    assert _line_aligned_polynomial(off, 4, {"S"}) == A.Const(True, "bool")
    off = A.Bin("+", A.Bin("*", I, s), J)
    assert _line_aligned_polynomial(off, 4, {"S"}) == A.Const(False, "bool")
    got = _line_aligned_polynomial(
        A.Bin("*", A.Bin("+", I, A.Const(1)), A.Bin("*", s, s)), 4, {"S"}
    )
    assert got is not None and expr_str(got) == "4 * S * S % 64 == 0"  # one test, two terms
    two = A.Bin("+", A.Bin("*", I, s), A.Bin("*", J, A.Var("T")))
    assert _line_aligned_polynomial(two, 4, {"S", "T"}) is None
    assert _line_aligned_polynomial(A.Bin("//", I, s), 4, {"S"}) is None
