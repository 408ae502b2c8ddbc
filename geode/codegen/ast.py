"""The loop AST: expressions, loops, ScheduleBlocks, loads and stores, and its printer.

Shape of a lowered kernel (CINN-style)::

    kernel fused_0(X: float32[N, 1024], Y: float32[N, 1024]; dims N)
    {
      serial for (i0, 0, N)
      {
        serial for (i1, 0, 1024)
        {
          ScheduleBlock(mul_0)
          {
            vi0, vi1 = axis.bind(i0, i1)
            T0[vi0, vi1] = X[vi0, vi1] * 2.0f
          }
        }
      }
    }

Expressions are immutable (frozen dataclasses); statements are mutable trees that
schedule primitives rewrite in place. Loops always run from 0 to ``extent`` with step
1. Every ScheduleBlock names its iteration variables (spatial or reduce), binds each
to an expression of the enclosing loop variables, and holds the statements computing
one element. A reduction is a block with reduce iteration variables whose store
combines into the output (``C[vi] = C[vi] + X[vi, vk]``), preceded by an init block.
"""

from __future__ import annotations

import copy
import enum
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------
# expressions
# ---------------------------------------------------------------------------------


class Expr:
    """Base of all expressions (immutable: copies share them)."""

    def __deepcopy__(self, memo: dict) -> Expr:
        # expressions are frozen: a deep copy of a statement tree (a schedule's backup,
        # Kernel.copy) shares them instead of rebuilding every node
        return self

    def __copy__(self) -> Expr:
        return self

    def __add__(self, o: object) -> Expr:
        return add(self, wrap(o))

    def __radd__(self, o: object) -> Expr:
        return add(wrap(o), self)

    def __sub__(self, o: object) -> Expr:
        return sub(self, wrap(o))

    def __mul__(self, o: object) -> Expr:
        return mul(self, wrap(o))

    def __rmul__(self, o: object) -> Expr:
        return mul(wrap(o), self)

    def __floordiv__(self, o: object) -> Expr:
        return floordiv(self, wrap(o))

    def __mod__(self, o: object) -> Expr:
        return mod(self, wrap(o))


@dataclass(frozen=True)
class Var(Expr):
    """A loop variable, block iteration variable, or symbolic dim (kernel argument)."""

    name: str


@dataclass(frozen=True)
class Const(Expr):
    """A literal; ``dtype`` is a numpy dtype name ('int64' for index arithmetic)."""

    value: float | int | bool
    dtype: str = "int64"


#: Binary operators. Arithmetic follows ONNX: ``/`` is true division for floats and
#: truncating division for integers; ``//`` is floor division (index arithmetic);
#: ``%`` takes the sign of the divisor (ONNX Mod fmod=0, also used for indices);
#: ``fmod`` takes the sign of the dividend (C fmod). ``and or xor`` are logical (bool),
#: ``bitand bitor bitxor shl shr`` bitwise. Comparisons give bool.
BIN_OPS = frozenset(
    [
        "+",
        "-",
        "*",
        "/",
        "//",
        "%",
        "fmod",
        "min",
        "max",
        "pow",
        "<",
        "<=",
        ">",
        ">=",
        "==",
        "!=",
        "and",
        "or",
        "xor",
        "bitand",
        "bitor",
        "bitxor",
        "shl",
        "shr",
    ]
)

#: Unary operators and math functions. ``round`` rounds half to even; ``sign`` gives
#: -1/0/1 in the operand's dtype; ``isnan``/``isinf``/``isposinf``/``isneginf`` give
#: bool; ``not`` is logical, ``bitnot`` bitwise; ``sigmoid`` is ``1 / (1 + exp(-x))``.
#: ``fence`` is its operand, computed on its own: no fast-math rewriting (contraction
#: into a fused multiply-add, reassociation) joins it with the expression around it, so
#: every copy of a value that ``compute_inline`` recomputes at several sites rounds
#: alike (see :func:`fenced`).
UN_OPS = frozenset(
    [
        "neg",
        "not",
        "bitnot",
        "abs",
        "exp",
        "log",
        "log1p",
        "sqrt",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "sigmoid",
        "floor",
        "ceil",
        "round",
        "sign",
        "isnan",
        "isinf",
        "isposinf",
        "isneginf",
        "fence",
    ]
)

