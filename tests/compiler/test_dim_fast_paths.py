"""Dims decided without sympy arithmetic (``shapes.monomial`` and its users): equality,
exact division in Reshape's -1, the nonzero constraint's ``Min`` and the compiled shape
functions give what the sympy path gives, on random dims (products of symbols, and sums,
``Min``, broadcasts and rationals that the fast paths leave to sympy)."""

from __future__ import annotations

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

import geode.compiler.shapes as shapes
from geode.compiler.ops.layout import exact_quotient
from geode.compiler.shapes import (
    SymbolTable,
    as_dim,
    compile_shape_fn,
    dims_equal,
    evaluate_dim,
    monomial,
    sym,
)
from geode.errors import ShapeError

SYMS = [sym("N"), sym("M"), sym("seq"), sym("batch")]


def _sympy_dims_equal(a, b) -> bool | None:
    """The sympy path of ``dims_equal`` (its expanded, simplified difference)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    diff = sympy.expand(sympy.Integer(a) - b if isinstance(a, int) else a - b)
    if diff.has(sympy.floor, sympy.ceiling, sympy.Mod, sympy.Min, sympy.Max):
        diff = sympy.simplify(diff)
    if diff == 0:
        return True
    return False if diff.is_number else None


def _products() -> st.SearchStrategy:
    """``c * s1**k1 * ...`` with an int ``c`` (sometimes 0 or negative), or an int."""
    powers = st.dictionaries(st.sampled_from(SYMS), st.integers(1, 3), max_size=3)
    return st.tuples(st.integers(-3, 64), powers).map(
        lambda t: as_dim(sympy.Mul(t[0], *(b**k for b, k in t[1].items())))
    )


def _dims() -> st.SearchStrategy:
    """Products, and dims the fast paths must leave to sympy."""
    s = st.sampled_from(SYMS)
    other = st.one_of(
        st.tuples(_products(), _products()).map(lambda t: as_dim(t[0] + t[1])),
        st.tuples(s, st.integers(1, 9)).map(lambda t: as_dim(sympy.Min(t[0], t[1]))),
        st.tuples(s, st.integers(2, 9)).map(lambda t: as_dim(t[0] / t[1])),
        st.tuples(s, s).map(lambda t: shapes.BroadcastDim(*t)),
        st.tuples(s, st.integers(2, 9)).map(lambda t: as_dim(sympy.floor(t[0] / t[1]))),
    )
    return st.one_of(_products(), _products(), other)


@settings(max_examples=100, deadline=None)
@given(_dims(), _dims())
def test_dims_equal_is_the_sympy_verdict(a, b) -> None:
    shapes._dims_equal_symbolic.cache_clear()
    assert dims_equal(a, b) == _sympy_dims_equal(a, b), (a, b)


@settings(max_examples=150, deadline=None)
@given(_products(), _products())
def test_exact_quotient_is_sympys_division(total, known) -> None:
    q = exact_quotient(total, known)
    if q is None:
        return
    assert q == as_dim(sympy.Integer(1) * total / known)
    assert type(q) is type(as_dim(sympy.Integer(1) * total / known))
    assert sympy.Mod(total, known) == 0


def test_exact_quotient_cases() -> None:
    n, m = SYMS[:2]
    assert exact_quotient(16 * n * m, n * m) == 16
    assert exact_quotient(16 * n**2 * m, 4 * n) == 4 * n * m
    assert exact_quotient(n * m, 16) is None  # 16 does not divide the coefficient
    assert exact_quotient(n, n * m) is None
    assert exact_quotient(n + m, n) is None  # a sum: sympy's job


@settings(max_examples=100, deadline=None)
@given(_dims())
def test_nonzero_constraint_is_sympys_min(d) -> None:
    if isinstance(d, int):
        return
    table = SymbolTable()
    table.require_nonzero(d)
    ((low, one, _),) = table.constraints
    twins = {s: sympy.Symbol(s.name, integer=True, nonnegative=True) for s in d.free_symbols}
    want = sympy.Min(d.xreplace(twins), 1)
    assert one == 1 and low == want and sympy.srepr(low) == sympy.srepr(want)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(_dims(), st.integers(0, 9)), min_size=1, max_size=3),
    st.lists(st.integers(1, 40), min_size=4, max_size=4),
)
def test_compiled_shape_fn_evaluates_exactly(shape, values) -> None:
    shapes._compiled_shape_fn.cache_clear()
    env = {s.name: v for s, v in zip(SYMS, values)}
    try:
        want = tuple(evaluate_dim(d, {s: v for s, v in zip(SYMS, values)}) for d in shape)
    except ShapeError:  # a broadcast of unequal values: not a shape
        return
    assert compile_shape_fn(tuple(shape))(env) == want


def test_compiled_shape_fn_of_products_and_min_needs_no_printer() -> None:
    n, m = SYMS[:2]
    names = {n: "_s0", m: "_s1"}
    assert shapes._int_code(16 * n * m**2, names) == "(16)*_s0*_s1**2"
    assert shapes._int_code(sympy.Min(2, n * m), names) in (
        "min((2), _s0*_s1)",
        "min((2), _s1*_s0)",
    )
    assert shapes._int_code(n + m, names) is None
    fn = compile_shape_fn((n, 3 * n * m, sympy.Min(2, n * m)))
    assert fn({"N": 5, "M": 7}) == (5, 105, 2)


def test_monomial_forms() -> None:
    n, m = SYMS[:2]
    assert monomial(12) == (12, {})
    assert monomial(n) == (1, {n: 1})
    assert monomial(-2 * n**3 * m) == (-2, {n: 3, m: 1})
    assert monomial(n + 1) is None and monomial(n / 2) is None and monomial(True) is None
