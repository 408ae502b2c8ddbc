""":func:`compile_kernel`: a scheduled loop AST -> an :class:`LLVMKernel` (see
:mod:`~geode.codegen.backends.llvm.compiled` for how it is called), through the disk
cache of object code (:func:`build_module`, the one way every module of the backend
gets linked) and a memo of the kernels in use."""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from geode.codegen.ast import Kernel
from geode.codegen.backends.llvm import background, jit, objcache, optlevel
from geode.codegen.backends.llvm.compiled import Emitted, LLVMKernel
from geode.codegen.backends.llvm.emit import emit_module
from geode.codegen.backends.llvm.objcache import module_key
from geode.codegen.backends.llvm.parallel import MIN_PARALLEL_ELEMENTS
from geode.codegen.backends.llvm.target import Target, host
from geode.errors import CodegenError

__all__ = [
    "KernelMemo",
    "LLVMKernel",
    "build_module",
    "compile_kernel",
    "drop_recent_kernels",
    "emit",
    "forget_kernels",
    "module_key",
    "abandon_compile",
    "abandon_module",
    "start_compile",
    "start_module",
    "while_alive",
]

log = logging.getLogger(__name__)


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
    choice: optlevel.Choice | None = None,
) -> tuple[jit.Loaded, bool]:
    """The machine code of module ``ir`` (exporting ``name``) linked into the process, and
    whether its object code came from the disk cache in ``cache_dir`` (None: compile in
    memory). A miss compiles the module with LLVM and stores the object code; a cached
    object that fails to link is a miss too (rebuilt, its entry rewritten), never an
    error. ``runtime``/``imports``: what the code calls (:func:`jit.load_object`);
    ``keep``: the objects owning the ``imports`` (kept alive with the code); ``choice``:
    the optimization level (:func:`optlevel.choose` of ``ir`` as a library module when
    not given); ``key``:
    the module's :func:`module_key` at that level when the caller has it.

    Code linked before and still alive, or among the :data:`KEEP_LINKED` most recent, is
    returned again (as if from the cache): LLVM keeps about 10 KB for every JIT library
    it ever linked, even once unloaded (llvmlite cannot remove a library from its
    session), so a process compiling the same models again and again would otherwise
    grow by that much per kernel each time; held, only its machine code stays mapped.
    """
    choice = choice or optlevel.choose(ir, generated=False)
    key = key or module_key(ir, target, choice.level)
    loc = objcache.location(cache_dir)
    link_key = (key, loc, name, runtime, tuple(sorted((imports or {}).items())))
    loaded = _linked.get(link_key)
    if loaded is not None:
        return loaded, True
    with _linked.lock_for(link_key):
        loaded = _linked.get(link_key)
        if loaded is not None:
            return loaded, True
        loaded, from_cache = _link(name, ir, target, loc, runtime, imports, key, choice)
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
    choice: optlevel.Choice,
) -> tuple[jit.Loaded, bool]:
    """:func:`build_module` without its memo: from the disk cache, else LLVM."""
    obj = None if cache_dir is None else objcache.load(cache_dir, key, name)
    if obj is not None:
        try:
            loaded = jit.load_object(obj, [name], runtime=runtime, imports=imports)
            loaded.level = choice.level
            return loaded, True
        except CodegenError as exc:
            log.warning(
                "kernel cache entry %s (%s) does not link, rebuilding: %s", key[:32], name, exc
            )
    t0 = time.perf_counter()
    obj = background.claim(key)
    if obj is None:
        obj = jit.compile_ir(ir, target, choice.level)
    log.debug(
        "LLVM: %s at %s in %.1f ms", name, choice.describe(), (time.perf_counter() - t0) * 1e3
    )
    if cache_dir is not None:
        objcache.store(cache_dir, key, name, obj, target.fingerprint())
    loaded = jit.load_object(obj, [name], runtime=runtime, imports=imports)
    loaded.level = choice.level
    return loaded, False


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
    emitted: Emitted | None = None,
) -> LLVMKernel:
    """Compile ``kernel`` to machine code now and return the callable :class:`LLVMKernel`.

    ``fastmath``: LLVM's ``fast`` flags on the kernel's float arithmetic (default: the
    accuracy-preserving ``reassoc arcp contract``); ``cache_dir``: the disk cache of
    object code, a folder or an :class:`~objcache.CacheLocation` (signed entries;
    :mod:`~geode.codegen.backends.llvm.objcache`; None: compile in memory);
    ``parallel=None`` runs the kernel's parallel loops on the thread pool (False: all
    serial); ``min_work``: below this many elements in every argument the parallel loops
    run on the calling thread; ``emitted``: the module :func:`start_compile` returned for
    the same kernel and arguments. The same kernel compiled twice in one process returns
    the same object. Raises :class:`~geode.errors.CodegenError` naming the kernel when it
    cannot be compiled."""
    t0 = time.perf_counter()
    target = host()
    if emitted is None:
        emitted = _emit(kernel, fastmath, parallel, target, min_work)
    choice = optlevel.choose(emitted.ir)
    key = module_key(emitted.ir, target, choice.level)
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
                emitted.entry,
                emitted.ir,
                target,
                loc,
                runtime=emitted.parallel,
                key=key,
                choice=choice,
            )
        except CodegenError as exc:
            raise CodegenError(f"kernel {kernel.name!r}: {exc}") from None
        k = LLVMKernel(
            kernel.name, emitted, loaded, target, time.perf_counter() - t0, from_cache, fastmath
        )
        _memo.put(memo_key, k)
        return k