#: the float operators whose results fast-math flags may rewrite together with their users
_FAST_MATH_ROOTS = frozenset(["+", "-", "*", "/"])


def fenced(value: Expr, dtype: str) -> Expr:
    """``value`` (of ``dtype``) as a ``fence`` when fast-math flags could compute it
    differently at different sites: a float32/float64 ``+ - * /`` (a ``x * y`` whose copy
    feeding a max is rounded but whose copy in ``x * y - max`` is contracted into a fused
    multiply-add ends up below its own max: exp of that underflowed a whole softmax column
    to 0 / 0, found by geode.fuzz); anything else as it is."""
    if dtype in ("float32", "float64") and isinstance(value, Bin) and value.op in _FAST_MATH_ROOTS:
        return Un("fence", value)
    return value


@dataclass(frozen=True)
class Bin(Expr):
    """Binary operation; ``op`` is one of :data:`BIN_OPS`."""

    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Un(Expr):
    """Unary operation or math function; ``op`` is one of :data:`UN_OPS`."""

    op: str
    a: Expr


@dataclass(frozen=True)
class Select(Expr):
    """``t if cond else f``."""

    cond: Expr
    t: Expr
    f: Expr


@dataclass(frozen=True)
class Cast(Expr):
    """Convert to a numpy dtype (by name)."""

    dtype: str
    a: Expr


@dataclass(frozen=True)
class Load(Expr):
    """Read one element of a buffer."""

    buffer: str
    indices: tuple[Expr, ...]


