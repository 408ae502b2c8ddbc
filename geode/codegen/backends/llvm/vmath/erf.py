"""erf (float32, float64): two regions, both evaluated, one selected.

float32 (``geode.vm.erf.f32``): ``|x| < 1.125``: ``erf = x + x P(x**2 - w0)`` (``P`` of
degree 6 around ``w0 = 0.443``, where its Horner sums cancel least); ``|x| >= 1.125``:
``erf = copysign(1 - 2**Q(z - 1.125), x)``, ``Q`` (degree 5) approximating
``log2(erfc(z))``, ``z = min(|x|, 3.95)`` (beyond, ``1 - erfc`` rounds to 1). The power of
two needs no Cody-Waite step: ``n = rint(Q)`` by the rounding constant, ``r = Q - n``
exact, ``2**r = 1 + r A(r)`` (``A`` degree 4), and ``1 - 2**n (1 + r A)`` is one FMA.
19 multiply-adds against the old form's 25 (no ln2 reduction, lower degrees: the
fits are weighted by what reaches erf, ``erfc(z)`` times the relative error of ``E``).
Max error 0.973 ulp over every float32 in [0, 4) (the old form: 1.03); with ``A`` of
degree 5 it was 0.918 at 1.07x the time.

It needs fused multiply-adds (without, 1.22 ulp): on an x86 target without FMA
``geode.vm.erf.f32`` is the old form. ``geode.vm.erf_legacy.f32`` keeps the old float32
form (the numba library's, bit for bit; for A/B measurements): split 0.875, ``x + x P(x**2)``, ``1 - exp(Q(z - 0.875))``
with ``Q`` of degree 8 approximating ``log(erfc(z))``.

float64 (the numba library's): ``|x| < 0.75``: ``x + x P(x**2)``; else ``1 - exp(Q(z -
c))`` with three ``Q`` of degree 15 on [0.75, 2), [2, 4), [4, 6] (centres 1, 3, 5) whose
coefficients are chosen per element with selects, ``z = min(|x|, 6)``.
"""

from __future__ import annotations

from . import coeffs
from ._ir import F32, F64, FloatKind, FunctionBuilder, Val
from ._ops import horner, horner3, isnan, pow2_rounded
from ._registry import fn_name, register
from .exp import exp_normal, rnd
from .target import VmathTarget

__all__ = ["ERF_F32_SPLIT", "ERF_F32_W0", "ERFC2_F32", "ERFP_F32", "EXP2A_F32"]

_SPLIT = {32: 0.875, 64: 0.75}
_CLAMP = {32: 3.95, 64: 6.0}

#: float32 region split and centre of the small region's polynomial (in ``x**2``)
ERF_F32_SPLIT = 1.125
ERF_F32_W0 = 0.4429687559604645
# Fitted for geode (weighted minimax by Lawson's iteration on 80k points, float64
# references; each coefficient rounded to float32 in turn, lowest first, the higher
# ones refitted to what is left). Low degree first.
# fmt: off
#: erf(x)/x - 1 in u = x**2 - w0, |x| <= 1.125 (relative fit error 6.2e-9)
ERFP_F32 = (-0.018239645287394524, -0.2903108596801758, 0.08260691910982132, -0.019097033888101578, 0.003647910663858056, -0.0005881304969079792, 7.021518831606954e-05)
#: log2(erfc(z)) in u = z - 1.125, z in [1.124, 3.954]; error x ln2 x erfc(z) <= 8.3e-9
ERFC2_F32 = (-3.1634390354156494, -4.1140031814575195, -1.237667441368103, -0.05250534415245056, 0.011496162042021751, -0.001480403821915388)
#: (2**r - 1) / r on |r| <= 1/2 (relative error of 2**r 9.3e-8: at most 0.17 ulp of erf,
#: whose 2**Q is at most erfc(1.125) = 0.116)
EXP2A_F32 = (0.6931470036506653, 0.24022246897220612, 0.0555071085691452, 0.009671292267739773, 0.0013269600458443165)
# fmt: on


def _one_minus_pow2(b: FunctionBuilder, k: FloatKind, q: Val) -> Val:
    """``1 - 2**q`` for ``q`` in [-26, -1]: ``n = rint(q)`` (the rounding constant with
    the bias folded in), ``r = q - n`` exact, ``2**n`` from the bits of ``t``, one FMA."""
    rc = b.const(k, rnd(k, k.bias))
    t = b.fadd(q, rc)
    r = b.fsub(q, b.fsub(t, rc))
    p = b.fmuladd(r, horner(b, k, EXP2A_F32, r), b.const(k, 1.0))
    return b.fmuladd(b.fneg(pow2_rounded(b, k, t)), p, b.const(k, 1.0))


def _emit_erf_f32() -> FunctionBuilder:
    """``erf(x)`` float32: max error 0.973 ulp over every float32 (odd: the negative
    half is the positive one's mirror); erf(+-inf) = +-1, NaN -> NaN, -0 keeps its
    sign."""
    k = F32
    b = FunctionBuilder(fn_name("erf", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    a = b.fabs(x)
    w = b.fmuladd(x, x, b.const(k, -ERF_F32_W0))
    small = b.fmuladd(x, horner(b, k, ERFP_F32, w), x)
    clamp = b.const(k, _CLAMP[32])
    z = b.select(b.fcmp("ogt", a, clamp), clamp, a)
    q = horner(b, k, ERFC2_F32, b.fsub(z, b.const(k, ERF_F32_SPLIT)))
    big = b.copysign(_one_minus_pow2(b, k, q), x)
    y = b.select(b.fcmp("olt", a, b.const(k, ERF_F32_SPLIT)), small, big)
    b.ret(b.select(isnan(b, k, x), x, y))
    return b


def _emit_erf_numba(k: FloatKind, name: str) -> FunctionBuilder:
    """``erf(x)`` in the numba library's form (float64, and float32 as ``erf_legacy``):
    max error 1.03 / 0.95 ulp measured; erf(+-inf) = +-1, NaN -> NaN, -0 keeps its
    sign."""
    b = FunctionBuilder(fn_name(name, k.suffix), k.ty, [(k.ty, "x")])
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


def _emit_erf_f32_for(target: VmathTarget) -> FunctionBuilder:
    """float32 erf for ``target``: geode's own form where ``llvm.fmuladd`` is fused (its
    bound needs the single roundings), else the numba library's (1.06 ulp unfused)."""
    return _emit_erf_f32() if target.has_fma else _emit_erf_numba(F32, "erf")


register(fn_name("erf", "f32"), _emit_erf_f32_for)
register(fn_name("erf_legacy", "f32"), lambda t: _emit_erf_numba(F32, "erf_legacy"))
register(fn_name("erf", "f64"), lambda t: _emit_erf_numba(F64, "erf"))
