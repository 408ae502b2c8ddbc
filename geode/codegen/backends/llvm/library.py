"""Library routines as native kernels: MatMul through the BLAS numpy ships, called by C
symbol from JIT-compiled code (not through Python).

:func:`blas` finds ``cblas_sgemm``/``cblas_dgemm`` in the OpenBLAS of numpy's wheel
(``numpy.libs/libscipy_openblas64_*``: the ILP64 interface, ``scipy_cblas_?gemm64_``) or,
failing that, in the process (a system CBLAS, 32-bit ints). :func:`matmul_kernel` compiles
an entry with the kernels' ABI (``int32 entry(ptrs, recs, ints)``, see
:mod:`~geode.codegen.backends.llvm.emit`) computing ``Y = A @ B`` for ``A`` of rank ``r``
(>= 2, its leading dims flattened into the GEMM's rows: one call for a whole batch of
rows) and ``B`` a matrix, all C-contiguous: it checks the three records (status 1, 2, 3
for a bad A, B, Y), then calls ``gemm(RowMajor, NoTrans, NoTrans, M, N, K, 1, A, K, B,
N, 0, Y, N)``; ``K = 0`` writes zeros (numpy's result) and ``M = 0`` or ``N = 0`` nothing.
The results are numpy's: numpy's own matmul calls the same routine for these operands.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import time
from dataclasses import dataclass

import numpy as np

from geode.codegen.backends.llvm.compiled import ArgSpec, Emitted

__all__ = ["TYPES", "Blas", "blas", "matmul_kernel", "share_pool"]

#: the dtypes the BLAS GEMMs take: LLVM element type, BLAS letter, bytes per element
TYPES = {"float32": ("float", "s", 4), "float64": ("double", "d", 8)}


@dataclass(frozen=True)
class Blas:
    """The GEMM routines found: their addresses, the width of their int arguments, and
    (OpenBLAS 0.3.27 and newer) the addresses of its thread-count and threads-callback
    setters (0 when absent)."""

    sgemm: int
    dgemm: int
    int_bits: int
    where: str
    set_threads: int = 0
    set_callback: int = 0
    get_threads: int = 0

    def symbol(self, dtype: str) -> str:
        """The name geode links the ``dtype`` GEMM under (its address is imported)."""
        return f"geode_blas_{TYPES[dtype][1]}gemm"

    def address(self, dtype: str) -> int:
        return self.sgemm if dtype == "float32" else self.dgemm


def _lookup(lib: ctypes.CDLL, names: tuple[str, str]) -> tuple[int, int] | None:
    try:
        return tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names)  # type: ignore[return-value]
    except AttributeError:
        return None


@functools.lru_cache(maxsize=1)
def blas() -> Blas | None:
    """numpy's BLAS (see the module docstring), or None when none is found."""
    libs_dir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs_dir, "*openblas*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for names, bits in (
            (("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_"), 64),
            (("cblas_sgemm64_", "cblas_dgemm64_"), 64),
            (("cblas_sgemm", "cblas_dgemm"), 32),
        ):
            found = _lookup(lib, names)
            if found and all(found):
                return _configured(Blas(found[0], found[1], bits, path, *_threading(lib)))
    found = _lookup(ctypes.CDLL(None), ("cblas_sgemm", "cblas_dgemm"))
    if found and all(found):
        return _configured(Blas(found[0], found[1], 32, "process"))
    return None


def _configured(lib: Blas) -> Blas:
    """``lib``, given to the native runtime's ``geode_gemm`` (which JIT code calls)."""
    from geode.runtime import native

    native.gemm_configure(lib.sgemm, lib.dgemm, lib.int_bits, lib.set_threads, lib.get_threads)
    return lib


def _threading(lib: ctypes.CDLL) -> tuple[int, int, int]:
    """OpenBLAS's ``(set_num_threads, set_threads_callback_function, get_num_threads)``,
    or zeros."""
    for prefix, suffix in (("scipy_openblas_", "64_"), ("openblas_", "")):
        names = (
            f"{prefix}set_num_threads{suffix}",
            f"{prefix}set_threads_callback_function{suffix}",
            f"{prefix}get_num_threads{suffix}",
        )
        found = [_lookup(lib, (name, name)) for name in names]
        if all(f and f[0] for f in found):
            return tuple(f[0] for f in found)  # type: ignore[return-value,index]
    return (0, 0, 0)


