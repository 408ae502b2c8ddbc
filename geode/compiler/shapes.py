"""Symbolic dims: sympy symbols and expressions, broadcasting, constraints, evaluation.

A dim is an ``int`` or a sympy expression over positive integer symbols. A shape is a
tuple of dims, or ``None`` when even the rank is unknown. Named dims (``"N"``,
``"seq"``) become one shared symbol per :class:`SymbolTable`; unknown dims get fresh
symbols (``_s0``, ``_s1``, ...).

sympy is imported on first use (:mod:`geode.lazy`): a graph read from a model file
holds :class:`~geode.compiler.stored_dims.StoredDim` data instead, which the functions
the runtime needs here (:func:`free_symbols`, :func:`shape_str`,
:func:`compile_shape_fn`, :func:`compile_dim_fn`, :func:`as_dim`) accept as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from geode.compiler.stored_dims import StoredDim, broadcast_value, compile_stored_shape
from geode.errors import ShapeError
from geode.lazy import sympy

#: a dim: an int, a sympy expression, or (in a graph read from a model file) a StoredDim
Dim = Union[int, "sympy.Expr", StoredDim]
Shape = tuple[Dim, ...] | None


def __getattr__(name: str) -> Any:
    # BroadcastDim subclasses a sympy class: defined (and sympy imported) on first use
    if name == "BroadcastDim":
        return _bcast_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _bcast_type() -> type:
    """:class:`BroadcastDim`, the ONNX broadcast of symbolic dims as a sympy function,
    defined on first use (it subclasses a sympy class: defining it imports sympy)."""
    from sympy.core.logic import fuzzy_and

    class BroadcastDim(sympy.Function):
        """The ONNX broadcast of two or more symbolic dims: the one of them that is not 1 (1
        when all are), legal only when those that are not 1 are equal (checked at run time:
        :meth:`SymbolTable.require_broadcast`). Printed ``bcast(M, N)``.

        Canonical on construction: nested broadcasts flatten, 1s drop out, repeated operands
        count once and the rest are sorted, so ``bcast(N, M)`` is ``bcast(M, N)``. A static
        operand other than 1 is the result (the others must be 1 or equal to it), and two
        different ones raise :class:`ShapeError`; so binding every symbol yields an int.
        Unlike ``Max`` it is right for 0: ``bcast(0, 1)`` is 0.
        """

        is_integer = True

        @classmethod
        def eval(cls, *args: sympy.Expr) -> sympy.Expr | None:
            """sympy's hook on construction: the canonical form, or None when ``args`` are."""
            ops = broadcast_operands(args)
            statics = sorted({int(a) for a in ops if a.is_Integer})
            if len(statics) > 1:
                raise ShapeError(f"cannot broadcast dims {statics[0]} and {statics[1]}")
            if statics:
                return sympy.Integer(statics[0])
            if not ops:
                return sympy.Integer(1)
            if len(ops) == 1:
                return ops[0]
            if tuple(ops) != tuple(args):
                return cls(*ops, evaluate=False)
            return None

        def _eval_is_positive(self) -> bool | None:
            return fuzzy_and(a.is_positive for a in self.args)

        def _eval_is_nonnegative(self) -> bool | None:
            return fuzzy_and(a.is_nonnegative for a in self.args)

        def _sympystr(self, printer: object) -> str:
            return "bcast(" + ", ".join(printer._print(a) for a in self.args) + ")"  # type: ignore[attr-defined]

    BroadcastDim.__module__, BroadcastDim.__qualname__ = __name__, "BroadcastDim"
    return BroadcastDim


def sym(name: str) -> sympy.Symbol:
    """The canonical symbol for a named dim (positive integer)."""
    return sympy.Symbol(name, integer=True, positive=True)


