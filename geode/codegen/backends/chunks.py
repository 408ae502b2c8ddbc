"""Chunked parallel kernels: one shared numba ``prange`` launcher for every kernel.

Why: numba compiles a ``parallel=True`` function twice over (the whole function, then
the prange body again as a gufunc, with its parfor passes), which cost 0.5-0.75 s of a
kernel's 0.9-1.4 s cold compile (measured on RMSNorm, softmax and the LSTM gates;
the same source compiled serially took 0.3-0.7 s). A kernel whose only parallel work is
one outermost parallel loop (see the ``numba`` package, "Chunked kernels") is therefore compiled
as serial pieces:

- ``<kernel>_rows(argv, chunk, chunks)``, a numba ``cfunc``: ``argv`` holds the data
  addresses of the kernel's arrays and its dims (int64); it rebuilds each array with
  :func:`numba.carray` and :func:`_g_ptr` and calls ``<kernel>_body``, which runs chunk
  ``chunk`` of ``chunks`` equal parts of the parallel loop (a kernel with non-temporal
  stores also has ``<kernel>_rows_nt``, calling its streaming body: see
  :mod:`geode.codegen.backends.numba`, "Chunked kernels").
- ``<kernel>(*arrays, *dims, rows, chunks, threads)`` (``rows, rows_nt, ...`` with a
  streaming body), a small serial ``njit`` entry: the shape checks, ``argv``
  (:func:`_g_addr`), then :func:`_g_launch` with ``rows``, the address of the chunk
  function, and the chunk count (:func:`launch_chunks`).

:func:`_g_launch` is compiled once per process and shared: its ``prange`` over the
chunks runs each through the chunk function's address (:func:`_g_work`), so no
kernel pays for parfor compilation. The backend compiles it for :data:`LAUNCH_SIGNATURE`
before the first chunked kernel, through an entry of geode's disk cache (``runtime/``,
:func:`geode.codegen.cache.compile_helper`), so a later
process loads it (0.01 s) instead of compiling it (0.24-0.33 s after numba's start-up;
its steps are LLVM IR intrinsics, since the same steps in Python took numba 0.4-1.9 s).
The chunks run the same machine code a prange body would (RMSNorm at [4096, 4096]:
3.7-4.1 ms either way).

How the chunks are shared (:func:`_g_launch`): each of the launch's workers (one per
thread in use) owns a contiguous run of chunks and takes them from its front; a worker
whose run is done takes chunks from the back of the others' runs ("work stealing":
one compare-and-swap on a worker's packed ``(front, back)`` word claims a chunk, each
word on its own cache line). A static split leaves one thread idle whenever the other
runs slower, which on a shared VM is most calls: measured on the LSTM gates at [4096,
1024] on two vCPUs, the two threads of a static split finished 0.06-1.1 ms apart
(median 0.11 ms, once 3 ms, of a 4 ms call), and the second thread started 20-135 us
after the first. With stealing, 32 chunks per thread, the call took 0.85-0.96 of the
static split's time (three runs of 11 interleaved rounds: medians 0.865, 0.907 and
0.923 of the per-round ratios, interquartile ranges within 0.85-0.96), and its time
varied less (roofline fraction 77-79% in every run, against 67-75% for the static
split). Over the six benchmark workloads at 64 MiB per input, paired in one process
against a static split in 8 chunks per thread: 0.90 (softmax) to 1.00 (RMSNorm), LSTM
gates 0.935. More chunks cost small calls a little: 64 chunks against 16 took
1.035-1.055 of the time of an [8, 4096] RMSNorm or [8, 1024] LSTM-gates launch (7.7
and 10.9 us). Consecutive chunks of one run stay on one thread, so a chunk's prefetch
of the row after its last still serves its owner.

The launcher also sets the calling thread's numba thread count when the entry passes
one (``threads > 0``): in compiled code, through the symbol numba's threading layer
registers, where ``numba.set_num_threads`` from Python took 35-57 us per call right
after a kernel that streamed the caches out.
"""

from __future__ import annotations

