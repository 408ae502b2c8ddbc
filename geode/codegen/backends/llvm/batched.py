"""Batched MatMul as a native kernel: ``Y[..., M, N] = A[..., M, K] @ B[..., K, N]`` with
numpy's broadcasting of the batch dims, one BLAS GEMM per matrix of ``Y``.

Entry (the kernels' ABI, :mod:`~geode.codegen.backends.llvm.emit`), for ``A`` of rank
``ra`` and ``B`` of rank ``rb`` (both >= 2, one of them > 2), ``Y`` of rank
``max(ra, rb)``: checks ranks and item sizes, ``K`` (``A[-1] == B[-2]``), ``Y``'s last two
dims (``M``, ``N``) and every batch dim (right-aligned: ``Y``'s, with ``A``'s and ``B``'s
equal to it or 1), returning status 1, 2 or 3 for a bad ``A``, ``B`` or ``Y``. With
``K = 0`` it writes zeros (numpy's result). Matrix ``t`` of ``Y`` (row-major batch index)
reads the matrices of ``A`` and ``B`` that its batch index selects (a batch dim of 1 is
broadcast: index 0). Small matrices (``M * N * K <= SMALL_GEMM``, which OpenBLAS computes
on one thread) are spread over the native pool, one matrix per chunk; larger ones run one
after another, each GEMM threaded by the BLAS itself (on the same pool, see
:func:`~geode.codegen.backends.llvm.library.share_pool`).
"""

from __future__ import annotations

import functools
import time

from geode.codegen.backends.llvm.library import GEMM_DECL, TYPES, gemm_call
from geode.codegen.backends.llvm.ssa import SsaWriter

__all__ = ["SMALL_GEMM", "batched_matmul_ir", "batched_matmul_kernel"]

#: GEMMs with at most this many multiply-adds run single-threaded in OpenBLAS
#: (its GEMM_MULTITHREAD_THRESHOLD x 65536): batches of them go to the pool instead
SMALL_GEMM = 4 * 65536

#: ctx words: A, B, Y (pointers as ints), M, N, K, the GEMMs' threads, then per batch dim:
#: Y's, A's, B's
_FIXED = 7


def _chunk_fn(name: str, dtype: str, nb: int) -> list[str]:
    """``void @name.chunk(ctx, t, n)``: matrix ``t`` of ``Y``."""
    ty = TYPES[dtype][0]
    w = SsaWriter()
    a, b, y, m, n, k, threads = (w.word("%ctx", i) for i in range(_FIXED))
    rest, a_off, b_off = "%c", "0", "0"
    a_stride, b_stride = "1", "1"
    for i in reversed(range(nb)):
        yd, ad, bd = (w.word("%ctx", _FIXED + 3 * i + j) for j in range(3))
        q = w.tmp(f"udiv i64 {rest}, {yd}")
        qy = w.tmp(f"mul i64 {q}, {yd}")
        idx = w.tmp(f"sub i64 {rest}, {qy}")
        for which, dim in (("a", ad), ("b", bd)):
            stride = a_stride if which == "a" else b_stride
            one = w.tmp(f"icmp eq i64 {dim}, 1")
            use = w.tmp(f"select i1 {one}, i64 0, i64 {idx}")
            term = w.tmp(f"mul i64 {use}, {stride}")
            if which == "a":
                a_off = w.tmp(f"add i64 {a_off}, {term}")
                a_stride = w.tmp(f"mul i64 {a_stride}, {dim}")
            else:
                b_off = w.tmp(f"add i64 {b_off}, {term}")
                b_stride = w.tmp(f"mul i64 {b_stride}, {dim}")
        rest = q
    mk, kn, mn = w.tmp(f"mul i64 {m}, {k}"), w.tmp(f"mul i64 {k}, {n}"), w.tmp(f"mul i64 {m}, {n}")
    ea, eb, ey = (
        w.tmp(f"mul i64 {a_off}, {mk}"),
        w.tmp(f"mul i64 {b_off}, {kn}"),
        w.tmp(f"mul i64 %c, {mn}"),
    )
    pa, pb, py = (w.tmp(f"inttoptr i64 {v} to ptr") for v in (a, b, y))
    ma = w.tmp(f"getelementptr inbounds {ty}, ptr {pa}, i64 {ea}")
    mb = w.tmp(f"getelementptr inbounds {ty}, ptr {pb}, i64 {eb}")
    my = w.tmp(f"getelementptr inbounds {ty}, ptr {py}, i64 {ey}")
    w.lines.append(gemm_call(dtype, m, n, k, [(ma, k), (mb, n), (my, n)], threads))
    head = [f"define internal void @{name}.chunk(ptr %ctx, i64 %c, i64 %n) {{", "entry:"]
    return head + w.lines + ["  ret void", "}"]


