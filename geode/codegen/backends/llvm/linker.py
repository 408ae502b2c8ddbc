"""Object code linked into the process through libllvmlite's C functions, directly.

Loading a compiled model needs four things of LLVM: the host's triple, CPU name and
features (what the code was compiled for is checked against them), LLVM's version, and
a linker for relocatable object code (an ``LLJIT`` instance: object code in, symbol
addresses out). All four are C functions of ``libllvmlite``, the library llvmlite's
Python package wraps; the package itself (``llvmlite.binding``: its IR builder, pass
managers, ...) takes some 20 ms to import, more than linking a model's code. So this
module opens the library with ctypes and calls those few functions itself: a warm
start, a model file loaded and run, never imports ``llvmlite.binding``. Compiling IR
still goes through llvmlite (:mod:`~geode.codegen.backends.llvm.jit`).

The functions and their signatures are llvmlite's (its ``ffi`` folder); model files
and cache entries record llvmlite's version and are refused by another, so code is
only ever linked by the llvmlite it was compiled with. When ``llvmlite.binding`` is
imported too (a compile in the same process), every call here also holds llvmlite's
own lock, as its wrappers would.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from ctypes import POINTER, c_bool, c_char_p, c_int, c_size_t, c_uint, c_uint8, c_uint64, c_void_p

from geode.errors import CodegenError

__all__ = ["Library", "host_cpu", "link", "llvm_version"]

_lock = threading.RLock()  # a Library freed by the collector mid-call closes itself


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # a thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)


class _LinkElement(ctypes.Structure):
    _fields_ = [("element_kind", c_uint8), ("value", c_char_p), ("value_len", c_size_t)]


class _SymbolAddress(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("address", c_uint64)]


#: link element kinds (llvmlite's ``JITLibraryBuilder``): object code, a library by name
#: (the empty name: the current process)
_OBJECT, _LIBRARY = 2, 3

_SIGNATURES = {
    "LLVMPY_GetVersionInfo": ([], c_uint),
    "LLVMPY_DisposeString": ([c_void_p], None),
    "LLVMPY_InitializeNativeTarget": ([], c_int),
    "LLVMPY_GetProcessTriple": ([POINTER(c_void_p)], None),
    "LLVMPY_GetHostCPUName": ([POINTER(c_void_p)], None),
    "LLVMPY_GetHostCPUFeatures": ([POINTER(c_void_p)], c_int),
    "LLVMPY_CreateLLJITCompiler": ([c_void_p, c_bool, c_bool, POINTER(c_void_p)], c_void_p),
    "LLVMPY_LLJIT_Link": (
        [
            c_void_p,
            c_char_p,
            POINTER(_LinkElement),
            c_size_t,
            POINTER(_SymbolAddress),
            c_size_t,
            POINTER(_SymbolAddress),
            c_size_t,
            POINTER(c_void_p),
        ],
        c_void_p,
    ),
    "LLVMPY_LLJIT_Dylib_Tracker_Dispose": ([c_void_p, POINTER(c_void_p)], c_bool),
}


def library_path() -> str:
    """Where ``libllvmlite`` is: next to llvmlite's ``binding`` package (found without
    importing it)."""
    spec = importlib.util.find_spec("llvmlite")
    if spec is None or not spec.submodule_search_locations:
        raise CodegenError("llvmlite is not installed: geode's LLVM backend needs it")
    if sys.platform == "darwin":
        name = "libllvmlite.dylib"
    else:
        name = "llvmlite.dll" if os.name == "nt" else "libllvmlite.so"
    return os.path.join(list(spec.submodule_search_locations)[0], "binding", name)


@functools.cache
def _lib() -> ctypes.CDLL:
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
    except (OSError, AttributeError) as exc:
        raise CodegenError(f"cannot use llvmlite's library {path!r}: {exc}") from None
    return lib


@contextlib.contextmanager
def _locked() -> Iterator[ctypes.CDLL]:
    """The library, with this module's lock and (when llvmlite's wrappers are in use in
    this process) llvmlite's."""
    lib = _lib()
    ffi = sys.modules.get("llvmlite.binding.ffi")
    theirs = getattr(getattr(ffi, "lib", None), "_lock", None)
    with _lock, theirs if theirs is not None else contextlib.nullcontext():
        yield lib


def _take_string(lib: ctypes.CDLL, ptr: c_void_p) -> str:
    """The C string llvmlite made at ``ptr`` (freed here)."""
    if not ptr.value:
        return ""
    try:
        return (ctypes.string_at(ptr.value) or b"").decode("utf-8", "replace")
    finally:
        lib.LLVMPY_DisposeString(ptr)


@functools.cache
def llvm_version() -> tuple[int, ...]:
    """LLVM's version, e.g. ``(22, 1, 0)`` (what ``llvmlite.binding.llvm_version_info``
    says)."""
    with _locked() as lib:
        x = lib.LLVMPY_GetVersionInfo()
    parts = []
    while x:
        parts.append(x & 0xFF)
        x >>= 8
    return tuple(reversed(parts))


