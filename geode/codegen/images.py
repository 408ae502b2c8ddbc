"""Compiled kernels as data (an *image*: object code plus what calling it needs), and back.

A model file keeps every native kernel of a compiled model as an image: the object
code LLVM emitted, the entry symbol, the entry's argument specs (for its error
messages), its dim names, whether it runs on the thread pool and links against the
native runtime, the symbols of other images it calls (a GEMM entry calls its
epilogue), the kind of kernel (a fused kernel, a native conv, pool or LSTM with its
spec, a GEMM with a fused epilogue) and its IR text (zlib-compressed at level 1, for
``model.kernels[i].source`` and ``.llvm``: a cold compile writes its model file, and
level 1 compresses a kernel's IR four to five times faster than level 6 for 20% more
bytes). Loading links the object code into the
process (:func:`~geode.codegen.backends.llvm.jit.load_object`): no IR is parsed,
optimized or compiled; a model's images are linked as one library (one link).

Blobs are written and read through callables (``add(bytes) -> index``,
``blob(index) -> bytes``), so this module knows nothing of the file around it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import zlib
from collections.abc import Callable
from typing import Any

from geode.codegen.backends.llvm import jit
from geode.codegen.backends.llvm.compiled import (
    TILED_CELL,
    ArgSpec,
    DenseKernel,
    Emitted,
    LLVMKernel,
    TiledRule,
    TiledSource,
)
from geode.errors import ModelFileError

#: image kind -> (module, kernel class, spec module, spec class): imported only when a
#: model holds such a kernel (a model of GEMMs and fused kernels loads no conv code)
KINDS: dict[str, tuple[str, str, str, str]] = {
    "conv": ("conv", "ConvKernel", "conv_spec", "ConvSpec"),
    "pool": ("pool", "PoolKernel", "pool_spec", "PoolSpec"),
    "lstm": ("lstm", "LstmKernel", "lstm", "LstmSpec"),
}
#: an image's IR text larger than this (decompressed) is refused
MAX_SOURCE = 64 << 20

Add = Callable[[bytes], int]
Blob = Callable[[Any], bytes]


def _classes(kind: str) -> tuple[type, type | None]:
    """The kernel class and spec class of an image kind."""
    if kind == "llvm":
        return LLVMKernel, None
    if kind not in KINDS:
        raise ModelFileError(f"unknown kernel kind {kind!r}")
    module, cls, spec_module, spec = KINDS[kind]
    base = "geode.codegen.backends.llvm."
    kernel_cls = getattr(importlib.import_module(base + module), cls)
    return kernel_cls, getattr(importlib.import_module(base + spec_module), spec)


def _kind_of(kernel: Any) -> str | None:
    """The image kind of a compiled kernel (its class says), or None when it has none."""
    kind = getattr(type(kernel), "image_kind", None)
    return kind if kind == "llvm" or kind in KINDS else None


class ImageWriter:
    """Turns kernels into image records (each kernel once, callees first)."""

    def __init__(self, add: Add):
        self._add = add
        self._index: dict[int, int] = {}
        self.records: list[dict[str, Any]] = []

    def image(self, kernel: Any) -> int:
        """The index of ``kernel``'s image (written now unless it already was)."""
        hit = self._index.get(id(kernel))
        if hit is not None:
            return hit
        if isinstance(kernel, DenseKernel):
            epilogue = self.image(kernel.epilogue)  # the callee first: the entry links to it
            tiled = None if kernel.tiled is None else self.image(kernel.tiled)
            record = {
                "kind": "dense",
                "name": kernel.name,
                "entry": self.image(kernel.kernel),
                "epilogue": epilogue,
            }
            if tiled is not None and kernel.lazy is None:  # an eager key-tiled body's epilogue
                record["tiled"] = tiled
            if kernel.lazy is not None:  # compiled after loading, on the first call taking it
                record["lazy"] = self._lazy_record(kernel.lazy)
        else:
            record = self._llvm_record(kernel)
        self.records.append(record)
        self._index[id(kernel)] = len(self.records) - 1
        return len(self.records) - 1

    def _lazy_record(self, src: TiledSource) -> dict[str, Any]:
        """An entry's key-tiled body as code to compile (:class:`TiledSource`): its
        modules' IR text (compressed blobs), names and rule."""
        ep = src.epilogue

        def text(ir: str) -> int:
            return self._add(zlib.compress(ir.encode(), 1))

        return {
            "name": src.name,
            "entry": ep.entry,
            "args": [dataclasses.astuple(a) for a in ep.args],
            "dims": list(ep.dims),
            "parallel": bool(ep.parallel),
            "fastmath": bool(src.fastmath),
            "epilogue_ir": text(ep.ir),
            "body_name": src.body_name,
            "body_ir": text(src.body_ir),
            "rule": dataclasses.asdict(src.rule),
        }

    def _llvm_record(self, k: Any) -> dict[str, Any]:
        kind = _kind_of(k)
        loaded = getattr(k, "_loaded", None)
        if kind is None or loaded is None or not loaded.obj:
            raise ModelFileError(
                f"kernel {getattr(k, 'name', k)!r} ({type(k).__name__}) has no object code "
                "to save (model files need the LLVM backend)"
            )
        record: dict[str, Any] = {
            "kind": kind,
            "name": k.name,
            "entry": k.entry,
            "args": [dataclasses.astuple(a) for a in k._args],
            "dims": list(k._dims),
            "parallel": bool(k.parallel),
            "fastmath": bool(k.fastmath),
            "runtime": bool(loaded.runtime),
            "imports": list(loaded.imports),
            "blas": b"geode_gemm" in loaded.obj,  # its GEMMs call numpy's BLAS
            "opt_level": int(loaded.level),
            "object": self._add(loaded.obj),
            "source": self._add(zlib.compress(k.source.encode(), 1)),
        }
        spec = getattr(k, "spec", None)
        if kind != "llvm":
            record["spec"] = dataclasses.asdict(spec)
        return record