def wrap(x: object) -> Expr:
    """Python ints/floats/bools become Const; Exprs pass through."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x, "bool")
    if isinstance(x, (int, np.integer)):
        return Const(int(x), "int64")
    if isinstance(x, (float, np.floating)):
        return Const(float(x), "float64")
    raise TypeError(f"not an expression: {x!r}")


def _is_const(e: Expr, v: object) -> bool:
    return isinstance(e, Const) and e.value == v and e.dtype == "int64"


def add(a: Expr, b: Expr) -> Expr:
    """Index addition with trivial folding."""
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == "int64":
        return Const(a.value + b.value)
    if _is_const(a, 0):
        return b
    if _is_const(b, 0):
        return a
    return Bin("+", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    """Index subtraction with trivial folding."""
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == "int64":
        return Const(a.value - b.value)
    if _is_const(b, 0):
        return a
    return Bin("-", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    """Index multiplication with trivial folding."""
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == "int64":
        return Const(a.value * b.value)
    if _is_const(a, 1):
        return b
    if _is_const(b, 1):
        return a
    if _is_const(a, 0) or _is_const(b, 0):
        return Const(0)
    return Bin("*", a, b)


def floordiv(a: Expr, b: Expr) -> Expr:
    """Index floor division with trivial folding. A division by a constant 0 (a static
    dim of 0, whose loops never run, so the index is never used) folds to 0: neither
    Python's folding nor the machine's division may see it."""
    if _is_const(b, 0):
        return Const(0)
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == "int64":
        return Const(a.value // b.value)
    if _is_const(b, 1):
        return a
    if _is_const(a, 0):
        return a
    return Bin("//", a, b)


def mod(a: Expr, b: Expr) -> Expr:
    """Index modulo with trivial folding (modulo a constant 0 folds to 0, as
    :func:`floordiv`)."""
    if _is_const(b, 0):
        return Const(0)
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == "int64":
        return Const(a.value % b.value)
    if _is_const(b, 1):
        return Const(0)
    return Bin("%", a, b)


def prod(xs: list[Expr]) -> Expr:
    """Product of index expressions."""
    out: Expr = Const(1)
    for x in xs:
        out = mul(out, x)
    return out


_FOLD = {"+": add, "-": sub, "*": mul, "//": floordiv, "%": mod}


#: the direct sub-expressions of each expression class with any (the classes are final)
_KIDS: dict[type, Callable[[Any], tuple[Expr, ...]]] = {
    Bin: lambda e: (e.a, e.b),
    Un: lambda e: (e.a,),
    Cast: lambda e: (e.a,),
    Select: lambda e: (e.cond, e.t, e.f),
    Load: lambda e: e.indices,
}


def children(e: Expr) -> tuple[Expr, ...]:
    """Direct sub-expressions."""
    kids = _KIDS.get(type(e))
    return () if kids is None else kids(e)


def rebuild(e: Expr, kids: tuple[Expr, ...]) -> Expr:
    """``e`` with its direct sub-expressions replaced (same order as ``children``)."""
    if isinstance(e, Bin):
        if e.op in _FOLD:
            return _FOLD[e.op](kids[0], kids[1])
        return Bin(e.op, kids[0], kids[1])
    if isinstance(e, Un):
        return Un(e.op, kids[0])
    if isinstance(e, Cast):
        return Cast(e.dtype, kids[0])
    if isinstance(e, Select):
        return Select(kids[0], kids[1], kids[2])
    if isinstance(e, Load):
        return Load(e.buffer, tuple(kids))
    return e


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: ``fn`` returns a replacement or None to keep the node.

    Each node is offered to ``fn`` once. When rebuilding a node over rewritten children
    folds it to one of them (``0 * 2 + x`` -> ``x``), that child is already rewritten
    and is returned as it is: offering it again would apply a substitution twice when
    its result names a variable the substitution also replaces (``x -> y``, ``y -> z``
    gave ``z``)."""
    kind = type(e)
    if kind is Bin:
        a, b = transform(e.a, fn), transform(e.b, fn)
        if a is not e.a or b is not e.b:
            e = rebuild(e, (a, b))
            if e is a or e is b:
                return e
    elif kind is Un or kind is Cast:
        a = transform(e.a, fn)
        if a is not e.a:
            e = rebuild(e, (a,))
            if e is a:
                return e
    elif kind is Select or kind is Load:
        kids = children(e)
        new_kids = tuple([transform(k, fn) for k in kids])
        if any(n is not o for n, o in zip(new_kids, kids)):
            e = rebuild(e, new_kids)
            if any(e is k for k in new_kids):
                return e
    r = fn(e)
    return e if r is None else r


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace variables by expressions."""
    if not mapping:
        return e
    return transform(e, lambda x: mapping.get(x.name) if isinstance(x, Var) else None)


def walk(e: Expr) -> Iterator[Expr]:
    """Every sub-expression, pre-order (:func:`preorder`'s list; expressions are
    immutable, so the list is what a lazy walk would yield). The list of each of the
    most recent expressions walked is kept, by identity: a schedule walks the same
    statements' expressions many times."""
    return iter(_preorder_of(_Identity(e)))


class _Identity:
    """An expression as a memo key by identity (hashing a frozen dataclass walks it; the
    memo holding the key keeps the expression, so its id is not reused meanwhile)."""

    __slots__ = ("e",)

    def __init__(self, e: Expr):
        self.e = e

    def __hash__(self) -> int:
        return id(self.e)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.e is self.e


@functools.lru_cache(maxsize=8192)
def _preorder_of(key: _Identity) -> tuple[Expr, ...]:
    return tuple(preorder(key.e))


@functools.lru_cache(maxsize=8192)
def _vars_of(key: _Identity) -> frozenset[str]:
    return frozenset(x.name for x in _preorder_of(key) if isinstance(x, Var))


@functools.lru_cache(maxsize=8192)
def _loads_of(key: _Identity) -> tuple[Load, ...]:
    return tuple(x for x in _preorder_of(key) if isinstance(x, Load))


