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
    LinkedBody,
    LLVMKernel,
    TiledRule,
    TiledSource,
)
from geode.errors import CodegenError, ModelFileError

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
    """Turns kernels into image records (each kernel once, callees first).

    ``bodies``: an entry choosing per call whose key-tiled body is not linked yet has it
    built now (``DenseKernel.build_tiled``: through the compile's object cache when it
    has one), so the file carries the body as object code; without it (the model
    cache's files, written at the end of a cold compile) such a body is kept as IR,
    compiled on its first long call after loading."""

    def __init__(self, add: Add, bodies: bool = True):
        self._add = add
        self._bodies = bodies
        self._index: dict[int, int] = {}
        self.records: list[dict[str, Any]] = []

    def image(self, kernel: Any) -> int:
        """The index of ``kernel``'s image (written now unless it already was)."""
        hit = self._index.get(id(kernel))
        if hit is not None:
            return hit
        if isinstance(kernel, DenseKernel):
            record = self._dense_record(kernel)
        else:
            record = self._llvm_record(kernel)
        self.records.append(record)
        self._index[id(kernel)] = len(self.records) - 1
        return len(self.records) - 1

    def _dense_record(self, kernel: DenseKernel) -> dict[str, Any]:
        """A GEMM entry with its epilogue (callees first: the entry links to them) and, for
        an entry choosing per call, its key-tiled body: linked (``body``: its object code,
        ``tiled``: its epilogue kernel's image, ``rule``), else as IR (``lazy``), or
        neither when it cannot be built (the row panels every call)."""
        if kernel.lazy is not None and self._bodies:
            kernel.build_tiled()
        record: dict[str, Any] = {"kind": "dense", "name": kernel.name}
        record["epilogue"] = self.image(kernel.epilogue)
        linked = kernel.linked
        if linked is not None:
            record["tiled"] = self.image(kernel.tiled)
            record["body"] = self._body_image(linked)
            record["rule"] = dataclasses.asdict(linked.rule)
        elif kernel.lazy is not None and not kernel.tiled_error:
            record["lazy"] = self._lazy_record(kernel.lazy)
        elif kernel.lazy is None and kernel.tiled is not None:  # an eager body's epilogue
            record["tiled"] = self.image(kernel.tiled)
        record["entry"] = self.image(kernel.kernel)
        return record

    def _body_image(self, body: LinkedBody) -> int:
        """The index of a linked key-tiled body's image (kind ``body``: its object code,
        symbol, imports; no kernel of its own: the entry calls it through its cell)."""
        loaded = body.loaded
        if not loaded.obj:
            raise ModelFileError(f"key-tiled body {body.name!r} has no object code to save")
        self.records.append(
            {
                "kind": "body",
                "name": body.name,
                "entry": body.name,
                "runtime": bool(loaded.runtime),
                "imports": list(loaded.imports),
                "opt_level": int(loaded.level),
                "object": self._add(loaded.obj),
                "source": self._text(body.ir),
            }
        )
        return len(self.records) - 1

    def _lazy_record(self, src: TiledSource) -> dict[str, Any]:
        """An entry's key-tiled body as code to compile (:class:`TiledSource`): its
        modules' IR text (compressed blobs), names and rule."""
        ep = src.epilogue
        text = self._text
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

    def _text(self, text: str) -> int:
        """The index of ``text`` (IR) stored as a compressed blob."""
        return self._add(zlib.compress(text.encode(), 1))

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
            "source": self._text(k.source),
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
        try:
            linked = self._link_together()
        except CodegenError as exc:
            msg = f"model file {self._label!r}: its code does not link: {exc}"
            raise ModelFileError(msg[:400]) from None
        for i, r in enumerate(self._records):
            try:
                self.kernels.append(self._load(r, target, linked.get(i)))
            except ModelFileError:
                raise
            except (KeyError, TypeError, ValueError, IndexError, CodegenError) as exc:
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
            return self._dense(r)
        if r["kind"] == "body":
            return self._link(r, linked)
        cls, spec_cls = _classes(str(r["kind"]))
        emitted = _emitted(_text(self._blob, r["source"]), r)
        loaded = self._link(r, linked)
        k = cls(str(r["name"]), emitted, loaded, target, 0.0, True, bool(r["fastmath"]))
        if spec_cls is not None:
            k.spec = _spec(spec_cls, r["spec"])
        return k

    def _link(self, r: dict[str, Any], linked: Any) -> Any:
        """An image's object code linked (or taken from the one link), its entry exported
        to the images after it."""
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
        self._exports[entry] = linked[entry]
        linked.level = int(r.get("opt_level", 3))
        return linked

    def _dense(self, r: dict[str, Any]) -> DenseKernel:
        """A GEMM entry from its record, with its key-tiled body linked (``body``: the cell
        written now), as IR (``lazy``) or none (its cell stays null: the row panels)."""
        entry, epilogue = self._kernel(r["entry"]), self._kernel(r["epilogue"])
        tiled = self._kernel(r["tiled"]) if "tiled" in r else None
        if "lazy" in r and "body" in r:
            raise ModelFileError(f"model file {self._label!r}: {entry.entry}: two key-tiled bodies")
        lazy = _lazy(r["lazy"], self._blob) if "lazy" in r else None
        body = self._linked_body(r, tiled) if "body" in r else None
        cell = self._cells.get(entry.entry + TILED_CELL)
        if (lazy is not None or body is not None) and cell is None:
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
            body=body,
        )

    def _linked_body(self, r: dict[str, Any], tiled: Any) -> LinkedBody:
        """A dense record's key-tiled body linked from its object code (an image of kind
        ``body`` calling the body's epilogue kernel, ``tiled``)."""
        index = r["body"]
        body = self._kernel(index)
        record = self._records[index]
        if not isinstance(body, jit.Loaded) or record.get("kind") != "body" or tiled is None:
            raise ModelFileError(f"model file {self._label!r}: bad key-tiled body {index!r}")
        if tiled.entry not in record["imports"]:
            raise ModelFileError(
                f"model file {self._label!r}: key-tiled body {index!r} does not call its epilogue"
            )
        return LinkedBody(
            str(record["entry"]), body, _rule(r["rule"]), _text(self._blob, record["source"])
        )


