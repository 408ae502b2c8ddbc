"""geode's native runtime: a thread pool and a kernel call trampoline, in C.

The C extension ``geode.runtime.native._ext`` (sources next to this file, built by the
repository's ``setup.py``: ``python setup.py build_ext --inplace`` or ``pip install -e .``)
serves kernels JIT-compiled by the LLVM backend. JIT code reaches it by C symbol address
(:func:`symbols`, registered with ``llvmlite.binding.add_symbol`` before compiling); Python
reaches a kernel through :func:`call`.

Thread pool (C ABI)
-------------------
``void geode_parallel_for(void (*fn)(void *ctx, int64_t chunk, int64_t nchunks), void *ctx,
int64_t nchunks, int64_t nthreads)`` runs ``fn(ctx, c, nchunks)`` once for every ``c`` in
``[0, nchunks)`` and returns when all have run; ``nthreads <= 0`` means the pool size.
``int64_t geode_num_threads(void)`` returns the pool size.
``void geode_launch(fn, void *ctx, int64_t ext, int64_t threads, bool small)`` runs a
generated kernel's parallel loop of ``ext`` iterations: nothing when ``ext < 1``;
``fn(ctx, 0, 1)`` on the caller when ``small`` or when one thread (``threads <= 0``: the
pool size) or one chunk would run it; else ``geode_parallel_for`` of ``min(ext, 32 *
threads)`` chunks (the LLVM backend's ``geode.launch``).
``void geode_parallel_steps(void (*fn)(void *ctx, int64_t step, int64_t chunk, int64_t
nchunks), void *ctx, int64_t nsteps, int64_t nchunks, int64_t nthreads)`` runs ``fn`` for
every step and chunk as ONE job: every chunk of step ``s`` returns before any of step
``s + 1`` starts (a barrier inside the job instead of a launch per step; a recurrence's
steps). A participant takes the same range of chunks at every step; whoever finishes a
step's last chunk opens the next, so no one waits for a thread that holds no chunk; a
participant waiting at the barrier spins at most ``GEODE_BARRIER_SPIN_US`` (50 us, pool.h),
then sleeps on a futex (``pool_info()["barrier_sleeps"]`` counts those sleeps). It falls
back like ``geode_parallel_for``.

- Size: ``GEODE_NUM_THREADS`` when set to a positive integer, else the CPUs this process may
  run on (``sched_getaffinity``); at most ``MAX_THREADS``. :func:`set_num_threads` changes it.
- Workers (``size - 1`` threads named ``geode-worker``, all signals blocked) start lazily on
  the first job that needs them; the calling thread is participant 0 and runs chunks too.
- Load balancing: each participant owns a contiguous range of chunks in a cache-line slot
  whose 64-bit word packs front and back offsets; the owner takes chunks from the front, a
  participant with an empty range steals single chunks from the back of the others.
- Idle: after a job a worker spins ``GEODE_SPIN_US`` microseconds (default 300, 0 allowed)
  waiting for the next one, then sleeps on a futex, so an idle pool uses no CPU. Waking a
  sleeping worker is slow on virtual machines, and a model calls its kernels a few tens of
  microseconds apart (measurements: ``docs/performance.md``).
- The caller's MXCSR control bits (FTZ, DAZ, rounding; x86 only) are applied on the workers
  for the job and their own restored after it.
- A call from inside a job (a nested ``geode_parallel_for``) or from another thread while a
  job holds the pool runs all its chunks serially on its caller: never a deadlock. So does a
  call with one thread or one chunk. ``pool_info()["inline_runs"]`` counts those calls.
- Fork: in a child process the pool is forgotten (``pthread_atfork``) and restarts lazily.

Kernel calls
------------
``call(addr, n_in, arrays, ints)`` calls ``int32_t entry(void **ptrs, const int64_t *recs,
const int64_t *ints)`` at ``addr`` with the GIL released and returns its status:
``ptrs[i]`` is the data pointer of ``arrays[i]``; ``recs`` holds, per array in order,
``ndim, itemsize, shape[0], ..., shape[ndim-1]``; ``ints`` are the ints as int64 (one that
does not fit raises ``ValueError``). Arrays are taken through the buffer protocol (a numpy
array read directly from its fields, under the same rules: 150-250 ns an array less), never
copied: each must be C-contiguous and ``arrays[n_in:]`` writable, else :class:`ArgumentError`
(a ``ValueError`` and a :class:`geode.errors.GeodeError`) with ``.index``, the position of
the offending array. Buffers are released after the call, also on errors.
"""

