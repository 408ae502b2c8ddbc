"""Compiled numba kernels: :class:`NumbaKernel`, the compile (through the disk cache),
and the thread count of numba's parallel kernels.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import linecache
import logging
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numba
import numpy as np

from geode.codegen import cache as _cache
from geode.codegen.ast import (
    Kernel,
)
from geode.codegen.backends import vmath as _vmath
from geode.codegen.backends.chunks import (
    CHUNK_SIGNATURE,
    LAUNCH_SIGNATURE,
    _g_launch,
    launch_chunks,
    start_threads,
)
from geode.codegen.backends.numba.emitter import emit_module_source
from geode.codegen.backends.numba.helpers import SLP_VECTORIZE, backend_fingerprint
from geode.codegen.backends.numba.pysource import Emitted
from geode.config import OptionError
from geode.errors import CodegenError

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------
# compiling
# ---------------------------------------------------------------------------------


class NumbaKernel:
    """A compiled kernel: call it as ``kernel(*inputs, *outputs, *dims)``.

    ``fn`` is the numba dispatcher (compiled for exactly one signature; compiling
    more is disabled so a wrong dtype or rank raises ``TypeError``); ``__call__``
    adapts float16 arrays (uint16 views) and 0-d arrays (1-element views), then
    calls it. A chunked kernel (``chunked``; see "Chunked kernels") also has
    ``rows``, the chunk function compiled with it (a numba ``cfunc``); ``fn`` then takes
    ``launch_args`` (the chunk functions' addresses, the chunk count and the thread
    count, 0: numba's setting) after the dims, which ``__call__`` passes with its
    ``threads`` keyword as the thread count (the threads the launch runs on, set for the
    calling thread as ``numba.set_num_threads`` would, in compiled code). A kernel with a
    streaming body compiles its plain chunk function on the first call that needs it
    (``__call__``: the entry reports it, see :meth:`_Emitter.chunk_entry`), through a
    cache entry of its own. ``source`` is the generated module, ``llvm``/``asm``
    numba's optimised IR and machine code (computed on first access; a chunked kernel's
    chunk functions first, then its entry), ``compile_seconds`` the wall time of
    :func:`compile_kernel` plus that of any chunk function compiled later,
    ``from_cache`` whether the machine code :func:`compile_kernel` returned came from the
    disk cache.
    """

    def __init__(
        self,
        name: str,
        fn: Any,
        emitted: Emitted,
        key: str,
        seconds: float,
        from_cache: bool,
        fastmath: bool,
        cache_path: str | None,
        compile_rows: Callable[[str], Any],
    ) -> None:
        self.name = name
        self.fn = fn
        self.source = emitted.source
        self.func_name = emitted.func_name
        self.parallel = emitted.parallel
        self.fastmath = fastmath
        self.key = key
        self.compile_seconds = seconds
        self.from_cache = from_cache
        self.cache_path = cache_path
        self.signature = fn.signatures[0]
        self._half = tuple(emitted.half_args)
        self._zero_d = tuple(emitted.zero_d_args)
        self._adapt = bool(self._half or self._zero_d)
        self._arrays = tuple(emitted.arrays)
        self._dims = tuple(emitted.dims)
        self.rows = getattr(fn, "__geode_rows__", None)
        #: a chunked kernel's chunk functions by name: the compiled cfunc, or None until
        #: the first call that needs it (see "Chunked kernels")
        self._chunk_fns: dict[str, Any] = {}
        if self.rows is not None:
            names = [emitted.rows_name, *([emitted.nt_rows_name] if emitted.nt_rows_name else [])]
            self._chunk_fns = {n: None for n in names}
            self._chunk_fns[emitted.nt_rows_name or emitted.rows_name] = self.rows
        self._compile_rows = compile_rows
        self._rows_lock = threading.Lock()
        self._rows_error: CodegenError | None = None
        #: what ``fn`` takes after the dims: a chunked kernel's (chunk functions'
        #: addresses, 0 for one not compiled yet; chunk count; thread count 0: numba's
        #: setting), else nothing
        self.launch_args = self._launch_args()

    def _launch_args(self) -> tuple[int, ...]:
        if self.rows is None:
            return ()
        addrs = tuple(0 if f is None else f.address for f in self._chunk_fns.values())
        return (*addrs, launch_chunks(), 0)

    def _compile_missing(self, name: str) -> None:
        """Compile the chunk function ``name`` if it is not yet, once, whichever thread
        asks first; a failure is remembered and raised again at every later need."""
        with self._rows_lock:
            if self._chunk_fns[name] is not None:
                return
            if self._rows_error is not None:
                raise self._rows_error
            t0 = time.perf_counter()
            try:
                self._chunk_fns[name] = self._compile_rows(name)
            except CodegenError as exc:
                self._rows_error = exc
                raise
            self.compile_seconds += time.perf_counter() - t0
            self.launch_args = self._launch_args()
            log.debug("kernel %s: compiled %s on first need", self.name, name)

    def compile_chunk_functions(self) -> None:
        """Compile now the chunk functions a chunked kernel left for first need (see
        "Chunked kernels"; nothing to do for other kernels): for a warm-up ahead of the
        first call. Raises :class:`CodegenError` if that compile fails."""
        for name in list(self._chunk_fns):
            self._compile_missing(name)

    @property
    def chunked(self) -> bool:
        """Is this a chunked kernel (see "Chunked kernels")?"""
        return self.rows is not None

    def __call__(self, *args: Any, threads: int = 0) -> None:
        """Run the kernel on ``(*inputs, *outputs, *dims)``; outputs are written in place.
        ``threads`` (a chunked kernel's launch; 1 to ``NUMBA_NUM_THREADS``, 0 for numba's
        current setting) is ignored by other kernels, which run on numba's setting."""
        given = args
        if self._adapt:
            if len(args) != len(self._arrays) + len(self._dims):
                self._coerce(args)  # raises, naming what was expected
            lst = list(args)
            for i in self._zero_d:
                a = lst[i]
                if isinstance(a, np.ndarray) and a.ndim == 0:
                    lst[i] = a.reshape(1)
            for i in self._half:
                a = lst[i]
                if isinstance(a, np.ndarray) and a.dtype == np.float16:
                    lst[i] = a.view(np.uint16)
            args = tuple(lst)
        launch = (*self.launch_args[:-1], threads) if self.launch_args else ()
        try:
            need = self.fn(*args, *launch)
        except TypeError:
            args = tuple(self._coerce(given))  # from the caller's arrays (float16 ones)
            need = self.fn(*args, *launch)
        if need:  # a chunk function not compiled yet: the entry ran nothing
            self._compile_missing(list(self._chunk_fns)[need - 1])  # raises if it fails
            self.fn(*args, *self.launch_args[:-1], threads)

    def _coerce(self, args: tuple[Any, ...]) -> list[Any]:
        """Slow path after a signature mismatch: make inputs C-contiguous, or explain."""
        arrays, dims = self._arrays, self._dims
        if len(args) != len(arrays) + len(dims):
            raise TypeError(
                f"kernel {self.name}: expected {len(arrays)} arrays "
                f"({', '.join(a[0] for a in arrays)}) and {len(dims)} dims "
                f"({', '.join(dims)}), got {len(args)} arguments"
            )
        out: list[Any] = []
        for a, (name, role, dtype, ndim) in zip(args, arrays):
            want = np.dtype(dtype)
            if not isinstance(a, np.ndarray) or a.dtype != want or max(a.ndim, 1) != max(ndim, 1):
                got = f"{a.dtype}[{a.ndim}-d]" if isinstance(a, np.ndarray) else type(a).__name__
                raise TypeError(
                    f"kernel {self.name}: argument {name} must be a {dtype} array "
                    f"of rank {ndim}, got {got}"
                )
            if not a.flags.c_contiguous:
                if role == "output":
                    raise TypeError(f"kernel {self.name}: output {name} must be C-contiguous")
                a = np.ascontiguousarray(a)
            if a.ndim == 0:
                a = a.reshape(1)
            if dtype == "float16":
                a = a.view(np.uint16)
            out.append(a)
        for d, name in zip(args[len(arrays) :], dims):
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
                raise TypeError(f"kernel {self.name}: dim {name} must be an int, got {d!r}")
            out.append(int(d))
        return out

    @functools.cached_property
    def _inspectable(self) -> tuple[Any, list[Any]]:
        """(entry dispatcher, chunk cfuncs) holding LLVM IR: numba keeps none for code
        loaded from its cache, so that is recompiled in memory, as is a chunk function
        not compiled yet."""
        module, options = self.fn.__geode_module__, self.fn.__geode_options__
        entry_cached = sum(self.fn.stats.cache_hits.values()) > 0
        with _numba_compile_settings(self.fn.__geode_interleave__):
            # a cfunc loaded from the cache (cache_hits) holds no IR either
            rows = [
                f
                if f is not None and not f.cache_hits
                else _compile_rows(module.__dict__[name], options, None)
                for name, f in self._chunk_fns.items()
            ]
            if not entry_cached:
                return self.fn, rows
            fn = numba.njit(**options)(self.fn.py_func)
            fn.compile(self.signature)
        return fn, rows

    @functools.cached_property
    def llvm(self) -> str:
        """numba's optimised LLVM IR for the kernel (recompiled if it came from the cache)."""
        fn, rows = self._inspectable
        return "\n".join([*(r.inspect_llvm() for r in rows), str(fn.inspect_llvm(self.signature))])

    @functools.cached_property
    def asm(self) -> str:
        """The kernel's machine code as assembly (recompiled if it came from the cache)."""
        fn, rows = self._inspectable
        parts = [r._library.get_asm_str() for r in rows]
        return "\n".join([*parts, str(fn.inspect_asm(self.signature))])

    def __repr__(self) -> str:
        how = "cached" if self.from_cache else f"{self.compile_seconds:.2f}s"
        return f"<NumbaKernel {self.name} ({how}{', parallel' if self.parallel else ''})>"


