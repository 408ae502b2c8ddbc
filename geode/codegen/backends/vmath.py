"""Vectorizable math functions for numba kernels (exp, expm1, log, log1p, tanh, sigmoid, erf,
sin, cos) in float32 and float64.

Why: the llvmlite wheels on PyPI ship without Intel SVML, so ``math.exp`` and friends inside a
numba loop become scalar libm calls and the loop never vectorizes (16M float32 ``exp`` in a
``prange`` loop: ~110-135 ms, against ~25-35 ms for a plain copy). Every function here is written
in plain arithmetic with a few LLVM intrinsics (bit casts, ``llvm.rint``, ``llvm.fmuladd``,
``llvm.copysign``, ``select``), without any branch on the value (clamps and special cases are selects), so
LLVM's loop vectorizer turns a loop calling them into packed ymm/zmm FMA code.

Use: the public functions are ``numba.njit(forceinline=True)``; call them from any njit
kernel::

    @numba.njit(parallel=True, fastmath={"contract"})
    def kernel(x, y):
        for i in numba.prange(x.size):
            y[i] = exp_f32(x[i])

:data:`VMATH` maps ``(op, dtype name)`` (op as in :data:`geode.codegen.ast.UN_OPS`, plus
``expm1``, ``log1p`` and ``sigmoid``) to the function, for the code generator.

How they are compiled: each public function is compiled once per process and signature
(with its helpers, which are ``inline="always"``: numba inlines them into it), and LLVM
inlines its IR into every calling kernel (``forceinline`` is LLVM's
``alwaysinline``; without it LLVM's cost model leaves sin, cos and erf in float64 as calls
and their loops run 5-9x slower). The kernel's loop vectorizes over the inlined code
exactly as it would over numba-inlined code. (numba's ``inline="always"`` on the public
functions would re-run its front end on every helper at every call site of every kernel:
half of the LSTM gates kernel's cold compile, 0.55 of 1.07 s for its five calls.)
The geode backend compiles the functions a kernel calls through its disk cache
(:func:`geode.codegen.cache.compile_helper`), so a new process loads them.

Conventions shared by all functions:

* ``*_f32`` functions convert their argument to float32 and compute in float32 only (all
  constants are float32, so nothing is promoted to float64); ``*_f64`` functions compute in
  float64. Accuracy is stated against the correctly rounded result (measured with float64/mpmath
  references over dense random samples of the whole range, see ``tests/test_vmath.py``).
* Special values follow C99/numpy: NaN in -> NaN out, overflow -> inf, underflow -> 0 (results in
  the subnormal range are computed, not flushed), ``log(0) = -inf``, ``log(x<0) = NaN`` ...
* ``fastmath``: the functions are accurate and keep their special values under any fastmath
  setting of the calling kernel (``False``, ``{"contract"}``, ``True``; tested). They are
  compiled with their own flags (none), and LLVM keeps each inlined instruction's flags, so a
  caller's fast-math flags do not reach them; within a function, numba's fast-math pass
  would flag every float instruction it finds; the steps whose exact order matters (two-sums,
  two-products, the error term of ``1 + x``, exponent scaling) are emitted by intrinsics as
  instructions it leaves alone, and the NaN/inf tests are integer bit tests, which ``nnan``/
  ``ninf`` cannot fold away. ``{"contract"}`` is the recommended setting (the polynomials use
  ``llvm.fmuladd``, fused on FMA hardware regardless). Under ``fastmath=True`` the sign of a
  zero result is not guaranteed.
* LLVM's tuning for AVX-512 CPUs prefers 256-bit vectors; geode adds ``-prefer-256-bit`` to
  numba's host features (:mod:`geode.codegen.backends.target`), so loops calling these
  functions vectorize to zmm code, measured 1.3-1.5x faster than ymm on exp and tanh.
* Polynomial coefficients were fitted for this module with ``mpmath.chebyfit`` (near-minimax
  Chebyshev fits at 60 digits) on the reduced interval named in each docstring, then rounded to
  the working precision; the fit error quoted is the error of the real-valued fit.
* Inlined code is compiled into the caller; numba's on-disk cache of a caller does not notice
  edits to this module (geode's kernel cache keys hash this file; clear other caches after
  changing it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "VMATH",
    "VMATH2",
    "VMATH_IEEE",
    "cos_f32",
    "cos_f64",
    "div_one_plus_exp_f32",
    "div_one_plus_exp_f64",
    "erf_f32",
    "erf_f64",
    "exp_f32",
    "exp_f64",
    "expm1_f32",
    "expm1_f64",
    "log1p_f32",
    "log1p_f64",
    "log_f32",
    "log_f64",
    "sigmoid_f32",
    "sigmoid_f64",
    "sigmoid_ieee_f32",
    "sigmoid_ieee_f64",
    "sin_f32",
    "sin_f64",
    "tanh_f32",
    "tanh_f64",
    "tanh_ieee_f32",
    "tanh_ieee_f64",
]

#: the helpers: inlined by numba into the public function that calls them
_inline = numba.njit(inline="always")
#: the public functions: compiled once per process (or loaded from geode's disk cache,
#: :func:`geode.codegen.cache.compile_helper`), then inlined into each calling kernel by
#: LLVM (``alwaysinline``)
_export = numba.njit(forceinline=True, error_model="numpy")

# ---------------------------------------------------------------------------------
# intrinsics: the few operations plain numba arithmetic cannot express (or would widen
# to int64, or would let a fastmath=True caller rewrite), emitted directly as LLVM IR.
# ---------------------------------------------------------------------------------


def _float_ir(ty: types.Type) -> tuple[ir.Type, ir.IntType, int, int, float]:
    """(float IR type, same-width int IR type, mantissa bits, exponent bias, 2**mant + bias)."""
    if ty.bitwidth == 32:
        return ir.FloatType(), ir.IntType(32), 23, 127, 2.0**23 + 127
    return ir.DoubleType(), ir.IntType(64), 52, 1023, 2.0**52 + 1023


def _call_intrinsic(builder: ir.IRBuilder, name: str, args: Sequence[ir.Value]) -> ir.Value:
    ty = args[0].type
    suffix = "f32" if isinstance(ty, ir.FloatType) else "f64"
    fnty = ir.FunctionType(ty, [ty] * len(args))
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.{name}.{suffix}")
    return builder.call(fn, list(args))


@intrinsic
def _rint(typingctx, x):
    """Round to the nearest integer, ties to even (``llvm.rint``; vroundps/vrndscaleps)."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "rint", args)

    return x(x), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c``, fused when the target has FMA (``llvm.fmuladd``)."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "fmuladd", args)

    return a(a, b, c), codegen


@intrinsic
def _floor(typingctx, x):
    """Round toward -inf (``llvm.floor``)."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "floor", args)

    return x(x), codegen


@intrinsic
def _exponent_field(typingctx, x):
    """The biased exponent field of ``x`` (0 for zero/subnormal, max for inf/NaN) as uint64,
    for indexing tables (unsigned: numba adds no negative-index wraparound)."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        _, ity, mant, bias, _ = _float_ir(sig.args[0])
        bits = builder.lshr(builder.bitcast(args[0], ity), ir.Constant(ity, mant))
        field = builder.and_(bits, ir.Constant(ity, 2 * bias + 1))
        return builder.zext(field, ir.IntType(64)) if ity.width < 64 else field

    return types.uint64(x), codegen