_shared: list[Blas] = []

#: the native runtime's partitioned GEMM (``runtime/native/gemm.c``), as JIT code declares it
GEMM_DECL = (
    "declare void @geode_gemm(i64, i64, i64, i64, ptr, i64, ptr, i64, double, ptr, i64, i64)"
)


def gemm_call(
    dtype: str,
    m: str,
    n: str,
    k: str,
    ops: list[tuple[str, str]],
    threads: str,
    beta: str = "0.0",
    trans_b: bool = False,
) -> str:
    """The IR call of ``C = A @ B (+ beta C)`` through ``geode_gemm`` (row-major, leading
    dims in elements; ``ops`` the ``(pointer, leading dim)`` of A, B, C; ``beta`` 0.0 or
    1.0; ``threads`` 0 for the pool's): split into independent blocks over the pool, each a
    single-threaded BLAS call, no barrier between threads; a float32 product too small for
    such blocks, and every float32 GEMV, on geode's own kernel (``runtime/native/gemm.c``,
    ``sgemm_thin.c``). ``trans_b``: B is stored transposed (``B^T`` row-major, ``ldb`` its
    leading dim; always the BLAS)."""
    (a, lda), (b, ldb), (c, ldc) = ops
    kind = (0 if dtype == "float32" else 1) + (2 if trans_b else 0)
    return (
        f"  call void @geode_gemm(i64 {kind}, i64 {m}, i64 {n}, i64 {k}, ptr {a}, i64 {lda}, "
        f"ptr {b}, i64 {ldb}, double {beta}, ptr {c}, i64 {ldc}, i64 {threads})"
    )


def share_pool(lib: Blas) -> bool:
    """Run ``lib``'s parallel work on geode's native pool (once per process; True when it
    does): OpenBLAS hands its jobs to :func:`geode_blas_callback` (``runtime/native``), so
    GEMMs, the fused kernels, and numpy's own matmul take turns on one pool with one thread
    count, and OpenBLAS's workers, which spin for a long time after each call, stay asleep.
    Off with ``GEODE_BLAS_POOL=0``, or when the BLAS has no threads callback."""
    if lib in _shared:
        return True
    if os.environ.get("GEODE_BLAS_POOL", "1").strip() == "0":
        return False
    if not (lib.set_threads and lib.set_callback):
        return False
    from geode.runtime import native

    native.blas_share_pool(lib.set_callback, lib.set_threads)
    _shared.append(lib)
    return True


def _shape_text(rank: int, last: str) -> str:
    dims = [f"d{i}" for i in range(rank - 1)] + [last]
    return "(" + ", ".join(dims) + ")"


