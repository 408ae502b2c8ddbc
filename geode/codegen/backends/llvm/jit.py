"""LLVM IR text -> optimized module -> relocatable object code -> machine code in memory.

:func:`compile_ir` parses a module's text, runs LLVM's O3 (or O2) pipeline for the target
(new pass manager, loop and SLP vectorization on; the level is chosen per module by
:mod:`~geode.codegen.backends.llvm.optlevel`) and emits relocatable object code;
:func:`load_object` links object code into the process's one ``LLJIT`` instance and
returns the addresses of the symbols asked for. The object code is what the disk cache
keeps (:mod:`geode.codegen.backends.llvm.objcache`), so a warm start runs no optimizer.

The JIT resolves undefined symbols against the process (libm's ``expf``, ``malloc``,
...) and against geode's native runtime (:mod:`geode.runtime.native`: the thread pool
that parallel loops call). Each :func:`load_object` is its own JIT library and a
:func:`load_objects` one for all its objects, kept alive by the :class:`Loaded` handles;
dropping the last reference unloads the machine code.

LLVM's global context is not safe to use from several threads at once: the inspection
helpers and every link hold one process-wide lock (:data:`LOCK`). :func:`compile_ir` uses
none of the global state: each module is parsed into a context of its own and compiled
by its thread's own target machine, so modules compile on several threads at once (the
background workers and a thread waiting for one: :mod:`.background`). llvmlite itself
serializes every call into LLVM with a lock of its own; the two long ones, the optimizer
and the code generator, are called past it (:func:`_unlocked`), on objects no other
thread sees. A fork waits until no module is being compiled (:func:`_before_fork`).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from geode.codegen.backends.llvm import linker
from geode.errors import CodegenError

__all__ = ["Loaded", "compile_ir", "initialize", "load_object", "optimized_ir", "assembly"]

#: the optimization levels a module can be compiled at (LLVM's O2 and O3 pipelines; 0:
#: no optimization pipeline, code generation only: a chain's entry, only calls)
LEVELS = (0, 2, 3)

#: held around every use of LLVM's global state
LOCK = threading.RLock()
_names = itertools.count()
#: compiles under way (:func:`compile_ir`), and the condition a fork waits on for none
_active = 0
_idle = threading.Condition(threading.Lock())
#: each thread's target machines (code generation changes a machine's state)
_local = threading.local()


@functools.lru_cache(maxsize=1)
def initialize() -> None:
    """Initialize LLVM's native target and assembly printer (once per process)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()


@functools.lru_cache(maxsize=4)
def _target_machine(triple: str, cpu: str, features: str) -> Any:
    import llvmlite.binding as llvm

    initialize()
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=3)


def target_machine(target: Any) -> Any:
    """The llvmlite target machine for a :class:`~geode.codegen.backends.llvm.target.Target`."""
    return _target_machine(target.triple, target.cpu, target.features)


def thread_target_machine(target: Any, codegen: int = 3) -> Any:
    """The calling thread's own target machine for ``target`` (made once per thread):
    what :func:`compile_ir` optimizes and generates code with; ``codegen``: its code
    generation level (3; 0, the fast instruction selector, for level-0 modules)."""
    machines = getattr(_local, "machines", None)
    if machines is None:
        machines = _local.machines = {}
    key = (target.triple, target.cpu, target.features, codegen)
    tm = machines.get(key)
    if tm is None:
        import llvmlite.binding as llvm

        initialize()
        tm = llvm.Target.from_triple(target.triple).create_target_machine(
            cpu=target.cpu, features=target.features, opt=codegen
        )
        machines[key] = tm
    return tm


def _parse(ir_text: str, target: Any, context: Any = None, tm: Any = None) -> Any:
    import llvmlite.binding as llvm

    initialize()
    try:
        mod = llvm.parse_assembly(ir_text, context)
        mod.verify()
    except RuntimeError as exc:
        raise CodegenError(f"LLVM rejected the generated IR: {exc}") from None
    tm = tm or target_machine(target)
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    return mod


def _unlocked(name: str) -> Any:
    """llvmlite's C function ``name`` without llvmlite's process-wide lock (its wrapper
    keeps the function as ``_cfn``; were that to change, the wrapper itself: locked, the
    same results, one module at a time)."""
    from llvmlite.binding import ffi

    fn = getattr(ffi.lib, name)
    return getattr(fn, "_cfn", fn)