from typing import Any

import numba
from llvmlite import ir as llir
from numba import types as nbt
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "CHUNKS_PER_THREAD",
    "CHUNK_SIGNATURE",
    "LAUNCH_SIGNATURE",
    "_g_addr",
    "_g_launch",
    "_g_ptr",
    "launch_chunks",
    "start_threads",
]

#: the C signature of a chunk function: ``void(int64 *argv, int64 chunk, int64 chunks)``
CHUNK_SIGNATURE = nbt.void(nbt.CPointer(nbt.int64), nbt.int64, nbt.int64)


@intrinsic
def _g_ptr(typingctx: Any, addr: Any, dtype: Any) -> Any:
    """``_g_ptr(address, np.float32)``: the int64 ``address`` as a typed data pointer
    (``CPointer(float32)``) for :func:`numba.carray`."""
    if not isinstance(addr, nbt.Integer) or not isinstance(dtype, (nbt.NumberClass, nbt.DType)):
        return None
    elem = dtype.dtype if isinstance(dtype, nbt.DType) else dtype.instance_type

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_data_type(elem).as_pointer())

    return nbt.CPointer(elem)(addr, dtype), codegen


@intrinsic
def _g_addr(typingctx: Any, arr: Any) -> Any:
    """The address of an array's data as an int64 (for a chunk function's ``argv``)."""
    if not isinstance(arr, nbt.Array):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a = context.make_array(signature.args[0])(context, builder, value=args[0])
        return builder.ptrtoint(a.data, llir.IntType(64))

    return nbt.int64(arr), codegen


#: chunks per thread numba may run (:func:`launch_chunks`): the unit of work stealing
#: (:func:`_g_launch`), so a thread left idle at the end waits for at most one chunk of
#: the other's. Measured on the LSTM gates at [4096, 1024], two threads, paired against
#: a static split in 8 chunks per thread (the medians of three runs): 16 per thread
#: 0.87-0.96 of the time, 32 per thread 0.865-0.92, 64 per thread 0.87-0.96
CHUNKS_PER_THREAD = 32


def launch_chunks() -> int:
    """The chunk count of a chunked kernel's launch: :data:`CHUNKS_PER_THREAD` per thread
    numba started (``NUMBA_NUM_THREADS``). A constant, so a launch needs no call asking
    numba for its thread count, which would make the entry's machine code uncacheable
    (numba bakes that call's address into it)."""
    return CHUNKS_PER_THREAD * int(numba.config.NUMBA_NUM_THREADS)


#: int64 words per worker in the launch's claim words: one cache line each, so one
#: worker's claims never invalidate the line another worker is claiming from
_SLOT = 8
#: a worker's ``(front, back)`` chunk indices packed in one int64: ``front << 32 | back``
_HALF = 32
_LOW = (1 << _HALF) - 1
_I64 = llir.IntType(64)
_C_INT = llir.IntType(32)


def _const(v: int) -> Any:
    return llir.Constant(_I64, v)


def _ints(*types: Any) -> bool:
    return all(isinstance(t, nbt.Integer) for t in types)


def _is_int64_array(arr: Any) -> bool:
    return isinstance(arr, nbt.Array) and arr.dtype == nbt.int64 and arr.ndim == 1


def _as_i64(context: Any, builder: Any, signature: Any, args: Any) -> list[Any]:
    """The intrinsic's integer arguments as int64 values (other arguments as they are)."""
    return [
        context.cast(builder, a, t, nbt.int64) if isinstance(t, nbt.Integer) else a
        for a, t in zip(args, signature.args)
    ]


def _threading_fn(builder: Any, name: str, ret: Any, params: list[Any]) -> Any:
    """``name`` of numba's threading layer, a symbol it registers with the JIT linker
    when its pool starts: calls to it stay cacheable, being resolved by name when the
    code loads (``numba.get_num_threads`` compiles to a baked address instead). The
    declaration must match the one numba's parfor lowering puts in the same module
    (``intp`` for ``get_num_threads``); the C functions take and return an ``int``."""
    return cgutils.get_or_insert_function(builder.module, llir.FunctionType(ret, params), name)


