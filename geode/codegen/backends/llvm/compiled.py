"""Compiled kernels as callables: what an LLVM kernel's entry takes and how Python calls it.

:class:`ArgSpec` and :class:`Emitted` describe a compiled module's entry (its arrays,
dims and needs); :class:`LLVMKernel` calls an entry through the native runtime's
trampoline; :class:`DenseKernel` calls a GEMM entry with its fused epilogue. This
module imports no code generator, so a process that only links object code (a model
file being loaded, see :mod:`geode.modelfile`) never loads the emitters.

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
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from geode.codegen.backends.llvm import jit
from geode.codegen.backends.llvm.target import Target
from geode.errors import CodegenError, ExecutionError

log = logging.getLogger(__name__)

__all__ = [
    "ArgSpec",
    "DenseKernel",
    "Emitted",
    "LLVMKernel",
    "LinkedBody",
    "TILED_CELL",
    "TiledRule",
    "TiledSource",
    "cached_build",
]


@dataclass(frozen=True)
class ArgSpec:
    """One array argument of a compiled kernel."""

    name: str
    role: str  # input | output
    dtype: str
    rank: int
    shape_text: str


@dataclass(frozen=True)
class Emitted:
    """A kernel's module: IR text, entry symbol, arguments, what it needs."""

    ir: str
    entry: str
    args: tuple[ArgSpec, ...]
    dims: tuple[str, ...]
    parallel: bool
    vmath: tuple[str, ...]

    @property
    def n_inputs(self) -> int:
        return sum(1 for a in self.args if a.role == "input")


class LLVMKernel:
    """A kernel compiled by the LLVM backend (see the module docstring).

    ``source`` is the module's IR text, ``llvm`` the optimized IR and ``asm`` the
    machine code (computed on first access), ``compile_seconds`` the wall time of
    :func:`compile_kernel`, ``from_cache`` whether the object code came from the disk
    cache, ``address`` the entry's address (``int32 entry(ptrs, recs, ints)``, see
    :mod:`geode.codegen.backends.llvm.emit`)."""

    #: the kernel takes its thread count per call (``threads=``)
    chunked = True
    #: how a model file keeps it (:mod:`geode.codegen.images`)
    image_kind = "llvm"

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
        #: the LLVM optimization level its object code was compiled at (2 or 3)
        self.opt_level = loaded.level
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
        return jit.optimized_ir(self.source, self._target, self.opt_level)

    @functools.cached_property
    def asm(self) -> str:
        """The kernel's machine code as assembly text."""
        return jit.assembly(self.source, self._target, self.opt_level)

    def __repr__(self) -> str:
        how = "cached" if self.from_cache else f"{self.compile_seconds * 1e3:.1f} ms"
        return f"<LLVMKernel {self.name} ({how}{', parallel' if self.parallel else ''})>"


#: the suffix of an entry's imported cell holding its key-tiled body's address
TILED_CELL = ".tiled_fn"


def _logical(shape: tuple, layout: tuple | None) -> tuple:
    """An operand's dims from the array passed for it: a root read as heads, ``layout``
    ``(heads, depth, transposed)``, gives ``[*lead, heads, seq, depth]`` (or ``depth,
    seq``); the entry's rule (``dense.py: _logical``)."""
    if layout is None:
        return tuple(shape)
    heads, depth, transposed = layout
    lead, seq = tuple(shape[:-2]), shape[-2]
    return (*lead, heads, *((depth, seq) if transposed else (seq, depth)))