class ImageLoader:
    """Links image records back into callable kernels, in order (callees come first)."""

    def __init__(self, records: Any, blob: Blob, label: str, build: Any = None):
        if not isinstance(records, list):
            raise ModelFileError(f"model file {label!r}: bad kernel image table")
        self._records = records
        self._blob = blob
        self._label = label
        #: how a key-tiled body kept as IR is linked on its first call (``DenseKernel``'s
        #: ``build``: in memory by default, or through the object cache of a warm start)
        self._build = build
        self._exports: dict[str, int] = {}
        self.kernels: list[Any] = []
        #: the cells of entries choosing per call (:data:`TILED_CELL`), by symbol
        self._cells: dict[str, Any] = {}
        for r in records:
            for name in r.get("imports", ()) if isinstance(r, dict) else ():
                if isinstance(name, str) and name.endswith(TILED_CELL):
                    self._cells[name] = ctypes.c_void_p()
                    self._exports[name] = ctypes.addressof(self._cells[name])

    def load_all(self) -> list[Any]:
        """Every image's kernel, by index."""
        from geode.codegen.backends.llvm.target import host

        target = host()
        if any(isinstance(r, dict) and r.get("blas") for r in self._records):
            _configure_blas(self._label)
        linked = self._link_together()
        for i, r in enumerate(self._records):
            try:
                self.kernels.append(self._load(r, target, linked.get(i)))
            except ModelFileError:
                raise
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise ModelFileError(
                    f"model file {self._label!r}: bad kernel image {i} "
                    f"({type(exc).__name__}: {exc})"[:300]
                ) from None
        return self.kernels

    def _link_together(self) -> dict[int, Any]:
        """Every image's object code linked as one library (one link: most of a link's
        cost is per library), by record index; empty when the table is not well formed
        (then each image is linked on its own, and a bad one raises its own error)."""
        items, indices = [], []
        for i, r in enumerate(self._records):
            if not isinstance(r, dict) or r.get("kind") == "dense":
                continue
            try:
                obj = bytes(self._blob(r["object"]))
                imports = tuple(str(n) for n in r["imports"])
                items.append((obj, str(r["entry"]), bool(r["runtime"]), imports))
            except (KeyError, TypeError, ValueError, IndexError, ModelFileError):
                return {}
            indices.append(i)
        if len({entry for _, entry, _, _ in items}) != len(items):
            return {}
        earlier: set[str] = set(self._cells)
        for _, entry, _, imports in items:
            if not earlier.issuperset(imports):
                return {}
            earlier.add(entry)
        if not items:
            return {}
        cells = {name: ctypes.addressof(c) for name, c in self._cells.items()}
        return dict(zip(indices, jit.load_objects(items, cells), strict=True))

    def _kernel(self, index: Any) -> Any:
        if not isinstance(index, int) or not 0 <= index < len(self.kernels):
            raise ModelFileError(f"model file {self._label!r}: bad kernel reference {index!r}")
        return self.kernels[index]

    def _load(self, r: dict[str, Any], target: Any, linked: Any = None) -> Any:
        if r["kind"] == "dense":
            entry, epilogue = self._kernel(r["entry"]), self._kernel(r["epilogue"])
            tiled = self._kernel(r["tiled"]) if "tiled" in r else None
            lazy = _lazy(r["lazy"], self._blob) if "lazy" in r else None
            cell = self._cells.get(entry.entry + TILED_CELL) if lazy is not None else None
            if lazy is not None and cell is None:
                raise ModelFileError(f"model file {self._label!r}: {entry.entry} has no cell")
            return DenseKernel(
                str(r["name"]),
                entry,
                epilogue,
                entry.source,
                tiled=tiled,
                lazy=lazy,
                cell=cell,
                build=self._build,
            )
        cls, spec_cls = _classes(str(r["kind"]))
        source = zlib.decompressobj().decompress(bytes(self._blob(r["source"])), MAX_SOURCE)
        imports = {}
        for name in r["imports"]:
            if name not in self._exports:
                raise ModelFileError(f"model file {self._label!r}: no kernel exports {name!r}")
            imports[name] = self._exports[name]
        entry = str(r["entry"])
        if linked is None:
            linked = jit.load_object(
                bytes(self._blob(r["object"])), [entry], runtime=bool(r["runtime"]), imports=imports
            )
        loaded = linked
        self._exports[entry] = loaded[entry]
        loaded.level = int(r.get("opt_level", 3))
        args = tuple(
            ArgSpec(str(n), str(role), str(dt), int(rank), str(text))
            for n, role, dt, rank, text in r["args"]
        )
        emitted = Emitted(
            source.decode(), entry, args, tuple(map(str, r["dims"])), bool(r["parallel"]), ()
        )
        k = cls(str(r["name"]), emitted, loaded, target, 0.0, True, bool(r["fastmath"]))
        if spec_cls is not None:
            k.spec = _spec(spec_cls, r["spec"])
        return k