def matmul_ir(dtype: str, rank: int) -> tuple[str, str]:
    """``(entry name, module IR)`` of ``Y = A @ B`` for ``A`` of rank ``rank``."""
    _, letter, item = TYPES[dtype]
    name = f"geode_matmul_{letter}_r{rank}"
    lines = [
        GEMM_DECL,
        "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
        f"define i32 @{name}(ptr %ptrs, ptr %recs, ptr %ints) nounwind {{",
        "entry:",
    ]

    def rec(i: int) -> str:
        return f"%r{i}"

    # A: [0] ndim, [1] item, [2 .. 2+rank) dims; B at 2+rank; Y at 2+rank+4. Each record's
    # ndim is checked before the words after it are read: another rank shifts the later
    # records, and reading on could run past them.
    b0, y0 = 2 + rank, 2 + rank + 4
    for i in range(2 * rank + 8):  # every record word: A (2 + rank), B (4), Y (2 + rank)
        lines.append(f"  %p{i} = getelementptr inbounds i64, ptr %recs, i64 {i}")
        lines.append(f"  {rec(i)} = load i64, ptr %p{i}")
        for start, want, status in ((0, rank, 1), (b0, 2, 2), (y0, rank, 3)):
            if i == start:
                lines += [
                    f"  %nd{status} = icmp eq i64 {rec(i)}, {want}",
                    f"  br i1 %nd{status}, label %nd_ok{status}, label %nd_bad{status}",
                    f"nd_bad{status}:",
                    f"  ret i32 {status}",
                    f"nd_ok{status}:",
                ]
    checks = {
        1: [f"icmp eq i64 %r0, {rank}", f"icmp eq i64 %r1, {item}"],
        2: [
            f"icmp eq i64 %r{b0}, 2",
            f"icmp eq i64 %r{b0 + 1}, {item}",
            f"icmp eq i64 %r{b0 + 2}, %r{1 + rank}",
        ],
        3: [f"icmp eq i64 %r{y0}, {rank}", f"icmp eq i64 %r{y0 + 1}, {item}"]
        + [f"icmp eq i64 %r{y0 + 2 + d}, %r{2 + d}" for d in range(rank - 1)]
        + [f"icmp eq i64 %r{y0 + 1 + rank}, %r{b0 + 3}"],
    }
    for status, conds in checks.items():
        ok = "true"
        for j, c in enumerate(conds):
            lines.append(f"  %c{status}_{j} = {c}")
            nxt = f"%c{status}_{j}"
            if ok != "true":
                lines.append(f"  %a{status}_{j} = and i1 {ok}, {nxt}")
                nxt = f"%a{status}_{j}"
            ok = nxt
        lines += [
            f"  br i1 {ok}, label %ok{status}, label %bad{status}",
            f"bad{status}:",
            f"  ret i32 {status}",
            f"ok{status}:",
        ]
    m = "%r2"
    for d in range(1, rank - 1):
        lines.append(f"  %m{d} = mul i64 {m}, %r{2 + d}")
        m = f"%m{d}"
    k, n = f"%r{1 + rank}", f"%r{b0 + 3}"
    lines += [
        *(f"  %pa{i} = getelementptr inbounds ptr, ptr %ptrs, i64 {i}" for i in range(3)),
        "  %A = load ptr, ptr %pa0",
        "  %B = load ptr, ptr %pa1",
        "  %Y = load ptr, ptr %pa2",
        f"  %mz = icmp eq i64 {m}, 0",
        f"  %nz = icmp eq i64 {n}, 0",
        "  %empty = or i1 %mz, %nz",
        "  br i1 %empty, label %done, label %some",
        "some:",
        f"  %kz = icmp eq i64 {k}, 0",
        "  br i1 %kz, label %zero, label %gemm",
        "zero:",
        f"  %mn = mul i64 {m}, {n}",
        f"  %bytes = mul i64 %mn, {item}",
        "  call void @llvm.memset.p0.i64(ptr %Y, i8 0, i64 %bytes, i1 false)",
        "  br label %done",
        "gemm:",
    ]
    lines += [
        "  %pt = getelementptr inbounds i64, ptr %ints, i64 0",
        "  %threads = load i64, ptr %pt",
        gemm_call(dtype, m, n, k, [("%A", k), ("%B", n), ("%Y", n)], "%threads"),
        "  br label %done",
        "done:",
        "  ret i32 0",
        "}",
    ]
    return name, "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=16)
def matmul_kernel(dtype: str, rank: int, cache_dir: str | None = None):  # -> LLVMKernel | None
    """The native ``Y = A @ B`` kernel for ``A`` of rank ``rank`` (>= 2) and a matrix
    ``B`` of ``dtype`` (float32/float64), or None when no BLAS is found (object code
    through the disk cache in ``cache_dir`` when given)."""
    from geode.codegen.backends.llvm.compiled import LLVMKernel
    from geode.codegen.backends.llvm.kernel import build_module
    from geode.codegen.backends.llvm.target import host

    lib = blas()
    if lib is None or dtype not in TYPES or rank < 2:
        return None
    share_pool(lib)
    name, ir = matmul_ir(dtype, rank)
    target = host()
    t0 = time.perf_counter()
    loaded, from_cache = build_module(name, ir, target, cache_dir)
    args = (
        ArgSpec("A", "input", dtype, rank, _shape_text(rank, "K")),
        ArgSpec("B", "input", dtype, 2, "(K, N)"),
        ArgSpec("Y", "output", dtype, rank, _shape_text(rank, "N")),
    )
    emitted = Emitted(ir, name, args, (), False, ())
    seconds = time.perf_counter() - t0
    return LLVMKernel(
        f"matmul_{dtype}_r{rank}", emitted, loaded, target, seconds, from_cache, False
    )