def forget_expression_memos() -> None:
    """Drop the per-expression memos (pre-order walks, free variables, loads). Each holds
    the expressions it was asked about, and a compile's expressions are its own: the
    spine drops them when a compile ends, so a process compiling model after model keeps
    none of them (the memos' bound alone let RSS grow by about 2.5 MB)."""
    _preorder_of.cache_clear()
    _vars_of.cache_clear()
    _loads_of.cache_clear()


def free_vars(e: Expr) -> set[str]:
    """Names of variables an expression reads (kept per expression like :func:`walk`'s
    lists; a new set each call)."""
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, Const):
        return set()
    return set(_vars_of(_Identity(e)))


def uses_var(e: Expr, name: str) -> bool:
    """Whether ``e`` reads variable ``name`` (:func:`free_vars` without building a set)."""
    if isinstance(e, Var):
        return e.name == name
    if isinstance(e, Const):
        return False
    return name in _vars_of(_Identity(e))


def loads(e: Expr) -> list[Load]:
    """Loads in an expression, pre-order (kept per expression like :func:`walk`'s lists;
    a new list each call)."""
    if isinstance(e, (Var, Const)):
        return []
    return list(_loads_of(_Identity(e)))


def reads_buffer(e: Expr, buffer: str) -> bool:
    """Whether ``e`` loads from ``buffer`` anywhere."""
    if isinstance(e, (Var, Const)):
        return False
    return any(x.buffer == buffer for x in _loads_of(_Identity(e)))


def transform_loads_of(e: Expr, buffer: str, fn: Callable[[Expr], Expr | None]) -> Expr:
    """:func:`transform` for a rewrite ``fn`` that replaces only loads of ``buffer``
    (None for every other node): ``e`` itself, unwalked, when it reads no ``buffer``,
    which is what the full rewrite would return (no node replaced, nothing rebuilt)."""
    return transform(e, fn) if reads_buffer(e, buffer) else e


def preorder(e: Expr) -> list[Expr]:
    """Every sub-expression, pre-order, as a list, walked with an explicit stack (not
    nested generators: the schedule asks for the loads of every statement many times)."""
    out: list[Expr] = []
    stack = [e]
    kids_of = _KIDS.get
    while stack:
        x = stack.pop()
        out.append(x)
        kids = kids_of(type(x))
        if kids is not None:
            stack.extend(kids(x)[::-1])
    return out


# ---------------------------------------------------------------------------------
# statements
# ---------------------------------------------------------------------------------


class ForKind(enum.Enum):
    """How a loop runs."""

    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"


class Stmt:
    """Base of all statements."""


@dataclass(eq=False)
class For(Stmt):
    """``for var in range(extent)``; ``kind`` says serial/parallel/vectorized/unrolled.

    ``interleave`` (vectorized loops, see :meth:`Schedule.interleave`) is how many vectors
    of consecutive iterations the backend computes side by side."""

    var: str
    extent: Expr
    body: list[Stmt]
    kind: ForKind = ForKind.SERIAL
    interleave: int = 1

    def __deepcopy__(self, memo: dict) -> For:
        return For(self.var, self.extent, clone_stmts(self.body), self.kind, self.interleave)


@dataclass
class IterVar:
    """A block iteration variable: its extent and whether it is spatial or reduce."""

    name: str
    extent: Expr
    kind: str = "spatial"  # spatial | reduce


@dataclass(eq=False)
class Block(Stmt):
    """A ScheduleBlock: iteration variables bound to loop expressions, and its body.

    ``predicate`` (if set) guards the body (tiles that overrun the extent). ``init``
    marks the initialisation block of a reduction (``reduce_of`` names the block).
    """

    name: str
    iter_vars: list[IterVar]
    bindings: list[Expr]
    body: list[Stmt]
    predicate: Expr | None = None
    reduce_of: str | None = None

    def __deepcopy__(self, memo: dict) -> Block:
        return Block(
            self.name,
            [IterVar(iv.name, iv.extent, iv.kind) for iv in self.iter_vars],
            list(self.bindings),
            clone_stmts(self.body),
            self.predicate,
            self.reduce_of,
        )