def _text(blob: Blob, index: Any) -> str:
    """A compressed IR text blob."""
    return zlib.decompressobj().decompress(bytes(blob(index)), MAX_SOURCE).decode()


def _emitted(ir: str, r: dict[str, Any]) -> Emitted:
    """A kernel's emitted module from a record's ``entry``, ``args``, ``dims`` and
    ``parallel`` (:meth:`ImageWriter._llvm_record`, ``_lazy_record``) and its IR text."""
    args = tuple(
        ArgSpec(str(n), str(role), str(dt), int(rank), str(text))
        for n, role, dt, rank, text in r["args"]
    )
    return Emitted(ir, str(r["entry"]), args, tuple(map(str, r["dims"])), bool(r["parallel"]), ())


def _lazy(d: dict[str, Any], blob: Blob) -> TiledSource:
    """An entry's key-tiled body from its record (:meth:`ImageWriter._lazy_record`)."""
    ep = _emitted(_text(blob, d["epilogue_ir"]), d)
    rule = _rule(d["rule"])
    name, body_name = str(d["name"]), str(d["body_name"])
    return TiledSource(name, ep, bool(d["fastmath"]), body_name, _text(blob, d["body_ir"]), rule)


def _rule(fields: Any) -> TiledRule:
    """An entry's :class:`TiledRule` from its fields, checked (ints, a flag, three
    layouts each None or ``(heads, depth, transposed)``)."""
    rule = _spec(TiledRule, fields)
    ints = (rule.item, rule.panel_bytes, rule.min_rows, rule.limit, rule.v_at)
    lays = rule.layouts
    if (
        any(type(x) is not int or x < 0 for x in ints)
        or type(rule.batched) is not bool
        or not isinstance(lays, tuple)
        or len(lays) != 3
        or not all(x is None or _layout(x) for x in lays)
    ):
        raise ValueError(f"bad key-tiled rule {fields!r}"[:200])
    return dataclasses.replace(rule, layouts=tuple(None if x is None else tuple(x) for x in lays))


def _layout(x: Any) -> bool:
    """Whether ``x`` is an operand's layout ``(heads, depth, transposed)``."""
    return (
        isinstance(x, (list, tuple))
        and len(x) == 3
        and all(type(v) is int and v > 0 for v in x[:2])
        and type(x[2]) is bool
    )


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