def _optimize(mod: Any, target: Any, level: int, tm: Any = None, unlocked: bool = False) -> None:
    import llvmlite.binding as llvm

    if level not in LEVELS:
        raise CodegenError(f"no LLVM optimization level {level!r}; the levels are {LEVELS}")
    if level == 0:
        return
    tm = tm or target_machine(target)
    pto = llvm.PipelineTuningOptions(speed_level=level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_interleaving = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    if unlocked:
        _unlocked("LLVMPY_RunNewModulePassManager")(mpm, mod, pb)
    else:
        mpm.run(mod, pb)


def _object_code(tm: Any, mod: Any) -> bytes:
    """``mod``'s relocatable object code, generated by ``tm`` past llvmlite's lock."""
    from ctypes import string_at

    from llvmlite.binding import ffi

    with ffi.OutputString() as err:
        buf = _unlocked("LLVMPY_TargetMachineEmitToMemory")(tm, mod, 1, err)
        if not buf:
            raise CodegenError(f"LLVM could not generate code: {err}")
    try:
        return string_at(ffi.lib.LLVMPY_GetBufferStart(buf), ffi.lib.LLVMPY_GetBufferSize(buf))
    finally:
        ffi.lib.LLVMPY_DisposeMemoryBuffer(buf)


@contextmanager
def _compiling() -> Iterator[None]:
    """Count a compile under way (a fork waits for none: :func:`_before_fork`)."""
    global _active
    with _idle:
        _active += 1
    try:
        yield
    finally:
        with _idle:
            _active -= 1
            if not _active:
                _idle.notify_all()


def compile_ir(ir_text: str, target: Any, level: int = 3) -> bytes:
    """Parse, optimize (``level``: 3 for O3, 2 for O2) and compile ``ir_text`` to
    relocatable object code (machine code generation at LLVM's aggressive level; level 0:
    no optimization pipeline, the fast instruction selector). Safe to call from several threads at once: the module lives in a context of
    its own and the calling thread's target machine compiles it."""
    with _compiling():  # a fork waits for the import and the initialization too
        import llvmlite.binding as llvm

        initialize()
        context = llvm.create_context()
        try:
            tm = thread_target_machine(target, 0 if level == 0 else 3)
            mod = _parse(ir_text, target, context, tm)
            try:
                _optimize(mod, target, level, tm, unlocked=True)
                return _object_code(tm, mod)
            finally:
                mod.close()
        finally:
            context.close()


def _before_fork() -> None:
    LOCK.acquire()
    _idle.acquire()
    while _active:
        _idle.wait()


def _after_fork() -> None:
    _idle.release()
    LOCK.release()


def _after_fork_in_child() -> None:
    global _active, _idle, _local
    _active = 0
    _idle = threading.Condition(threading.Lock())
    _local = threading.local()
    LOCK.release()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork_in_child
)


def optimized_ir(ir_text: str, target: Any, level: int = 3) -> str:
    """The optimized IR of ``ir_text`` at ``level`` (for inspection)."""
    with LOCK:
        mod = _parse(ir_text, target)
        _optimize(mod, target, level)
        return str(mod)


def assembly(ir_text: str, target: Any, level: int = 3) -> str:
    """The machine code of ``ir_text`` at ``level`` as assembly text (for inspection)."""
    with LOCK:
        mod = _parse(ir_text, target)
        _optimize(mod, target, level)
        return str(target_machine(target).emit_assembly(mod))


@functools.lru_cache(maxsize=1)
def runtime_symbols() -> dict[str, int]:
    """Addresses of the native runtime's C functions that generated code calls (the
    launcher of parallel loops, ``geode_launch``, also as ``geode.launch``: the name the
    modules call it by, :data:`~geode.codegen.backends.llvm.parallel.LAUNCH`)."""
    from geode.runtime import native

    symbols = dict(native.symbols())
    symbols["geode.launch"] = symbols["geode_launch"]
    return symbols


@dataclass(eq=False)
class Loaded:
    """Machine code linked into the process: ``addresses`` of its exported symbols.
    The code stays mapped while this object is alive; ``keep`` holds what it calls into
    (other loaded code whose addresses it was linked with), alive as long as it is.
    ``obj`` is the object code it was linked from, ``runtime`` whether it was linked
    against the native runtime and ``imports`` the other symbols it was given (by name):
    what a model file keeps to link the same code again in another process. ``level``:
    the optimization level the object code was compiled at."""

    tracker: Any
    addresses: dict[str, int]
    obj: bytes = b""
    runtime: bool = True
    imports: tuple[str, ...] = ()
    keep: Any = None
    level: int = 3

    def __getitem__(self, name: str) -> int:
        return self.addresses[name]


def load_object(
    obj: bytes, exports: list[str], runtime: bool = True, imports: dict[str, int] | None = None
) -> Loaded:
    """Link object code into the process and return the addresses of ``exports``
    (``runtime``: the code calls the native runtime's functions; ``imports``: other
    symbols it calls, by address)."""
    with LOCK:
        imported = {**(runtime_symbols() if runtime else {}), **(imports or {})}
        tracker = linker.link([obj], f"geode_lib{next(_names)}", exports, imported)
    return Loaded(tracker, dict(tracker.addresses), obj, runtime, tuple(imports or ()))


def load_objects(
    items: list[tuple[bytes, str, bool, tuple[str, ...]]], cells: dict[str, int] | None = None
) -> list[Loaded]:
    """Link several objects into the process as one library: ``items`` are ``(object
    code, its entry symbol, whether it calls the native runtime, the entries of other
    items it calls)``, in an order where each calls only earlier ones. One link of many
    objects costs little more than one of a single object (LLVM's per-library work is
    most of a small link), so a model's kernels load together. Raises CodegenError when
    two items export one entry, an item calls one not before it, or LLVM refuses.
    ``cells``: other symbols items read, by address (an entry's key-tiled body's cell)."""
    entries = [entry for _, entry, _, _ in items]
    if len(set(entries)) != len(entries):
        raise CodegenError(f"several kernels export one symbol: {sorted(entries)}")
    seen: set[str] = set(cells or ())
    for _, entry, _, imports in items:
        missing = [name for name in imports if name not in seen]
        if missing:
            raise CodegenError(f"kernel {entry!r} calls {missing}, not linked before it")
        seen.add(entry)
    with LOCK:
        imported = runtime_symbols() if any(runtime for _, _, runtime, _ in items) else {}
        imported = {**imported, **(cells or {})}
        library = linker.link(
            [obj for obj, _, _, _ in items], f"geode_lib{next(_names)}", entries, imported
        )
    return [
        Loaded(library, {entry: library[entry]}, obj, runtime, imports)
        for obj, entry, runtime, imports in items
    ]