def as_dim(d: object) -> Dim:
    """Normalise a dim: ints stay ints, strings become symbols, sympy ints become ints."""
    if isinstance(d, bool):
        raise ShapeError(f"a dim cannot be a bool ({d!r})")
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        return sym(d)
    if isinstance(d, StoredDim):
        return d
    if isinstance(d, sympy.Expr):
        # sympy canonicalises arithmetic on construction; a full simplify() is too slow
        # to run on every dim (tens of ms for Min/Max/ceiling)
        return int(d) if d.is_Integer else d
    if hasattr(d, "__index__"):
        return int(d)  # numpy integers
    raise ShapeError(f"not a dim: {d!r} ({type(d).__name__})")


def is_static(shape: Shape) -> bool:
    """True when the rank and every dim are known integers."""
    return shape is not None and all(isinstance(d, int) for d in shape)


def numel(shape: Sequence[Dim]) -> Dim:
    """Number of elements, as an int when static."""
    n: Dim = 1
    for d in shape:
        n = n * d
    return as_dim(n) if not isinstance(n, int) else n


def dim_str(d: Dim) -> str:
    """Readable text for one dim (a symbolic dim's printed once per process: sympy builds
    a printer for every ``str``, 20-70 us each, and a compile prints the same few dims
    hundreds of times)."""
    if isinstance(d, int):
        return str(d)
    try:
        return _printed(d)
    except TypeError:  # an unhashable dim
        return str(d)


@functools.lru_cache(maxsize=4096)
def _printed(d: Any) -> str:
    return str(d)


