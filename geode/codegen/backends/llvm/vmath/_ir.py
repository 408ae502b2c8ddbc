"""IR-text writing for the vmath functions: float kinds, literals and a straight-line
function builder.

Every vmath function is one basic block of SSA instructions (no branches: special
cases are ``select``). :class:`FunctionBuilder` hands out SSA names, formats each
instruction with its operand types, and records what the body needs besides itself:
the intrinsics it calls (with their ``declare`` lines), the constant tables it loads
from and the other vmath functions it calls. No instruction carries fast-math flags,
so inlined into a caller that has them, the vmath code keeps IEEE semantics (LLVM keeps
each instruction's own flags when it inlines).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["F32", "F64", "FloatKind", "FunctionBuilder", "Val", "float_bits", "float_literal"]


@dataclass(frozen=True)
class FloatKind:
    """A float type the functions compute in and its integer twin."""

    #: IR type (``float``/``double``)
    ty: str
    #: same-width integer IR type
    ity: str
    #: width in bits
    bits: int
    #: explicit mantissa bits
    mant: int
    #: exponent bias
    bias: int
    #: name suffix of functions and intrinsics (``f32``/``f64``)
    suffix: str
    #: numpy dtype name
    dtype: str

    def round(self, value: float) -> float:
        """``value`` rounded to this type (as a Python float)."""
        return float(np.float32(value)) if self.bits == 32 else float(value)


F32 = FloatKind("float", "i32", 32, 23, 127, "f32", "float32")
F64 = FloatKind("double", "i64", 64, 52, 1023, "f64", "float64")


def float_literal(value: float, kind: FloatKind) -> str:
    """The IR literal of ``value`` rounded to ``kind``: IR writes float and double
    constants alike as the hexadecimal bits of the double holding the value.

    >>> float_literal(1.0, F32)
    '0x3FF0000000000000'
    >>> float_literal(0.1, F32)
    '0x3FB99999A0000000'
    """
    v = kind.round(value)
    if math.isnan(v):
        v = math.nan  # canonical quiet NaN
    return f"0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016X}"


def float_bits(kind: FloatKind, value: float) -> int:
    """The bits of ``value`` rounded to ``kind``, as an unsigned integer.

    >>> hex(float_bits(F32, 1.0))
    '0x3f800000'
    """
    arr = np.array([value], dtype=kind.dtype)
    return int(arr.view(np.uint32 if kind.bits == 32 else np.uint64)[0])


@dataclass(frozen=True)
class Val:
    """An IR operand (``%t3``, a literal) and its type."""

    ref: str
    ty: str

    def __str__(self) -> str:
        return f"{self.ty} {self.ref}"


def _intrinsic_decl(name: str, ret: str, args: Sequence[str]) -> str:
    return f"declare {ret} @{name}({', '.join(args)})"


class FunctionBuilder:
    """A straight-line function being written (see the module docstring).

    Float arithmetic methods take and return :class:`Val`; constants come from
    :meth:`const` / :meth:`iconst`. :meth:`text` prints the finished definition.
    """

    def __init__(self, name: str, ret: str, params: Sequence[tuple[str, str]]):
        self.name = name
        self.ret_ty = ret
        self.params = [Val(f"%{pname}", ty) for ty, pname in params]
        self.lines: list[str] = []
        #: intrinsic name -> its declare line
        self.declares: dict[str, str] = {}
        #: names of the constant tables loaded from
        self.tables: set[str] = set()
        #: names of the vmath functions called
        self.callees: set[str] = set()
        self._n = 0
        self._returned = False

    # -- plumbing -------------------------------------------------------------------
    def _emit(self, ty: str, text: str) -> Val:
        if self._returned:
            raise AssertionError(f"{self.name}: instruction after ret: {text}")
        ref = f"%t{self._n}"
        self._n += 1
        self.lines.append(f"  {ref} = {text}")
        return Val(ref, ty)

    def const(self, kind: FloatKind, value: float) -> Val:
        """A float constant (rounded to ``kind``)."""
        return Val(float_literal(value, kind), kind.ty)

    @staticmethod
    def iconst(ity: str, value: int) -> Val:
        """An integer constant of type ``ity`` (written as a signed decimal)."""
        bits = int(ity[1:])
        v = value & ((1 << bits) - 1)
        if v >= 1 << (bits - 1):
            v -= 1 << bits
        return Val(str(v), ity)

    def _binop(self, op: str, a: Val, b: Val) -> Val:
        if a.ty != b.ty:
            raise AssertionError(f"{self.name}: {op} of {a.ty} and {b.ty}")
        return self._emit(a.ty, f"{op} {a.ty} {a.ref}, {b.ref}")

    def _intrinsic(self, base: str, ret: str, args: Sequence[Val], suffix: str) -> Val:
        name = f"llvm.{base}.{suffix}"
        self.declares.setdefault(name, _intrinsic_decl(name, ret, [a.ty for a in args]))
        return self._emit(ret, f"call {ret} @{name}({', '.join(map(str, args))})")

    # -- float arithmetic (no fast-math flags) --------------------------------------
    def fadd(self, a: Val, b: Val) -> Val:
        """``a + b``."""
        return self._binop("fadd", a, b)

    def fsub(self, a: Val, b: Val) -> Val:
        """``a - b``."""
        return self._binop("fsub", a, b)

    def fmul(self, a: Val, b: Val) -> Val:
        """``a * b``."""
        return self._binop("fmul", a, b)

    def fdiv(self, a: Val, b: Val) -> Val:
        """``a / b`` (IEEE division: no flag lets LLVM use a reciprocal estimate)."""
        return self._binop("fdiv", a, b)

    def fneg(self, a: Val) -> Val:
        """``-a`` (sign flip)."""
        return self._emit(a.ty, f"fneg {a}")

    def fcmp(self, pred: str, a: Val, b: Val) -> Val:
        """``fcmp pred a, b`` (``olt``, ``ogt``, ``oeq``, ``une`` ...) as an ``i1``."""
        if a.ty != b.ty:
            raise AssertionError(f"{self.name}: fcmp of {a.ty} and {b.ty}")
        return self._emit("i1", f"fcmp {pred} {a.ty} {a.ref}, {b.ref}")

    def select(self, cond: Val, a: Val, b: Val) -> Val:
        """``a if cond else b`` (one ``select``, no branch)."""
        if a.ty != b.ty or cond.ty != "i1":
            raise AssertionError(f"{self.name}: select {cond.ty} ? {a.ty} : {b.ty}")
        return self._emit(a.ty, f"select i1 {cond.ref}, {a}, {b}")

    def fmuladd(self, a: Val, b: Val, c: Val) -> Val:
        """``a * b + c``, fused when the target has FMA (``llvm.fmuladd``)."""
        return self._intrinsic("fmuladd", a.ty, [a, b, c], _suffix(a.ty))

    def fma(self, a: Val, b: Val, c: Val) -> Val:
        """``a * b + c`` rounded once on every target (``llvm.fma``; exact two-products)."""
        return self._intrinsic("fma", a.ty, [a, b, c], _suffix(a.ty))

    def rint(self, a: Val) -> Val:
        """Round to an integer, ties to even (``llvm.rint``)."""
        return self._intrinsic("rint", a.ty, [a], _suffix(a.ty))

    def floor(self, a: Val) -> Val:
        """Round toward -inf (``llvm.floor``)."""
        return self._intrinsic("floor", a.ty, [a], _suffix(a.ty))

    def fabs(self, a: Val) -> Val:
        """``|a|`` (``llvm.fabs``)."""
        return self._intrinsic("fabs", a.ty, [a], _suffix(a.ty))

    def copysign(self, mag: Val, sgn: Val) -> Val:
        """Magnitude of ``mag`` with the sign bit of ``sgn`` (``llvm.copysign``)."""
        return self._intrinsic("copysign", mag.ty, [mag, sgn], _suffix(mag.ty))

    def ldexp(self, a: Val, n: Val) -> Val:
        """``a * 2**n`` rounded once, ``n`` an ``i32`` (``llvm.ldexp``; ``vscalefps``)."""
        return self._intrinsic("ldexp", a.ty, [a, n], f"{_suffix(a.ty)}.{n.ty}")

    # -- integer and conversion instructions ----------------------------------------
    def bitcast(self, a: Val, ty: str) -> Val:
        """Reinterpret the bits of ``a`` as ``ty``."""
        return self._emit(ty, f"bitcast {a} to {ty}")

    def add(self, a: Val, b: Val) -> Val:
        """Integer ``a + b`` (wrapping)."""
        return self._binop("add", a, b)

    def sub(self, a: Val, b: Val) -> Val:
        """Integer ``a - b`` (wrapping)."""
        return self._binop("sub", a, b)

    def and_(self, a: Val, b: Val) -> Val:
        """Bitwise and."""
        return self._binop("and", a, b)

    def shl(self, a: Val, b: Val) -> Val:
        """Shift left."""
        return self._binop("shl", a, b)

    def lshr(self, a: Val, b: Val) -> Val:
        """Logical shift right."""
        return self._binop("lshr", a, b)

    def ashr(self, a: Val, b: Val) -> Val:
        """Arithmetic shift right."""
        return self._binop("ashr", a, b)

    def icmp(self, pred: str, a: Val, b: Val) -> Val:
        """``icmp pred a, b`` (``ugt``, ``eq``, ``ult`` ...) as an ``i1``."""
        if a.ty != b.ty:
            raise AssertionError(f"{self.name}: icmp of {a.ty} and {b.ty}")
        return self._emit("i1", f"icmp {pred} {a.ty} {a.ref}, {b.ref}")

    def convert(self, op: str, a: Val, ty: str) -> Val:
        """A conversion (``sitofp``, ``fpext``, ``fptrunc``, ``zext``, ``trunc``)."""
        return self._emit(ty, f"{op} {a} to {ty}")

    def load_table(self, table: str, rows: int, index: Val) -> Val:
        """``table[index]`` from a constant ``[rows x double]`` global (a vector gather
        once vectorized); ``index`` is an ``i64`` known to be below ``rows``."""
        self.tables.add(table)
        ptr = self._emit(
            "ptr", f"getelementptr inbounds [{rows} x double], ptr @{table}, i64 0, {index}"
        )
        return self._emit("double", f"load double, ptr {ptr.ref}, align 8")

    def call(self, fn: str, ret: str, args: Sequence[Val]) -> Val:
        """Call another vmath function (recorded as a dependency)."""
        self.callees.add(fn)
        return self._emit(ret, f"call {ret} @{fn}({', '.join(map(str, args))})")

    def ret(self, v: Val) -> None:
        """End the function returning ``v``."""
        if v.ty != self.ret_ty:
            raise AssertionError(f"{self.name}: returns {v.ty}, declared {self.ret_ty}")
        self.lines.append(f"  ret {v}")
        self._returned = True

    # -- output ---------------------------------------------------------------------
    def text(self, attrs: str) -> str:
        """The definition: ``internal`` linkage, function attributes ``attrs``."""
        if not self._returned:
            raise AssertionError(f"{self.name}: no ret")
        params = ", ".join(str(p) for p in self.params)
        head = f"define internal {self.ret_ty} @{self.name}({params}) {attrs} {{"
        return "\n".join([head, "entry:", *self.lines, "}"])


def _suffix(ty: str) -> str:
    return {"float": "f32", "double": "f64"}[ty]
