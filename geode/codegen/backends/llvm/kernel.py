"""Compiled kernels of the LLVM backend and :func:`compile_kernel`.

An :class:`LLVMKernel` is called as ``kernel(*inputs, *outputs, *dims, threads=0)``,
the order of ``Kernel.inputs``, ``Kernel.outputs``, ``Kernel.dims``: C-contiguous numpy
arrays of the buffers' dtypes and ranks (a 0-d buffer also takes a one-element 1-d
array; float16 arrays are passed as they are), outputs written in place, dims as ints,
``threads`` the thread count of its parallel loops (0: the pool's size). The call goes
through the native runtime's trampoline (:func:`geode.runtime.native.call`), which
releases the GIL while the kernel runs. A shape that does not match the buffer's
raises ``ValueError`` naming the argument (the entry checks it before touching
memory); a wrong dtype or rank ``TypeError``; a non-contiguous input is copied to C
order, a non-contiguous output is an error.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from geode.codegen.ast import Kernel
from geode.codegen.backends.llvm import jit, objcache
from geode.codegen.backends.llvm.emit import Emitted, emit_module
from geode.codegen.backends.llvm.parallel import MIN_PARALLEL_ELEMENTS
from geode.codegen.backends.llvm.target import Target, host
from geode.errors import CodegenError

__all__ = [
    "KernelMemo",
    "LLVMKernel",
    "build_module",
    "compile_kernel",
    "drop_recent_kernels",
    "forget_kernels",
    "while_alive",
]

log = logging.getLogger(__name__)


class LLVMKernel:
    """A kernel compiled by the LLVM backend (see the module docstring).

    ``source`` is the module's IR text, ``llvm`` the optimized IR and ``asm`` the
    machine code (computed on first access), ``compile_seconds`` the wall time of
    :func:`compile_kernel`, ``from_cache`` whether the object code came from the disk
    cache, ``address`` the entry's address (``int32 entry(ptrs, recs, ints)``, see
    :mod:`geode.codegen.backends.llvm.emit`)."""

    #: the kernel takes its thread count per call (``threads=``)
    chunked = True

    def __init__(
        self,
        name: str,
        emitted: Emitted,
        loaded: jit.Loaded,
        target: Target,
        seconds: float,
        from_cache: bool,
        fastmath: bool,
    ) -> None:
        from geode.runtime import native

        self.name = name
        self.source = emitted.ir
        self.parallel = emitted.parallel
        self.fastmath = fastmath
        self.compile_seconds = seconds
        self.from_cache = from_cache
        self.entry = emitted.entry
        self.address = loaded[emitted.entry]
        self._loaded = loaded  # keeps the machine code mapped
        self._target = target
        self._args = emitted.args
        self._dims = emitted.dims
        self._n_in = emitted.n_inputs
        self._n = len(emitted.args)
        self._n_dims = len(emitted.dims)
        self._n_args = self._n + self._n_dims
        self._dtypes = tuple(np.dtype(a.dtype) for a in emitted.args)
        self._call = native.call
        self._argument_error = native.ArgumentError

    def __call__(self, *args: Any, threads: int = 0) -> None:
        """Run the kernel on ``(*inputs, *outputs, *dims)``."""
        n = self._n
        if len(args) != self._n_args:
            self._explain(args)
        arrays = args[:n]
        for a, dt in zip(arrays, self._dtypes):
            # numpy's dtypes of native byte order are singletons: ``is`` is the fast test
            if type(a) is not np.ndarray or (a.dtype is not dt and a.dtype != dt):
                arrays = self._coerce(arrays)
                break
        ints = args[n:] + (threads,) if self._n_dims else (threads,)
        try:
            status = self._call(self.address, self._n_in, arrays, ints)
        except self._argument_error as exc:
            arrays = self._coerce(arrays, exc.index)
            status = self._call(self.address, self._n_in, arrays, ints)
        except (TypeError, OverflowError, ValueError) as exc:
            self._explain(args)
            raise TypeError(f"kernel {self.name}: {exc}") from None
        if status:
            self._bad_argument(status - 1)

    def call(self, arrays: tuple, ints: tuple) -> None:
        """The lean entry for callers that guarantee the arrays' dtypes (the runtime's
        AI Core steps): ``arrays`` the inputs and outputs, ``ints`` the dims then the
        thread count. Shapes, ranks, item sizes and contiguity are still checked (by the
        trampoline and the kernel's entry); a non-contiguous input is copied."""
        try:
            status = self._call(self.address, self._n_in, arrays, ints)
        except self._argument_error as exc:
            arrays = self._coerce(arrays, exc.index)
            status = self._call(self.address, self._n_in, arrays, ints)
        if status:
            self._bad_argument(status - 1)

    def _bad_argument(self, i: int) -> None:
        """Raise the ``ValueError`` for argument ``i`` the entry refused."""
        a = self._args[i]
        if a.rank == 0:
            raise ValueError(f"kernel {self.name}: argument {a.name} must hold exactly one element")
        raise ValueError(f"kernel {self.name}: argument {a.name} must have shape {a.shape_text}")

    def _explain(self, args: tuple[Any, ...]) -> None:
        """Raise ``TypeError`` describing what a bad argument list should be."""
        arrays, dims = self._args, self._dims
        if len(args) != len(arrays) + len(dims):
            raise TypeError(
                f"kernel {self.name}: expected {len(arrays)} arrays "
                f"({', '.join(a.name for a in arrays)}) and {len(dims)} dims "
                f"({', '.join(dims)}), got {len(args)} arguments"
            )
        for d, name in zip(args[len(arrays) :], dims):
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
                raise TypeError(f"kernel {self.name}: dim {name} must be an int, got {d!r}")

    def _coerce(self, arrays: tuple[Any, ...], bad: int | None = None) -> tuple[Any, ...]:
        """Check dtypes and ranks; copy non-contiguous inputs to C order."""
        out = []
        for i, (a, spec) in enumerate(zip(arrays, self._args)):
            want = np.dtype(spec.dtype)
            if (
                not isinstance(a, np.ndarray)
                or a.dtype != want
                or max(a.ndim, 1) != max(spec.rank, 1)
            ):
                got = f"{a.dtype}[{a.ndim}-d]" if isinstance(a, np.ndarray) else type(a).__name__
                raise TypeError(
                    f"kernel {self.name}: argument {spec.name} must be a {spec.dtype} array "
                    f"of rank {spec.rank}, got {got}"
                )
            if not a.flags.c_contiguous or (i == bad and spec.role == "input"):
                if spec.role == "output":
                    raise TypeError(f"kernel {self.name}: output {spec.name} must be C-contiguous")
                a = np.ascontiguousarray(a)
            if spec.role == "output" and not a.flags.writeable:
                raise TypeError(f"kernel {self.name}: output {spec.name} is read-only")
            out.append(a)
        return tuple(out)

    @functools.cached_property
    def llvm(self) -> str:
        """The optimized LLVM IR of the kernel's module."""
        return jit.optimized_ir(self.source, self._target)

    @functools.cached_property
    def asm(self) -> str:
        """The kernel's machine code as assembly text."""
        return jit.assembly(self.source, self._target)

    def __repr__(self) -> str:
        how = "cached" if self.from_cache else f"{self.compile_seconds * 1e3:.1f} ms"
        return f"<LLVMKernel {self.name} ({how}{', parallel' if self.parallel else ''})>"


class KernelMemo:
    """Compiled kernels (or linked code) by key, for as long as they are in use, plus
    the ``keep`` most recently asked for (none by default). Two threads asking for the
    same key get one kernel (:meth:`lock_for` serializes its build)."""

    def __init__(self, keep: int = 0) -> None:
        self.keep = keep
        self._alive: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()
        self._recent: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._locks = [threading.Lock() for _ in range(64)]
        _memos.add(self)

    def get(self, key: Any) -> Any:
        """The value of ``key`` if one is alive (it becomes the most recent), else None."""
        with self._lock:
            value = self._alive.get(key)
            if value is not None:
                self._hold(key, value)
            return value

    def put(self, key: Any, value: Any) -> None:
        """Remember ``value`` as the value of ``key``."""
        with self._lock:
            self._alive[key] = value
            self._hold(key, value)

    def _hold(self, key: Any, value: Any) -> None:
        if self.keep <= 0:
            return
        self._recent[key] = value
        self._recent.move_to_end(key)
        while len(self._recent) > self.keep:
            self._recent.popitem(last=False)

    def lock_for(self, key: Any) -> threading.Lock:
        """The lock to hold while building the value of ``key``."""
        return self._locks[hash(key) % len(self._locks)]

    def drop_recent(self) -> None:
        """Stop holding the recent values: those nothing else uses die now."""
        with self._lock:
            self._recent.clear()

    def clear(self) -> None:
        """Forget every value (their users keep theirs)."""
        with self._lock:
            self._recent.clear()
            self._alive.clear()

    def keys(self) -> list[Any]:
        """Keys of the values alive."""
        with self._lock:
            return list(self._alive.keys())

    def items(self) -> list[tuple[Any, Any]]:
        """``(key, value)`` of the values alive."""
        with self._lock:
            return list(self._alive.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._alive)


_memos: weakref.WeakSet[KernelMemo] = weakref.WeakSet()

#: linked machine code held after its last kernel died (see :func:`build_module`)
KEEP_LINKED = 64

#: linked machine code by (cache key, cache location, entry, what it calls)
_linked = KernelMemo(KEEP_LINKED)


def drop_recent_kernels() -> None:
    """Stop holding recently linked code (:func:`build_module`): machine code no kernel
    uses is unloaded now."""
    for memo in list(_memos):
        memo.drop_recent()


def forget_kernels() -> None:
    """Forget every kernel and linked code this process memoized (models keep theirs):
    the next compile of any kernel goes to the disk cache or LLVM."""
    for memo in list(_memos):
        memo.clear()


def build_module(
    name: str,
    ir: str,
    target: Target,
    cache_dir: objcache.CacheDir | None,
    *,
    runtime: bool = True,
    imports: dict[str, int] | None = None,
    keep: Any = None,
    key: str | None = None,
) -> tuple[jit.Loaded, bool]:
    """The machine code of module ``ir`` (exporting ``name``) linked into the process, and
    whether its object code came from the disk cache in ``cache_dir`` (None: compile in
    memory). A miss compiles the module with LLVM and stores the object code; a cached
    object that fails to link is a miss too (rebuilt, its entry rewritten), never an
    error. ``runtime``/``imports``: what the code calls (:func:`jit.load_object`);
    ``keep``: the objects owning the ``imports`` (kept alive with the code); ``key``: the
    module's :func:`objcache.cache_key` when the caller has it.

    Code linked before and still alive, or among the :data:`KEEP_LINKED` most recent, is
    returned again (as if from the cache): LLVM keeps about 10 KB for every JIT library
    it ever linked, even once unloaded (llvmlite cannot remove a library from its
    session), so a process compiling the same models again and again would otherwise
    grow by that much per kernel each time; held, only its machine code stays mapped.
    """
    key = key or objcache.cache_key(ir, target.fingerprint())
    loc = objcache.location(cache_dir)
    link_key = (key, loc, name, runtime, tuple(sorted((imports or {}).items())))
    loaded = _linked.get(link_key)
    if loaded is not None:
        return loaded, True
    with _linked.lock_for(link_key):
        loaded = _linked.get(link_key)
        if loaded is not None:
            return loaded, True
        loaded, from_cache = _link(name, ir, target, loc, runtime, imports, key)
        loaded.keep = keep
        _linked.put(link_key, loaded)
        return loaded, from_cache


def _link(
    name: str,
    ir: str,
    target: Target,
    cache_dir: objcache.CacheDir | None,
    runtime: bool,
    imports: dict[str, int] | None,
    key: str,
) -> tuple[jit.Loaded, bool]:
    """:func:`build_module` without its memo: from the disk cache, else LLVM."""
    obj = None if cache_dir is None else objcache.load(cache_dir, key, name)
    if obj is not None:
        try:
            return jit.load_object(obj, [name], runtime=runtime, imports=imports), True
        except CodegenError as exc:
            log.warning(
                "kernel cache entry %s (%s) does not link, rebuilding: %s", key[:32], name, exc
            )
    obj = jit.compile_ir(ir, target)
    if cache_dir is not None:
        objcache.store(cache_dir, key, name, obj, target.fingerprint())
    return jit.load_object(obj, [name], runtime=runtime, imports=imports), False


def while_alive(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Memoize ``fn`` (arguments hashable) in a :class:`KernelMemo`: the same arguments
    give the same kernel while it is in use; a None result is not kept.
    ``fn.cache_clear()`` forgets them all, ``fn.memo`` is the memo."""
    memo = KernelMemo()

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        hit = memo.get(args)
        if hit is not None:
            return hit
        with memo.lock_for(args):
            hit = memo.get(args)
            if hit is not None:
                return hit
            value = fn(*args)
            if value is not None:
                memo.put(args, value)
            return value

    wrapper.cache_clear = memo.clear  # type: ignore[attr-defined]
    wrapper.memo = memo  # type: ignore[attr-defined]
    return wrapper


#: kernels of :func:`compile_kernel` by (key, cache location), while in use
_memo = KernelMemo()


def compile_kernel(
    kernel: Kernel,
    *,
    fastmath: bool = False,
    cache_dir: objcache.CacheDir | None = None,
    parallel: bool | None = None,
    min_work: int = MIN_PARALLEL_ELEMENTS,
) -> LLVMKernel:
    """Compile ``kernel`` to machine code now and return the callable :class:`LLVMKernel`.

    ``fastmath``: LLVM's ``fast`` flags on the kernel's float arithmetic (default: the
    accuracy-preserving ``reassoc arcp contract``); ``cache_dir``: the disk cache of
    object code, a folder or an :class:`~objcache.CacheLocation` (signed entries;
    :mod:`~geode.codegen.backends.llvm.objcache`; None: compile in memory);
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
    loc = objcache.location(cache_dir)
    memo_key = (key, loc)
    hit = _memo.get(memo_key)
    if hit is not None:
        return hit
    with _memo.lock_for(memo_key):
        hit = _memo.get(memo_key)
        if hit is not None:
            return hit
        try:
            loaded, from_cache = build_module(
                emitted.entry, emitted.ir, target, loc, runtime=emitted.parallel, key=key
            )
        except CodegenError as exc:
            raise CodegenError(f"kernel {kernel.name!r}: {exc}") from None
        k = LLVMKernel(
            kernel.name, emitted, loaded, target, time.perf_counter() - t0, from_cache, fastmath
        )
        _memo.put(memo_key, k)
        return k