@intrinsic
def _fma_exact(typingctx, a, b, c):
    """``a * b + c`` with a single rounding (``llvm.fma``), for exact two-products."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "fma", args)

    return a(a, b, c), codegen


@intrinsic
def _copysign(typingctx, mag, sgn):
    """Magnitude of ``mag`` with the sign bit of ``sgn`` (``llvm.copysign``)."""
    if not (isinstance(mag, types.Float) and mag == sgn):
        return None

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "copysign", args)

    return mag(mag, sgn), codegen


@intrinsic
def _select(typingctx, cond, a, b):
    """``a if cond else b`` as one LLVM ``select`` (no branch, cheap to type and compile)."""
    if not (isinstance(cond, types.Boolean) and isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return builder.select(args[0], args[1], args[2])

    return a(cond, a, b), codegen


def _bit_test(name: str, doc: str, pred: Callable) -> Callable:
    def impl(typingctx, x):
        if not isinstance(x, types.Float):
            return None

        def codegen(context, builder, sig, args):
            _, ity, mant, bias, _ = _float_ir(sig.args[0])
            mag = builder.and_(
                builder.bitcast(args[0], ity), ir.Constant(ity, (1 << (ity.width - 1)) - 1)
            )
            inf_bits = ir.Constant(ity, (2 * bias + 1) << mant)
            return pred(builder, mag, inf_bits)

        return types.boolean(x), codegen

    impl.__name__ = name
    impl.__doc__ = doc
    return intrinsic(impl)


#: NaN / inf / finite tests on the bits (integer compares), so they survive the
#: ``nnan``/``ninf`` flags of a ``fastmath=True`` caller that would fold ``x != x`` to False.
_isnan = _bit_test("_isnan", "x is NaN (bit test).", lambda b, m, inf: b.icmp_unsigned(">", m, inf))
_isinf = _bit_test(
    "_isinf", "x is +-inf (bit test).", lambda b, m, inf: b.icmp_unsigned("==", m, inf)
)
_isfinite = _bit_test(
    "_isfinite", "x is finite (bit test).", lambda b, m, inf: b.icmp_unsigned("<", m, inf)
)


@intrinsic
def _div(typingctx, a, b):
    """``a / b`` as a plain IEEE division: numba's default ``error_model="python"`` would add a
    zero-divisor check (a branch raising ZeroDivisionError) to ``/``; strict flags keep a
    ``fastmath=True`` caller from turning it into a reciprocal estimate."""
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return builder.fdiv(args[0], args[1], flags=_STRICT_FLAGS)

    return a(a, b), codegen


def _strict_binop(op: str) -> Callable:
    def impl(typingctx, a, b):
        if not (isinstance(a, types.Float) and a == b):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1], flags=_STRICT_FLAGS)

        return a(a, b), codegen

    impl.__name__ = f"_{op}"
    impl.__doc__ = f"IEEE ``{op}`` that ``fastmath=True`` cannot reassociate."
    return intrinsic(impl)


#: numba's fast-math pass adds the caller's flags to every float instruction that has none;
#: ``afn`` (meaningless on arithmetic) marks an instruction as already flagged, so it stays
#: a plain IEEE operation.
_STRICT_FLAGS = ("afn",)

#: Plain IEEE add/sub/mul for the steps whose exact order matters (error-free transforms,
#: exact scaling), kept as written even in a caller compiled with ``fastmath=True``.
_add = _strict_binop("fadd")
_sub = _strict_binop("fsub")
_mul = _strict_binop("fmul")


def _pow2_ir(builder: ir.IRBuilder, n: ir.Value, fty: ir.Type, ity: ir.IntType) -> ir.Value:
    """IR for ``2**n``, ``n`` an integer-valued float in the normal exponent range: ``n +
    (2**mant + bias)`` holds ``n + bias`` in its low mantissa bits; shifting its bits left
    by ``mant`` moves them into the exponent field."""
    mant = 23 if ity.width == 32 else 52
    magic = 2.0**mant + (127 if ity.width == 32 else 1023)
    v = builder.fadd(n, ir.Constant(fty, magic), flags=_STRICT_FLAGS)
    return builder.bitcast(builder.shl(builder.bitcast(v, ity), ir.Constant(ity, mant)), fty)


@intrinsic
def _pow2_rounded(typingctx, t):
    """``2**n`` from ``t = n + 1.5 * 2**mant + bias`` held exactly, as the rounding step of an
    exp reduction computes it with the bias folded into its constant (:data:`_RNDB_F32`):
    the low mantissa bits of ``t`` then hold ``n + bias``, and one shift left by ``mant``
    moves them into the exponent field (no float add, no float->int conversion).

    Valid for ``n + bias`` in ``[1, 2 * bias]`` (normal results); ``n + bias = 2 * bias + 1``
    gives inf. A NaN ``t`` gives garbage bits (never poison); callers keep a NaN factor in
    the product.
    """
    if not isinstance(t, types.Float):
        return None

    def codegen(context, builder, sig, args):
        fty, ity, mant, _, _ = _float_ir(sig.args[0])
        bits = builder.shl(builder.bitcast(args[0], ity), ir.Constant(ity, mant))
        return builder.bitcast(bits, fty)

    return t(t), codegen


#: Lower exponent split of the two-factor scaling in :func:`_scale2_rnd` (f32, f64): with
#: ``a = max(n, split)`` both ``2**(a-1)`` and ``2**(n-a)`` are normal for every ``n`` an
#: exp needs (down to -150 / -1075).
_SCALE_SPLIT = {32: -125.0, 64: -1021.0}

#: ``ldexp`` lowering for :func:`_scale2_rnd`: None asks the target (AVX-512F with VL:
#: ``vscalefps``/``vscalefpd``), True/False force it (tests compare both paths).
SCALEF: bool | None = None


def _use_scalef() -> bool:
    if SCALEF is not None:
        return SCALEF
    return _target_has_scalef()


@functools.lru_cache(maxsize=1)
def _target_has_scalef() -> bool:
    from geode.codegen.backends.target import codegen_fingerprint

    feats = set(codegen_fingerprint()["cpu_features"].split(","))
    return {"+avx512f", "+avx512vl"} <= feats


@intrinsic
def _scale2_rnd(typingctx, p, t):
    """``p * 2**n`` rounded once (so subnormal results are correctly rounded and overflow
    gives inf), for ``p`` in ``[0.5, 2)`` and ``t = n + 1.5 * 2**mant`` held exactly (exp's
    rounding step computes it), ``n`` an integer from -1100 up to the largest exponent
    plus one (128 / 1024: the range exp needs); NaN ``p`` gives NaN.

    On AVX-512 hosts this is ``llvm.ldexp``, which LLVM lowers to one ``vscalefps``/
    ``vscalefpd`` (plus an integer convert): the integer exponent comes straight from the
    bits of ``t``, never from an ``fptosi`` that would be poison for a NaN. Elsewhere
    (vector ``ldexp`` would become libm calls) it is ``(2p) * 2**(a-1) * 2**(n-a)`` with
    ``a = max(n, split)``: both factors are normal, the first product is exact, the
    second rounds once. Both paths give identical results.
    """
    if not (isinstance(p, types.Float) and p == t):
        return None

    def codegen(context, builder, sig, args):
        return _scale2_ir(builder, sig.args[0], args[0], args[1])

    return p(p, t), codegen


def _scale2_ir(builder, ty, pv, t):
    """IR of :func:`_scale2_rnd`."""
    fty, ity, mant, _, _ = _float_ir(ty)
    rnd = ir.Constant(fty, 1.5 * 2.0**mant)
    if _use_scalef():
        ni = builder.sub(builder.bitcast(t, ity), builder.bitcast(rnd, ity))
        i32 = ir.IntType(32)
        if ity.width != 32:
            ni = builder.trunc(ni, i32)
        suffix = "f32" if ity.width == 32 else "f64"
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(fty, [fty, i32]), f"llvm.ldexp.{suffix}.i32"
        )
        return builder.call(fn, [pv, ni])
    n = builder.fsub(t, rnd, flags=_STRICT_FLAGS)
    split = ir.Constant(fty, _SCALE_SPLIT[ity.width])
    one = ir.Constant(fty, 1.0)
    a = builder.select(builder.fcmp_ordered(">", n, split), n, split)
    f1 = _pow2_ir(builder, builder.fsub(a, one, flags=_STRICT_FLAGS), fty, ity)
    f2 = _pow2_ir(builder, builder.fsub(n, a, flags=_STRICT_FLAGS), fty, ity)
    twice = builder.fadd(pv, pv, flags=_STRICT_FLAGS)
    return builder.fmul(builder.fmul(twice, f1, flags=_STRICT_FLAGS), f2, flags=_STRICT_FLAGS)


@intrinsic
def _frexp_sqrt2(typingctx, x):
    """Split positive normal ``x`` into ``(k, m)`` with ``x = m * 2**k``, ``m`` in
    ``[sqrt(1/2), sqrt(2))``; ``k`` is returned as a float. Integer work only (no branch): with
    ``B`` the bits of ``sqrt(1/2)``, ``k = (bits - B) >> mant`` and ``m`` has bits
    ``bits - (k << mant)``. Garbage but defined for zero, negative, inf and NaN inputs.
    """
    if not isinstance(x, types.Float):
        return None
    ret = types.UniTuple(x, 2)

    def codegen(context, builder, sig, args):
        fty, ity, mant, _, _ = _float_ir(sig.args[0])
        b = 0x3F3504F3 if mant == 23 else 0x3FE6A09E667F3BCD
        bits = builder.bitcast(args[0], ity)
        k = builder.ashr(builder.sub(bits, ir.Constant(ity, b)), ir.Constant(ity, mant))
        mbits = builder.sub(bits, builder.shl(k, ir.Constant(ity, mant)))
        e = builder.sitofp(k, fty)
        m = builder.bitcast(mbits, fty)
        return context.make_tuple(builder, sig.return_type, [e, m])

    return ret(x), codegen


# ---------------------------------------------------------------------------------
# polynomial evaluation helpers (generated, so coefficient tables stay data)
# ---------------------------------------------------------------------------------


def _horner(name: str, coeffs: Sequence[float], dtype: type) -> Callable:
    """An inlinable njit ``p(x) = sum(coeffs[k] * x**k)`` by Horner's rule with ``_fma``;
    coefficients are rounded to ``dtype`` (np.float32 or np.float64) and frozen as constants."""
    n = len(coeffs)
    ns: dict[str, object] = {"_fma": _fma}
    ns.update({f"c{k}": dtype(c) for k, c in enumerate(coeffs)})
    body = [f"def {name}(x):", f"    p = c{n - 1}"]
    body += [f"    p = _fma(p, x, c{k})" for k in range(n - 2, -1, -1)]
    body.append("    return p")
    exec("\n".join(body), ns)
    return _inline(ns[name])


def _horner3(name: str, pieces: Sequence[Sequence[float]], dtype: type) -> Callable:
    """Like :func:`_horner` for three same-degree polynomials selected per element:
    ``p(x, in0, in1)`` uses ``pieces[0]`` if ``in0``, else ``pieces[1]`` if ``in1``, else
    ``pieces[2]``. Each coefficient is picked by selects (blends), so there is a single
    polynomial evaluation and no branch."""
    n = len(pieces[0])
    ns: dict[str, object] = {"_fma": _fma, "_select": _select}
    for j, piece in enumerate(pieces):
        ns.update({f"c{j}_{k}": dtype(c) for k, c in enumerate(piece)})

    def coef(k: int) -> str:
        return f"_select(in0, c0_{k}, _select(in1, c1_{k}, c2_{k}))"

    body = [f"def {name}(x, in0, in1):", f"    p = {coef(n - 1)}"]
    body += [f"    p = _fma(p, x, {coef(k)})" for k in range(n - 2, -1, -1)]
    body.append("    return p")
    exec("\n".join(body), ns)
    return _inline(ns[name])


# ---------------------------------------------------------------------------------
# coefficients (low degree first), fitted with mpmath.chebyfit; see each docstring
# ---------------------------------------------------------------------------------

# fmt: off
# q(r) = (exp(r) - 1 - r) / r**2 on |r| <= ln2/2 (fit error 6.5e-8 resp. 1.4e-18)
_EXPQ_F32 = (0.5, 0.16666576845993977, 0.04166655443768594, 0.008363202971575855, 0.0013926213466332444)
_EXPQ_F64 = (0.5, 0.1666666666666667, 0.04166666666666667, 0.008333333333326112, 0.001388888888888373, 0.0001984126987490126, 2.4801587325605324e-05, 2.7557255297969643e-06, 2.755727357010214e-07, 2.5105259538448494e-08, 2.0914717341716378e-09)
# T(z) = (2 atanh(s) / s - 2) / z, z = s**2 <= ((sqrt2-1)/(sqrt2+1))**2 (fit error 1.9e-7 resp. 3.1e-16)
_LOGT_F32 = (0.6666668509542907, 0.39988757716604845, 0.29580985929974424)
_LOGT_F64 = (0.666666666666667, 0.3999999999989889, 0.28571428626253836, 0.22222211089379496, 0.1818289243253687, 0.15331611722055008, 0.14617807153417325)
# erf(x)/x - 1 as a polynomial in w = x**2, |x| <= 0.875 resp. 0.75 (fit error 9e-9 resp. 8e-19)
_ERFA_F32 = (0.12837915808178624, -0.37612554106986856, 0.11282491758304311, -0.026792746388152853, 0.0050340337466186925, -0.0006212635658290611)
_ERFA_F64 = (0.1283791670955126, -0.37612638903183715, 0.11283791670952574, -0.026866170644423006, 0.005223977615352482, -0.0008548326183927565, 0.00012055289359577225, -1.4924190787307278e-05, 1.6430595993862833e-06, -1.5939288983225857e-07, 1.1469591473651114e-08)
# log(erfc(z)) as a polynomial in u = z - 0.875 on z in [0.87, 3.96] (fit error 2.1e-8)
_ERFB_F32 = (-1.5328244187343467, -2.4302208945388415, -0.8265297287874076, -0.04694655201700535, 0.011438913361750003, -0.002306306204236201, 0.00035036676615638347, -3.474933739602045e-05, 1.6518342659033025e-06)
# log(erfc(z)) in u = z - c on [0.745, 2] (c=1), [2, 4] (c=3), [4, 6.01] (c=5) (fit error 5.8e-18, 4.6e-17, 1.2e-19)
_ERFB1_F64 = (-1.8496055099332482, -2.6389675142347913, -0.8431072563584876, -0.041561098046541435, 0.010033825434509818, -0.0019779030206649602, 0.00023732470009832149, 2.62703784176326e-05, -2.714099604130205e-05, 9.576997333856188e-06, -2.0188263882413087e-06, 1.055212068164781e-07, 1.200900034538829e-07, -5.920207802081031e-08, 1.4517849169844786e-08, -1.6378157377777163e-09)
_ERFB2_F64 = (-10.720363041981113, -6.303753689003234, -0.9573942188012455, -0.0074118917955658, 0.0013533104381338924, -0.00024569213382519864, 4.3081790261932936e-05, -7.115465172255726e-06, 1.0693924461286522e-06, -1.3617724616146135e-07, 1.1452646831596569e-08, 6.346477677357405e-10, -6.014073579396739e-10, 1.880583743347194e-10, -4.9545379131479674e-11, 9.15323489583395e-12)
_ERFB3_F64 = (-27.200889545537436, -10.192700054863682, -0.9820669298906405, -0.0021526488607301656, 0.00028146177332980026, -3.8013870130694084e-05, 5.176109265395029e-06, -7.006542391291392e-07, 9.334066937019565e-08, -1.2127767733006121e-08, 1.521289508291797e-09, -1.8165662691744447e-10, 2.018460834994357e-11, -1.985409293071981e-12, 1.387816586397148e-13, 3.330999586870625e-16)
# S(w) = (sin(r) - r) / r**3, C(w) = (cos(r) - 1 + w/2) / w**2, w = r**2 <= (pi/4)**2
# (fit error: S 2.0e-8 / 2.1e-17, C 2.0e-9 / 1.3e-18)
_SIN_F32 = (-0.16666664656310706, 0.008332747104372895, -0.000195876390357926)
_SIN_F64 = (-0.16666666666666666, 0.008333333333330936, -0.00019841269836740527, 2.7557316093196066e-06, -2.5051129895962807e-08, 1.5917988944318716e-10)
_COS_F32 = (0.04166666465348729, -0.0013888301867270142, 2.4547689709382208e-05)
_COS_F64 = (0.041666666666666664, -0.0013888888888887389, 2.48015872987544e-05, -2.7557317265876615e-07, 2.087614504910828e-09, -1.1382544623404291e-11)
# fmt: on

_expq_f32 = _horner("_expq_f32", _EXPQ_F32, np.float32)
_expq_f64 = _horner("_expq_f64", _EXPQ_F64, np.float64)
_logt_f32 = _horner("_logt_f32", _LOGT_F32, np.float32)
_logt_f64 = _horner("_logt_f64", _LOGT_F64, np.float64)
_erfa_f32 = _horner("_erfa_f32", _ERFA_F32, np.float32)
_erfa_f64 = _horner("_erfa_f64", _ERFA_F64, np.float64)
_erfb_f32 = _horner("_erfb_f32", _ERFB_F32, np.float32)
_erfb_f64 = _horner3("_erfb_f64", (_ERFB1_F64, _ERFB2_F64, _ERFB3_F64), np.float64)
_sinp_f32 = _horner("_sinp_f32", _SIN_F32, np.float32)
_sinp_f64 = _horner("_sinp_f64", _SIN_F64, np.float64)
_cosp_f32 = _horner("_cosp_f32", _COS_F32, np.float32)
_cosp_f64 = _horner("_cosp_f64", _COS_F64, np.float64)

# ---------------------------------------------------------------------------------
# constants (typed: a bare Python float literal would promote float32 code to float64)
# ---------------------------------------------------------------------------------

_F32 = np.float32
_F64 = np.float64
_ZERO_F32, _HALF_F32, _ONE_F32, _TWO_F32 = _F32(0.0), _F32(0.5), _F32(1.0), _F32(2.0)
_ZERO_F64, _HALF_F64, _ONE_F64, _TWO_F64 = _F64(0.0), _F64(0.5), _F64(1.0), _F64(2.0)
_INF_F32, _NAN_F32 = _F32(np.inf), _F32(np.nan)
_INF_F64, _NAN_F64 = _F64(np.inf), _F64(np.nan)

_LOG2E_F32 = _F32(1.4426950408889634)
_LOG2E_F64 = _F64(1.4426950408889634)
# Cody-Waite split of ln2: n * hi is exact for |n| < 2**15 (f32) / 2**21 (f64)
_NLN2HI_F32 = _F32(-0.693359375)
_NLN2LO_F32 = _F32(2.1219444005469057e-04)
_NLN2HI_F64 = _F64(-6.93147180369123816490e-01)
_NLN2LO_F64 = _F64(-1.90821492927058770002e-10)
# ln2 for log: hi has 16 significant bits (k * hi exact for |k| < 2**8 / 2**37)
_LN2HI_F32 = _F32(0.693145751953125)
_LN2LO_F32 = _F32(1.4286068203094173e-06)
_LN2HI_F64 = _F64(6.93147180369123816490e-01)
_LN2LO_F64 = _F64(1.90821492927058770002e-10)


# ---------------------------------------------------------------------------------
# exp / expm1
# ---------------------------------------------------------------------------------

_EXP_LO_F32, _EXP_HI_F32 = _F32(-104.0), _F32(89.0)
_EXP_LO_F64, _EXP_HI_F64 = _F64(-746.0), _F64(710.0)
_EXPM1_LO_F32, _EXPM1_LO_F64 = _F32(-18.0), _F64(-40.0)
#: rounding constants of the exp reduction: ``fma(x, log2(e), c)`` rounds ``x * log2(e)``
#: to an integer ``n`` (the spacing of floats in ``[2**mant, 2**(mant + 1))`` is 1) and
#: holds ``n + c`` exactly. ``_RND``: ``c = 1.5 * 2**mant``; ``_RNDB``: the exponent bias
#: folded in, so :func:`_pow2_rounded` of the sum is ``2**n``; ``_RNDB1``: bias - 1, so it
#: is ``2**(n - 1)``. All three round alike (they differ by an integer).
_RND_F32, _RND_F64 = _F32(1.5 * 2**23), _F64(1.5 * 2**52)
_RNDB_F32, _RNDB_F64 = _F32(1.5 * 2**23 + 127), _F64(1.5 * 2**52 + 1023)
_RNDB1_F32, _RNDB1_F64 = _F32(1.5 * 2**23 + 126), _F64(1.5 * 2**52 + 1022)


# Alternatives to the reduction + polynomial below, measured on Zen 4 (float32, 16 lanes
# per vector, one core, cycles per vector of a loop computing exp): this form 10.4; the
# rational form ``exp(r) = (R + r) / (R - r)`` with ``R = 2 + r**2 (p1 + p2 r**2)``
# (three FMAs fewer, one division more) 10.9, and in the sign-tested sigmoid that
# :func:`sigmoid_f32` replaced 15.7 against 15.7;
# Estrin's scheme for ``q`` (one multiply more, a shorter dependency chain) 11.5. Such
# loops behave as bound by the FMA pipes' work (an added FMA costs about a cycle, a
# division 1.5-2, a compare and blend about one; a max or a vscalefps next to nothing),
# not by latency, so neither is used (and sigmoid avoids the compare and blend).
@_inline
def _exp_reduce_f32(x, rnd):  # pragma: no cover - compiled
    """t = n + rnd, n = rint(x / ln2), r = x - n ln2 (two-constant Cody-Waite); ``rnd`` is
    one of the rounding constants above.

    ``rint`` is one FMA: adding ``rnd`` rounds ``x * log2(e)`` to an integer with a single
    rounding, and the strict subtraction gets it back exactly."""
    t = _fma(x, _LOG2E_F32, rnd)
    n = _sub(t, rnd)
    r = _fma(n, _NLN2HI_F32, x)
    return t, n, _fma(n, _NLN2LO_F32, r)


@_inline
def _exp_reduce_f64(x, rnd):  # pragma: no cover - compiled
    """As :func:`_exp_reduce_f32`, in float64."""
    t = _fma(x, _LOG2E_F64, rnd)
    n = _sub(t, rnd)
    r = _fma(n, _NLN2HI_F64, x)
    return t, n, _fma(n, _NLN2LO_F64, r)


@_inline
def _exp_parts_f32(x, rnd):  # pragma: no cover - compiled
    """:func:`_exp_reduce_f32`'s ``t`` and ``n``, and ``e = expm1(r)``."""
    t, n, r = _exp_reduce_f32(x, rnd)
    return t, n, _fma(r * r, _expq_f32(r), r)