@dataclass(eq=False)
class Store(Stmt):
    """``buffer[indices] = value``.

    ``nontemporal`` (a bool expression of the dims, or None; see
    :meth:`Schedule.store_nontemporal`): when it holds, the backend may write a kernel
    output with non-temporal (streaming) vector stores straight from the registers, in
    runs of its enclosing loop that start on a vector boundary. The values written are
    the same either way."""

    buffer: str
    indices: tuple[Expr, ...]
    value: Expr
    nontemporal: Expr | None = None

    def __deepcopy__(self, memo: dict) -> Store:
        return Store(self.buffer, self.indices, self.value, self.nontemporal)


@dataclass(eq=False)
class If(Stmt):
    """``if cond: body``."""

    cond: Expr
    body: list[Stmt]

    def __deepcopy__(self, memo: dict) -> If:
        return If(self.cond, clone_stmts(self.body))


@dataclass(eq=False)
class Prefetch(Stmt):
    """``prefetch(buffer, offset)``: a hint to bring the cache line holding element
    ``offset`` of ``buffer`` (flat, row-major) closer; no effect on values, and an
    offset past the end is harmless (a prefetch never faults). ``level`` is the nearest
    cache level the line should reach: 1 (all levels, the default) or 2 (the L2 and
    beyond, leaving the L1 to the data in use); printed as ``prefetch(X, off, L2)``."""

    buffer: str
    offset: Expr
    level: int = 1

    def __deepcopy__(self, memo: dict) -> Prefetch:
        return Prefetch(self.buffer, self.offset, self.level)


@dataclass(eq=False)
class StreamStore(Stmt):
    """``buffer[offset : offset + length] = src[src_offset : src_offset + length]``
    (flat, row-major offsets): copies values staged in local buffer ``src`` into
    kernel output ``buffer``. When ``nontemporal`` (a bool expression of the dims)
    holds, the backend uses non-temporal (streaming) stores: the output's cache lines
    are not read from memory before being overwritten and do not stay in the caches.
    The values written are the same either way."""

    buffer: str
    offset: Expr
    src: str
    src_offset: Expr
    length: Expr
    nontemporal: Expr

    def __deepcopy__(self, memo: dict) -> StreamStore:
        return StreamStore(
            self.buffer, self.offset, self.src, self.src_offset, self.length, self.nontemporal
        )


@dataclass
class Buffer:
    """A tensor a kernel reads or writes: global (argument), local (temporary array)
    or register (a scalar temporary).

    ``nan_insensitive`` (max/min reduction results only): the kernel's outputs are the
    same whether this reduction propagates a NaN of its inputs or not, because the NaN
    reaches every affected output another way (softmax's sum, see
    :mod:`geode.codegen.nan_flow`); a backend may then reduce it ignoring NaN."""

    name: str
    dtype: str
    shape: tuple[Expr, ...]
    scope: str = "global"  # global | local | register
    nan_insensitive: bool = False

    def __deepcopy__(self, memo: dict) -> Buffer:
        # its fields are strings, flags and a tuple of (immutable) expressions
        new = Buffer(self.name, self.dtype, self.shape, self.scope, self.nan_insensitive)
        memo[id(self)] = new
        return new


@dataclass
class Kernel:
    """A function: argument buffers (inputs then outputs), symbolic dim arguments,
    temporary buffers and the loop body."""

    name: str
    inputs: list[Buffer]
    outputs: list[Buffer]
    dims: list[str]
    body: list[Stmt]
    temps: list[Buffer] = field(default_factory=list)

    def __deepcopy__(self, memo: dict) -> Kernel:
        # a schedule backs up its kernel before every primitive: copy the statements
        # and buffers, share the (immutable) expressions, skip the generic reconstruction
        return Kernel(
            self.name,
            _clone_buffers(self.inputs, memo),
            _clone_buffers(self.outputs, memo),
            list(self.dims),
            clone_stmts(self.body),
            _clone_buffers(self.temps, memo),
        )

    def buffer(self, name: str) -> Buffer:
        """The buffer called ``name`` (argument or temporary)."""
        for b in self.inputs + self.outputs + self.temps:
            if b.name == name:
                return b
        raise KeyError(name)

    def copy(self) -> Kernel:
        """A deep copy (schedules work on copies to keep the lowered form)."""
        return copy.deepcopy(self)


