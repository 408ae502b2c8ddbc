"""The numba backend (``GEODE_BACKEND=numba``): loop AST -> Python source of one numba
function -> native kernel.

Rooms: :mod:`.helpers` (the runtime helpers generated kernels call), :mod:`.pysource`
(building blocks of the generated Python), :mod:`.emitter` (kernel -> source),
:mod:`.kernel` (compile, :class:`NumbaKernel`, threads). Importing the package sets
numba's CPU target up for geode first (:mod:`geode.codegen.backends.target`): the
helpers compile numba code at import.


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
  multiplies on the way (``_g_stream_divided`` for ``/ s``, an IEEE division per element):
  no stage store and load per element.

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

from geode.lazy import require_numba

# numba is an optional extra: without it, importing this backend says how to get it
require_numba("the numba backend (geode.codegen.backends.numba)")

from geode.codegen.backends import target as _target  # noqa: E402

_target.configure()  # before the rooms below build numba's CPU target

# the names generated kernels import from this package (``_g_*``) and the public API
from geode.codegen.backends.chunks import _g_addr, _g_launch, _g_ptr  # noqa: E402
from geode.codegen.backends.numba.emitter import emit_source  # noqa: E402
from geode.codegen.backends.numba.helpers import (  # noqa: E402
    DEFAULT_FLAGS,
    FASTMATH_FLAGS,
    MAX_REGISTER_UNROLL,
    MAX_UNROLL,
    SLP_VECTORIZE,
    _g_f2h,
    _g_fdiv,
    _g_fmax,
    _g_fmin,
    _g_fmodi,
    _g_freeze,
    _g_fsign,
    _g_h2f,
    _g_ipow,
    _g_isign,
    _g_maximum,
    _g_maxnum_nn,
    _g_minimum,
    _g_minnum_nn,
    _g_mod,
    _g_nanguard,
    _g_ntstore,
    _g_prefetch,
    _g_prefetch_l2,
    _g_rh,
    _g_sfence,
    _g_shl,
    _g_shr,
    _g_stream,
    _g_stream_divided,
    _g_stream_scaled,
    _g_tdiv,
    _g_udiv,
    _g_umod,
    _g_upow,
    _g_ushl,
    _g_ushr,
    _g_vector_start,
)
from geode.codegen.backends.numba.kernel import (  # noqa: E402
    NumbaKernel,
    clamp_threads,
    compile_kernel,
    get_num_threads,
    set_num_threads,
)

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