@_inline
def _exp_parts_f64(x, rnd):  # pragma: no cover - compiled
    """As :func:`_exp_parts_f32`, in float64."""
    t, n, r = _exp_reduce_f64(x, rnd)
    return t, n, _fma(r * r, _expq_f64(r), r)


@_inline
def _exp_core_f32(x):  # pragma: no cover - compiled
    """exp for x already known to be <= _EXP_HI_F32 (NaN propagates); clamps the low side.

    ``2**n`` (n in [-150, 128]) is applied by :func:`_scale2_rnd` with a single rounding, so
    subnormal results are correctly rounded and overflow gives inf exactly."""
    x = _select(x < _EXP_LO_F32, _EXP_LO_F32, x)
    t, _, e = _exp_parts_f32(x, _RND_F32)
    return _scale2_rnd(_add(e, _ONE_F32), t)


@_inline
def _exp_core_f64(x):  # pragma: no cover - compiled
    x = _select(x < _EXP_LO_F64, _EXP_LO_F64, x)
    t, _, e = _exp_parts_f64(x, _RND_F64)
    return _scale2_rnd(_add(e, _ONE_F64), t)


@_inline
def _exp_normal_f32(x):  # pragma: no cover - compiled
    """exp for x whose result is a normal number (|x| < 87): no clamp, one scaling factor
    taken from the rounding step's bits."""
    t, _, e = _exp_parts_f32(x, _RNDB_F32)
    return (e + _ONE_F32) * _pow2_rounded(t)


