"""erf (float32, float64): two regions, both evaluated, one selected.

``|x| < split`` (0.875 / 0.75): ``erf = x + x P(x**2)`` (fit of ``erf(x)/x - 1``).
``|x| >= split``: ``erf = copysign(1 - exp(Q(z - c)), x)``, ``Q`` approximating
``log(erfc(z))``, ``z = min(|x|, clamp)`` (3.95 / 6: beyond, ``1 - erfc`` rounds to 1).
float32 has one ``Q`` of degree 8 centred at 0.875; float64 has three of degree 15 on
[0.75, 2), [2, 4), [4, 6] (centres 1, 3, 5) whose coefficients are chosen per element
with selects, so a single polynomial is evaluated.
"""

from __future__ import annotations

from . import coeffs
from ._ir import F32, F64, FloatKind, FunctionBuilder
from ._ops import horner, horner3, isnan
from ._registry import fn_name, register
from .exp import exp_normal

__all__: list[str] = []

_SPLIT = {32: 0.875, 64: 0.75}
_CLAMP = {32: 3.95, 64: 6.0}


def _emit_erf(k: FloatKind) -> FunctionBuilder:
    """``erf(x)``: max error 1.01 / 0.95 ulp measured; erf(+-inf) = +-1, NaN -> NaN,
    -0 keeps its sign."""
    b = FunctionBuilder(fn_name("erf", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    a = b.fabs(x)
    erfa = coeffs.ERFA_F32 if k.bits == 32 else coeffs.ERFA_F64
    small = b.fmuladd(x, horner(b, k, erfa, b.fmul(x, x)), x)
    clamp = b.const(k, _CLAMP[k.bits])
    z = b.select(b.fcmp("ogt", a, clamp), clamp, a)
    if k.bits == 32:
        q = horner(b, k, coeffs.ERFB_F32, b.fsub(z, b.const(k, 0.875)))
    else:
        in0 = b.fcmp("olt", z, b.const(k, 2.0))
        in1 = b.fcmp("olt", z, b.const(k, 4.0))
        c = b.select(in0, b.const(k, 1.0), b.select(in1, b.const(k, 3.0), b.const(k, 5.0)))
        pieces = (coeffs.ERFB1_F64, coeffs.ERFB2_F64, coeffs.ERFB3_F64)
        q = horner3(b, k, pieces, b.fsub(z, c), in0, in1)
    big = b.copysign(b.fsub(b.const(k, 1.0), exp_normal(b, k, q)), x)
    y = b.select(b.fcmp("olt", a, b.const(k, _SPLIT[k.bits])), small, big)
    b.ret(b.select(isnan(b, k, x), x, y))
    return b


for _k in (F32, F64):
    register(fn_name("erf", _k.suffix), lambda t, k=_k: _emit_erf(k))
