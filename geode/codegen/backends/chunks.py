"""Chunked parallel kernels: one shared numba ``prange`` launcher for every kernel.

Why: numba compiles a ``parallel=True`` function twice over (the whole function, then
the prange body again as a gufunc, with its parfor passes), which cost 0.5-0.75 s of a
kernel's 0.9-1.4 s cold compile (measured on RMSNorm, softmax and the LSTM gates;
the same source compiled serially took 0.3-0.7 s). A kernel whose only parallel work is
one outermost parallel loop (see ``numba.py``, "Chunked kernels") is therefore compiled
as serial pieces:

- ``<kernel>_rows(argv, chunk, chunks)``, a numba ``cfunc``: ``argv`` holds the data
  addresses of the kernel's arrays and its dims (int64); it rebuilds each array with
  :func:`numba.carray` and :func:`_g_ptr` and calls ``<kernel>_body``, which runs chunk
  ``chunk`` of ``chunks`` equal parts of the parallel loop.
- ``<kernel>(*arrays, *dims, rows, chunks)``, a small serial ``njit`` entry: the shape
  checks, ``argv`` (:func:`_g_addr`), then :func:`_g_launch` with ``rows``, the address
  of the chunk function, and the chunk count (:func:`launch_chunks`).

:func:`_g_launch` is compiled once per process and shared: its ``prange`` over the
chunks runs each through the chunk function's address (:func:`_g_call_chunk`), so no
kernel pays for parfor compilation. The backend compiles it for :data:`LAUNCH_SIGNATURE`
before the first chunked kernel, through an entry of geode's disk cache (``runtime/``,
:func:`geode.codegen.cache.compile_helper`), so a later
process loads it (0.01 s) instead of compiling it (0.23 s after numba's start-up).
Run time is unchanged (the same machine code runs per row; RMSNorm at [4096, 4096]:
3.7-4.1 ms either way), and a call costs the same (5.1-5.2 us for an [8, 4096] RMSNorm
on two threads).
"""

from __future__ import annotations

from typing import Any

import numba
from llvmlite import ir as llir
from numba import types as nbt
from numba.extending import intrinsic

__all__ = [
    "CHUNKS_PER_THREAD",
    "CHUNK_SIGNATURE",
    "LAUNCH_SIGNATURE",
    "_g_addr",
    "_g_call_chunk",
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


@intrinsic
def _g_call_chunk(typingctx: Any, fn: Any, argv: Any, chunk: Any, chunks: Any) -> Any:
    """Call the chunk function at address ``fn`` (:data:`CHUNK_SIGNATURE`) with the data
    of the int64 array ``argv``."""
    if not (
        isinstance(fn, nbt.Integer)
        and isinstance(argv, nbt.Array)
        and argv.dtype == nbt.int64
        and isinstance(chunk, nbt.Integer)
        and isinstance(chunks, nbt.Integer)
    ):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i64 = llir.IntType(64)
        fnty = llir.FunctionType(llir.VoidType(), [i64.as_pointer(), i64, i64])
        target = builder.inttoptr(args[0], fnty.as_pointer())
        a = context.make_array(signature.args[1])(context, builder, value=args[1])
        c = context.cast(builder, args[2], signature.args[2], nbt.int64)
        n = context.cast(builder, args[3], signature.args[3], nbt.int64)
        builder.call(target, [a.data, c, n])
        return context.get_dummy_value()

    return nbt.void(fn, argv, chunk, chunks), codegen


#: chunks per thread numba may run (:func:`launch_chunks`): numba's prange gives each of
#: its n threads an equal run of consecutive chunks, so with fewer threads in use than
#: numba started the busiest thread does at most one chunk more than its share (3 of 4
#: threads: 11, 11 and 10 chunks of 32)
CHUNKS_PER_THREAD = 8


def launch_chunks() -> int:
    """The chunk count of a chunked kernel's launch: :data:`CHUNKS_PER_THREAD` per thread
    numba started (``NUMBA_NUM_THREADS``). A constant, so a launch needs no call asking
    numba for its thread count, which would make the entry's machine code uncacheable
    (numba bakes that call's address into it)."""
    return CHUNKS_PER_THREAD * int(numba.config.NUMBA_NUM_THREADS)


@numba.njit(parallel=True, nogil=True, cache=False)
def _g_launch(fn: int, argv: Any, chunks: int) -> None:  # pragma: no cover - compiled
    """Run the chunk function at address ``fn`` on ``argv`` in ``chunks`` chunks, spread
    over numba's threads by its prange."""
    for c in numba.prange(chunks):
        _g_call_chunk(fn, argv, c, chunks)


#: the launcher's argument types, as a chunked kernel's entry passes them
LAUNCH_SIGNATURE = (nbt.int64, nbt.Array(nbt.int64, 1, "C"), nbt.int64)


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
