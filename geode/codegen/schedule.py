"""Schedule primitives over the loop AST, each recorded in a replayable trace.

A :class:`Schedule` owns a copy of a lowered :class:`~geode.codegen.ast.Kernel` and
rewrites it in place, one primitive at a time, in the style of CINN's IRSchedule:

* queries: :meth:`~Schedule.get_block`, :meth:`~Schedule.blocks`,
  :meth:`~Schedule.get_loops`, :meth:`~Schedule.producers`,
  :meth:`~Schedule.consumers`, :meth:`~Schedule.writers`, :meth:`~Schedule.readers`,
  :meth:`~Schedule.load_strides`;
* loop transformations: :meth:`~Schedule.split`, :meth:`~Schedule.fuse`,
  :meth:`~Schedule.reorder`, :meth:`~Schedule.align` / :meth:`~Schedule.align_all`
  (CINN's iteration-space alignment);
* block transformations: :meth:`~Schedule.compute_inline`,
  :meth:`~Schedule.reverse_compute_inline`, :meth:`~Schedule.rfactor` (two-step
  reduce), :meth:`~Schedule.compute_at`, :meth:`~Schedule.reuse_output` (a row buffer
  kept in the output it becomes);
* loop annotations: :meth:`~Schedule.parallel`, :meth:`~Schedule.vectorize`,
  :meth:`~Schedule.interleave`, :meth:`~Schedule.unroll`; cache hints:
  :meth:`~Schedule.prefetch_next`, :meth:`~Schedule.stream_output` (non-temporal
  stores through a staging buffer), :meth:`~Schedule.stream_row` (an output's row
  staged for the later passes that read it, then streamed),
  :meth:`~Schedule.store_nontemporal` (streaming stores straight from the registers);
* software pipelining of row passes: :meth:`~Schedule.software_pipeline`.

Loops are named by their loop variable, blocks by their name. Every primitive checks
its requirements first and raises :class:`~geode.errors.ScheduleError` naming the
primitive and the block concerned; a primitive that fails leaves the kernel exactly as
it was. Primitives that create loops return the new loop variables' names, which are
derived deterministically from the kernel's current names, so
:meth:`Trace.replay` on a fresh copy of the same kernel rebuilds the same AST.

Invariants the primitives rely on and preserve (the lowering establishes them):

* loop variables are unique in the kernel; block bodies use only their iteration
  variables and the kernel's dims; bindings and predicates use loop variables;
* for every block the map from its loops to its iteration variables is injective on
  the points where its predicate holds, and every predicate is a guard against the
  overrun of a non-dividing split (so dropping it for points inside the buffer's
  bounds never changes a value);
* a reduction block stores ``C[idx] = combine(C[idx], value)`` and is preceded by its
  init block (``reduce_of`` names it).

One documented exception to injectivity: the first-pass blocks that
:meth:`~Schedule.software_pipeline` moves into a later pass revisit a chunk's last row
(the "next" row is clamped to it); they only update registers that their row
re-initialises first, and the values of that extra visit are never read.

Index expressions are compared structurally first and then, when symbolic dims are
involved, with sympy.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import sympy

from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Const,
    Expr,
    For,
    ForKind,
    If,
    IterVar,
    Kernel,
    Load,
    Prefetch,
    Stmt,
    Store,
    StreamStore,
    Var,
    add,
    expr_str,
    floordiv,
    format_kernel,
    free_vars,
    loads,
    mod,
    mul,
    prod,
    sub,
    substitute,
    transform,
    walk_stmts,
)
from geode.codegen.ast import blocks as ast_blocks
from geode.errors import ScheduleError

__all__ = ["Schedule", "Trace", "TraceStep", "alloc_loop", "and_flags", "conjuncts", "line_aligned"]

#: combine operators a reduction may use
COMBINE_OPS = ("+", "*", "max", "min")

# ---------------------------------------------------------------------------------
# trace
# ---------------------------------------------------------------------------------


@dataclass
class TraceStep:
    """One applied primitive: its name, its arguments by keyword, and what it returned."""

    primitive: str
    args: dict[str, Any]
    result: Any = None

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        out = f"{self.primitive}({args})"
        return out if self.result is None else f"{out} -> {self.result!r}"


@dataclass
class Trace:
    """The primitives applied by a :class:`Schedule`, in order."""

    steps: list[TraceStep] = field(default_factory=list)

    def append(self, step: TraceStep) -> None:
        """Record one more step."""
        self.steps.append(step)

    def __iter__(self) -> Iterator[TraceStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i: int) -> TraceStep:
        return self.steps[i]

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self.steps)

    def replay(self, kernel: Kernel) -> Schedule:
        """Apply the steps again to a fresh copy of ``kernel`` (the kernel the trace was
        recorded on, as lowered) and return the resulting schedule."""
        sch = Schedule(kernel)
        for step in self.steps:
            getattr(sch, step.primitive)(**copy.deepcopy(step.args))
        return sch


F = TypeVar("F", bound=Callable[..., Any])


def _primitive(fn: F) -> F:
    """Make a method a schedule primitive: atomic (the kernel is restored when it
    raises) and recorded in the trace (only when called by the user, not by another
    primitive)."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(self: Schedule, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        record = {k: _plain(v) for k, v in list(bound.arguments.items())[1:]}
        top = self._depth == 0
        backup = copy.deepcopy(self.kernel) if top else None
        self._depth += 1
        try:
            result = fn(self, *args, **kwargs)
        except BaseException:
            if top:
                self.kernel = backup  # type: ignore[assignment]
            raise
        finally:
            self._depth -= 1
        if top:
            self.trace.append(TraceStep(fn.__name__, record, copy.deepcopy(result)))
        return result

    return wrapper  # type: ignore[return-value]


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    return copy.deepcopy(v)


# ---------------------------------------------------------------------------------
# expression helpers
# ---------------------------------------------------------------------------------


def _flatten(vars_: Sequence[Expr], extents: Sequence[Expr]) -> Expr:
    """Row-major index of ``vars_`` in a box of ``extents`` (Horner form:
    ``(v0 * e1 + v1) * e2 + v2``)."""
    if not vars_:
        return Const(0)
    out = vars_[0]
    for v, e in zip(vars_[1:], extents[1:]):
        out = add(mul(out, e), v)
    return out


def _decompose(e: Expr, extents: Sequence[Expr]) -> list[Expr]:
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


def _and(a: Expr | None, b: Expr | None) -> Expr | None:
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


def _all_and(es: Sequence[Expr]) -> Expr | None:
    out: Expr | None = None
    for e in es:
        out = _and(out, e)
    return out


_SYMS: dict[str, sympy.Symbol] = {}


@functools.lru_cache(maxsize=4096)
def _to_sympy(e: Expr) -> sympy.Expr:
    if isinstance(e, Var):
        if e.name not in _SYMS:
            _SYMS[e.name] = sympy.Symbol(e.name, integer=True, nonnegative=True)
        return _SYMS[e.name]
    if isinstance(e, Const):
        if e.dtype not in ("int64", "int32"):
            raise ValueError("not an index constant")
        return sympy.Integer(int(e.value))
    if isinstance(e, Bin):
        a, b = _to_sympy(e.a), _to_sympy(e.b)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
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
    try:
        terms = sympy.Add.make_args(sympy.expand(_to_sympy(offset)))
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


def _diff(a: Expr, b: Expr) -> sympy.Expr | None:
    try:
        return sympy.expand(_to_sympy(a) - _to_sympy(b))
    except (ValueError, TypeError):
        return None


def _eq(a: Expr, b: Expr) -> bool:
    """``a == b`` provably (for all values of the dims)."""
    if a == b:
        return True
    if isinstance(a, Const) and isinstance(b, Const):
        return a.value == b.value
    d = _diff(a, b)
    return d is not None and d == 0


def _le(a: Expr | None, b: Expr | None) -> bool:
    """``a <= b`` provably."""
    if a is None or b is None:
        return False
    if isinstance(a, Const) and isinstance(b, Const):
        return a.value <= b.value
    if a == b:
        return True
    d = _diff(b, a)
    return d is not None and bool(d.is_number) and bool(d >= 0)


