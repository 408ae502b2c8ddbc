"""tanh, sigmoid, ``1 + tanh`` and ``a / (1 + exp(t))`` (float32, float64), built on
the exp blocks of :mod:`.exp`.

``tanh`` and ``sigmoid`` have an ``_ieee`` variant without the final NaN test, for
callers without the ``nnan`` fast-math flag: NaN already propagates through their
arithmetic (the clamps keep it, the divisions return it). The guarded function calls
the ieee one and adds the test.
"""

from __future__ import annotations

from ._ir import F32, F64, FloatKind, FunctionBuilder, Val
from ._ops import clamp_above, clamp_below, horner, isnan, scale2
from ._registry import fn_name, register
from .exp import exp_normal, exp_reduce, expm1_pos, expq, rnd
from .target import VmathTarget

__all__: list[str] = []

_TANH_CLAMP = {32: 10.0, 64: 20.0}
#: clamp of ``1 + exp(t)``: below, the sum is 1 anyway; above, exp is inf
_OPT_LO = {32: -87.0, 64: -708.0}
_OPT_HI = {32: 89.0, 64: 710.0}
#: sigmoid's clamp: below LO the result rounds to 0, above HI to 1
_SIG_LO = {32: -105.0, 64: -746.0}
_SIG_HI = {32: 86.0, 64: 707.0}


def _emit_tanh_ieee(k: FloatKind) -> FunctionBuilder:
    """``tanh(x)`` for NaN-propagating callers: ``a = min(|x|, 10)`` (float64: 20),
    ``e = expm1(2a)``, ``tanh = copysign(e / (e + 2), x)``; exact for tiny x, -0 keeps
    its sign. Max error 2.3 / 2.55 ulp measured."""
    b = FunctionBuilder(fn_name("tanh_ieee", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    a = clamp_above(b, k, b.fabs(x), _TANH_CLAMP[k.bits])
    e = expm1_pos(b, k, b.fadd(a, a))
    b.ret(b.copysign(b.fdiv(e, b.fadd(e, b.const(k, 2.0))), x))
    return b


def _emit_guarded(op: str, k: FloatKind) -> FunctionBuilder:
    """``op`` = its ieee variant plus a NaN test on the input (bit test)."""
    b = FunctionBuilder(fn_name(op, k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    y = b.call(fn_name(f"{op}_ieee", k.suffix), k.ty, [x])
    b.ret(b.select(isnan(b, k, x), x, y))
    return b


def _sig4h(k: FloatKind) -> list[float]:
    """Horner coefficients of ``h`` with ``4 exp(-s) = 4 - s h(s)``: 4 (1, -q0, q1, -q2,
    ...) for exp's ``q`` (exact scalings and sign flips of the same fit)."""
    return [4.0] + [4.0 * c * (-1) ** (i + 1) for i, c in enumerate(expq(k))]


def _emit_sigmoid_ieee(k: FloatKind, target: VmathTarget) -> FunctionBuilder:
    """``1 / (1 + exp(-x))`` for NaN-propagating callers, max error 2.3 / 2.37 ulp.

    With ``m = rint(x / ln2)`` and ``s = x - m ln2`` (exp's reduction), ``sigmoid =
    2**(m+2) / (2**(m+2) + 4 exp(-s))`` for every x, no sign test: x clamped to [-105, 86]
    (float64: [-746, 707]), ``2**(m+2)`` exact (down to the least subnormal, by
    :func:`~._ops.scale2`), the denominator one FMA ``-s h(s) + (2**(m+2) + 4)``, one
    rounding in the division, also into the subnormal range."""
    b = FunctionBuilder(fn_name("sigmoid_ieee", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    x = clamp_below(b, k, x, _SIG_LO[k.bits])
    x = clamp_above(b, k, x, _SIG_HI[k.bits])
    t, _, s = exp_reduce(b, k, x, rnd(k, 2.0))
    q = scale2(b, k, target, b.const(k, 1.0), t)
    den = b.fmuladd(b.fneg(s), horner(b, k, _sig4h(k), s), b.fadd(q, b.const(k, 4.0)))
    b.ret(b.fdiv(q, den))
    return b


def _one_plus_exp(b: FunctionBuilder, k: FloatKind, t: Val) -> Val:
    """``1 + exp(t)`` with ``t`` clamped to [-87, 89] (float64: [-708, 710]), so exp is
    one normal scaling (NaN propagates)."""
    t = clamp_below(b, k, t, _OPT_LO[k.bits])
    t = clamp_above(b, k, t, _OPT_HI[k.bits])
    return b.fadd(b.const(k, 1.0), exp_normal(b, k, t))


def _emit_one_plus_exp(k: FloatKind) -> FunctionBuilder:
    b = FunctionBuilder(fn_name("one_plus_exp", k.suffix), k.ty, [(k.ty, "t")])
    b.ret(_one_plus_exp(b, k, b.params[0]))
    return b


def _emit_one_plus_tanh(k: FloatKind) -> FunctionBuilder:
    """``1 + tanh(x) = 2 / (1 + exp(-2x))``, max error 2.5 ulp measured; no cancellation
    for negative x (results under about 1.2e-38 flush to zero in float32)."""
    b = FunctionBuilder(fn_name("one_plus_tanh", k.suffix), k.ty, [(k.ty, "x")])
    (x,) = b.params
    t = b.fmul(x, b.const(k, -2.0))
    den = b.call(fn_name("one_plus_exp", k.suffix), k.ty, [t])
    b.ret(b.fdiv(b.const(k, 2.0), den))
    return b


def _emit_div_one_plus_exp(k: FloatKind) -> FunctionBuilder:
    """``a / (1 + exp(t))``, max error 2.3 / 2.04 ulp measured (the tanh GELU's ``0.5 a
    (1 + tanh(z))`` with ``t = -2z``). Where exp overflows the result is a zero of
    ``a``'s sign; NaN in either argument gives NaN."""
    b = FunctionBuilder(fn_name("div_one_plus_exp", k.suffix), k.ty, [(k.ty, "a"), (k.ty, "t")])
    a, t = b.params
    b.ret(b.fdiv(a, b.call(fn_name("one_plus_exp", k.suffix), k.ty, [t])))
    return b


for _k in (F32, F64):
    register(fn_name("tanh_ieee", _k.suffix), lambda t, k=_k: _emit_tanh_ieee(k))
    register(fn_name("tanh", _k.suffix), lambda t, k=_k: _emit_guarded("tanh", k))
    register(fn_name("sigmoid_ieee", _k.suffix), lambda t, k=_k: _emit_sigmoid_ieee(k, t))
    register(fn_name("sigmoid", _k.suffix), lambda t, k=_k: _emit_guarded("sigmoid", k))
    register(fn_name("one_plus_exp", _k.suffix), lambda t, k=_k: _emit_one_plus_exp(k))
    register(fn_name("one_plus_tanh", _k.suffix), lambda t, k=_k: _emit_one_plus_tanh(k))
    register(fn_name("div_one_plus_exp", _k.suffix), lambda t, k=_k: _emit_div_one_plus_exp(k))
