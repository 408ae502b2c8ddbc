"""Index arithmetic over loop-AST expressions: the public API every codegen module uses.

Index expressions are integer expressions of loop variables and the kernel's dims.
They are compared structurally first, then as polynomials and by evaluation
(:mod:`geode.codegen.index_algebra`, where sympy's verdict is certain without it), and
then with sympy (:func:`to_sympy`, :func:`exprs_equal`, :func:`provably_le`,
:func:`constant_difference`); row-major digits
are built and joined (:func:`flatten_index`, :func:`decompose_index`,
:func:`join_digits`); bool conditions are combined (:func:`and_expr`, :func:`and_flags`,
:func:`conjuncts`); :func:`line_aligned` decides when an offset starts a cache line;
:class:`IndexContext` simplifies indices knowing the loops' extents.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sympy

from geode.codegen.ast import (
    Bin,
    Const,
    Expr,
    Stmt,
    Var,
    add,
    floordiv,
    free_vars,
    mod,
    mul,
    sub,
    transform,
    uses_var,
)
from geode.codegen.ast import blocks as ast_blocks
from geode.codegen.index_algebra import NOT_CONSTANT, UNKNOWN, difference_verdict, polynomial


def flatten_index(vars_: Sequence[Expr], extents: Sequence[Expr]) -> Expr:
    """Row-major index of ``vars_`` in a box of ``extents`` (Horner form:
    ``(v0 * e1 + v1) * e2 + v2``)."""
    if not vars_:
        return Const(0)
    out = vars_[0]
    for v, e in zip(vars_[1:], extents[1:]):
        out = add(mul(out, e), v)
    return out


def decompose_index(e: Expr, extents: Sequence[Expr]) -> list[Expr]:
    """The row-major digits of ``e`` in a box of ``extents``, nested so that
    ``//``/``%`` pairs stay recognisable: ``[(e // e2) // e1, (e // e2) % e1, e % e2]``."""
    n = len(extents)
    out: list[Expr] = [Const(0)] * n
    q = e
    for k in range(n - 1, 0, -1):
        out[k] = mod(q, extents[k])
        q = floordiv(q, extents[k])
    if n:
        out[0] = q
    return out


def and_expr(a: Expr | None, b: Expr | None) -> Expr | None:
    if a is None:
        return b
    if b is None:
        return a
    return Bin("and", a, b)


def conjuncts(e: Expr | None) -> list[Expr]:
    """The terms of ``e`` as a conjunction (``x and y and z``); none for None."""
    if e is None:
        return []
    if isinstance(e, Bin) and e.op == "and":
        return conjuncts(e.a) + conjuncts(e.b)
    return [e]


def all_and(es: Sequence[Expr]) -> Expr | None:
    out: Expr | None = None
    for e in es:
        out = and_expr(out, e)
    return out


@functools.lru_cache(maxsize=4096)
def to_sympy(e: Expr) -> sympy.Expr:
    if isinstance(e, Var):
        # sympy interns symbols by name and assumptions (no table of ours grows per name)
        return sympy.Symbol(e.name, integer=True, nonnegative=True)
    if isinstance(e, Const):
        if e.dtype not in ("int64", "int32"):
            raise ValueError("not an index constant")
        return sympy.Integer(int(e.value))
    if isinstance(e, Bin):
        a, b = to_sympy(e.a), to_sympy(e.b)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.op in ("//", "%") and b == 0:
            # a static dim of 0: the loops over it never run, so no such index is ever
            # computed; any value stands in (sympy would raise ZeroDivisionError)
            return sympy.Integer(0) if e.op == "//" else a
        if e.op == "//":
            return sympy.floor(a / b)
        if e.op == "%":
            return sympy.Mod(a, b)
        if e.op == "min":
            return sympy.Min(a, b)
        if e.op == "max":
            return sympy.Max(a, b)
    raise ValueError("not an index expression")


#: cache line size (bytes) that non-temporal stores fill whole
LINE_BYTES = 64


