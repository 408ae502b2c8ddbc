""":func:`compile_kernel`: a scheduled loop AST -> an :class:`LLVMKernel` (see
:mod:`~geode.codegen.backends.llvm.compiled` for how it is called), through the disk
cache of object code and a process-wide memo of the kernels in use."""

from __future__ import annotations

import os
import threading
import time
import weakref

from geode.codegen.ast import Kernel
from geode.codegen.backends.llvm import jit, objcache
from geode.codegen.backends.llvm.compiled import LLVMKernel
from geode.codegen.backends.llvm.emit import emit_module
from geode.codegen.backends.llvm.parallel import MIN_PARALLEL_ELEMENTS
from geode.codegen.backends.llvm.target import host
from geode.errors import CodegenError

__all__ = ["LLVMKernel", "compile_kernel"]


#: kernels alive in this process by (key, cache folder): compiled once while in use
_memo: weakref.WeakValueDictionary[tuple[str, str | None], LLVMKernel] = (
    weakref.WeakValueDictionary()
)
_memo_lock = threading.Lock()
#: striped locks: two threads compiling the same kernel compile it once
_key_locks = [threading.Lock() for _ in range(64)]


def compile_kernel(
    kernel: Kernel,
    *,
    fastmath: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    parallel: bool | None = None,
    min_work: int = MIN_PARALLEL_ELEMENTS,
) -> LLVMKernel:
    """Compile ``kernel`` to machine code now and return the callable :class:`LLVMKernel`.

    ``fastmath``: LLVM's ``fast`` flags on the kernel's float arithmetic (default: the
    accuracy-preserving ``reassoc arcp contract``); ``cache_dir``: the disk cache of
    object code (:mod:`~geode.codegen.backends.llvm.objcache`; None: compile in memory);
    ``parallel=None`` runs the kernel's parallel loops on the thread pool (False: all
    serial); ``min_work``: below this many elements in every argument the parallel loops
    run on the calling thread. The same kernel compiled twice in one process returns the same object.
    Raises :class:`~geode.errors.CodegenError` naming the kernel when it cannot be
    compiled."""
    t0 = time.perf_counter()
    target = host()
    try:
        emitted = emit_module(kernel, fastmath, parallel is not False, target, min_work)
    except CodegenError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise CodegenError(f"kernel {kernel.name!r}: cannot emit LLVM IR: {exc}") from exc
    key = objcache.cache_key(emitted.ir, target.fingerprint())
    cdir = None if cache_dir is None else os.fspath(cache_dir)
    memo_key = (key, cdir)
    with _memo_lock:
        hit = _memo.get(memo_key)
        if hit is not None:
            return hit
        lock = _key_locks[hash(memo_key) % len(_key_locks)]
    with lock:
        hit = _memo.get(memo_key)
        if hit is not None:
            return hit
        obj = None if cdir is None else objcache.load(cdir, key, emitted.entry)
        from_cache = obj is not None
        if obj is None:
            try:
                obj = jit.compile_ir(emitted.ir, target)
            except CodegenError as exc:
                raise CodegenError(f"kernel {kernel.name!r}: {exc}") from None
            if cdir is not None:
                objcache.store(cdir, key, emitted.entry, obj, target.fingerprint())
        loaded = jit.load_object(obj, [emitted.entry], runtime=emitted.parallel)
        k = LLVMKernel(
            kernel.name, emitted, loaded, target, time.perf_counter() - t0, from_cache, fastmath
        )
        with _memo_lock:
            _memo[memo_key] = k
        return k