def _clone_buffers(bufs: list[Buffer], memo: dict) -> list[Buffer]:
    # what copy.deepcopy of the list gives (a buffer met before is its earlier copy),
    # without the generic dispatch: a schedule copies its kernel before every primitive
    out: list[Buffer] = []
    for b in bufs:
        done = memo.get(id(b))
        out.append(done if done is not None else b.__deepcopy__(memo))
    return out


def clone_stmts(stmts: list[Stmt]) -> list[Stmt]:
    """A copy of a statement list (what ``copy.deepcopy`` gives: new statements and
    lists, the immutable expressions shared), made directly: a schedule copies its
    kernel's statements before every primitive, and the generic deep copy's dispatch
    and memo cost more than the copying. A statement type not known here is deep-copied."""
    out: list[Stmt] = []
    for st in stmts:
        kind = type(st)
        if kind is Store:
            out.append(Store(st.buffer, st.indices, st.value, st.nontemporal))
        elif kind is For:
            out.append(For(st.var, st.extent, clone_stmts(st.body), st.kind, st.interleave))
        elif kind is Block:
            out.append(
                Block(
                    st.name,
                    [IterVar(iv.name, iv.extent, iv.kind) for iv in st.iter_vars],
                    list(st.bindings),
                    clone_stmts(st.body),
                    st.predicate,
                    st.reduce_of,
                )
            )
        elif kind is If:
            out.append(If(st.cond, clone_stmts(st.body)))
        else:
            out.append(copy.deepcopy(st))
    return out


def walk_stmts(stmts: list[Stmt]) -> Iterator[Stmt]:
    """Every statement, pre-order."""
    for s in stmts:
        yield s
        if isinstance(s, (For, Block, If)):
            yield from walk_stmts(s.body)


def blocks(stmts: list[Stmt]) -> list[Block]:
    """ScheduleBlocks in program order."""
    out: list[Block] = []
    _collect_blocks(stmts, out)
    return out


def _collect_blocks(stmts: list[Stmt], out: list[Block]) -> None:
    # pre-order, recursing only into statements that hold others (the statement classes
    # are final): the schedule lists its kernel's blocks for every block it looks up
    for s in stmts:
        kind = type(s)
        if kind is Block:
            out.append(s)
            _collect_blocks(s.body, out)
        elif kind is For or kind is If:
            _collect_blocks(s.body, out)


def stmt_exprs(s: Stmt) -> list[Expr]:
    """Expressions a statement holds directly (not those of nested statements)."""
    if isinstance(s, Store):
        flag = [] if s.nontemporal is None else [s.nontemporal]
        return [*s.indices, s.value, *flag]
    if isinstance(s, For):
        return [s.extent]
    if isinstance(s, Block):
        out = list(s.bindings) + [iv.extent for iv in s.iter_vars]
        return out + ([s.predicate] if s.predicate is not None else [])
    if isinstance(s, If):
        return [s.cond]
    if isinstance(s, Prefetch):
        return [s.offset]
    if isinstance(s, StreamStore):
        return [s.offset, s.src_offset, s.length, s.nontemporal]
    return []


# ---------------------------------------------------------------------------------
# printer
# ---------------------------------------------------------------------------------

_PREC = {
    "or": 1,
    "and": 2,
    "xor": 2,
    "<": 3,
    "<=": 3,
    ">": 3,
    ">=": 3,
    "==": 3,
    "!=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "//": 5,
    "%": 5,
}