def line_aligned(offset: Expr, itemsize: int, dims: set[str]) -> Expr:
    """A bool expression of the dims that holds only if element ``offset`` (an integer
    index expression of loop variables and dims) starts a cache line for every value of
    its loop variables: each term of ``offset`` expanded, times ``itemsize``, is a
    multiple of :data:`LINE_BYTES`. A term is its integer coefficient times dims times
    other integer factors (loop variables, ``//`` and ``%`` of them), which keep any
    multiple a multiple; so a term is decided here when its coefficient alone suffices
    or it has no dims (``False`` when one cannot be a multiple, or ``offset`` is not such
    a sum), and tested at run time otherwise."""
    quick = _line_aligned_polynomial(offset, itemsize, dims)
    if quick is not None:
        return quick
    try:
        terms = sympy.Add.make_args(sympy.expand(to_sympy(offset)))
    except (ValueError, TypeError):
        return Const(False, "bool")
    cond: Expr = Const(True, "bool")
    for term in terms:
        coef, rest = term.as_coeff_Mul()
        if not coef.is_Integer:
            return Const(False, "bool")
        if int(coef) * itemsize % LINE_BYTES == 0:
            continue
        factor: Expr = Const(int(coef) * itemsize)
        for base, exp in rest.as_powers_dict().items():
            if base == 1:
                continue
            # index expressions divide only inside floor: every factor is an integer
            if not (exp.is_Integer and exp > 0):
                return Const(False, "bool")
            if base.is_Symbol and base.name in dims:
                for _ in range(int(exp)):
                    factor = mul(factor, Var(base.name))
        if isinstance(factor, Const):
            return Const(False, "bool")
        cond = and_flags(cond, Bin("==", mod(factor, Const(LINE_BYTES)), Const(0)))
    return cond


def _line_aligned_polynomial(offset: Expr, itemsize: int, dims: set[str]) -> Expr | None:
    """:func:`line_aligned` without sympy when ``offset`` is a polynomial in variables
    alone (no ``//``, ``%``, min or max: sympy's expansion has exactly its terms, and a
    term's factors in sympy's order, :func:`_sympy_factor_order`) and its terms
    leave at most one distinct run-time test (the order of several is sympy's order of
    terms); else None. sympy's first sum in a process costs ~25 ms."""
    poly = polynomial(offset)
    if poly is None or any(not atom.startswith("v:") for m in poly for atom in m):
        return None
    tested: list[Expr] = []
    for m, coef in poly.items():
        if coef * itemsize % LINE_BYTES == 0:
            continue
        factor: Expr = Const(coef * itemsize)
        for name in _sympy_factor_order(m):
            if name in dims:
                factor = mul(factor, Var(name))
        if isinstance(factor, Const):
            return Const(False, "bool")
        test = Bin("==", mod(factor, Const(LINE_BYTES)), Const(0))
        if test not in tested:
            tested.append(test)
    if len(tested) > 1:
        return None
    return and_flags(Const(True, "bool"), tested[0]) if tested else Const(True, "bool")


def _sympy_factor_order(monomial: tuple[str, ...]) -> list[str]:
    """The variables of ``monomial`` (its atoms sorted by name, repeated for powers) in
    the order sympy's product of them lists its factors: the variables of power one by
    name, then the powers by base name (sympy sorts a symbol before a power), each power
    repeated as often as its exponent."""
    counts: dict[str, int] = {}
    for atom in monomial:
        counts[atom[2:]] = counts.get(atom[2:], 0) + 1
    ones = [name for name, c in counts.items() if c == 1]
    powers = [name for name, c in counts.items() if c > 1 for _ in range(c)]
    return sorted(ones) + sorted(powers)


def and_flags(a: Expr, b: Expr) -> Expr:
    """``a and b`` over bool expressions, folded where either is a constant; a term of
    ``b``'s conjunction that ``a``'s already holds is not repeated."""
    if Const(False, "bool") in (a, b):
        return Const(False, "bool")
    true = Const(True, "bool")
    have = [t for t in conjuncts(a) if t != true]
    for term in conjuncts(b):
        if term != true and term not in have:
            a = term if a == true else Bin("and", a, term)
            have.append(term)
    return a


def expr_difference(a: Expr, b: Expr) -> sympy.Expr | None:
    """``a - b`` expanded by sympy, or None when an expression has no sympy form.
    Remembered per pair (expressions are immutable): a BERT layer's schedule asks 91
    times about 28 pairs, each a sympy ``expand`` of 0.5 ms or more."""
    try:
        return _difference(a, b)
    except TypeError:  # an unhashable constant: not remembered
        return _expanded_difference(a, b)


