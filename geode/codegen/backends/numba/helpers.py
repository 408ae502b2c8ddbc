"""The numba backend's runtime helpers: the fast-math flag sets, and the numba
intrinsics and ``njit`` helpers generated kernels call (``_g_*``: float16 conversion,
integer division and shifts with numpy's results, NaN-propagating and guarded min/max,
prefetch, streams and non-temporal stores, fences), plus the fingerprint of the code
compiled into every cached kernel.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np
from llvmlite import ir as llir
from numba import types as nbt
from numba.extending import intrinsic

# the generated kernels import the ``_g_*`` names (a prefix reserved for them, so no
# generated variable shadows one): public to the backend despite the underscore
__all__ = [
    "DEFAULT_FLAGS",
    "FASTMATH_FLAGS",
    "MAX_REGISTER_UNROLL",
    "MAX_UNROLL",
    "PREFETCH_HELPERS",
    "SLP_VECTORIZE",
    "backend_fingerprint",
    "_g_f2h",
    "_g_fdiv",
    "_g_fmax",
    "_g_fmin",
    "_g_fmodi",
    "_g_freeze",
    "_g_fsign",
    "_g_h2f",
    "_g_ipow",
    "_g_isign",
    "_g_maximum",
    "_g_maxnum_nn",
    "_g_minimum",
    "_g_minnum_nn",
    "_g_mod",
    "_g_nanguard",
    "_g_ntstore",
    "_g_prefetch",
    "_g_prefetch_l2",
    "_g_rh",
    "_g_sfence",
    "_g_shl",
    "_g_shr",
    "_g_stream",
    "_g_stream_divided",
    "_g_stream_scaled",
    "_g_tdiv",
    "_g_udiv",
    "_g_umod",
    "_g_upow",
    "_g_ushl",
    "_g_ushr",
    "_g_vector_start",
]

#: LLVM fast-math flags used when ``fastmath=True`` (see ``config.ACCURACY_POLICY``).
FASTMATH_FLAGS: frozenset[str] = frozenset(
    ["nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc"]
)

#: LLVM fast-math flags used by default (``fastmath=False``): reassociation and FMA
#: contraction only, so reductions vectorize while NaN/Inf keep IEEE semantics (see
#: ``config.ACCURACY_POLICY``). No ``arcp``: numba sets the flags per function, and a
#: division ``x / d`` by a multiply with ``1 / d`` overflows for a subnormal ``d``.
DEFAULT_FLAGS: frozenset[str] = frozenset(["contract", "reassoc"])

#: Largest constant extent of an ``unrolled`` loop that is expanded into straight code.

MAX_UNROLL = 256
#: Largest constant extent of a loop unrolled to keep a register buffer in scalars.
MAX_REGISTER_UNROLL = 64
#: Compile geode kernels with LLVM's SLP vectorizer (numba's default is off).
SLP_VECTORIZE = True

# ---------------------------------------------------------------------------------
# runtime helpers the generated modules import (``_g_`` names are reserved)
# ---------------------------------------------------------------------------------


@intrinsic
def _g_h2f(typingctx: Any, bits: Any) -> Any:
    """float16 bits (uint16) -> float32 value."""
    if bits != nbt.uint16:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], llir.HalfType()), llir.FloatType())

    return nbt.float32(nbt.uint16), codegen


def _to_half(builder: Any, x: Any) -> Any:
    """IR rounding a float or double ``x`` to half, to nearest even. A double goes through
    float rounded to odd (truncate, then set the last bit if anything was dropped): with
    13 more bits than half, that float rounds to the same half as the double, and
    float -> half is one ``vcvtps2ph``, where a direct double -> half truncation is a call
    to compiler-rt's ``__truncdfhf2`` that the JIT may not find."""
    if x.type == llir.DoubleType():
        f32, i32 = llir.FloatType(), llir.IntType(32)
        near = builder.fptrunc(x, f32)
        back = builder.fpext(near, llir.DoubleType())
        exact = builder.fcmp_ordered("==", back, x)
        fabs = _fabs_f64(builder)
        over = builder.fcmp_ordered(">", builder.call(fabs, [back]), builder.call(fabs, [x]))
        bits = builder.bitcast(near, i32)
        toward_zero = builder.select(over, builder.sub(bits, llir.Constant(i32, 1)), bits)
        odd = builder.or_(toward_zero, llir.Constant(i32, 1))
        x = builder.select(exact, near, builder.bitcast(odd, f32))
    return builder.fptrunc(x, llir.HalfType())