@contextlib.contextmanager
def _numba_compile_settings(interleave: int = 1) -> Iterator[None]:
    """Hold numba's compiler lock and turn SLP vectorization on for our compile only;
    with ``interleave > 1`` also force LLVM's vector interleave count to it (reset to 0,
    LLVM's own choice, afterwards)."""
    import llvmlite.binding as llvm
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        old = config.SLP_VECTORIZE
        config.SLP_VECTORIZE = int(SLP_VECTORIZE)
        if interleave > 1:
            llvm.set_option("geode", f"-force-vector-interleave={int(interleave)}")
        try:
            yield
        finally:
            config.SLP_VECTORIZE = old
            if interleave > 1:
                llvm.set_option("geode", "-force-vector-interleave=0")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _compile_error(kernel: Kernel, exc: BaseException, source: str, filename: str) -> CodegenError:
    text = _ANSI.sub("", str(exc))
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    msg = f"numba failed to compile kernel {kernel.name!r}: {type(exc).__name__}: {first}"
    lines = source.splitlines()
    hits = re.findall(r'File "([^"]*)", line (\d+)', text)
    numbers = [
        int(n)
        for f, n in hits
        if f == filename or os.path.basename(f) == os.path.basename(filename)
    ]
    if not numbers:
        # e.g. "NameError: name 'acc' is not defined" comes without a location
        m = re.search(r"name '(\w+)' is not defined", text)
        if m:
            pat = re.compile(rf"\b{re.escape(m.group(1))}\b")
            start = next((i for i, ln in enumerate(lines) if ln.startswith("def ")), 0)
            numbers = [i + 1 for i in range(start, len(lines)) if pat.search(lines[i])][:1]
    if numbers:
        n = numbers[-1]
        if 1 <= n <= len(lines):
            msg += f"\n  generated source line {n}: {lines[n - 1].strip()}"
    return CodegenError(msg)