from __future__ import annotations

from typing import Any

try:
    from geode.runtime.native import _ext
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "geode's native runtime (geode.runtime.native._ext) is not built: run "
        "`python setup.py build_ext --inplace` or `pip install -e .` at the repository root"
    ) from exc

ArgumentError = _ext.ArgumentError
MAX_THREADS: int = _ext.MAX_THREADS

#: Call a JIT-compiled kernel entry; the C function itself, for speed (see the module docs).
call = _ext.call
#: Call several kernel entries in one crossing: ``call_chain(entries, arrays, ints)`` with
#: ``entries`` a tuple of ``(addr, n_arrays, n_in, n_ints)`` per kernel and ``arrays``/``ints``
#: every kernel's arguments concatenated; returns 0, or ``((k + 1) << 32) | status`` for the
#: first kernel ``k`` that refused its arguments (the later ones do not run). An optional 4th
#: argument, the address of a native chain entry generated for those entries
#: (``int64_t chain(void **ptrs, const int64_t *recs, const int64_t *ints)``, the same
#: slices and status), is called once instead of the loop.
call_chain = _ext.call_chain
#: ``blas_share_pool(set_callback, set_threads)``: route OpenBLAS's parallel work to the pool
#: (the addresses of OpenBLAS's ``openblas_set_threads_callback_function`` and
#: ``openblas_set_num_threads``); OpenBLAS's thread count then follows the pool size. Its jobs
#: wait on each other, so they run on as many threads at once, on the pool (waiting for it if
#: another thread's job holds it) or, from inside a pool job, on short-lived threads.
blas_share_pool = _ext.blas_share_pool
#: ``gemm_configure(sgemm, dgemm, int_bits, set_threads)``: the BLAS ``geode_gemm`` calls
#: (row-major cblas ``?gemm`` addresses with ``int_bits``-bit ints, and OpenBLAS's
#: ``openblas_set_num_threads`` or 0). ``geode_gemm`` (a C symbol for JIT code, see
#: :func:`symbols`) splits ``C = A @ B + beta C`` into independent blocks over the pool,
#: each a single-threaded BLAS call: no job waits for another (OpenBLAS's own threads wait
#: on each other, and stall when a core is busy or a worker sleeps)
gemm_configure = _ext.gemm_configure
#: ``release_scratch()``: free the calling thread's scratch buffers (a pool worker's are
#: freed when it stops, e.g. on :func:`set_num_threads`)
release_scratch = _ext.release_scratch

__all__ = [
    "MAX_THREADS",
    "ArgumentError",
    "call",
    "blas_share_pool",
    "call_chain",
    "PACK_NR",
    "pack_weight",
    "packed_gemm_at_function",
    "packed_gemm_bias_function",
    "packed_gemm_function",
    "packed_size",
    "set_gemm_wide",
    "set_packed_isa",
    "gemm_configure",
    "get_num_threads",
    "pool_info",
    "release_scratch",
    "set_num_threads",
    "symbols",
]


def set_num_threads(n: int) -> None:
    """Resize the pool to ``n`` threads, the calling thread included (1 to ``MAX_THREADS``).

    Waits until no job holds the pool, then stops the workers; the next parallel job starts
    ``n - 1`` new ones. Raises ``ValueError`` when ``n`` is out of range and ``RuntimeError``
    when called from inside a parallel job.
    """
    _ext.set_num_threads(n)


def get_num_threads() -> int:
    """Return the pool size: the threads that run one job, the calling thread included."""
    return _ext.get_num_threads()


