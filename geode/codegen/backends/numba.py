"""numba backend: loop AST -> Python source of one numba function -> native kernel.

:func:`emit_source` prints a :class:`~geode.codegen.ast.Kernel` as a small Python
module holding one function, its numba signature and its ``njit`` options;
:func:`compile_kernel` compiles it eagerly (through the on-disk cache of
:mod:`geode.codegen.cache` when given a ``cache_dir``) and wraps it in a
:class:`NumbaKernel`.

Calling convention
------------------
``kernel(*inputs, *outputs, *dims)`` in the order of ``Kernel.inputs``,
``Kernel.outputs``, ``Kernel.dims``. Arrays are C-contiguous numpy arrays of the
buffer's dtype and rank (inputs may be read-only; outputs are written in place); dims
are Python ints. The entry checks every argument's shape against the buffer's shape
expression and raises ``ValueError`` naming the buffer on a mismatch (a few integer
compares; it keeps a wrong call from writing out of bounds).

Choices: a 0-d buffer is a 1-element 1-d array at the native level (numba's parallel
lowering mistypes 0-d arrays read inside a prange); :meth:`NumbaKernel.__call__`
takes a 0-d array or a 1-element 1-d array. numba has no float16 on the CPU: float16
buffers are ``uint16`` views of the same memory at the native level, which
``__call__`` makes for you. ``NumbaKernel.fn`` is the bare numba dispatcher (no
adaptation: the fastest call, for kernels without float16 or 0-d buffers; a chunked
kernel's also takes ``*NumbaKernel.launch_args`` last, see "Chunked kernels", and a
kernel with a streaming body returns 1 or 2 without running while the chunk function the
call needs is not compiled: call :meth:`NumbaKernel.compile_chunk_functions` first, or
the ``NumbaKernel``, which compiles it). When the
arguments do not match the compiled signature, ``__call__`` copies non-contiguous
inputs to C order and retries, or raises ``TypeError`` naming the argument (a
non-contiguous output cannot be written in place: it is an error).

Chunked kernels
---------------
A parallel kernel whose only parallel work is one top-level parallel loop (every
other top-level statement computes values only: no store, no loop) is compiled without
numba's parfor machinery, which compiles a ``parallel=True`` function twice over and
cost 0.5-0.75 s of a 0.9-1.4 s cold compile. The module then holds three functions
(five with a streaming body, below; see :mod:`geode.codegen.backends.chunks`):

- the entry ``fused_0(*arrays, *dims, rows, chunks, threads)``, serial ``njit``: the
  shape checks, the arrays' addresses and the dims in an int64 ``argv``, and the shared
  launcher ``_g_launch(rows, argv, chunks, threads)``, which sets the thread count
  (``threads > 0``) and shares the chunks among numba's threads by work stealing;
- the chunk function ``fused_0_rows(argv, chunk, chunks)``, a numba ``cfunc``: it
  rebuilds each array (``numba.carray`` of ``_g_ptr(argv[i], dtype)``) and calls
- the body ``fused_0_body(*arrays, *dims, chunk, chunks)``, serial ``njit`` with
  ``noalias`` array arguments (as numba gives a prange body it found no aliases in;
  without it LLVM must assume the rebuilt arrays alias each other and the temps, and
  softmax's exp loop lost its clean vector code: 1.12-1.15x the time): it takes its
  share ``[N * chunk // chunks, N * (chunk + 1) // chunks)`` of the parallel loop,
  returns at once when that is empty, allocates the iteration-private temps once, and
  runs the loop (the same body a prange would run).

``NumbaKernel.__call__`` passes ``rows`` (the cfunc's address; with a streaming body,
then that of the streaming chunk function), ``chunks``
(:func:`~geode.codegen.backends.chunks.launch_chunks`) and ``threads`` (its keyword
argument; 0 keeps the calling thread's numba setting). Cold compiles of the
benchmark kernels took 0.4-0.75 s instead of 0.9-1.4 s, with equal run time and call
overhead. Any other parallel kernel (two parallel loops one after another, a parallel
loop inside a serial one, stores outside the parallel loop) keeps ``numba.prange``.

A chunked kernel with stores that :meth:`~geode.codegen.schedule.Schedule.store_nontemporal`
marked holds a streaming body ``fused_0_body_nt`` and its own chunk function
``fused_0_rows_nt``: the same loops, with those stores as ``_g_ntstore`` (non-temporal
stores that LLVM's loop vectorizer turns into whole aligned vector stores, ``vmovntps``).
The entry launches it when every marked store's flag holds and each such output array
starts on a vector boundary (``_g_vector_start(Y, 0)``), the plain chunk function
otherwise. A store counts only when, in the AST being printed, it sits in a flat block
without predicate directly in a vectorized loop and every run of that loop starts on a
cache line of the output (checked again here, whatever the schedule did after marking
it): with the array aligned, every vector the loop vectorizer stores is then aligned to
its own size, as ``vmovntps`` requires. A whole function is duplicated rather than the
loop, because a loop printed twice in one function made LLVM spill the registers of both
copies' constants (the LSTM gates' ``h`` pass: 30 stack accesses per 64 elements, 1.1x
the time of the plain kernel, against 0.9x for the streaming body on its own). Other
kernels print such stores as ordinary stores.

Each body is as costly to compile as the whole kernel without it (the LSTM gates:
0.6-0.65 s, the tanh GELU 0.5 s), so :func:`compile_kernel` compiles the streaming
chunk function only (what geode's outputs of at least a MiB, 64-byte aligned, run) and
the plain one on the first call that needs it: its entry address is 0 until then, the
entry returns 1 instead of launching, and ``NumbaKernel.__call__`` compiles it (once,
under a lock) through a cache entry of its own and calls again
(:meth:`NumbaKernel.compile_chunk_functions` compiles it ahead of time, for a warm-up).
Such a kernel may thus own two entries of the disk cache. Cold compiles with the
runtime helpers cached fell from 1.30-1.36 s to 0.82-0.84 s (LSTM gates) and from 0.90 s
to 0.66 s (tanh GELU); a program whose outputs are small or misaligned pays the plain
chunk function's compile (about as much) on its first call instead.

Runtime helpers
---------------
A kernel's compile links in the launcher (chunked kernels) and the vmath functions it
calls; each is compiled once per process, before the kernel, through its own entry of
the disk cache (:func:`~geode.codegen.cache.compile_helper`), so a new process loads
them instead of compiling them (the launcher: 0.23 s; a vmath function: 0.1-0.2 s).
A kernel loaded from its cache entry already holds their code and needs neither.

Statements
----------
- ``For``: ``parallel`` -> ``numba.prange`` when the kernel is compiled parallel and
  no enclosing loop is parallel (numba only parallelises the outermost prange; inner
  ones are printed as ``range``), or this chunk's share of it in a chunked kernel
  (below); ``serial``/``vectorized`` -> ``range`` (a vectorized
  loop is a plain innermost loop over contiguous elements that LLVM's loop vectorizer
  turns into SIMD); ``unrolled`` with a constant extent (at most
  :data:`MAX_UNROLL`) -> the body repeated with the loop variable replaced by each
  constant, otherwise a ``range`` loop. A non-parallel loop with a constant extent
  (at most :data:`MAX_REGISTER_UNROLL`) whose body indexes a multi-element register
  buffer with the loop variable is unrolled too, so the register buffer stays a set
  of scalars (``acc_0 .. acc_7``) that SLP vectorization packs into SIMD registers.
- ``Block``: each iteration variable is bound to its binding: a binding that folds to
  a constant or to a plain variable is substituted, anything else is assigned once
  (``vi0 = i0 * 4 + i1``). A ``predicate`` guards the body with ``if``.
- ``Store``/``Load``: native multi-dimensional indexing ``X[i, j]`` of C-contiguous
  arrays (see "Indexing" below). A Store converts the value to the buffer's dtype.
- Buffers by scope: ``global`` -> the argument; ``register`` -> Python scalars (one per
  constant index tuple: ``acc`` for a 0-d/1-element buffer, ``acc_3`` for ``acc[3]``);
  a register buffer indexed by a non-constant expression falls back to a local array.
  ``local`` -> ``np.empty(shape)``. Allocation rule: a local temp whose every access
  lies inside one loop printed as ``prange`` is allocated at the top of that loop's
  body, so it is private to each parallel iteration (numba hoists the allocation into
  each worker's chunk, so it costs one allocation per thread, not per iteration);
  every other local temp is allocated once at the kernel entry. A 0-d local temp is a
  1-element array. float16 locals and registers hold float32 values that are exactly
  float16 (see "dtypes").
- ``StreamStore``: ``_g_stream`` (non-temporal vector stores when its flag holds). When
  the loop just before it only stages ``buf[..., x + j] * s`` (or ``s * buf[...]``,
  ``buf[...] / s``) for its variable ``j``, ``buf`` a local buffer and ``s`` fixed for
  the chunk (softmax's ``e / sum``), the pair prints as one ``_g_stream_scaled``, which
  multiplies on the way: no stage store and load per element.

dtypes
------
Each expression has a numpy dtype: ``Var`` int64, ``Const``/``Load``/``Cast`` their
own, ``Select`` the promotion of its branches, comparisons and logical ops bool, math
functions on integers the smallest float that holds them (numpy's rule: int8 ->
float16, int16 -> float32, int32/int64 -> float64), ``floor``/``ceil``/``round``/
``abs`` keep integer dtypes. Binary arithmetic promotes like numpy 2 (NEP 50) with a
``Const`` of the default dtypes int64/float64/bool taken as a *weak* Python scalar
when the other operand is not itself such a constant: ``float32 * 2.0 -> float32``,
``int32 + 1 -> int32``, ``int32 * 0.5 -> float64``; a typed constant (``Const(2.0,
"float32")``) is strong. Every result is computed in its own dtype: float32 math
stays float32 (literals are emitted typed, ``np.float32(2.0)``), narrow integer
results are wrapped back (numba computes them in int64: ``np.int32(a + b)`` wraps
like numpy). float16 values are carried as float32 and rounded to float16 after
every operation (``_g_rh``, an LLVM ``fptrunc``/``fpext`` pair), which gives exactly
numpy's float16 results for + - * / and sqrt (numpy also computes float16 in
float32 and rounds each result); loads and stores convert between float16 bits and
float32 with the same instructions (``vcvtph2ps``/``vcvtps2ph``; on AVX512-FP16
hosts LLVM even folds the pairs into native half arithmetic, ``vmulph``/``vaddph``,
which rounds identically).

Operators (``BIN_OPS``/``UN_OPS``), numpy semantics unless ONNX says otherwise:
integer ``/`` truncates toward zero, ``//`` floors, ``%`` takes the divisor's sign,
``fmod`` the dividend's; integer division or modulo by zero gives 0 and
``MIN // -1`` wraps (numpy's results, without its warnings); float division by zero
gives inf/nan. ``min``/``max`` propagate NaN (``np.minimum``); a scalar float
register reduced only by ``R = max(R, v)`` in a loop that does not otherwise read or
reset it prints as ``_g_maxnum_nn`` (plain ``vmaxps``, 3x faster as a reduction) plus
an integer NaN guard checked after the loop, which keeps np.max's NaN result exactly
(see ``_Emitter.find_guarded``). ``Prefetch`` statements print as ``_g_prefetch``
(``llvm.prefetch`` into every cache level) or, at level 2, ``_g_prefetch_l2`` (into
the L2 and beyond). ``1 + tanh(z)`` prints as vmath's ``one_plus_tanh(z)`` and the tanh
GELU's ``0.5 * a * (1 + tanh(z))`` (any grouping) as ``div_one_plus_exp(a, -2z)``, one
division (``_Emitter.one_plus_tanh``, ``_Emitter.tanh_gate``). Integer ``pow`` with a
negative exponent gives 0 (1 or -1 for bases 1/-1) where numpy raises. ``shl``/``shr``
by a negative amount or by at least the bit width give 0 (``shr`` of a negative
signed value gives -1), like numpy. ``round`` is half-to-even (``np.rint``), ``sign``
keeps NaN, ``erf`` is ``math.erf``. Float-to-int casts truncate; out-of-range and NaN
casts are undefined (as in C). ``neg``/``/``/``pow``/``-`` on bool and bitwise
shifts on floats raise :class:`~geode.errors.CodegenError`.

Indexing (measured with ``inspect_asm``; ``tests/test_backend_numba.py::test_vectorizes_*``)
-----------------------------------------------------------------------------------------
Native multi-dimensional indexing (``X[i, j]`` on a ``C``-layout array type) and
linearised indexing (``Xf[i * 256 + j]`` on ``X.reshape(X.size)``) give the same
machine code: on an elementwise ``Z = X * Y + B`` kernel both loops compile to
32 ``vmulps ymm`` + 32 ``vaddps ymm`` (``vfmadd213ps`` with fastmath), because numba
computes C-layout offsets from the shape (the innermost stride is known to be the
item size); on a row-sum written with 8 independent partial accumulators both give
19 ``vaddps xmm`` with SLP vectorization on and only scalar ``vaddss`` with it off.
Timings were equal within noise. Native indexing is therefore used: it is the more
readable source and needs no reshaped views.

numba turns LLVM's SLP vectorizer off by default (numba PR #8852, miscompilations in
older LLVMs); without it partial-accumulator reductions stay scalar unless fastmath
is on. geode kernels are compiled with SLP vectorization on (:data:`SLP_VECTORIZE`,
set only while geode's own compiles hold numba's compiler lock); it is part of the
cache key. Every compiled path is tested differentially against numpy.

A vectorized loop's interleave factor (:meth:`Schedule.interleave`) cannot reach LLVM
as loop metadata (numba sets none). The kernel module states its largest factor as
``INTERLEAVE`` (so it is part of the source, hence of the cache key), and the compile
sets LLVM's ``-force-vector-interleave`` to it while it holds numba's compiler lock,
then back to 0 (LLVM's own choice); every loop of that kernel is interleaved alike.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import keyword
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numba
import numpy as np
from llvmlite import ir as llir
from numba import types as nbt
from numba.extending import intrinsic

from geode.codegen import cache as _cache
from geode.codegen.ast import (
    Bin,
    Block,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    ForKind,
    If,
    Kernel,
    Load,
    Prefetch,
    Select,
    Stmt,
    Store,
    StreamStore,
    Un,
    Var,
    stmt_exprs,
    substitute,
    transform,
    walk,
    walk_stmts,
)
from geode.codegen.backends import target as _target

# numba's CPU target gets geode's features before the modules below build it (vmath and
# chunks compile numba code at import)
_target.configure()

from geode.codegen.backends import vmath as _vmath  # noqa: E402
from geode.codegen.backends.chunks import (  # the helpers of chunked kernels' modules  # noqa: E402
    CHUNK_SIGNATURE,
    LAUNCH_SIGNATURE,
    _g_addr,  # noqa: F401
    _g_launch,
    _g_ptr,  # noqa: F401
    launch_chunks,
    start_threads,
)
from geode.codegen.backends.patterns import (  # noqa: E402
    cubic_parts,
    flat_index,
    is_const,
    one_plus_tanh_parts,
    product_factors,
    scaled_stage,
)
from geode.codegen.backends.vmath import VMATH, VMATH2, VMATH_IEEE  # noqa: E402
from geode.codegen.schedule import and_flags, conjuncts, line_aligned  # noqa: E402
from geode.config import OptionError  # noqa: E402
from geode.errors import CodegenError  # noqa: E402

__all__ = [
    "DEFAULT_FLAGS",
    "FASTMATH_FLAGS",
    "MAX_REGISTER_UNROLL",
    "MAX_UNROLL",
    "SLP_VECTORIZE",
    "NumbaKernel",
    "clamp_threads",
    "compile_kernel",
    "emit_source",
    "get_num_threads",
    "set_num_threads",
]

log = logging.getLogger(__name__)

#: LLVM fast-math flags used when ``fastmath=True`` (see ``config.ACCURACY_POLICY``).
FASTMATH_FLAGS: frozenset[str] = frozenset(
    ["nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc"]
)

#: LLVM fast-math flags used by default (``fastmath=False``): reassociation, FMA
#: contraction and reciprocal multiplication only, so reductions vectorize and a division
#: by a row-invariant value becomes one reciprocal and a multiply, while NaN/Inf keep
#: IEEE semantics (see ``config.ACCURACY_POLICY``).
DEFAULT_FLAGS: frozenset[str] = frozenset(["arcp", "contract", "reassoc"])

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


def _stream_codegen(scaled: bool) -> Callable[..., Any]:
    """The LLVM codegen of :func:`_g_stream` (``scaled``: :func:`_g_stream_scaled`, whose
    seventh argument multiplies every element on its way)."""

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
                    v = builder.fmul(v, factor)
                builder.store(v, builder.gep(dptr, [i]))

        def copy_vectors(head: Any, nvec: Any, nontemporal: Any) -> None:
            with cgutils.for_range(builder, nvec) as loop:
                off = builder.add(head, builder.mul(loop.index, c64(lanes)))
                v = builder.load(builder.bitcast(builder.gep(sptr, [off]), vty.as_pointer()))
                v.align = esz
                if vfactor is not None:
                    v = builder.fmul(v, vfactor)
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


#: float dtype -> (integer dtype of its bits, the bits of +inf): ``|bits| > inf`` iff NaN.
_NAN_GUARD = {"float32": ("int32", 0x7F800000), "float64": ("int64", 0x7FF0000000000000)}


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


def _backend_fingerprint() -> str:
    """Hash of this file, vmath.py and chunks.py: their helpers are compiled into every
    cached kernel."""
    try:
        here = Path(__file__)
        return hashlib.sha256(
            b"".join(
                p.read_bytes() for p in (here, here.parent / "vmath.py", here.parent / "chunks.py")
            )
        ).hexdigest()
    except OSError:  # pragma: no cover - zipped installs
        return "unknown"


# ---------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------

_FLOATS = ("float16", "float32", "float64")
_SINTS = ("int8", "int16", "int32", "int64")
_UINTS = ("uint8", "uint16", "uint32", "uint64")
_ALL = (*_FLOATS, *_SINTS, *_UINTS, "bool")
_WEAK = ("int64", "float64", "bool")


def _dtype_name(dtype: str, where: str) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise CodegenError(f"{where}: unknown dtype {dtype!r}") from None
    if name not in _ALL:
        raise CodegenError(f"{where}: dtype {name} is not supported by the numba backend")
    return name


def _nb_scalar(dtype: str) -> str:
    """numba type expression (in the generated module) of a buffer's element."""
    if dtype == "float16":
        return "_t.uint16"
    if dtype == "bool":
        return "_t.boolean"
    return f"_t.{dtype}"