def _ceildiv_of(e: Expr, n: Expr, c: Expr) -> bool:
    """Whether ``e`` is ``ceil(n / c)`` as :meth:`Schedule.split` writes it."""
    if isinstance(n, Const) and isinstance(c, Const) and isinstance(e, Const):
        return e.value == -(-n.value // c.value)
    if isinstance(c, Const):
        return e == floordiv(add(n, Const(c.value - 1)), c)
    return False


class _Ctx:
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
            if self.nonneg(lo) and _le(self.ub(lo), c):
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
                if self.nonneg(x.a) and _le(self.ub(x.a), x.b):
                    return Const(0) if x.op == "//" else x.a
                ds = self.digit_split(x.a)
                if ds is not None and _eq(ds[1], x.b):
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
                if e.op == "%" and self.nonneg(a) and _le(self.ub(a), n):
                    queue.append((a, rc))
                ds = self.digit_split(a)
                if ds is not None and _eq(ds[1], n):
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
        if isinstance(e, Const) and _eq(size, Const(1)) and e.value == 0:
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
            if not (isinstance(lo, Var) and lo.name in inner and _eq(self.ext[lo.name], c)):
                return None
            used.append(lo.name)
            stride = mul(stride, c)
            cur = hi
        if len(set(used)) != len(used):
            return None
        total = mul(top, stride)
        if _eq(total, size) or (_le(size, total) and isinstance(total, Const)):
            return set(used)
        if _ceildiv_of(top, size, stride):
            return set(used)
        return None


# ---------------------------------------------------------------------------------
# statement helpers
# ---------------------------------------------------------------------------------


def _walk(
    stmts: list[Stmt], loops: tuple[For, ...] = ()
) -> Iterator[tuple[Stmt, list[Stmt], tuple[For, ...]]]:
    """(statement, the list holding it, enclosing loops) for every statement outside
    block bodies, pre-order."""
    for s in list(stmts):
        yield s, stmts, loops
        if isinstance(s, For):
            yield from _walk(s.body, loops + (s,))
        elif isinstance(s, If):
            yield from _walk(s.body, loops)


def _stores(b: Block) -> list[Store]:
    return [s for s in walk_stmts(b.body) if isinstance(s, Store)]


def _loads(b: Block) -> list[Load]:
    out: list[Load] = []
    for s in walk_stmts(b.body):
        if isinstance(s, Store):
            for i in s.indices:
                out += loads(i)
            out += loads(s.value)
        elif isinstance(s, If):
            out += loads(s.cond)
    return out


def _writes(b: Block) -> set[str]:
    return {s.buffer for s in _stores(b)}


def _reads(b: Block) -> set[str]:
    return {ld.buffer for ld in _loads(b)}


def _is_reduce(b: Block) -> bool:
    return any(iv.kind == "reduce" for iv in b.iter_vars)


def _loop_terms(b: Block, e: Expr) -> Expr:
    """``e`` (in ``b``'s iteration variables) in terms of loop variables."""
    return substitute(e, {iv.name: x for iv, x in zip(b.iter_vars, b.bindings)})


def _reduce_binding_vars(b: Block) -> set[str]:
    out: set[str] = set()
    for iv, x in zip(b.iter_vars, b.bindings):
        if iv.kind == "reduce":
            out |= free_vars(x)
    return out


def _spatial_binding_vars(b: Block) -> set[str]:
    out: set[str] = set()
    for iv, x in zip(b.iter_vars, b.bindings):
        if iv.kind != "reduce":
            out |= free_vars(x)
    return out


def _accesses(
    loop: For, var: str, rename: dict[str, Expr] | None = None
) -> tuple[dict[str, list[tuple[Expr, ...]]], dict[str, list[tuple[Expr, ...]]]]:
    """Stores and loads inside ``loop`` by buffer, with indices rewritten from block
    iteration variables to loop variables (``rename`` renames loop variables first)."""
    writes: dict[str, list[tuple[Expr, ...]]] = {}
    reads: dict[str, list[tuple[Expr, ...]]] = {}
    for b in ast_blocks(loop.body):
        bind = {iv.name: substitute(x, rename or {}) for iv, x in zip(b.iter_vars, b.bindings)}
        exprs: list[Expr] = [substitute(x, rename or {}) for x in b.bindings]
        if b.predicate is not None:
            exprs.append(b.predicate)
        for st in walk_stmts(b.body):
            if isinstance(st, Store):
                writes.setdefault(st.buffer, []).append(
                    tuple(substitute(i, bind) for i in st.indices)
                )
                exprs += list(st.indices) + [st.value]
            elif isinstance(st, If):
                exprs.append(st.cond)
        for e in exprs:
            for ld in loads(e):
                reads.setdefault(ld.buffer, []).append(
                    tuple(substitute(i, bind) for i in ld.indices)
                )
    return writes, reads


def _block_exprs(b: Block) -> list[Expr]:
    """Every expression of a block: bindings, predicate, store indices and values, conditions."""
    out: list[Expr] = list(b.bindings) + ([b.predicate] if b.predicate is not None else [])
    for st in walk_stmts(b.body):
        if isinstance(st, Store):
            out += list(st.indices) + [st.value]
        elif isinstance(st, If):
            out.append(st.cond)
    return out


def _join_digits(hi: Expr, lo: Expr, d: Expr) -> Expr | None:
    """``hi * d + lo`` when the pair are digits of one index in base ``d``:
    ``(e // d, e % d)`` -> ``e``, ``(e // d % m, e % d)`` -> ``e % (m * d)`` (nested
    divisions ``e // a // b`` read as ``e // (a * b)``); else None."""
    if not (isinstance(lo, Bin) and lo.op == "%" and _eq(lo.b, d)):
        return None
    e = lo.a
    if isinstance(hi, Bin) and hi.op == "%":
        for q in (hi.a, _collapse_div(hi.a)):
            if isinstance(q, Bin) and q.op == "//" and q.a == e and _eq(q.b, d):
                return mod(e, mul(hi.b, d))
        return None
    for q in (hi, _collapse_div(hi)):
        if isinstance(q, Bin) and q.op == "//" and q.a == e and _eq(q.b, d):
            return e
    return None


def _collapse_div(e: Expr) -> Expr:
    """``e // a // b`` as ``e // (a * b)`` (equal for positive divisors)."""
    if isinstance(e, Bin) and e.op == "//":
        inner = _collapse_div(e.a)
        if isinstance(inner, Bin) and inner.op == "//":
            return floordiv(inner.a, mul(inner.b, e.b))
    return e


def _subst_loop_vars(stmts: list[Stmt], mapping: dict[str, Expr]) -> None:
    """Replace loop variables in loop extents, conditions, bindings, predicates and
    prefetch offsets."""
    for s in stmts:
        if isinstance(s, For):
            s.extent = substitute(s.extent, mapping)
            _subst_loop_vars(s.body, mapping)
        elif isinstance(s, If):
            s.cond = substitute(s.cond, mapping)
            _subst_loop_vars(s.body, mapping)
        elif isinstance(s, Block):
            s.bindings = [substitute(x, mapping) for x in s.bindings]
            if s.predicate is not None:
                s.predicate = substitute(s.predicate, mapping)
        elif isinstance(s, Prefetch):
            s.offset = substitute(s.offset, mapping)
        elif isinstance(s, StreamStore):
            s.offset = substitute(s.offset, mapping)
            s.src_offset = substitute(s.src_offset, mapping)
            s.length = substitute(s.length, mapping)


def _flat_block(x: Stmt) -> bool:
    """A block holding no loop and no nested block."""
    return isinstance(x, Block) and not any(isinstance(y, (For, Block)) for y in walk_stmts(x.body))


def _rename_loads(e: Expr, names: dict[str, str]) -> Expr:
    """``e`` with loads of the buffers in ``names`` reading the renamed buffers instead."""

    def repl(x: Expr) -> Expr | None:
        if isinstance(x, Load) and x.buffer in names:
            return Load(names[x.buffer], x.indices)
        return None

    return transform(e, repl)


@dataclass
class _RowChunks:
    """A row loop of ``n`` rows cut into chunks of ``c`` rows: chunk loop ``vo`` over
    ``count`` chunks, row loop ``vi`` over the ``ext`` rows of chunk ``vo`` (the last
    chunk may be short), which starts at row ``start``; ``row`` is row ``vi``'s index."""

    c: Expr
    vo: str
    vi: str
    count: Expr
    start: Expr
    ext: Expr
    row: Expr


def _par(e: Expr) -> Expr:
    """The parity of index ``e``."""
    return mod(e, Const(2))


def _accessed(s: Stmt) -> set[str]:
    """The buffers statement ``s`` reads or writes itself (a block: anywhere in it)."""
    if isinstance(s, Block):
        return _reads(s) | _writes(s)
    if isinstance(s, StreamStore):
        return {s.buffer, s.src}
    if isinstance(s, Prefetch):
        return {s.buffer}
    return set()


def _map_block_exprs(b: Block, fn: Callable[[Expr], Expr]) -> None:
    """Rewrite every expression in a block's body (store indices, values, conditions)."""
    for s in walk_stmts(b.body):
        if isinstance(s, (Store, If)):
            _map_stmt_exprs(s, fn)


def _map_stmt_exprs(s: Stmt, fn: Callable[[Expr], Expr]) -> None:
    """Rewrite every expression ``s`` holds directly (not those of nested statements)."""
    if isinstance(s, Store):
        s.indices = tuple(fn(i) for i in s.indices)
        s.value = fn(s.value)
        if s.nontemporal is not None:
            s.nontemporal = fn(s.nontemporal)
    elif isinstance(s, For):
        s.extent = fn(s.extent)
    elif isinstance(s, Block):
        s.bindings = [fn(x) for x in s.bindings]
        if s.predicate is not None:
            s.predicate = fn(s.predicate)
    elif isinstance(s, If):
        s.cond = fn(s.cond)
    elif isinstance(s, Prefetch):
        s.offset = fn(s.offset)
    elif isinstance(s, StreamStore):
        s.offset, s.src_offset = fn(s.offset), fn(s.src_offset)
        s.length, s.nontemporal = fn(s.length), fn(s.nontemporal)


def _retarget(b: Block, temp: str, out: str, plan: list[int | Expr], row: dict[str, Expr]) -> None:
    """In ``b``, turn ``temp[s]`` into ``out[...]``: axis ``i`` of ``out`` takes ``s[plan[i]]``
    or, for a row expression, ``row[expr_str(plan[i])]``."""

    def to_out(idx: Sequence[Expr]) -> tuple[Expr, ...]:
        return tuple(idx[p] if isinstance(p, int) else row[expr_str(p)] for p in plan)

    def repl(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.buffer == temp:
            return Load(out, to_out(e.indices))
        return None

    for st in _stores(b):
        if st.buffer == temp:
            st.buffer = out
            st.indices = to_out(st.indices)
    _map_block_exprs(b, lambda e: transform(e, repl))


def _combine(b: Block) -> tuple[str, Store, Expr, bool] | None:
    """For a reduction block: (combine op, the store, the combined value, whether the
    accumulator is the left operand), or None if the body is not ``C = C op x``."""
    if len(b.body) != 1 or not isinstance(b.body[0], Store):
        return None
    st = b.body[0]
    v = st.value
    if not (isinstance(v, Bin) and v.op in COMBINE_OPS):
        return None
    acc = Load(st.buffer, st.indices)
    if v.a == acc and st.buffer not in {ld.buffer for ld in loads(v.b)}:
        return v.op, st, v.b, True
    if v.b == acc and st.buffer not in {ld.buffer for ld in loads(v.a)}:
        return v.op, st, v.a, False
    return None


def _identity(op: str, dtype: str) -> Const:
    dt = np.dtype(dtype)
    if op == "+":
        return Const(0.0 if dt.kind == "f" else 0, dtype)
    if op == "*":
        return Const(1.0 if dt.kind == "f" else 1, dtype)
    if dt.kind == "f":
        return Const(float("-inf") if op == "max" else float("inf"), dtype)
    if dt.kind == "b":
        return Const(op == "min", dtype)
    info = np.iinfo(dt)
    return Const(int(info.min) if op == "max" else int(info.max), dtype)


def alloc_loop(kernel: Kernel, buffer: str) -> str | None:
    """The innermost loop enclosing every access to temp ``buffer``: where a backend
    should allocate it (one private copy per iteration), or None for kernel level.

    After :meth:`Schedule.compute_at` shrinks a temp to its per-iteration region, the
    temp must live inside this loop when the loop (or one around it) is parallel.
    """
    paths: list[tuple[For, ...]] = []
    for s, _, loops in _walk(kernel.body):
        reads_it = (isinstance(s, Block) and buffer in (_reads(s) | _writes(s))) or (
            isinstance(s, StreamStore) and buffer == s.src
        )
        if reads_it:
            paths.append(loops)
    if not paths:
        return None
    common = _common_prefix(paths)
    return common[-1].var if common else None


def _index(cont: list[Stmt], x: Stmt) -> int:
    """Position of ``x`` in ``cont`` by identity (statements compare by value)."""
    for i, s in enumerate(cont):
        if s is x:
            return i
    raise ValueError("statement not in list")


def _common_prefix(paths: Sequence[tuple[For, ...]]) -> tuple[For, ...]:
    out: list[For] = []
    for group in zip(*paths):
        if all(f is group[0] for f in group):
            out.append(group[0])
        else:
            break
    return tuple(out)


# ---------------------------------------------------------------------------------
# the schedule
# ---------------------------------------------------------------------------------


class Schedule:
    """Schedule primitives over a copy of a lowered kernel; see the module docstring.

    ``sch.kernel`` is the kernel being rewritten, ``sch.trace`` the primitives applied
    so far. ``str(sch)`` prints the current loop AST.
    """

    def __init__(self, kernel: Kernel):
        self.kernel: Kernel = kernel.copy()
        self.trace: Trace = Trace()
        self._depth = 0

    def __str__(self) -> str:
        return format_kernel(self.kernel)

    # ------------------------------------------------------------------ queries

    def blocks(self) -> list[str]:
        """Names of all blocks, in program order."""
        return [b.name for b in ast_blocks(self.kernel.body)]

    def get_block(self, name: str) -> Block:
        """The block called ``name`` (raises ScheduleError if there is none)."""
        for b in ast_blocks(self.kernel.body):
            if b.name == name:
                return b
        raise ScheduleError("get_block", name, "no such block")

    def get_loops(self, block: str) -> list[str]:
        """Loop variables enclosing ``block``, outermost first."""
        return [f.var for f in self._locate_block("get_loops", block)[2]]

    def get_loop(self, loop: str) -> For:
        """The loop whose variable is ``loop``."""
        return self._locate_loop("get_loop", loop)[0]

    def writers(self, buffer: str) -> list[str]:
        """Blocks storing into ``buffer``, in program order."""
        return [b.name for b in ast_blocks(self.kernel.body) if buffer in _writes(b)]

    def readers(self, buffer: str) -> list[str]:
        """Blocks loading from ``buffer``, in program order."""
        return [b.name for b in ast_blocks(self.kernel.body) if buffer in _reads(b)]

    def producers(self, block: str) -> list[str]:
        """Blocks writing a buffer that ``block`` reads (a reduction's own init block
        counts as part of it, not as a producer)."""
        b = self.get_block(block)
        rs = _reads(b)
        return [
            x.name
            for x in ast_blocks(self.kernel.body)
            if x is not b and x.reduce_of != b.name and _writes(x) & rs
        ]

    def consumers(self, block: str) -> list[str]:
        """Blocks reading a buffer that ``block`` writes (for an init block, the
        reduction it initialises is not counted)."""
        b = self.get_block(block)
        ws = _writes(b)
        return [
            x.name
            for x in ast_blocks(self.kernel.body)
            if x is not b and b.reduce_of != x.name and x.reduce_of != b.name and _reads(x) & ws
        ]

    def load_strides(self, block: str, loop: str) -> list[tuple[str, list[int | None]]]:
        """For every load of ``block``: its buffer and, per index, how far that index
        moves when loop ``loop`` advances by one (the constant coefficient of ``loop`` in
        the index written in loop variables; 0 when the index does not use ``loop``;
        None when it is not affine in ``loop`` with a constant coefficient)."""
        b = self.get_block(block)
        out: list[tuple[str, list[int | None]]] = []
        for ld in _loads(b):
            strides: list[int | None] = []
            for i in ld.indices:
                e = _loop_terms(b, i)
                if loop not in free_vars(e):
                    strides.append(0)
                    continue
                d = _diff(substitute(e, {loop: add(Var(loop), Const(1))}), e)
                ok = d is not None and d.is_Integer
                strides.append(int(d) if ok else None)  # type: ignore[arg-type]
            out.append((ld.buffer, strides))
        return out

    # ------------------------------------------------------------------ internals

    def _ctx(self) -> _Ctx:
        ext = {s.var: s.extent for s, _, _ in _walk(self.kernel.body) if isinstance(s, For)}
        return _Ctx(ext, self.kernel.dims)

    def _names_in_use(self, kind: str) -> set[str]:
        """Names taken in one namespace: "var" (dims, loop and iteration variables),
        "block" or "buffer"."""
        k = self.kernel
        if kind == "buffer":
            return {b.name for b in k.inputs + k.outputs + k.temps}
        used: set[str] = set(k.dims) if kind == "var" else set()
        for s, _, _ in _walk(k.body):
            if isinstance(s, For) and kind == "var":
                used.add(s.var)
            elif isinstance(s, Block):
                if kind == "block":
                    used.add(s.name)
                else:
                    used |= {iv.name for iv in s.iter_vars}
        return used

    def _fresh(
        self,
        base: str,
        taken: set[str] | None = None,
        free: set[str] | None = None,
        kind: str = "var",
    ) -> str:
        """A name starting with ``base`` unused in namespace ``kind`` and not in
        ``taken`` (which receives it); names in ``free`` count as unused."""
        used = (self._names_in_use(kind) - (free or set())) | (taken or set())
        if base not in used:
            name = base
        else:
            n = 1
            while f"{base}_{n}" in used:
                n += 1
            name = f"{base}_{n}"
        if taken is not None:
            taken.add(name)
        return name

    def _locate_block(self, prim: str, name: str) -> tuple[Block, list[Stmt], tuple[For, ...]]:
        for s, cont, loops in _walk(self.kernel.body):
            if isinstance(s, Block) and s.name == name:
                return s, cont, loops
        raise ScheduleError(prim, name, "no such block")

    def _locate_loop(self, prim: str, var: str) -> tuple[For, list[Stmt], tuple[For, ...]]:
        for s, cont, loops in _walk(self.kernel.body):
            if isinstance(s, For) and s.var == var:
                return s, cont, loops
        raise ScheduleError(prim, "-", f"no loop with variable {var!r}")

    def _container(self, stmt: Stmt) -> tuple[list[Stmt], tuple[For, ...]]:
        for s, cont, loops in _walk(self.kernel.body):
            if s is stmt:
                return cont, loops
        raise KeyError("statement not in kernel")

    @staticmethod
    def _first_block(stmt: Stmt) -> str:
        bs = ast_blocks([stmt])
        return bs[0].name if bs else "-"

    def _loop_ids(self, block: str) -> set[int]:
        """Identities of the loops enclosing ``block``."""
        return {id(f) for f in self._locate_block("-", block)[2]}

    def _shared_loops(self, a: str, b: str) -> set[int]:
        """Identities of the loops enclosing both blocks."""
        return self._loop_ids(a) & self._loop_ids(b)

    def _order(self) -> dict[str, int]:
        return {b.name: i for i, b in enumerate(ast_blocks(self.kernel.body))}

    def _init_of(self, b: Block) -> Block | None:
        for x in ast_blocks(self.kernel.body):
            if x.reduce_of == b.name:
                return x
        return None

    def _own_chain(self, b: Block) -> tuple[list[For], list[Stmt]]:
        """The loops around ``b`` that hold nothing else (innermost upward), and the
        list holding the outermost of them (or ``b`` itself)."""
        cont, loops = self._container(b)
        chain: list[For] = []
        child: Stmt = b
        holder = cont
        for f in reversed(loops):
            if len(holder) == 1 and holder[0] is child:
                chain.insert(0, f)
                child = f
                holder = self._container(f)[0]
            else:
                break
        return chain, holder

    def _root_chain(self, prim: str, b: Block) -> list[For]:
        """``b``'s loops when ``b`` sits alone in a perfect nest at kernel level."""
        chain, holder = self._own_chain(b)
        _, loops = self._container(b)
        if holder is not self.kernel.body or len(chain) != len(loops):
            raise ScheduleError(
                prim, b.name, "the block must sit alone in its own loop nest at kernel level"
            )
        return chain

    def _remove(self, stmt: Stmt) -> None:
        cont, _ = self._container(stmt)
        for i, s in enumerate(cont):
            if s is stmt:
                del cont[i]
                break
        self._prune(self.kernel.body)

    def _prune(self, stmts: list[Stmt]) -> None:
        i = 0
        while i < len(stmts):
            s = stmts[i]
            if isinstance(s, (For, If)):
                self._prune(s.body)
                if not s.body:
                    del stmts[i]
                    continue
            i += 1

    def _accesses(self, b: Block, buf: str) -> list[tuple[str, tuple[Expr, ...]]]:
        """('w'|'r', indices in loop terms) for every access of ``b`` to ``buf``."""
        out: list[tuple[str, tuple[Expr, ...]]] = []
        for st in _stores(b):
            if st.buffer == buf:
                out.append(("w", tuple(_loop_terms(b, i) for i in st.indices)))
        for ld in _loads(b):
            if ld.buffer == buf:
                out.append(("r", tuple(_loop_terms(b, i) for i in ld.indices)))
        return out

    def _slab_analysis(
        self, buf: str, blocks_: Sequence[tuple[Block, tuple[For, ...]]], outer: tuple[For, ...]
    ) -> list[bool] | str:
        """Check that, inside one iteration of the loops ``outer``, the given blocks'
        accesses to ``buf`` only touch what the writers among them store in that same
        iteration. Returns per dim whether it is a *slab* dim (fixed by ``outer``: the
        same index in every access) or a reason string when the check fails."""
        ctx = self._ctx()
        lset = {f.var for f in outer} | set(self.kernel.dims)
        shape = self.kernel.buffer(buf).shape
        acc: list[tuple[Block, str, tuple[Expr, ...], set[str]]] = []
        for b, path in blocks_:
            inner = {f.var for f in path[len(outer) :]}
            for kind, idx in self._accesses(b, buf):
                acc.append((b, kind, idx, inner))
            if buf in _writes(b) and _reduce_binding_vars(b) & {f.var for f in outer}:
                return f"block {b.name} reduces across the shared loops"
        slab: list[bool] = []
        covered_by: dict[str, set[str]] = {}
        for d in range(len(shape)):
            exprs = [a[2][d] for a in acc]
            if all(free_vars(e) <= lset for e in exprs) and all(_eq(e, exprs[0]) for e in exprs):
                slab.append(True)
                continue
            for b, kind, idx, inner in acc:
                if kind != "w":
                    continue
                used = ctx.covers(idx[d], shape[d], inner)
                if used is None or used & covered_by.get(b.name, set()):
                    return (
                        f"{buf} dim {d}: block {b.name} writes index "
                        f"{_s(idx[d])}, which neither matches every access in the shared "
                        f"loops nor covers the whole dim within one iteration"
                    )
                covered_by.setdefault(b.name, set()).update(used)
            slab.append(False)
        return slab

    def _try_shrink(self, buf: str) -> None:
        """Shrink local temp ``buf`` to its per-iteration region when every access to it
        lies inside common loops and the slab analysis holds."""
        k = self.kernel
        b = next((t for t in k.temps if t.name == buf), None)
        if b is None or b.scope != "local" or not b.shape:
            return
        users = [
            (s, loops)
            for s, _, loops in _walk(k.body)
            if isinstance(s, Block) and buf in (_reads(s) | _writes(s))
        ]
        if not users:
            return
        outer = _common_prefix([p for _, p in users])
        if not outer:
            return
        slab = self._slab_analysis(buf, users, outer)
        if isinstance(slab, str) or not any(slab):
            return
        full = all(slab)

        def fix(idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
            if full:
                return ()
            return tuple(Const(0) if s else i for s, i in zip(slab, idx))

        def relabel(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == buf:
                return Load(buf, fix(e.indices))
            return None

        for blk, _ in users:
            for st in _stores(blk):
                if st.buffer == buf:
                    st.indices = fix(st.indices)
            _map_block_exprs(blk, lambda e: transform(e, relabel))
        if full:
            b.shape = ()
            b.scope = "register"
        else:
            b.shape = tuple(Const(1) if s else d for s, d in zip(slab, b.shape))

    # ------------------------------------------------------------------ loops

    @_primitive
    def split(self, loop: str, factors: Sequence[int | None]) -> list[str]:
        """Split ``loop`` into nested loops of the given extents, outermost first.

        Requirements: the loop exists; ``factors`` has at least two entries, positive
        ints, at most one of them ``-1``/``None`` (inferred as a ceiling division of
        the extent by the others). A symbolic extent needs an inferred factor; with
        constant factors only their product must reach the extent. When the product
        may overrun the extent (non-dividing or symbolic), every block inside gets
        the predicate ``flat < extent``. New loops are serial and named
        ``<loop>_0, <loop>_1, ...``; returns their names.

        Example, ``split("i", [-1, 4])`` with extent 10::

            serial for (i, 0, 10)              serial for (i_0, 0, 3)
              ScheduleBlock(A)                   serial for (i_1, 0, 4)
                vi = axis.bind(i)       ->         ScheduleBlock(A)
                A[vi] = X[vi] * 2.0f                 vi = axis.bind(i_0 * 4 + i_1)
                                                     predicate = i_0 * 4 + i_1 < 10
                                                     A[vi] = X[vi] * 2.0f
        """
        f, cont, _ = self._locate_loop("split", loop)
        blk = self._first_block(f)
        fs = list(factors)
        if len(fs) < 2:
            raise ScheduleError("split", blk, f"split of {loop} needs at least two factors")
        inferred = [i for i, x in enumerate(fs) if x is None or x == -1]
        if len(inferred) > 1:
            raise ScheduleError("split", blk, "at most one factor may be inferred (-1/None)")
        for x in fs:
            if x is None or x == -1:
                continue
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
                raise ScheduleError("split", blk, f"factor {x!r} is not a positive int")
        known = 1
        for x in fs:
            if not (x is None or x == -1):
                known *= int(x)
        extent = f.extent
        exts: list[Expr] = []
        if inferred:
            if isinstance(extent, Const):
                inf: Expr = Const(-(-int(extent.value) // known))
            else:
                inf = floordiv(add(extent, Const(known - 1)), Const(known))
            exts = [inf if i in inferred else Const(int(x)) for i, x in enumerate(fs)]
        else:
            if not isinstance(extent, Const):
                raise ScheduleError(
                    "split", blk, f"extent {_s(extent)} of {loop} is symbolic: infer one factor"
                )
            if known < int(extent.value):
                raise ScheduleError(
                    "split", blk, f"factors {fs} cover {known} < extent {extent.value} of {loop}"
                )
            exts = [Const(int(x)) for x in fs]
        total = prod(exts)
        exact = (
            isinstance(extent, Const) and isinstance(total, Const) and total.value == extent.value
        )
        taken: set[str] = set()
        names = [self._fresh(f"{loop}_{i}", taken) for i in range(len(fs))]
        flat = _flatten([Var(n) for n in names], exts)
        body = f.body
        _subst_loop_vars(body, {loop: flat})
        if not exact:
            pred = Bin("<", flat, extent)
            for b in ast_blocks(body):
                b.predicate = _and(b.predicate, pred)
        inner: list[Stmt] = body
        for n, e in reversed(list(zip(names, exts))):
            inner = [For(n, e, inner)]
        cont[_index(cont, f)] = inner[0]
        self._ctx().simplify_bindings(inner)
        return names

    @_primitive
    def fuse(self, loops: Sequence[str]) -> str:
        """Fuse perfectly nested loops (given outermost first, each the only statement
        of the previous one) into one loop; returns its name ``<a>_<b>_fused``.

        Requirements: at least two loops, consecutive and perfectly nested; no extent
        depends on a fused loop. Bindings recover the old variables with ``//``/``%``.

        Example, ``fuse(["i", "j"])``::

            serial for (i, 0, N)                 serial for (i_j_fused, 0, N * 8)
              serial for (j, 0, 8)                 ScheduleBlock(A)
                ScheduleBlock(A)          ->         vi, vj = axis.bind(i_j_fused // 8,
                  vi, vj = axis.bind(i, j)                              i_j_fused % 8)
                  A[vi, vj] = X[vi, vj]              A[vi, vj] = X[vi, vj]
        """
        names = list(loops)
        if len(names) < 2:
            raise ScheduleError("fuse", "-", "fuse needs at least two loops")
        first, cont, _ = self._locate_loop("fuse", names[0])
        blk = self._first_block(first)
        fors = [first]
        for n in names[1:]:
            cur = fors[-1]
            if len(cur.body) != 1 or not isinstance(cur.body[0], For) or cur.body[0].var != n:
                raise ScheduleError(
                    "fuse", blk, f"loop {n} is not the only statement of loop {cur.var}"
                )
            fors.append(cur.body[0])
        fused = set(names)
        for f in fors:
            if free_vars(f.extent) & fused:
                raise ScheduleError("fuse", blk, f"extent of {f.var} depends on a fused loop")
        name = self._fresh("_".join(names) + "_fused")
        exts = [f.extent for f in fors]
        mapping = dict(zip(names, _decompose(Var(name), exts)))
        new = For(name, prod(exts), fors[-1].body)
        _subst_loop_vars(new.body, mapping)
        cont[_index(cont, first)] = new
        self._ctx().simplify_bindings([new])
        return name

    @_primitive
    def reorder(self, loops: Sequence[str]) -> None:
        """Permute loops of one perfect nest: the given loops take, in the given order,
        the nest positions they occupied (loops of the nest not listed keep theirs).

        Requirements: distinct loops lying on one chain of loops, each loop of the
        chain between the outermost and innermost given one being the only statement
        of its parent; no moved extent depends on a loop of the chain. Reordering a
        loop nest only changes the order in which a reduction combines its values.

        Example, ``reorder(["j", "i"])``::

            serial for (i, 0, 4)                 serial for (j, 0, 8)
              serial for (j, 0, 8)      ->         serial for (i, 0, 4)
                ScheduleBlock(A) ...                 ScheduleBlock(A) ...
        """
        names = list(loops)
        if len(set(names)) != len(names):
            raise ScheduleError("reorder", "-", f"repeated loops in {names}")
        if not names:
            return None
        located = [self._locate_loop("reorder", n) for n in names]
        deepest = max(located, key=lambda t: len(t[2]))
        path = list(deepest[2]) + [deepest[0]]
        blk = self._first_block(deepest[0])
        pos: list[int] = []
        for n in names:
            idx = [i for i, f in enumerate(path) if f.var == n]
            if not idx:
                raise ScheduleError(
                    "reorder", blk, f"loop {n} is not in the same nest as the others"
                )
            pos.append(idx[0])
        lo, hi = min(pos), max(pos)
        blk = self._first_block(path[lo])
        for i in range(lo, hi):
            if len(path[i].body) != 1 or path[i].body[0] is not path[i + 1]:
                raise ScheduleError(
                    "reorder", blk, f"loop {path[i].var} holds more than loop {path[i + 1].var}"
                )
        chain_vars = {f.var for f in path[lo : hi + 1]}
        for i in pos:
            if free_vars(path[i].extent) & chain_vars:
                raise ScheduleError(
                    "reorder", blk, f"extent of {path[i].var} depends on a loop of the nest"
                )
        heads = [(path[i].var, path[i].extent, path[i].kind) for i in pos]
        for p, (v, e, kd) in zip(sorted(pos), heads):
            path[p].var, path[p].extent, path[p].kind = v, e, kd
        return None

    @_primitive
    def align(self, block: str, reduce_axes: Sequence[int] | None = None) -> list[str]:
        """Iteration-space alignment (CINN): rewrite ``block``'s nest into the canonical
        ``for sp in prod(spatial extents)`` [``for rb in prod(reduce extents)``] form;
        returns the new loop names ``<block>_sp`` [, ``<block>_rb``].

        The ``rb`` loop gathers the block's reduce iteration variables; for a
        non-reduction block, ``reduce_axes`` (positions of iteration variables) names
        the axes to put there instead (CINN's impure spatial axes, e.g. the broadcast
        axis after a reduction). Requirements: the block sits alone in its own perfect
        nest at kernel level, has no predicate, and each loop binds exactly one
        iteration variable directly (``vi = i``) with the same extent. Aligning an
        already aligned block returns its loops unchanged.

        Example, a ``ReduceSum`` over the last axis::

            serial for (i, 0, S1)                  serial for (C_sp, 0, S1 * S2)
              serial for (j, 0, S2)                  serial for (C_rb, 0, 1024)
                serial for (k, 0, 1024)      ->        ScheduleBlock(C)
                  ScheduleBlock(C)                       vi, vj, r:vk = axis.bind(
                    vi, vj, r:vk = axis.bind(              C_sp // S2, C_sp % S2, C_rb)
                      i, j, k)                           C[vi, vj] = C[vi, vj] + B[vi, vj, vk]
                    C[vi, vj] = C[vi, vj] + B[vi, vj, vk]
        """
        b, _, loops = self._locate_block("align", block)
        is_red = _is_reduce(b)
        ivs = b.iter_vars
        if is_red:
            rb_idx = [i for i, iv in enumerate(ivs) if iv.kind == "reduce"]
        else:
            rb_idx = sorted(set(reduce_axes or ()))
            if any(not 0 <= i < len(ivs) for i in rb_idx):
                raise ScheduleError(
                    "align",
                    block,
                    f"reduce_axes {list(reduce_axes or ())} "
                    f"out of range for {len(ivs)} iteration variables",
                )
        sp_idx = [i for i in range(len(ivs)) if i not in rb_idx]
        sp_ext = prod([ivs[i].extent for i in sp_idx])
        rb_ext = prod([ivs[i].extent for i in rb_idx])
        reason = self._not_one_to_one(b)
        if reason is not None:
            want = 2 if rb_idx else 1
            if len(loops) == want and b.predicate is None:
                canon = self._aligned_bindings(b, sp_idx, rb_idx, [f.var for f in loops])
                if (
                    canon == b.bindings
                    and _eq(loops[0].extent, sp_ext)
                    and (not rb_idx or _eq(loops[1].extent, rb_ext))
                ):
                    return [f.var for f in loops]  # already aligned
            raise ScheduleError("align", block, reason)
        chain = self._root_chain("align", b)
        own = {f.var for f in chain}
        taken: set[str] = set()
        sp = self._fresh(f"{block}_sp", taken, own)
        names = [sp] + ([self._fresh(f"{block}_rb", taken, own)] if rb_idx else [])
        b.bindings = self._aligned_bindings(b, sp_idx, rb_idx, names)
        inner: list[Stmt] = [b]
        if rb_idx:
            inner = [For(names[1], rb_ext, inner)]
        top = For(sp, sp_ext, inner)
        root = chain[0] if chain else b
        self.kernel.body[_index(self.kernel.body, root)] = top
        return names

    def _not_one_to_one(self, b: Block) -> str | None:
        """Why ``b``'s nest is not a lowered-style nest (alone at kernel level, no
        predicate, each loop binding one iteration variable directly), or None."""
        try:
            chain = self._root_chain("align", b)
        except ScheduleError as e:
            return str(e).split(": ", 1)[1]
        if b.predicate is not None:
            return "the block has a predicate (its nest was split)"
        lvars = {f.var: f for f in chain}
        seen: set[str] = set()
        for iv, x in zip(b.iter_vars, b.bindings):
            if not (isinstance(x, Var) and x.name in lvars) or x.name in seen:
                return f"iter var {iv.name} is not bound directly to its own loop"
            seen.add(x.name)
            if not _eq(lvars[x.name].extent, iv.extent):
                return f"loop {x.name} and iter var {iv.name} differ in extent"
        if len(seen) != len(chain):
            return "a loop of the nest binds no iteration variable"
        return None

    @staticmethod
    def _aligned_bindings(
        b: Block, sp_idx: list[int], rb_idx: list[int], names: list[str]
    ) -> list[Expr]:
        out: list[Expr] = [Const(0)] * len(b.iter_vars)
        groups = [(sp_idx, names[0])] + ([(rb_idx, names[1])] if rb_idx else [])
        for idx, var in groups:
            digits = _decompose(Var(var), [b.iter_vars[i].extent for i in idx])
            for i, e in zip(idx, digits):
                out[i] = e
        return out

    @_primitive
    def align_all(self) -> dict[str, list[str]]:
        """Align every block (see :meth:`align`); returns block -> its new loops.

        The impure spatial axes of non-reduction blocks are inferred from the first
        reduction: its input's axes that the reduce iteration variables index are put in
        the ``rb`` loop of every non-reduction block whose iteration extents equal that
        input's shape (the elementwise blocks before and the broadcast blocks after the
        reduction), so that all nests share ``sp`` (and ``rb``) extents.

        Requirements: those of :meth:`align` for every block (the error names the
        first block that fails; nothing is changed then).

        Example, X*2 then a ReduceSum over the last axis (init omitted)::

            for (A_i0, 0, N)                     for (A_sp, 0, N)
              for (A_i1, 0, 64)                    for (A_rb, 0, 64)
                ScheduleBlock(A)                     ScheduleBlock(A)
                  vi0, vi1 = axis.bind(                vi0, vi1 = axis.bind(A_sp, A_rb)
                    A_i0, A_i1)                        A[vi0, vi1] = X[vi0, vi1] * 2.0f
                  A[vi0, vi1] = X[vi0, vi1] * 2.0f
            for (C_i0, 0, N)                ->   for (C_sp, 0, N)
              for (C_k0, 0, 64)                    for (C_rb, 0, 64)
                ScheduleBlock(C)                     ScheduleBlock(C)
                  vi0, r:vk0 = axis.bind(              vi0, r:vk0 = axis.bind(C_sp, C_rb)
                    C_i0, C_k0)                        C[vi0] = C[vi0] + A[vi0, vk0]
                  C[vi0] = C[vi0] + A[vi0, vk0]
        """
        axes: list[int] | None = None
        shape: tuple[Expr, ...] = ()
        for b in ast_blocks(self.kernel.body):
            if not _is_reduce(b) or b.reduce_of is not None:
                continue
            red = {iv.name for iv in b.iter_vars if iv.kind == "reduce"}
            for ld in _loads(b):
                names = [i.name if isinstance(i, Var) else None for i in ld.indices]
                if red <= set(n for n in names if n):
                    axes = [i for i, n in enumerate(names) if n in red]
                    shape = self.kernel.buffer(ld.buffer).shape
                    break
            if axes is not None:
                break
        out: dict[str, list[str]] = {}
        for name in self.blocks():
            b = self.get_block(name)
            ra: list[int] | None = None
            if (
                axes
                and not _is_reduce(b)
                and len(b.iter_vars) == len(shape)
                and all(_eq(iv.extent, d) for iv, d in zip(b.iter_vars, shape))
            ):
                ra = axes
            try:
                out[name] = self.align(name, ra)
            except ScheduleError as e:
                raise ScheduleError("align_all", e.block, str(e).split(": ", 1)[1]) from None
        return out

    # ------------------------------------------------------------------ blocks

    @_primitive
    def compute_inline(self, block: str) -> None:
        """Inline a pure spatial block into every consumer and delete it with its temp.

        Requirements: not a reduction or init block; its body is one store whose
        indices are exactly its iteration variables, in order; the stored buffer is a
        temp (not a kernel output) that no other block writes and that the value does
        not read; the buffers it reads are not written after it. (Inline before
        :meth:`compute_at` shrinks the temp: the shrunk indices are no longer the
        iteration variables.)

        Example, ``compute_inline("A")``::

            for (i, 0, N)                       for (j, 0, N)
              ScheduleBlock(A)                    ScheduleBlock(B)
                vi = axis.bind(i)                   vj = axis.bind(j)
                A[vi] = X[vi] * 2.0f     ->         B[vj] = X[vj] * 2.0f + 1.0f
            for (j, 0, N)
              ScheduleBlock(B)
                vj = axis.bind(j)
                B[vj] = A[vj] + 1.0f
        """
        b, _, _ = self._locate_block("compute_inline", block)
        buf, value, ivs = self._inlinable("compute_inline", b)
        order = self._order()
        for y in {ld.buffer for ld in loads(value)}:
            for w in self.writers(y):
                if order[w] > order[block]:
                    raise ScheduleError(
                        "compute_inline", block, f"{y}, which it reads, is written later by {w}"
                    )
        consumers = [self.get_block(n) for n in self.readers(buf)]
        for c in consumers:
            if order[c.name] < order[block]:
                raise ScheduleError(
                    "compute_inline", block, f"consumer {c.name} runs before the block"
                )
        # what the value reads must still hold the same data where the consumers run:
        # a writer re-executed by a loop it shares with the block must enclose them too
        for y in {ld.buffer for ld in loads(value)}:
            for w in self.writers(y):
                shared = self._shared_loops(w, block)
                for c in consumers:
                    if not shared <= self._loop_ids(c.name):
                        raise ScheduleError(
                            "compute_inline",
                            block,
                            f"{y} is rewritten by {w} in a loop that does not enclose "
                            f"consumer {c.name}",
                        )

        def repl(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == buf:
                return substitute(value, dict(zip(ivs, e.indices)))
            return None

        for c in consumers:
            _map_block_exprs(c, lambda e: transform(e, repl))
        self._remove(b)
        self.kernel.temps = [t for t in self.kernel.temps if t.name != buf]
        return None

    def _inlinable(self, prim: str, b: Block) -> tuple[str, Expr, list[str]]:
        if _is_reduce(b) or b.reduce_of is not None:
            raise ScheduleError(prim, b.name, "a reduction (or its init) cannot be inlined")
        if len(b.body) != 1 or not isinstance(b.body[0], Store):
            raise ScheduleError(prim, b.name, "the body must be a single store")
        st = b.body[0]
        buf = st.buffer
        if buf not in {t.name for t in self.kernel.temps}:
            raise ScheduleError(prim, b.name, f"{buf} is a kernel argument, not a temp")
        ivs = [iv.name for iv in b.iter_vars]
        if list(st.indices) != [Var(n) for n in ivs]:
            raise ScheduleError(
                prim,
                b.name,
                f"store index [{', '.join(_s(i) for i in st.indices)}] is not "
                f"exactly the iteration variables [{', '.join(ivs)}]",
            )
        if buf in {ld.buffer for ld in loads(st.value)}:
            raise ScheduleError(prim, b.name, f"the value reads {buf} itself")
        if self.writers(buf) != [b.name]:
            raise ScheduleError(prim, b.name, f"{buf} has other writers: {self.writers(buf)}")
        return buf, st.value, ivs

    @_primitive
    def reverse_compute_inline(self, block: str) -> None:
        """Fold an elementwise consumer into its single producer: the producer then
        computes and stores the consumer's result, the consumer and the temp go away.

        Requirements: ``block`` is not a reduction, its body is one store; among the
        buffers it reads exactly one is written by a block (the producer), a temp read
        by no other block; every load of it indexes a permutation of the consumer's
        iteration variables (all of them, extents matching the temp's shape); the
        producer is a pure spatial single-store block whose store index is exactly its
        iteration variables; nothing between producer and consumer writes what the
        consumer reads or touches what it writes.

        Example, ``reverse_compute_inline("B")``::

            for (i, 0, N)                       for (i, 0, N)
              ScheduleBlock(A)                    ScheduleBlock(A)
                vi = axis.bind(i)                   vi = axis.bind(i)
                A[vi] = X[vi] * 2.0f     ->         B[vi] = X[vi] * 2.0f + 1.0f
            for (j, 0, N)
              ScheduleBlock(B)
                vj = axis.bind(j)
                B[vj] = A[vj] + 1.0f
        """
        prim = "reverse_compute_inline"
        c, _, _ = self._locate_block(prim, block)
        if _is_reduce(c) or c.reduce_of is not None:
            raise ScheduleError(prim, block, "the consumer must not be a reduction")
        if len(c.body) != 1 or not isinstance(c.body[0], Store):
            raise ScheduleError(prim, block, "the body must be a single store")
        cst = c.body[0]
        produced = [y for y in sorted(_reads(c)) if self.writers(y)]
        if len(produced) != 1:
            raise ScheduleError(
                prim, block, f"needs exactly one produced input, found {produced or 'none'}"
            )
        buf = produced[0]
        if buf == cst.buffer:
            raise ScheduleError(prim, block, f"the block reads its own output {buf}")
        if self.readers(buf) != [block]:
            raise ScheduleError(prim, block, f"{buf} is also read by {self.readers(buf)}")
        if len(self.writers(buf)) != 1:
            raise ScheduleError(prim, block, f"{buf} has several writers")
        pname = self.writers(buf)[0]
        p = self.get_block(pname)
        try:
            _, pvalue, pivs = self._inlinable(prim, p)
        except ScheduleError as e:
            raise ScheduleError(prim, block, f"producer {pname}: {e}") from None
        civs = [iv.name for iv in c.iter_vars]
        idxs = {ld.indices for ld in _loads(c) if ld.buffer == buf}
        if len(idxs) != 1:
            raise ScheduleError(prim, block, f"{buf} is loaded at several indices")
        (idx,) = idxs
        shape = self.kernel.buffer(buf).shape
        names = [i.name if isinstance(i, Var) else None for i in idx]
        if sorted(n for n in names if n) != sorted(civs) or len(idx) != len(civs):
            raise ScheduleError(
                prim,
                block,
                f"load {buf}[{', '.join(_s(i) for i in idx)}] is not a permutation "
                "of the iteration variables",
            )
        ext = {iv.name: iv.extent for iv in c.iter_vars}
        for n, d, piv in zip(names, shape, p.iter_vars):
            if not (_eq(ext[n], d) and _eq(piv.extent, d)):  # type: ignore[index]
                raise ScheduleError(
                    prim, block, f"iter vars {n} / {piv.name} do not both span {buf}'s dim"
                )
        sigma: dict[str, Expr] = {n: Var(pv) for n, pv in zip(names, pivs)}  # type: ignore[misc]
        order = self._order()
        lo, hi = order[pname], order[block]
        if lo > hi:
            raise ScheduleError(prim, block, f"producer {pname} runs after the block")
        others = _reads(c) - {buf}
        for x in ast_blocks(self.kernel.body):
            if lo < order[x.name] < hi and (
                _writes(x) & (others | {cst.buffer}) or cst.buffer in _reads(x)
            ):
                raise ScheduleError(prim, block, f"block {x.name} between them conflicts")
        # the store must not depend on the consumer's loop context (e.g. a shrunk temp)
        out_shape = self.kernel.buffer(cst.buffer).shape
        snames = [i.name for i in cst.indices if isinstance(i, Var)]
        if sorted(snames) != sorted(civs) or not all(
            isinstance(i, Var) or (i == Const(0) and _eq(d, Const(1)))
            for i, d in zip(cst.indices, out_shape)
        ):
            raise ScheduleError(
                prim,
                block,
                f"store index [{', '.join(_s(i) for i in cst.indices)}] is not a permutation "
                "of the iteration variables",
            )
        # what else the consumer reads must hold the same data at the producer
        for y in others:
            for w in self.writers(y):
                if order[w] > lo or self._shared_loops(w, block) != self._shared_loops(w, pname):
                    raise ScheduleError(
                        prim, block, f"{y} (written by {w}) may differ at producer {pname}"
                    )

        def repl(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == buf:
                return pvalue
            if isinstance(e, Var) and e.name in sigma:
                return sigma[e.name]
            return None

        new_value = transform(cst.value, repl)
        new_idx = tuple(substitute(i, sigma) for i in cst.indices)
        p.body = [Store(cst.buffer, new_idx, new_value)]
        self._remove(c)
        self.kernel.temps = [t for t in self.kernel.temps if t.name != buf]
        return None

    @_primitive
    def rfactor(self, block: str, loop: str, factor: int) -> list[str]:
        """Two-step reduce: split reduce loop ``loop`` into ``outer * factor``,
        accumulate ``factor`` partial results per output element in a new local buffer
        ``<buf>_rf`` (the output's shape plus an axis of size ``factor``) in a block
        ``<block>_rf`` (with its init ``<block>_rf__init``), then let ``block`` reduce
        that axis into the output. Returns the rf nest's two new loops
        ``[<loop>_0, <loop>_1]``; the inner one carries the partials' axis and is
        spatial for the rf block, so it can be vectorized or parallelized.

        Requirements: ``block`` is a reduction ``C[idx] = C[idx] op value`` with op in
        ``+ * max min``; ``loop`` is among the loops holding nothing but the block,
        bound directly (``vk = loop``) to one reduce iteration variable and used by no
        other binding; those loops bind spatial iteration variables outside and reduce
        ones inside, and enclosing loops bind no reduce variable; ``factor`` >= 1. The
        result equals the original up to float reassociation.

        Example, ``rfactor("C", "k", 4)`` (C's own init, unchanged, omitted)::

            for (i, 0, N)
              for (k, 0, 16)
                ScheduleBlock(C)
                  vi, r:vk = axis.bind(i, k)
                  C[vi] = C[vi] + X[vi, vk]
            ->
            for (i_i, 0, N)
              for (k_1_i, 0, 4)
                ScheduleBlock(C_rf__init)
                  vi, vk_i = axis.bind(i_i, k_1_i)
                  C_rf[vi, vk_i] = 0.0f
            for (i, 0, N)
              for (k_0, 0, 4)
                for (k_1, 0, 4)
                  ScheduleBlock(C_rf)
                    vi, r:vk_o, vk_i = axis.bind(i, k_0, k_1)
                    C_rf[vi, vk_i] = C_rf[vi, vk_i] + X[vi, vk_o * 4 + vk_i]
            for (i_f, 0, N)
              for (k_1_f, 0, 4)
                ScheduleBlock(C)
                  vi, r:vk_i = axis.bind(i_f, k_1_f)
                  C[vi] = C[vi] + C_rf[vi, vk_i]
        """
        prim = "rfactor"
        b, _, loops = self._locate_block(prim, block)
        if not _is_reduce(b) or b.reduce_of is not None:
            raise ScheduleError(prim, block, "not a reduction block")
        comb = _combine(b)
        if comb is None:
            raise ScheduleError(prim, block, "body is not a single store C[i] = C[i] op value")
        op, st, rest, acc_left = comb
        if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)) or factor < 1:
            raise ScheduleError(prim, block, f"factor {factor!r} is not a positive int")
        factor = int(factor)
        chain, _ = self._own_chain(b)
        chain_vars = [f.var for f in chain]
        if loop not in chain_vars:
            raise ScheduleError(prim, block, f"loop {loop} is not one of the block's own loops")
        red_vars = _reduce_binding_vars(b)
        bound = [i for i, x in enumerate(b.bindings) if loop in free_vars(x)]
        if len(bound) != 1 or b.bindings[bound[0]] != Var(loop):
            raise ScheduleError(prim, block, f"loop {loop} must bind exactly one iter var directly")
        ri = bound[0]
        if b.iter_vars[ri].kind != "reduce":
            raise ScheduleError(prim, block, f"loop {loop} binds a spatial iter var")
        shared = {f.var for f in loops} - set(chain_vars)
        if red_vars & shared:
            raise ScheduleError(prim, block, "an enclosing shared loop binds a reduce iter var")
        kinds = ["r" if v in red_vars else "s" for v in chain_vars]
        if "".join(kinds) != "s" * kinds.count("s") + "r" * kinds.count("r"):
            raise ScheduleError(prim, block, "spatial loops must enclose the reduce loops")
        sp_loops = [f for f in chain if f.var not in red_vars]
        sp_bound = _spatial_binding_vars(b)
        for f in sp_loops:
            if f.var not in sp_bound:
                raise ScheduleError(prim, block, f"loop {f.var} binds no iteration variable")
        cbuf = self.kernel.buffer(st.buffer)
        old_pred = b.predicate
        # 1. split the reduce loop
        r0, r1 = self.split(loop, [None, factor])
        ctx = self._ctx()
        # 2. the reduce iter var becomes vk_o (reduce) and vk_i (spatial)
        iv = b.iter_vars[ri]
        taken: set[str] = set()
        vo = self._fresh(f"{iv.name}_o", taken)
        vi = self._fresh(f"{iv.name}_i", taken)
        b.iter_vars[ri : ri + 1] = [
            IterVar(vo, ctx.ext[r0], "reduce"),
            IterVar(vi, Const(factor), "spatial"),
        ]
        b.bindings[ri : ri + 1] = [Var(r0), Var(r1)]
        recon = add(mul(Var(vo), Const(factor)), Var(vi))
        rest = substitute(rest, {iv.name: recon})
        # 3. partial buffer and the rf block
        rf_buf = self._fresh(f"{cbuf.name}_rf", kind="buffer")
        self.kernel.temps.append(
            Buffer(rf_buf, cbuf.dtype, tuple(cbuf.shape) + (Const(factor),), "local")
        )
        rf_idx = tuple(st.indices) + (Var(vi),)
        acc = Load(rf_buf, rf_idx)
        b.body = [Store(rf_buf, rf_idx, Bin(op, acc, rest) if acc_left else Bin(op, rest, acc))]
        final_name = b.name
        b.name = self._fresh(f"{final_name}_rf", kind="block")
        # 4. init of the partials and the final reduction, in nests copying the
        #    block's spatial loops plus the partials' axis
        sp_ivs = [
            (v, x) for v, x in zip(b.iter_vars, b.bindings) if v.kind != "reduce" and v.name != vi
        ]
        keep_pred = [c for c in conjuncts(old_pred) if not (free_vars(c) & red_vars)]

        def nest(suffix: str, blk: Block) -> Stmt:
            ren = {f.var: Var(self._fresh(f"{f.var}_{suffix}", taken)) for f in sp_loops}
            rvar = self._fresh(f"{r1}_{suffix}", taken)
            blk.bindings = [substitute(x, ren) for x in blk.bindings[:-1]] + [Var(rvar)]
            blk.predicate = _all_and([substitute(c, ren) for c in keep_pred])
            inner: Stmt = For(rvar, Const(factor), [blk])
            for f in reversed(sp_loops):
                inner = For(ren[f.var].name, f.extent, [inner])  # type: ignore[union-attr]
            return inner

        ivs_copy = [IterVar(v.name, v.extent, "spatial") for v, _ in sp_ivs]
        init_blk = Block(
            self._fresh(f"{b.name}__init", kind="block"),
            ivs_copy + [IterVar(vi, Const(factor), "spatial")],
            [x for _, x in sp_ivs] + [Const(0)],
            [Store(rf_buf, rf_idx, _identity(op, cbuf.dtype))],
            reduce_of=b.name,
        )
        facc = Load(st.buffer, st.indices)
        fin_blk = Block(
            final_name,
            [IterVar(v.name, v.extent, "spatial") for v, _ in sp_ivs]
            + [IterVar(vi, Const(factor), "reduce")],
            [x for _, x in sp_ivs] + [Const(0)],
            [Store(st.buffer, st.indices, Bin(op, facc, acc) if acc_left else Bin(op, acc, facc))],
        )
        init_nest = nest("i", init_blk)
        fin_nest = nest("f", fin_blk)
        chain, _ = self._own_chain(b)
        top = chain[0] if chain else b
        cont, _ = self._container(top)
        at = _index(cont, top)
        cont[at + 1 : at + 1] = [fin_nest]
        cont[at:at] = [init_nest]
        return [r0, r1]

    @_primitive
    def compute_at(self, block: str, loop: str) -> list[str]:
        """Move ``block`` (with its init, for a reduction) inside ``loop`` of another
        nest, CINN SimpleComputeAt style; returns the block's loops afterwards.

        The block's outer loops are identified with the loops from the root down to
        ``loop``: one to one when their extents are equal, else the shortest prefix of
        the block's loops whose extents' product equals theirs is recomputed from them
        with ``//``/``%``. The block keeps its remaining loops. It goes first in
        ``loop``'s body when blocks there read what it writes (producer), last when it
        reads what blocks there write (consumer). Temps it writes or reads shrink to
        the per-iteration region when every access to them lies in common loops
        (a temp whose every dim shrinks becomes a register scalar).

        Requirements: not an init block; the block (and its init) sit alone in their
        own nests at kernel level, outside ``loop``'s nest; the extents match as above
        and the identified loops bind only spatial iteration variables; the block is
        a producer or a consumer of the loop's blocks, not both; no block whose order
        relative to it changes, or that shares the outer loops but not ``loop``,
        conflicts with it; inside one iteration of the shared loops, every access to a
        buffer they exchange touches only what the writers store in that iteration
        (same index expression in the shared loops, or a full dim covered by the
        writer's inner loops), and no writer reduces across the shared loops.

        Example, ``compute_at("D", "F_sp")`` (D feeds F; D becomes a register)::

            for (D_sp, 0, N)
              ScheduleBlock(D)
                vi = axis.bind(D_sp)
                D[vi] = C[vi] * 2.0f
            for (F_sp, 0, N)
              for (F_rb, 0, 64)
                ScheduleBlock(F)
                  vi, vj = axis.bind(F_sp, F_rb)
                  F[vi, vj] = D[vi] + 1.0f
            ->
            for (F_sp, 0, N)
              ScheduleBlock(D)
                vi = axis.bind(F_sp)
                D[] = C[vi] * 2.0f
              for (F_rb, 0, 64)
                ScheduleBlock(F)
                  vi, vj = axis.bind(F_sp, F_rb)
                  F[vi, vj] = D[] + 1.0f
        """
        prim = "compute_at"
        b, _, _ = self._locate_block(prim, block)
        if b.reduce_of is not None:
            raise ScheduleError(
                prim, block, f"an init block moves with its reduction {b.reduce_of}"
            )
        init = self._init_of(b) if _is_reduce(b) else None
        t, _, tpath = self._locate_loop(prim, loop)
        target = list(tpath) + [t]
        chain = self._root_chain(prim, b)
        ichain = self._root_chain(prim, init) if init is not None else []
        for f in target:
            if any(f is x for x in chain + ichain):
                raise ScheduleError(prim, block, f"loop {loop} is in the block's own nest")
        moved = [x for x in (init, b) if x is not None]
        moved_names = {x.name for x in moved}
        bw = set().union(*(_writes(x) for x in moved))
        br = set().union(*(_reads(x) for x in moved)) - bw
        sub_blocks = [x for x in ast_blocks(t.body) if x.name not in moved_names]
        producer = any(_reads(x) & bw for x in sub_blocks)
        consumer = any(_writes(x) & br for x in sub_blocks)
        if producer and consumer:
            raise ScheduleError(prim, block, f"the block both feeds and reads blocks in {loop}")
        for x in sub_blocks:
            bad = (
                _writes(x) & bw
                or (_writes(x) & br if producer else False)
                or (_reads(x) & bw if not producer else False)
            )
            if bad:
                raise ScheduleError(
                    prim, block, f"block {x.name} in {loop} conflicts on {sorted(bad)}"
                )
        order_before = self._order()
        # identify loops and rewrite bindings
        tops: list[Stmt] = []
        for x, ch in ((init, ichain), (b, chain)):
            if x is None:
                continue
            keep = self._match_loops(prim, block, x, ch, target)
            tops.append(keep[0] if keep else x)
        for x, ch in ((init, ichain), (b, chain)):
            if x is None:
                continue
            root = ch[0] if ch else x
            del self.kernel.body[_index(self.kernel.body, root)]
        if producer:
            t.body[0:0] = tops
        else:
            t.body.extend(tops)
        self._ctx().simplify_bindings(tops)
        # order and element-level checks on the new tree
        order_after = self._order()
        l0 = target[0]
        inside_t = {x.name for x in ast_blocks(t.body)}
        inside_l0 = {x.name for x in ast_blocks(l0.body)}
        for x in ast_blocks(self.kernel.body):
            if x.name in moved_names or x.name in inside_t:
                continue
            flipped = (order_before[x.name] < order_before[block]) != (
                order_after[x.name] < order_after[block]
            )
            if (flipped or x.name in inside_l0) and (_writes(x) & (bw | br) or _reads(x) & bw):
                raise ScheduleError(
                    prim, block, f"block {x.name} conflicts with it and would be reordered"
                )
        exchanged = (bw if producer else br) & set().union(
            *((_reads(x) if producer else _writes(x)) for x in sub_blocks)
        )
        users = [(s, lp) for s, _, lp in _walk(t.body, tuple(target)) if isinstance(s, Block)]
        for buf in sorted(exchanged):
            acc = [(s, lp) for s, lp in users if buf in (_reads(s) | _writes(s))]
            res = self._slab_analysis(buf, acc, tuple(target))
            if isinstance(res, str):
                raise ScheduleError(prim, block, res)
        for buf in sorted(bw | br):
            self._try_shrink(buf)
        return self.get_loops(block)

    def _match_loops(
        self, prim: str, block: str, x: Block, chain: list[For], target: list[For]
    ) -> list[For]:
        """Rewrite ``x``'s bindings so its outer loops become ``target``; return the
        remaining loops of its chain (re-linked, innermost holding ``x``)."""
        tex = [f.extent for f in target]
        mex = [f.extent for f in chain]
        k = len(target)
        mapping: dict[str, Expr] | None = None
        used = 0
        if len(chain) >= k and all(_eq(a, c) for a, c in zip(mex, tex)):
            mapping = {f.var: Var(g.var) for f, g in zip(chain, target)}
            used = k
        else:
            tprod = prod(tex)
            for j in range(len(chain) + 1):
                if _eq(prod(mex[:j]), tprod):
                    flat = _flatten([Var(g.var) for g in target], tex)
                    mapping = dict(zip([f.var for f in chain[:j]], _decompose(flat, mex[:j])))
                    used = j
                    break
        if mapping is None:
            raise ScheduleError(
                prim,
                block,
                f"loops of {x.name} ({', '.join(_s(e) for e in mex)}) do not match "
                f"the loops down to {target[-1].var} ({', '.join(_s(e) for e in tex)})",
            )
        if _reduce_binding_vars(x) & set(mapping):
            raise ScheduleError(
                prim,
                block,
                f"a loop of {x.name} identified with {target[-1].var}'s nest "
                "binds a reduce iteration variable",
            )
        rest = chain[used:]
        _subst_loop_vars(rest if rest else [x], mapping)
        return rest

    # ------------------------------------------------------------------ annotations

    def _check_independent(
        self,
        prim: str,
        f: For,
        path: tuple[For, ...],
        reassoc: Callable[[Block], bool] | None,
    ) -> None:
        """Iterations of ``f`` must not touch each other's stores. ``reassoc`` (for
        vectorize) says whether a reduction carried by ``f`` may be reassociated."""
        v = f.var
        blocks_in = ast_blocks(f.body)
        if not blocks_in:
            return
        if isinstance(f.extent, Const) and f.extent.value <= 1:
            return
        carried: dict[str, str] = {}
        for b in blocks_in:
            if any(
                iv.kind == "reduce" and v in free_vars(x) for iv, x in zip(b.iter_vars, b.bindings)
            ):
                comb = _combine(b)
                if reassoc is None or comb is None or not reassoc(b):
                    raise ScheduleError(prim, b.name, f"loop {v} carries a reduction of the block")
                carried[b.name] = comb[1].buffer
        ctx = self._ctx()
        inside = {b.name for b in blocks_in}
        temps = {t.name for t in self.kernel.temps}
        written = sorted(set().union(*(_writes(b) for b in blocks_in)))
        for buf in written:
            acc: list[tuple[Block, tuple[Expr, ...]]] = []
            for b in blocks_in:
                if carried.get(b.name) == buf:
                    continue
                acc += [(b, idx) for _, idx in self._accesses(b, buf)]
            if not acc:
                continue
            everyone = set(self.readers(buf)) | set(self.writers(buf))
            if (
                buf in temps
                and everyone <= inside
                and all(v not in set().union(*(free_vars(i) for i in idx)) for _, idx in acc)
            ):
                # a temp private to each iteration: what an iteration reads must be
                # what it wrote itself
                users = [
                    (s, lp)
                    for s, _, lp in _walk(f.body, (*path, f))
                    if isinstance(s, Block) and s.name in everyone
                ]
                res = self._slab_analysis(buf, users, (*path, f))
                if isinstance(res, str):
                    raise ScheduleError(prim, self._first_block(f), res)
                continue
            first: tuple | None = None
            for b, idx in acc:
                rc = ctx.recipe(idx, v)
                if rc is None:
                    raise ScheduleError(
                        prim,
                        b.name,
                        f"the location of {buf}[{', '.join(_s(i) for i in idx)}] "
                        f"does not determine {v}: iterations may touch the same element",
                    )
                if first is None:
                    first = rc
                elif rc != first:
                    raise ScheduleError(
                        prim,
                        b.name,
                        f"accesses to {buf} in different iterations of {v} may overlap",
                    )

    @_primitive
    def fuse_siblings(self, first: str, second: str) -> str:
        """Loop fusion: merge loop ``second`` into the adjacent sibling loop ``first`` before it
        (same extent); returns ``first``.

        Requirements: both loops sit in the same statement list, ``second`` after
        ``first`` with only loop-free blocks between them that neither read what
        ``first`` writes nor write what it touches (they move before ``first``), with
        textually equal extents; no buffer is written by both; nothing
        ``first`` reads is written by ``second``; every buffer ``first`` writes and
        ``second`` reads is read at the very element iteration ``i`` of ``first`` wrote
        (so it is ready when iteration ``i`` of ``second`` runs); a register (0-d)
        ``first`` writes is not read by ``second``, nor is any buffer a reduction carried by
        ``first`` accumulates into (it is final only after the last iteration).

        Example, ``fuse_siblings("E_rb", "S_rb")`` (a row's exp, then its sum)::

            serial for (E_rb, 0, K)                  serial for (E_rb, 0, K)
              ScheduleBlock(E)                         ScheduleBlock(E)
                vk = axis.bind(E_rb)                     vk = axis.bind(E_rb)
                T[vk] = exp(X[vk] - m)        ->          T[vk] = exp(X[vk] - m)
            serial for (S_rb, 0, K)                    ScheduleBlock(S)
              ScheduleBlock(S)                           r:vk = axis.bind(E_rb)
                r:vk = axis.bind(S_rb)                   s = s + T[vk]
                s = s + T[vk]
        """
        prim = "fuse_siblings"
        a, cont, _ = self._locate_loop(prim, first)
        b, cont_b, _ = self._locate_loop(prim, second)
        blk = self._first_block(a)
        if cont is not cont_b:
            raise ScheduleError(prim, blk, f"loops {first} and {second} are not siblings")
        ia = next(i for i, x in enumerate(cont) if x is a)
        ib = next((i for i, x in enumerate(cont) if x is b), -1)
        if ib <= ia:
            raise ScheduleError(prim, blk, f"loop {second} does not follow {first}")
        if expr_str(a.extent) != expr_str(b.extent):
            raise ScheduleError(
                prim, blk, f"extents differ: {expr_str(a.extent)} vs {expr_str(b.extent)}"
            )
        wa, ra = _accesses(a, a.var)
        between = cont[ia + 1 : ib]
        for st in between:
            if not isinstance(st, Block) or any(isinstance(x, For) for x in walk_stmts(st.body)):
                raise ScheduleError(
                    prim, blk, f"a loop or non-block statement separates {first} and {second}"
                )
            ws = {x.buffer for x in walk_stmts(st.body) if isinstance(x, Store)}
            rs = {ld.buffer for e in _block_exprs(st) for ld in loads(e)}
            if ws & (set(wa) | set(ra)) or rs & set(wa):
                raise ScheduleError(
                    prim, blk, f"block {st.name} between the loops depends on {first}"
                )
        wb, rb = _accesses(b, a.var, rename={b.var: Var(a.var)})
        both = set(wa) & set(wb)
        if both:
            raise ScheduleError(prim, blk, f"both loops write {sorted(both)}")
        back = set(wb) & set(ra)
        if back:
            raise ScheduleError(prim, blk, f"{second} writes {sorted(back)}, which {first} reads")
        reducing = {
            w for x in ast_blocks(a.body) if a.var in _reduce_binding_vars(x) for w in _writes(x)
        }
        if reducing & set(rb):
            raise ScheduleError(
                prim,
                blk,
                f"{second} reads {sorted(reducing & set(rb))}, which {first} is still reducing",
            )
        for buf, idxs in rb.items():
            if buf not in wa:
                continue
            stores = {tuple(expr_str(i) for i in idx) for idx in wa[buf]}
            if len(stores) != 1 or not stores.pop():
                raise ScheduleError(
                    prim, blk, f"{first} writes {buf} at several places or as a scalar"
                )
            want = tuple(expr_str(i) for i in wa[buf][0])
            for idx in idxs:
                if tuple(expr_str(i) for i in idx) != want:
                    raise ScheduleError(
                        prim, blk, f"{second} reads {buf} at another element than {first} writes"
                    )
        _subst_loop_vars(b.body, {b.var: Var(a.var)})
        a.body.extend(b.body)
        del cont[ia + 1 : ib + 1]
        cont[ia:ia] = between  # independent blocks in between now run before the fused loop
        return a.var

    @_primitive
    def reuse_output(self, temp: str, block: str) -> None:
        """Keep local temp ``temp`` in the kernel output that ``block`` writes from it, so
        a row buffer costs no memory of its own and the row is written to the output
        once (softmax: exp values go straight into ``y``, then ``y`` is scaled in
        place).

        Requirements: ``temp`` is a local temp; ``block`` stores one kernel output
        ``O`` (same dtype), which no other block reads or writes, and reads ``temp``
        at one index ``t``; no block after ``block`` accesses ``temp``, and every other
        accessor sits outside ``block``'s loops below their common outer loops, or, if it
        shares a loop that indexes ``temp``, accesses only ``block``'s element; each
        component of ``block``'s ``O`` index (in loop terms) is either a component of
        ``t`` (with ``temp``'s extent equal to ``O``'s there) or an expression of the
        loops enclosing every accessor, which each accessor binds to one of its
        iteration variables; every component of ``t`` that is not a constant 0 over an
        extent-1 axis is used. Then ``temp[s]`` becomes ``O[h(s)]`` at every access,
        with ``h(t) = `` ``block``'s own store index, and ``temp`` is deleted.

        Example, ``reuse_output("T", "D")``::

            parallel for (i, 0, N)                  parallel for (i, 0, N)
              for (k, 0, K)                           for (k, 0, K)
                ScheduleBlock(E)                        ScheduleBlock(E)
                  vi, vk = axis.bind(i, k)                vi, vk = axis.bind(i, k)
                  T[0, vk] = exp(X[vi, vk])     ->        Y[vi, vk] = exp(X[vi, vk])
              for (k2, 0, K)                          for (k2, 0, K)
                ScheduleBlock(D)                        ScheduleBlock(D)
                  vi, vk = axis.bind(i, k2)               vi, vk = axis.bind(i, k2)
                  Y[vi, vk] = T[0, vk] / s[]              Y[vi, vk] = Y[vi, vk] / s[]
        """
        prim = "reuse_output"
        out, users, plan = self._reuse_plan(prim, temp, block)
        self._redirect(prim, temp, out, [x for x, _ in users], plan)
        return None

    def _reuse_plan(
        self, prim: str, temp: str, block: str
    ) -> tuple[str, list[tuple[Block, tuple[For, ...]]], list[int | Expr]]:
        """:meth:`reuse_output`'s checks; returns the output, the blocks accessing ``temp``
        (with their loops) and, per output axis, the temp axis it takes or a row expression."""
        k = self.kernel
        tbuf = next((t for t in k.temps if t.name == temp), None)
        if tbuf is None or tbuf.scope != "local":
            raise ScheduleError(prim, block, f"{temp} is not a local temp buffer")
        b, _, b_loops = self._locate_block(prim, block)
        stores = _stores(b)
        if len(stores) != 1 or stores[0].buffer not in {o.name for o in k.outputs}:
            raise ScheduleError(prim, block, "the block must store exactly one kernel output")
        out = k.buffer(stores[0].buffer)
        if out.dtype != tbuf.dtype:
            raise ScheduleError(prim, block, f"{out.name} and {temp} have different dtypes")
        if self.writers(out.name) != [block] or self.readers(out.name):
            raise ScheduleError(prim, block, f"another block accesses {out.name}")
        t_loads = {tuple(ld.indices) for ld in _loads(b) if ld.buffer == temp}
        if len(t_loads) != 1:
            raise ScheduleError(prim, block, f"it must read {temp} at exactly one index")
        users = [
            (x, lp)
            for x, _, lp in _walk(k.body)
            if isinstance(x, Block) and temp in (_reads(x) | _writes(x))
        ]
        if users[-1][0] is not b:
            raise ScheduleError(prim, block, f"{users[-1][0].name} accesses {temp} after it")
        outer = _common_prefix([lp for _, lp in users])
        mine = {id(f) for f in b_loops[len(outer) :]}
        for x, lp in users[:-1]:
            if mine & {id(f) for f in lp}:
                raise ScheduleError(prim, block, f"{x.name} shares a loop with it below the rows")
        t_idx = [_loop_terms(b, i) for i in next(iter(t_loads))]
        t_vars = set().union(*(free_vars(e) for e in t_idx))
        for x, lp in users[:-1]:
            shared = {f.var for f in lp} & {f.var for f in b_loops}
            if not shared & t_vars:
                continue
            for _, idx in self._accesses(x, temp):
                if len(idx) != len(t_idx) or not all(_eq(a, c) for a, c in zip(idx, t_idx)):
                    raise ScheduleError(
                        prim,
                        block,
                        f"{x.name} shares loop(s) {sorted(shared & t_vars)} with it and "
                        f"accesses {temp} at another element",
                    )
        o_idx = [_loop_terms(b, i) for i in stores[0].indices]
        outer_vars = {f.var for f in outer}
        plan: list[int | Expr] = []  # per O axis: the temp axis it takes, or a row expression
        for i, oe in enumerate(o_idx):
            j = next(
                (j for j, te in enumerate(t_idx) if not isinstance(te, Const) and _eq(te, oe)),
                None,
            )
            if j is not None:
                if not _eq(tbuf.shape[j], out.shape[i]):
                    raise ScheduleError(
                        prim, block, f"{temp} axis {j} and {out.name} axis {i} differ"
                    )
                plan.append(j)
            elif free_vars(oe) <= outer_vars | set(k.dims):
                plan.append(oe)
            else:
                raise ScheduleError(prim, block, f"{out.name} index {expr_str(oe)} has no match")
        used = {p for p in plan if isinstance(p, int)}
        for j, te in enumerate(t_idx):
            if j not in used and not (_eq(te, Const(0)) and _eq(tbuf.shape[j], Const(1))):
                raise ScheduleError(prim, block, f"{temp} axis {j} does not reach {out.name}")
        return out.name, users, plan

    def _redirect(
        self, prim: str, temp: str, out: str, users: list[Block], plan: list[int | Expr]
    ) -> None:
        """Replace every access ``temp[s]`` in ``users`` by ``out[h(s)]``: ``plan`` maps each
        ``out`` axis to a ``temp`` axis or to a row expression, which each block reads
        through the iteration variable it binds to that expression."""
        for x in users:
            row: dict[str, Expr] = {}
            for p in plan:
                if isinstance(p, int):
                    continue
                iv = next((iv for iv, bd in zip(x.iter_vars, x.bindings) if _eq(bd, p)), None)
                if iv is None:
                    raise ScheduleError(
                        prim, x.name, f"no iteration variable is bound to {expr_str(p)}"
                    )
                row[expr_str(p)] = Var(iv.name)
            _retarget(x, temp, out, plan, row)
        self.kernel.temps = [t for t in self.kernel.temps if t.name != temp]

    @_primitive
    def prefetch_next(
        self,
        loop: str,
        buffer: str,
        at_start: bool = False,
        spread: str | None = None,
        level: int = 1,
        distance: int = 1,
    ) -> str:
        """Prefetch, during each iteration of ``loop``, the slab of input ``buffer`` that the
        iteration ``distance`` ahead reads (1: the next one), one cache line at a time, to
        cache ``level`` (see :class:`~geode.codegen.ast.Prefetch`). Where:

        * by default, in one burst right after the first loop in ``loop``'s body (the
          first pass over a row has brought the current slab in; the hint overlaps
          fetching the next one with the remaining passes' arithmetic);
        * with ``at_start``, in one burst at the top of the body (a single pass: an
          elementwise row);
        * with ``spread``, a serial loop directly in ``loop``'s body (a pass, such as
          the chunk loop of a streamed output), spread over its iterations: each fetches
          its share of the slab's lines at the end of its body, so the fetches overlap
          that pass's stores instead of queueing up in one burst (the last iteration may
          run up to ``spread``'s extent lines past the slab: harmless).

        Returns the new prefetch loop's variable.

        Requirements: ``buffer`` is a kernel input read inside ``loop``; every such read
        indexes it as ``buffer[f(v), ..., g...]``: a non-empty leading part that depends
        only on ``loop``'s variable ``v`` (and dims), the same in every read, then trailing
        components that do not depend on ``v``; ``loop``'s body holds a loop; ``level``
        is 1 or 2; ``distance`` is an int >= 1; ``spread`` (not with ``at_start``) is a
        serial loop directly in ``loop``'s body whose extent depends on dims only.

        Example, ``prefetch_next("i", "X")`` with ``X: float32[N, 4096]``::

            parallel for (i, 0, N)                 parallel for (i, 0, N)
              for (k, 0, 4096)                       for (k, 0, 4096)
                ScheduleBlock(M) ...     ->            ScheduleBlock(M) ...
              for (k2, 0, 4096)                      if (i + 1 < N)
                ScheduleBlock(E) ...                   serial for (i_pf, 0, 256)
                                                         prefetch(X, (i + 1) * 4096 + i_pf * 16)
                                                     for (k2, 0, 4096)
                                                       ScheduleBlock(E) ...

        and ``prefetch_next("i", "X", spread="c", level=2)`` on a chunked last pass::

            parallel for (i, 0, N)                 parallel for (i, 0, N)
              for (k, 0, 4096)                       for (k, 0, 4096)
                ScheduleBlock(M) ...                   ScheduleBlock(M) ...
              for (c, 0, 8)              ->          for (c, 0, 8)
                for (k2, 0, 512)                       for (k2, 0, 512)
                  ScheduleBlock(E) ...                   ScheduleBlock(E) ...
                                                       if (i + 1 < N)
                                                         serial for (i_pf, 0, 32)
                                                           prefetch(X, (i + 1) * 4096
                                                             + (c * 32 + i_pf) * 16, L2)
        """
        prim = "prefetch_next"
        f, _, _ = self._locate_loop(prim, loop)
        blk = self._first_block(f)
        k = self.kernel
        if level not in (1, 2):
            raise ScheduleError(prim, blk, f"cache level {level!r} is not 1 or 2")
        if isinstance(distance, bool) or not isinstance(distance, int) or distance < 1:
            raise ScheduleError(prim, blk, f"distance {distance!r} is not an int >= 1")
        if buffer not in {b.name for b in k.inputs}:
            raise ScheduleError(prim, blk, f"{buffer} is not a kernel input")
        buf = k.buffer(buffer)
        lead, idx0 = self._row_lead(prim, blk, f, buf)
        pos = next((i for i, x in enumerate(f.body) if isinstance(x, For)), None)
        if pos is None:
            raise ScheduleError(prim, blk, f"loop {loop} holds no pass to prefetch behind")
        ahead = add(Var(f.var), Const(distance))
        nxt = {f.var: ahead}
        base: Expr = Const(0)
        for i in range(len(buf.shape)):
            comp = substitute(idx0[i], nxt) if i < lead else Const(0)
            base = add(mul(base, buf.shape[i]), comp)
        line = max(1, 64 // np.dtype(buf.dtype).itemsize)
        row = prod(list(buf.shape[lead:])) if lead < len(buf.shape) else Const(1)
        lines = floordiv(add(row, Const(line - 1)), Const(line))
        var = self._fresh(f"{f.var}_pf")
        first: Expr = Const(0)
        if spread is not None:
            host = self._spread_loop(prim, blk, f, spread, at_start)
            lines = floordiv(add(lines, sub(host.extent, Const(1))), host.extent)
            first = mul(Var(host.var), lines)
        pf = Prefetch(buffer, add(base, mul(add(first, Var(var)), Const(line))), level)
        guard = If(Bin("<", ahead, f.extent), [For(var, lines, [pf])])
        if spread is not None:
            host.body.append(guard)
        else:
            f.body.insert(0 if at_start else pos + 1, guard)
        return var

    def reads_rows(self, loop: str, buffer: str) -> bool:
        """Does each iteration of ``loop`` read its own slab of input ``buffer``, so that
        :meth:`prefetch_next` may fetch it ahead? (A query: nothing is changed or traced;
        raises :class:`ScheduleError` when there is no loop ``loop``.)"""
        f, _, _ = self._locate_loop("reads_rows", loop)
        if buffer not in {b.name for b in self.kernel.inputs}:
            return False
        try:
            self._row_lead("reads_rows", self._first_block(f), f, self.kernel.buffer(buffer))
        except ScheduleError:
            return False
        return True

    def _row_lead(self, prim: str, blk: str, f: For, buf: Buffer) -> tuple[int, tuple[Expr, ...]]:
        """How many leading indices of ``buf``'s reads inside ``f`` depend on ``f``'s
        variable (checked: the same in every read, over dims and that variable only,
        and the trailing indices free of it), and the first read's indices."""
        _, reads = _accesses(f, f.var)
        idxs = reads.get(buf.name, [])
        if not idxs:
            raise ScheduleError(prim, blk, f"{buf.name} is not read inside loop {f.var}")
        lead = 0
        while lead < len(buf.shape) and f.var in free_vars(idxs[0][lead]):
            lead += 1
        if lead == 0:
            raise ScheduleError(prim, blk, f"{buf.name}'s first index does not depend on {f.var}")
        allowed = {f.var} | set(self.kernel.dims)
        for idx in idxs:
            if any(
                not free_vars(e) <= allowed or not _eq(e, idxs[0][i])
                for i, e in enumerate(idx[:lead])
            ):
                raise ScheduleError(prim, blk, f"{buf.name} is read at different rows of {f.var}")
            if any(f.var in free_vars(e) for e in idx[lead:]):
                raise ScheduleError(prim, blk, f"{buf.name}'s trailing indices depend on {f.var}")
        return lead, tuple(idxs[0])

    def _spread_loop(self, prim: str, blk: str, f: For, spread: str, at_start: bool) -> For:
        """The serial pass ``spread`` of ``f``'s body that a prefetch is spread over."""
        if at_start:
            raise ScheduleError(prim, blk, "spread and at_start exclude each other")
        host = next((s for s in f.body if isinstance(s, For) and s.var == spread), None)
        if host is None:
            raise ScheduleError(prim, blk, f"{spread} is not a loop directly in {f.var}'s body")
        if host.kind is not ForKind.SERIAL:
            raise ScheduleError(prim, blk, f"loop {spread} is {host.kind.value}, not serial")
        if not free_vars(host.extent) <= set(self.kernel.dims):
            raise ScheduleError(prim, blk, f"loop {spread}'s extent is not over dims only")
        return host

    @_primitive
    def stream_output(self, block: str, chunk: int = 512, min_bytes: int = 0) -> list[str]:
        """Write ``block``'s kernel output ``O`` with streaming (non-temporal) stores: the
        innermost loop ``L`` around ``block`` is split into chunks of ``chunk`` elements,
        ``block`` stores each chunk into a small local staging buffer ``O_stage``, and a
        ``StreamStore`` after the chunk copies it to ``O``. The copy uses non-temporal
        stores when ``O`` holds at least ``min_bytes`` bytes and every chunk starts on a
        cache line of ``O`` (:data:`LINE_BYTES`; each term of the chunk's offset is a
        multiple of it; run-time tests when ``O``'s shape is symbolic; a chunk starting
        mid-line would share that line with the previous chunk's plain stores, which
        fetch it): a streamed line is never read from memory before it is
        overwritten (an ordinary store first fetches it: 1.5x the traffic of a copy) and
        does not evict useful lines, which pays for outputs larger than the caches.
        Returns the chunk loop and the element loop. Apply it last: afterwards ``O`` is
        written by the ``StreamStore``, not by a block.

        Requirements: ``block`` is a flat block without predicate whose body is one
        store to ``O``; no other block reads or writes ``O``; ``block`` sits directly in
        a serial or vectorized loop ``L`` holding only flat blocks; in loop terms the
        store's last index is ``L``'s variable plus terms free of it and the other
        indices are free of it (consecutive iterations write consecutive elements);
        ``chunk`` is a positive int; ``O`` is not known to be smaller than ``min_bytes``.

        Example, ``stream_output("E", chunk=512)`` with ``Y: float32[N, 4096]``::

            parallel for (i, 0, N)                parallel for (i, 0, N)
              vectorized for (j, 0, 4096)           serial for (j_0, 0, 8)
                ScheduleBlock(E)                      vectorized for (j_1, 0, 512)
                  vi, vj = axis.bind(i, j)    ->        ScheduleBlock(E)
                  Y[vi, vj] = exp(X[vi, vj])              vi, vj, vj_s = axis.bind(i, j_0 * 512 + j_1, j_1)
                                                          Y_stage[vj_s] = exp(X[vi, vj])
                                                      stream(Y[i * 4096 + j_0 * 512 +: 512]
                                                             = Y_stage[0 +: 512], nontemporal=...)
        """
        prim = "stream_output"
        k = self.kernel
        b, cont, loops = self._locate_block(prim, block)
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
            raise ScheduleError(prim, block, f"chunk {chunk!r} is not a positive int")
        chunk = int(chunk)
        st, out = self._output_store(prim, b)
        if self.writers(out.name) != [block] or self.readers(out.name):
            raise ScheduleError(prim, block, f"another block accesses {out.name}")
        if not loops or cont is not loops[-1].body:
            raise ScheduleError(prim, block, "the block must sit directly in a loop")
        f = loops[-1]
        if f.kind not in (ForKind.SERIAL, ForKind.VECTORIZED):
            raise ScheduleError(prim, block, f"loop {f.var} is {f.kind.value}")
        if not all(_flat_block(x) for x in f.body):
            raise ScheduleError(prim, block, f"loop {f.var} holds more than flat blocks")
        idx = self._consecutive_store(prim, b, st, out, f)
        start = mul(Var(f.var), Const(chunk))  # the chunk loop's variable, renamed below
        offset: Expr = Const(0)
        for i, e in enumerate(idx):
            comp = substitute(e, {f.var: start}) if i == len(idx) - 1 else e
            offset = add(mul(offset, out.shape[i]), comp)
        nontemporal = self._streaming_flag(prim, block, out, offset, min_bytes)
        kind = f.kind
        extent = f.extent
        names = self.split(f.var, [None, chunk])
        outer, inner = self._locate_loop(prim, names[0])[0], self._locate_loop(prim, names[1])[0]
        inner.kind = kind
        start = mul(Var(names[0]), Const(chunk))
        offset = substitute(offset, {f.var: Var(names[0])})
        if isinstance(extent, Const) and int(extent.value) % chunk == 0:
            length: Expr = Const(chunk)
        else:
            length = Bin("min", Const(chunk), sub(extent, start))
        stage = self._fresh(f"{out.name}_stage", kind="buffer")
        k.temps.append(Buffer(stage, out.dtype, (Const(chunk),), "local"))
        iv = self._fresh(f"{b.iter_vars[-1].name}_s" if b.iter_vars else "v_s")
        b.iter_vars.append(IterVar(iv, Const(chunk)))
        b.bindings.append(Var(names[1]))
        st.buffer, st.indices = stage, (Var(iv),)
        outer.body.append(StreamStore(out.name, offset, stage, Const(0), length, nontemporal))
        self._ctx().simplify_bindings([outer])
        return names

    def _output_store(self, prim: str, b: Block) -> tuple[Store, Buffer]:
        """The one store of flat block ``b`` (no predicate), to a kernel output, not yet
        non-temporal, and that output: :meth:`stream_output`'s and
        :meth:`store_nontemporal`'s checks of the block."""
        if not _flat_block(b) or b.predicate is not None:
            raise ScheduleError(prim, b.name, "the block must be flat and have no predicate")
        if len(b.body) != 1 or not isinstance(b.body[0], Store):
            raise ScheduleError(prim, b.name, "the block body must be a single store")
        st = b.body[0]
        if st.nontemporal is not None:
            raise ScheduleError(prim, b.name, f"the store to {st.buffer} is already non-temporal")
        if st.buffer not in {o.name for o in self.kernel.outputs}:
            raise ScheduleError(prim, b.name, f"{st.buffer} is not a kernel output")
        return st, self.kernel.buffer(st.buffer)

    def _consecutive_store(self, prim: str, b: Block, st: Store, out: Buffer, f: For) -> list[Expr]:
        """The indices of ``b``'s store ``st`` to ``out`` in loop terms, checked to write
        consecutive elements in consecutive iterations of loop ``f``: the last index is
        ``f``'s variable plus terms free of it, the others are free of it."""
        idx = [_loop_terms(b, i) for i in st.indices]
        if not idx:
            raise ScheduleError(prim, b.name, f"{out.name} is a scalar")
        rest = _diff(idx[-1], Var(f.var))
        if (
            any(f.var in free_vars(e) for e in idx[:-1])
            or rest is None
            or sympy.Symbol(f.var, integer=True, nonnegative=True) in rest.free_symbols
        ):
            raise ScheduleError(
                prim, b.name, f"{out.name} is not written at consecutive elements along {f.var}"
            )
        return idx

    def _streaming_flag(
        self, prim: str, block: str, out: Buffer, offset: Expr, min_bytes: int
    ) -> Expr:
        """When a stream into ``out`` starting at element ``offset`` may use
        non-temporal stores: ``out`` holds at least ``min_bytes`` bytes (raises
        ScheduleError when it is known not to) and ``offset`` starts a cache line."""
        itemsize = np.dtype(out.dtype).itemsize
        size = mul(prod(list(out.shape)), Const(itemsize))
        if isinstance(size, Const):
            if int(size.value) < min_bytes:
                raise ScheduleError(
                    prim, block, f"{out.name} holds {size.value} bytes < min_bytes {min_bytes}"
                )
            big: Expr = Const(True, "bool")
        elif min_bytes <= 0:
            big = Const(True, "bool")
        else:
            big = Bin(">=", size, Const(int(min_bytes)))
        return and_flags(big, line_aligned(offset, itemsize, set(self.kernel.dims)))

    @_primitive
    def stream_row(
        self, block: str, loop: str, min_bytes: int = 0, spread: str | None = None
    ) -> str:
        """Write the row of kernel output ``O`` that ``block`` produces in each iteration of
        ``loop`` into a local row buffer ``O_row`` instead, copy that buffer to ``O`` with
        a ``StreamStore`` right after the pass ``P`` (the loop in ``loop``'s body) holding
        ``block``, and let the later passes of the row that read ``O`` read ``O_row``.
        The output is then written once, with non-temporal stores under the conditions
        of :meth:`stream_output` (``O`` holds at least ``min_bytes`` bytes, each row starts
        on a cache line), while the row's readers find it in the L1: the output of a
        split chain (the LSTM cell's ``c'``, which ``h = sigmoid(o) * tanh(c')`` reads)
        streams without a staging copy per chunk, and the stores no longer fetch the
        output's lines from memory. With ``spread``, a serial loop of ``loop``'s body
        after ``P`` of static extent ``n``, the copy is cut in ``n`` equal parts instead,
        one at the end of each of its iterations, so the stores overlap that pass's
        arithmetic rather than stalling in one burst. Returns ``O_row``.

        Requirements: ``block`` is a flat block without predicate or reduce iteration
        variables whose body is one store to ``O``, at its own distinct iteration
        variables with ``O``'s extents (it writes every element of ``O`` once), and no
        other block writes ``O`` or streams into it; ``loop`` is a serial or parallel loop
        around ``block``, and ``block`` sits inside a loop ``P`` of ``loop``'s body whose
        loops (down to ``block``) have extents over dims only; in loop terms the store's
        index is a leading part over ``loop``'s variable and dims (the row, at least one
        component) and a trailing part over the loops inside ``loop`` and dims (at least
        one component); every block that reads ``O`` sits in a statement of ``loop``'s
        body after ``P`` and reads it at the same row; ``spread`` (if given) is a serial
        loop directly in ``loop``'s body after ``P`` whose static extent divides the row's
        static length. Each iteration of ``loop`` then writes its whole row before any
        read of it.

        Example, ``stream_row("C", "i")`` with ``Cn: float32[N, 1024]``::

            parallel for (i, 0, N)                 parallel for (i, 0, N)
              for (j, 0, 1024)                       for (j, 0, 1024)
                ScheduleBlock(C)                       ScheduleBlock(C)
                  vi, vj = axis.bind(i, j)               vi, vj = axis.bind(i, j)
                  Cn[vi, vj] = f(X[vi, vj])   ->          Cn_row[vj] = f(X[vi, vj])
              for (j2, 0, 1024)                      stream(Cn[i * 1024 +: 1024]
                ScheduleBlock(H)                            = Cn_row[0 +: 1024], nontemporal=...)
                  vi, vj = axis.bind(i, j2)          for (j2, 0, 1024)
                  Y[vi, vj] = g(Cn[vi, vj])            ScheduleBlock(H)
                                                         vi, vj = axis.bind(i, j2)
                                                         Y[vi, vj] = g(Cn_row[vj])

        and ``stream_row("C", "i", spread="j2_0")`` once the second pass is cut in 16
        chunks (``split("j2", [None, 64])``)::

            parallel for (i, 0, N)
              for (j, 0, 1024)
                ScheduleBlock(C) ... Cn_row[vj] = f(X[vi, vj])
              serial for (j2_0, 0, 16)
                vectorized for (j2_1, 0, 64)
                  ScheduleBlock(H) ... Y[vi, vj] = g(Cn_row[vj])
                stream(Cn[i * 1024 + j2_0 * 64 +: 64] = Cn_row[j2_0 * 64 +: 64], nontemporal=...)
        """
        prim = "stream_row"
        k = self.kernel
        b, _, loops = self._locate_block(prim, block)
        st, out = self._row_store(prim, b)
        f, host = self._row_host(prim, b, loops, loop)
        lead = self._row_lead_of_store(prim, b, st, f, loops)
        row_idx = [_loop_terms(b, i) for i in st.indices[:lead]]
        trail = out.shape[lead:]
        for x in self.readers(out.name):
            self._check_row_reader(prim, block, x, out.name, row_idx, f, host)
        length = prod(list(trail))
        offset = _flatten([*row_idx, *[Const(0)] * len(trail)], out.shape)
        at, start, part = f.body, Const(0), length
        if spread is not None:
            n, spread_loop = self._row_parts(prim, block, f, host, spread, length)
            at, start, part = spread_loop.body, mul(Var(spread), Const(n)), Const(n)
        flag = self._streaming_flag(prim, block, out, add(offset, start), min_bytes)
        row = self._fresh(f"{out.name}_row", kind="buffer")
        k.temps.append(Buffer(row, out.dtype, (length,), "local"))

        def repl(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == out.name:
                return Load(row, (_flatten(e.indices[lead:], trail),))
            return None

        for name in self.readers(out.name):
            for s in walk_stmts([self.get_block(name)]):
                _map_stmt_exprs(s, lambda e: transform(e, repl))
        st.buffer, st.indices = row, (_flatten(st.indices[lead:], trail),)
        ss = StreamStore(out.name, add(offset, start), row, start, part, flag)
        if spread is None:
            f.body.insert(next(i for i, s in enumerate(f.body) if s is host) + 1, ss)
        else:
            at.append(ss)
        return row

    @_primitive
    def store_nontemporal(self, block: str, min_bytes: int = 0) -> str:
        """Write ``block``'s kernel output ``O`` with non-temporal (streaming) stores
        straight from the vector registers: unlike :meth:`stream_output`, no staging
        buffer, so an element costs no store and load in the L1 on its way; like it, a
        streamed line is not read from memory before it is overwritten and does not
        evict useful lines. Returns the loop ``L`` the backend versions for it.

        The store's ``nontemporal`` flag holds when ``O`` holds at least ``min_bytes``
        bytes and every run of ``L`` starts on a cache line of ``O`` (each term of the
        start's offset is a multiple of :data:`LINE_BYTES`; tested at run time when
        ``O``'s shape is symbolic). The backend prints a second body of the kernel with
        streaming stores and runs it where the flag holds and ``O``'s array starts on a
        vector boundary (checked at run time, so a misaligned array takes the plain
        body); LLVM's loop vectorizer then stores whole vectors of ``L``, each starting on
        a vector boundary (see the backend's "Chunked kernels"). Apply it last, like
        :meth:`stream_output`: it is meant for outputs that no pass of the kernel reads
        (the LSTM cell's ``h``), written by arithmetic costly enough that a staging
        buffer's copy shows.

        Requirements: ``block`` is a flat block without predicate whose body is one
        store, not yet non-temporal, to ``O`` of dtype float32 or float64; no other
        statement reads or writes ``O``; ``block`` sits directly in a vectorized loop
        ``L``; in loop terms the store's last index is ``L``'s variable plus terms free
        of it and the other indices are free of it (consecutive iterations write
        consecutive elements); ``O`` is not known to be smaller than ``min_bytes`` and
        its runs are not known to start off the cache lines.

        Example, ``store_nontemporal("H")`` with ``Y: float32[N, 1024]``::

            parallel for (i, 0, N)                      parallel for (i, 0, N)
              serial for (j_0, 0, 16)                     serial for (j_0, 0, 16)
                vectorized for (j_1, 0, 64)       ->        vectorized for (j_1, 0, 64)
                  ScheduleBlock(H)                            ScheduleBlock(H)
                    vi, vj = axis.bind(i, j_0 * 64 + j_1)       vi, vj = axis.bind(...)
                    Y[vi, vj] = g(X[vi, vj])                    Y[vi, vj] = g(X[vi, vj]), nontemporal=true
        """
        prim = "store_nontemporal"
        k = self.kernel
        b, cont, loops = self._locate_block(prim, block)
        st, out = self._output_store(prim, b)
        if out.dtype not in ("float32", "float64"):
            raise ScheduleError(prim, block, f"{out.name} is {out.dtype}, not float32 or float64")
        streams = (s for s in walk_stmts(k.body) if isinstance(s, StreamStore))
        if (
            self.writers(out.name) != [block]
            or self.readers(out.name)
            or any(out.name in _accessed(s) for s in streams)
        ):
            raise ScheduleError(prim, block, f"another statement accesses {out.name}")
        if not loops or cont is not loops[-1].body:
            raise ScheduleError(prim, block, "the block must sit directly in a loop")
        f = loops[-1]
        if f.kind is not ForKind.VECTORIZED:
            raise ScheduleError(prim, block, f"loop {f.var} is {f.kind.value}, not vectorized")
        idx = self._consecutive_store(prim, b, st, out, f)
        start = substitute(_flatten(idx, out.shape), {f.var: Const(0)})
        flag = self._streaming_flag(prim, block, out, start, min_bytes)
        if flag == Const(False, "bool"):
            raise ScheduleError(
                prim, block, f"the runs of {f.var} never start a line of {out.name}"
            )
        st.nontemporal = flag
        return f.var

    def _row_parts(
        self, prim: str, block: str, f: For, host: For, spread: str, length: Expr
    ) -> tuple[int, For]:
        """:meth:`stream_row`'s spread loop (checked: serial, directly in ``f``'s body
        after ``host``, a static extent that divides the static row ``length``) and the
        elements of the row each of its iterations copies."""
        pos = {id(s): i for i, s in enumerate(f.body)}
        loop = next((s for s in f.body if isinstance(s, For) and s.var == spread), None)
        if loop is None or pos[id(loop)] <= pos[id(host)]:
            raise ScheduleError(
                prim, block, f"{spread} is not a loop of {f.var} after the row's pass"
            )
        if loop.kind is not ForKind.SERIAL:
            raise ScheduleError(prim, block, f"loop {spread} is {loop.kind.value}, not serial")
        n, total = loop.extent, length
        if (
            not (isinstance(n, Const) and isinstance(total, Const))
            or int(n.value) < 1
            or int(total.value) % int(n.value)
        ):
            raise ScheduleError(
                prim, block, f"loop {spread}'s extent does not divide the row statically"
            )
        return int(total.value) // int(n.value), loop

    def _row_store(self, prim: str, b: Block) -> tuple[Store, Buffer]:
        """:meth:`stream_row`'s checks of the block: its one store, to an output it alone
        writes, at its own iteration variables over the output's whole extent."""
        k = self.kernel
        if not _flat_block(b) or b.predicate is not None or _is_reduce(b):
            raise ScheduleError(prim, b.name, "the block must be flat, spatial, without predicate")
        st, out = self._output_store(prim, b)
        if self.writers(out.name) != [b.name] or any(
            isinstance(s, StreamStore) and s.buffer == out.name for s in walk_stmts(k.body)
        ):
            raise ScheduleError(prim, b.name, f"another statement writes {out.name}")
        ivs = {iv.name: iv for iv in b.iter_vars}
        names = [i.name if isinstance(i, Var) else None for i in st.indices]
        if (
            len(names) != len(out.shape)
            or None in names
            or len(set(names)) != len(names)
            or any(n not in ivs or not _eq(ivs[n].extent, d) for n, d in zip(names, out.shape))
        ):
            raise ScheduleError(
                prim, b.name, f"{out.name} is not stored at the block's own variables"
            )
        return st, out

    def _row_host(self, prim: str, b: Block, loops: tuple[For, ...], loop: str) -> tuple[For, For]:
        """:meth:`stream_row`'s row loop ``loop`` around ``b`` and the pass in its body
        holding ``b`` (checked: the row loop is serial or parallel, the pass's loops
        down to ``b`` have extents over dims only)."""
        at = next((i for i, x in enumerate(loops) if x.var == loop), None)
        if at is None:
            raise ScheduleError(prim, b.name, f"loop {loop} does not enclose the block")
        f = loops[at]
        if f.kind not in (ForKind.SERIAL, ForKind.PARALLEL):
            raise ScheduleError(prim, b.name, f"loop {loop} is {f.kind.value}")
        if at + 1 == len(loops) or not any(s is loops[at + 1] for s in f.body):
            raise ScheduleError(prim, b.name, f"the block is not in a loop of {loop}'s body")
        dims = set(self.kernel.dims)
        for x in loops[at + 1 :]:
            if not free_vars(x.extent) <= dims:
                raise ScheduleError(prim, b.name, f"loop {x.var}'s extent is not over dims only")
        return f, loops[at + 1]

    def _row_lead_of_store(
        self, prim: str, b: Block, st: Store, f: For, loops: tuple[For, ...]
    ) -> int:
        """How many leading components of ``st``'s index (in loop terms) select the row:
        up to the last that uses ``f``'s variable or an outer loop's, they use ``f``'s
        variable and dims only; the rest use the loops inside ``f`` and dims only
        (checked, both parts non-empty)."""
        at = next(i for i, x in enumerate(loops) if x is f)
        outer = {x.var for x in loops[: at + 1]}
        inner = {x.var for x in loops[at + 1 :]}
        dims = set(self.kernel.dims)
        idx = [_loop_terms(b, i) for i in st.indices]
        lead = 1 + max((i for i, e in enumerate(idx) if free_vars(e) & outer), default=-1)
        if lead == 0 or lead == len(idx):
            raise ScheduleError(
                prim, b.name, f"the store does not split into a row of {f.var} and its elements"
            )
        for e in idx[:lead]:
            if not free_vars(e) <= dims | {f.var}:
                raise ScheduleError(prim, b.name, f"row index {expr_str(e)} is not over {f.var}")
        for e in idx[lead:]:
            if not free_vars(e) <= dims | inner:
                raise ScheduleError(
                    prim, b.name, f"element index {expr_str(e)} is not over the loops in {f.var}"
                )
        return lead

    def _check_row_reader(
        self, prim: str, block: str, name: str, out: str, row: list[Expr], f: For, host: For
    ) -> None:
        """:meth:`stream_row`'s check of a reader of the row: it sits in a statement of
        ``f``'s body after ``host`` and reads ``out`` only at row ``row``."""
        x = self.get_block(name)
        pos = next((i for i, s in enumerate(f.body) if any(y is x for y in ast_blocks([s]))), None)
        if pos is None:
            raise ScheduleError(prim, block, f"{name} reads {out} outside loop {f.var}")
        if pos <= next(i for i, s in enumerate(f.body) if s is host):
            raise ScheduleError(prim, block, f"{name} reads {out} before the row is written")
        for _, idx in self._accesses(x, out):
            if not all(_eq(a, c) for a, c in zip(idx, row)):
                raise ScheduleError(prim, block, f"{name} reads {out} off the row")

    @_primitive
    def software_pipeline(
        self, loop: str, chunk: int = 64, min_chunks: int = 8, into: str | None = None
    ) -> list[str]:
        """Overlap each iteration's first pass with a later pass of the previous iteration:
        while row ``i``'s pass ``into`` (default: the last pass) runs, the same loop
        computes row ``i + 1``'s first pass, so the memory traffic of reading the next row
        (the first pass) overlaps the host pass's writes and arithmetic instead of
        alternating with them.
        ``loop`` (extent ``n``) is split into chunks of ``c = max(1, min(chunk, n //
        min_chunks))`` rows, run like ``loop`` (parallel if it was); each chunk runs its
        first row's first pass as a prologue. Returns the chunk loop and the row loop.

        Requirements: ``loop`` is serial or parallel; its body is loop-free blocks (the
        *head*, initialising the first pass), a loop ``F`` (the first pass), any
        statements, and last a loop; the host pass ``L`` (loop ``into``, or that last
        loop) is a loop of the body after ``F`` with the same extent as ``F``, which does not depend
        on the row; ``F`` and ``L`` hold only loop-free blocks; neither is parallel, and
        ``L`` is vectorized only if ``F`` is (its reductions were accepted for that); the
        head and ``F`` write only registers (0-d temps) and read only kernel inputs and
        the registers they write, each one set earlier in the same row (nothing is
        carried from row to row); nothing after ``F`` writes those registers.

        Those registers, where read after ``F``, are read from a copy taken at the top of
        the row (``<reg>_cur``), since the next row's first pass overwrites them during
        ``L`` (the next row's initialisation moves just before ``L``). In the last row of
        a chunk the "next" row is the row itself (a re-read from cache, the value unused).

        Example, ``software_pipeline("i", 64)`` on RMSNorm (``X: float32[N, K]``)::

            parallel for (i, 0, N)               parallel for (i_o, 0, (N + c - 1) // c)
              ScheduleBlock(S_init)                ScheduleBlock(S_init_pro) ... row i_o * c
                s[] = 0.0f                         serial for (k_pro, 0, K)
              serial for (k, 0, K)                   ScheduleBlock(S_pro) ... row i_o * c
                ScheduleBlock(S)                   serial for (i_i, 0, min(c, N - i_o * c))
                  s[] = s[] + X[i, k] ^ 2            ScheduleBlock(s_cur)
              serial for (k2, 0, K)       ->          s_cur[] = s[]
                ScheduleBlock(Y)                     ScheduleBlock(S_init) ... row i'
                  Y[i, k2] = X[i, k2] * f(s[])         s[] = 0.0f
                                                     serial for (k2, 0, K)
                                                       ScheduleBlock(Y) ... row i
                                                         Y[i, k2] = X[i, k2] * f(s_cur[])
                                                       ScheduleBlock(S) ... row i'
                                                         s[] = s[] + X[i', k2] ^ 2

        with ``c`` the chunk, ``i = i_o * c + i_i`` and
        ``i' = i_o * c + min(i_i + 1, min(c, N - i_o * c) - 1)``.
        """
        prim = "software_pipeline"
        f, cont, head, first, rest, host, regs = self._pipeline_plan(
            prim, loop, chunk, min_chunks, into
        )
        last = rest[host]
        assert isinstance(last, For)
        k = self.kernel
        rest_blocks = ast_blocks(rest)
        head_blocks = head + list(first.body)
        rc = self._row_chunks(f, chunk, min_chunks)
        vo, vi, start, ext, row = rc.vo, rc.vi, rc.start, rc.ext, rc.row
        nxt = add(start, Bin("min", add(Var(vi), Const(1)), sub(ext, Const(1))))
        used_regs = {ld.buffer for b in rest_blocks for e in _block_exprs(b) for ld in loads(e)}
        cur: dict[str, str] = {}
        copies: list[Stmt] = []
        taken: set[str] = set()
        for r in sorted(regs & used_regs):
            cur[r] = self._fresh(f"{r}_cur", kind="buffer")
            k.temps.append(Buffer(cur[r], k.buffer(r).dtype, (), "register"))
            copies.append(
                Block(
                    self._fresh(cur[r], taken, kind="block"),
                    [],
                    [],
                    [Store(cur[r], (), Load(r, ()))],
                )
            )
        names: dict[str, str] = {
            b.name: self._fresh(f"{b.name}_pro", taken, kind="block") for b in head_blocks
        }
        pro_var = self._fresh(f"{first.var}_pro", taken)
        prologue = copy.deepcopy(head + [first])
        for b in ast_blocks(prologue):
            b.name = names[b.name]
            if b.reduce_of is not None:
                b.reduce_of = names.get(b.reduce_of, b.reduce_of)
        prologue[-1].var = pro_var  # type: ignore[attr-defined]
        _subst_loop_vars(prologue, {f.var: start, first.var: Var(pro_var)})
        _subst_loop_vars(rest, {f.var: row})
        for b in rest_blocks:
            _map_block_exprs(b, lambda e: _rename_loads(e, cur))
        _subst_loop_vars(head, {f.var: nxt})
        _subst_loop_vars(first.body, {f.var: nxt, first.var: Var(last.var)})
        last.body.extend(first.body)
        inner = For(vi, ext, copies + rest[:host] + head + rest[host:], ForKind.SERIAL)
        outer = For(vo, rc.count, prologue + [inner], f.kind)
        cont[next(i for i, x in enumerate(cont) if x is f)] = outer
        return [vo, vi]

    def _row_chunks(self, f: For, chunk: int, min_chunks: int) -> _RowChunks:
        """Cut row loop ``f`` into chunks of at most ``chunk`` rows and at least
        ``min_chunks`` chunks (when there are that many rows), with fresh loop names."""
        n = f.extent
        c: Expr = (
            Const(max(1, min(chunk, int(n.value) // min_chunks)))
            if isinstance(n, Const)
            else Bin("max", Const(1), Bin("min", Const(chunk), floordiv(n, Const(min_chunks))))
        )
        vo, vi = self._fresh(f"{f.var}_o"), self._fresh(f"{f.var}_i")
        start = mul(Var(vo), c)
        count = floordiv(add(n, sub(c, Const(1))), c)
        return _RowChunks(
            c, vo, vi, count, start, Bin("min", c, sub(n, start)), add(start, Var(vi))
        )

    def _pipeline_plan(
        self, prim: str, loop: str, chunk: int, min_chunks: int, into: str | None
    ) -> tuple[For, list[Stmt], list[Stmt], For, list[Stmt], int, set[str]]:
        """:meth:`software_pipeline`'s checks; returns the row loop, the list holding it, the
        head, the first pass, the statements after it, the host's index among them and the
        registers the head and first pass write."""
        f, cont, _ = self._locate_loop(prim, loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.PARALLEL):
            raise ScheduleError(prim, blk, f"loop {loop} is {f.kind.value}")
        if chunk < 1 or min_chunks < 1:
            raise ScheduleError(prim, blk, "chunk and min_chunks must be positive")
        pos = next((i for i, x in enumerate(f.body) if isinstance(x, For)), None)
        if pos is None:
            raise ScheduleError(prim, blk, f"loop {loop} holds no pass")
        head, first, rest = f.body[:pos], f.body[pos], f.body[pos + 1 :]
        host = next(
            (
                i
                for i, x in enumerate(rest)
                if isinstance(x, For) and (x.var == into or (into is None and i == len(rest) - 1))
            ),
            -1,
        )
        if host < 0:
            why = (
                f"loop {loop} does not end with a pass"
                if into is None
                else f"no pass {into!r} follows the first pass in loop {loop}"
            )
            raise ScheduleError(prim, blk, why)
        last = rest[host]
        assert isinstance(last, For)
        if not all(_flat_block(x) for x in head):
            raise ScheduleError(
                prim, blk, "statements before the first pass must be loop-free blocks"
            )
        for g in (first, last):
            if not all(_flat_block(x) for x in g.body):
                raise ScheduleError(prim, blk, f"pass {g.var} must hold only loop-free blocks")
        if expr_str(first.extent) != expr_str(last.extent) or f.var in free_vars(first.extent):
            raise ScheduleError(
                prim,
                blk,
                f"passes {first.var} and {last.var} differ in extent or depend on the row",
            )
        if ForKind.PARALLEL in (first.kind, last.kind) or (
            last.kind == ForKind.VECTORIZED and first.kind != ForKind.VECTORIZED
        ):
            raise ScheduleError(
                prim,
                blk,
                f"pass {first.var} ({first.kind.value}) cannot run inside "
                f"{last.var} ({last.kind.value})",
            )
        k = self.kernel
        head_blocks = head + list(first.body)
        regs = set().union(*(_writes(b) for b in head_blocks))
        registers = {t.name for t in k.temps if t.scope == "register" and not t.shape}
        if not regs <= registers:
            raise ScheduleError(
                prim, blk, f"the first pass writes {sorted(regs - registers)}, not registers"
            )
        inputs = {b.name for b in k.inputs}
        reads = set().union(*(_reads(b) for b in head_blocks))
        if not reads <= inputs | regs:
            raise ScheduleError(
                prim, blk, f"the first pass reads {sorted(reads - inputs - regs)}, not inputs"
            )
        ready: set[str] = set()
        for b in head_blocks:  # every row starts afresh: each register is set before use
            early = (_reads(b) & regs) - ready
            if early:
                raise ScheduleError(
                    prim, b.name, f"it reads {sorted(early)} before this row sets them"
                )
            ready |= _writes(b)
        clash = regs & set().union(set(), *(_writes(b) for b in ast_blocks(rest)))
        if clash:
            raise ScheduleError(prim, blk, f"a later pass writes {sorted(clash)}")
        return f, cont, head, first, rest, host, regs

    @_primitive
    def defer_last_pass(
        self, loop: str, into: str, chunk: int = 64, min_chunks: int = 8
    ) -> list[str]:
        """Run each iteration's last pass ``D`` inside the next iteration's pass ``into``
        (``H``, just before ``D``), chunk by chunk: while row ``i``'s ``H`` computes
        (softmax's exp), row ``i - 1``'s ``D`` writes its output (the streamed scale pass),
        so the output's memory traffic overlaps ``H``'s arithmetic instead of following
        it. ``loop`` (extent ``n``) is split into chunks of ``c = max(1, min(chunk, n //
        min_chunks))`` rows, run like ``loop``; a chunk's first row defers nothing and its
        last row's ``D`` runs after the row loop (an epilogue). Returns the chunk loop and
        the row loop.

        What ``D`` reads of the row is kept for it: each register it reads that the row
        writes is copied to ``<reg>_prev`` at the end of the row; each local row buffer it
        reads that the row writes gets a leading dim of 2, alternated by row parity (a
        block accessing it gets an iteration variable ``<block>_par`` bound to the
        parity of its row within the chunk).

        Requirements: ``loop`` is parallel, or serial with independent iterations (as
        :meth:`parallel` requires); ``D`` is the last statement of its body and a loop,
        ``H`` is the loop just before it, both serial with the same extent, which does not
        depend on the row; ``D`` writes only kernel outputs and local temps that nothing
        outside ``D`` accesses; a row buffer ``D`` reads is not streamed from and its
        shape does not depend on the row; ``chunk`` and ``min_chunks`` are positive.

        Example, ``defer_last_pass("i", "j", 64)`` on softmax (``X: float32[N, K]``,
        ``K = 128 J``, the exp pass ``j`` and the streamed scale pass ``j2`` in chunks)::

            parallel for (i, 0, N)                parallel for (i_o, 0, (N + c - 1) // c)
              ... m[] = max over X[i, :]            ScheduleBlock(s_prev_init)
              serial for (j, 0, J)                    s_prev[] = 0.0f
                vectorized for (k, 0, 128)          serial for (i_i, 0, min(c, N - i_o * c))
                  E[0, ..] = exp(X[i, ..] - m[])      ... m[] = max over X[i, :]
                  s[] = s[] + E[0, ..]                serial for (j, 0, J)
              serial for (j2, 0, J)         ->          vectorized for (k, 0, 128)
                vectorized for (k2, 0, 128)               E[p, 0, ..] = exp(X[i, ..] - m[])
                  Y_stage[k2] = E[0, ..] / s[]            s[] = s[] + E[p, 0, ..]
                stream(Y[i, j2 * 128 +: 128])           if (0 < i_i)
                                                          vectorized for (k2, 0, 128)
                                                            Y_stage[k2] = E[q, 0, ..] / s_prev[]
                                                          stream(Y[i - 1, j * 128 +: 128])
                                                      ScheduleBlock(s_prev)
                                                        s_prev[] = s[]
                                                    serial for (j2_epi, 0, J) ... row i_o * c + ext - 1

        with ``c`` the chunk, ``i = i_o * c + i_i``, ``p = i_i % 2``, ``q = (i_i + 1) % 2``
        and ``ext = min(c, N - i_o * c)``.
        """
        prim = "defer_last_pass"
        f, cont, host, last, regs, bufs = self._defer_plan(prim, loop, into, chunk, min_chunks)
        k = self.kernel
        rc = self._row_chunks(f, chunk, min_chunks)
        vo, vi, start, ext, row = rc.vo, rc.vi, rc.start, rc.ext, rc.row
        taken: set[str] = set()
        prev: dict[str, str] = {}
        inits: list[Stmt] = []
        copies: list[Stmt] = []
        for r in sorted(regs):
            dt = k.buffer(r).dtype
            prev[r] = self._fresh(f"{r}_prev", kind="buffer")
            k.temps.append(Buffer(prev[r], dt, (), "register"))
            zero = Const(np.zeros((), dt).item(), dt)
            init = self._fresh(f"{prev[r]}_init", taken, kind="block")
            inits.append(Block(init, [], [], [Store(prev[r], (), zero)]))
            name = self._fresh(prev[r], taken, kind="block")
            copies.append(Block(name, [], [], [Store(prev[r], (), Load(r, ()))]))
        parity = self._double_buffer(f, bufs)
        epilogue = copy.deepcopy(last)
        renames: dict[str, Expr] = {}
        for g in [s for s in walk_stmts([epilogue]) if isinstance(s, For)]:
            renames[g.var] = Var(self._fresh(f"{g.var}_epi", taken))
            g.var = renames[g.var].name  # type: ignore[attr-defined]
        for b in ast_blocks([epilogue]):
            b.name = self._fresh(f"{b.name}_epi", taken, kind="block")
        deferred = last.body
        last_row = sub(ext, Const(1))
        _subst_loop_vars(
            deferred,
            {
                f.var: sub(row, Const(1)),
                last.var: Var(host.var),
                parity: _par(add(Var(vi), Const(1))),
            },
        )
        _subst_loop_vars(
            [epilogue], {**renames, f.var: add(start, last_row), parity: _par(last_row)}
        )
        for b in ast_blocks(deferred) + ast_blocks([epilogue]):
            _map_block_exprs(b, lambda e: _rename_loads(e, prev))
        rest = f.body[:-1]
        _subst_loop_vars(rest, {f.var: row, parity: _par(Var(vi))})
        at = next((i for i, s in enumerate(host.body) if isinstance(s, If)), len(host.body))
        host.body.insert(at, If(Bin("<", Const(0), Var(vi)), deferred))
        inner = For(vi, ext, rest + copies, ForKind.SERIAL)
        outer = For(vo, rc.count, inits + [inner, epilogue], f.kind)
        cont[_index(cont, f)] = outer
        self._ctx().simplify_bindings([outer])
        return [vo, vi]

    def _defer_plan(
        self, prim: str, loop: str, into: str, chunk: int, min_chunks: int
    ) -> tuple[For, list[Stmt], For, For, set[str], set[str]]:
        """:meth:`defer_last_pass`'s checks; returns the row loop, the list holding it, the
        host and last passes, the registers and the row buffers the last pass reads of
        the row."""
        f, cont, path = self._locate_loop(prim, loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.PARALLEL):
            raise ScheduleError(prim, blk, f"loop {loop} is {f.kind.value}")
        ok = all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool)
            for x in (chunk, min_chunks)
        )
        if not ok or chunk < 1 or min_chunks < 1:
            raise ScheduleError(prim, blk, "chunk and min_chunks must be positive ints")
        if len(f.body) < 2 or not isinstance(f.body[-1], For):
            raise ScheduleError(prim, blk, f"loop {loop} does not end with a pass")
        host, last = f.body[-2], f.body[-1]
        if not isinstance(host, For) or host.var != into:
            raise ScheduleError(
                prim, blk, f"the pass before the last of loop {loop} is not {into!r}"
            )
        for g in (host, last):
            if g.kind != ForKind.SERIAL:
                raise ScheduleError(prim, blk, f"pass {g.var} is {g.kind.value}, not serial")
        if expr_str(host.extent) != expr_str(last.extent) or f.var in free_vars(host.extent):
            raise ScheduleError(
                prim, blk, f"passes {host.var} and {last.var} differ in extent or depend on the row"
            )
        if f.kind == ForKind.SERIAL:
            self._check_independent(prim, f, path, None)
        k = self.kernel
        scope = {b.name: b.scope for b in k.temps}
        outputs = {b.name for b in k.outputs}
        mine = ast_blocks([last])
        streams = [s for s in walk_stmts([last]) if isinstance(s, StreamStore)]
        written = set().union(set(), *(_writes(b) for b in mine)) | {s.buffer for s in streams}
        for w in sorted(written):
            if w not in outputs and scope.get(w) != "local":
                raise ScheduleError(
                    prim, blk, f"the last pass writes {w!r}, not an output or local"
                )
        outside = [s for s, _, loops in _walk(k.body) if s is not last and last not in loops]
        touched = set().union(set(), *(_accessed(s) for s in outside))
        if written & touched:
            raise ScheduleError(
                prim,
                blk,
                f"{sorted(written & touched)} written by the last pass are used elsewhere",
            )
        row_writes = set().union(set(), *(_writes(b) for b in ast_blocks(f.body[:-1])))
        reads = set().union(set(), *(_reads(b) for b in mine)) | {s.src for s in streams}
        carried = (reads - written) & row_writes
        regs = {r for r in carried if scope.get(r) == "register"}
        bufs = carried - regs
        for b in sorted(bufs):
            if scope.get(b) != "local":
                raise ScheduleError(prim, blk, f"the last pass reads {b!r}, which the row writes")
            if f.var in set().union(set(), *(free_vars(d) for d in k.buffer(b).shape)):
                raise ScheduleError(prim, blk, f"the shape of row buffer {b!r} depends on the row")
            if any(isinstance(s, StreamStore) and s.src == b for s in walk_stmts(f.body)):
                raise ScheduleError(prim, blk, f"row buffer {b!r} is streamed from")
            if any(
                b in _accessed(s) for s, _, loops in _walk(k.body) if s is not f and f not in loops
            ):
                raise ScheduleError(prim, blk, f"row buffer {b!r} is used outside loop {loop}")
        return f, cont, host, last, regs, bufs

    def _double_buffer(self, f: For, bufs: set[str]) -> str:
        """Give each local buffer in ``bufs`` a leading dim of 2 and every block in ``f``
        accessing one an iteration variable bound to a placeholder variable (returned),
        which indexes that dim."""
        par = self._fresh("par")
        for name in bufs:
            buf = self.kernel.buffer(name)
            buf.shape = (Const(2), *buf.shape)
        for b in ast_blocks(f.body):
            if not (_reads(b) | _writes(b)) & bufs:
                continue
            iv = self._fresh(f"{b.name}_par", {v.name for v in b.iter_vars})
            b.iter_vars.append(IterVar(iv, Const(2)))
            b.bindings.append(Var(par))

            def lead(e: Expr, iv: str = iv) -> Expr:
                def repl(x: Expr) -> Expr | None:
                    if isinstance(x, Load) and x.buffer in bufs:
                        return Load(x.buffer, (Var(iv), *x.indices))
                    return None

                return transform(e, repl)

            for s in walk_stmts(b.body):
                if isinstance(s, Store):
                    s.value = lead(s.value)
                    s.indices = tuple(lead(i) for i in s.indices)
                    if s.buffer in bufs:
                        s.indices = (Var(iv), *s.indices)
                elif isinstance(s, If):
                    s.cond = lead(s.cond)
        return par

    @_primitive
    def parallel(self, loop: str) -> None:
        """Run ``loop``'s iterations in parallel (``ForKind.PARALLEL``).

        Requirements: the loop is serial or already parallel and no loop around or
        inside it is parallel; no block inside binds a reduce iteration variable to it;
        every buffer stored inside is either a temp whose every access is inside the
        loop and independent of it (one private copy per iteration, see
        :func:`alloc_loop`) or accessed inside the loop only at locations that
        determine the loop variable the same way (so iterations touch disjoint
        elements).

        Example, ``parallel("i")``::

            serial for (i, 0, N)        ->      parallel for (i, 0, N)
              ...                                 ...
        """
        f, _, path = self._locate_loop("parallel", loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.PARALLEL):
            raise ScheduleError("parallel", blk, f"loop {loop} is already {f.kind.value}")
        nested = [g.var for g in path if g.kind == ForKind.PARALLEL] + [
            s.var for s in walk_stmts(f.body) if isinstance(s, For) and s.kind == ForKind.PARALLEL
        ]
        if nested:
            raise ScheduleError("parallel", blk, f"nested parallel loops: {nested}")
        self._check_independent("parallel", f, path, None)
        f.kind = ForKind.PARALLEL
        return None

    @_primitive
    def vectorize(self, loop: str, allow_reassoc: bool = False) -> None:
        """Mark innermost ``loop`` vectorized (``ForKind.VECTORIZED``).

        Requirements: the loop is serial (or already vectorized) and holds no loop;
        its body is blocks whose bodies are only stores; iterations are independent as
        for :meth:`parallel`, except that a reduction carried by the loop is allowed
        when its combine may be reassociated: ``max``/``min`` always, integer ``+``/``*``
        always, float ``+``/``*`` only with ``allow_reassoc=True`` (fastmath).

        Example, ``vectorize("j")``::

            serial for (j, 0, 16)       ->      vectorized for (j, 0, 16)
              ScheduleBlock(A) ...                ScheduleBlock(A) ...
        """
        f, _, path = self._locate_loop("vectorize", loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.VECTORIZED):
            raise ScheduleError("vectorize", blk, f"loop {loop} is already {f.kind.value}")
        for s in f.body:
            if not isinstance(s, Block):
                raise ScheduleError(
                    "vectorize", blk, f"loop {loop} is not innermost or holds a non-block statement"
                )
            if not all(isinstance(x, Store) for x in s.body):
                raise ScheduleError("vectorize", s.name, "the block body must be stores only")

        def reassoc(b: Block) -> bool:
            comb = _combine(b)
            if comb is None:
                return False
            dt = np.dtype(self.kernel.buffer(comb[1].buffer).dtype)
            return comb[0] in ("max", "min") or dt.kind in "iub" or allow_reassoc

        self._check_independent("vectorize", f, path, reassoc)
        f.kind = ForKind.VECTORIZED
        return None

    @_primitive
    def interleave(self, loop: str, factor: int) -> None:
        """Compute ``factor`` vectors of consecutive iterations of vectorized ``loop`` side
        by side (LLVM's interleave count). Each vector of a long per-element dependency
        chain (a transcendental function: 20-40 dependent instructions) then overlaps
        the others' latency; without it the out-of-order window holds only two or three
        chains. ``factor=1`` clears the hint. The numba backend can only pass the
        largest factor of a kernel to LLVM for the whole kernel (numba sets no loop
        metadata), so every loop of that kernel is interleaved alike.

        Requirements: the loop is vectorized; ``factor`` is a power of two from 1 to 16.

        Example, ``interleave("j", 4)``::

            vectorized for (j, 0, 128)  ->      vectorized for (j, 0, 128) interleave(4)
              ScheduleBlock(A) ...                ScheduleBlock(A) ...
        """
        f, _, _ = self._locate_loop("interleave", loop)
        blk = self._first_block(f)
        if f.kind != ForKind.VECTORIZED:
            raise ScheduleError("interleave", blk, f"loop {loop} is {f.kind.value}, not vectorized")
        ok = isinstance(factor, (int, np.integer)) and not isinstance(factor, bool)
        if not ok or not 1 <= factor <= 16 or factor & (factor - 1):
            raise ScheduleError(
                "interleave", blk, f"factor {factor!r} is not a power of two from 1 to 16"
            )
        f.interleave = int(factor)
        return None

    @_primitive
    def unroll(self, loop: str, max_extent: int = 64) -> None:
        """Mark ``loop`` unrolled (``ForKind.UNROLLED``).

        Requirements: the loop is serial (or already unrolled) and its extent is a
        constant no larger than ``max_extent`` (64).

        Example, ``unroll("k")``::

            serial for (k, 0, 4)        ->      unrolled for (k, 0, 4)
        """
        f, _, _ = self._locate_loop("unroll", loop)
        blk = self._first_block(f)
        if f.kind not in (ForKind.SERIAL, ForKind.UNROLLED):
            raise ScheduleError("unroll", blk, f"loop {loop} is already {f.kind.value}")
        if not isinstance(f.extent, Const):
            raise ScheduleError("unroll", blk, f"extent {_s(f.extent)} of {loop} is not constant")
        if int(f.extent.value) > max_extent:
            raise ScheduleError(
                "unroll", blk, f"extent {f.extent.value} of {loop} exceeds {max_extent}"
            )
        f.kind = ForKind.UNROLLED
        return None

    def digit_dims(self, buffer: str) -> list[int]:
        """The dims ``k`` of kernel argument ``buffer`` where some access indexes dims
        ``k`` and ``k + 1`` with the two digits of one index (``e // d, e % d``, through
        the block's bindings): what :meth:`merge_dims` folds."""
        buf = self.kernel.buffer(buffer)
        found: set[int] = set()
        for b in ast_blocks(self.kernel.body):
            bind = {iv.name: x for iv, x in zip(b.iter_vars, b.bindings)}
            idxs = [st.indices for st in _stores(b) if st.buffer == buffer]
            idxs += [ld.indices for ld in _loads(b) if ld.buffer == buffer]
            for idx in idxs:
                for k in range(len(idx) - 1):
                    hi, lo = substitute(idx[k], bind), substitute(idx[k + 1], bind)
                    if _join_digits(hi, lo, buf.shape[k + 1]) is not None:
                        found.add(k)
        return sorted(found)

    @_primitive
    def merge_dims(self, buffer: str, dim: int) -> None:
        """View kernel argument ``buffer`` with dims ``dim`` and ``dim + 1`` merged into
        one (a C-contiguous array reshaped: the caller passes it in the new shape), or
        allocate local temp ``buffer`` so. Every
        access's index pair ``(hi, lo)`` becomes ``hi * d + lo`` (``d`` the size of dim
        ``dim + 1``), folded where the pair splits one index into digits, through the
        block's bindings: ``(e // d, e % d)`` is ``e`` and ``(e // d % m, e % d)`` is
        ``e % (m * d)``. A loop fused over several axes of an array (``align``'s reduce
        loop over H and W) then walks it with one contiguous index instead of a division
        and a modulo per element, which keeps the loop vectorizable.

        Requirements: ``buffer`` is a kernel input or output or a local temp;
        ``0 <= dim < rank - 1``.

        Example, ``merge_dims("x", 2)`` with ``x`` of shape ``[N, 64, 56, 56]``::

            for (sp, 0, N * 64)                  for (sp, 0, N * 64)
              for (rb, 0, 3136)                    for (rb, 0, 3136)
                ScheduleBlock(R)          ->         ScheduleBlock(R)
                  vi, vj, r:vk, r:vl =                 vi, vj, r:vk, r:vl =
                    axis.bind(sp // 64, sp % 64,         axis.bind(sp // 64, sp % 64,
                              rb // 56, rb % 56)                   rb // 56, rb % 56)
                  R[vi, vj] = R[vi, vj]                R[vi, vj] = R[vi, vj]
                    + x[vi, vj, vk, vl]                  + x[vi, vj, rb]
        """
        prim = "merge_dims"
        local = [b for b in self.kernel.temps if b.scope == "local"]
        args = {b.name: b for b in self.kernel.inputs + self.kernel.outputs + local}
        if buffer not in args:
            raise ScheduleError(prim, buffer, "not a kernel input or output or a local temp")
        buf = args[buffer]
        if not 0 <= dim < len(buf.shape) - 1:
            raise ScheduleError(prim, buffer, f"dim {dim} has no next dim in rank {len(buf.shape)}")
        d = buf.shape[dim + 1]

        def merged(idx: tuple[Expr, ...], bind: dict[str, Expr]) -> tuple[Expr, ...]:
            hi, lo = idx[dim], idx[dim + 1]
            joined = _join_digits(substitute(hi, bind), substitute(lo, bind), d)
            if joined is None:
                joined = add(mul(hi, d), lo)
            return (*idx[:dim], joined, *idx[dim + 2 :])

        def visit(stmts: list[Stmt], bind: dict[str, Expr]) -> None:
            def repl(e: Expr) -> Expr | None:
                if isinstance(e, Load) and e.buffer == buffer:
                    return Load(e.buffer, merged(e.indices, bind))
                return None

            for st in stmts:
                _map_stmt_exprs(st, lambda e: transform(e, repl))
                if isinstance(st, Store) and st.buffer == buffer:
                    st.indices = merged(st.indices, bind)
                if isinstance(st, Block):
                    visit(st.body, {iv.name: x for iv, x in zip(st.iter_vars, st.bindings)})
                elif isinstance(st, (For, If)):
                    visit(st.body, bind)

        visit(self.kernel.body, {})
        buf.shape = (*buf.shape[:dim], mul(buf.shape[dim], d), *buf.shape[dim + 2 :])
        return None


def _s(e: Expr) -> str:
    from geode.codegen.ast import expr_str

    return expr_str(e)