def pool_info() -> dict[str, int]:
    """Return the pool's state: ``threads`` (pool size), ``spin_us`` (worker spin time
    before sleeping), ``workers_running`` (worker threads alive), ``launches`` (jobs run on
    the pool), ``inline_runs`` (calls run serially on their caller: nested, concurrent
    with another job, one thread or one chunk), ``stepped_launches`` (the launches that
    were stepped jobs) and ``barrier_sleeps`` (their barrier waits that went to sleep); ``blas_pool_runs`` and ``blas_thread_runs``
    count OpenBLAS calls whose jobs ran on the pool and on short-lived threads;
    ``scratch_bytes`` the bytes every thread's scratch buffers hold (:func:`symbols`);
    ``gemm_split_calls`` the ``geode_gemm`` calls split over the pool;
    ``gemm_wide_calls`` its float32 products computed by the packed kernel with B packed per
    call and ``gemm_wide_kernel`` 1 when they take it (:func:`set_gemm_wide`);
    ``gemm_packed_calls`` the calls of the packed-weight GEMM and ``gemm_packed_isa`` its
    path (0 plain C, 1 AVX2, 2 AVX-512)."""
    return _ext.pool_info()


def gemm_function() -> Any:
    """``geode_gemm`` as a ctypes function, for Python callers that pass raw addresses
    (tests, benchmarks): ``(kind, m, n, k, a, lda, b, ldb, beta, c, ldc, threads)``, kind
    0 float32, 1 float64 (see :data:`gemm_configure` for what it computes)."""
    import ctypes

    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    signature = ctypes.CFUNCTYPE(
        None, i64, i64, i64, i64, ptr, i64, ptr, i64, ctypes.c_double, ptr, i64, i64
    )
    return signature(symbols()["geode_gemm"])


#: columns per panel of a packed weight (:func:`pack_weight`)
PACK_NR = 16