def _np_ctor(dtype: str) -> str:
    """Constructor of a value of ``dtype`` in generated code (float16 carried as float32)."""
    if dtype == "float16":
        return "np.float32"
    if dtype == "bool":
        return "np.bool_"
    return f"np.{dtype}"


def _promote(a: str, a_weak: bool, b: str, b_weak: bool) -> str:
    """numpy 2 (NEP 50) promotion; a weak operand acts as a Python scalar of its kind."""
    if a_weak and not b_weak:
        return np.result_type(_weak_scalar(a), np.dtype(b)).name
    if b_weak and not a_weak:
        return np.result_type(np.dtype(a), _weak_scalar(b)).name
    return np.promote_types(a, b).name


def _weak_scalar(dtype: str) -> object:
    return {"int64": 0, "float64": 0.0, "bool": False}[dtype]


def _float_for(dtype: str) -> str:
    """The float dtype numpy computes a math function of ``dtype`` in."""
    if dtype in _FLOATS:
        return dtype
    return np.promote_types(dtype, np.float16).name


# ---------------------------------------------------------------------------------
# emitted values and precedence
# ---------------------------------------------------------------------------------

_ATOM = 100  # names, literals, calls, subscripts
_POW = 95
_UNARY = 90
_MUL = 80
_ADD = 70
_SHIFT = 60
_BAND = 50
_BXOR = 40
_BOR = 30
_CMP = 20
_NOT = 15
_TERNARY = 5


class _V(NamedTuple):
    code: str
    dtype: str
    prec: int
    literal: object = None  # the value, when the code is a literal constant


def _p(v: _V, min_prec: int) -> str:
    return v.code if v.prec >= min_prec else f"({v.code})"


def _call(fn: str, *args: _V | str) -> str:
    return f"{fn}({', '.join(a if isinstance(a, str) else a.code for a in args)})"


_PY_OPS = {
    "+": ("+", _ADD),
    "-": ("-", _ADD),
    "*": ("*", _MUL),
    "/": ("/", _MUL),
    "//": ("//", _MUL),
    "%": ("%", _MUL),
}
_CMP_OPS = {"<", "<=", ">", ">=", "==", "!="}
_LOGIC_OPS = {"and": ("&", _BAND), "or": ("|", _BOR), "xor": ("^", _BXOR)}
_BIT_OPS = {"bitand": ("&", _BAND), "bitor": ("|", _BOR), "bitxor": ("^", _BXOR)}
_MATH_UN = {
    "exp": "math.exp",
    "log": "math.log",
    "log1p": "math.log1p",
    "sqrt": "math.sqrt",
    "sin": "math.sin",
    "cos": "math.cos",
    "tan": "math.tan",
    "asin": "math.asin",
    "acos": "math.acos",
    "atan": "math.atan",
    "sinh": "math.sinh",
    "cosh": "math.cosh",
    "tanh": "math.tanh",
    "asinh": "math.asinh",
    "acosh": "math.acosh",
    "atanh": "math.atanh",
    "erf": "math.erf",
}
_ROUND_UN = {"floor": "np.floor", "ceil": "np.ceil", "round": "np.rint"}


def _implemented_ops() -> tuple[set[str], set[str]]:
    """The binary and unary ops the emitter handles (tests compare with the AST's)."""
    binary = set(_PY_OPS) | _CMP_OPS | set(_LOGIC_OPS) | set(_BIT_OPS)
    binary |= {"fmod", "min", "max", "pow", "shl", "shr"}
    unary = set(_MATH_UN) | set(_ROUND_UN) | {"sigmoid"}
    unary |= {"neg", "not", "bitnot", "abs", "sign", "isnan", "isinf", "isposinf", "isneginf"}
    return binary, unary


# ---------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------

_RESERVED = frozenset(
    set(keyword.kwlist)
    | set(keyword.softkwlist)
    | {
        "np",
        "math",
        "numba",
        "range",
        "min",
        "max",
        "abs",
        "int",
        "float",
        "bool",
        "SIGNATURE",
        "NJIT_OPTIONS",
        "ValueError",
        "print",
        "len",
    }
)