@_inline
def _exp_normal_f64(x):  # pragma: no cover - compiled
    t, _, e = _exp_parts_f64(x, _RNDB_F64)
    return (e + _ONE_F64) * _pow2_rounded(t)


@_export
def exp_f32(x: float) -> float:
    """``exp(x)`` in float32, max error 1.05 ulp measured (mean 0.13), subnormal results included.

    Method: clamp x to [-104, 89] (NaN passes; beyond the clamp the result is already 0 / inf),
    ``n = rint(x * log2(e))`` (one FMA with a rounding constant), ``r = x - n*ln2`` with a
    two-constant Cody-Waite split (``|r| <= ln2/2``), ``exp(r) = 1 + r + r**2 q(r)`` with ``q``
    of degree 4 (near-minimax, fit error 6.5e-8, i.e. degree 6 overall), then scale by
    ``2**n`` with one rounding (:func:`_scale2_rnd`: ``vscalefps`` on AVX-512 hosts, two normal
    factors elsewhere), so results round once into the subnormal range or overflow to inf
    exactly as they should. NaN propagates through the arithmetic (no final test): about
    14 vector instructions per vector of elements with ``vscalefps``, 20 without.
    Special values: exp(-inf) = 0, exp(inf) = inf, NaN -> NaN.
    """
    x = np.float32(x)
    return _exp_core_f32(_select(x > _EXP_HI_F32, _EXP_HI_F32, x))


@_export
def exp_f64(x: float) -> float:
    """``exp(x)`` in float64, max error 0.98 ulp measured (mean 0.12).

    Method as :func:`exp_f32`: clamp to [-746, 710], Cody-Waite ``ln2`` split (fdlibm's
    32-bit ``ln2_hi``), ``q`` of degree 10 (degree 12 overall, fit error 1.4e-18),
    two-factor ``2**n`` scaling (subnormal results are exact-rounded, overflow gives inf).
    """
    x = np.float64(x)
    y = _exp_core_f64(_select(x > _EXP_HI_F64, _EXP_HI_F64, x))
    return _select(_isnan(x), x, y)


@_inline
def _expm1_core_f32(x):  # pragma: no cover - compiled
    """expm1 for any non-NaN x (clamped to [-18, 89]); callers handle NaN."""
    x = _select(x > _EXP_HI_F32, _EXP_HI_F32, x)
    x = _select(x < _EXPM1_LO_F32, _EXPM1_LO_F32, x)
    t, _, e = _exp_parts_f32(x, _RNDB1_F32)
    h = _pow2_rounded(t)
    return _TWO_F32 * _fma(h, e, h - _HALF_F32)


@_inline
def _expm1_core_f64(x):  # pragma: no cover - compiled
    x = _select(x > _EXP_HI_F64, _EXP_HI_F64, x)
    x = _select(x < _EXPM1_LO_F64, _EXPM1_LO_F64, x)
    t, _, e = _exp_parts_f64(x, _RNDB1_F64)
    h = _pow2_rounded(t)
    return _TWO_F64 * _fma(h, e, h - _HALF_F64)


#: ln2 rounded to the working precision, for :func:`_expm1_pos_f32`'s one-constant reduction
_NLN2_F32, _NLN2_F64 = _F32(-math.log(2.0)), _F64(-math.log(2.0))