def _records(w: SsaWriter, ra: int, rb: int, ry: int, item: int) -> tuple[list, list, list]:
    """Load and check the three records; returns A's, B's and Y's dims."""
    pos, out = 0, []
    for status, rank in ((1, ra), (2, rb), (3, ry)):
        nd = w.word("%recs", pos)  # checked before reading on: another rank shifts the rest
        w.check(w.tmp(f"icmp eq i64 {nd}, {rank}"), status)
        its = w.word("%recs", pos + 1)
        dims = [w.word("%recs", pos + 2 + i) for i in range(rank)]
        pos += 2 + rank
        out.append((status, nd, its, rank, dims))
    for status, nd, its, rank, _ in out:
        ok = [w.tmp(f"icmp eq i64 {nd}, {rank}"), w.tmp(f"icmp eq i64 {its}, {item}")]
        w.check(w.all_of(ok), status)
    return out[0][4], out[1][4], out[2][4]


def _batch_dims(w: SsaWriter, ad: list, bd: list, yd: list) -> list[tuple[str, str, str]]:
    """Check ``Y``'s batch dims against ``A``'s and ``B``'s (right-aligned, 1 broadcasts);
    returns ``(Y's, A's, B's)`` per batch dim (``"1"`` where an operand has none)."""
    nb = len(yd) - 2
    dims = []
    for i in range(nb):
        ia, ib = i - (nb - (len(ad) - 2)), i - (nb - (len(bd) - 2))
        a = ad[ia] if ia >= 0 else "1"
        b = bd[ib] if ib >= 0 else "1"
        y = yd[i]
        conds = []
        for op, status in ((a, 1), (b, 2)):
            if op == "1":
                continue
            eq, one = w.tmp(f"icmp eq i64 {op}, {y}"), w.tmp(f"icmp eq i64 {op}, 1")
            conds.append((w.tmp(f"or i1 {eq}, {one}"), status))
        # Y's dim is the broadcast of A's and B's: the larger (the other is equal or 1)
        big_a = a if a != "1" else "1"
        big = w.tmp(f"select i1 {w.tmp(f'icmp eq i64 {big_a}, 1')}, i64 {b}, i64 {big_a}")
        conds.append((w.tmp(f"icmp eq i64 {big}, {y}"), 3))
        for cond, status in conds:
            w.check(cond, status)
        dims.append((y, a, b))
    return dims