class _Names:
    """Python identifiers for AST names: sanitised, unique within the function."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def fresh(self, name: str) -> str:
        base = re.sub(r"\W", "_", name) or "v"
        if base[0].isdigit():
            base = "v_" + base
        if base.startswith("_"):
            base = "v" + base
        if base in _RESERVED:
            base += "_"
        out = base
        n = 1
        while out in self.used:
            out = f"{base}_{n}"
            n += 1
        self.used.add(out)
        return out


# ---------------------------------------------------------------------------------
# the emitter
# ---------------------------------------------------------------------------------


class _Demote(Exception):
    """A register buffer was indexed by a non-constant: re-emit it as a local array."""

    def __init__(self, buffer: str):
        self.buffer = buffer


@dataclass
class _Emitted:
    source: str
    func_name: str
    parallel: bool
    half_args: list[int] = field(default_factory=list)
    zero_d_args: list[int] = field(default_factory=list)
    #: (buffer name, "input"/"output", dtype, rank) of every array argument, in order
    arrays: list[tuple[str, str, str, int]] = field(default_factory=list)
    dims: list[str] = field(default_factory=list)
    #: the chunk function of a chunked kernel and the body it calls (see "Chunked
    #: kernels"), else None
    rows_name: str | None = None
    body_name: str | None = None
    #: a chunked kernel's streaming body (see ``_Emitter.plan_nontemporal``) and the
    #: chunk function that calls it, else None
    nt_body_name: str | None = None
    nt_rows_name: str | None = None
    #: (name in :mod:`geode.codegen.backends.vmath`, argument dtype) of every vmath
    #: function the kernel calls
    vmath: tuple[tuple[str, str], ...] = ()


def _fold_int(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Const) and e.dtype in (*_SINTS, *_UINTS) else None


class _Emitter:
    def __init__(self, kernel: Kernel, fastmath: bool, parallel: bool, demoted: set[str]):
        self.k = kernel
        self.fastmath = fastmath
        self.parallel = parallel
        self.demoted = demoted
        self.names = _Names()
        self.helpers: set[str] = set()
        #: the vmath functions called, by name, with their argument's dtype
        self.vmath: dict[str, str] = {}
        self.index_vars: set[str] = set(kernel.dims)
        for st in walk_stmts(kernel.body):
            if isinstance(st, For):
                self.index_vars.add(st.var)
            elif isinstance(st, Block):
                self.index_vars.update(iv.name for iv in st.iter_vars)
        self.lines: list[str] = []
        self.bufs: dict[str, Buffer] = {}
        self.roles: dict[str, str] = {}
        self.dtypes: dict[str, str] = {}
        for role, group in (
            ("input", kernel.inputs),
            ("output", kernel.outputs),
            ("temp", kernel.temps),
        ):
            for b in group:
                if b.name in self.bufs:
                    raise CodegenError(f"kernel {kernel.name!r}: buffer {b.name!r} declared twice")
                self.bufs[b.name] = b
                self.roles[b.name] = role
                self.dtypes[b.name] = _dtype_name(
                    b.dtype, f"kernel {kernel.name!r} buffer {b.name!r}"
                )
        self.func_name = self.names.fresh(kernel.name)
        self.py: dict[str, str] = {}  # buffer -> python name
        self.reg_scalars: dict[tuple[str, tuple[int, ...]], str] = {}
        self.alloc_site: dict[str, int | None] = {}
        self.guarded = self.find_guarded()
        self.guard_names: dict[str, str] = {}  # register python name -> its NaN guard
        self.quiet_regs: set[str] = set()  # guarded registers of nan_insensitive buffers
        # loops being emitted, innermost last: where loop-invariant block bindings are
        # hoisted to (see binding)
        self.hoist_frames: list[_HoistFrame] = []
        self.n_hoisted = 0
        # dims-only min/max/floor-division terms (a chunk size such as
        # max(1, min(64, N // 8))) are computed once at the top of the kernel
        self.prologue_at: int | None = None
        self.dim_names: set[str] = set()
        self.dim_terms: dict[str, str] = {}
        self.in_dim_term: set[int] = set()  # ids of the terms being emitted
        self.n_comments = 0
        #: per enclosing For being printed: the guarded registers (python name, dtype) it
        #: updates (None for a prange loop, where updates stay exact)
        self.guard_frames: list[list[tuple[str, str]] | None] = []
        #: a streaming store ran outside any prange loop: fence at the end of the kernel
        self.fence_at_end = False
        #: ids of the non-temporal Stores printed as streaming stores in the body being
        #: printed (see plan_nontemporal)
        self.nt_on: set[int] = set()
        #: a chunked kernel's (chunk, chunks) parameter names (see "Chunked kernels")
        self.chunk_vars: tuple[str, str] | None = None

    # -- min/max reductions ----------------------------------------------------------
    def find_guarded(self) -> set[str]:
        """Scalar float registers that are only ever initialised or updated as
        ``R = max(R, v)`` (or ``min``): their updates print as the fast NaN-ignoring
        ``_g_maxnum_nn`` plus an integer NaN guard, and the loop holding the update is
        followed by ``if guard > bits(inf): R = nan`` (exact np.max/np.min semantics,
        including NaN; only the sign of a zero result of a +0/-0 tie is unspecified).
        Since ``R`` is only exact after that check, a register is left alone when the
        innermost loop holding one of its updates also reads it elsewhere or
        (re)initialises it."""
        ops: dict[str, set[str]] = {}
        bad: set[str] = set()
        updates: dict[str, list[tuple[int, ...]]] = {}  # register -> loop stacks of updates
        others: dict[str, list[tuple[int, ...]]] = {}  # loop stacks of inits and other reads

        def candidate(name: str) -> bool:
            return (
                name in self.bufs
                and self.scope(name) == "register"
                and _size(self.bufs[name]) == 1
                and self.dtypes[name] in _NAN_GUARD
            )

        def note_reads(exprs: list[Expr], stack: tuple[int, ...]) -> None:
            for e in exprs:
                for x in walk(e):
                    if isinstance(x, Load) and candidate(x.buffer):
                        others.setdefault(x.buffer, []).append(stack)

        def visit(stmts: list[Stmt], stack: tuple[int, ...]) -> None:
            for st in stmts:
                if isinstance(st, Store) and candidate(st.buffer):
                    kind = self.minmax_update(st)
                    if kind is None:
                        bad.add(st.buffer)
                    elif kind:
                        ops.setdefault(st.buffer, set()).add(kind[0])
                        updates.setdefault(st.buffer, []).append(stack)
                        note_reads([*st.indices, kind[1]], stack)
                        continue
                    else:
                        others.setdefault(st.buffer, []).append(stack)
                if isinstance(st, For):
                    note_reads([st.extent], stack)
                    visit(st.body, (*stack, id(st)))
                    continue
                note_reads(stmt_exprs(st), stack)
                if isinstance(st, (Block, If)):
                    visit(st.body, stack)

        visit(self.k.body, ())
        out = set()
        for name, o in ops.items():
            if name in bad or len(o) != 1:
                continue
            inner = {stk[-1] for stk in updates[name] if stk}
            if any(inner & set(stk) for stk in others.get(name, [])):
                continue
            out.add(name)
        return out

    @staticmethod
    def minmax_update(st: Store) -> tuple[str, Expr] | tuple[()] | None:
        """``(op, v)`` for ``R = op(R, v)``, ``()`` for a store not reading ``R``, ``None``
        for any other store reading ``R``."""

        def reads(e: Expr) -> bool:
            return any(isinstance(x, Load) and x.buffer == st.buffer for x in walk(e))

        v = st.value
        if isinstance(v, Bin) and v.op in ("max", "min"):
            for acc, other in ((v.a, v.b), (v.b, v.a)):
                if isinstance(acc, Load) and acc.buffer == st.buffer and not reads(other):
                    return (v.op, other)
        return None if reads(v) else ()

    # -- helpers -------------------------------------------------------------------
    def where(self) -> str:
        return f"kernel {self.k.name!r}"

    def helper(self, name: str) -> str:
        self.helpers.add(name)
        return name

    def scope(self, name: str) -> str:
        b = self.bufs[name]
        if self.roles[name] != "temp":
            return "global"
        if b.scope == "register" and name not in self.demoted:
            return "register"
        return "local"

    def fold(self, e: Expr, env: dict[str, Expr]) -> Expr:
        """AST expression -> expression over Python names, constants folded."""

        def fn(x: Expr) -> Expr | None:
            if isinstance(x, Var):
                if x.name not in env:
                    raise CodegenError(f"{self.where()}: unbound variable {x.name!r}")
                return env[x.name]
            return None

        return _fold_consts(transform(e, fn))

    # -- expressions ---------------------------------------------------------------
    def const(self, value: object, dtype: str) -> _V:
        if dtype == "bool":
            return _V("True" if value else "False", "bool", _ATOM, bool(value))
        if dtype in _SINTS or dtype in _UINTS:
            iv = int(value)  # type: ignore[call-overload]
            if dtype == "int64":
                return _V(repr(iv), dtype, _ATOM if iv >= 0 else _UNARY, iv)
            return _V(f"np.{dtype}({iv})", dtype, _ATOM, iv)
        typed = np.dtype(dtype).type(value)  # round to the constant's dtype
        fv = float(typed)
        if math.isnan(fv):
            text = "math.nan"
        elif math.isinf(fv):
            text = "math.inf" if fv > 0 else "-math.inf"
        else:
            text = repr(fv)
            short = str(typed)  # shortest digits that identify a float32/float16 value
            if (
                dtype != "float64"
                and np.float32(float(short)) == np.float32(fv)
                and len(short) < len(text)
            ):
                text = short if any(ch in short for ch in ".en") else short + ".0"
        if dtype == "float64":
            prec = _UNARY if text.startswith("-") else _ATOM
            return _V(text, dtype, prec, fv)
        return _V(f"np.float32({text})", dtype, _ATOM, fv)

    def convert(self, v: _V, to: str) -> _V:
        """``v`` converted to dtype ``to`` (numpy ``astype`` semantics)."""
        fr = v.dtype
        if fr == to:
            return v
        if v.literal is not None and not (
            to in (*_SINTS, *_UINTS)
            and isinstance(v.literal, float)
            and not math.isfinite(v.literal)
        ):
            return self.const(v.literal, to)  # a typed literal instead of a conversion call
        if to == "bool":
            return _V(f"{_p(v, _CMP + 1)} != 0", "bool", _CMP)
        if to == "float16":
            if fr == "float32" or fr == "float64":
                return _V(_call(self.helper("_g_rh"), v), to, _ATOM)
            if fr == "float16":  # pragma: no cover - handled by fr == to
                return v
            return _V(_call(self.helper("_g_rh"), _call("np.float64", v)), to, _ATOM)
        if fr == "float16" and to == "float32":
            return _V(v.code, to, v.prec)  # carrier is already float32
        return _V(_call(_np_ctor(to), v), to, _ATOM)

    def wrap(self, code: str, prec: int, dtype: str) -> _V:
        """A numba int64/float32 result brought back to ``dtype``."""
        if dtype in ("int64", "float32", "float64", "bool"):
            return _V(code, dtype, prec)
        if dtype == "float16":
            return _V(f"{self.helper('_g_rh')}({code})", dtype, _ATOM)
        return _V(f"np.{dtype}({code})", dtype, _ATOM)

    def ex(self, e: Expr) -> _V:
        if isinstance(e, Const):
            return self.const(e.value, _dtype_name(e.dtype, f"{self.where()} constant"))
        if isinstance(e, Var):
            return _V(e.name, "int64", _ATOM)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Cast):
            return self.convert(self.ex(e.a), _dtype_name(e.dtype, f"{self.where()} cast"))
        if isinstance(e, Select):
            c = self.convert(self.ex(e.cond), "bool")
            t, f = self.ex(e.t), self.ex(e.f)
            r = _promote(t.dtype, _weak(e.t, t), f.dtype, _weak(e.f, f))
            t, f = self.convert(t, r), self.convert(f, r)
            code = f"{_p(t, _TERNARY + 1)} if {_p(c, _TERNARY + 1)} else {_p(f, _TERNARY)}"
            return _V(code, r, _TERNARY)
        if isinstance(e, Un):
            return self.unary(e)
        if isinstance(e, Bin):
            return self.binary(e)
        raise CodegenError(f"{self.where()}: unknown expression {e!r}")

    def index_codes(self, indices: tuple[Expr, ...]) -> list[str]:
        out = []
        for i in indices:
            v = self.ex(i)
            if v.dtype not in _SINTS and v.dtype not in _UINTS:
                raise CodegenError(f"{self.where()}: index {i!r} has dtype {v.dtype}")
            out.append(v.code)
        return out

    def subscript(self, name: str, indices: tuple[Expr, ...]) -> str:
        b = self.bufs[name]
        if len(indices) != len(b.shape):
            raise CodegenError(
                f"{self.where()}: buffer {name!r} has rank {len(b.shape)} but is "
                f"indexed with {len(indices)} indices"
            )
        py = self.py[name]
        if not indices:
            return f"{py}[0]"  # 0-d buffers are 1-element arrays
        return f"{py}[{', '.join(self.index_codes(indices))}]"

    def register_name(self, name: str, indices: tuple[Expr, ...]) -> str:
        b = self.bufs[name]
        consts = [_fold_int(i) for i in indices]
        if any(c is None for c in consts):
            raise _Demote(name)
        idx = tuple(c for c in consts if c is not None)
        if len(idx) != len(b.shape):
            raise CodegenError(f"{self.where()}: register {name!r} indexed with {len(idx)} indices")
        key = (name, ()) if _size(b) == 1 else (name, idx)
        if key not in self.reg_scalars:
            label = name if not key[1] else name + "_" + "_".join(str(i) for i in idx)
            self.reg_scalars[key] = self.names.fresh(label)
        return self.reg_scalars[key]

    def load(self, e: Load) -> _V:
        if e.buffer not in self.bufs:
            raise CodegenError(f"{self.where()}: load of unknown buffer {e.buffer!r}")
        dt = self.dtypes[e.buffer]
        sc = self.scope(e.buffer)
        if sc == "register":
            return _V(self.register_name(e.buffer, e.indices), dt, _ATOM)
        sub = self.subscript(e.buffer, e.indices)
        if dt == "float16" and sc == "global":
            return _V(f"{self.helper('_g_h2f')}({sub})", dt, _ATOM)
        return _V(sub, dt, _ATOM)

    def unary(self, e: Un) -> _V:
        op = e.op
        a = self.ex(e.a)
        dt = a.dtype
        isf = dt in _FLOATS
        if op == "neg":
            if dt == "bool":
                raise CodegenError(f"{self.where()}: neg of a bool")
            if isf:
                return _V(f"-{_p(a, _UNARY + 1)}", dt, _UNARY)
            return self.wrap(f"-{_p(a, _UNARY + 1)}", _UNARY, dt)
        if op == "not":
            if dt != "bool":
                return _V(f"{_p(a, _CMP + 1)} == 0", "bool", _CMP)
            return _V(f"not {_p(a, _NOT)}", "bool", _NOT)
        if op == "bitnot":
            if dt == "bool":
                return _V(f"not {_p(a, _NOT)}", "bool", _NOT)
            if isf:
                raise CodegenError(f"{self.where()}: bitnot of {dt}")
            return self.wrap(f"~{_p(a, _UNARY)}", _UNARY, dt)
        if op == "abs":
            if dt == "bool" or dt in _UINTS:
                return a
            if isf:
                return _V(_call("abs", a), dt, _ATOM)
            return self.wrap(_call("abs", a), _ATOM, dt)
        if op == "sigmoid":
            fdt = _float_for(dt)
            x = self.convert(a, fdt)
            fn = self.vmath_fn(op, fdt)
            if fn is not None:
                return self.call_vmath(fn, x, fdt)
            one = f"np.{fdt}(1.0)"
            return self.wrap(f"{one} / ({one} + math.exp(-{_p(x, _UNARY)}))", _MUL, fdt)
        if op in _MATH_UN:
            fdt = _float_for(dt)
            x = self.convert(a, fdt)
            fn = self.vmath_fn(op, fdt)
            if fn is not None:  # vectorizable implementation (no libm call in the loop)
                return self.call_vmath(fn, x, fdt)
            return self.wrap(_call(_MATH_UN[op], x), _ATOM, fdt)
        if op in _ROUND_UN:
            if not isf:
                return a
            # floor/ceil/rint of a float16 value is a float16 value: no rounding
            return _V(_call(_ROUND_UN[op], a), dt, _ATOM)
        if op == "sign":
            if dt == "bool":
                return a
            if isf:
                one = self.const(1.0, dt)
                return _V(_call(self.helper("_g_fsign"), a, one), dt, _ATOM)
            if dt in _UINTS:
                return self.convert(_V(f"{_p(a, _CMP + 1)} != 0", "bool", _CMP), dt)
            return self.wrap(_call(self.helper("_g_isign"), self.convert(a, "int64")), _ATOM, dt)
        if op in ("isnan", "isinf", "isposinf", "isneginf"):
            if not isf:
                return _V("False", "bool", _ATOM)
            if op == "isnan":
                return _V(_call("math.isnan", a), "bool", _ATOM)
            if op == "isinf":
                return _V(_call("math.isinf", a), "bool", _ATOM)
            inf = "math.inf" if op == "isposinf" else "-math.inf"
            return _V(f"{_p(a, _CMP + 1)} == {inf}", "bool", _CMP)
        raise CodegenError(f"{self.where()}: unknown unary op {op!r}")

    def call_vmath(self, fn: Callable, x: _V, dtype: str) -> _V:
        """A call of the vmath function ``fn`` on ``x`` (already ``dtype``), recorded so the
        module imports it and the backend compiles it before the kernel."""
        self.vmath[fn.__name__] = dtype
        return self.wrap(_call(fn.__name__, x), _ATOM, dtype)

    def vmath_fn(self, op: str, dtype: str) -> Callable | None:
        """The vmath function for ``op``: the variant without a final NaN test when the
        kernel is compiled without ``nnan`` (NaN propagates through its arithmetic)."""
        if not self.fastmath and (op, dtype) in VMATH_IEEE:
            return VMATH_IEEE[op, dtype]
        return VMATH.get((op, dtype))

    def is_index(self, e: Expr) -> bool:
        """A non-negative index expression: loop/iteration variables, dims, non-negative
        constants, and + * // % of them (a zero divisor only occurs in empty loops)."""
        if isinstance(e, Const):
            return e.dtype == "int64" and int(e.value) >= 0
        if isinstance(e, Var):
            return e.name in self.index_vars
        if isinstance(e, Bin) and e.op in ("+", "*", "//", "%"):
            return self.is_index(e.a) and self.is_index(e.b)
        return False

    def one_plus_tanh(self, e: Bin) -> _V | None:
        """``1 + tanh(z)`` (either order) as ``one_plus_tanh`` (``2 / (1 + exp(-2z))``): cheaper,
        and accurate where adding 1 to tanh cancels (z < 0); float32/float64 only, and only
        when the sum keeps z's float dtype."""
        parts = one_plus_tanh_parts(e)
        if parts is None:
            return None
        one, tanh = parts
        z = self.ex(tanh.a)
        fdt = _float_for(z.dtype)
        fn = VMATH.get(("one_plus_tanh", fdt))
        if fn is None or not self.keeps_dtype(one, fdt):
            return None
        return self.call_vmath(fn, self.convert(z, fdt), fdt)

    def keeps_dtype(self, c: Const, dtype: str) -> bool:
        """Whether constant ``c`` combined with a ``dtype`` value leaves the result ``dtype``."""
        cv = self.ex(c)
        return _promote(dtype, False, cv.dtype, _weak(c, cv)) == dtype

    def tanh_gate(self, e: Bin) -> _V | None:
        """``0.5 * a * (1 + tanh(z))`` (one product of those factors, in any order and
        grouping; ``a`` may be a product of several) as vmath's ``div_one_plus_exp(a, t)``
        = ``a / (1 + exp(t))`` with ``t = -2z``: the tanh GELU's gate, whose halving and
        product fold into the one division (two multiplies fewer than ``0.5 * a *
        one_plus_tanh(z)``, and more accurate). The GELU's ``z = c * (h + k * h * h * h)``
        becomes ``t = h * (-2c + (-2ck) * (h * h))``: three multiply-adds instead of four
        (the policy allows reassociation). float32/float64 only, and only when every
        factor has z's dtype (the constants may be weak)."""
        if e.op != "*":
            return None
        factors = product_factors(e)
        half = next((i for i, f in enumerate(factors) if is_const(f, 0.5)), None)
        gate = next((i for i, f in enumerate(factors) if one_plus_tanh_parts(f)), None)
        if half is None or gate is None or len(factors) < 3:
            return None
        one, tanh = one_plus_tanh_parts(factors[gate])  # type: ignore[misc]
        z = self.ex(tanh.a)
        dt = z.dtype
        fn = VMATH2.get(("div_one_plus_exp", dt))
        if fn is None or not all(self.keeps_dtype(c, dt) for c in (one, factors[half])):
            return None
        a: _V | None = None
        for f in (f for i, f in enumerate(factors) if i not in (half, gate)):
            v = self.ex(f)
            if v.dtype != dt and not (isinstance(f, Const) and self.keeps_dtype(f, dt)):
                return None
            v = self.convert(v, dt)
            a = v if a is None else self.wrap(f"{_p(a, _MUL)} * {_p(v, _MUL + 1)}", _MUL, dt)
        assert a is not None  # three factors or more
        t = self.gelu_cubic(tanh.a, dt) or self.wrap(
            f"{self.const(-2.0, dt).code} * {_p(z, _MUL + 1)}", _MUL, dt
        )
        self.vmath[fn.__name__] = dt
        return self.wrap(_call(fn.__name__, a, t), _ATOM, dt)

    def gelu_cubic(self, z: Expr, dtype: str) -> _V | None:
        """``-2z`` for ``z = c * (h + k * h * h * h)`` (constants ``c``, ``k`` that keep
        ``dtype``, ``h`` of ``dtype``; any grouping) as ``h * (-2c + (-2ck) * (h * h))``,
        the constants folded in float64 and rounded once; None for any other ``z``."""
        m = cubic_parts(z)
        if m is None:
            return None
        h, c, k = m
        hv = self.ex(h)
        if hv.dtype != dtype or not (self.keeps_dtype(c, dtype) and self.keeps_dtype(k, dtype)):
            return None
        cv, kv = float(c.value), float(k.value)  # type: ignore[arg-type]
        c0, c2 = self.const(-2.0 * cv, dtype), self.const(-2.0 * cv * kv, dtype)
        h2 = self.wrap(f"{_p(hv, _MUL)} * {_p(hv, _MUL + 1)}", _MUL, dtype)
        q = self.wrap(f"{c0.code} + {c2.code} * {_p(h2, _MUL + 1)}", _ADD, dtype)
        return self.wrap(f"{_p(hv, _MUL)} * {_p(q, _MUL + 1)}", _MUL, dtype)

    def dim_term(self, e: Bin) -> _V | None:
        """A ``min``/``max``/``//``/``%`` of dims only (no loop variable, no load), emitted once
        at the top of the kernel and referred to by name (the active loops' hoisting
        positions move down by the inserted line)."""
        if (
            self.prologue_at is None
            or id(e) in self.in_dim_term
            or e.op not in ("min", "max", "//", "%")
        ):
            return None
        used = _free(e)
        if not used or not used <= self.dim_names or any(isinstance(x, Load) for x in walk(e)):
            return None
        self.in_dim_term.add(id(e))
        try:
            v = self.binary(e)  # its own dims-only terms are hoisted first
        finally:
            self.in_dim_term.discard(id(e))
        if v.dtype != "int64":
            return None
        if v.code not in self.dim_terms:
            name = self.names.fresh("_d")
            self.dim_terms[v.code] = name
            self.lines.insert(self.prologue_at, f"    {name} = {v.code}")
            self.prologue_at += 1
            self.n_hoisted += 1
            for frame in self.hoist_frames:
                frame.at += 1
        return _V(self.dim_terms[v.code], "int64", _ATOM)

    def binary(self, e: Bin) -> _V:
        op = e.op
        fused = self.tanh_gate(e) or self.one_plus_tanh(e)
        if fused is not None:
            return fused
        term = self.dim_term(e)
        if term is not None:
            return term
        a, b = self.ex(e.a), self.ex(e.b)
        if op in _LOGIC_OPS:
            sym, prec = _LOGIC_OPS[op]
            a, b = self.convert(a, "bool"), self.convert(b, "bool")
            return _V(f"{_p(a, prec)} {sym} {_p(b, prec + 1)}", "bool", prec)
        r = _promote(a.dtype, _weak(e.a, a), b.dtype, _weak(e.b, b))
        a, b = self.convert(a, r), self.convert(b, r)
        isf = r in _FLOATS
        if op in _CMP_OPS:
            return _V(f"{_p(a, _CMP + 1)} {op} {_p(b, _CMP + 1)}", "bool", _CMP)
        if r == "bool":
            return self.bool_binary(op, a, b)
        if op in _PY_OPS and (isf or op in ("+", "-", "*")):
            sym, prec = _PY_OPS[op]
            return self.wrap(f"{_p(a, prec)} {sym} {_p(b, prec + 1)}", prec, r)
        if op in ("/", "//", "%", "fmod"):
            if isf:  # op == "fmod"
                return self.wrap(_call("np.fmod", a, b), _ATOM, r)
            if op in ("//", "%") and (
                (isinstance(b.literal, int) and b.literal > 0)
                or (self.is_index(e.a) and self.is_index(e.b))
            ):
                # index arithmetic: Python's // and % are floor/mod, exact for a divisor > 0
                sym, prec = _PY_OPS[op]
                return self.wrap(f"{_p(a, prec)} {sym} {_p(b, prec + 1)}", prec, r)
            if r in _UINTS:
                fn = "_g_udiv" if op in ("/", "//") else "_g_umod"
                code = _call(self.helper(fn), self.convert(a, "uint64"), self.convert(b, "uint64"))
            else:
                fn = {"/": "_g_tdiv", "//": "_g_fdiv", "%": "_g_mod", "fmod": "_g_fmodi"}[op]
                code = _call(self.helper(fn), self.convert(a, "int64"), self.convert(b, "int64"))
            return self.wrap(code, _ATOM, r)
        if op in ("min", "max"):
            if isf and r in ("float32", "float64"):
                return self.wrap(_call(self.helper("_g_" + op + "imum"), a, b), _ATOM, r)
            if isf:
                return self.wrap(_call(self.helper("_g_f" + op), a, b), _ATOM, r)
            return _V(_call(op, a, b), r, _ATOM)
        if op == "pow":
            if isf:
                return self.wrap(f"{_p(a, _ATOM)} ** {_p(b, _ATOM)}", _POW, r)
            if r in _UINTS:
                code = _call(
                    self.helper("_g_upow"), self.convert(a, "uint64"), self.convert(b, "uint64")
                )
            else:
                code = _call(
                    self.helper("_g_ipow"), self.convert(a, "int64"), self.convert(b, "int64")
                )
            return self.wrap(code, _ATOM, r)
        if op in _BIT_OPS:
            if isf:
                raise CodegenError(f"{self.where()}: {op} of {r}")
            sym, prec = _BIT_OPS[op]
            return self.wrap(f"{_p(a, prec)} {sym} {_p(b, prec + 1)}", prec, r)
        if op in ("shl", "shr"):
            if isf:
                raise CodegenError(f"{self.where()}: {op} of {r}")
            nbits = str(np.dtype(r).itemsize * 8)
            if r in _UINTS:
                fn = "_g_ushl" if op == "shl" else "_g_ushr"
                code = _call(
                    self.helper(fn), self.convert(a, "uint64"), self.convert(b, "uint64"), nbits
                )
            else:
                fn = "_g_shl" if op == "shl" else "_g_shr"
                code = _call(
                    self.helper(fn), self.convert(a, "int64"), self.convert(b, "int64"), nbits
                )
            return self.wrap(code, _ATOM, r)
        raise CodegenError(f"{self.where()}: unknown binary op {op!r}")

    def bool_binary(self, op: str, a: _V, b: _V) -> _V:
        table = {
            "+": ("|", _BOR),
            "*": ("&", _BAND),
            "min": ("&", _BAND),
            "max": ("|", _BOR),
            "bitand": ("&", _BAND),
            "bitor": ("|", _BOR),
            "bitxor": ("^", _BXOR),
        }
        if op not in table:
            raise CodegenError(f"{self.where()}: {op} of bool operands")
        sym, prec = table[op]
        return _V(f"{_p(a, prec)} {sym} {_p(b, prec + 1)}", "bool", prec)

    # -- statements ----------------------------------------------------------------
    def emit(self, line: str, ind: int) -> None:
        self.lines.append("    " * ind + line)

    def stmts(self, body: list[Stmt], env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        i = 0
        while i < len(body):
            if i + 1 < len(body) and self.scaled_stream(body[i], body[i + 1], env, ind, in_prange):
                i += 2
                continue
            self.stmt(body[i], env, ind, in_prange)
            i += 1

    def scaled_stream(
        self, f: Stmt, ss: Stmt, env: dict[str, Expr], ind: int, in_prange: bool
    ) -> bool:
        """Emit a staged chunk and its stream as one ``_g_stream_scaled`` when the chunk loop
        ``f`` only stages ``buf[... + j] * s`` (or ``s * buf[...]``, ``buf[...] / s``: a
        division by ``s`` is a multiply by ``1 / s`` under the policy's ``arcp``) for its
        variable ``j``, ``buf`` a local buffer read at unit stride in ``j``, ``s`` fixed
        for the chunk, all of the output's float dtype, and ``ss`` streams exactly that
        stage: the products go from registers to the output, without the stage's store and
        load per element. Returns whether it did (nothing is emitted otherwise)."""
        m = scaled_stage(f, ss)
        if m is None:
            return False
        assert isinstance(f, For) and isinstance(ss, StreamStore)
        load, scale, divide = m
        names = (ss.buffer, ss.src, load.buffer)
        if not all(x in self.bufs for x in names) or self.roles.get(ss.buffer) != "output":
            return False
        if self.scope(ss.src) != "local" or self.scope(load.buffer) != "local":
            return False
        dt = self.dtypes[ss.buffer]
        if dt not in ("float32", "float64") or any(self.dtypes[x] != dt for x in names):
            return False
        n = _fold_int(self.fold(f.extent, env))
        if (
            n is None
            or n != _fold_int(self.fold(ss.length, env))
            or _fold_int(self.fold(ss.src_offset, env)) != 0
        ):
            return False
        sv = self.ex(self.fold(scale, env))
        if _promote(dt, False, sv.dtype, _weak(scale, sv)) != dt:
            return False
        sv = self.convert(sv, dt)
        if divide:
            sv = self.wrap(f"{self.const(1.0, dt).code} / {_p(sv, _MUL + 1)}", _MUL, dt)
        start = [substitute(x, {f.var: Const(0)}) for x in load.indices]
        src_off = flat_index(start, self.bufs[load.buffer].shape)
        direct = StreamStore(ss.buffer, ss.offset, load.buffer, src_off, Const(n), ss.nontemporal)
        self.emit_stream(direct, "_g_stream_scaled", sv.code, env, ind, in_prange)
        return True

    def emit_stream(
        self,
        s: StreamStore,
        helper: str,
        extra: str | None,
        env: dict[str, Expr],
        ind: int,
        in_prange: bool,
    ) -> None:
        """Emit ``helper(dst, offset, src, src_offset, length, nontemporal[, extra])`` for
        stream ``s``; the thread fences its streaming stores at the end of its parallel
        iteration (or of the kernel), see :meth:`loop` and :meth:`run`."""
        off, soff, n = (
            self.convert(self.ex(self.fold(e, env)), "int64").code
            for e in (s.offset, s.src_offset, s.length)
        )
        nt = self.convert(self.ex(self.fold(s.nontemporal, env)), "bool").code
        tail = "" if extra is None else f", {extra}"
        self.emit(
            f"{self.helper(helper)}({self.py[s.buffer]}, {off}, {self.py[s.src]}, "
            f"{soff}, {n}, {nt}{tail})",
            ind,
        )
        if not in_prange:
            self.fence_at_end = True

    def stmt(self, s: Stmt, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        if isinstance(s, For):
            self.for_(s, env, ind, in_prange)
        elif isinstance(s, Block):
            self.block(s, env, ind, in_prange)
        elif isinstance(s, If):
            cond = self.convert(self.ex(self.fold(s.cond, env)), "bool")
            if cond.code == "True":
                self.stmts(s.body, env, ind, in_prange)
            elif cond.code != "False":
                self.emit(f"if {cond.code}:", ind)
                self.body(s.body, env, ind + 1, in_prange)
        elif isinstance(s, Store):
            self.store(s, env, ind, in_prange)
        elif isinstance(s, Prefetch):
            if s.buffer not in self.bufs or self.scope(s.buffer) != "global":
                raise CodegenError(f"{self.where()}: prefetch of non-argument {s.buffer!r}")
            if s.level not in PREFETCH_HELPERS:
                raise CodegenError(f"{self.where()}: prefetch to cache level {s.level!r}")
            off = self.convert(self.ex(self.fold(s.offset, env)), "int64")
            fn = self.helper(PREFETCH_HELPERS[s.level])
            self.emit(f"{fn}({self.py[s.buffer]}, {off.code})", ind)
        elif isinstance(s, StreamStore):
            self.stream_store(s, env, ind, in_prange)
        else:
            raise CodegenError(f"{self.where()}: unknown statement {type(s).__name__}")

    def stream_store(self, s: StreamStore, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        """``_g_stream(dst, offset, src, src_offset, length, nontemporal)`` (see
        :meth:`emit_stream`)."""
        for name, want in ((s.buffer, "output"), (s.src, "local")):
            if name not in self.bufs:
                raise CodegenError(f"{self.where()}: stream of unknown buffer {name!r}")
            role = self.roles.get(name) if want == "output" else self.scope(name)
            if role != want:
                raise CodegenError(f"{self.where()}: stream needs a {want} buffer, {name!r} is not")
        if self.dtypes[s.buffer] != self.dtypes[s.src] or self.dtypes[s.src] == "float16":
            raise CodegenError(
                f"{self.where()}: stream from {s.src!r} to {s.buffer!r} needs one dtype "
                f"other than float16"
            )
        self.emit_stream(s, "_g_stream", None, env, ind, in_prange)

    def body(self, body: list[Stmt], env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        n = self.emitted()
        self.stmts(body, env, ind, in_prange)
        if self.emitted() == n:
            self.emit("pass", ind)

    def emitted(self) -> int:
        """Statements emitted in place so far (comments and bindings hoisted above a loop
        not counted): a body that gained none needs a ``pass``."""
        return len(self.lines) - self.n_hoisted - self.n_comments

    def for_(self, s: For, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        ext = self.fold(s.extent, env)
        n = _fold_int(ext)
        prange = s.kind == ForKind.PARALLEL and self.parallel and not in_prange
        unroll = (
            n is not None
            and not self.holds_nt(s)
            and (
                (s.kind == ForKind.UNROLLED and n <= MAX_UNROLL)
                or (
                    s.kind != ForKind.PARALLEL
                    and n <= MAX_REGISTER_UNROLL
                    and self.indexes_register(s)
                )
            )
        )
        self.guard_frames.append(None if prange else [])
        try:
            self.loop(s, env, ind, in_prange, prange, unroll, n, ext)
        finally:
            frame = self.guard_frames.pop()
        for name, dt in frame or []:  # NaN seen in the loop -> the result is NaN
            if name in self.quiet_regs:  # any value will do when the row held a NaN
                self.emit(f"{name} = {self.helper('_g_freeze')}({name})", ind)
                continue
            gty, inf_bits = _NAN_GUARD[dt]
            self.emit(f"if {self.guard_names[name]} > np.{gty}({inf_bits}):", ind)
            self.emit(f"{name} = np.{dt}(np.nan)", ind + 1)

    def nt_stores(self, s: For) -> list[tuple[Block, Store]]:
        """The non-temporal stores (:meth:`Schedule.store_nontemporal`) of the blocks directly
        in loop ``s``, when every statement there is a flat block without predicate that
        stores to no register; else none. A non-temporal store not found here prints as an
        ordinary store."""
        found: list[tuple[Block, Store]] = []
        for b in s.body:
            if (
                not isinstance(b, Block)
                or b.predicate is not None
                or any(isinstance(x, (For, Block)) for x in walk_stmts(b.body))
            ):
                return []
            for st in walk_stmts(b.body):
                if (
                    isinstance(st, Store)
                    and st.buffer in self.bufs
                    and self.scope(st.buffer) == "register"
                ):
                    return []
                if isinstance(st, Store) and st.nontemporal is not None:
                    found.append((b, st))
        return found

    def holds_nt(self, s: For) -> bool:
        """Whether loop ``s`` holds a store printed as a streaming one (see
        :meth:`plan_nontemporal`): it is then printed as a loop, never unrolled."""
        return bool(self.nt_on) and any(id(x) in self.nt_on for x in walk_stmts(s.body))

    def plan_nontemporal(self) -> tuple[set[int], Expr, list[str]]:
        """The non-temporal stores a chunked kernel's streaming body prints as streaming
        stores, the condition (over dims) under which that body runs, and the outputs
        whose arrays must start on a vector boundary for it (see "Chunked kernels").

        A store counts when it sits in a flat block directly in a vectorized loop ``L``
        (:meth:`nt_stores`) and every run of ``L`` starts on a cache line of the output:
        checked here again on the AST being printed (``line_aligned`` of the run's first
        element, tested at run time for symbolic shapes), whatever the schedule did after
        marking the store. Its flag joins the condition."""
        ids: set[int] = set()
        cond: Expr = Const(True, "bool")
        outs: list[str] = []
        dims = set(self.k.dims)
        for f in walk_stmts(self.k.body):
            if not isinstance(f, For) or f.kind is not ForKind.VECTORIZED:
                continue
            for b, st in self.nt_stores(f):
                dt = self.dtypes.get(st.buffer)
                if self.roles.get(st.buffer) != "output" or dt not in ("float32", "float64"):
                    raise CodegenError(
                        f"{self.where()}: non-temporal store to {st.buffer!r}, which is not "
                        f"a float32/float64 output"
                    )
                binds = {iv.name: x for iv, x in zip(b.iter_vars, b.bindings)}
                start = [substitute(substitute(i, binds), {f.var: Const(0)}) for i in st.indices]
                first = flat_index(start, self.bufs[st.buffer].shape)
                assert st.nontemporal is not None
                flag = and_flags(st.nontemporal, line_aligned(first, np.dtype(dt).itemsize, dims))
                if flag == Const(False, "bool"):
                    continue
                ids.add(id(st))
                cond = and_flags(cond, flag)
                if st.buffer not in outs:
                    outs.append(st.buffer)
        return ids, cond, outs

    def loop(
        self,
        s: For,
        env: dict[str, Expr],
        ind: int,
        in_prange: bool,
        prange: bool,
        unroll: bool,
        n: int | None,
        ext: Expr,
    ) -> None:
        if unroll:
            assert n is not None
            for k in range(n):
                self.stmts(s.body, {**env, s.var: Const(k)}, ind, in_prange)
            return
        v = self.ex(ext)
        if v.dtype not in _SINTS and v.dtype not in _UINTS:
            raise CodegenError(f"{self.where()}: loop {s.var!r} has extent of dtype {v.dtype}")
        var = self.names.fresh(s.var)
        frame = _HoistFrame(len(self.lines), ind, {var}, prange)
        chunked = prange and self.chunk_vars is not None
        if chunked:
            per_chunk = self.chunk_range(s, v, var, env, ind)
            frame.at = len(self.lines) - 1
        else:
            self.emit(f"for {var} in {'numba.prange' if prange else 'range'}({v.code}):", ind)
        inner = {**env, s.var: Var(var)}
        n_before = self.emitted()
        if prange and not (chunked and per_chunk):
            self.allocations(id(s), inner, ind + 1)
        self.hoist_frames.append(frame)
        try:
            self.stmts(s.body, inner, ind + 1, in_prange or prange)
        finally:
            self.hoist_frames.pop()
        # streamed stores must be fenced before the thread that made them finishes: once
        # after a chunk's share of the loop, or in every iteration of a prange (numba's
        # workers run the iterations). A fence per row cost softmax over rows of 128
        # floats half its time.
        streams = prange and any(
            isinstance(x, StreamStore) or (isinstance(x, Store) and id(x) in self.nt_on)
            for x in walk_stmts(s.body)
        )
        if streams and not chunked:
            self.emit(f"{self.helper('_g_sfence')}()", ind + 1)
        if self.emitted() == n_before:
            self.emit("pass", ind + 1)
        if streams and chunked:
            self.emit(f"{self.helper('_g_sfence')}()", ind)

    def chunk_range(self, s: For, ext: _V, var: str, env: dict[str, Expr], ind: int) -> bool:
        """The loop header of a chunked kernel's parallel loop: this chunk's share of
        its iterations (nothing to do for an empty share), then the temps private to an
        iteration, allocated once per chunk (as numba hoists them into each thread's
        share of a prange) unless a shape depends on the loop variable, then the
        ``for``. Returns whether the temps were allocated here."""
        assert self.chunk_vars is not None
        c, cs = self.chunk_vars
        e = _p(ext, _MUL)
        lo, hi = self.names.fresh(f"{var}_lo"), self.names.fresh(f"{var}_hi")
        self.emit(f"{lo} = {e} * {c} // {cs}", ind)
        self.emit(f"{hi} = {e} * ({c} + 1) // {cs}", ind)
        self.emit(f"if {lo} >= {hi}:", ind)
        self.emit("return", ind + 1)
        per_chunk = not any(
            s.var in _free(d)
            for name, site in self.alloc_site.items()
            if site == id(s)
            for d in self.bufs[name].shape
        )
        if per_chunk:
            self.allocations(id(s), env, ind)
        self.emit(f"for {var} in range({lo}, {hi}):", ind)
        return per_chunk

    def indexes_register(self, loop: For) -> bool:
        """Does the loop body index a multi-element register buffer with ``loop.var``?"""
        regs = {n for n, b in self.bufs.items() if self.scope(n) == "register" and _size(b) != 1}
        if not regs:
            return False
        dep = {loop.var}

        def visit(stmts: list[Stmt]) -> bool:
            for s in stmts:
                if isinstance(s, Block):
                    for iv, bind in zip(s.iter_vars, s.bindings):
                        if _free(bind) & dep:
                            dep.add(iv.name)
                exprs: list[Expr] = []
                if isinstance(s, Store):
                    if s.buffer in regs and any(_free(i) & dep for i in s.indices):
                        return True
                    exprs = [s.value]
                elif isinstance(s, If):
                    exprs = [s.cond]
                elif isinstance(s, Block) and s.predicate is not None:
                    exprs = [s.predicate]
                for ex in exprs:
                    for x in walk(ex):
                        if (
                            isinstance(x, Load)
                            and x.buffer in regs
                            and any(_free(i) & dep for i in x.indices)
                        ):
                            return True
                if isinstance(s, (For, Block, If)) and visit(s.body):
                    return True
            return False

        return visit(loop.body)

    def block(self, s: Block, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        if len(s.iter_vars) != len(s.bindings):
            raise CodegenError(
                f"{self.where()}: block {s.name!r} binds {len(s.bindings)} "
                f"expressions to {len(s.iter_vars)} iteration variables"
            )
        self.emit(f"# block {s.name}", ind)
        self.n_comments += 1
        inner = dict(env)
        for iv, bind in zip(s.iter_vars, s.bindings):
            e = self.fold(bind, env)
            if isinstance(e, (Const, Var)):
                inner[iv.name] = e
            else:
                inner[iv.name] = Var(self.binding(iv.name, e, ind))
        if s.predicate is not None:
            cond = self.convert(self.ex(self.fold(s.predicate, inner)), "bool")
            if cond.code == "False":
                return
            if cond.code != "True":
                self.emit(f"if {cond.code}:", ind)
                self.body(s.body, inner, ind + 1, in_prange)
                return
        self.stmts(s.body, inner, ind, in_prange)

    def binding(self, iv: str, e: Expr, ind: int) -> str:
        """Emit iteration variable ``iv = e`` (``e`` folded to Python names) and return its
        name. A load-free ``e`` that uses nothing the innermost serial loop defines is
        computed once before that loop instead (once per distinct expression), so row
        indices of a row's passes are not recomputed per element; index arithmetic never
        faults (the division helpers return 0 for a zero divisor), so computing it when
        the loop runs no iteration is harmless."""
        n = self.emitted()
        v = self.ex(e)
        frame = self.hoist_frames[-1] if self.hoist_frames else None
        if (
            frame is None
            or frame.prange
            or self.emitted() != n
            or any(isinstance(x, Load) for x in walk(e))
            or _free(e) & frame.defined
        ):
            name = self.names.fresh(iv)
            self.emit(f"{name} = {v.code}", ind)
            if frame is not None:
                frame.defined.add(name)
            return name
        if v.code not in frame.cse:
            frame.cse[v.code] = self.names.fresh(iv)
            self.lines.insert(frame.at, "    " * frame.ind + f"{frame.cse[v.code]} = {v.code}")
            frame.at += 1
            self.n_hoisted += 1
        return frame.cse[v.code]

    def store(self, s: Store, env: dict[str, Expr], ind: int, in_prange: bool) -> None:
        if s.buffer not in self.bufs:
            raise CodegenError(f"{self.where()}: store to unknown buffer {s.buffer!r}")
        if self.roles[s.buffer] == "input":
            raise CodegenError(f"{self.where()}: store to input buffer {s.buffer!r}")
        dt = self.dtypes[s.buffer]
        sc = self.scope(s.buffer)
        indices = tuple(self.fold(i, env) for i in s.indices)
        if sc == "register" and s.buffer in self.guarded:
            self.guarded_store(s, env, ind, dt, indices)
            return
        value = self.ex(self.fold(s.value, env))
        if sc == "register":
            name = self.register_name(s.buffer, indices)
            self.emit(f"{name} = {self.convert(value, dt).code}", ind)
            return
        if id(s) in self.nt_on:  # the streaming body (see plan_nontemporal)
            off = self.ex(self.fold(flat_index(s.indices, self.bufs[s.buffer].shape), env))
            code = self.convert(value, dt).code
            self.emit(f"{self.helper('_g_ntstore')}({self.py[s.buffer]}, {off.code}, {code})", ind)
            self.fence_at_end = self.fence_at_end or not in_prange  # else fenced per chunk
            return
        target = self.subscript(s.buffer, indices)
        if dt == "float16" and sc == "global":
            if value.dtype not in ("float32", "float64", "float16"):
                value = self.convert(value, "float16")
            code = _call(self.helper("_g_f2h"), value)
        else:
            code = self.convert(value, dt).code
        self.emit(f"{target} = {code}", ind)

    def guarded_store(
        self, s: Store, env: dict[str, Expr], ind: int, dt: str, indices: tuple[Expr, ...]
    ) -> None:
        """A store to a register of :meth:`find_guarded` (see there)."""
        name = self.register_name(s.buffer, indices)
        upd = self.minmax_update(s)
        frame = self.guard_frames[-1] if self.guard_frames else None
        gty, _ = _NAN_GUARD[dt]
        quiet = self.bufs[s.buffer].nan_insensitive  # no guard: see geode.codegen.nan_flow
        if upd and frame is not None and name in self.guard_names:
            op, other = upd
            v = self.convert(self.ex(self.fold(other, env)), dt)
            tmp = self.names.fresh(name + "_v")
            guard = self.guard_names[name]
            fn = self.helper("_g_maxnum_nn" if op == "max" else "_g_minnum_nn")
            self.emit(f"{tmp} = {v.code}", ind)
            self.emit(f"{name} = {fn}({name}, {tmp})", ind)
            if not quiet:
                self.emit(f"{guard} = {self.helper('_g_nanguard')}({guard}, {tmp})", ind)
            if (name, dt) not in frame:
                frame.append((name, dt))
            return
        value = self.convert(self.ex(self.fold(s.value, env)), dt)
        self.emit(f"{name} = {value.code}", ind)
        if not upd:  # an initialisation: (re)start the guard
            guard = self.guard_names.setdefault(name, self.names.fresh(name + "_nan"))
            if quiet:
                self.quiet_regs.add(name)
            else:
                self.emit(f"{guard} = np.{gty}(0)", ind)

    # -- allocation ------------------------------------------------------------------
    def plan_allocations(self) -> None:
        """Where each local array is allocated (see the module docstring)."""
        sites: dict[str, set[int | None]] = {}

        def note(name: str, site: int | None) -> None:
            if name in self.bufs and self.scope(name) == "local":
                sites.setdefault(name, set()).add(site)

        def visit(stmts: list[Stmt], site: int | None, in_par: bool) -> None:
            for s in stmts:
                if isinstance(s, Store):
                    note(s.buffer, site)
                elif isinstance(s, StreamStore):
                    note(s.src, site)
                exprs: list[Expr] = []
                if isinstance(s, Store):
                    exprs = [*s.indices, s.value]
                elif isinstance(s, If):
                    exprs = [s.cond]
                elif isinstance(s, Block):
                    exprs = list(s.bindings) + ([s.predicate] if s.predicate is not None else [])
                for ex in exprs:
                    for x in walk(ex):
                        if isinstance(x, Load):
                            note(x.buffer, site)
                if isinstance(s, For):
                    par = s.kind == ForKind.PARALLEL and self.parallel and not in_par
                    visit(s.body, id(s) if par else site, in_par or par)
                elif isinstance(s, (Block, If)):
                    visit(s.body, site, in_par)

        visit(self.k.body, None, False)
        for name in self.bufs:
            if self.scope(name) != "local":
                continue
            found = sites.get(name, {None})
            self.alloc_site[name] = next(iter(found)) if len(found) == 1 else None

    def allocations(self, site: int | None, env: dict[str, Expr], ind: int) -> None:
        for name, at in self.alloc_site.items():
            if at != site:
                continue
            b = self.bufs[name]
            dims = [self.ex(self.fold(d, env)).code for d in b.shape]
            shape = "1" if not dims else (dims[0] + "," if len(dims) == 1 else ", ".join(dims))
            carrier = (
                "np.float32" if self.dtypes[name] == "float16" else _np_ctor(self.dtypes[name])
            )
            self.emit(f"{self.py[name]} = np.empty(({shape}), dtype={carrier})", ind)

    # -- the module ------------------------------------------------------------------
    def run(self) -> _Emitted:
        k = self.k
        env: dict[str, Expr] = {}
        args: list[str] = []
        sig: list[str] = []
        half: list[int] = []
        zero_d: list[int] = []
        arrays: list[tuple[str, str, str, int]] = []
        pos = 0
        for role, group in (("input", k.inputs), ("output", k.outputs)):
            for b in group:
                py = self.names.fresh(b.name)
                self.py[b.name] = py
                args.append(py)
                dt = self.dtypes[b.name]
                ro = ", readonly=True" if role == "input" else ""
                shape = ", ".join(_shape_text(d) for d in b.shape)
                note = " (float16 bits)" if dt == "float16" else ""
                sig.append(
                    f'    _t.Array({_nb_scalar(dt)}, {max(len(b.shape), 1)}, "C"{ro}),'
                    f"  # {b.name}: {role} {dt}[{shape}]{note}"
                )
                if dt == "float16":
                    half.append(pos)
                if not b.shape:
                    zero_d.append(pos)
                arrays.append((b.name, role, dt, len(b.shape)))
                pos += 1
        for d in k.dims:
            py = self.names.fresh(d)
            env[d] = Var(py)
            args.append(py)
            sig.append(f"    _t.int64,  # {d}")
        for b in k.temps:
            if self.scope(b.name) == "local":
                self.py[b.name] = self.names.fresh(b.name)
        has_par = any(isinstance(s, For) and s.kind == ForKind.PARALLEL for s in walk_stmts(k.body))
        self.parallel = self.parallel and has_par
        self.plan_allocations()

        chunked = self.parallel and _chunkable(k)
        checks = self.shape_checks(env)
        body_start = len(self.lines)
        entry: list[str] = []
        unpack: list[str] = []
        rows_name = body_name = None
        nt_ids: set[int] = set()
        nt_name = nt_rows_name = None
        rows_params: list[str] = []
        if chunked:
            rows_name = self.names.fresh(f"{self.func_name}_rows")
            body_name = self.names.fresh(f"{self.func_name}_body")
            argv, chunk, chunks, rows, threads = (
                self.names.fresh(n) for n in ("argv", "chunk", "chunks", "rows", "threads")
            )
            self.chunk_vars = (chunk, chunks)
            nt_ids, nt_cond, nt_outs = self.plan_nontemporal()
            test = None
            if nt_ids:
                nt_name = self.names.fresh(f"{self.func_name}_body_nt")
                nt_rows_name = self.names.fresh(f"{self.func_name}_rows_nt")
                tests = [
                    self.convert(self.ex(self.fold(t, env)), "bool") for t in conjuncts(nt_cond)
                ]
                test = " and ".join(
                    [_p(t, _CMP) for t in tests]
                    + [f"{self.helper('_g_vector_start')}({self.py[o]}, 0)" for o in nt_outs]
                )
            rows_params = [rows] if test is None else [rows, self.names.fresh("rows_nt")]
            entry = self.chunk_entry(checks, args, argv, rows_params, chunks, threads, test)
            unpack = self.unpack_argv(args, env, argv)
            call = f"({', '.join([*args, chunk, chunks])})"
            sig.append(f"    _t.int64,  # {rows}: the address of {rows_name} (geode passes it)")
            if nt_rows_name is not None:
                sig.append(
                    f"    _t.int64,  # {rows_params[1]}: the address of {nt_rows_name}, "
                    "0 while not compiled (geode passes it)"
                )
            sig.append(f"    _t.int64,  # {chunks}: the launch's chunk count (geode passes it)")
            sig.append(
                f"    _t.int64,  # {threads}: the thread count, 0 for numba's (geode passes it)"
            )
        else:
            self.lines += checks
        self.dim_names = {env[d].name for d in k.dims}  # type: ignore[attr-defined]
        body = self.emit_body(env, body_start, set())
        nt_body = self.emit_body(env, len(self.lines), nt_ids) if chunked and nt_ids else []

        flags = FASTMATH_FLAGS if self.fastmath else DEFAULT_FLAGS
        fm = "{" + ", ".join(repr(f) for f in sorted(flags)) + "}"
        head = [
            f"# geode kernel {k.name}: generated by geode.codegen.backends.numba, do not edit",
            "import math",
            "",
            "import numba",
            "import numpy as np",
            "from numba import types as _t",
            "",
        ]
        if self.helpers:
            head.append(
                f"from geode.codegen.backends.numba import {', '.join(sorted(self.helpers))}"
            )
            head.append("")
        if self.vmath:
            head.append(f"from geode.codegen.backends.vmath import {', '.join(sorted(self.vmath))}")
            head.append("")
        head += ["SIGNATURE = (", *sig, ")"]
        interleave = max(
            (
                s.interleave
                for s in walk_stmts(k.body)
                if isinstance(s, For) and s.kind == ForKind.VECTORIZED
            ),
            default=1,
        )
        if interleave > 1:
            head.append(f"INTERLEAVE = {interleave}  # LLVM's interleave count for this kernel")
        head.append(
            f'NJIT_OPTIONS = {{"parallel": {self.parallel and not chunked}, "fastmath": {fm}, '
            f'"nogil": True, "cache": True, "boundscheck": False, "error_model": "numpy"}}'
        )
        if chunked:
            c, cs = self.chunk_vars  # type: ignore[misc]
            params = ", ".join([*args, *rows_params, cs, threads])
            lines = [*head, "", "", f"def {self.func_name}({params}):"]
            lines += [*entry, "", "", f"def {rows_name}({argv}, {c}, {cs}):", *unpack]
            lines.append(f"    {body_name}{call}")
            if nt_body:
                lines += ["", "", f"def {nt_rows_name}({argv}, {c}, {cs}):", *unpack]
                lines.append(f"    {nt_name}{call}")
            lines += ["", "", f"def {body_name}({', '.join([*args, c, cs])}):", *body]
            if nt_body:
                lines += ["", "", f"def {nt_name}({', '.join([*args, c, cs])}):", *nt_body]
        else:
            lines = [*head, "", "", f"def {self.func_name}({', '.join(args)}):", *body]
        source = "\n".join(lines) + "\n"
        return _Emitted(
            source,
            self.func_name,
            self.parallel,
            half,
            zero_d,
            arrays,
            list(k.dims),
            rows_name,
            body_name,
            nt_name if nt_body else None,
            nt_rows_name if nt_body else None,
            tuple(sorted(self.vmath.items())),
        )

    def emit_body(self, env: dict[str, Expr], start: int, nt: set[int]) -> list[str]:
        """Print the kernel's statements after line ``start`` (the shape checks of an
        unchunked kernel) and return those lines: the entry's temps, then the loops,
        with the stores of ``nt`` as streaming stores (see :meth:`plan_nontemporal`).
        Each call starts afresh what one function's body holds (its dims-only terms, NaN
        guards, end fence), so a chunked kernel can print a second body."""
        self.dim_terms, self.in_dim_term = {}, set()
        self.guard_names, self.quiet_regs = {}, set()
        self.fence_at_end, self.nt_on = False, nt
        self.allocations(None, env, 1)
        self.prologue_at = len(self.lines)
        self.stmts(self.k.body, env, 1, False)
        if self.fence_at_end:
            self.emit(f"{self.helper('_g_sfence')}()", 1)
        if len(self.lines) == start:
            self.emit("pass", 1)
        body = self.lines[start:]
        del self.lines[start:]
        self.nt_on = set()
        return body

    def shape_checks(self, env: dict[str, Expr]) -> list[str]:
        """The entry's lines checking every argument's shape (``ValueError`` naming it)."""
        k, out = self.k, []
        for b in (*k.inputs, *k.outputs):
            py = self.py[b.name]
            if not b.shape:
                out.append(f"    if {py}.shape[0] != 1:")
                msg = f"kernel {k.name}: argument {b.name} must hold exactly one element"
                out.append(f"        raise ValueError({msg!r})")
                continue
            conds = []
            for axis, d in enumerate(b.shape):
                v = self.ex(self.fold(d, env))
                conds.append(f"{py}.shape[{axis}] != {_p(v, _CMP + 1)}")
            want = ", ".join(_shape_text(d) for d in b.shape)
            out.append(f"    if {' or '.join(conds)}:")
            msg = f"kernel {k.name}: argument {b.name} must have shape ({want}{',' if len(b.shape) == 1 else ''})"
            out.append(f"        raise ValueError({msg!r})")
        return out

    def chunk_entry(
        self,
        checks: list[str],
        args: list[str],
        argv: str,
        rows: list[str],
        chunks: str,
        threads: str,
        nt_test: str | None,
    ) -> list[str]:
        """A chunked kernel's entry: the shape checks, ``argv`` (the arrays' addresses,
        then the dims) and the shared launcher, which runs the chunk function at address
        ``rows[0]`` in ``chunks`` chunks on ``threads`` threads (0: numba's setting).

        With a streaming body, ``rows`` also names the streaming chunk function's
        address, launched instead when ``nt_test`` holds. Either address may be 0 (a
        chunk function compiled on first need, see "Chunked kernels"): the entry then
        returns 1 (the plain one is needed) or 2 (the streaming one) without running
        anything; it returns 0 after a launch (and nothing, without a streaming body)."""
        n_arrays = len(self.k.inputs) + len(self.k.outputs)
        out = [*checks, f"    {argv} = np.empty({len(args)}, dtype=np.int64)"]
        for i, a in enumerate(args):
            val = f"{self.helper('_g_addr')}({a})" if i < n_arrays else a
            out.append(f"    {argv}[{i}] = {val}")
        launch = self.helper("_g_launch")
        if nt_test is None:
            out.append(f"    {launch}({rows[0]}, {argv}, {chunks}, {threads})")
            return out
        for lead, addr, need in ((f"if {nt_test}:", rows[1], 2), ("else:", rows[0], 1)):
            out += [f"    {lead}", f"        if {addr} == 0:", f"            return {need}"]
            out.append(f"        {launch}({addr}, {argv}, {chunks}, {threads})")
        out.append("    return 0")
        return out

    def unpack_argv(self, args: list[str], env: dict[str, Expr], argv: str) -> list[str]:
        """The chunk function's lines: dims, then each array rebuilt from its address."""
        k, out = self.k, []
        bufs = (*k.inputs, *k.outputs)
        for i in range(len(bufs), len(bufs) + len(k.dims)):
            out.append(f"    {args[i]} = {argv}[{i}]")
        for i, b in enumerate(bufs):
            dt = self.dtypes[b.name]
            carrier = {"float16": "np.uint16", "bool": "np.bool_"}.get(dt, f"np.{dt}")
            # shapes use dims only (never hoisted terms), printed from the buffer's shape
            dims = [_p(self.ex(self.fold(d, env)), _CMP + 1) for d in b.shape] or ["1"]
            shape = dims[0] + "," if len(dims) == 1 else ", ".join(dims)
            ptr = f"{self.helper('_g_ptr')}({argv}[{i}], {carrier})"
            out.append(f"    {args[i]} = numba.carray({ptr}, ({shape}))")
        return out


def _weak(e: Expr, v: _V) -> bool:
    return isinstance(e, Const) and v.dtype in _WEAK


def _free(e: Expr) -> set[str]:
    return {x.name for x in walk(e) if isinstance(x, Var)}


def _size(b: Buffer) -> int | None:
    size = 1
    for d in b.shape:
        n = _fold_int(_fold_consts(d))
        if n is None:
            return None
        size *= n
    return size


_INT_FOLD: dict[str, Callable[[int, int], int | None]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b if b else None,
    "%": lambda a, b: a % b if b else None,
    "min": min,
    "max": max,
}


def _fold_consts(e: Expr) -> Expr:
    """Fold int64 arithmetic on constants (index expressions after unrolling)."""

    def fn(x: Expr) -> Expr | None:
        if (
            isinstance(x, Bin)
            and x.op in _INT_FOLD
            and isinstance(x.a, Const)
            and isinstance(x.b, Const)
            and x.a.dtype == x.b.dtype == "int64"
        ):
            r = _INT_FOLD[x.op](int(x.a.value), int(x.b.value))
            if r is not None and -(2**63) <= r < 2**63:
                return Const(r, "int64")
        return None

    return transform(e, fn)


def _shape_text(d: Expr) -> str:
    from geode.codegen.ast import expr_str

    return expr_str(d)


def _has_parallel(kernel: Kernel) -> bool:
    return any(isinstance(s, For) and s.kind == ForKind.PARALLEL for s in walk_stmts(kernel.body))


def _chunkable(kernel: Kernel) -> bool:
    """Can the kernel run chunked (see "Chunked kernels")? Its one top-level parallel
    loop is its only top-level loop, and every other top-level statement only computes
    values (no store), so each chunk may run them itself."""
    par = [s for s in kernel.body if isinstance(s, For) and s.kind == ForKind.PARALLEL]
    return len(par) == 1 and not any(
        isinstance(x, (Store, StreamStore, For))
        for s in kernel.body
        if s is not par[0]
        for x in walk_stmts([s])
    )


@dataclass
class _HoistFrame:
    """A loop being emitted: the line index of its ``for`` (where hoisted bindings go,
    advanced past each), its indentation, the Python names its body defines, whether it
    is a prange, and the hoisted bindings by code."""

    at: int
    ind: int
    defined: set[str]
    prange: bool
    cse: dict[str, str] = field(default_factory=dict)


def _emit(kernel: Kernel, fastmath: bool, parallel: bool | None) -> _Emitted:
    par = _has_parallel(kernel) if parallel is None else bool(parallel)
    demoted: set[str] = set()
    while True:
        try:
            return _Emitter(kernel, fastmath, par, demoted).run()
        except _Demote as d:
            if d.buffer in demoted:  # pragma: no cover - defensive
                raise CodegenError(
                    f"kernel {kernel.name!r}: cannot place register {d.buffer!r}"
                ) from None
            demoted.add(d.buffer)


def emit_source(kernel: Kernel, fastmath: bool = False, parallel: bool | None = None) -> str:
    """The Python source of one numba function computing ``kernel``.

    The text is a complete module: imports, ``SIGNATURE`` (the numba argument types,
    inputs read-only), ``NJIT_OPTIONS`` and the function (with its chunk function and
    body, for a chunked kernel: see "Chunked kernels"). ``parallel=None`` compiles
    parallel loops in parallel when the kernel has any; ``False`` prints them as
    ``range``. Raises :class:`CodegenError` naming the kernel for anything the backend
    cannot express.
    """
    return _emit(kernel, fastmath, parallel).source


# ---------------------------------------------------------------------------------
# compiling
# ---------------------------------------------------------------------------------


class NumbaKernel:
    """A compiled kernel: call it as ``kernel(*inputs, *outputs, *dims)``.

    ``fn`` is the numba dispatcher (compiled for exactly one signature; compiling
    more is disabled so a wrong dtype or rank raises ``TypeError``); ``__call__``
    adapts float16 arrays (uint16 views) and 0-d arrays (1-element views), then
    calls it. A chunked kernel (``chunked``; see "Chunked kernels") also has
    ``rows``, the chunk function compiled with it (a numba ``cfunc``); ``fn`` then takes
    ``launch_args`` (the chunk functions' addresses, the chunk count and the thread
    count, 0: numba's setting) after the dims, which ``__call__`` passes with its
    ``threads`` keyword as the thread count (the threads the launch runs on, set for the
    calling thread as ``numba.set_num_threads`` would, in compiled code). A kernel with a
    streaming body compiles its plain chunk function on the first call that needs it
    (``__call__``: the entry reports it, see :meth:`_Emitter.chunk_entry`), through a
    cache entry of its own. ``source`` is the generated module, ``llvm``/``asm``
    numba's optimised IR and machine code (computed on first access; a chunked kernel's
    chunk functions first, then its entry), ``compile_seconds`` the wall time of
    :func:`compile_kernel` plus that of any chunk function compiled later,
    ``from_cache`` whether the machine code :func:`compile_kernel` returned came from the
    disk cache.
    """

    def __init__(
        self,
        name: str,
        fn: Any,
        emitted: _Emitted,
        key: str,
        seconds: float,
        from_cache: bool,
        fastmath: bool,
        cache_path: str | None,
        compile_rows: Callable[[str], Any],
    ) -> None:
        self.name = name
        self.fn = fn
        self.source = emitted.source
        self.func_name = emitted.func_name
        self.parallel = emitted.parallel
        self.fastmath = fastmath
        self.key = key
        self.compile_seconds = seconds
        self.from_cache = from_cache
        self.cache_path = cache_path
        self.signature = fn.signatures[0]
        self._half = tuple(emitted.half_args)
        self._zero_d = tuple(emitted.zero_d_args)
        self._adapt = bool(self._half or self._zero_d)
        self._arrays = tuple(emitted.arrays)
        self._dims = tuple(emitted.dims)
        self.rows = getattr(fn, "__geode_rows__", None)
        #: a chunked kernel's chunk functions by name: the compiled cfunc, or None until
        #: the first call that needs it (see "Chunked kernels")
        self._chunk_fns: dict[str, Any] = {}
        if self.rows is not None:
            names = [emitted.rows_name, *([emitted.nt_rows_name] if emitted.nt_rows_name else [])]
            self._chunk_fns = {n: None for n in names}
            self._chunk_fns[emitted.nt_rows_name or emitted.rows_name] = self.rows
        self._compile_rows = compile_rows
        self._rows_lock = threading.Lock()
        self._rows_error: CodegenError | None = None
        #: what ``fn`` takes after the dims: a chunked kernel's (chunk functions'
        #: addresses, 0 for one not compiled yet; chunk count; thread count 0: numba's
        #: setting), else nothing
        self.launch_args = self._launch_args()

    def _launch_args(self) -> tuple[int, ...]:
        if self.rows is None:
            return ()
        addrs = tuple(0 if f is None else f.address for f in self._chunk_fns.values())
        return (*addrs, launch_chunks(), 0)

    def _compile_missing(self, name: str) -> None:
        """Compile the chunk function ``name`` if it is not yet, once, whichever thread
        asks first; a failure is remembered and raised again at every later need."""
        with self._rows_lock:
            if self._chunk_fns[name] is not None:
                return
            if self._rows_error is not None:
                raise self._rows_error
            t0 = time.perf_counter()
            try:
                self._chunk_fns[name] = self._compile_rows(name)
            except CodegenError as exc:
                self._rows_error = exc
                raise
            self.compile_seconds += time.perf_counter() - t0
            self.launch_args = self._launch_args()
            log.debug("kernel %s: compiled %s on first need", self.name, name)

    def compile_chunk_functions(self) -> None:
        """Compile now the chunk functions a chunked kernel left for first need (see
        "Chunked kernels"; nothing to do for other kernels): for a warm-up ahead of the
        first call. Raises :class:`CodegenError` if that compile fails."""
        for name in list(self._chunk_fns):
            self._compile_missing(name)

    @property
    def chunked(self) -> bool:
        """Is this a chunked kernel (see "Chunked kernels")?"""
        return self.rows is not None

    def __call__(self, *args: Any, threads: int = 0) -> None:
        """Run the kernel on ``(*inputs, *outputs, *dims)``; outputs are written in place.
        ``threads`` (a chunked kernel's launch; 1 to ``NUMBA_NUM_THREADS``, 0 for numba's
        current setting) is ignored by other kernels, which run on numba's setting."""
        given = args
        if self._adapt:
            if len(args) != len(self._arrays) + len(self._dims):
                self._coerce(args)  # raises, naming what was expected
            lst = list(args)
            for i in self._zero_d:
                a = lst[i]
                if isinstance(a, np.ndarray) and a.ndim == 0:
                    lst[i] = a.reshape(1)
            for i in self._half:
                a = lst[i]
                if isinstance(a, np.ndarray) and a.dtype == np.float16:
                    lst[i] = a.view(np.uint16)
            args = tuple(lst)
        launch = (*self.launch_args[:-1], threads) if self.launch_args else ()
        try:
            need = self.fn(*args, *launch)
        except TypeError:
            args = tuple(self._coerce(given))  # from the caller's arrays (float16 ones)
            need = self.fn(*args, *launch)
        if need:  # a chunk function not compiled yet: the entry ran nothing
            self._compile_missing(list(self._chunk_fns)[need - 1])  # raises if it fails
            self.fn(*args, *self.launch_args[:-1], threads)

    def _coerce(self, args: tuple[Any, ...]) -> list[Any]:
        """Slow path after a signature mismatch: make inputs C-contiguous, or explain."""
        arrays, dims = self._arrays, self._dims
        if len(args) != len(arrays) + len(dims):
            raise TypeError(
                f"kernel {self.name}: expected {len(arrays)} arrays "
                f"({', '.join(a[0] for a in arrays)}) and {len(dims)} dims "
                f"({', '.join(dims)}), got {len(args)} arguments"
            )
        out: list[Any] = []
        for a, (name, role, dtype, ndim) in zip(args, arrays):
            want = np.dtype(dtype)
            if not isinstance(a, np.ndarray) or a.dtype != want or max(a.ndim, 1) != max(ndim, 1):
                got = f"{a.dtype}[{a.ndim}-d]" if isinstance(a, np.ndarray) else type(a).__name__
                raise TypeError(
                    f"kernel {self.name}: argument {name} must be a {dtype} array "
                    f"of rank {ndim}, got {got}"
                )
            if not a.flags.c_contiguous:
                if role == "output":
                    raise TypeError(f"kernel {self.name}: output {name} must be C-contiguous")
                a = np.ascontiguousarray(a)
            if a.ndim == 0:
                a = a.reshape(1)
            if dtype == "float16":
                a = a.view(np.uint16)
            out.append(a)
        for d, name in zip(args[len(arrays) :], dims):
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
                raise TypeError(f"kernel {self.name}: dim {name} must be an int, got {d!r}")
            out.append(int(d))
        return out

    @functools.cached_property
    def _inspectable(self) -> tuple[Any, list[Any]]:
        """(entry dispatcher, chunk cfuncs) holding LLVM IR: numba keeps none for code
        loaded from its cache, so that is recompiled in memory, as is a chunk function
        not compiled yet."""
        module, options = self.fn.__geode_module__, self.fn.__geode_options__
        entry_cached = sum(self.fn.stats.cache_hits.values()) > 0
        with _numba_compile_settings(self.fn.__geode_interleave__):
            # a cfunc loaded from the cache (cache_hits) holds no IR either
            rows = [
                f
                if f is not None and not f.cache_hits
                else _compile_rows(module.__dict__[name], options, None)
                for name, f in self._chunk_fns.items()
            ]
            if not entry_cached:
                return self.fn, rows
            fn = numba.njit(**options)(self.fn.py_func)
            fn.compile(self.signature)
        return fn, rows

    @functools.cached_property
    def llvm(self) -> str:
        """numba's optimised LLVM IR for the kernel (recompiled if it came from the cache)."""
        fn, rows = self._inspectable
        return "\n".join([*(r.inspect_llvm() for r in rows), str(fn.inspect_llvm(self.signature))])

    @functools.cached_property
    def asm(self) -> str:
        """The kernel's machine code as assembly (recompiled if it came from the cache)."""
        fn, rows = self._inspectable
        parts = [r._library.get_asm_str() for r in rows]
        return "\n".join([*parts, str(fn.inspect_asm(self.signature))])

    def __repr__(self) -> str:
        how = "cached" if self.from_cache else f"{self.compile_seconds:.2f}s"
        return f"<NumbaKernel {self.name} ({how}{', parallel' if self.parallel else ''})>"


@contextlib.contextmanager
def _numba_compile_settings(interleave: int = 1) -> Iterator[None]:
    """Hold numba's compiler lock and turn SLP vectorization on for our compile only;
    with ``interleave > 1`` also force LLVM's vector interleave count to it (reset to 0,
    LLVM's own choice, afterwards)."""
    import llvmlite.binding as llvm
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        old = config.SLP_VECTORIZE
        config.SLP_VECTORIZE = int(SLP_VECTORIZE)
        if interleave > 1:
            llvm.set_option("geode", f"-force-vector-interleave={int(interleave)}")
        try:
            yield
        finally:
            config.SLP_VECTORIZE = old
            if interleave > 1:
                llvm.set_option("geode", "-force-vector-interleave=0")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _compile_error(kernel: Kernel, exc: BaseException, source: str, filename: str) -> CodegenError:
    text = _ANSI.sub("", str(exc))
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    msg = f"numba failed to compile kernel {kernel.name!r}: {type(exc).__name__}: {first}"
    lines = source.splitlines()
    hits = re.findall(r'File "([^"]*)", line (\d+)', text)
    numbers = [
        int(n)
        for f, n in hits
        if f == filename or os.path.basename(f) == os.path.basename(filename)
    ]
    if not numbers:
        # e.g. "NameError: name 'acc' is not defined" comes without a location
        m = re.search(r"name '(\w+)' is not defined", text)
        if m:
            pat = re.compile(rf"\b{re.escape(m.group(1))}\b")
            start = next((i for i, ln in enumerate(lines) if ln.startswith("def ")), 0)
            numbers = [i + 1 for i in range(start, len(lines)) if pat.search(lines[i])][:1]
    if numbers:
        n = numbers[-1]
        if 1 <= n <= len(lines):
            msg += f"\n  generated source line {n}: {lines[n - 1].strip()}"
    return CodegenError(msg)


_memo: dict[tuple[str, str | None], NumbaKernel] = {}
_memo_lock = threading.Lock()
_key_locks: dict[tuple[str, str | None], threading.Lock] = {}


class _Loaded(NamedTuple):
    """A kernel module loaded for compiling: the module, its cache entry (None: compile
    in memory), the file name numba reports, the njit options and interleave count."""

    module: Any
    entry: Any
    filename: str
    options: dict[str, Any]
    interleave: int


def _load(kernel: Kernel, emitted: _Emitted, key: str, cache_dir: str | None) -> _Loaded:
    """Prepare ``key``'s cache entry (when ``cache_dir`` is set) and import the kernel's
    module from it (or from memory), with its bodies wrapped as ``noalias`` dispatchers."""
    entry = None
    module_name = f"geode_k_{key[:32]}"
    filename = f"<geode kernel {kernel.name} {key[:12]}>"
    if cache_dir is not None:
        try:
            entry = _cache.prepare_entry(cache_dir, key, emitted.source)
            module_name, filename = entry.module_name, str(entry.module_path)
        except OSError as exc:
            log.warning(
                "kernel cache %s unusable (%s): compiling %s in memory", cache_dir, exc, kernel.name
            )
    try:
        module = _cache.load_module(emitted.source, module_name, filename)
        options = dict(module.NJIT_OPTIONS)
        interleave = int(getattr(module, "INTERLEAVE", 1))
        # numba's FunctionCache is attached by the caller, pinned to the cache entry
        options["cache"] = False
    except CodegenError:
        raise
    except Exception as exc:
        raise _compile_error(kernel, exc, emitted.source, filename) from exc
    for name in (emitted.body_name, emitted.nt_body_name):
        if name:
            # a module loaded before (same source) already holds the dispatcher
            body = module.__dict__[name]
            module.__dict__[name] = _noalias_njit(getattr(body, "py_func", body), options)
    return _Loaded(module, entry, filename, options, interleave)


def _compile_loaded(
    kernel: Kernel,
    emitted: _Emitted,
    loaded: _Loaded,
    cache_dir: str | None,
    work: Callable[[Any], tuple[Any, bool]],
    launcher: bool = True,
) -> tuple[Any, Any, bool]:
    """Run ``work(entry)`` (compile through the cache entry, or in memory for None;
    returns its result and whether it came from the cache) under numba's compile
    settings, with the runtime helpers compiled first unless the entry is trusted. A
    trusted entry numba still cannot load is discarded and rebuilt; an entry that fails
    otherwise (a full disk...) is given up for an in-memory compile; a compile error is
    a :class:`CodegenError`. The entry is committed after a fresh compile. Returns
    ``(result, entry, from_cache)``. ``launcher=False``: the chunk launcher is not among the helpers
    (a chunk function compiled on its own does not call it)."""
    entry = loaded.entry
    while True:
        try:
            if not (entry is not None and entry.trusted):
                _compile_helpers(emitted, None if entry is None else cache_dir, launcher)
            with _numba_compile_settings(loaded.interleave):
                result, from_cache = work(entry)
        except Exception as exc:
            if entry is not None and entry.trusted:
                # verified files that numba still cannot load: never trust them again
                log.warning(
                    "kernel cache entry %s failed to load (%s): rebuilding", entry.directory, exc
                )
                _cache.discard_entry(entry)
                continue
            if entry is not None:
                # maybe the cache (a full disk...): a compile error fails again in memory
                log.debug("compiling %s with the disk cache failed: %s", kernel.name, exc)
                entry = None
                continue
            raise _compile_error(kernel, exc, emitted.source, loaded.filename) from exc
        break
    if entry is not None and not from_cache:
        try:
            _cache.commit_entry(entry)
        except OSError as exc:  # the kernel is fine; only the cache entry is lost
            log.warning("kernel cache entry %s not saved: %s", entry.directory, exc)
    return result, entry, from_cache


def _build(
    kernel: Kernel, emitted: _Emitted, key: str, cache_dir: str | None, fastmath: bool
) -> tuple[Any, bool, str | None]:
    loaded = _load(kernel, emitted, key, cache_dir)
    module, options = loaded.module, loaded.options
    py_func = module.__dict__[emitted.func_name]
    # a chunked kernel compiles its streaming chunk function when it has one (what
    # geode's large outputs run), else the plain one; the other on first need
    eager = emitted.nt_rows_name or emitted.rows_name
    if eager is not None:
        start_threads()  # before the entry's code is loaded: it resolves the pool's symbols

    def work(entry: Any) -> tuple[Any, bool]:
        rows = None if eager is None else _compile_rows(module.__dict__[eager], options, entry)
        fn = numba.njit(**options)(py_func)
        if entry is not None:
            _cache.attach_numba_cache(fn, entry)
        fn.compile(module.SIGNATURE)
        hit = sum(fn.stats.cache_hits.values()) > 0 and (rows is None or rows.cache_hits > 0)
        return (fn, rows), hit

    (fn, rows), entry, from_cache = _compile_loaded(kernel, emitted, loaded, cache_dir, work)
    fn.disable_compile()
    fn.__geode_rows__ = rows
    fn.__geode_module__ = module
    fn.__geode_options__ = options
    fn.__geode_interleave__ = loaded.interleave
    return fn, from_cache, (str(entry.directory) if entry is not None else None)


def _compile_lazy_rows(
    kernel: Kernel, emitted: _Emitted, key: str, cache_dir: str | None, name: str
) -> Any:
    """Compile the chunk function ``name`` of a kernel with a streaming body, the one
    :func:`_build` left for first need, through a cache entry of its own (the kernel's
    key and ``name`` hashed), so the kernel's committed entry is never changed."""
    sub = hashlib.sha256(f"{key}:{name}".encode()).hexdigest()
    loaded = _load(kernel, emitted, sub, cache_dir)

    def work(entry: Any) -> tuple[Any, bool]:
        rows = _compile_rows(loaded.module.__dict__[name], loaded.options, entry)
        return rows, rows.cache_hits > 0

    rows, _, _ = _compile_loaded(kernel, emitted, loaded, cache_dir, work, launcher=False)
    return rows


def _compile_helpers(emitted: _Emitted, cache_dir: str | None, launcher: bool = True) -> None:
    """Compile (or load from ``cache_dir``) the runtime helpers a kernel's compile links in:
    the chunk launcher of a chunked kernel (unless ``launcher`` is False) and the vmath
    functions it calls. A kernel loaded from its cache entry already holds their code and
    needs none of them."""
    if launcher and emitted.rows_name is not None:
        _cache.compile_helper(_g_launch, LAUNCH_SIGNATURE, cache_dir)
    for name, dtype in emitted.vmath:
        fn = getattr(_vmath, name)
        arity = len(inspect.signature(fn.py_func).parameters)
        _cache.compile_helper(fn, (numba.from_dtype(np.dtype(dtype)),) * arity, cache_dir)


def _serial_options(options: dict[str, Any]) -> dict[str, Any]:
    """A kernel module's ``NJIT_OPTIONS`` for its chunk function and body: serial, and
    no numba cache of their own (the kernel's cache entry is attached instead)."""
    return {k: v for k, v in options.items() if k not in ("parallel", "cache")}


def _noalias_njit(py_func: Any, options: dict[str, Any]) -> Any:
    """A serial ``njit`` dispatcher of a chunked kernel's body whose array arguments are
    ``noalias``, as numba makes those of a prange body it found no aliases in: the
    arrays the chunk function rebuilds from addresses would otherwise be assumed to
    alias each other and the body's own temps, which cost softmax's exp loop its clean
    vector code (1.12-1.15x the time)."""
    disp = numba.njit(**_serial_options(options))(py_func)
    customize = disp._compiler._customize_flags

    def with_noalias(flags: Any) -> Any:
        flags = customize(flags)
        flags.noalias = True
        return flags

    disp._compiler._customize_flags = with_noalias
    return disp


def _compile_rows(py_func: Any, options: dict[str, Any], entry: Any) -> Any:
    """Compile a chunked kernel's chunk function as a numba ``cfunc``
    (:data:`~geode.codegen.backends.chunks.CHUNK_SIGNATURE`; serial), through ``entry``
    (the kernel's cache entry, or the chunk function's own) when there is one."""
    from numba.core import sigutils
    from numba.core.ccallback import CFunc

    sig = sigutils.normalize_signature(CHUNK_SIGNATURE)
    rows = CFunc(py_func, sig, {}, _serial_options(options))
    if entry is not None:
        _cache.attach_numba_cache(rows, entry)
    rows.compile()
    return rows


def compile_kernel(
    kernel: Kernel,
    *,
    fastmath: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    parallel: bool | None = None,
) -> NumbaKernel:
    """Compile ``kernel`` to native code now and return the callable :class:`NumbaKernel`
    (a kernel with a streaming body leaves its plain chunk function for first need, see
    "Chunked kernels": :meth:`NumbaKernel.compile_chunk_functions`).

    ``fastmath`` selects numba's fast-math flags per ``config.ACCURACY_POLICY``;
    ``cache_dir`` (``Options.cache_dir``) enables the on-disk cache of
    :mod:`geode.codegen.cache` (``None``: compile in memory only); ``parallel=None``
    parallelises when the kernel has a parallel loop. The same kernel compiled twice
    in one process returns the same object. Raises :class:`CodegenError` naming the
    kernel (and the generated source line numba reported) when compilation fails.
    """
    t0 = time.perf_counter()
    emitted = _emit(kernel, fastmath, parallel)
    extra = {
        "backend": _backend_fingerprint(),
        "slp_vectorize": str(SLP_VECTORIZE),
        "opt": str(numba.core.config.OPT),
    }
    key = _cache.cache_key(emitted.source, extra)
    cdir = None if cache_dir is None else os.fspath(cache_dir)
    memo_key = (key, cdir)
    with _memo_lock:
        hit = _memo.get(memo_key)
        if hit is not None:
            return hit
        lock = _key_locks.setdefault(memo_key, threading.Lock())
    with lock:
        hit = _memo.get(memo_key)
        if hit is not None:
            return hit
        fn, from_cache, path = _build(kernel, emitted, key, cdir, fastmath)

        def compile_rows(name: str) -> Any:
            return _compile_lazy_rows(kernel, emitted, key, cdir, name)

        k = NumbaKernel(
            kernel.name,
            fn,
            emitted,
            key,
            time.perf_counter() - t0,
            from_cache,
            fastmath,
            path,
            compile_rows,
        )
        with _memo_lock:
            _memo[memo_key] = k
        return k


# ---------------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------------


def set_num_threads(n: int) -> int:
    """Threads for parallel kernels launched from this thread (``0``: all cores).

    Wraps ``numba.set_num_threads`` (a per-calling-thread setting, at most
    ``numba.config.NUMBA_NUM_THREADS``); larger requests are clamped. Returns the
    count in effect. Raises :class:`~geode.config.OptionError` for a negative ``n``.
    """
    numba.set_num_threads(clamp_threads(n))
    return int(numba.get_num_threads())


def clamp_threads(n: int) -> int:
    """The thread count :func:`set_num_threads` uses for a request of ``n`` (``0``: all
    cores; at most ``numba.config.NUMBA_NUM_THREADS``). Raises
    :class:`~geode.config.OptionError` for a negative or non-integer ``n``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise OptionError(f"num_threads must be an int >= 0 (0: all cores), got {n!r}")
    top = int(numba.config.NUMBA_NUM_THREADS)
    return top if n == 0 else min(int(n), top)


def get_num_threads() -> int:
    """Threads parallel kernels launched from this thread use."""
    return int(numba.get_num_threads())