def shape_str(shape: Shape) -> str:
    """Readable text for a shape: ``[N, 128]`` or ``[?]`` for unknown rank."""
    if shape is None:
        return "[?]"
    return "[" + ", ".join(dim_str(d) for d in shape) + "]"


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """True/False when provably equal/different, None when it depends on symbol values."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    # one object, or structurally equal (the common case): no simplification needed
    if a is b or a == b:
        return True
    return _dims_equal_symbolic(a, b)


def same_dim(a: Dim, b: Dim) -> bool:
    """Whether ``a`` and ``b`` are provably equal (:func:`dims_equal` is True): False when
    they differ or when it depends on symbol values."""
    return dims_equal(a, b) is True


def monomial(d: object) -> tuple[int, dict[Any, int]] | None:
    """``d`` as ``c * s1**k1 * s2**k2 ...``: the int ``c`` and ``{symbol: k}`` (every
    ``k`` a positive int), or None when ``d`` is no such product (a sum, a ``Min``, a
    broadcast, a rational, a stored dim). An int is ``(d, {})``.

    The compile's dims are nearly all of this form (symbols, element counts): their
    equality, exact division and printing are decided here without sympy arithmetic,
    whose first sum in a process costs ~25 ms (sympy's ``Add`` imports its tensor and
    combinatorics modules then) and each further one 0.1-1 ms."""
    if isinstance(d, int):
        return None if isinstance(d, bool) else (d, {})
    if not isinstance(d, sympy.Expr):
        return None
    c, powers = 1, {}
    for f in sympy.Mul.make_args(d):
        if f.is_Integer:
            c *= int(f)
        elif f.is_Symbol and f not in powers:
            powers[f] = 1
        elif f.is_Pow and f.base.is_Symbol and f.exp.is_Integer and f.exp > 0:
            if f.base in powers:
                return None
            powers[f.base] = int(f.exp)
        else:
            return None
    return c, powers


#: :func:`_monomial_verdict` when either dim is no :func:`monomial` product
_UNDECIDED = "undecided"


def _monomial_verdict(a: Dim, b: Dim) -> bool | None | str:
    """:func:`dims_equal` when both dims are :func:`monomial` products, else
    :data:`_UNDECIDED`: True when they are the same product, False when both are
    different numbers, None otherwise (their difference is a polynomial with a term
    that is not constant: sympy's expanded difference is neither 0 nor a number)."""
    ma, mb = monomial(a), monomial(b)
    if ma is None or mb is None:
        return _UNDECIDED
    if ma == mb:
        return True
    if not ma[1] and not mb[1]:
        return False
    return None


@functools.lru_cache(maxsize=1 << 16)
def _dims_equal_symbolic(a: Dim, b: Dim) -> bool | None:
    """:func:`dims_equal` on the expanded difference ``a - b``; sympy's ``simplify``
    (tens of milliseconds on a cold cache) only when that difference still holds
    floor, ceiling, Mod, Min or Max, which expansion cannot cancel. Two
    :func:`monomial` products are decided without sympy (:func:`_monomial_verdict`)."""
    verdict = _monomial_verdict(a, b)
    if verdict is not _UNDECIDED:
        return verdict  # type: ignore[return-value]
    diff = sympy.expand(sympy.Integer(a) - b if isinstance(a, int) else a - b)
    if diff.has(sympy.floor, sympy.ceiling, sympy.Mod, sympy.Min, sympy.Max):
        diff = sympy.simplify(diff)
    if diff == 0:
        return True
    if diff.is_number:
        return False
    return None


def free_symbols(shape: Shape) -> set[sympy.Symbol]:
    """Symbols a shape depends on."""
    out: set[sympy.Symbol] = set()
    for d in shape or ():
        if not isinstance(d, int):
            out |= d.free_symbols
    return out


def normalize_axis(axis: int, rank: int, where: str = "") -> int:
    """Map a possibly negative axis into ``[0, rank)``; ShapeError when out of range."""
    a = int(axis)
    if not -rank <= a < max(rank, 1) or (rank == 0 and a not in (0, -1)):
        raise ShapeError(
            f"axis {axis} out of range for rank {rank}" + (f" at {where}" if where else "")
        )
    return a + rank if a < 0 else a


def evaluate_dim(d: Dim, env: Mapping[sympy.Symbol, int]) -> int:
    """Value of a dim once its symbols are bound."""
    if isinstance(d, int):
        return d
    v = d.xreplace({s: sympy.Integer(env[s]) for s in d.free_symbols if s in env})
    if not v.is_number:
        missing = ", ".join(sorted(str(s) for s in v.free_symbols))
        raise ShapeError(f"dim {d} needs unbound symbols: {missing}")
    return int(v)


def evaluate(shape: Sequence[Dim], env: Mapping[sympy.Symbol, int]) -> tuple[int, ...]:
    """Concrete shape once its symbols are bound."""
    return tuple(evaluate_dim(d, env) for d in shape)


def broadcast_operands(dims: Iterable[object]) -> list[sympy.Expr]:
    """The operands of a broadcast of ``dims`` in canonical order: nested
    :class:`BroadcastDim` flattened, 1s dropped, each operand once."""
    seen: set[sympy.Expr] = set()
    for d in dims:
        e = sympy.sympify(d)
        for a in e.args if isinstance(e, _bcast_type()) else (e,):
            if a != 1:
                seen.add(a)
    return sorted(seen, key=sympy.default_sort_key)


def broadcasts_to(d: Dim, target: Dim, symbols: SymbolTable | None = None) -> bool:
    """True when a dim ``d`` of an operand broadcasts to the result dim ``target`` for
    every binding the model admits: ``d`` is 1 or provably ``target``, or ``target`` is a
    broadcast of ``d``'s operands and others (``N`` into ``bcast(M, N)``), or, given the
    graph's ``symbols``, a recorded broadcast made a static ``target`` of ``d`` (``N``
    against 16 gives 16, legal when ``N`` is 1 or 16). Then ``d`` equals ``target`` or is
    1 at run time, and a kernel reads it at index 0 when it is 1."""
    if d == 1 or dims_equal(d, target) is True:
        return True
    ops = set(broadcast_operands((d,)))
    if isinstance(target, _bcast_type()) and ops <= set(target.args):
        return True
    return symbols is not None and symbols.broadcast_recorded(ops | {sympy.sympify(target)})


def broadcast_stride(d: Dim) -> Dim:
    """The index stride of a dim ``d`` that broadcasts (:func:`broadcasts_to`) to a result
    dim: ``Min(1, d - 1)``, 1 when ``d`` is the result (a size other than 1), 0 when it
    is 1 (every index reads element 0). For ``d`` = 0 it is -1, but then the result is 0
    too and nothing is read."""
    if isinstance(d, int):
        return min(1, d - 1)
    return as_dim(sympy.Min(1, d - 1))


def broadcast_dim(a: Dim, b: Dim, where: str = "", symbols: SymbolTable | None = None) -> Dim:
    """Multidirectional (numpy/ONNX) broadcast of two dims.

    Static dims are decided here. A symbolic pair that is not provably equal broadcasts to
    :class:`BroadcastDim` (or to the static side when it is not 1), legal at run time only
    when the two are equal or one is 1: ``symbols`` (the graph's table) records that
    constraint for the executor to check (:meth:`SymbolTable.require_broadcast`).
    """
    if isinstance(a, int) and isinstance(b, int):
        if a == b or b == 1:
            return a
        if a == 1:
            return b
        raise ShapeError(f"cannot broadcast dims {a} and {b}" + (f" at {where}" if where else ""))
    if a == 1:
        return b
    if b == 1:
        return a
    if dims_equal(a, b) is True:
        return a
    if symbols is not None:
        symbols.require_broadcast((a, b), where)
    try:
        return as_dim(_bcast_type()(a, b))
    except ShapeError as exc:  # two different static operands of nested broadcasts
        raise ShapeError(f"{exc}" + (f" at {where}" if where else "")) from None


def broadcast_shapes(*shapes: Shape, where: str = "", symbols: SymbolTable | None = None) -> Shape:
    """Multidirectional broadcast of several shapes (None if any rank is unknown); with
    the graph's ``symbols``, symbolic broadcasts are recorded (see :func:`broadcast_dim`)."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        padded = (1,) * (rank - len(s)) + tuple(s)
        out = [broadcast_dim(x, y, where, symbols) for x, y in zip(out, padded)]
    return tuple(out)


@dataclass
class SymbolTable:
    """The symbols of one graph: named dims, fresh dims, equality constraints, and
    broadcast constraints (groups of dims broadcast together: those that are not 1
    must be equal at run time)."""

    named: dict[str, sympy.Symbol] = field(default_factory=dict)
    counter: int = 0
    constraints: list[tuple[Dim, Dim, str]] = field(default_factory=list)
    broadcasts: list[tuple[tuple[Dim, ...], str]] = field(default_factory=list)

    def named_dim(self, name: str) -> sympy.Symbol:
        """The shared symbol for a named dim."""
        if name not in self.named:
            self.named[name] = sym(name)
        return self.named[name]

    def fresh(self, prefix: str = "s") -> sympy.Symbol:
        """A new symbol that no other dim shares."""
        while True:
            name = f"_{prefix}{self.counter}"
            self.counter += 1
            if name not in self.named:
                s = sym(name)
                self.named[name] = s
                return s

    def dim(self, d: object) -> Dim:
        """Turn a user/ONNX dim into a Dim: str -> shared symbol, None/-1/'?' -> fresh."""
        if (
            d is None
            or (isinstance(d, int) and not isinstance(d, bool) and d < 0)
            or d in ("?", "")
        ):
            return self.fresh()
        if isinstance(d, str):
            return self.named_dim(d)
        return as_dim(d)

    def shape(self, dims: Iterable[object] | None) -> Shape:
        """Turn a user/ONNX shape into a Shape (None: unknown rank)."""
        if dims is None:
            return None
        return tuple(self.dim(d) for d in dims)

    def equate(self, a: Dim, b: Dim, where: str = "") -> Dim:
        """Record that two dims must be equal; ShapeError if they provably differ."""
        eq = dims_equal(a, b)
        if eq is False:
            raise ShapeError(f"dims {a} and {b} must be equal" + (f" at {where}" if where else ""))
        if eq is None:
            self.constraints.append((a, b, where))
            return a if isinstance(a, int) else b if isinstance(b, int) else a
        return a

    def require_nonzero(self, d: Dim, where: str = "") -> None:
        """Record that ``d`` must be at least 1 at run time: an inference that relied on
        symbols being positive (``Min(1, N)`` is 1) is wrong for a run-time 0, and the
        executor then refuses the inputs instead of running with a wrong shape.

        The constraint reads ``Min(d, 1) == 1`` over non-negative twins of ``d``'s symbols
        (same names), which sympy cannot fold to ``1 == 1`` as it would for the originals.
        """
        if isinstance(d, int):
            return
        twins = {s: sympy.Symbol(s.name, integer=True, nonnegative=True) for s in d.free_symbols}
        entry = (_min_one(d.xreplace(twins), monomial(d)), 1, where)
        if not any(a == entry[0] for a, _, _ in self.constraints):
            self.constraints.append(entry)

    def require_broadcast(self, dims: Iterable[Dim], where: str = "") -> None:
        """Record that ``dims`` broadcast together (ONNX: equal, or 1): the executor checks
        it once the symbols are bound. Nested broadcasts are flattened into one group of
        operands; a group already recorded is not repeated."""
        ops = tuple(as_dim(d) for d in broadcast_operands(dims))
        if len(ops) < 2 or any(set(ops) <= set(g) for g, _ in self.broadcasts):
            return
        self.broadcasts.append((ops, where))

    def broadcast_recorded(self, dims: Iterable[Dim]) -> bool:
        """True when a recorded broadcast group holds every operand of ``dims``."""
        want = set(broadcast_operands(dims))
        return any(want <= set(broadcast_operands(g)) for g, _ in self.broadcasts)


def _min_one(twin: sympy.Expr, form: tuple[int, dict[Any, int]] | None) -> sympy.Expr:
    """``Min(twin, 1)``. When ``twin`` is a product ``c * s1**k1 ...`` (``form``, with
    ``c >= 1``) of non-negative symbols, it may be 0 or at least 1, so sympy's evaluation
    cannot fold the Min and returns it as built: it is built unevaluated, the same
    object without the comparisons (sums) sympy's evaluation makes."""
    if form is not None and form[0] >= 1 and form[1]:
        return sympy.Min(twin, 1, evaluate=False)
    return sympy.Min(twin, 1)


def _int_code(d: Dim, names: Mapping[Any, str]) -> str | None:
    """Python text of dim ``d`` with exact integer arithmetic over ``names`` (symbol ->
    variable name) when ``d`` is an int, a :func:`monomial` product, or a ``Min`` or
    ``Max`` of those; else None (the sympy printer's job)."""
    form = monomial(d)
    if form is not None:
        c, powers = form
        parts = [] if c == 1 and powers else [f"({c})"]
        parts += [names[b] if k == 1 else f"{names[b]}**{k}" for b, k in powers.items()]
        return "*".join(parts)
    if isinstance(d, (sympy.Min, sympy.Max)):
        args = [_int_code(a, names) for a in d.args]
        if all(a is not None for a in args):
            return ("min(" if isinstance(d, sympy.Min) else "max(") + ", ".join(args) + ")"  # type: ignore[arg-type]
    return None


@functools.lru_cache(maxsize=1)
def _int_printer():  # noqa: ANN202 - built lazily: sympy's printers are slow to import
    from sympy.printing.pycode import PythonCodePrinter

    class IntShapePrinter(PythonCodePrinter):
        """Prints dims with exact integer arithmetic: floor/ceiling become ``//``, and
        other rationals become ``Fraction`` (never float division)."""

        def _frac(self, arg: sympy.Expr) -> tuple[str, str]:
            n, d = sympy.fraction(sympy.together(arg))
            return self._print(sympy.expand(n)), self._print(d)

        def _print_floor(self, e: sympy.Expr) -> str:
            n, d = self._frac(e.args[0])
            return f"(({n}) // ({d}))"

        def _print_ceiling(self, e: sympy.Expr) -> str:
            n, d = self._frac(e.args[0])
            return f"(-((-({n})) // ({d})))"

        def _print_Rational(self, e: sympy.Rational) -> str:  # noqa: N802 - sympy's name
            return f"Fraction({e.p}, {e.q})"

        def _print_Half(self, e: sympy.Expr) -> str:  # noqa: N802 - sympy's name
            return "Fraction(1, 2)"

        def _print_Max(self, e: sympy.Expr) -> str:  # noqa: N802 - sympy's name
            return "max(" + ", ".join(self._print(a) for a in e.args) + ")"

        def _print_Min(self, e: sympy.Expr) -> str:  # noqa: N802 - sympy's name
            return "min(" + ", ".join(self._print(a) for a in e.args) + ")"

        def _print_BroadcastDim(self, e: sympy.Expr) -> str:  # noqa: N802 - sympy's name
            return "_bcast(" + ", ".join(self._print(a) for a in e.args) + ")"

    return IntShapePrinter()


def compile_shape_fn(shape: Sequence[Dim]) -> Callable[[Mapping[str, int]], tuple[int, ...]]:
    """A plain Python function ``env -> tuple[int, ...]`` evaluating a symbolic shape
    with exact integer arithmetic.

    ``env`` maps symbol names to ints. Used to hand shapes to the runtime, which must
    not depend on sympy objects.
    """
    if all(isinstance(d, int) for d in shape):
        const = tuple(int(d) for d in shape)
        return lambda env: const
    if any(isinstance(d, StoredDim) for d in shape):
        return compile_stored_shape(tuple(shape))
    return _compiled_shape_fn(tuple(shape))


@functools.lru_cache(maxsize=4096)
def _compiled_shape_fn(shape: tuple[Dim, ...]) -> Callable[[Mapping[str, int]], tuple[int, ...]]:
    """:func:`compile_shape_fn` of a symbolic shape, once per shape (the values of a
    model share a few shapes; each costs a sympy print and an ``exec``)."""
    # symbol names come from the model (an ONNX dim_param, a user's dim string) and may be
    # any text: the generated source names them only as _s0, _s1, ... and looks the real
    # names up in a list, so no name ever becomes code
    syms = sorted(
        {s for d in shape if not isinstance(d, int) for s in d.free_symbols}, key=lambda s: s.name
    )
    names = [s.name for s in syms]
    codes = [_int_code(d, {s: f"_s{i}" for i, s in enumerate(syms)}) for d in shape]
    if all(code is not None for code in codes):
        # ints, products of symbols and their Min/Max: written directly (the printer's
        # first use costs milliseconds, and sympy's sums when it expands)
        body = [str(d) if isinstance(d, int) else f"int({code})" for d, code in zip(shape, codes)]
    else:
        printer = _int_printer()
        safe = {s: sympy.Symbol(f"_s{i}", **s.assumptions0) for i, s in enumerate(syms)}
        body = [
            str(d) if isinstance(d, int) else f"int({printer.doprint(d.xreplace(safe))})"
            for d in shape
        ]
    lines = ["def shape_fn(env):"]
    lines += [f"    _s{i} = env[_names[{i}]]" for i in range(len(names))]
    lines.append(f"    return ({', '.join(body)},)")
    import fractions
    import math

    scope: dict = {
        "math": math,
        "Fraction": fractions.Fraction,
        "_bcast": broadcast_value,
        "_names": tuple(names),
    }
    exec("\n".join(lines), scope)  # noqa: S102 - sympy expressions over _s<i> symbols only
    return scope["shape_fn"]


def compile_dim_fn(d: Dim) -> Callable[[Mapping[str, int]], int]:
    """A plain Python function ``env -> int`` evaluating one dim."""
    f = compile_shape_fn((d,))
    return lambda env: f(env)[0]