def packed_size(k: int, n: int) -> int:
    """Floats of a ``k x n`` weight packed by :func:`pack_weight`: ``ceil(n / 16)``
    panels of ``k x 16``."""
    return -(-n // PACK_NR) * k * PACK_NR


def pack_weight(b: Any, transposed: bool = False) -> Any:
    """A float32 weight ``B`` (``K x N``; with ``transposed``, ``B^T`` given as ``N x
    K``, Gemm's ``transB``) packed for :func:`packed_gemm_function` (C
    ``geode_sgemm_pack``): a new array of shape ``(ceil(N / 16), K, 16)``, one panel of
    16 columns after another, each ``K`` rows of 16 contiguous floats, the columns past
    ``N`` zero. Raises ``ValueError`` for anything but a 2-D float32 array."""
    import ctypes

    import numpy as np

    arr = np.ascontiguousarray(b)
    if arr.ndim != 2 or arr.dtype != np.float32:
        raise ValueError(f"pack_weight(): a 2-D float32 matrix, not {arr.dtype}{arr.shape}")
    k, n = (arr.shape[1], arr.shape[0]) if transposed else arr.shape
    out = np.empty((-(-n // PACK_NR), k, PACK_NR), dtype=np.float32)
    if out.size:
        fn = ctypes.CFUNCTYPE(
            None,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
        )(symbols()["geode_sgemm_pack"])
        fn(k, n, arr.ctypes.data, arr.shape[1], int(transposed), out.ctypes.data)
    return out


def packed_gemm_function() -> Any:
    """``geode_sgemm_packed`` as a ctypes function (tests, benchmarks): ``(m, n, k,
    alpha, a, lda, packed_b, beta, c, ldc, threads)`` computes ``C = alpha A @ B + beta C``
    (float32, row-major, leading dims in elements; ``packed_b`` from :func:`pack_weight`;
    ``threads <= 0``: the pool's size), every element summed in the same order whatever the
    split over the pool (``runtime/native/sgemm_packed.c``)."""
    import ctypes

    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    signature = ctypes.CFUNCTYPE(None, i64, i64, i64, f32, ptr, i64, ptr, f32, ptr, i64, i64)
    return signature(symbols()["geode_sgemm_packed"])


def packed_gemm_bias_function() -> Any:
    """``geode_sgemm_packed_bias`` as a ctypes function (tests, benchmarks): ``(m, n, k,
    alpha, a, lda, packed_b, bias, beta, c, ldc, threads)`` computes ``C = alpha A @ B +
    bias + beta C`` like :func:`packed_gemm_function`, ``bias`` (``n`` floats, or None)
    added to every row after alpha and before ``beta C``: each element is its sum, plus
    its column's bias, plus ``C``'s value (beta 1), the bits of adding them after."""
    import ctypes

    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    signature = ctypes.CFUNCTYPE(None, i64, i64, i64, f32, ptr, i64, ptr, ptr, f32, ptr, i64, i64)
    return signature(symbols()["geode_sgemm_packed_bias"])


def packed_gemm_at_function() -> Any:
    """``geode_sgemm_packed_at`` as a ctypes function (tests, benchmarks): ``(m, n, k,
    alpha, a, lda, ka, a_rows, a_bstride, row0, packed_b, bias, beta, c, ldc, threads)``,
    :func:`packed_gemm_bias_function` with ``A``'s rows anywhere: ``C``'s row ``i`` is
    ``A``'s row ``row = row0 + i`` at ``a + (row // a_rows) * a_bstride + (row % a_rows) *
    lda`` (``a_rows`` 0: ``a + row * lda``), its element ``p`` at ``+ p * ka``: an ``X``
    of shape ``[batch, K, R]`` read as its transpose ``[batch, R, K]`` is ``lda`` 1, ``ka``
    and ``a_rows`` R, ``a_bstride`` K x R."""
    import ctypes

    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    args = [i64, i64, i64, f32, ptr, i64, i64, i64, i64, i64, ptr, ptr, f32, ptr, i64, i64]
    return ctypes.CFUNCTYPE(None, *args)(symbols()["geode_sgemm_packed_at"])


def set_packed_isa(isa: int) -> int:
    """Testing hook: the packed GEMM's path (0 plain C, 1 AVX2 + FMA, 2 AVX-512F; a
    negative value: the default again, the best the CPU runs or ``GEODE_PACKED_ISA``).
    Returns the previous path; ``ValueError`` when the CPU cannot run ``isa``."""
    return _ext._set_packed_isa(isa)


def set_gemm_wide(on: bool) -> bool:
    """Testing and benchmark hook: ``False`` keeps ``geode_gemm``'s float32 products on the
    BLAS (as before geode's packed kernel took them on AVX-512 CPUs, ``gemm.c``), ``True``
    lets them take it again. Returns the previous setting."""
    return bool(_ext._set_gemm_wide(int(on)))


def symbols() -> dict[str, int]:
    """Return the runtime's C functions for JIT code as ``{name: address}``:
    ``geode_parallel_for``, ``geode_launch``, ``geode_parallel_steps``, ``geode_num_threads``,
    ``geode_gemm`` (see
    :data:`gemm_configure`), ``geode_sgemm_packed``, ``geode_sgemm_packed_bias``,
    ``geode_sgemm_packed_at`` and ``geode_sgemm_pack`` (see :func:`packed_gemm_function`,
    :func:`packed_gemm_bias_function`, :func:`packed_gemm_at_function`, :func:`pack_weight`), ``geode_scratch`` (``void
    *geode_scratch(int64_t slot, int64_t bytes)``: the calling thread's buffer for ``slot``
    (0 to 3 for JIT code; 4 is ``geode_sgemm_wide``'s), at least ``bytes`` long, 64-byte aligned, kept for its next call; NULL when
    out of memory), and ``geode_check_indices``, a kernel entry (see "Kernel calls") that a
    chain runs before a kernel reading memory at unchecked indices: 0 when every index of
    its one array lies in ``[-dim, dim)`` (ints ``dim, unsigned``), 1 when one does not, 2
    for an item size other than 1, 2, 4 or 8. JIT code links them by address."""
    return _ext.symbols()