@functools.lru_cache(maxsize=4096)
def _difference(a: Expr, b: Expr) -> sympy.Expr | None:
    return _expanded_difference(a, b)


def _expanded_difference(a: Expr, b: Expr) -> sympy.Expr | None:
    try:
        return sympy.expand(to_sympy(a) - to_sympy(b))
    except (ValueError, TypeError):
        return None


def steps_along(e: Expr, var: str) -> bool:
    """Whether ``e - var`` has a sympy form free of ``var`` (``e`` takes consecutive
    values in consecutive iterations of loop ``var``). Read off the expression, without
    sympy's expansion, when it is ``var``, ``x + var`` or ``var + x`` with ``x`` free
    of ``var`` (``e - var`` is then ``x``); sympy decides every other form."""
    rest = _offset_of(e, var)
    if rest is None:
        d = expr_difference(e, Var(var))
        return d is not None and to_sympy(Var(var)) not in d.free_symbols
    try:
        to_sympy(rest)  # the sympy form must exist, as for the expansion
    except (ValueError, TypeError):
        return False
    return True


def _offset_of(e: Expr, var: str) -> Expr | None:
    if e == Var(var):
        return Const(0)
    if isinstance(e, Bin) and e.op == "+":
        if e.b == Var(var) and not uses_var(e.a, var):
            return e.a
        if e.a == Var(var) and not uses_var(e.b, var):
            return e.b
    return None


def constant_difference(a: Expr, b: Expr) -> int | None:
    """``a - b`` when it is provably an integer constant (for all values of the dims and
    loop variables), else None: sympy's verdict on :func:`expr_difference`, found without
    sympy where that verdict is certain (:func:`~geode.codegen.index_algebra.
    difference_verdict`)."""
    verdict = difference_verdict(a, b)
    if verdict is NOT_CONSTANT:
        return None
    if verdict is not UNKNOWN:
        return int(verdict)
    d = expr_difference(a, b)
    return int(d) if d is not None and d.is_Integer else None


def exprs_equal(a: Expr, b: Expr) -> bool:
    """``a == b`` provably (for all values of the dims)."""
    if a == b:
        return True
    if isinstance(a, Const) and isinstance(b, Const):
        return a.value == b.value
    verdict = difference_verdict(a, b)
    if verdict is not UNKNOWN:
        return verdict == 0
    d = expr_difference(a, b)
    return d is not None and d == 0


def provably_le(a: Expr | None, b: Expr | None) -> bool:
    """``a <= b`` provably."""
    if a is None or b is None:
        return False
    if isinstance(a, Const) and isinstance(b, Const):
        return a.value <= b.value
    if a == b:
        return True
    verdict = difference_verdict(b, a)
    if verdict is NOT_CONSTANT:
        return False
    if verdict is not UNKNOWN:
        return int(verdict) >= 0
    d = expr_difference(b, a)
    return d is not None and bool(d.is_number) and bool(d >= 0)