#: kernels alive in this process by (key, cache folder): compiled once while in use,
#: forgotten with the last model using them (so are their modules, see compile_kernel)
_memo: weakref.WeakValueDictionary[tuple[str, str | None], NumbaKernel] = (
    weakref.WeakValueDictionary()
)
_memo_lock = threading.Lock()
#: striped locks: two threads compiling the same kernel compile it once
_key_locks = [threading.Lock() for _ in range(64)]


#: (module name, source) of kernels that died, for :func:`release_dead_modules`
_dead_modules: list[tuple[str, str]] = []


def _forget_module(name: str, source: str) -> None:
    """Note that the kernel of module ``name`` died (a finalizer: it may run inside any
    allocation, even while a module is being loaded, so it only takes note)."""
    _dead_modules.append((name, source))


def release_dead_modules() -> int:
    """Drop the modules of kernels that died from ``sys.modules``, and their source from
    ``linecache``, unless a live kernel uses the module again (a later compile of the
    same source loads it anew); returns how many were dropped. Every compile calls it."""
    dropped = 0
    while _dead_modules:
        name, source = _dead_modules.pop()
        with _memo_lock:
            used = any(f"geode_k_{key[:32]}" == name for key, _ in list(_memo.keys()))
        if used:
            continue
        with _cache.module_lock:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__geode_source__", None) == source:
                del sys.modules[name]
                linecache.cache.pop(getattr(module, "__file__", None), None)
                dropped += 1
    return dropped