def _fabs_f64(builder: Any) -> Any:
    """``llvm.fabs.f64``."""
    from numba.core import cgutils

    d = llir.DoubleType()
    return cgutils.get_or_insert_function(
        builder.module, llir.FunctionType(d, [d]), "llvm.fabs.f64"
    )


@intrinsic
def _g_f2h(typingctx: Any, x: Any) -> Any:
    """float32/float64 value -> float16 bits (uint16), rounding to nearest even."""
    if x not in (nbt.float32, nbt.float64):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(_to_half(builder, args[0]), llir.IntType(16))

    return nbt.uint16(x), codegen


@intrinsic
def _g_rh(typingctx: Any, x: Any) -> Any:
    """Round a float32/float64 value to float16 precision, as a float32."""
    if x not in (nbt.float32, nbt.float64):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(_to_half(builder, args[0]), llir.FloatType())

    return nbt.float32(x), codegen


_helper = numba.njit(nogil=True, cache=False, error_model="numpy")


@_helper
def _g_tdiv(a: int, b: int) -> int:  # int64: division truncating toward zero
    if b == 0:
        return np.int64(0)
    if b == -1:
        return np.int64(0) - a
    q = a // b
    if q * b != a and (a < 0) != (b < 0):
        q += 1
    return q


@_helper
def _g_fdiv(a: int, b: int) -> int:  # int64: floor division
    if b == 0:
        return np.int64(0)
    if b == -1:
        return np.int64(0) - a
    return a // b


@_helper
def _g_mod(a: int, b: int) -> int:  # int64: remainder with the divisor's sign
    if b == 0 or b == -1:
        return np.int64(0)
    return a % b


@_helper
def _g_fmodi(a: int, b: int) -> int:  # int64: remainder with the dividend's sign
    if b == 0 or b == -1:
        return np.int64(0)
    r = a % b
    if r != 0 and (r < 0) != (a < 0):
        r -= b
    return r


@_helper
def _g_udiv(a: int, b: int) -> int:  # uint64: division (trunc == floor)
    if b == np.uint64(0):
        return np.uint64(0)
    return a // b


@_helper
def _g_umod(a: int, b: int) -> int:  # uint64: remainder
    if b == np.uint64(0):
        return np.uint64(0)
    return a % b


@_helper
def _g_ipow(a: int, b: int) -> int:  # int64 power by squaring; negative exponents
    if b < 0:
        if a == 1:
            return np.int64(1)
        if a == -1:
            return np.int64(1) if b % 2 == 0 else np.int64(-1)
        return np.int64(0)
    r = np.int64(1)
    while b > 0:
        if b & 1:
            r = r * a
        a = a * a
        b >>= 1
    return r


@_helper
def _g_upow(a: int, b: int) -> int:  # uint64 power by squaring
    r = np.uint64(1)
    while b > np.uint64(0):
        if b & np.uint64(1):
            r = r * a
        a = a * a
        b >>= np.uint64(1)
    return r


@_helper
def _g_shl(a: int, b: int, nbits: int) -> int:  # int64 a << b; 0 past the width
    if b < 0 or b >= nbits:
        return np.int64(0)
    return a << b


@_helper
def _g_shr(a: int, b: int, nbits: int) -> int:  # int64 arithmetic a >> b
    if b < 0 or b >= nbits:
        return np.int64(-1) if a < 0 else np.int64(0)
    return a >> b


@_helper
def _g_ushl(a: int, b: int, nbits: int) -> int:  # uint64 a << b
    if b >= np.uint64(nbits):
        return np.uint64(0)
    return a << b


@_helper
def _g_ushr(a: int, b: int, nbits: int) -> int:  # uint64 logical a >> b
    if b >= np.uint64(nbits):
        return np.uint64(0)
    return a >> b


