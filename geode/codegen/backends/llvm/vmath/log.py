"""log and log1p (float32, float64), fdlibm's scheme.

``x = m * 2**k`` with ``m`` in [sqrt(1/2), sqrt(2)) from the bits (subnormal x first
scaled by 2**25 / 2**54), ``f = m - 1``, ``s = f / (2 + f)``, ``log(1+f) = f - f**2/2 +
s (f**2/2 + R)`` with ``R = z T(z)``, ``z = s**2``, ``T`` of degree 2 / 6, plus ``k ln2``
in two pieces. The core is the helper function ``geode.vm.log_core.*(x, c)`` =
``log(x) + c`` for finite positive x, shared by log and log1p (log1p passes the
rounding error of ``1 + x`` divided by it as ``c``).
"""

from __future__ import annotations

from . import coeffs
from ._ir import F32, F64, FloatKind, FunctionBuilder
from ._ops import frexp_sqrt2, horner, isinf, isnan
from ._registry import fn_name, register

__all__: list[str] = []

_MIN_NORMAL = {32: 2.0**-126, 64: 2.0**-1022}
_SUBSCALE = {32: (2.0**25, 25.0), 64: (2.0**54, 54.0)}
#: ln2 for log: hi has 16 significant bits (k * hi exact for every k)
_LN2HI = {32: 0.693145751953125, 64: 6.93147180369123816490e-01}
_LN2LO = {32: 1.4286068203094173e-06, 64: 1.90821492927058770002e-10}


def _emit_log_core(k: FloatKind) -> FunctionBuilder:
    """``log(x) + c`` for finite ``x > 0`` (subnormals included) and a small ``c``."""
    b = FunctionBuilder(fn_name("log_core", k.suffix), k.ty, [(k.ty, "x"), (k.ty, "c")])
    x, c = b.params
    one = b.const(k, 1.0)
    scale, shift = _SUBSCALE[k.bits]
    sub = b.fcmp("olt", x, b.const(k, _MIN_NORMAL[k.bits]))
    x = b.select(sub, b.fmul(x, b.const(k, scale)), x)
    e, m = frexp_sqrt2(b, k, x)
    e = b.select(sub, b.fsub(e, b.const(k, shift)), e)
    f = b.fsub(m, one)
    s = b.fdiv(f, b.fadd(b.const(k, 2.0), f))
    z = b.fmul(s, s)
    big_r = b.fmul(z, horner(b, k, coeffs.LOGT_F32 if k.bits == 32 else coeffs.LOGT_F64, z))
    hfsq = b.fmul(b.fmul(b.const(k, 0.5), f), f)
    lo = b.fmuladd(s, b.fadd(hfsq, big_r), b.fmuladd(e, b.const(k, _LN2LO[k.bits]), c))
    b.ret(b.fmuladd(e, b.const(k, _LN2HI[k.bits]), b.fsub(f, b.fsub(hfsq, lo))))
    return b


def _emit_log(k: FloatKind) -> FunctionBuilder:
    """Natural log: max error 0.82 / 0.83 ulp measured. log(0) = -inf, log(x < 0) = NaN,
    log(inf) = inf, NaN -> NaN."""
    b = FunctionBuilder(fn_name("log", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    zero, inf = b.const(k, 0.0), b.const(k, float("inf"))
    y = b.call(fn_name("log_core", k.suffix), k.ty, [x, zero])
    y = b.select(isinf(b, k, x), inf, y)
    y = b.select(b.fcmp("oeq", x, zero), b.const(k, float("-inf")), y)
    y = b.select(b.fcmp("olt", x, zero), b.const(k, float("nan")), y)
    b.ret(b.select(isnan(b, k, x), x, y))
    return b


def _emit_log1p(k: FloatKind) -> FunctionBuilder:
    """``log(1 + x)``, accurate near 0: max error 0.81 ulp measured. ``u = 1 + x`` rounded,
    its exact rounding error ``d`` (Fast2Sum, ordered by magnitude with a select),
    ``log1p(x) = log(u) + d/u``. log1p(-1) = -inf, log1p(x < -1) = NaN, log1p(inf) =
    inf, NaN -> NaN."""
    b = FunctionBuilder(fn_name("log1p", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    one = b.const(k, 1.0)
    u = b.fadd(one, x)
    d_small = b.fsub(x, b.fsub(u, one))
    d_big = b.fsub(one, b.fsub(u, x))
    d = b.select(b.fcmp("ole", b.fabs(x), one), d_small, d_big)
    y = b.call(fn_name("log_core", k.suffix), k.ty, [u, b.fdiv(d, u)])
    y = b.select(isinf(b, k, x), b.const(k, float("inf")), y)
    neg_one = b.const(k, -1.0)
    y = b.select(b.fcmp("oeq", x, neg_one), b.const(k, float("-inf")), y)
    y = b.select(b.fcmp("olt", x, neg_one), b.const(k, float("nan")), y)
    b.ret(b.select(isnan(b, k, x), x, y))
    return b


for _k in (F32, F64):
    register(fn_name("log_core", _k.suffix), lambda t, k=_k: _emit_log_core(k))
    register(fn_name("log", _k.suffix), lambda t, k=_k: _emit_log(k))
    register(fn_name("log1p", _k.suffix), lambda t, k=_k: _emit_log1p(k))