class _Loaded(NamedTuple):
    """A kernel module loaded for compiling: the module, its cache entry (None: compile
    in memory), the file name numba reports, the njit options and interleave count."""

    module: Any
    entry: Any
    filename: str
    options: dict[str, Any]
    interleave: int


def _load(kernel: Kernel, emitted: Emitted, key: str, cache_dir: str | None) -> _Loaded:
    """Prepare ``key``'s cache entry (when ``cache_dir`` is set) and import the kernel's
    module from it (or from memory), with its bodies wrapped as ``noalias`` dispatchers."""
    entry = None
    module_name = f"geode_k_{key[:32]}"
    filename = f"<geode kernel {kernel.name} {key[:12]}>"
    if cache_dir is not None:
        try:
            entry = _cache.prepare_entry(cache_dir, key, emitted.source)
            module_name, filename = entry.module_name, str(entry.module_path)
        except _cache.UntrustedCacheError as exc:  # reported once, naming the folder
            log.debug("kernel cache not used for %s: %s", kernel.name, exc)
        except OSError as exc:
            log.warning(
                "kernel cache %s unusable (%s): compiling %s in memory", cache_dir, exc, kernel.name
            )
    try:
        module = _cache.load_module(emitted.source, module_name, filename)
        options = dict(module.NJIT_OPTIONS)
        interleave = int(getattr(module, "INTERLEAVE", 1))
        # numba's FunctionCache is attached by the caller, pinned to the cache entry
        options["cache"] = False
    except CodegenError:
        raise
    except Exception as exc:
        raise _compile_error(kernel, exc, emitted.source, filename) from exc
    for name in (emitted.body_name, emitted.nt_body_name):
        if name:
            # a module loaded before (same source) already holds the dispatcher
            body = module.__dict__[name]
            module.__dict__[name] = _noalias_njit(getattr(body, "py_func", body), options)
    return _Loaded(module, entry, filename, options, interleave)


def _compile_loaded(
    kernel: Kernel,
    emitted: Emitted,
    loaded: _Loaded,
    cache_dir: str | None,
    work: Callable[[Any], tuple[Any, bool]],
    launcher: bool = True,
) -> tuple[Any, Any, bool]:
    """Run ``work(entry)`` (compile through the cache entry, or in memory for None;
    returns its result and whether it came from the cache) under numba's compile
    settings, with the runtime helpers compiled first unless the entry is trusted. A
    trusted entry numba still cannot load is discarded and rebuilt; an entry that fails
    otherwise (a full disk...) is given up for an in-memory compile; a compile error is
    a :class:`CodegenError`. The entry is committed after a fresh compile. Returns
    ``(result, entry, from_cache)``. ``launcher=False``: the chunk launcher is not among the helpers
    (a chunk function compiled on its own does not call it)."""
    entry = loaded.entry
    while True:
        try:
            if not (entry is not None and entry.trusted):
                _compile_helpers(emitted, None if entry is None else cache_dir, launcher)
            with _numba_compile_settings(loaded.interleave):
                result, from_cache = work(entry)
        except Exception as exc:
            if entry is not None and entry.trusted:
                # verified files that numba still cannot load: never trust them again
                log.warning(
                    "kernel cache entry %s failed to load (%s): rebuilding", entry.directory, exc
                )
                _cache.discard_entry(entry)
                continue
            if entry is not None:
                # maybe the cache (a full disk...): a compile error fails again in memory
                log.debug("compiling %s with the disk cache failed: %s", kernel.name, exc)
                entry = None
                continue
            raise _compile_error(kernel, exc, emitted.source, loaded.filename) from exc
        break
    if entry is not None and not from_cache:
        try:
            _cache.commit_entry(entry)
        except OSError as exc:  # the kernel is fine; only the cache entry is lost
            log.warning("kernel cache entry %s not saved: %s", entry.directory, exc)
    return result, entry, from_cache