def batched_matmul_ir(dtype: str, ra: int, rb: int) -> tuple[str, str]:
    """``(entry name, module IR)`` of the batched MatMul (see the module docstring)."""
    _, letter, item = TYPES[dtype]
    ry = max(ra, rb)
    name = f"geode_bmm_{letter}_a{ra}_b{rb}"
    w = SsaWriter()
    ad, bd, yd = _records(w, ra, rb, ry, item)
    m, k, n = ad[-2], ad[-1], bd[-1]
    w.check(w.tmp(f"icmp eq i64 {bd[-2]}, {k}"), 2)
    w.check(w.all_of([w.eq(yd[-2], m), w.eq(yd[-1], n)]), 3)
    dims = _batch_dims(w, ad, bd, yd)
    ptrs = [w.word("%ptrs", i, "ptr") for i in range(3)]
    ctx = w.tmp(f"alloca [{_FIXED + 3 * len(dims)} x i64]")
    threads = w.word("%ints", 0)  # inside a pool job (the small matrices), geode_gemm is serial
    words = [w.tmp(f"ptrtoint ptr {p} to i64") for p in ptrs] + [m, n, k, threads]
    words += [d for triple in dims for d in triple]
    for i, word in enumerate(words):
        slot = w.tmp(f"getelementptr inbounds i64, ptr {ctx}, i64 {i}")
        w.emit(f"  store i64 {word}, ptr {slot}")
    t = "1"
    for y, _, _ in dims:
        t = y if t == "1" else w.tmp(f"mul i64 {t}, {y}")
    mn = w.tmp(f"mul i64 {m}, {n}")
    total = w.tmp(f"mul i64 {t}, {mn}")
    kz = w.tmp(f"icmp eq i64 {k}, 0")
    w.emit(f"  br i1 {kz}, label %zero, label %some")
    w.emit("zero:")
    nbytes = w.tmp(f"mul i64 {total}, {item}")
    w.emit(f"  call void @llvm.memset.p0.i64(ptr {ptrs[2]}, i8 0, i64 {nbytes}, i1 false)")
    w.emit("  ret i32 0")
    w.emit("some:")
    empty = w.tmp(f"icmp eq i64 {total}, 0")
    w.emit(f"  br i1 {empty}, label %done, label %work")
    w.emit("work:")
    mnk = w.tmp(f"mul i64 {mn}, {k}")
    small = w.tmp(f"icmp ule i64 {mnk}, {SMALL_GEMM}")
    many = w.tmp(f"icmp ugt i64 {t}, 1")
    par = w.tmp(f"and i1 {small}, {many}")
    w.emit(f"  br i1 {par}, label %par, label %loop")
    w.emit("par:")
    w.emit(f"  call void @geode_parallel_for(ptr @{name}.chunk, ptr {ctx}, i64 {t}, i64 {threads})")
    w.emit("  br label %done")
    w.emit("loop:")
    w.emit("  %i = phi i64 [ 0, %work ], [ %i1, %loop ]")
    w.emit(f"  call void @{name}.chunk(ptr {ctx}, i64 %i, i64 {t})")
    w.emit("  %i1 = add i64 %i, 1")
    w.emit(f"  %more = icmp ult i64 %i1, {t}")
    w.emit("  br i1 %more, label %loop, label %done")
    w.emit("done:")
    w.emit("  ret i32 0")
    head = [
        GEMM_DECL,
        "declare void @geode_parallel_for(ptr, ptr, i64, i64)",
        "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
        *_chunk_fn(name, dtype, len(dims)),
        f"define i32 @{name}(ptr %ptrs, ptr %recs, ptr %ints) {{",
        "entry:",
    ]
    return name, "\n".join(head + w.lines + ["}"]) + "\n"


@functools.lru_cache(maxsize=32)
def batched_matmul_kernel(
    dtype: str, ra: int, rb: int, cache_dir: str | None = None
):  # -> LLVMKernel | None
    """The native batched MatMul for ``A`` of rank ``ra`` and ``B`` of rank ``rb`` (both
    >= 2, one > 2) of ``dtype`` (float32/float64), or None when no BLAS is found (object
    code through the disk cache in ``cache_dir`` when given)."""
    from geode.codegen.backends.llvm.compiled import ArgSpec, Emitted, LLVMKernel
    from geode.codegen.backends.llvm.kernel import build_module
    from geode.codegen.backends.llvm.library import blas, share_pool
    from geode.codegen.backends.llvm.target import host

    lib = blas()
    if lib is None or dtype not in TYPES or min(ra, rb) < 2 or max(ra, rb) < 3:
        return None
    share_pool(lib)
    name, ir = batched_matmul_ir(dtype, ra, rb)
    target = host()
    t0 = time.perf_counter()
    loaded, from_cache = build_module(name, ir, target, cache_dir)
    ry = max(ra, rb)
    args = (
        ArgSpec("A", "input", dtype, ra, f"(..., M, K) of rank {ra}"),
        ArgSpec("B", "input", dtype, rb, f"(..., K, N) of rank {rb}"),
        ArgSpec("Y", "output", dtype, ry, f"(broadcast batch..., M, N) of rank {ry}"),
    )
    emitted = Emitted(ir, name, args, (), True, ())
    seconds = time.perf_counter() - t0
    return LLVMKernel(
        f"matmul_{dtype}_a{ra}_b{rb}", emitted, loaded, target, seconds, from_cache, False
    )