def is_ceildiv_of(e: Expr, n: Expr, c: Expr) -> bool:
    """Whether ``e`` is ``ceil(n / c)`` as :meth:`Schedule.split` writes it."""
    if isinstance(n, Const) and isinstance(c, Const) and isinstance(e, Const):
        return e.value == -(-n.value // c.value)
    if isinstance(c, Const):
        return e == floordiv(add(n, Const(c.value - 1)), c)
    return False


class IndexContext:
    """Loop extents by loop variable plus the dims: what index reasoning needs."""

    def __init__(self, ext: dict[str, Expr], dims: Sequence[str]):
        self.ext = ext
        self.dims = set(dims)

    def loop_free(self, e: Expr) -> bool:
        return not (free_vars(e) & self.ext.keys())

    def nonneg(self, e: Expr) -> bool:
        """``e >= 0`` provably (loop variables and dims are non-negative)."""
        if isinstance(e, Var):
            return e.name in self.ext or e.name in self.dims
        if isinstance(e, Const):
            return e.dtype == "int64" and e.value >= 0
        if isinstance(e, Bin):
            if e.op in ("+", "*"):
                return self.nonneg(e.a) and self.nonneg(e.b)
            if e.op in ("//", "%"):
                return self.nonneg(e.a) and self.divisor(e.b)
        return False

    def divisor(self, e: Expr) -> bool:
        """``e`` is loop-free and positive whenever it is used as a divisor (a positive
        constant or a non-negative expression of dims: a zero dim empties the loops)."""
        if isinstance(e, Const):
            return e.dtype == "int64" and e.value > 0
        return self.loop_free(e) and self.nonneg(e)

    def ub(self, e: Expr) -> Expr | None:
        """An exclusive upper bound of a non-negative index expression."""
        if isinstance(e, Var):
            return self.ext.get(e.name)
        if isinstance(e, Const):
            return Const(int(e.value) + 1) if e.dtype == "int64" else None
        if not isinstance(e, Bin):
            return None
        if e.op == "+":
            a, b = self.ub(e.a), self.ub(e.b)
            return None if a is None or b is None else sub(add(a, b), Const(1))
        if e.op == "*":
            x, c = (e.a, e.b) if self.loop_free(e.b) else (e.b, e.a)
            if not self.divisor(c):
                return None
            a = self.ub(x)
            return None if a is None else add(mul(sub(a, Const(1)), c), Const(1))
        if e.op == "%" and self.divisor(e.b) and self.nonneg(e.a):
            return e.b
        if e.op == "//" and self.divisor(e.b):
            a = self.ub(e.a)
            return None if a is None else add(floordiv(sub(a, Const(1)), e.b), Const(1))
        return None

    def digit_split(self, e: Expr) -> tuple[Expr, Expr, Expr] | None:
        """``e`` as ``hi * c + lo`` with ``0 <= lo < c`` provably, or None."""
        if not (isinstance(e, Bin) and e.op == "+"):
            if isinstance(e, Bin) and e.op == "*":
                x, c = (e.a, e.b) if self.loop_free(e.b) else (e.b, e.a)
                if self.divisor(c):
                    return x, c, Const(0)
            return None
        for hi_part, lo in ((e.a, e.b), (e.b, e.a)):
            if isinstance(hi_part, Bin) and hi_part.op == "*":
                x, c = (
                    (hi_part.a, hi_part.b) if self.loop_free(hi_part.b) else (hi_part.b, hi_part.a)
                )
                if not self.divisor(c):
                    continue
            else:
                x, c = hi_part, Const(1)
            if self.nonneg(lo) and provably_le(self.ub(lo), c):
                return x, c, lo
        return None

    def simplify(self, e: Expr) -> Expr:
        """Fold digit arithmetic the loop ranges make trivial:
        ``(x * c + w) // c -> x`` and ``(x * c + w) % c -> w`` when ``0 <= w < c``,
        ``a // c -> 0`` and ``a % c -> a`` when ``a < c``, and
        ``(a // c) * c + a % c -> a``."""

        def rule(x: Expr) -> Expr | None:
            if not isinstance(x, Bin):
                return None
            if x.op in ("//", "%") and self.divisor(x.b):
                if self.nonneg(x.a) and provably_le(self.ub(x.a), x.b):
                    return Const(0) if x.op == "//" else x.a
                ds = self.digit_split(x.a)
                if ds is not None and exprs_equal(ds[1], x.b):
                    return ds[0] if x.op == "//" else ds[2]
            if x.op == "+":
                for hi, lo in ((x.a, x.b), (x.b, x.a)):
                    if (
                        isinstance(hi, Bin)
                        and hi.op == "*"
                        and isinstance(hi.a, Bin)
                        and hi.a.op == "//"
                        and isinstance(lo, Bin)
                        and lo.op == "%"
                        and hi.a.a == lo.a
                        and hi.a.b == hi.b == lo.b
                    ):
                        return lo.a
            return None

        return transform(e, rule)

    def simplify_bindings(self, stmts: list[Stmt]) -> None:
        """:meth:`simplify` every binding and predicate of the blocks in ``stmts``."""
        for b in ast_blocks(stmts):
            b.bindings = [self.simplify(x) for x in b.bindings]
            if b.predicate is not None:
                b.predicate = self.simplify(b.predicate)

    def recipe(self, indices: Sequence[Expr], v: str) -> tuple | None:
        """How to recover loop var ``v`` from the location ``indices`` (as a canonical,
        comparable description), or None if the location does not determine ``v``."""
        queue: list[tuple[Expr, tuple]] = [(e, ("dim", d)) for d, e in enumerate(indices)]
        seen: set[Expr] = set()
        divs: dict[tuple[Expr, Expr], tuple] = {}
        mods: dict[tuple[Expr, Expr], tuple] = {}
        target = Var(v)
        while queue:
            e, rc = queue.pop(0)
            if e == target:
                return rc
            if e in seen or v not in free_vars(e):
                continue
            seen.add(e)
            if isinstance(e, Bin) and e.op in ("//", "%") and self.divisor(e.b):
                a, n = e.a, e.b
                if e.op == "%" and self.nonneg(a) and provably_le(self.ub(a), n):
                    queue.append((a, rc))
                ds = self.digit_split(a)
                if ds is not None and exprs_equal(ds[1], n):
                    queue.append((ds[0] if e.op == "//" else ds[2], rc))
                key = (a, n)
                if e.op == "//":
                    divs[key] = rc
                    if key in mods:
                        queue.append((a, ("join", rc, mods[key], n)))
                else:
                    mods[key] = rc
                    if key in divs:
                        queue.append((a, ("join", divs[key], rc, n)))
                continue
            ds = self.digit_split(e)
            if ds is not None:
                hi, c, lo = ds
                queue.append((hi, ("div", rc, c)))
                queue.append((lo, ("mod", rc, c)))
        return None

    def covers(self, e: Expr, size: Expr, inner: set[str]) -> set[str] | None:
        """If index ``e`` (over the loops ``inner``) takes every value in ``[0, size)``,
        the set of loop vars it uses; else None."""
        if isinstance(e, Const) and exprs_equal(size, Const(1)) and e.value == 0:
            return set()
        used: list[str] = []
        stride: Expr = Const(1)
        cur = e
        while True:
            if isinstance(cur, Var):
                if cur.name not in inner:
                    return None
                used.append(cur.name)
                top = self.ext[cur.name]
                break
            ds = self.digit_split(cur)
            if ds is None:
                return None
            hi, c, lo = ds
            if not (isinstance(lo, Var) and lo.name in inner and exprs_equal(self.ext[lo.name], c)):
                return None
            used.append(lo.name)
            stride = mul(stride, c)
            cur = hi
        if len(set(used)) != len(used):
            return None
        total = mul(top, stride)
        if exprs_equal(total, size) or (provably_le(size, total) and isinstance(total, Const)):
            return set(used)
        if is_ceildiv_of(top, size, stride):
            return set(used)
        return None


def join_digits(hi: Expr, lo: Expr, d: Expr) -> Expr | None:
    """``hi * d + lo`` when the pair are digits of one index in base ``d``:
    ``(e // d, e % d)`` -> ``e``, ``(e // d % m, e % d)`` -> ``e % (m * d)`` (nested
    divisions ``e // a // b`` read as ``e // (a * b)``); else None."""
    if not (isinstance(lo, Bin) and lo.op == "%" and exprs_equal(lo.b, d)):
        return None
    e = lo.a
    if isinstance(hi, Bin) and hi.op == "%":
        for q in (hi.a, collapse_div(hi.a)):
            if isinstance(q, Bin) and q.op == "//" and q.a == e and exprs_equal(q.b, d):
                return mod(e, mul(hi.b, d))
        return None
    for q in (hi, collapse_div(hi)):
        if isinstance(q, Bin) and q.op == "//" and q.a == e and exprs_equal(q.b, d):
            return e
    return None


def collapse_div(e: Expr) -> Expr:
    """``e // a // b`` as ``e // (a * b)`` (equal for positive divisors)."""
    if isinstance(e, Bin) and e.op == "//":
        inner = collapse_div(e.a)
        if isinstance(inner, Bin) and inner.op == "//":
            return floordiv(inner.a, mul(inner.b, e.b))
    return e


def index_parity(e: Expr) -> Expr:
    """The parity of index ``e``."""
    return mod(e, Const(2))
