"""Building blocks of the numba backend's generated Python: dtype names and numpy
promotion, operator precedence and the typed source fragments (``Src``), op tables,
name sanitising, and the AST facts the emitter asks (sizes, folded constants, which
kernels are chunked).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from geode.codegen.ast import (
    Const,
    Expr,
    For,
    ForKind,
    Kernel,
    Store,
    StreamStore,
    walk_stmts,
)
from geode.errors import CodegenError

# ---------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------

FLOATS = ("float16", "float32", "float64")
SINTS = ("int8", "int16", "int32", "int64")
UINTS = ("uint8", "uint16", "uint32", "uint64")
ALL = (*FLOATS, *SINTS, *UINTS, "bool")
WEAK = ("int64", "float64", "bool")


def dtype_name(dtype: str, where: str) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise CodegenError(f"{where}: unknown dtype {dtype!r}") from None
    if name not in ALL:
        raise CodegenError(f"{where}: dtype {name} is not supported by the numba backend")
    return name


def nb_scalar(dtype: str) -> str:
    """numba type expression (in the generated module) of a buffer's element."""
    if dtype == "float16":
        return "_t.uint16"
    if dtype == "bool":
        return "_t.boolean"
    return f"_t.{dtype}"


def np_ctor(dtype: str) -> str:
    """Constructor of a value of ``dtype`` in generated code (float16 carried as float32)."""
    if dtype == "float16":
        return "np.float32"
    if dtype == "bool":
        return "np.bool_"
    return f"np.{dtype}"


def promote(a: str, a_weak: bool, b: str, b_weak: bool) -> str:
    """numpy 2 (NEP 50) promotion; a weak operand acts as a Python scalar of its kind."""
    if a_weak and not b_weak:
        return np.result_type(weak_scalar(a), np.dtype(b)).name
    if b_weak and not a_weak:
        return np.result_type(np.dtype(a), weak_scalar(b)).name
    return np.promote_types(a, b).name


def weak_scalar(dtype: str) -> object:
    return {"int64": 0, "float64": 0.0, "bool": False}[dtype]


def float_for(dtype: str) -> str:
    """The float dtype numpy computes a math function of ``dtype`` in."""
    if dtype in FLOATS:
        return dtype
    return np.promote_types(dtype, np.float16).name


# ---------------------------------------------------------------------------------
# emitted values and precedence
# ---------------------------------------------------------------------------------

ATOM = 100  # names, literals, calls, subscripts
POW = 95
UNARY = 90
MUL = 80
ADD = 70
SHIFT = 60
BAND = 50
BXOR = 40
BOR = 30
CMP = 20
NOT = 15
TERNARY = 5


class Src(NamedTuple):
    code: str
    dtype: str
    prec: int
    literal: object = None  # the value, when the code is a literal constant


def paren(v: Src, min_prec: int) -> str:
    return v.code if v.prec >= min_prec else f"({v.code})"


def call_text(fn: str, *args: Src | str) -> str:
    return f"{fn}({', '.join(a if isinstance(a, str) else a.code for a in args)})"


PY_OPS = {
    "+": ("+", ADD),
    "-": ("-", ADD),
    "*": ("*", MUL),
    "/": ("/", MUL),
    "//": ("//", MUL),
    "%": ("%", MUL),
}
CMP_OPS = {"<", "<=", ">", ">=", "==", "!="}
LOGIC_OPS = {"and": ("&", BAND), "or": ("|", BOR), "xor": ("^", BXOR)}
BIT_OPS = {"bitand": ("&", BAND), "bitor": ("|", BOR), "bitxor": ("^", BXOR)}
MATH_UN = {
    "exp": "math.exp",
    "log": "math.log",
    "log1p": "math.log1p",
    "sqrt": "math.sqrt",
    "sin": "math.sin",
    "cos": "math.cos",
    "tan": "math.tan",
    "asin": "math.asin",
    "acos": "math.acos",
    "atan": "math.atan",
    "sinh": "math.sinh",
    "cosh": "math.cosh",
    "tanh": "math.tanh",
    "asinh": "math.asinh",
    "acosh": "math.acosh",
    "atanh": "math.atanh",
    "erf": "math.erf",
}
ROUND_UN = {"floor": "np.floor", "ceil": "np.ceil", "round": "np.rint"}