def _text(blob: Blob, index: Any) -> str:
    """A compressed IR text blob."""
    return zlib.decompressobj().decompress(bytes(blob(index)), MAX_SOURCE).decode()


def _lazy(d: dict[str, Any], blob: Blob) -> TiledSource:
    """An entry's key-tiled body from its record (:meth:`ImageWriter._lazy_record`)."""
    args = tuple(
        ArgSpec(str(n), str(role), str(dt), int(rank), str(text))
        for n, role, dt, rank, text in d["args"]
    )
    ep = Emitted(
        _text(blob, d["epilogue_ir"]),
        str(d["entry"]),
        args,
        tuple(map(str, d["dims"])),
        bool(d["parallel"]),
        (),
    )
    rule = _spec(TiledRule, d["rule"])
    lays = tuple(None if x is None else tuple(x) for x in rule.layouts)
    rule = dataclasses.replace(rule, layouts=lays)
    name, body_name = str(d["name"]), str(d["body_name"])
    return TiledSource(name, ep, bool(d["fastmath"]), body_name, _text(blob, d["body_ir"]), rule)


def _configure_blas(label: str) -> None:
    """Give the native runtime numpy's BLAS (and share the pool), as a compile does."""
    from geode.codegen.backends.llvm.library import blas, share_pool

    lib = blas()
    if lib is None:
        raise ModelFileError(f"model file {label!r}: its GEMMs need a BLAS and none is found")
    share_pool(lib)


def _spec(cls: type, fields: Any) -> Any:
    """A spec dataclass from its fields (JSON lists back to tuples)."""
    if not isinstance(fields, dict):
        raise ValueError("bad spec")
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items() if k in names}
    return cls(**values)