@functools.cache
def _initialized() -> None:
    with _locked() as lib:
        lib.LLVMPY_InitializeNativeTarget()


@functools.cache
def host_cpu() -> tuple[str, str, str]:
    """The process's triple, the host CPU's name and its features as LLVM's
    ``+feature,-feature`` text, in LLVM's order ("" when the host cannot report them)."""
    _initialized()
    with _locked() as lib:
        out = [c_void_p() for _ in range(3)]
        lib.LLVMPY_GetProcessTriple(ctypes.byref(out[0]))
        lib.LLVMPY_GetHostCPUName(ctypes.byref(out[1]))
        ok = lib.LLVMPY_GetHostCPUFeatures(ctypes.byref(out[2]))
        triple, cpu, features = (_take_string(lib, p) for p in out)
    if not ok:
        features = ""
    # as llvmlite's FeatureMap.flatten(): by name, each "+name" or "-name"
    flags = {f[1:]: f[0] for f in features.split(",") if f[:1] in ("+", "-")}
    return triple, cpu, ",".join(sign + f for f, sign in sorted(flags.items()))


@functools.cache
def _jit() -> int:
    """The process's one LLJIT (never disposed: code it linked may be running)."""
    _initialized()
    with _locked() as lib:
        err = c_void_p()
        jit = lib.LLVMPY_CreateLLJITCompiler(None, False, False, ctypes.byref(err))
        message = _take_string(lib, err)
    if not jit:
        raise CodegenError(f"LLVM could not make a JIT: {message}")
    return jit


#: trackers of libraries the collector freed, unloaded at the next link or close: a
#: finalizer takes no lock (the thread it runs on may hold llvmlite's, or this module's)
_dead: list[int] = []


def _unload(lib: ctypes.CDLL, trackers: list[int]) -> None:
    """Unload the libraries of ``trackers`` (this module's lock held)."""
    while trackers:
        err = c_void_p()
        lib.LLVMPY_LLJIT_Dylib_Tracker_Dispose(trackers.pop(), ctypes.byref(err))
        _take_string(lib, err)


class Library:
    """Object code linked into the process under ``name``: ``addresses`` of its exported
    symbols. The code stays mapped while this object is alive (see :func:`link`)."""

    def __init__(self, tracker: int, name: str, addresses: dict[str, int]) -> None:
        self._tracker = tracker
        self._dead = _dead  # held here: at interpreter exit the module's globals may be gone
        self.name = name
        self.addresses = addresses

    def __getitem__(self, symbol: str) -> int:
        return self.addresses[symbol]

    def close(self) -> None:
        """Unload the code (no symbol of it may be called after)."""
        tracker, self._tracker = self._tracker, 0
        with _locked() as lib:
            _unload(lib, [tracker] if tracker else [])
            _unload(lib, _dead)

    def __del__(self) -> None:
        tracker, self._tracker = self._tracker, 0
        if tracker:
            self._dead.append(tracker)  # unloaded by the next link (at exit: by the process)


def link(
    objects: Sequence[bytes], name: str, exports: Sequence[str], imports: Mapping[str, int]
) -> Library:
    """Link ``objects`` (relocatable object code) into the process as one library named
    ``name``, undefined symbols resolved by ``imports`` (name -> address), then by the
    process's own (libm, libc, ...); returns the addresses of ``exports``. Raises
    :class:`CodegenError` when LLVM cannot link them or an export is missing."""
    kept = [bytes(o) for o in objects]  # alive until LLVM has copied them
    elements = (_LinkElement * (len(kept) + 1))()
    for i, obj in enumerate(kept):
        elements[i].element_kind, elements[i].value, elements[i].value_len = _OBJECT, obj, len(obj)
    elements[len(kept)].element_kind, elements[len(kept)].value = _LIBRARY, b""
    elements[len(kept)].value_len = 0
    imp = (_SymbolAddress * len(imports))()
    for i, (sym, addr) in enumerate(imports.items()):
        imp[i].name, imp[i].address = sym.encode(), addr
    exp = (_SymbolAddress * len(exports))()
    for i, sym in enumerate(exports):
        exp[i].name = sym.encode()
    jit = _jit()
    with _locked() as lib:
        _unload(lib, _dead)
        err = c_void_p()
        tracker = lib.LLVMPY_LLJIT_Link(
            jit, name.encode(), elements, len(elements), imp, len(imp), exp, len(exp),
            ctypes.byref(err),
        )  # fmt: skip
        message = _take_string(lib, err)
    if not tracker:
        raise CodegenError(f"linking compiled code failed: {message}")
    library = Library(tracker, name, {sym: exp[i].address for i, sym in enumerate(exports)})
    missing = [sym for sym, addr in library.addresses.items() if not addr]
    if missing:
        raise CodegenError(f"compiled code lacks symbols {missing}")
    return library