def _build(
    kernel: Kernel, emitted: Emitted, key: str, cache_dir: str | None, fastmath: bool
) -> tuple[Any, bool, str | None]:
    loaded = _load(kernel, emitted, key, cache_dir)
    module, options = loaded.module, loaded.options
    py_func = module.__dict__[emitted.func_name]
    # a chunked kernel compiles its streaming chunk function when it has one (what
    # geode's large outputs run), else the plain one; the other on first need
    eager = emitted.nt_rows_name or emitted.rows_name
    if eager is not None:
        start_threads()  # before the entry's code is loaded: it resolves the pool's symbols

    def work(entry: Any) -> tuple[Any, bool]:
        rows = None if eager is None else _compile_rows(module.__dict__[eager], options, entry)
        fn = numba.njit(**options)(py_func)
        if entry is not None:
            _cache.attach_numba_cache(fn, entry)
        fn.compile(module.SIGNATURE)
        hit = sum(fn.stats.cache_hits.values()) > 0 and (rows is None or rows.cache_hits > 0)
        return (fn, rows), hit

    (fn, rows), entry, from_cache = _compile_loaded(kernel, emitted, loaded, cache_dir, work)
    fn.disable_compile()
    fn.__geode_rows__ = rows
    fn.__geode_module__ = module
    fn.__geode_options__ = options
    fn.__geode_interleave__ = loaded.interleave
    return fn, from_cache, (str(entry.directory) if entry is not None else None)


def _compile_lazy_rows(
    kernel: Kernel, emitted: Emitted, key: str, cache_dir: str | None, name: str
) -> Any:
    """Compile the chunk function ``name`` of a kernel with a streaming body, the one
    :func:`_build` left for first need, through a cache entry of its own (the kernel's
    key and ``name`` hashed), so the kernel's committed entry is never changed."""
    sub = hashlib.sha256(f"{key}:{name}".encode()).hexdigest()
    loaded = _load(kernel, emitted, sub, cache_dir)

    def work(entry: Any) -> tuple[Any, bool]:
        rows = _compile_rows(loaded.module.__dict__[name], loaded.options, entry)
        return rows, rows.cache_hits > 0

    rows, _, _ = _compile_loaded(kernel, emitted, loaded, cache_dir, work, launcher=False)
    return rows


def _compile_helpers(emitted: Emitted, cache_dir: str | None, launcher: bool = True) -> None:
    """Compile (or load from ``cache_dir``) the runtime helpers a kernel's compile links in:
    the chunk launcher of a chunked kernel (unless ``launcher`` is False) and the vmath
    functions it calls. A kernel loaded from its cache entry already holds their code and
    needs none of them."""
    if launcher and emitted.rows_name is not None:
        _cache.compile_helper(_g_launch, LAUNCH_SIGNATURE, cache_dir)
    for name, dtype in emitted.vmath:
        fn = getattr(_vmath, name)
        arity = len(inspect.signature(fn.py_func).parameters)
        _cache.compile_helper(fn, (numba.from_dtype(np.dtype(dtype)),) * arity, cache_dir)


def _serial_options(options: dict[str, Any]) -> dict[str, Any]:
    """A kernel module's ``NJIT_OPTIONS`` for its chunk function and body: serial, and
    no numba cache of their own (the kernel's cache entry is attached instead)."""
    return {k: v for k, v in options.items() if k not in ("parallel", "cache")}