def expr_str(e: Expr, parent: int = 0) -> str:
    """Readable text for an expression."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        if e.dtype == "bool":
            return "true" if e.value else "false"
        if e.dtype.startswith("float"):
            suffix = "f" if e.dtype == "float32" else ("h" if e.dtype == "float16" else "")
            return f"{float(e.value)!r}{suffix}"
        return str(e.value)
    if isinstance(e, Bin):
        if e.op in _PREC:
            p = _PREC[e.op]
            s = f"{expr_str(e.a, p)} {e.op} {expr_str(e.b, p + 1)}"
            return f"({s})" if p < parent else s
        return f"{e.op}({expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, Un):
        if e.op == "neg":
            return f"-{expr_str(e.a, 6)}"
        if e.op == "not":
            return f"!{expr_str(e.a, 6)}"
        return f"{e.op}({expr_str(e.a)})"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.t)}, {expr_str(e.f)})"
    if isinstance(e, Cast):
        return f"cast<{e.dtype}>({expr_str(e.a)})"
    if isinstance(e, Load):
        return f"{e.buffer}[{', '.join(expr_str(i) for i in e.indices)}]"
    return repr(e)


def _stmt_lines(s: Stmt, ind: str) -> list[str]:
    if isinstance(s, For):
        head = f"{ind}{s.kind.value} for ({s.var}, 0, {expr_str(s.extent)})"
        if s.interleave > 1:
            head += f" interleave({s.interleave})"
        out = [head, f"{ind}{{"]
        for b in s.body:
            out += _stmt_lines(b, ind + "  ")
        return out + [f"{ind}}}"]
    if isinstance(s, Block):
        out = [f"{ind}ScheduleBlock({s.name})", f"{ind}{{"]
        inner = ind + "  "
        if s.iter_vars:
            names = ", ".join(
                ("" if iv.kind == "spatial" else "r:") + iv.name for iv in s.iter_vars
            )
            out.append(f"{inner}{names} = axis.bind({', '.join(expr_str(b) for b in s.bindings)})")
        if s.predicate is not None:
            out.append(f"{inner}predicate = {expr_str(s.predicate)}")
        for b in s.body:
            out += _stmt_lines(b, inner)
        return out + [f"{ind}}}"]
    if isinstance(s, Store):
        idx = ", ".join(expr_str(i) for i in s.indices)
        nt = "" if s.nontemporal is None else f", nontemporal={expr_str(s.nontemporal)}"
        return [f"{ind}{s.buffer}[{idx}] = {expr_str(s.value)}{nt}"]
    if isinstance(s, Prefetch):
        lvl = f", L{s.level}" if s.level != 1 else ""
        return [f"{ind}prefetch({s.buffer}, {expr_str(s.offset)}{lvl})"]
    if isinstance(s, StreamStore):
        n = expr_str(s.length)
        return [
            f"{ind}stream({s.buffer}[{expr_str(s.offset)} +: {n}] = "
            f"{s.src}[{expr_str(s.src_offset)} +: {n}], nontemporal={expr_str(s.nontemporal)})"
        ]
    if isinstance(s, If):
        out = [f"{ind}if ({expr_str(s.cond)})", f"{ind}{{"]
        for b in s.body:
            out += _stmt_lines(b, ind + "  ")
        return out + [f"{ind}}}"]
    return [f"{ind}{s!r}"]


def _buf_str(b: Buffer) -> str:
    return f"{b.name}: {b.dtype}[{', '.join(expr_str(d) for d in b.shape)}]"


def format_stmts(stmts: list[Stmt], indent: str = "") -> str:
    """Readable text for a statement list."""
    lines: list[str] = []
    for s in stmts:
        lines += _stmt_lines(s, indent)
    return "\n".join(lines)


def format_kernel(k: Kernel) -> str:
    """Readable text for a kernel, in the style of CINN's AST printer."""
    args = ", ".join(_buf_str(b) for b in k.inputs + k.outputs)
    dims = f"; dims {', '.join(k.dims)}" if k.dims else ""
    lines = [f"kernel {k.name}({args}{dims})"]
    for t in k.temps:
        note = "  (NaN-insensitive)" if t.nan_insensitive else ""
        lines.append(f"  {t.scope} {_buf_str(t)}{note}")
    lines.append("{")
    lines.append(format_stmts(k.body, "  "))
    lines.append("}")
    return "\n".join(lines)