def _float_minmax(which: str, flags: tuple[str, ...] = ()) -> Any:
    """An intrinsic calling LLVM's float ``llvm.<which>`` (two float32/float64 operands) with
    the instruction fast-math ``flags``."""

    def typer(typingctx: Any, a: Any, b: Any) -> Any:
        if a != b or a not in (nbt.float32, nbt.float64):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            from numba.core import cgutils

            ty = args[0].type
            suffix = "f32" if ty == llir.FloatType() else "f64"
            fn = cgutils.get_or_insert_function(
                builder.module, llir.FunctionType(ty, [ty, ty]), f"llvm.{which}.{suffix}"
            )
            return builder.call(fn, list(args), fastmath=flags)

        return a(a, b), codegen

    typer.__name__ = f"_g_{which}" + ("_nn" if flags else "")
    return intrinsic(typer)


#: ``llvm.maximum``/``llvm.minimum``: NaN-propagating like np.maximum/np.minimum; unlike a
#: compare-and-select, LLVM vectorizes reductions of them.
_g_maximum = _float_minmax("maximum")
_g_minimum = _float_minmax("minimum")
#: ``llvm.maxnum``/``llvm.minnum`` with ``nnan nsz``: the plain ``vmaxps``/``vminps`` that
#: LLVM vectorizes into a reduction with several accumulators (``llvm.maximum`` needs a
#: compare and a blend per vector and runs at a third of the speed). A NaN operand gives an
#: unspecified result, so a reduction using them tracks NaNs on the side with
#: :func:`_g_nanguard` (see ``_Emitter.find_guarded``).
_g_maxnum_nn = _float_minmax("maxnum", ("nnan", "nsz"))
_g_minnum_nn = _float_minmax("minnum", ("nnan", "nsz"))


def _emit_prefetch(builder: Any, ptr: Any, write: bool, locality: int) -> None:
    """Call ``llvm.prefetch`` (data cache) on ``ptr`` for reading or writing."""
    from numba.core import cgutils

    i8p, i32 = llir.IntType(8).as_pointer(), llir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, llir.FunctionType(llir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
    )
    flags = [llir.Constant(i32, v) for v in (int(write), locality, 1)]
    builder.call(fn, [builder.bitcast(ptr, i8p), *flags])


def _prefetch_to(locality: int) -> Any:
    """An intrinsic ``(array, offset)``: ``llvm.prefetch`` (read, data cache) of element
    ``offset`` of a C-contiguous array's flat data with LLVM's ``locality`` (3: every
    cache level, ``prefetcht0`` on x86; 2: the L2 and beyond, ``prefetcht1``); a hint
    that never faults, so no bounds check."""

    def typer(typingctx: Any, arr: Any, offset: Any) -> Any:
        if not isinstance(arr, nbt.Array) or not isinstance(offset, nbt.Integer):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            a = context.make_array(signature.args[0])(context, builder, value=args[0])
            _emit_prefetch(builder, builder.gep(a.data, [args[1]]), False, locality)
            return context.get_dummy_value()

        return nbt.void(arr, nbt.int64), codegen

    typer.__name__ = f"_g_prefetch_{locality}"
    return intrinsic(typer)


#: ``Prefetch`` helpers by the statement's cache level
_g_prefetch = _prefetch_to(3)
_g_prefetch_l2 = _prefetch_to(2)
PREFETCH_HELPERS = {1: "_g_prefetch", 2: "_g_prefetch_l2"}


