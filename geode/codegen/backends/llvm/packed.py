"""MatMul against a weight packed once: the call of the native runtime's packed-weight GEMM
(``runtime/native/sgemm_packed.c``) and a native kernel ``Y = A @ B`` that makes it.

``B`` (float32, ``K x N``, a constant) reaches the kernel as its packed copy ``Bp`` of
shape ``(ceil(N / 16), K, 16)`` (:func:`geode.runtime.native.pack_weight`), so ``N`` is
fixed in the kernel. The entry (the kernels' ABI, :mod:`~geode.codegen.backends.llvm.emit`)
checks the records (status 1, 2, 3 for a bad A, Bp, Y: ranks, item sizes, ``Bp``'s panels
and ``K`` against ``A``'s last dim, ``Y``'s dims ``A``'s leading ones then ``N``), then
calls ``geode_sgemm_packed(M, N, K, 1, A, K, Bp, 0, Y, N, threads)``: ``M`` the product of
``A``'s leading dims; ``K = 0`` writes zeros and ``M = 0`` nothing.
"""

from __future__ import annotations

import functools
import time

from geode.codegen.backends.llvm.compiled import ArgSpec, Emitted
from geode.codegen.backends.llvm.ssa import SsaWriter

__all__ = [
    "PACKED_AT_DECL",
    "PACKED_BIAS_DECL",
    "PACKED_DECL",
    "PANEL",
    "packed_at_call",
    "packed_call",
    "packed_matmul_ir",
    "packed_matmul_kernel",
]

#: columns per panel of a packed weight (``runtime/native/sgemm_packed.c``'s NR)
PANEL = 16

#: the native runtime's packed-weight GEMM, as JIT code declares it
PACKED_DECL = (
    "declare void @geode_sgemm_packed(i64, i64, i64, float, ptr, i64, ptr, float, ptr, i64, i64)"
)
#: its form with A's rows anywhere (``packed_at_call``: A read transposed in place)
PACKED_AT_DECL = (
    "declare void @geode_sgemm_packed_at(i64, i64, i64, float, ptr, i64, i64, i64, i64, i64, "
    "ptr, ptr, float, ptr, i64, i64)"
)
#: its form with a bias added to every row (``packed_call(..., bias=...)``)
PACKED_BIAS_DECL = (
    "declare void @geode_sgemm_packed_bias(i64, i64, i64, float, ptr, i64, ptr, ptr, float, "
    "ptr, i64, i64)"
)


def packed_call(
    m: str,
    n: str | int,
    k: str,
    ops: list[tuple[str, str]],
    threads: str,
    beta: float = 0.0,
    bias: str | None = None,
) -> str:
    """The IR call of ``C = A @ B [+ bias] + beta C`` with ``B`` packed (``ops``:
    ``(pointer, leading dim)`` of A, Bp, C; Bp's leading dim is unused; ``bias``: a pointer
    to ``n`` floats added to every row). Each element is its sum from zero, plus the
    column's bias, plus (``beta`` 1) ``C``'s value: the bits of adding the bias, then
    ``C``, after the product."""
    (a, lda), (bp, _), (c, ldc) = ops
    if bias is None:
        return (
            f"  call void @geode_sgemm_packed(i64 {m}, i64 {n}, i64 {k}, float 1.0, ptr {a}, "
            f"i64 {lda}, ptr {bp}, float {float(beta)!r}, ptr {c}, i64 {ldc}, i64 {threads})"
        )
    return (
        f"  call void @geode_sgemm_packed_bias(i64 {m}, i64 {n}, i64 {k}, float 1.0, "
        f"ptr {a}, i64 {lda}, ptr {bp}, ptr {bias}, float {float(beta)!r}, ptr {c}, "
        f"i64 {ldc}, i64 {threads})"
    )


def packed_at_call(
    m: str, n: str | int, k: str, a_at: tuple[str, ...], bp: str, c: tuple[str, str], threads: str
) -> str:
    """The IR call of ``C = A @ B`` with ``B`` packed and ``A``'s rows anywhere
    (``geode_sgemm_packed_at``): ``a_at`` is ``(A, lda, ka, a_rows, a_bstride, row0)``
    (C's row ``i`` is A's row ``row0 + i``, at ``A + (row / a_rows) a_bstride + (row mod
    a_rows) lda``, its elements ``ka`` apart), ``c`` is ``(C, ldc)``."""
    a, lda, ka, rows, stride, row0 = a_at
    return (
        f"  call void @geode_sgemm_packed_at(i64 {m}, i64 {n}, i64 {k}, float 1.0, ptr {a}, "
        f"i64 {lda}, i64 {ka}, i64 {rows}, i64 {stride}, i64 {row0}, ptr {bp}, ptr null, "
        f"float 0.0, ptr {c[0]}, i64 {c[1]}, i64 {threads})"
    )