def emit(
    kernel: Kernel, *, fastmath: bool = False, min_work: int = MIN_PARALLEL_ELEMENTS
) -> Emitted:
    """``kernel``'s module, emitted for this host (not compiled: :func:`build_module`
    links it later). Raises :class:`~geode.errors.CodegenError` when it cannot be."""
    return _emit(kernel, fastmath, None, host(), min_work)


def _emit(
    kernel: Kernel, fastmath: bool, parallel: bool | None, target: Target, min_work: int
) -> Emitted:
    try:
        return emit_module(kernel, fastmath, parallel is not False, target, min_work)
    except CodegenError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise CodegenError(f"kernel {kernel.name!r}: cannot emit LLVM IR: {exc}") from exc


def abandon_compile(emitted: Emitted) -> None:
    """Cancel the background LLVM run :func:`start_compile` began on ``emitted``'s module
    when it was never linked (nothing when it was, or never began)."""
    target = host()
    background.cancel(module_key(emitted.ir, target, optlevel.choose(emitted.ir).level))


def start_compile(
    kernel: Kernel,
    *,
    fastmath: bool = False,
    cache_dir: objcache.CacheDir | None = None,
    parallel: bool | None = None,
    min_work: int = MIN_PARALLEL_ELEMENTS,
) -> Emitted:
    """Emit ``kernel``'s module and, unless this process holds its kernel or the disk
    cache its object code, start LLVM on it on a background thread
    (:mod:`~geode.codegen.backends.llvm.background`); returns the module, for
    :func:`compile_kernel` (same arguments, ``emitted=``), which links it later. Raises
    :class:`~geode.errors.CodegenError` like :func:`compile_kernel` when it cannot be emitted."""
    target = host()
    emitted = _emit(kernel, fastmath, parallel, target, min_work)
    choice = optlevel.choose(emitted.ir)
    key = module_key(emitted.ir, target, choice.level)
    loc = objcache.location(cache_dir)
    if _memo.get((key, loc)) is not None:
        return emitted
    if loc is not None and objcache.load(loc, key, emitted.entry) is not None:
        return emitted
    background.submit(key, emitted.ir, target, choice.level)
    return emitted


def start_module(name: str, ir: str, cache_dir: objcache.CacheDir | None = None) -> None:
    """Start LLVM on the hand-written library module ``ir`` (exporting ``name``) on a
    background thread, unless this process holds it linked or the disk cache in
    ``cache_dir`` its object code: :func:`build_module` (same ``ir``, its level chosen
    likewise) then claims it."""
    target = host()
    choice = optlevel.choose(ir, generated=False)
    key = module_key(ir, target, choice.level)
    loc = objcache.location(cache_dir)
    linked = _linked.keys()
    if any(k[0] == key and k[1] == loc for k in linked):
        return
    if loc is not None and objcache.load(loc, key, name) is not None:
        return
    background.submit(key, ir, target, choice.level)


def abandon_module(ir: str) -> None:
    """Cancel the background LLVM run :func:`start_module` began on ``ir`` when nothing
    claimed it (nothing when it was claimed, or never began)."""
    background.cancel(module_key(ir, host(), optlevel.choose(ir, generated=False).level))