def _stream_codegen(scaled: bool, divide: bool = False) -> Callable[..., Any]:
    """The LLVM codegen of :func:`_g_stream` (``scaled``: :func:`_g_stream_scaled`, whose
    seventh argument multiplies every element on its way, or with ``divide``
    :func:`_g_stream_divided`, whose seventh argument divides it)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        from numba.core import cgutils

        from geode.codegen.backends.target import stream_vector_bytes

        i64 = llir.IntType(64)
        d = context.make_array(signature.args[0])(context, builder, value=args[0])
        s = context.make_array(signature.args[2])(context, builder, value=args[2])
        ety = context.get_data_type(signature.args[0].dtype)
        esz = context.get_abi_sizeof(ety)
        dptr = builder.gep(d.data, [args[1]])
        sptr = builder.gep(s.data, [args[3]])
        count = args[4]
        vbytes = stream_vector_bytes()
        lanes = max(1, vbytes // esz)
        vty = llir.VectorType(ety, lanes)
        factor = args[6] if scaled else None
        vfactor = None
        if factor is not None:
            one = builder.insert_element(llir.Constant(vty, None), factor, llir.Constant(i64, 0))
            vfactor = builder.shuffle_vector(
                one, one, llir.Constant(llir.VectorType(llir.IntType(32), lanes), [0] * lanes)
            )

        def c64(v: int) -> Any:
            return llir.Constant(i64, v)

        def copy_range(lo: Any, hi: Any) -> None:
            with cgutils.for_range_slice(builder, lo, hi, c64(1)) as (i, _):
                v = builder.load(builder.gep(sptr, [i]))
                if factor is not None:
                    v = builder.fdiv(v, factor) if divide else builder.fmul(v, factor)
                builder.store(v, builder.gep(dptr, [i]))

        def copy_vectors(head: Any, nvec: Any, nontemporal: Any) -> None:
            with cgutils.for_range(builder, nvec) as loop:
                off = builder.add(head, builder.mul(loop.index, c64(lanes)))
                v = builder.load(builder.bitcast(builder.gep(sptr, [off]), vty.as_pointer()))
                v.align = esz
                if vfactor is not None:
                    v = builder.fdiv(v, vfactor) if divide else builder.fmul(v, vfactor)
                st = builder.store(v, builder.bitcast(builder.gep(dptr, [off]), vty.as_pointer()))
                if nontemporal is None:
                    st.align = esz
                else:
                    st.align = vbytes
                    st.set_metadata("nontemporal", nontemporal)

        nt_flag = builder.icmp_unsigned("!=", args[5], llir.Constant(args[5].type, 0))
        with builder.if_else(nt_flag) as (stream, plain):
            with stream:
                # elements before the first vector-aligned address (all of them when the
                # address is not even element-aligned)
                mis = builder.urem(builder.ptrtoint(dptr, i64), c64(vbytes))
                gap = builder.urem(builder.sub(c64(vbytes), mis), c64(vbytes))
                whole = builder.icmp_unsigned("==", builder.urem(gap, c64(esz)), c64(0))
                head = builder.select(whole, builder.udiv(gap, c64(esz)), count)
                head = builder.select(builder.icmp_signed("<", head, count), head, count)
                copy_range(c64(0), head)
                nvec = builder.sdiv(builder.sub(count, head), c64(lanes))
                nontemporal = builder.module.add_metadata([llir.Constant(llir.IntType(32), 1)])
                copy_vectors(head, nvec, nontemporal)
                copy_range(builder.add(head, builder.mul(nvec, c64(lanes))), count)
            with plain:
                if factor is None:
                    cgutils.raw_memcpy(builder, dptr, sptr, count, esz)
                else:
                    nvec = builder.sdiv(count, c64(lanes))
                    copy_vectors(c64(0), nvec, None)
                    copy_range(builder.mul(nvec, c64(lanes)), count)
                # fetch the next chunk's lines for writing while this one's are copied
                nbytes = builder.mul(count, c64(esz))
                base = builder.gep(builder.bitcast(dptr, llir.IntType(8).as_pointer()), [nbytes])
                lines = builder.udiv(builder.add(nbytes, c64(63)), c64(64))
                with cgutils.for_range(builder, lines) as loop:
                    at = builder.gep(base, [builder.mul(loop.index, c64(64))])
                    _emit_prefetch(builder, at, True, 3)
        return context.get_dummy_value()

    return codegen


def _stream_types_ok(dst: Any, doff: Any, src: Any, soff: Any, n: Any, nt: Any) -> bool:
    return (
        isinstance(dst, nbt.Array)
        and isinstance(src, nbt.Array)
        and dst.dtype == src.dtype
        and all(isinstance(x, nbt.Integer) for x in (doff, soff, n))
        and isinstance(nt, nbt.Boolean)
    )


@intrinsic
def _g_stream(typingctx: Any, dst: Any, doff: Any, src: Any, soff: Any, n: Any, nt: Any) -> Any:
    """Copy ``n`` elements from flat offset ``soff`` of C-contiguous array ``src`` to flat
    offset ``doff`` of ``dst`` (same dtype). With ``nt``: scalar stores up to the first
    address aligned to the target's vector size, whole vectors with non-temporal aligned
    stores (``vmovntps``: no read-for-ownership, the lines bypass the caches), scalar
    stores for the tail; otherwise ``llvm.memcpy`` and a write prefetch of the next ``n``
    elements' lines (the next chunk: its stores then find their lines fetched instead of
    stalling the next chunk's arithmetic; measured at [256, 4096] float32, outputs not in
    the cache: exp, ``x * 2 + 1`` and RMSNorm from 1.35-1.6x to 1.14-1.22x the time of
    direct stores, and with the outputs in the cache ``x * 2 + 1`` and RMSNorm from
    1.16-1.3x to 1.02-1.16x (the interleaved exp 0.77x either way); a
    prefetch never faults, so the one past the end is harmless). No bounds check (the
    schedule guarantees the ranges)."""
    if not _stream_types_ok(dst, doff, src, soff, n, nt):
        return None
    return nbt.void(dst, doff, src, soff, n, nt), _stream_codegen(False)


@intrinsic
def _g_stream_scaled(
    typingctx: Any, dst: Any, doff: Any, src: Any, soff: Any, n: Any, nt: Any, factor: Any
) -> Any:
    """:func:`_g_stream` of ``src[i] * factor`` (``factor`` a scalar of the arrays' float
    dtype): the backend's form of a streamed output whose staged value is a unit-stride
    load times (or over) a value fixed for the chunk, such as softmax's ``e / sum``. The
    products go straight from registers to the stores, so the stage buffer's store and
    load per element are saved (softmax [4096, 4096] float32: 0.87 of the time).
    Without ``nt`` the products are stored with whole-vector ordinary stores, then the
    next chunk's lines are prefetched for writing as in :func:`_g_stream`."""
    if not (
        _stream_types_ok(dst, doff, src, soff, n, nt)
        and isinstance(dst.dtype, nbt.Float)
        and factor == dst.dtype
    ):
        return None
    return nbt.void(dst, doff, src, soff, n, nt, factor), _stream_codegen(True)


