"""exp and expm1 (float32, float64), and the exp building blocks the tanh, sigmoid and
erf families share.

Reduction (as in the numba library): ``t = fma(x, log2(e), c)`` rounds ``x log2(e)`` to
an integer ``n`` with one rounding (``c = 1.5 * 2**mant`` plus an offset: the spacing of
floats near ``c`` is 1) and holds ``n + c`` exactly; ``n = t - c`` exactly;
``r = x - n ln2`` with a two-constant Cody-Waite split, ``|r| <= ln2/2``; ``expm1(r) =
r + r**2 q(r)`` with ``q`` of degree 4 (float32) / 10 (float64). The offset chooses what
the bits of ``t`` give: ``RND`` (none) for :func:`~._ops.scale2`, ``RNDB`` (the bias)
for ``2**n`` by one shift, ``RNDB1`` (bias - 1) for ``2**(n-1)``.
"""

from __future__ import annotations

import math

from . import coeffs
from ._ir import F32, F64, FloatKind, FunctionBuilder, Val
from ._ops import clamp_above, clamp_below, horner, isnan, pow2_rounded, scale2
from ._registry import fn_name, register
from .target import VmathTarget

__all__ = [
    "exp_normal",
    "exp_parts",
    "exp_reduce",
    "expm1_pos",
    "expq",
    "rnd",
]

LOG2E = 1.4426950408889634
#: Cody-Waite split of ln2 (negated): ``n * hi`` is exact for the n exp needs
NLN2HI = {32: -0.693359375, 64: -6.93147180369123816490e-01}
NLN2LO = {32: 2.1219444005469057e-04, 64: -1.90821492927058770002e-10}
#: ln2 in one constant (negated), for :func:`expm1_pos`
NLN2 = -math.log(2.0)

EXP_LO = {32: -104.0, 64: -746.0}
EXP_HI = {32: 89.0, 64: 710.0}
EXPM1_LO = {32: -18.0, 64: -40.0}


def rnd(k: FloatKind, offset: float = 0.0) -> float:
    """The rounding constant ``1.5 * 2**mant + offset`` of the reduction."""
    return 1.5 * 2.0**k.mant + offset


def expq(k: FloatKind) -> tuple[float, ...]:
    """Coefficients of ``q(r) = (exp(r) - 1 - r) / r**2`` for ``k``."""
    return coeffs.EXPQ_F32 if k.bits == 32 else coeffs.EXPQ_F64


def exp_reduce(b: FunctionBuilder, k: FloatKind, x: Val, c: float) -> tuple[Val, Val, Val]:
    """``(t, n, r)``: ``t = n + c`` (``c`` from :func:`rnd`), ``n = rint(x / ln2)``,
    ``r = x - n ln2`` (two-constant Cody-Waite)."""
    cc = b.const(k, c)
    t = b.fmuladd(x, b.const(k, LOG2E), cc)
    n = b.fsub(t, cc)
    r = b.fmuladd(n, b.const(k, NLN2HI[k.bits]), x)
    return t, n, b.fmuladd(n, b.const(k, NLN2LO[k.bits]), r)


def exp_parts(b: FunctionBuilder, k: FloatKind, x: Val, c: float) -> tuple[Val, Val, Val]:
    """:func:`exp_reduce`'s ``t`` and ``n``, and ``e = expm1(r)``."""
    t, n, r = exp_reduce(b, k, x, c)
    return t, n, b.fmuladd(b.fmul(r, r), horner(b, k, expq(k), r), r)


def exp_normal(b: FunctionBuilder, k: FloatKind, x: Val) -> Val:
    """exp for ``x`` whose result is a normal number (|x| < 87 in float32): no clamp,
    one scaling factor from the rounding step's bits."""
    t, _, e = exp_parts(b, k, x, rnd(k, k.bias))
    return b.fmul(b.fadd(e, b.const(k, 1.0)), pow2_rounded(b, k, t))


def expm1_pos(b: FunctionBuilder, k: FloatKind, x: Val) -> Val:
    """expm1 for ``x`` in [0, 40] (NaN propagates), tanh's case: ``2**n`` is normal, so
    no clamps, and ``expm1 = 2**n e + (2**n - 1)`` is one FMA. The reduction uses ln2
    rounded to the working precision (one FMA); its error reaches tanh damped by
    ``2E / (E**2 - 1)`` (at most 0.05 ulp of tanh in float32, 0.15 in float64)."""
    c = b.const(k, rnd(k, k.bias))
    t = b.fmuladd(x, b.const(k, LOG2E), c)
    r = b.fmuladd(b.fsub(t, c), b.const(k, NLN2), x)
    u = pow2_rounded(b, k, t)
    e = b.fmuladd(b.fmul(r, r), horner(b, k, expq(k), r), r)
    return b.fmuladd(u, e, b.fsub(u, b.const(k, 1.0)))


def _emit_exp(k: FloatKind, target: VmathTarget) -> FunctionBuilder:
    """``exp(x)``: max error 1.05 ulp (float32) / 0.98 ulp (float64) measured.

    Clamp x to [-104, 89] (float64: [-746, 710]; beyond, the result is already 0 / inf,
    NaN passes), reduce, ``exp(r) = 1 + expm1(r)``, scale by ``2**n`` with one rounding
    (:func:`~._ops.scale2`), so subnormal results round once and overflow gives inf.
    Float64 ends with a NaN test (the float32 code propagates NaN through its arithmetic,
    as the numba version does)."""
    b = FunctionBuilder(fn_name("exp", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    y = clamp_above(b, k, x, EXP_HI[k.bits])
    y = clamp_below(b, k, y, EXP_LO[k.bits])
    t, _, e = exp_parts(b, k, y, rnd(k))
    y = scale2(b, k, target, b.fadd(e, b.const(k, 1.0)), t)
    if k.bits == 64:
        y = b.select(isnan(b, k, x), x, y)
    b.ret(y)
    return b


def _emit_expm1(k: FloatKind, target: VmathTarget) -> FunctionBuilder:
    """``exp(x) - 1``, accurate near 0: max error 1.52 / 1.71 ulp measured.

    Clamp to [-18, 89] (float64: [-40, 710]), ``e = expm1(r)`` (exact when n = 0), then
    ``2**n e + (2**n - 1) = 2 * fma(h, e, h - 1/2)`` with ``h = 2**(n-1)``, finite up to
    n = 128 so that the doubling overflows to inf. NaN -> NaN, -inf -> -1, inf -> inf."""
    b = FunctionBuilder(fn_name("expm1", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    y = clamp_above(b, k, x, EXP_HI[k.bits])
    y = clamp_below(b, k, y, EXPM1_LO[k.bits])
    t, _, e = exp_parts(b, k, y, rnd(k, k.bias - 1))
    h = pow2_rounded(b, k, t)
    y = b.fmul(b.const(k, 2.0), b.fmuladd(h, e, b.fsub(h, b.const(k, 0.5))))
    b.ret(b.select(isnan(b, k, x), x, y))
    return b


for _k in (F32, F64):
    register(fn_name("exp", _k.suffix), lambda t, k=_k: _emit_exp(k, t))
    register(fn_name("expm1", _k.suffix), lambda t, k=_k: _emit_expm1(k, t))