def _implemented_ops() -> tuple[set[str], set[str]]:
    """The binary and unary ops the emitter handles (tests compare with the AST's)."""
    binary = set(PY_OPS) | CMP_OPS | set(LOGIC_OPS) | set(BIT_OPS)
    binary |= {"fmod", "min", "max", "pow", "shl", "shr"}
    unary = set(MATH_UN) | set(ROUND_UN) | {"sigmoid"}
    unary |= {"neg", "not", "bitnot", "abs", "sign", "isnan", "isinf", "isposinf", "isneginf"}
    unary |= {"fence"}
    return binary, unary


# ---------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------

_RESERVED = frozenset(
    set(keyword.kwlist)
    | set(keyword.softkwlist)
    | {
        "np",
        "math",
        "numba",
        "range",
        "min",
        "max",
        "abs",
        "int",
        "float",
        "bool",
        "SIGNATURE",
        "NJIT_OPTIONS",
        "ValueError",
        "print",
        "len",
    }
)


class Names:
    """Python identifiers for AST names: sanitised, unique within the function."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def fresh(self, name: str) -> str:
        base = re.sub(r"\W", "_", name) or "v"
        if base[0].isdigit():
            base = "v_" + base
        if base.startswith("_"):
            base = "v" + base
        if base in _RESERVED:
            base += "_"
        out = base
        n = 1
        while out in self.used:
            out = f"{base}_{n}"
            n += 1
        self.used.add(out)
        return out


# ---------------------------------------------------------------------------------
# the emitter
# ---------------------------------------------------------------------------------


class Demote(Exception):
    """A register buffer was indexed by a non-constant: re-emit it as a local array."""

    def __init__(self, buffer: str):
        self.buffer = buffer


@dataclass
class Emitted:
    source: str
    func_name: str
    parallel: bool
    half_args: list[int] = field(default_factory=list)
    zero_d_args: list[int] = field(default_factory=list)
    #: (buffer name, "input"/"output", dtype, rank) of every array argument, in order
    arrays: list[tuple[str, str, str, int]] = field(default_factory=list)
    dims: list[str] = field(default_factory=list)
    #: the chunk function of a chunked kernel and the body it calls (see "Chunked
    #: kernels"), else None
    rows_name: str | None = None
    body_name: str | None = None
    #: a chunked kernel's streaming body (see ``_Emitter.plan_nontemporal``) and the
    #: chunk function that calls it, else None
    nt_body_name: str | None = None
    nt_rows_name: str | None = None
    #: (name in :mod:`geode.codegen.backends.vmath`, argument dtype) of every vmath
    #: function the kernel calls
    vmath: tuple[tuple[str, str], ...] = ()


def is_weak(e: Expr, v: Src) -> bool:
    return isinstance(e, Const) and v.dtype in WEAK


def shape_text(d: Expr) -> str:
    from geode.codegen.ast import expr_str

    return expr_str(d)


def has_parallel(kernel: Kernel) -> bool:
    return any(isinstance(s, For) and s.kind == ForKind.PARALLEL for s in walk_stmts(kernel.body))


def chunkable(kernel: Kernel) -> bool:
    """Can the kernel run chunked (see "Chunked kernels")? Its one top-level parallel
    loop is its only top-level loop, and every other top-level statement only computes
    values (no store), so each chunk may run them itself."""
    par = [s for s in kernel.body if isinstance(s, For) and s.kind == ForKind.PARALLEL]
    return len(par) == 1 and not any(
        isinstance(x, (Store, StreamStore, For))
        for s in kernel.body
        if s is not par[0]
        for x in walk_stmts([s])
    )