def _noalias_njit(py_func: Any, options: dict[str, Any]) -> Any:
    """A serial ``njit`` dispatcher of a chunked kernel's body whose array arguments are
    ``noalias``, as numba makes those of a prange body it found no aliases in: the
    arrays the chunk function rebuilds from addresses would otherwise be assumed to
    alias each other and the body's own temps, which cost softmax's exp loop its clean
    vector code (1.12-1.15x the time)."""
    disp = numba.njit(**_serial_options(options))(py_func)
    customize = disp._compiler._customize_flags

    def with_noalias(flags: Any) -> Any:
        flags = customize(flags)
        flags.noalias = True
        return flags

    disp._compiler._customize_flags = with_noalias
    return disp


def _compile_rows(py_func: Any, options: dict[str, Any], entry: Any) -> Any:
    """Compile a chunked kernel's chunk function as a numba ``cfunc``
    (:data:`~geode.codegen.backends.chunks.CHUNK_SIGNATURE`; serial), through ``entry``
    (the kernel's cache entry, or the chunk function's own) when there is one."""
    from numba.core import sigutils
    from numba.core.ccallback import CFunc

    sig = sigutils.normalize_signature(CHUNK_SIGNATURE)
    rows = CFunc(py_func, sig, {}, _serial_options(options))
    if entry is not None:
        _cache.attach_numba_cache(rows, entry)
    rows.compile()
    return rows


def compile_kernel(
    kernel: Kernel,
    *,
    fastmath: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    parallel: bool | None = None,
) -> NumbaKernel:
    """Compile ``kernel`` to native code now and return the callable :class:`NumbaKernel`
    (a kernel with a streaming body leaves its plain chunk function for first need, see
    "Chunked kernels": :meth:`NumbaKernel.compile_chunk_functions`).

    ``fastmath`` selects numba's fast-math flags per ``config.ACCURACY_POLICY``;
    ``cache_dir`` (``Options.cache_dir``) enables the on-disk cache of
    :mod:`geode.codegen.cache` (``None``: compile in memory only); ``parallel=None``
    parallelises when the kernel has a parallel loop. The same kernel compiled twice
    in one process returns the same object. Raises :class:`CodegenError` naming the
    kernel (and the generated source line numba reported) when compilation fails.
    """
    t0 = time.perf_counter()
    release_dead_modules()
    emitted = emit_module_source(kernel, fastmath, parallel)
    extra = {
        "backend": backend_fingerprint(),
        "slp_vectorize": str(SLP_VECTORIZE),
        "opt": str(numba.core.config.OPT),
    }
    key = _cache.cache_key(emitted.source, extra)
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
        fn, from_cache, path = _build(kernel, emitted, key, cdir, fastmath)

        def compile_rows(name: str) -> Any:
            return _compile_lazy_rows(kernel, emitted, key, cdir, name)

        k = NumbaKernel(
            kernel.name,
            fn,
            emitted,
            key,
            time.perf_counter() - t0,
            from_cache,
            fastmath,
            path,
            compile_rows,
        )
        with _memo_lock:
            _memo[memo_key] = k
        weakref.finalize(k, _forget_module, f"geode_k_{key[:32]}", emitted.source)
        return k


# ---------------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------------


def set_num_threads(n: int) -> int:
    """Threads for parallel kernels launched from this thread (``0``: all cores).

    Wraps ``numba.set_num_threads`` (a per-calling-thread setting, at most
    ``numba.config.NUMBA_NUM_THREADS``); larger requests are clamped. Returns the
    count in effect. Raises :class:`~geode.config.OptionError` for a negative ``n``.
    """
    numba.set_num_threads(clamp_threads(n))
    return int(numba.get_num_threads())


def clamp_threads(n: int) -> int:
    """The thread count :func:`set_num_threads` uses for a request of ``n`` (``0``: all
    cores; at most ``numba.config.NUMBA_NUM_THREADS``). Raises
    :class:`~geode.config.OptionError` for a negative or non-integer ``n``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise OptionError(f"num_threads must be an int >= 0 (0: all cores), got {n!r}")
    top = int(numba.config.NUMBA_NUM_THREADS)
    return top if n == 0 else min(int(n), top)


def get_num_threads() -> int:
    """Threads parallel kernels launched from this thread use."""
    return int(numba.get_num_threads())