@_inline
def _expm1_pos_f32(x):  # pragma: no cover - compiled
    """expm1 for x in [0, 40] (NaN propagates), tanh's case: ``2**n`` is normal and finite
    for such x, so no clamps, and ``expm1 = 2**n e + (2**n - 1)`` is one FMA with ``2**n``
    from the rounding step's bits.

    The reduction ``r = x - n ln2`` uses ln2 rounded to float32 (one FMA, not exp's two):
    its error ``n * 1.9e-9`` (float64: ``n * 2.3e-17``) reaches tanh damped by
    ``2E / (E**2 - 1)``, ``E = exp(x)``, which is under 1.4 for n >= 1 and shrinks like
    ``2 / E``: at most 0.05 ulp of tanh (float64: 0.15), and none for n = 0, where r = x.
    Not for expm1 itself, whose error would grow with n."""
    t = _fma(x, _LOG2E_F32, _RNDB_F32)
    r = _fma(_sub(t, _RNDB_F32), _NLN2_F32, x)
    u = _pow2_rounded(t)
    return _fma(u, _fma(r * r, _expq_f32(r), r), u - _ONE_F32)


@_inline
def _expm1_pos_f64(x):  # pragma: no cover - compiled
    t = _fma(x, _LOG2E_F64, _RNDB_F64)
    r = _fma(_sub(t, _RNDB_F64), _NLN2_F64, x)
    u = _pow2_rounded(t)
    return _fma(u, _fma(r * r, _expq_f64(r), r), u - _ONE_F64)


@_export
def expm1_f32(x: float) -> float:
    """``exp(x) - 1`` in float32, accurate near 0, max error 1.52 ulp measured.

    Method: clamp to [-18, 89] (expm1(-18) rounds to -1), same reduction as :func:`exp_f32`
    giving ``e = expm1(r)`` (exact when n = 0), then ``expm1(x) = 2**n e + (2**n - 1)``
    evaluated as ``2 * fma(t, e, t - 1/2)`` with ``t = 2**(n-1)`` so ``t`` stays finite
    up to n = 128 and the final doubling overflows to inf. NaN -> NaN, -inf -> -1, inf -> inf.
    """
    x = np.float32(x)
    y = _expm1_core_f32(x)
    return _select(_isnan(x), x, y)


@_export
def expm1_f64(x: float) -> float:
    """``exp(x) - 1`` in float64, max error 1.71 ulp measured; method as :func:`expm1_f32`, clamp
    [-40, 710], degree-12 polynomial."""
    x = np.float64(x)
    y = _expm1_core_f64(x)
    return _select(_isnan(x), x, y)


# ---------------------------------------------------------------------------------
# log / log1p
# ---------------------------------------------------------------------------------

_MIN_NORMAL_F32, _SUBSCALE_F32, _SUBK_F32 = _F32(2.0**-126), _F32(2.0**25), _F32(25.0)
_MIN_NORMAL_F64, _SUBSCALE_F64, _SUBK_F64 = _F64(2.0**-1022), _F64(2.0**54), _F64(54.0)


@_inline
def _log_core_f32(x, c):  # pragma: no cover - compiled
    """log(x) + c for finite x > 0 (subnormals included) and a small correction c."""
    sub = x < _MIN_NORMAL_F32
    x = _select(sub, x * _SUBSCALE_F32, x)
    k, m = _frexp_sqrt2(x)
    k = _select(sub, k - _SUBK_F32, k)
    f = m - _ONE_F32
    s = _div(f, _TWO_F32 + f)
    z = s * s
    big_r = z * _logt_f32(z)
    hfsq = _HALF_F32 * f * f
    lo = _fma(s, hfsq + big_r, _fma(k, _LN2LO_F32, c))
    return _fma(k, _LN2HI_F32, f - (hfsq - lo))


@_inline
def _log_core_f64(x, c):  # pragma: no cover - compiled
    sub = x < _MIN_NORMAL_F64
    x = _select(sub, x * _SUBSCALE_F64, x)
    k, m = _frexp_sqrt2(x)
    k = _select(sub, k - _SUBK_F64, k)
    f = m - _ONE_F64
    s = _div(f, _TWO_F64 + f)
    z = s * s
    big_r = z * _logt_f64(z)
    hfsq = _HALF_F64 * f * f
    lo = _fma(s, hfsq + big_r, _fma(k, _LN2LO_F64, c))
    return _fma(k, _LN2HI_F64, f - (hfsq - lo))


@_export
def log_f32(x: float) -> float:
    """Natural log in float32, max error 0.82 ulp measured (subnormal inputs included).

    Method (fdlibm's scheme): ``x = m * 2**k`` with ``m`` in [sqrt(1/2), sqrt(2)) from the bits
    (subnormal x is first scaled by 2**25), ``f = m - 1``, ``s = f / (2 + f)``,
    ``log(1+f) = f - f**2/2 + s (f**2/2 + R)`` with ``R = z T(z)``, ``z = s**2 <= 0.0295``,
    ``T`` of degree 2 (fit error 1.9e-7 on T, below 1e-9 relative on the result), plus
    ``k ln2`` in two pieces. Special values: log(0) = -inf, log(x < 0) = NaN, log(inf) = inf,
    NaN -> NaN.
    """
    x = np.float32(x)
    y = _log_core_f32(x, _ZERO_F32)
    y = _select(_isinf(x), _INF_F32, y)
    y = _select(x == _ZERO_F32, -_INF_F32, y)
    y = _select(x < _ZERO_F32, _NAN_F32, y)
    return _select(_isnan(x), x, y)


@_export
def log_f64(x: float) -> float:
    """Natural log in float64, max error 0.83 ulp measured; method as :func:`log_f32` with ``T`` of
    degree 6 (fit error 3.1e-16 on T, ~1e-18 relative on the result), subnormals scaled by
    2**54."""
    x = np.float64(x)
    y = _log_core_f64(x, _ZERO_F64)
    y = _select(_isinf(x), _INF_F64, y)
    y = _select(x == _ZERO_F64, -_INF_F64, y)
    y = _select(x < _ZERO_F64, _NAN_F64, y)
    return _select(_isnan(x), x, y)


@_export
def log1p_f32(x: float) -> float:
    """``log(1 + x)`` in float32, accurate near 0, max error 0.81 ulp measured.

    Method: ``u = 1 + x`` rounded, its exact rounding error ``d`` (Fast2Sum, ordered by
    magnitude with a select), ``log1p(x) = log(u) + d/u`` with the log of :func:`log_f32`.
    Special values: log1p(-1) = -inf, log1p(x < -1) = NaN, log1p(inf) = inf, NaN -> NaN.
    """
    x = np.float32(x)
    u = _add(_ONE_F32, x)
    d = _select(abs(x) <= _ONE_F32, _sub(x, _sub(u, _ONE_F32)), _sub(_ONE_F32, _sub(u, x)))
    y = _log_core_f32(u, _div(d, u))
    y = _select(_isinf(x), _INF_F32, y)
    y = _select(x == -_ONE_F32, -_INF_F32, y)
    y = _select(x < -_ONE_F32, _NAN_F32, y)
    return _select(_isnan(x), x, y)


@_export
def log1p_f64(x: float) -> float:
    """``log(1 + x)`` in float64, max error 0.81 ulp measured; method as :func:`log1p_f32`."""
    x = np.float64(x)
    u = _add(_ONE_F64, x)
    d = _select(abs(x) <= _ONE_F64, _sub(x, _sub(u, _ONE_F64)), _sub(_ONE_F64, _sub(u, x)))
    y = _log_core_f64(u, _div(d, u))
    y = _select(_isinf(x), _INF_F64, y)
    y = _select(x == -_ONE_F64, -_INF_F64, y)
    y = _select(x < -_ONE_F64, _NAN_F64, y)
    return _select(_isnan(x), x, y)


# ---------------------------------------------------------------------------------
# tanh / sigmoid
# ---------------------------------------------------------------------------------

_TANH_CLAMP_F32, _TANH_CLAMP_F64 = _F32(10.0), _F64(20.0)


@_export
def tanh_f32(x: float) -> float:
    """``tanh(x)`` in float32, max error 2.3 ulp measured (relative 1.7e-7; mean 0.13 ulp).

    Method: ``a = min(|x|, 10)`` (tanh(10) rounds to 1), ``e = expm1(2a)`` (as in
    :func:`expm1_f32`), ``tanh = copysign(e / (e + 2), x)``; exact for tiny x
    (``e = 2a``) and sign-correct for -0.0. tanh(+-inf) = +-1, NaN -> NaN.
    """
    x = np.float32(x)
    return _select(_isnan(x), x, _tanh_ieee_f32(x))


@_inline
def _tanh_ieee_f32(x):  # pragma: no cover - compiled
    x = np.float32(x)
    a = abs(x)
    a = _select(a > _TANH_CLAMP_F32, _TANH_CLAMP_F32, a)
    e = _expm1_pos_f32(a + a)
    return _copysign(_div(e, e + _TWO_F32), x)


@_export
def tanh_ieee_f32(x: float) -> float:
    """:func:`tanh_f32` for callers without the ``nnan`` fast-math flag: a NaN already
    propagates through every step (the clamps keep it, ``expm1`` and the division return
    it), so the final NaN test is left out (three vector instructions fewer)."""
    return _tanh_ieee_f32(x)