@intrinsic
def _g_stream_divided(
    typingctx: Any, dst: Any, doff: Any, src: Any, soff: Any, n: Any, nt: Any, divisor: Any
) -> Any:
    """:func:`_g_stream_scaled` of ``src[i] / divisor``, an IEEE division per element: the
    form of a staged ``buf[...] / s`` (softmax's ``e / sum``), whose ``s`` may be subnormal
    (its reciprocal would overflow to inf)."""
    if not (
        _stream_types_ok(dst, doff, src, soff, n, nt)
        and isinstance(dst.dtype, nbt.Float)
        and divisor == dst.dtype
    ):
        return None
    return nbt.void(dst, doff, src, soff, n, nt, divisor), _stream_codegen(True, divide=True)


@intrinsic
def _g_sfence(typingctx: Any) -> Any:
    """Order this thread's earlier non-temporal stores before its later stores
    (``sfence`` on x86, a sequentially consistent fence elsewhere)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        from numba.core import cgutils

        from geode.codegen.backends.target import is_x86

        if is_x86():
            fn = cgutils.get_or_insert_function(
                builder.module, llir.FunctionType(llir.VoidType(), []), "llvm.x86.sse.sfence"
            )
            builder.call(fn, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return nbt.void(), codegen


def _nt_array(arr: Any, off: Any) -> bool:
    """Whether :func:`_g_ntstore` / :func:`_g_vector_start` accept ``(arr, off)``."""
    return (
        isinstance(arr, nbt.Array)
        and arr.layout == "C"
        and arr.dtype in (nbt.float32, nbt.float64)
        and isinstance(off, nbt.Integer)
    )


@intrinsic
def _g_ntstore(typingctx: Any, arr: Any, off: Any, val: Any) -> Any:
    """Store ``val`` at flat offset ``off`` of C-contiguous float array ``arr`` with a
    non-temporal store that claims the alignment of a whole streaming vector
    (:func:`~geode.codegen.backends.target.stream_vector_bytes`).

    Only for the stores of a chunked kernel's streaming body
    (``_Emitter.plan_nontemporal``), whose vectorized loops' runs start on a vector
    boundary. LLVM's loop vectorizer turns a non-temporal store into vector ones only
    when its alignment covers the vector (the alignment is copied to each vector store,
    and ``vmovntps`` needs it), so the claim is what makes ``vmovntps`` of whole vectors.
    Each vector of the run then starts on a multiple of its own size from the run's
    aligned start, which is the alignment the instruction needs. A scalar left over is
    stored with a scalar instruction (ordinary, or a scalar or integer streaming one),
    none of which faults when misaligned."""
    if not (_nt_array(arr, off) and val == arr.dtype):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        from geode.codegen.backends.target import stream_vector_bytes

        a = context.make_array(signature.args[0])(context, builder, value=args[0])
        st = builder.store(args[2], builder.gep(a.data, [args[1]]))
        st.align = stream_vector_bytes()
        st.set_metadata(
            "nontemporal", builder.module.add_metadata([llir.Constant(llir.IntType(32), 1)])
        )
        return context.get_dummy_value()

    return nbt.void(arr, off, val), codegen


@intrinsic
def _g_vector_start(typingctx: Any, arr: Any, off: Any) -> Any:
    """Whether element ``off`` of C-contiguous float array ``arr`` starts a streaming
    vector in memory: its address is a multiple of
    :func:`~geode.codegen.backends.target.stream_vector_bytes`."""
    if not _nt_array(arr, off):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        from geode.codegen.backends.target import stream_vector_bytes

        i64 = llir.IntType(64)
        a = context.make_array(signature.args[0])(context, builder, value=args[0])
        addr = builder.ptrtoint(builder.gep(a.data, [args[1]]), i64)
        mis = builder.and_(addr, llir.Constant(i64, stream_vector_bytes() - 1))
        return builder.icmp_unsigned("==", mis, llir.Constant(i64, 0))

    return nbt.boolean(arr, off), codegen


@intrinsic
def _g_freeze(typingctx: Any, x: Any) -> Any:
    """``x`` as an opaque value: a NaN-ignoring max/min (``nnan``) of a row holding NaN is
    poison, which this turns into some fixed value that a NaN-insensitive reduction may
    use (see :mod:`geode.codegen.nan_flow`). On x86 an empty inline asm does it (LLVM's
    ``freeze`` would be pushed back into the loop by instcombine, stripping ``nnan`` from
    the max and with it the fast ``vmaxps`` reduction); elsewhere ``freeze``."""
    if not isinstance(x, nbt.Float):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        from geode.codegen.backends.target import is_x86

        ty = args[0].type
        if is_x86():
            return builder.asm(llir.FunctionType(ty, [ty]), "", "=x,0", [args[0]], False)
        ins = llir.Instruction(builder.block, ty, "freeze", [args[0]])
        builder._insert(ins)
        return ins

    return x(x), codegen


@intrinsic
def _g_nanguard(typingctx: Any, g: Any, x: Any) -> Any:
    """``max(g, bits(x) & ~sign)``: an integer max reduction (one ``vpand`` and one
    ``vpmaxud`` per vector) whose result exceeds the bits of +inf iff some ``x`` is NaN."""
    ity = {nbt.float32: nbt.int32, nbt.float64: nbt.int64}.get(x)
    if ity is None or g != ity:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        from numba.core import cgutils

        it = llir.IntType(ity.bitwidth)
        bits = builder.and_(
            builder.bitcast(args[1], it), llir.Constant(it, (1 << (ity.bitwidth - 1)) - 1)
        )
        fn = cgutils.get_or_insert_function(
            builder.module, llir.FunctionType(it, [it, it]), f"llvm.umax.i{ity.bitwidth}"
        )
        return builder.call(fn, [args[0], bits])

    return ity(g, x), codegen


@_helper
def _g_fmin(a: float, b: float) -> float:  # NaN-propagating minimum (np.minimum)
    return a if (a <= b or a != a) else b


@_helper
def _g_fmax(a: float, b: float) -> float:  # NaN-propagating maximum (np.maximum)
    return a if (a >= b or a != a) else b


@_helper
def _g_fsign(x: float, one: float) -> float:  # -1/0/1 keeping NaN and the dtype
    if x > 0:
        return one
    if x < 0:
        return -one
    return x


@_helper
def _g_isign(x: int) -> int:  # int64 sign
    return np.int64(x > 0) - np.int64(x < 0)


def backend_fingerprint() -> str:
    """Hash of the backend's own files, vmath.py and chunks.py: their helpers are compiled
    into every cached kernel."""
    try:
        package = Path(__file__).parent
        files = [
            *sorted(package.glob("*.py")),
            package.parent / "vmath.py",
            package.parent / "chunks.py",
        ]
        return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()
    except OSError:  # pragma: no cover - zipped installs
        return "unknown"