@intrinsic
def _g_workers(typingctx: Any, chunks: Any, threads: Any) -> Any:
    """The worker count of a launch of ``chunks`` chunks: the calling thread's numba
    thread count (first set to ``threads`` when that is positive, as
    ``numba.set_num_threads`` would, without its range check: 1 <= threads <=
    NUMBA_NUM_THREADS is the caller's to keep), at most ``chunks``, at least 1."""
    if not _ints(chunks, threads):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        chunks_v, threads_v = _as_i64(context, builder, signature, args)
        with builder.if_then(builder.icmp_signed(">", threads_v, _const(0))):
            setter = _threading_fn(builder, "set_num_threads", llir.VoidType(), [_C_INT])
            builder.call(setter, [builder.trunc(threads_v, _C_INT)])
        getter = _threading_fn(builder, "get_num_threads", _I64, [])
        # the C int in the low 32 bits, sign-extended (the high bits are not defined)
        n = builder.sext(builder.trunc(builder.call(getter, []), _C_INT), _I64)
        n = builder.select(builder.icmp_signed("<", chunks_v, n), chunks_v, n)
        return builder.select(builder.icmp_signed("<", n, _const(1)), _const(1), n)

    return nbt.int64(chunks, threads), codegen


@intrinsic
def _g_claims(typingctx: Any, chunks: Any, workers: Any) -> Any:
    """The claim words of a launch, on the calling function's stack (valid until it
    returns, so through a parallel loop inside it, which ends before it does): worker ``v``'s packed
    ``(front, back)`` at word ``v * _SLOT``, a cache line each, initialised to its equal
    share ``[chunks * v // workers, chunks * (v + 1) // workers)``. Returns their address
    as an int64, which the parallel loop takes as a plain value."""
    if not _ints(chunks, workers):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        chunks_v, workers_v = _as_i64(context, builder, signature, args)
        words = builder.alloca(
            _I64, size=builder.mul(builder.add(workers_v, _const(1)), _const(_SLOT))
        )
        # start on a cache line: skip up to one slot of words
        addr = builder.ptrtoint(words, _I64)
        aligned = builder.and_(builder.add(addr, _const(8 * _SLOT - 1)), _const(-8 * _SLOT))
        base = builder.inttoptr(aligned, _I64.as_pointer())
        with cgutils.for_range(builder, workers_v) as loop:
            v = loop.index
            lo = builder.sdiv(builder.mul(chunks_v, v), workers_v)
            hi = builder.sdiv(builder.mul(chunks_v, builder.add(v, _const(1))), workers_v)
            word = builder.or_(builder.shl(lo, _const(_HALF)), hi)
            builder.store(word, builder.gep(base, [builder.mul(v, _const(_SLOT))]))
        return aligned

    return nbt.int64(chunks, workers), codegen