@_export
def tanh_f64(x: float) -> float:
    """``tanh(x)`` in float64, max error 2.55 ulp measured; method as :func:`tanh_f32`, clamp at
    20."""
    x = np.float64(x)
    return _select(_isnan(x), x, _tanh_ieee_f64(x))


@_inline
def _tanh_ieee_f64(x):  # pragma: no cover - compiled
    x = np.float64(x)
    a = abs(x)
    a = _select(a > _TANH_CLAMP_F64, _TANH_CLAMP_F64, a)
    e = _expm1_pos_f64(a + a)
    return _copysign(_div(e, e + _TWO_F64), x)


@_export
def tanh_ieee_f64(x: float) -> float:
    """:func:`tanh_f64` for callers without ``nnan`` (see :func:`tanh_ieee_f32`)."""
    return _tanh_ieee_f64(x)


_OPT_LO_F32, _OPT_HI_F32 = _F32(-87.0), _F32(89.0)
_OPT_LO_F64, _OPT_HI_F64 = _F64(-708.0), _F64(710.0)
_NTWO_F32, _NTWO_F64 = _F32(-2.0), _F64(-2.0)


@_inline
def _one_plus_exp_f32(t):  # pragma: no cover - compiled
    """``1 + exp(t)`` with ``t`` clamped to [-87, 89], so the exp is one normal scaling:
    below the clamp ``1 + exp`` is 1 anyway; above it exp is inf (NaN propagates)."""
    t = np.float32(t)
    t = _select(t < _OPT_LO_F32, _OPT_LO_F32, t)
    t = _select(t > _OPT_HI_F32, _OPT_HI_F32, t)
    return _ONE_F32 + _exp_normal_f32(t)


@_inline
def _one_plus_exp_f64(t):  # pragma: no cover - compiled
    """As :func:`_one_plus_exp_f32`, clamp [-708, 710]."""
    t = np.float64(t)
    t = _select(t < _OPT_LO_F64, _OPT_LO_F64, t)
    t = _select(t > _OPT_HI_F64, _OPT_HI_F64, t)
    return _ONE_F64 + _exp_normal_f64(t)


@_export
def one_plus_tanh_f32(x: float) -> float:
    """``1 + tanh(x)`` in float32, max error 2.5 ulp measured.

    Method: ``2 / (1 + exp(-2x))``. The backend uses it for ``1 + tanh(x)``: it is
    cheaper than tanh and more accurate than adding 1 to it, which cancels for negative
    x (``1 + tanh(-10)`` is 0 in float32; this gives 4.1e-9). ``-2x`` is clamped to
    [-87, 89] so exp stays a single scaling: below, ``1 + exp`` is 1 anyway; above, exp
    is inf and the result 0, which flushes results under about 1.2e-38 (x < -44.2) to
    zero. 1 + tanh(inf) = 2, 1 + tanh(-inf) = 0, NaN -> NaN.
    """
    return _div(_TWO_F32, _one_plus_exp_f32(np.float32(x) * _NTWO_F32))


@_export
def one_plus_tanh_f64(x: float) -> float:
    """``1 + tanh(x)`` in float64; method as :func:`one_plus_tanh_f32` (clamp [-708, 710])."""
    return _div(_TWO_F64, _one_plus_exp_f64(np.float64(x) * _NTWO_F64))


@_export
def div_one_plus_exp_f32(a: float, t: float) -> float:
    """``a / (1 + exp(t))`` in float32, max error 2.3 ulp measured. The backend computes
    the tanh GELU's ``0.5 * a * (1 + tanh(z))`` as this with ``t = -2z``, folding the
    -2 into z's own constants: the halving and the product with ``a`` go into the one
    division, two multiplies (and their roundings) fewer than ``0.5 * a *
    one_plus_tanh(z)``, whose error against the exact product is 2.63 ulp.

    Method: the clamped exp of :func:`one_plus_tanh_f32`, then one division. Where
    ``exp(t)`` overflows (``t > 88.4``) the result is a zero of ``a``'s sign; the exact
    value there is under ``|a| * 2**-127.4`` (about 4e-39). Special values follow the
    quotient: ``a = +-inf`` with ``t = +inf`` gives NaN, NaN in either argument gives NaN.
    """
    return _div(np.float32(a), _one_plus_exp_f32(t))


@_export
def div_one_plus_exp_f64(a: float, t: float) -> float:
    """``a / (1 + exp(t))`` in float64, max error 2.04 ulp measured; method as
    :func:`div_one_plus_exp_f32` (a zero of ``a``'s sign for ``t > 709.4``, where the
    exact value is under ``|a| * 2**-1023.4``, about 7.9e-309)."""
    return _div(np.float64(a), _one_plus_exp_f64(t))


#: sigmoid's clamp: below LO the result rounds to 0 (under half the least subnormal);
#: above HI it rounds to 1, and ``2**(m + 2)`` (see :func:`sigmoid_f32`) is still finite.
_SIG_LO_F32, _SIG_HI_F32 = _F32(-105.0), _F32(86.0)
_SIG_LO_F64, _SIG_HI_F64 = _F64(-746.0), _F64(707.0)
#: rounding constants of sigmoid's reduction: as :data:`_RND_F32` plus 2, so the rounded
#: sum holds ``m + 2`` for :func:`_scale2_rnd`
_RND2_F32, _RND2_F64 = _F32(1.5 * 2**23 + 2), _F64(1.5 * 2**52 + 2)
_FOUR_F32, _FOUR_F64 = _F32(4.0), _F64(4.0)


def _sig4h(dtype: type) -> Callable:
    """``h`` with ``4 exp(-s) = 4 - s h(s)``: Horner coefficients 4 (1, -q0, q1, -q2, ...)
    for exp's ``q`` (exact scalings and sign flips of the same fit, so ``h(s)`` is bit for
    bit the evaluation of ``4 (1 + r q(r))`` at ``r = -s``)."""
    q = _EXPQ_F32 if dtype is np.float32 else _EXPQ_F64
    coeffs = [4.0] + [4.0 * c * (-1) ** (k + 1) for k, c in enumerate(q)]
    return _horner(f"_sig4h_{np.dtype(dtype).name}", coeffs, dtype)


_sig4h_f32, _sig4h_f64 = _sig4h(np.float32), _sig4h(np.float64)

# Measured and not used: ``sigmoid(a) * tanh(b)`` as one quotient ``q e / (d (e + 2))``
# (sigmoid's ``q / d`` below, tanh's ``e / (e + 2)``; ``a`` clamped to [-105, 25] so
# neither product overflows), one division instead of two, max error 3.7 ulp against
# the exact product (4.2 for the separate calls). On the LSTM gates at [4096, 1024]
# (two Zen 4 cores, float32) it made a loop in the cache 0.95 of the time, but geode's
# kernel from memory 1.02-1.06x (its first pass, cut in chunks of two vectors, spilled
# registers) and, with one-vector chunks, 1.00x: that kernel is bound by overlapping
# its memory traffic with the arithmetic, no longer by the arithmetic. Measured again
# once ``h`` was stored from the registers (``Schedule.store_nontemporal``), fused in the
# ``h`` pass only, against three separately compiled copies of each kernel to average
# out code placement (a single pair differed by up to 4% with identical machine code):
# 0.99 of the time. Max error measured again: 3.84 ulp in float32 (the separate calls
# 3.83), 3.80 in float64 (4.45).


@_export
def sigmoid_f32(x: float) -> float:
    """``1 / (1 + exp(-x))`` in float32, max error 2.3 ulp measured (float64: 2.37), stable for
    any x, subnormal results included.

    Method: with ``m = rint(x / ln2)`` and ``r = m ln2 - x`` (the negated Cody-Waite
    reduction ``s = x - m ln2`` of :func:`exp_f32`), ``exp(-x) = 2**-m exp(r)``, so
    ``sigmoid = 2**(m+2) / (2**(m+2) + 4 exp(r))`` for every x, with no sign test: x is
    clamped to [-105, 86] (beyond, the result rounds to 0 resp. 1), ``2**(m+2)`` is exact
    (down to the least subnormal, by :func:`_scale2_rnd`), the denominator is one FMA
    ``r * h(r) + (2**(m+2) + 4)`` ending the Horner evaluation of ``4 exp(r)``, and the
    division rounds once, also into the subnormal range. Measured on Zen 4: 13.5 against
    15.7 cycles per 16-lane vector for ``(x >= 0 ? 1 : e) / (1 + e)`` with
    ``e = exp(-|x|)``, whose compare and blend compete with the FMAs.
    sigmoid(-inf) = 0, sigmoid(inf) = 1, NaN -> NaN.
    """
    x = np.float32(x)
    return _select(_isnan(x), x, _sigmoid_ieee_f32(x))


