"""Building blocks shared by the vmath families: bit tests, exponent tricks, exact
scaling, error-free sums and polynomial evaluation, each writing IR into a
:class:`~._ir.FunctionBuilder` (Python-level inlining: they emit instructions into
the function being written, they are not IR functions of their own)."""

from __future__ import annotations

from collections.abc import Sequence

from ._ir import FloatKind, FunctionBuilder, Val, float_bits
from .target import VmathTarget

__all__ = [
    "clamp_above",
    "clamp_below",
    "exponent_field",
    "frexp_sqrt2",
    "horner",
    "horner3",
    "isfinite",
    "isinf",
    "isnan",
    "pow2_exact",
    "pow2_rounded",
    "scale2",
    "two_sum",
]


def _magnitude_bits(b: FunctionBuilder, k: FloatKind, x: Val) -> tuple[Val, Val]:
    mag = b.and_(b.bitcast(x, k.ity), b.iconst(k.ity, (1 << (k.bits - 1)) - 1))
    return mag, b.iconst(k.ity, (2 * k.bias + 1) << k.mant)


def isnan(b: FunctionBuilder, k: FloatKind, x: Val) -> Val:
    """``x`` is NaN, as an integer test on its bits (which no ``nnan`` flag folds)."""
    mag, inf = _magnitude_bits(b, k, x)
    return b.icmp("ugt", mag, inf)


def isinf(b: FunctionBuilder, k: FloatKind, x: Val) -> Val:
    """``x`` is +-inf (bit test)."""
    mag, inf = _magnitude_bits(b, k, x)
    return b.icmp("eq", mag, inf)


def isfinite(b: FunctionBuilder, k: FloatKind, x: Val) -> Val:
    """``x`` is finite (bit test)."""
    mag, inf = _magnitude_bits(b, k, x)
    return b.icmp("ult", mag, inf)


def clamp_below(b: FunctionBuilder, k: FloatKind, x: Val, lo: float) -> Val:
    """``lo if x < lo else x`` (NaN stays NaN)."""
    c = b.const(k, lo)
    return b.select(b.fcmp("olt", x, c), c, x)


def clamp_above(b: FunctionBuilder, k: FloatKind, x: Val, hi: float) -> Val:
    """``hi if x > hi else x`` (NaN stays NaN)."""
    c = b.const(k, hi)
    return b.select(b.fcmp("ogt", x, c), c, x)


def exponent_field(b: FunctionBuilder, k: FloatKind, x: Val) -> Val:
    """The biased exponent field of ``x`` as an ``i64`` (0 for zero and subnormals, the
    maximum for inf and NaN), for indexing tables."""
    bits = b.lshr(b.bitcast(x, k.ity), b.iconst(k.ity, k.mant))
    field = b.and_(bits, b.iconst(k.ity, 2 * k.bias + 1))
    return b.convert("zext", field, "i64") if k.bits < 64 else field


def pow2_rounded(b: FunctionBuilder, k: FloatKind, t: Val) -> Val:
    """``2**n`` from ``t = n + 1.5 * 2**mant + bias`` held exactly (an exp reduction's
    rounding step with the bias folded into its constant): the low mantissa bits of
    ``t`` hold ``n + bias``, one shift left by ``mant`` moves them into the exponent
    field. Valid for normal results; a NaN ``t`` gives garbage bits, never poison."""
    return b.bitcast(b.shl(b.bitcast(t, k.ity), b.iconst(k.ity, k.mant)), k.ty)


def pow2_exact(b: FunctionBuilder, k: FloatKind, n: Val) -> Val:
    """``2**n`` for an integer-valued float ``n`` in the normal exponent range: ``n +
    (2**mant + bias)`` holds ``n + bias`` in its low mantissa bits."""
    v = b.fadd(n, b.const(k, 2.0**k.mant + k.bias))
    return b.bitcast(b.shl(b.bitcast(v, k.ity), b.iconst(k.ity, k.mant)), k.ty)


#: lower exponent split of the two-factor scaling: with ``a = max(n, split)`` both
#: ``2**(a-1)`` and ``2**(n-a)`` are normal for every ``n`` exp needs
_SCALE_SPLIT = {32: -125.0, 64: -1021.0}