@intrinsic
def _g_work(
    typingctx: Any, fn: Any, argv: Any, chunks: Any, claims: Any, w: Any, workers: Any
) -> Any:
    """Worker ``w`` of a launch: claim and run chunks from the front of its own run, then
    from the backs of the other workers' runs, until every run is empty (``claims``: the
    address :func:`_g_claims` returned). A claim is one ``cmpxchg`` of the run's word (a
    failed one rereads it). Emitted as LLVM IR, as the launcher's other steps are: numba's
    front end and parfor passes on the same loop in Python, with the claim words in an
    array, made the shared launcher's compile 0.4-1.9 s instead of 0.2 s.

    In Python terms::

        for k in range(workers):
            v = (w + k) % workers
            while (s := load_acquire(claims[v * _SLOT])) has front < back:
                claim = (front + 1, back) if k == 0 else (front, back - 1)
                if cmpxchg(claims[v * _SLOT], s, claim):
                    run chunk front if k == 0 else back - 1
    """
    if not (_is_int64_array(argv) and _ints(fn, chunks, claims, w, workers)):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fn_v, _, chunks_v, claims_v, w_v, workers_v = _as_i64(context, builder, signature, args)
        fnty = llir.FunctionType(llir.VoidType(), [_I64.as_pointer(), _I64, _I64])
        target = builder.inttoptr(fn_v, fnty.as_pointer())
        data = context.make_array(signature.args[1])(context, builder, value=args[1]).data
        words = builder.inttoptr(claims_v, _I64.as_pointer())

        func = builder.function
        head, claim, try_, run, next_, done = (
            func.append_basic_block(f"steal.{n}")
            for n in ("victim", "claim", "try", "run", "next", "done")
        )
        start = builder.block
        builder.branch(head)

        builder.position_at_end(head)  # k: which run (0: its own), v = (w + k) % workers
        k = builder.phi(_I64, "k")
        k.add_incoming(_const(0), start)
        builder.cbranch(builder.icmp_signed("<", k, workers_v), claim, done)

        builder.position_at_end(claim)
        v = builder.srem(builder.add(w_v, k), workers_v)
        slot = builder.gep(words, [builder.mul(v, _const(_SLOT))])
        word = builder.load_atomic(slot, "acquire", 8)
        lo = builder.lshr(word, _const(_HALF))
        hi = builder.and_(word, _const(_LOW))
        builder.cbranch(builder.icmp_signed(">=", lo, hi), next_, try_)

        builder.position_at_end(try_)
        own = builder.icmp_signed("==", k, _const(0))
        last = builder.sub(hi, _const(1))
        front_claim = builder.or_(builder.shl(builder.add(lo, _const(1)), _const(_HALF)), hi)
        back_claim = builder.or_(builder.shl(lo, _const(_HALF)), last)
        new = builder.select(own, front_claim, back_claim)
        chunk = builder.select(own, lo, last)
        swapped = builder.extract_value(builder.cmpxchg(slot, word, new, "acq_rel", "acquire"), 1)
        builder.cbranch(swapped, run, claim)

        builder.position_at_end(run)
        builder.call(target, [data, chunk, chunks_v])
        builder.branch(claim)

        builder.position_at_end(next_)
        k.add_incoming(builder.add(k, _const(1)), next_)
        builder.branch(head)

        builder.position_at_end(done)
        return context.get_dummy_value()

    return nbt.void(fn, argv, chunks, claims, w, workers), codegen


@numba.njit(parallel=True, nogil=True, cache=False)
def _g_launch(fn: int, argv: Any, chunks: int, threads: int) -> None:  # pragma: no cover - compiled
    """Run the chunk function at address ``fn`` on ``argv`` in ``chunks`` chunks on
    numba's threads, shared by work stealing (see the module docstring): one worker per
    thread in use (:func:`_g_work`), each owning an equal contiguous run of chunks.
    ``threads > 0`` first sets the calling thread's numba thread count."""
    workers = _g_workers(chunks, threads)
    claims = _g_claims(chunks, workers)
    for w in numba.prange(workers):
        _g_work(fn, argv, chunks, claims, w, workers)


#: the launcher's argument types, as a chunked kernel's entry passes them: the chunk
#: function's address, ``argv``, the chunk count and the thread count (0: numba's)
LAUNCH_SIGNATURE = (nbt.int64, nbt.Array(nbt.int64, 1, "C"), nbt.int64, nbt.int64)


def start_threads() -> None:
    """Start numba's thread pool (idempotent) before a chunked kernel's machine code is
    compiled or loaded: starting it registers the pool's entry points (``numba_parallel_for``
    ...) with the JIT linker, which resolves the kernel's references to them as it loads.

    numba starts the pool when it compiles or loads a parallel function, so this is
    usually done already; but a kernel compiled in a process that loaded the launcher
    from the disk cache does not carry numba's start-up hook into its own cache entry,
    and loading that entry in a fresh process left the references null (a segfault on
    the first call, found by ``test_runtime_helpers_are_cached_across_processes``)."""
    from numba.np.ufunc.parallel import _launch_threads

    _launch_threads()