@_inline
def _sigmoid_ieee_f32(x):  # pragma: no cover - compiled
    x = np.float32(x)
    x = _select(x < _SIG_LO_F32, _SIG_LO_F32, x)
    x = _select(x > _SIG_HI_F32, _SIG_HI_F32, x)
    t, _, s = _exp_reduce_f32(x, _RND2_F32)
    q = _scale2_rnd(_ONE_F32, t)
    return _div(q, _fma(-s, _sig4h_f32(s), q + _FOUR_F32))


@_export
def sigmoid_ieee_f32(x: float) -> float:
    """:func:`sigmoid_f32` for callers without the ``nnan`` fast-math flag: a NaN already
    propagates (the clamps keep it and the denominator is NaN), so the final NaN test is
    left out (three vector instructions fewer)."""
    return _sigmoid_ieee_f32(x)


@_export
def sigmoid_f64(x: float) -> float:
    """``1 / (1 + exp(-x))`` in float64; method as :func:`sigmoid_f32` (clamp [-746, 707],
    exp's degree-12 polynomial)."""
    x = np.float64(x)
    return _select(_isnan(x), x, _sigmoid_ieee_f64(x))


@_inline
def _sigmoid_ieee_f64(x):  # pragma: no cover - compiled
    x = np.float64(x)
    x = _select(x < _SIG_LO_F64, _SIG_LO_F64, x)
    x = _select(x > _SIG_HI_F64, _SIG_HI_F64, x)
    t, _, s = _exp_reduce_f64(x, _RND2_F64)
    q = _scale2_rnd(_ONE_F64, t)
    return _div(q, _fma(-s, _sig4h_f64(s), q + _FOUR_F64))


@_export
def sigmoid_ieee_f64(x: float) -> float:
    """:func:`sigmoid_f64` for callers without ``nnan`` (see :func:`sigmoid_ieee_f32`)."""
    return _sigmoid_ieee_f64(x)


# ---------------------------------------------------------------------------------
# erf
# ---------------------------------------------------------------------------------

_ERF_SPLIT_F32, _ERFB_C_F32, _ERF_CLAMP_F32 = _F32(0.875), _F32(0.875), _F32(3.95)
_ERF_SPLIT_F64, _ERF_CLAMP_F64 = _F64(0.75), _F64(6.0)
_ERFB_C1_F64, _ERFB_C2_F64, _ERFB_C3_F64 = _F64(1.0), _F64(3.0), _F64(5.0)
_ERFB_S1_F64, _ERFB_S2_F64 = _F64(2.0), _F64(4.0)


@_export
def erf_f32(x: float) -> float:
    """``erf(x)`` in float32, max error 1.01 ulp measured.

    Method: two regions, both evaluated and one selected. ``|x| < 0.875``:
    ``erf = x + x P(x**2)``, ``P`` of degree 5 (fit of erf(x)/x - 1, error 9e-9).
    ``|x| >= 0.875``: ``erf = copysign(1 - exp(Q(|x| - 0.875)), x)`` where ``Q`` (degree 8, fit
    error 2.1e-8) approximates ``log(erfc(z))`` on [0.875, 3.95]; |x| is clamped to 3.95, where
    ``1 - erfc`` rounds to 1. erf(+-inf) = +-1, NaN -> NaN.
    """
    x = np.float32(x)
    a = abs(x)
    small = _fma(x, _erfa_f32(x * x), x)
    z = _select(a > _ERF_CLAMP_F32, _ERF_CLAMP_F32, a)
    big = _copysign(_ONE_F32 - _exp_normal_f32(_erfb_f32(z - _ERFB_C_F32)), x)
    return _select(_isnan(x), x, _select(a < _ERF_SPLIT_F32, small, big))


@_export
def erf_f64(x: float) -> float:
    """``erf(x)`` in float64, max error 0.95 ulp measured (against mpmath).

    Method as :func:`erf_f32` with more pieces: ``|x| < 0.75``: ``x + x P(x**2)``, ``P`` of
    degree 10 (fit error 8e-19); ``|x| >= 0.75``: ``1 - exp(Q(z - c))`` with ``Q``
    approximating ``log(erfc(z))`` by three degree-15 polynomials on [0.75, 2), [2, 4),
    [4, 6] (centres c = 1, 3, 5; fit errors <= 5e-17), whose coefficients are chosen per
    element with selects, so only one polynomial is evaluated; |x| is clamped to 6.
    """
    x = np.float64(x)
    a = abs(x)
    small = _fma(x, _erfa_f64(x * x), x)
    z = _select(a > _ERF_CLAMP_F64, _ERF_CLAMP_F64, a)
    in0 = z < _ERFB_S1_F64
    in1 = z < _ERFB_S2_F64
    c = _select(in0, _ERFB_C1_F64, _select(in1, _ERFB_C2_F64, _ERFB_C3_F64))
    big = _copysign(_ONE_F64 - _exp_normal_f64(_erfb_f64(z - c, in0, in1)), x)
    return _select(_isnan(x), x, _select(a < _ERF_SPLIT_F64, small, big))


# ---------------------------------------------------------------------------------
# sin / cos
# ---------------------------------------------------------------------------------

#: 2/pi to 1280 bits (hex digits after the binary point).
_TWO_OVER_PI_HEX = (
    "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561"
    "b7246e3a424dd2e006492eea09d1921cfe1deb1cb129a73ee88235f52ebb4484"
    "e99c7026b45f7e413991d639835339f49c845f8bbdf9283b1ff897ffde05980f"
    "ef2f118b5a0a6d1f6d367ecf27cb09b74f463f669e5fea2d7527bac7ebe5f17b"
    "3d0739f78a5292ea6bfb5fb11f8d5d0856033046fc7b6babf0cfbc209af4361d"
)


def _payne_hanek_table(
    mant: int, bias: int, chunk_bits: Sequence[int], scale_row: int = 1 << 30, scale_exp: int = 0
) -> np.ndarray:
    """For each biased exponent ``eb`` of the input, the bits of 2/pi that matter for
    ``x * 2/pi mod 4``, split into float64 pieces: shape ``(pieces, 2*bias + 2)``.

    ``x = M * 2**q`` with integer ``M < 2**(mant+1)`` and ``q = max(eb, 1) - bias - mant``.
    Bits of 2/pi of weight ``>= 2**(2-q)`` only add multiples of 4 to ``x * 2/pi``; the rest
    ``L`` is cut into pieces of ``chunk_bits`` significant bits plus a last 53-bit piece, so
    that ``M * piece`` is exact for the leading pieces. Rows ``>= scale_row`` are multiplied by
    ``2**scale_exp`` (the caller scales x by ``2**-scale_exp``) to keep the pieces normal.
    """
    nbits = len(_TWO_OVER_PI_HEX) * 4
    g = int(_TWO_OVER_PI_HEX, 16)  # 2/pi = g * 2**-nbits
    rows = 2 * bias + 2
    table = np.zeros((len(chunk_bits) + 1, rows))
    for eb in range(rows):
        q = max(eb, 1) - bias - mant
        rest = g % (1 << (nbits + 2 - q)) if 2 - q < 0 else g
        for j, cb in enumerate((*chunk_bits, 53)):  # the last piece: 53 bits, truncated
            sh = max(rest.bit_length() - cb, 0)
            table[j, eb] = math.ldexp(
                rest >> sh, sh - nbits + (scale_exp if eb >= scale_row else 0)
            )
            rest -= (rest >> sh) << sh
    return table


_PH_F32 = _payne_hanek_table(23, 127, (29, 29))
_PH1_F32, _PH2_F32, _PH3_F32 = (np.ascontiguousarray(t) for t in _PH_F32)
_sinp_f32d = _horner("_sinp_f32d", _SIN_F32, np.float64)
_cosp_f32d = _horner("_cosp_f32d", _COS_F32, np.float64)
_PIO2_F64 = _F64(1.5707963267948966)
_QUARTER_F64, _FOUR_F64, _NHALF_F64 = _F64(0.25), _F64(4.0), _F64(-0.5)


@_inline
def _sincos_f32(x, shift):  # pragma: no cover - compiled
    """sin(x + shift * pi/2) for float32 x, computed in float64 (NaN/inf/-0 not handled)."""
    d = np.float64(x)
    i = _exponent_field(x)
    p1 = d * _PH1_F32[i]
    y1 = _fma(_rint(p1 * _QUARTER_F64), -_FOUR_F64, p1)  # p1 mod 4, exact
    y2 = d * _PH2_F32[i]
    n = _rint(y1 + y2)
    f = _add(_add(_sub(y1, n), y2), d * _PH3_F32[i])  # x * 2/pi - n, |f| <= 1/2
    r = f * _PIO2_F64
    w = r * r
    s = _fma(r * w, _sinp_f32d(w), r)
    c = _fma(w * w, _cosp_f32d(w), _fma(w, _NHALF_F64, _ONE_F64))
    n = n + shift
    n4 = _fma(_floor(n * _QUARTER_F64), -_FOUR_F64, n)  # n mod 4 in {0, 1, 2, 3}
    v = _select(_fma(_floor(n4 * _HALF_F64), -_TWO_F64, n4) != _ZERO_F64, c, s)
    return np.float32(_select(n4 >= _TWO_F64, -v, v))