def scale2(b: FunctionBuilder, k: FloatKind, target: VmathTarget, p: Val, t: Val) -> Val:
    """``p * 2**n`` rounded once (subnormal results correctly rounded, overflow gives
    inf), ``p`` in ``[0.5, 2)`` and ``t = n + 1.5 * 2**mant`` held exactly, ``n`` from
    -1100 up to the largest exponent plus one; NaN ``p`` gives NaN.

    With ``target.has_scalef`` this is ``llvm.ldexp`` (one ``vscalefps``/``vscalefpd``)
    with the integer exponent taken from the bits of ``t`` (never an ``fptosi``, which
    would be poison for a NaN). Elsewhere it is ``(2p) * 2**(a-1) * 2**(n-a)`` with ``a
    = max(n, split)``: both factors are normal, the first product is exact, the second
    rounds once. Both paths give identical results."""
    rnd = b.const(k, 1.5 * 2.0**k.mant)
    if target.has_scalef:
        ni = b.sub(b.bitcast(t, k.ity), b.iconst(k.ity, float_bits(k, 1.5 * 2.0**k.mant)))
        if k.bits != 32:
            ni = b.convert("trunc", ni, "i32")
        return b.ldexp(p, ni)
    n = b.fsub(t, rnd)
    split = b.const(k, _SCALE_SPLIT[k.bits])
    one = b.const(k, 1.0)
    a = b.select(b.fcmp("ogt", n, split), n, split)
    f1 = pow2_exact(b, k, b.fsub(a, one))
    f2 = pow2_exact(b, k, b.fsub(n, a))
    twice = b.fadd(p, p)
    return b.fmul(b.fmul(twice, f1), f2)


def frexp_sqrt2(b: FunctionBuilder, k: FloatKind, x: Val) -> tuple[Val, Val]:
    """``(k, m)`` with ``x = m * 2**k``, ``m`` in ``[sqrt(1/2), sqrt(2))``, ``k`` as a float,
    for positive normal ``x``, by integer work only: with ``B`` the bits of ``sqrt(1/2)``,
    ``k = (bits - B) >> mant`` and ``m`` has the bits ``bits - (k << mant)``. Garbage but
    defined for zero, negative, inf and NaN inputs."""
    base = 0x3F3504F3 if k.bits == 32 else 0x3FE6A09E667F3BCD
    bits = b.bitcast(x, k.ity)
    shift = b.iconst(k.ity, k.mant)
    e = b.ashr(b.sub(bits, b.iconst(k.ity, base)), shift)
    mbits = b.sub(bits, b.shl(e, shift))
    return b.convert("sitofp", e, k.ty), b.bitcast(mbits, k.ty)


def two_sum(b: FunctionBuilder, x: Val, y: Val) -> tuple[Val, Val]:
    """``(s, e)`` with ``s = fl(x + y)`` and ``s + e = x + y`` exactly (Knuth)."""
    s = b.fadd(x, y)
    bb = b.fsub(s, x)
    return s, b.fadd(b.fsub(x, b.fsub(s, bb)), b.fsub(y, bb))


def horner(b: FunctionBuilder, k: FloatKind, coeffs: Sequence[float], x: Val) -> Val:
    """``sum(coeffs[i] * x**i)`` by Horner's rule with ``llvm.fmuladd``, coefficients
    rounded to ``k``."""
    p = b.const(k, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = b.fmuladd(p, x, b.const(k, c))
    return p


def horner3(
    b: FunctionBuilder,
    k: FloatKind,
    pieces: Sequence[Sequence[float]],
    x: Val,
    in0: Val,
    in1: Val,
) -> Val:
    """Like :func:`horner` for three same-degree polynomials chosen per element:
    ``pieces[0]`` where ``in0``, else ``pieces[1]`` where ``in1``, else ``pieces[2]``;
    each coefficient is picked by two selects, so one polynomial is evaluated."""

    def coef(i: int) -> Val:
        inner = b.select(in1, b.const(k, pieces[1][i]), b.const(k, pieces[2][i]))
        return b.select(in0, b.const(k, pieces[0][i]), inner)

    n = len(pieces[0])
    p = coef(n - 1)
    for i in range(n - 2, -1, -1):
        p = b.fmuladd(p, x, coef(i))
    return p
