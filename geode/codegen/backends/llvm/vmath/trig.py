"""sin and cos (float32, float64) over the whole range, with an exact Payne-Hanek style
reduction by table.

With ``x = M * 2**q`` (integer ``M``), the bits of 2/pi of weight ``>= 2**(2-q)`` only add
multiples of 4 to ``x * 2/pi``; the rest, cut into three float64 pieces, is stored per
biased exponent of the input (a table of ``2*bias + 2`` rows per piece, loaded by the
exponent field: a gather once vectorized). The first pieces have few enough bits that
``x * piece`` is exact (float32 in float64) or is made exact with ``llvm.fma``
two-products (float64), so ``y = x * 2/pi mod 4`` has full accuracy even near
multiples of pi/2. ``r = (y - n) pi/2`` with ``n = rint(y)``, then ``sin(r)`` and
``cos(r)`` by polynomials and the quadrant ``n mod 4`` (plus 1 for cos) picks +-sin or
+-cos with selects. float32 computes in float64; float64 carries ``r`` as a
double-double.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from . import coeffs
from ._ir import F32, F64, FloatKind, FunctionBuilder, Val, float_literal
from ._ops import exponent_field, horner, isfinite, two_sum
from ._registry import fn_name, register, register_table

__all__ = ["TWO_OVER_PI_HEX", "payne_hanek_table", "table_name"]

#: 2/pi to 1280 bits (hex digits after the binary point)
TWO_OVER_PI_HEX = (
    "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561"
    "b7246e3a424dd2e006492eea09d1921cfe1deb1cb129a73ee88235f52ebb4484"
    "e99c7026b45f7e413991d639835339f49c845f8bbdf9283b1ff897ffde05980f"
    "ef2f118b5a0a6d1f6d367ecf27cb09b74f463f669e5fea2d7527bac7ebe5f17b"
    "3d0739f78a5292ea6bfb5fb11f8d5d0856033046fc7b6babf0cfbc209af4361d"
)


def payne_hanek_table(
    mant: int, bias: int, chunk_bits: Sequence[int], scale_row: int = 1 << 30, scale_exp: int = 0
) -> np.ndarray:
    """For each biased input exponent ``eb``, the bits of 2/pi that matter for ``x * 2/pi
    mod 4`` as float64 pieces: shape ``(len(chunk_bits) + 1, 2*bias + 2)``.

    ``x = M * 2**q``, ``M < 2**(mant+1)``, ``q = max(eb, 1) - bias - mant``. Bits of 2/pi
    of weight ``>= 2**(2-q)`` are dropped; the rest is cut into pieces of ``chunk_bits``
    significant bits and a last 53-bit piece (truncated). Rows ``>= scale_row`` are
    multiplied by ``2**scale_exp`` (the caller scales x by ``2**-scale_exp``) so that no
    piece is subnormal.
    """
    nbits = len(TWO_OVER_PI_HEX) * 4
    g = int(TWO_OVER_PI_HEX, 16)  # 2/pi = g * 2**-nbits
    rows = 2 * bias + 2
    out = np.zeros((len(chunk_bits) + 1, rows))
    for eb in range(rows):
        q = max(eb, 1) - bias - mant
        rest = g % (1 << (nbits + 2 - q)) if 2 - q < 0 else g
        for j, cb in enumerate((*chunk_bits, 53)):
            sh = max(rest.bit_length() - cb, 0)
            extra = scale_exp if eb >= scale_row else 0
            out[j, eb] = math.ldexp(rest >> sh, sh - nbits + extra)
            rest -= (rest >> sh) << sh
    return out


#: float64 inputs with |x| >= 2**512 are scaled by 2**-512 (their rows by 2**512)
_BIG_EXP = 512
_TABLE_ARGS = {32: (23, 127, (29, 29)), 64: (52, 1023, (53, 53))}


def table_name(piece: int, k: FloatKind) -> str:
    """IR name of table ``piece`` (1-3) for inputs of kind ``k``."""
    return f"geode.vm.ph{piece}.{k.suffix}"


@functools.lru_cache(maxsize=2)
def _tables(k: FloatKind) -> np.ndarray:
    mant, bias, chunks = _TABLE_ARGS[k.bits]
    if k.bits == 64:
        return payne_hanek_table(mant, bias, chunks, scale_row=bias + _BIG_EXP, scale_exp=_BIG_EXP)
    return payne_hanek_table(mant, bias, chunks)


def _write_table(k: FloatKind, piece: int) -> str:
    row = _tables(k)[piece - 1]
    body = ", ".join(f"double {float_literal(float(v), F64)}" for v in row)
    return (
        f"@{table_name(piece, k)} = internal unnamed_addr constant "
        f"[{row.size} x double] [{body}], align 8"
    )


def _rows(k: FloatKind) -> int:
    return 2 * k.bias + 2


_PIO2 = 1.5707963267948966
_PIO2LO = 6.123233995736766e-17


def _quadrant_select(b: FunctionBuilder, n: Val, shift: Val, s: Val, c: Val) -> Val:
    """``+-s`` or ``+-c`` by ``(n + shift) mod 4`` (float64 arithmetic, exact)."""
    d = F64
    n = b.fadd(n, shift)
    n4 = b.fmuladd(b.floor(b.fmul(n, b.const(d, 0.25))), b.const(d, -4.0), n)
    odd = b.fmuladd(b.floor(b.fmul(n4, b.const(d, 0.5))), b.const(d, -2.0), n4)
    v = b.select(b.fcmp("une", odd, b.const(d, 0.0)), c, s)
    return b.select(b.fcmp("oge", n4, b.const(d, 2.0)), b.fneg(v), v)


def _emit_sincos_f32() -> FunctionBuilder:
    """``sin(x + shift * pi/2)`` for finite float32 ``x``, computed in float64."""
    k, d = F32, F64
    b = FunctionBuilder(fn_name("sincos", k.suffix), k.ty, [(k.ty, "x"), (d.ty, "shift")])
    x, shift = b.params
    xd = b.convert("fpext", x, d.ty)
    i = exponent_field(b, k, x)
    rows = _rows(k)
    p1 = b.fmul(xd, b.load_table(table_name(1, k), rows, i))
    y1 = b.fmuladd(b.rint(b.fmul(p1, b.const(d, 0.25))), b.const(d, -4.0), p1)  # p1 mod 4
    y2 = b.fmul(xd, b.load_table(table_name(2, k), rows, i))
    n = b.rint(b.fadd(y1, y2))
    p3 = b.fmul(xd, b.load_table(table_name(3, k), rows, i))
    f = b.fadd(b.fadd(b.fsub(y1, n), y2), p3)  # x * 2/pi - n, |f| <= 1/2
    r = b.fmul(f, b.const(d, _PIO2))
    w = b.fmul(r, r)
    s = b.fmuladd(b.fmul(r, w), horner(b, d, coeffs.SIN_F32, w), r)
    one_m = b.fmuladd(w, b.const(d, -0.5), b.const(d, 1.0))
    c = b.fmuladd(b.fmul(w, w), horner(b, d, coeffs.COS_F32, w), one_m)
    b.ret(b.convert("fptrunc", _quadrant_select(b, n, shift, s, c), k.ty))
    return b


def _emit_sincos_f64() -> FunctionBuilder:
    """``sin(x + shift * pi/2)`` for finite float64 ``x`` (tiny x not handled)."""
    k = F64
    b = FunctionBuilder(fn_name("sincos", k.suffix), k.ty, [(k.ty, "x"), (k.ty, "shift")])
    x, shift = b.params
    rows = _rows(k)
    i = exponent_field(b, k, x)
    big = b.fcmp("oge", b.fabs(x), b.const(k, 2.0**_BIG_EXP))
    x = b.fmul(x, b.select(big, b.const(k, 2.0**-_BIG_EXP), b.const(k, 1.0)))
    u1 = b.load_table(table_name(1, k), rows, i)
    u2 = b.load_table(table_name(2, k), rows, i)
    p1 = b.fmul(x, u1)
    e1 = b.fma(x, u1, b.fneg(p1))  # x*u1 = p1 + e1 exactly
    m1 = b.fmuladd(b.rint(b.fmul(p1, b.const(k, 0.25))), b.const(k, -4.0), p1)  # p1 mod 4
    p2 = b.fmul(x, u2)
    e2 = b.fma(x, u2, b.fneg(p2))
    s, es = two_sum(b, m1, e1)
    t, et = two_sum(b, s, p2)
    n = b.rint(t)
    p3 = b.fmul(x, b.load_table(table_name(3, k), rows, i))
    hi, lo = two_sum(b, b.fsub(t, n), b.fadd(b.fadd(b.fadd(es, et), e2), p3))
    pio2 = b.const(k, _PIO2)
    rh = b.fmul(hi, pio2)  # r = (hi + lo) pi/2 as a double-double rh + rl
    rl = b.fmuladd(hi, b.const(k, _PIO2LO), b.fmuladd(lo, pio2, b.fma(hi, pio2, b.fneg(rh))))
    r = b.fadd(rh, rl)
    rl = b.fsub(rl, b.fsub(r, rh))
    one = b.const(k, 1.0)
    w = b.fmul(r, r)
    hz = b.fmul(b.const(k, 0.5), w)
    sn = b.fadd(
        r, b.fmuladd(b.fmul(r, w), horner(b, k, coeffs.SIN_F64, w), b.fmul(rl, b.fsub(one, hz)))
    )
    v = b.fsub(one, hz)
    tail = b.fmuladd(b.fmul(w, w), horner(b, k, coeffs.COS_F64, w), b.fneg(b.fmul(r, rl)))
    cs = b.fadd(v, b.fadd(b.fsub(b.fsub(one, v), hz), tail))
    b.ret(_quadrant_select(b, n, shift, sn, cs))
    return b


def _emit_trig(op: str, k: FloatKind) -> FunctionBuilder:
    """``sin``/``cos``: max error 0.66 ulp (float32) / 0.80-0.81 ulp (float64) measured.
    sin(+-inf) = cos(+-inf) = NaN, NaN -> NaN, sin(-0) = -0; float64 returns x (sin) or
    1 (cos) for |x| < 2**-27."""
    b = FunctionBuilder(fn_name(op, k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    shift = b.const(F64, 0.0 if op == "sin" else 1.0)
    v = b.call(fn_name("sincos", k.suffix), k.ty, [x, shift])
    if k.bits == 32:
        if op == "sin":
            v = b.select(b.fcmp("oeq", x, b.const(k, 0.0)), x, v)
    else:
        tiny = b.fcmp("olt", b.fabs(x), b.const(k, 2.0**-27))
        v = b.select(tiny, x if op == "sin" else b.const(k, 1.0), v)
    b.ret(b.select(isfinite(b, k, x), v, b.const(k, float("nan"))))
    return b


register(fn_name("sincos", "f32"), lambda t: _emit_sincos_f32())
register(fn_name("sincos", "f64"), lambda t: _emit_sincos_f64())
for _k in (F32, F64):
    for _op in ("sin", "cos"):
        register(fn_name(_op, _k.suffix), lambda t, k=_k, op=_op: _emit_trig(op, k))
    for _piece in (1, 2, 3):
        register_table(table_name(_piece, _k), lambda k=_k, p=_piece: _write_table(k, p))