@_export
def sin_f32(x: float) -> float:
    """``sin(x)`` in float32 over the whole float32 range, max error 0.66 ulp measured.

    Method: exact Payne-Hanek style reduction in float64: with ``x = M * 2**q`` only the bits of
    2/pi of weight ``< 2**(2-q)`` matter; a 256-row table (indexed by the exponent field, a
    vector gather) holds them in three pieces, the first two of 29 bits so ``x * piece`` is
    exact in float64; ``y = x * 2/pi mod 4`` is summed exactly enough that
    ``r = (y - n) * pi/2`` (``n = rint(y)``) has float64 accuracy even for x near multiples of
    pi/2. Then ``sin(r) = r + r**3 S(r**2)``, ``cos(r) = 1 - r**2/2 + r**4 C(r**2)`` (S, C of
    degree 2, fit errors 2e-8 / 2e-9) in float64 and the quadrant ``n mod 4`` picks
    +-sin or +-cos with selects. sin(+-inf) = NaN, NaN -> NaN, sin(-0) = -0.
    """
    x = np.float32(x)
    v = _sincos_f32(x, _ZERO_F64)
    v = _select(x == _ZERO_F32, x, v)
    return _select(_isfinite(x), v, _NAN_F32)


@_export
def cos_f32(x: float) -> float:
    """``cos(x)`` in float32 over the whole float32 range, max error 0.66 ulp measured; method as
    :func:`sin_f32` (``cos(x) = sin(x + pi/2)`` by shifting the quadrant). cos(+-inf) = NaN."""
    x = np.float32(x)
    v = _sincos_f32(x, _ONE_F64)
    return _select(_isfinite(x), v, _NAN_F32)


_PH_F64 = _payne_hanek_table(52, 1023, (53, 53), scale_row=1023 + 512, scale_exp=512)
_PH_BIG_F64, _PH_SCALE_F64 = _F64(2.0**512), _F64(2.0**-512)
_PH1_F64, _PH2_F64, _PH3_F64 = (np.ascontiguousarray(t) for t in _PH_F64)
_PIO2HI_F64, _PIO2LO_F64 = _F64(1.5707963267948966), _F64(6.123233995736766e-17)
_SIN_TINY_F64 = _F64(2.0**-27)


@_inline
def _two_sum(a, b):  # pragma: no cover - compiled
    """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth)."""
    s = _add(a, b)
    bb = _sub(s, a)
    return s, _add(_sub(a, _sub(s, bb)), _sub(b, bb))


@_inline
def _sincos_f64(x, shift):  # pragma: no cover - compiled
    """sin(x + shift * pi/2) for float64 x (NaN/inf/tiny x not handled)."""
    i = _exponent_field(x)
    x = x * _select(abs(x) >= _PH_BIG_F64, _PH_SCALE_F64, _ONE_F64)  # table rows are scaled
    u1 = _PH1_F64[i]
    u2 = _PH2_F64[i]
    p1 = _mul(x, u1)
    e1 = _fma_exact(x, u1, -p1)  # x*u1 = p1 + e1 exactly
    m1 = _fma(_rint(p1 * _QUARTER_F64), -_FOUR_F64, p1)  # p1 mod 4, exact
    p2 = _mul(x, u2)
    e2 = _fma_exact(x, u2, -p2)
    s, es = _two_sum(m1, e1)
    t, et = _two_sum(s, p2)
    n = _rint(t)
    hi, lo = _two_sum(_sub(t, n), ((es + et) + e2) + x * _PH3_F64[i])  # x*2/pi - n
    rh = _mul(hi, _PIO2HI_F64)  # r = (hi + lo) * pi/2 as a double-double rh + rl
    rl = _fma(hi, _PIO2LO_F64, _fma(lo, _PIO2HI_F64, _fma_exact(hi, _PIO2HI_F64, -rh)))
    r = _add(rh, rl)
    rl = _sub(rl, _sub(r, rh))
    w = r * r
    hz = _HALF_F64 * w
    sn = r + _fma(r * w, _sinp_f64(w), rl * (_ONE_F64 - hz))
    v = _ONE_F64 - hz
    cs = _add(v, _add(_sub(_sub(_ONE_F64, v), hz), _fma(w * w, _cosp_f64(w), -(r * rl))))
    n = n + shift
    n4 = _fma(_floor(n * _QUARTER_F64), -_FOUR_F64, n)
    y = _select(_fma(_floor(n4 * _HALF_F64), -_TWO_F64, n4) != _ZERO_F64, cs, sn)
    return _select(n4 >= _TWO_F64, -y, y)


@_export
def sin_f64(x: float) -> float:
    """``sin(x)`` in float64 over the whole float64 range, max error 0.80 ulp measured.

    Method as :func:`sin_f32`, in double-double where needed: a 2048-row table of 2/pi bits
    (three 53-bit pieces per input exponent, gathered; rows for |x| >= 2**512 are scaled by
    2**512 and x by 2**-512 so no piece is subnormal), exact products via ``llvm.fma``
    (two-product), ``x * 2/pi mod 4`` accumulated with two-sums, ``r = (y - n) * pi/2`` as a
    double-double ``rh + rl``; ``sin(r) = r + r**3 S(r**2) + rl cos(r)``, ``S`` of degree 5
    (fit error 2e-17), ``cos(r)`` with ``C`` of degree 5 (fit error 1.3e-18). The reduction
    error is below 2**-100 absolute, so results are within ~1 ulp except for inputs within
    ~2**-47 of a large multiple of pi/2. |x| < 2**-27 returns x. sin(+-inf) = NaN.
    """
    x = np.float64(x)
    v = _sincos_f64(x, _ZERO_F64)
    v = _select(abs(x) < _SIN_TINY_F64, x, v)
    return _select(_isfinite(x), v, _NAN_F64)


@_export
def cos_f64(x: float) -> float:
    """``cos(x)`` in float64 over the whole range, max error 0.81 ulp measured; method as
    :func:`sin_f64` (quadrant shifted by one). cos(+-inf) = NaN."""
    x = np.float64(x)
    v = _sincos_f64(x, _ONE_F64)
    v = _select(abs(x) < _SIN_TINY_F64, _ONE_F64, v)
    return _select(_isfinite(x), v, _NAN_F64)


#: ``(op, dtype name) -> function`` for the code generator; op names as in
#: :data:`geode.codegen.ast.UN_OPS` plus ``expm1``, ``log1p`` and ``sigmoid``.
VMATH: dict[tuple[str, str], Callable] = {
    ("exp", "float32"): exp_f32,
    ("exp", "float64"): exp_f64,
    ("expm1", "float32"): expm1_f32,
    ("expm1", "float64"): expm1_f64,
    ("log", "float32"): log_f32,
    ("log", "float64"): log_f64,
    ("log1p", "float32"): log1p_f32,
    ("log1p", "float64"): log1p_f64,
    ("tanh", "float32"): tanh_f32,
    ("tanh", "float64"): tanh_f64,
    ("one_plus_tanh", "float32"): one_plus_tanh_f32,
    ("one_plus_tanh", "float64"): one_plus_tanh_f64,
    ("sigmoid", "float32"): sigmoid_f32,
    ("sigmoid", "float64"): sigmoid_f64,
    ("erf", "float32"): erf_f32,
    ("erf", "float64"): erf_f64,
    ("sin", "float32"): sin_f32,
    ("sin", "float64"): sin_f64,
    ("cos", "float32"): cos_f32,
    ("cos", "float64"): cos_f64,
}

#: Two-argument functions the code generator matches whole expressions to: ``(name, dtype
#: name) -> function``; ``div_one_plus_exp(a, t)`` is ``a / (1 + exp(t))`` (the tanh
#: GELU's ``0.5 * a * (1 + tanh(z))`` with ``t = -2z``).
VMATH2: dict[tuple[str, str], Callable] = {
    ("div_one_plus_exp", "float32"): div_one_plus_exp_f32,
    ("div_one_plus_exp", "float64"): div_one_plus_exp_f64,
}

#: Variants for kernels compiled without the ``nnan`` fast-math flag (geode's default):
#: NaN propagates through their arithmetic, so they skip the final NaN test; same
#: results as the :data:`VMATH` entry in such a kernel (tested).
VMATH_IEEE: dict[tuple[str, str], Callable] = {
    ("tanh", "float32"): tanh_ieee_f32,
    ("tanh", "float64"): tanh_ieee_f64,
    ("sigmoid", "float32"): sigmoid_ieee_f32,
    ("sigmoid", "float64"): sigmoid_ieee_f64,
}