@dataclass(frozen=True)
class TiledRule:
    """When an entry choosing per call takes its key-tiled body: the entry's own rule
    (``dense.py: _to_tiled``, ``_panel_rows``) on the shapes of ``A``, ``B`` and ``V``
    (``arrays[v_at]``), in Python, so the body is linked before the first call that
    needs it. ``layouts``: per operand None or ``(heads, depth, transposed)``."""

    item: int
    panel_bytes: int
    min_rows: int
    limit: int
    batched: bool
    v_at: int
    layouts: tuple = (None, None, None)

    def long(self, arrays: Any) -> bool:
        """Whether a call on ``arrays`` runs the key-tiled body (False for arrays the
        entry refuses: it says why)."""
        try:
            picked = (arrays[0].shape, arrays[1].shape, arrays[self.v_at].shape)
            a, b, v = (_logical(x, lay) for x, lay in zip(picked, self.layouts))
            m = a[-2] if self.batched else math.prod(a[:-1])
            k, n, d = a[-1], b[-1], v[-1]
        except (IndexError, AttributeError, TypeError, ValueError):
            return False
        mb = max(self.panel_bytes // max(n * self.item, 1), self.min_rows)
        if n == 0 or (k + d) * n * self.item > self.panel_bytes:
            mb = m
        mb = max(min(mb, m), 1)
        return mb * n * self.item > self.limit


@dataclass(frozen=True)
class TiledSource:
    """The key-tiled body of an entry choosing per call, as code not yet compiled: the
    module of its epilogue kernel (``epilogue``, kernel ``name``), the body's module
    (``body_ir``, exporting ``body_name``, calling the epilogue) and when it runs
    (``rule``)."""

    name: str
    epilogue: Emitted
    fastmath: bool
    body_name: str
    body_ir: str
    rule: TiledRule


@dataclass(frozen=True)
class LinkedBody:
    """The key-tiled body of an entry choosing per call, linked: its module's code
    (``loaded``, exporting ``name``, calling the body's epilogue kernel), when it runs
    (``rule``) and its IR text (``ir``, "" when not kept). What a model file keeps as
    object code, so a loaded model's long calls run no LLVM."""

    name: str
    loaded: jit.Loaded
    rule: TiledRule
    ir: str = ""


#: ``build(name, ir, runtime, imports, keep, generated) -> (Loaded, from_cache)``: how a
#: lazily compiled module is linked (a compile's disk cache, or LLVM in memory)
Build = Callable[[str, str, bool, "dict[str, int] | None", Any, bool], "tuple[jit.Loaded, bool]"]


def cached_build(cache_dir: Any, sign: bool = False) -> Build:
    """:data:`Build` through the disk cache of object code in ``cache_dir`` (a folder, or
    a ``CacheLocation``; ``sign``: its entries signed; None: no cache, LLVM compiles in
    memory), like every module of a compile: a warm start links the cached object (no
    ``llvmlite.binding``), a miss compiles and stores it."""

    def build(
        name: str, ir: str, runtime: bool, imports: Any, keep: Any, generated: bool
    ) -> tuple[jit.Loaded, bool]:
        from geode.codegen.backends.llvm import objcache, optlevel
        from geode.codegen.backends.llvm.kernel import build_module
        from geode.codegen.backends.llvm.target import host

        where = cache_dir
        if isinstance(where, str):
            where = objcache.CacheLocation(where, sign)
        choice = optlevel.choose(ir, generated)
        return build_module(
            name, ir, host(), where, runtime=runtime, imports=imports, keep=keep, choice=choice
        )

    return build


class DenseKernel:
    """A GEMM with its fused epilogue, compiled (see :mod:`geode.codegen.backends.llvm.dense`):
    called like an LLVM kernel (``call(arrays, ints)``, ``ints`` the thread count).

    An entry choosing per call (``lazy``, a :class:`TiledSource`) reads its key-tiled
    body's address from ``cell`` (a ctypes pointer, null: row panels). ``prepare(arrays)``
    (None for other entries) links the body, once, when a call on ``arrays`` needs it
    (:class:`TiledRule`), through ``build`` (default ``cached_build(None)``: in memory), and then
    stores its address in the cell; a lock keeps two threads from building it twice.
    An entry given its body linked (``body``, a :class:`LinkedBody`: a model file's object
    code) has its cell written now and builds nothing."""

    def __init__(
        self,
        name: str,
        kernel: Any,
        epilogue: Any,
        ir: str,
        in_place: bool = False,
        tiled: Any = None,
        lazy: TiledSource | None = None,
        cell: Any = None,
        build: Build | None = None,
        body: LinkedBody | None = None,
    ) -> None:
        self.name = name
        #: the GEMM writes the epilogue's output panels, rewritten in place (``DenseSpec.in_place``)
        self.in_place = in_place
        self.kernel = kernel  # the entry, an LLVMKernel
        self.epilogue = epilogue  # kept alive: the entry calls it
        #: the key-tiled body's epilogue kernel once linked (an entry choosing per call)
        self.tiled = tiled
        self.lazy = lazy
        self._cell = cell
        self._build = build or cached_build(None)
        self._lock = threading.Lock()
        self._body: Any = None  # the key-tiled body's linked code (False: none can be)
        #: the key-tiled body once linked (built here, or given by a model file)
        self.linked: LinkedBody | None = None
        #: how many times this entry's key-tiled body was built (0 or 1)
        self.tiled_builds = 0
        #: why the key-tiled body could not be built ("" when it could, or was not yet)
        self.tiled_error = ""
        self.prepare = self._prepare if lazy is not None else None
        self.source = ir + "\n; epilogue kernel\n" + epilogue.source
        if tiled is not None:
            self.source += "\n; key-tiled body's epilogue kernel\n" + tiled.source
        if lazy is not None:
            self.source += "\n; key-tiled body (compiled on the first call that takes it)\n"
            self.source += lazy.body_ir + "\n; its epilogue kernel\n" + lazy.epilogue.ir
        if body is not None:
            if cell is None or tiled is None:
                raise CodegenError(f"kernel {name}: a linked key-tiled body needs its cell")
            self.source += "\n; key-tiled body (linked from object code)\n" + body.ir
            self.linked, self._body = body, body.loaded
            cell.value = body.loaded[body.name]  # the entry takes the body from now on
        self.address = kernel.address
        parts = (kernel, epilogue) if tiled is None else (kernel, epilogue, tiled)
        #: whether the entry and the epilogue(s) came from the disk cache
        self.from_cache = all(getattr(k, "from_cache", False) for k in parts)
        self.chunked = True
        self.parallel = True

    def _prepare(self, arrays: Any) -> None:
        """Link the key-tiled body before the first call on ``arrays`` that takes it."""
        if self._body is None and self.lazy.rule.long(arrays):
            self.build_tiled()

    def build_tiled(self) -> bool:
        """Link the key-tiled body now, whatever the calls (a model being saved: the file
        carries its object code), unless it is linked or cannot be; returns whether it
        is linked."""
        if self.lazy is None or self._body is not None:
            return self.linked is not None
        with self._lock:
            if self._body is not None:
                return self.linked is not None
            try:
                self._link_tiled()
            except CodegenError as exc:  # the row panels then run every call, as they can
                log.warning("kernel %s: no key-tiled body (%s); row panels", self.name, exc)
                self.tiled_error, self._body = str(exc), False
        return self.linked is not None

    def _link_tiled(self) -> None:
        """Build the key-tiled body (its epilogue kernel, then the body calling it) and
        publish its address in the cell, the code linked first."""
        from geode.codegen.backends.llvm.target import host

        src = self.lazy
        t0 = time.perf_counter()
        ep = src.epilogue
        loaded, cached = self._build(ep.entry, ep.ir, ep.parallel, None, None, True)
        kernel = LLVMKernel(
            src.name, ep, loaded, host(), time.perf_counter() - t0, cached, src.fastmath
        )
        imports = {ep.entry: kernel.address}
        body, _ = self._build(src.body_name, src.body_ir, True, imports, kernel, False)
        self.linked = LinkedBody(src.body_name, body, src.rule, src.body_ir)
        self._cell.value = body[src.body_name]  # published: the entry may call it now
        self.tiled, self._body = kernel, body
        self.tiled_builds += 1

    def call(self, arrays: tuple, ints: tuple) -> None:
        """Run on ``arrays`` (A, B, the epilogue's inputs, its outputs)."""
        from geode.runtime import native

        n_in = self.kernel._n_in
        try:
            status = native.call(self.address, n_in, arrays, ints)
        except native.ArgumentError as exc:  # a strided input: copied to C order
            arrays = self.kernel._coerce(arrays, exc.index)
            status = native.call(self.address, n_in, arrays, ints)
        if status:
            self._bad_argument(status - 1)

    def _bad_argument(self, i: int) -> None:
        """Raise for the entry's status ``i + 1``: a bad argument ``i``, no memory for the
        panel, or an epilogue that refused its panel arguments."""
        from geode.codegen.backends.llvm.dense import EPILOGUE_STATUS, NO_MEMORY

        status = i + 1
        if status == NO_MEMORY:
            raise ExecutionError(f"kernel {self.name}: out of memory for its product panel")
        if status >= EPILOGUE_STATUS:
            raise ExecutionError(
                f"kernel {self.name}: its epilogue refused argument {status - EPILOGUE_STATUS - 1}"
            )
        self.kernel._bad_argument(i)

    @property
    def llvm(self) -> str:
        more = "" if self.tiled is None else "\n" + self.tiled.llvm
        return self.kernel.llvm + "\n" + self.epilogue.llvm + more

    @property
    def asm(self) -> str:
        more = "" if self.tiled is None else "\n" + self.tiled.asm
        return self.kernel.asm + "\n" + self.epilogue.asm + more
