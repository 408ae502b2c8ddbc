"""Typed IR values: constants, conversions between dtypes, float16 rounding.

A :class:`V` is an IR operand with the numpy dtype it stands for. :class:`ValueWriter`
prints constants and conversions into the function being written (``self.fn``) and
declares the intrinsics they need in the module (``self.module``); the expression and
statement writers build on it.

Conversions follow numpy's ``astype``: float -> bool is ``x != 0`` (NaN is true),
float -> int truncates (saturating: out-of-range values clamp and NaN gives 0, where C
and numpy leave them undefined), every result is computed in its own dtype, and a
float16 result is rounded to float16 once, from whatever precision it was computed in
(:meth:`ValueWriter.to_half`: a double goes through float rounded to odd, which rounds
to the same half as the double itself; a direct double -> half truncation would be a
call to compiler-rt's ``__truncdfhf2``, which the JIT need not find).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from geode.codegen.backends.llvm import dtypes as D
from geode.codegen.backends.llvm.irtext import (
    FunctionWriter,
    ModuleWriter,
    float_literal,
    int_literal,
)
from geode.errors import CodegenError

__all__ = ["V", "ValueWriter"]


class V(NamedTuple):
    """An IR operand ``ref`` of numpy dtype ``dtype``; ``literal`` is its Python value
    when it is a constant (so conversions of literals fold to typed literals)."""

    ref: str
    dtype: str
    literal: object = None


def _wrap_int(value: int, dtype: str) -> int:
    """``value`` wrapped to integer ``dtype`` (two's complement, as numpy casts)."""
    n = D.bits(dtype)
    v = value & ((1 << n) - 1)
    if D.is_signed(dtype) and v >= 1 << (n - 1):
        v -= 1 << n
    return v


_INTRINSIC_SUFFIX = {"float": "f32", "double": "f64", "half": "f16"}


class ValueWriter:
    """Constants and conversions, printed into ``self.fn`` (set by the subclass)."""

    fn: FunctionWriter
    module: ModuleWriter

    # -- intrinsics --------------------------------------------------------------------
    def intrinsic(self, base: str, ret: str, args: list[str], suffix: str | None = None) -> str:
        """Declare ``llvm.<base>.<suffix>`` (suffix from the return type by default)
        and return its ``@name``."""
        sfx = suffix if suffix is not None else _INTRINSIC_SUFFIX.get(ret, ret)
        name = f"llvm.{base}.{sfx}" if sfx else f"llvm.{base}"
        return self.module.declare(name, f"declare {ret} @{name}({', '.join(args)})")

    def call(self, callee: str, ret: str, args: list[tuple[str, str]], flags: str = "") -> str:
        """``call ret callee(args)`` returning the value (``flags``: fast-math flags)."""
        arg_text = ", ".join(f"{t} {v}" for t, v in args)
        fl = f"{flags} " if flags else ""
        return self.fn.value(f"call {fl}{ret} {callee}({arg_text})")

    def unary_intrinsic(self, base: str, x: str, ty: str, flags: str = "") -> str:
        """``llvm.<base>`` of one float operand."""
        return self.call(self.intrinsic(base, ty, [ty]), ty, [(ty, x)], flags)

    # -- constants ---------------------------------------------------------------------
    def const(self, value: object, dtype: str) -> V:
        """A literal of ``dtype`` (rounded to it, as numpy would)."""
        if dtype == "bool":
            return V("true" if value else "false", "bool", bool(value))
        if D.is_int(dtype):
            iv = _wrap_int(int(value), dtype)  # type: ignore[call-overload]
            return V(int_literal(iv, D.bits(dtype)), dtype, iv)
        fv = float(np.dtype(dtype).type(value))
        return V(float_literal(fv, D.value_type(dtype)), dtype, fv)

    # -- conversions -------------------------------------------------------------------
    def round_half(self, x: str, ty: str) -> str:
        """A float/double ``x`` rounded to the nearest half, as a ``half``."""
        if ty == "double":
            x = self.double_to_odd_float(x)
        return self.fn.value(f"fptrunc float {x} to half")

    def double_to_odd_float(self, x: str) -> str:
        """``x`` (double) rounded to float with round-to-odd: truncate toward zero and set
        the last bit when anything was dropped. With 13 more bits than half, rounding that
        float to half gives the same result as rounding ``x`` itself (one rounding)."""
        f = self.fn
        near = f.value(f"fptrunc double {x} to float")
        back = f.value(f"fpext float {near} to double")
        exact = f.value(f"fcmp oeq double {back}, {x}")
        fabs = self.intrinsic("fabs", "double", ["double"])
        ab = f.value(f"call double {fabs}(double {back})")
        ax = f.value(f"call double {fabs}(double {x})")
        over = f.value(f"fcmp ogt double {ab}, {ax}")
        bits = f.value(f"bitcast float {near} to i32")
        down = f.value(f"sub i32 {bits}, 1")
        tz = f.value(f"select i1 {over}, i32 {down}, i32 {bits}")
        odd = f.value(f"or i32 {tz}, 1")
        oddf = f.value(f"bitcast i32 {odd} to float")
        return f.value(f"select i1 {exact}, float {near}, float {oddf}")

    def to_half_carrier(self, v: V) -> V:
        """``v`` (a float32/float64 value) rounded to float16, as its float carrier."""
        h = self.round_half(v.ref, D.value_type(v.dtype))
        return V(self.fn.value(f"fpext half {h} to float"), "float16")

    def wrap(self, ref: str, dtype: str) -> V:
        """A result computed in ``dtype``'s value type, brought back to ``dtype`` (float16
        results are rounded to float16)."""
        if dtype == "float16":
            return self.to_half_carrier(V(ref, "float32"))
        return V(ref, dtype)

    def convert(self, v: V, to: str) -> V:
        """``v`` converted to dtype ``to`` (numpy ``astype``)."""
        fr = v.dtype
        if fr == to:
            return v
        if v.literal is not None and not (
            D.is_int(to) and isinstance(v.literal, float) and not math.isfinite(v.literal)
        ):
            return self.const(v.literal, to)
        f = self.fn
        vt, tt = D.value_type(fr), D.value_type(to)
        if to == "bool":
            if D.is_float(fr):
                return V(f.value(f"fcmp une {vt} {v.ref}, 0.0"), "bool")
            return V(f.value(f"icmp ne {vt} {v.ref}, 0"), "bool")
        if fr == "bool":
            op = "uitofp" if D.is_float(to) else "zext"
            out = V(f.value(f"{op} i1 {v.ref} to {tt}"), to)
            return out
        if D.is_float(fr) and D.is_float(to):
            return self._float_to_float(v, to)
        if D.is_float(fr):  # float -> int, saturating
            sat = "fptosi.sat" if D.is_signed(to) else "fptoui.sat"
            callee = self.intrinsic(sat, tt, [vt], suffix=f"{tt}.{_INTRINSIC_SUFFIX[vt]}")
            return V(self.call(callee, tt, [(vt, v.ref)]), to)
        if D.is_float(to):  # int -> float
            op = "sitofp" if D.is_signed(fr) else "uitofp"
            if to == "float16":
                d = f.value(f"{op} {vt} {v.ref} to double")
                return self.to_half_carrier(V(d, "float64"))
            return V(f.value(f"{op} {vt} {v.ref} to {tt}"), to)
        return V(self._int_to_int(v.ref, fr, to), to)

    def _float_to_float(self, v: V, to: str) -> V:
        f = self.fn
        if to == "float16":
            return self.to_half_carrier(v)
        if v.dtype == "float16" and to == "float32":
            return V(v.ref, to)
        fv, tv = D.value_type(v.dtype), D.value_type(to)
        op = "fpext" if D.bits(to) > D.bits(v.dtype) or v.dtype == "float16" else "fptrunc"
        return V(f.value(f"{op} {fv} {v.ref} to {tv}"), to)

    def _int_to_int(self, ref: str, fr: str, to: str) -> str:
        fb, tb = D.bits(fr), D.bits(to)
        if fb == tb:
            return ref
        if fb > tb:
            return self.fn.value(f"trunc i{fb} {ref} to i{tb}")
        op = "sext" if D.is_signed(fr) else "zext"
        return self.fn.value(f"{op} i{fb} {ref} to i{tb}")

    def as_int64(self, v: V, where: str) -> str:
        """An integer (or bool) value as an ``i64`` operand (index arithmetic)."""
        if not (D.is_int(v.dtype) or v.dtype == "bool"):
            raise CodegenError(f"{where}: index of dtype {v.dtype}")
        return self.convert(v, "int64" if v.dtype != "uint64" else "uint64").ref