def packed_check(w: SsaWriter, record: tuple[str, str, list[str]], k: str, n: int) -> str:
    """The condition that ``record`` (ndim, itemsize, dims) is a float32 weight of ``K``
    rows and ``n`` columns packed in panels."""
    nd, item, dims = record
    panels = -(-n // PANEL)
    conds = [w.eq(nd, 3), w.eq(item, 4), w.eq(dims[0], panels), w.eq(dims[1], k)]
    return w.all_of([*conds, w.eq(dims[2], PANEL)])


def _record(w: SsaWriter, pos: int, rank: int, status: int) -> tuple[str, str, list[str]]:
    """One record at word ``pos``: its ndim checked (``status``) before the rest is read."""
    nd = w.word("%recs", pos)
    w.check(w.eq(nd, rank), status)
    words = [w.word("%recs", pos + 1 + j) for j in range(1 + rank)]
    return nd, words[0], words[1:]


def packed_matmul_ir(rank: int, n: int) -> tuple[str, str]:
    """``(entry name, module IR)`` of ``Y = A @ B`` for float32 ``A`` of rank ``rank`` and
    ``B`` of ``n`` columns, packed."""
    name = f"geode_packed_matmul_r{rank}_n{n}"
    w = SsaWriter()
    a = _record(w, 0, rank, 1)
    b = _record(w, 2 + rank, 3, 2)
    y = _record(w, 2 + rank + 5, rank, 3)
    k = a[2][-1]
    w.check(w.eq(a[1], 4), 1)
    w.check(packed_check(w, b, k, n), 2)
    same = [w.eq(y[2][d], a[2][d]) for d in range(rank - 1)]
    w.check(w.all_of([w.eq(y[1], 4), *same, w.eq(y[2][-1], n)]), 3)
    m = w.product(a[2][:-1])
    ptrs = [w.word("%ptrs", i, "ptr") for i in range(3)]
    threads = w.word("%ints", 0)
    w.emit(packed_call(m, n, k, [(ptrs[0], k), (ptrs[1], "0"), (ptrs[2], str(n))], threads))
    w.emit("  ret i32 0")
    head = [PACKED_DECL, f"define i32 @{name}(ptr %ptrs, ptr %recs, ptr %ints) nounwind {{"]
    return name, "\n".join([*head, "entry:", *w.lines, "}"]) + "\n"


@functools.lru_cache(maxsize=64)
def packed_matmul_kernel(rank: int, n: int, cache_dir: str | None = None):  # -> LLVMKernel
    """The native ``Y = A @ B`` kernel for float32 ``A`` of rank ``rank`` (>= 2) and a
    weight of ``n`` columns packed (object code through the disk cache in ``cache_dir``)."""
    from geode.codegen.backends.llvm.compiled import LLVMKernel
    from geode.codegen.backends.llvm.kernel import build_module
    from geode.codegen.backends.llvm.target import host

    name, ir = packed_matmul_ir(rank, n)
    target = host()
    t0 = time.perf_counter()
    loaded, from_cache = build_module(name, ir, target, cache_dir)
    lead = ", ".join(f"d{i}" for i in range(rank - 1))
    args = (
        ArgSpec("A", "input", "float32", rank, f"({lead}, K)"),
        ArgSpec("Bp", "input", "float32", 3, f"({-(-n // PANEL)}, K, {PANEL})"),
        ArgSpec("Y", "output", "float32", rank, f"({lead}, {n})"),
    )
    emitted = Emitted(ir, name, args, (), False, ())
    seconds = time.perf_counter() - t0
    kernel = LLVMKernel(
        f"packed_matmul_r{rank}_n{n}", emitted, loaded, target, seconds, from_cache, False
    )
    kernel.packed_n = n  # its B argument is a weight of n columns, packed
    return kernel
