"""ONNX front end: an ONNX model (proto, file or bytes) -> a geode :class:`Graph`.

::

    g = import_model("model.onnx")           # or a ModelProto, or the file's bytes
    model = geode.compile(g)

What it does:

- loads files and bytes through the ``onnx`` package only; tensors stored in external
  files are read through ``onnx.external_data_helper``, whose checked loader rejects
  locations outside the model's folder (absolute paths, ``..``, symbolic links);
- checks the opset imports (default domain: :data:`SUPPORTED_OPSET_RANGE`);
- decodes text that is not valid UTF-8 (names, ``dim_param``, op types;
  :mod:`geode.compiler.frontend.onnx_text`) as it decodes string attributes;
- turns graph inputs into :meth:`Graph.input` values (``dim_value`` -> int,
  ``dim_param`` -> one shared symbol per name, missing dim -> fresh symbol, missing
  shape -> unknown rank) and initializers into constants, except an initializer that
  a node of geode's domain (``"geode"``: Assign, AssignAdd, AssignSub) writes, which
  becomes a variable of that name with the initializer as its initial value;
- converts every node's attributes to Python values, brings the node from the model's
  opset to geode's opset-21 form (:mod:`geode.compiler.frontend.onnx_versions`) and adds
  it with :meth:`Graph.add_node` (verify + shape inference). ``Constant`` nodes become
  constants; model-local functions, and ONNX ops that geode does not register but that
  ONNX defines by a function body, are expanded into their body's nodes.

Errors: :class:`ModelLoadError` for anything wrong with the file or the model's
structure, :class:`UnknownOpError` for ops and domains geode does not know.

External data: a constant whose tensor lives in an external file carries
``value.external = (path, offset, length)`` and ``value.external_loader`` (a callable
returning the array, reading through onnx's checked loader); see :func:`external_loader`.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from geode.compiler import dtypes
from geode.compiler.frontend import onnx_versions
from geode.compiler.frontend.onnx_text import decode_text, decoded
from geode.compiler.frontend.onnx_versions import AdaptContext, NodeSpec
from geode.compiler.ir import GEODE_DOMAIN, Graph, TensorDesc, Value, ValueKind
from geode.compiler.ops import registry
from geode.compiler.ops.state import WRITE_OPS
from geode.compiler.shapes import SymbolTable
from geode.errors import ModelLoadError, UnknownOpError

#: default-domain (``ai.onnx``) opsets the importer honours, inclusive.
SUPPORTED_OPSET_RANGE: tuple[int, int] = onnx_versions.SUPPORTED_OPSET_RANGE

#: domains whose ops geode registers under the default domain.
DEFAULT_DOMAINS = ("", "ai.onnx")

#: with ``load_external=False``, external tensors up to this size are still read at
#: import (they are usually shapes, axes or scalars that shape inference needs).
EAGER_EXTERNAL_BYTES = 4096

#: nesting limit for function expansion (a function whose body calls functions).
MAX_FUNCTION_DEPTH = 16

_A = onnx.AttributeProto


@dataclass(frozen=True)
class ExternalRef:
    """Where a constant's data lives: a file next to the model, a byte range in it."""

    path: str  #: absolute path of the data file (identity only; read through ``loader``)
    offset: int
    length: int
    location: str  #: the location as written in the model (relative to its folder)
    tensor: str  #: the tensor's name in the model


def import_model(
    model: onnx.ModelProto | str | os.PathLike | bytes,
    *,
    load_external: bool = True,
    overridable_initializers: bool = False,
    expand_functions: bool = True,
    external_data_dir: str | os.PathLike | None = None,
) -> Graph:
    """Import an ONNX model as a geode Graph.

    ``model`` is a ``ModelProto``, a path to a model file, or a serialized model.
    With ``load_external`` (the default) tensors in external files are read now; without
    it, those larger than :data:`EAGER_EXTERNAL_BYTES` become constants with
    ``data=None`` and an ``external_loader`` for the session to load lazily.
    ``overridable_initializers`` keeps initializers that are also graph inputs (IR
    version >= 4) as inputs, with the initializer on ``value.default``; by default they
    are constants. ``expand_functions`` expands ops that geode does not register but
    that ONNX defines as a function of other ops. ``external_data_dir`` is the folder
    of external data for a ``ModelProto`` or bytes (a path's own folder otherwise).

    Raises :class:`ModelLoadError` for unreadable files, non-ONNX data, unsupported
    opsets, untyped inputs and bad external data; :class:`UnknownOpError` for ops and
    domains geode does not know.
    """
    proto, base_dir, label = _load(model)
    if external_data_dir is not None:
        base_dir = os.path.abspath(os.fspath(external_data_dir))
    _check_model(proto, label)
    proto = decoded(proto)  # names and dims that are not valid UTF-8
    importer = _Importer(
        proto,
        base_dir,
        label,
        load_external=load_external,
        overridable=overridable_initializers,
        expand_functions=expand_functions,
    )
    return importer.run()


def external_loader(value: Value) -> Callable[[], np.ndarray] | None:
    """The loader of a constant whose data is in an external file (None for others).

    The loader reads the tensor through ``onnx.external_data_helper`` (so the file is
    checked to lie inside the model's folder again) and returns a fresh array.
    """
    return getattr(value, "external_loader", None)


# -- loading ------------------------------------------------------------------------------
def _load(model: object) -> tuple[onnx.ModelProto, str | None, str]:
    """The ModelProto, the folder of its external data (if known) and a label for errors."""
    if isinstance(model, onnx.ModelProto):
        return model, None, f"ONNX model {model.graph.name or '(unnamed)'!r}"
    if isinstance(model, (bytearray, memoryview)):
        model = bytes(model)
    if isinstance(model, bytes):
        label = f"ONNX model bytes ({len(model)} bytes)"
        try:
            proto = onnx.load_model_from_string(model)
        except Exception as exc:  # protobuf DecodeError and friends
            raise ModelLoadError(f"{label}: not a readable ONNX model: {_exc_text(exc)}") from exc
        return proto, None, label
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        label = f"ONNX model file {path!r}"
        if not os.path.exists(path):
            raise ModelLoadError(f"{label}: no such file")
        if not os.path.isfile(path):
            raise ModelLoadError(f"{label}: not a regular file")
        try:
            proto = onnx.load(path, load_external_data=False)
        except Exception as exc:
            raise ModelLoadError(f"{label}: not a readable ONNX model: {_exc_text(exc)}") from exc
        return proto, os.path.dirname(os.path.abspath(path)), label
    raise ModelLoadError(
        f"cannot import a {type(model).__name__} as an ONNX model: "
        "give a ModelProto, a path to a .onnx file or the model's bytes"
    )


def _exc_text(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "..."


def _check_model(proto: object, label: str) -> None:
    """ModelLoadError unless ``proto`` looks like an ONNX ModelProto."""
    if not isinstance(proto, onnx.ModelProto):
        raise ModelLoadError(f"{label}: not an ONNX ModelProto ({type(proto).__name__})")
    if proto.ir_version <= 0:
        raise ModelLoadError(f"{label}: not an ONNX model (no IR version)")
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{label}: not an ONNX model (no graph)")
    if proto.ir_version >= 3 and not proto.opset_import:
        raise ModelLoadError(f"{label}: not an ONNX model (no opset import)")


def _norm_domain(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


def _domain_name(domain: str) -> str:
    return domain or "ai.onnx"


def _opsets(entries: Iterable[onnx.OperatorSetIdProto]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in entries:
        out[_norm_domain(e.domain)] = int(e.version)
    return out


# -- names read and defined by graphs (for ordering and captures) -------------------------
def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out = []
    for a in node.attribute:
        if a.type == _A.GRAPH or (a.type == _A.UNDEFINED and a.HasField("g")):
            out.append(a.g)
        elif a.type == _A.GRAPHS:
            out.extend(a.graphs)
    return out


def _free_names(gp: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads from enclosing scopes."""
    defined = {vi.name for vi in gp.input} | {t.name for t in gp.initializer}
    defined |= {s.values.name for s in gp.sparse_initializer}
    used: set[str] = set()
    for n in gp.node:
        used.update(x for x in n.input if x)
        for sg in _subgraphs(n):
            used |= _free_names(sg)
        defined.update(x for x in n.output if x)
    used.update(vo.name for vo in gp.output)
    return used - defined


def _node_reads(node: onnx.NodeProto) -> list[str]:
    names = [x for x in node.input if x]
    for sg in _subgraphs(node):
        names.extend(sorted(_free_names(sg)))
    return names


def _all_reads(gp: onnx.GraphProto, acc: set[str]) -> set[str]:
    for n in gp.node:
        acc.update(x for x in n.input if x)
        for sg in _subgraphs(n):
            _all_reads(sg, acc)
    acc.update(vo.name for vo in gp.output)
    return acc


def _all_names(gp: onnx.GraphProto, acc: set[str]) -> set[str]:
    """Every value name a graph and its subgraphs define or read."""
    acc.update(vi.name for vi in gp.input)
    acc.update(t.name for t in gp.initializer)
    acc.update(s.values.name for s in gp.sparse_initializer)
    for n in gp.node:
        acc.update(n.input)
        acc.update(n.output)
        for sg in _subgraphs(n):
            _all_names(sg, acc)
    return acc


def _toposort(nodes: list[onnx.NodeProto], label: str) -> list[onnx.NodeProto]:
    """Nodes in a topological order (the model's order when it already is one)."""
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer.setdefault(o, i)
    deps: list[set[int]] = []
    readers: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        d = {producer[x] for x in _node_reads(n) if x in producer and producer[x] != i}
        deps.append(d)
        for p in d:
            readers.setdefault(p, []).append(i)
    indeg = [len(d) for d in deps]
    heap = [i for i in range(len(nodes)) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        i = heapq.heappop(heap)
        order.append(i)
        for r in readers.get(i, []):
            indeg[r] -= 1
            if indeg[r] == 0:
                heapq.heappush(heap, r)
    if len(order) != len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i in range(len(nodes)) if indeg[i] > 0][:5]
        raise ModelLoadError(f"{label}: the graph has a cycle through nodes {stuck}")
    return [nodes[i] for i in order]


# -- the importer -------------------------------------------------------------------------
class _Importer:
    """Model-wide state: opsets, options, external data, local functions."""

    def __init__(
        self,
        proto: onnx.ModelProto,
        base_dir: str | None,
        label: str,
        *,
        load_external: bool,
        overridable: bool,
        expand_functions: bool,
    ):
        self.proto = proto
        self.base_dir = base_dir
        self.label = label
        self.load_external = load_external
        self.overridable = overridable
        self.expand_functions = expand_functions
        self.ir_version = int(proto.ir_version)
        self.opsets = _opsets(proto.opset_import)
        self.functions: dict[tuple[str, str], onnx.FunctionProto] = {}
        for f in proto.functions:
            self.functions[(_norm_domain(f.domain), f.name)] = f
        self.used = _all_reads(proto.graph, set())
        self.model_names = _all_names(proto.graph, set())
        self._external_cache: dict[tuple, np.ndarray] = {}
        self._check_opsets()

    def _check_opsets(self) -> None:
        lo, hi = SUPPORTED_OPSET_RANGE
        if "" not in self.opsets:
            if self.ir_version < 3:
                self.opsets[""] = 1  # IR < 3 predates opset imports: opset 1
            else:
                return  # no default-domain ops; nodes that need one fail by name
        v = self.opsets[""]
        if v > hi:
            raise ModelLoadError(
                f"{self.label}: domain 'ai.onnx' opset {v} is newer than supported "
                f"(geode supports ai.onnx opsets {lo} to {hi})"
            )
        if v < lo:
            raise ModelLoadError(
                f"{self.label}: domain 'ai.onnx' opset {v} is older than supported "
                f"(geode supports ai.onnx opsets {lo} to {hi})"
            )

    def run(self) -> Graph:
        """Import the main graph."""
        gb = _GraphBuilder(self, self.proto.graph, parent=None)
        g = gb.build()
        g.onnx_opsets = dict(self.opsets)  # type: ignore[attr-defined]
        g.onnx_ir_version = self.ir_version  # type: ignore[attr-defined]
        return g

    # -- tensors ------------------------------------------------------------------------
    def tensor_array(
        self, t: onnx.TensorProto, what: str
    ) -> tuple[np.ndarray | None, ExternalRef | None, Callable[[], np.ndarray] | None]:
        """A tensor's data (None when left for lazy loading), its external ref and loader."""
        if any(d < 0 for d in t.dims):
            raise ModelLoadError(
                f"{self.label}: {what} {t.name!r} has dims {list(t.dims)}: a stored tensor's "
                "dims cannot be negative"
            )
        if external_data_helper.uses_external_data(t):
            return self._external(t, what)
        try:
            return np.array(numpy_helper.to_array(t)), None, None
        except Exception as exc:
            raise ModelLoadError(
                f"{self.label}: cannot read {what} {t.name!r}: {_exc_text(exc)}"
            ) from exc

    def _external(
        self, t: onnx.TensorProto, what: str
    ) -> tuple[np.ndarray | None, ExternalRef, Callable[[], np.ndarray]]:
        try:
            info = external_data_helper.ExternalDataInfo(t)
        except Exception as exc:
            raise ModelLoadError(
                f"{self.label}: {what} {t.name!r}: bad external data entry: {_exc_text(exc)}"
            ) from exc
        loc = info.location
        where = f"{self.label}: {what} {t.name!r} with external data at location {loc!r}"
        if not loc:
            raise ModelLoadError(f"{where}: no location given")
        if self.base_dir is None:
            raise ModelLoadError(
                f"{where}: the model was not loaded from a file, so its folder is unknown; "
                "import it from its path or pass external_data_dir="
            )
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        except Exception as exc:
            raise ModelLoadError(f"{where}: unsupported data type {t.data_type}") from exc
        shape = tuple(int(d) for d in t.dims)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset = int(info.offset or 0)
        length = int(info.length) if info.length is not None else nbytes
        stub = _external_stub(t)
        base_dir = self.base_dir

        def loader() -> np.ndarray:
            """Read the tensor through onnx's checked external-data loader."""
            return _load_external(stub, base_dir, where)

        key = (loc, offset, length, dtype.str, shape)  # one read per (file, byte range)
        arr = self._external_cache.get(key)
        if arr is None:
            if self.load_external or nbytes <= EAGER_EXTERNAL_BYTES:
                arr = loader()  # onnx's checked loader rejects locations outside base_dir
                self._external_cache[key] = arr
            else:
                _check_external_location(stub, base_dir, where)
        # the location has passed onnx's checks (inside base_dir, a regular file): its
        # absolute path is the identity of the file for (file, offset) dedup; the data
        # itself is only ever read through ``loader``
        ref = ExternalRef(
            os.path.normpath(os.path.join(base_dir, loc)), offset, length, loc, t.name
        )
        return arr, ref, loader


def _external_stub(t: onnx.TensorProto) -> onnx.TensorProto:
    """A copy of a tensor's header and external-data entries, without any data."""
    stub = onnx.TensorProto()
    stub.name = t.name
    stub.data_type = t.data_type
    stub.dims.extend(t.dims)
    stub.data_location = onnx.TensorProto.EXTERNAL
    for e in t.external_data:
        entry = stub.external_data.add()
        entry.key, entry.value = e.key, e.value
    return stub


def _load_external(stub: onnx.TensorProto, base_dir: str, where: str) -> np.ndarray:
    t = onnx.TensorProto()
    t.CopyFrom(stub)
    try:
        external_data_helper.load_external_data_for_tensor(t, base_dir)
        arr = numpy_helper.to_array(t)
    except Exception as exc:
        raise ModelLoadError(f"{where}: {_exc_text(exc)}") from exc
    return np.array(arr)  # a writable copy, independent of the read buffer


def _check_external_location(stub: onnx.TensorProto, base_dir: str, where: str) -> None:
    """Validate an external location through onnx's checked loader, reading no data."""
    t = onnx.TensorProto()
    t.CopyFrom(stub)
    keep = [(e.key, e.value) for e in t.external_data if e.key not in ("length",)]
    del t.external_data[:]
    for k, v in [*keep, ("length", "0")]:
        entry = t.external_data.add()
        entry.key, entry.value = k, v
    try:
        external_data_helper.load_external_data_for_tensor(t, base_dir)
    except Exception as exc:
        raise ModelLoadError(f"{where}: {_exc_text(exc)}") from exc


def _sparse_to_dense(
    sp: onnx.SparseTensorProto, values: np.ndarray, indices: np.ndarray
) -> np.ndarray:
    dims = tuple(int(d) for d in sp.dims)
    dense = np.zeros(int(np.prod(dims, dtype=np.int64)), dtype=values.dtype)
    if indices.size:
        flat = (
            indices.reshape(-1)
            if indices.ndim == 1
            else np.ravel_multi_index(tuple(indices.T), dims)
        )
        dense[flat] = values.reshape(-1)
    return dense.reshape(dims)


class _GraphBuilder:
    """Imports one GraphProto (the main graph or a subgraph) into a geode Graph."""

    def __init__(
        self,
        imp: _Importer,
        gp: onnx.GraphProto,
        parent: _GraphBuilder | None,
        input_hints: list[TensorDesc | None] | None = None,
    ):
        self.imp = imp
        self.gp = gp
        self.parent = parent
        #: types for the formal inputs of a subgraph that leaves them untyped (ONNX lets a
        #: Loop or Scan body take its inputs' types from the node's inputs)
        self.input_hints = list(input_hints or [])
        self.graph = Graph(gp.name or ("main" if parent is None else "subgraph"))
        self.scope: dict[str, Value] = {}
        self.captures: list[str] = []
        self._node_count = 0
        self._reserved: set[str] = set()
        #: initializers that geode-domain Assign ops write: variables, not constants
        self.written = {
            n.input[0]
            for n in gp.node
            if _norm_domain(n.domain) == GEODE_DOMAIN and n.op_type in WRITE_OPS and n.input
        }

    @property
    def label(self) -> str:
        """How errors name this graph."""
        return (
            self.imp.label
            if self.parent is None
            else f"{self.imp.label}, subgraph {self.graph.name!r}"
        )

    # -- values ---------------------------------------------------------------------------
    def lookup(self, name: str, reader: str) -> Value:
        """The value a node input names: local, or captured from an enclosing graph."""
        v = self.scope.get(name)
        if v is not None:
            return v
        if self.parent is not None:
            outer = self.parent.find(name)
            if outer is not None:
                v = self.graph.input(name, outer.shape, outer.dtype)
                self.scope[name] = v
                self.captures.append(name)
                return v
        raise ModelLoadError(
            f"{self.label}: {reader} reads {name!r}, which no node, input or initializer defines"
        )

    def find(self, name: str) -> Value | None:
        """A value visible in this graph or an enclosing one (capturing it here if needed)."""
        if name in self.scope:
            return self.scope[name]
        if self.parent is None or self.parent.find(name) is None:
            return None
        return self.lookup(name, "a subgraph")

    def _define(self, name: str, v: Value) -> None:
        self.scope[name] = v

    def _check_new_name(self, name: str, what: str) -> None:
        if name in self.scope or name in self.graph.values:
            raise ModelLoadError(
                f"{self.label}: {what} {name!r} reuses a name that is already defined"
            )

    def fresh_name(self, base: str) -> str:
        """A value name not used in the graph and not promised to another value."""
        name = self.graph.unique_name(base)
        k = 0
        while name in self._reserved or name in self.scope or name in self.imp.model_names:
            k += 1
            name = self.graph.unique_name(f"{base}_{k}")
        self._reserved.add(name)
        return name

    def value_desc(
        self, vi: onnx.ValueInfoProto, what: str, hint: TensorDesc | None = None
    ) -> TensorDesc:
        """TensorDesc of a graph input's ValueInfo (ModelLoadError when it has no type).

        A subgraph input without a type (or element type) takes ``hint``'s, the type of
        the node input it receives, when there is one; one with a type but no shape
        takes the hint's rank (and its static dims). The hint's symbolic dims become fresh
        symbols: a loop-carried value may change size from one iteration to the next.
        """
        hint_shape = None
        if hint is not None and hint.shape is not None:
            hint_shape = tuple(
                d if isinstance(d, int) else self.graph.symbols.fresh() for d in hint.shape
            )
        untyped = not vi.HasField("type") or (
            vi.type.WhichOneof("value") == "tensor_type"
            and vi.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED
        )
        if untyped and hint is not None and self.parent is not None:
            return TensorDesc(hint.dtype, hint_shape)
        if not vi.HasField("type"):
            raise ModelLoadError(f"{self.label}: {what} {vi.name!r} has no type")
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            raise ModelLoadError(
                f"{self.label}: {what} {vi.name!r} has type {kind or 'none'}; geode imports tensors only"
            )
        tt = vi.type.tensor_type
        if tt.elem_type == onnx.TensorProto.UNDEFINED:
            raise ModelLoadError(f"{self.label}: {what} {vi.name!r} has no element type")
        dtype = dtypes.to_numpy(tt.elem_type, f"{what} {vi.name!r}")
        if not tt.HasField("shape"):
            usable = self.parent is not None and hint is not None and hint.dtype == dtype
            return TensorDesc(dtype, hint_shape if usable else None)
        dims: list[object] = []
        for d in tt.shape.dim:
            which = d.WhichOneof("value")
            if which == "dim_value" and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif which == "dim_param" and d.dim_param:
                dims.append(self.graph.symbols.named_dim(d.dim_param))
            else:
                dims.append(self.graph.symbols.fresh())
        return TensorDesc(dtype, tuple(dims))

    # -- the graph ---------------------------------------------------------------------------
    def build(self) -> Graph:
        """Import inputs, initializers, nodes and outputs."""
        gp, g, imp = self.gp, self.graph, self.imp
        init_names = [t.name for t in gp.initializer] + [
            s.values.name for s in gp.sparse_initializer
        ]
        init_set = set(init_names)
        overridable = imp.overridable and imp.ir_version >= 4
        inputs_as_defaults: dict[str, Value] = {}
        seen_inputs: set[str] = set()
        for vi in gp.input:
            if not vi.name:
                raise ModelLoadError(f"{self.label}: a graph input has no name")
            if vi.name in seen_inputs:
                raise ModelLoadError(f"{self.label}: graph input {vi.name!r} is listed twice")
            seen_inputs.add(vi.name)
            if vi.name in init_set and not overridable:
                continue  # an initializer: a constant
            k = len(seen_inputs) - 1
            hint = self.input_hints[k] if k < len(self.input_hints) else None
            desc = self.value_desc(vi, "graph input", hint)
            v = g.input(vi.name, desc.shape, desc.dtype)
            self._define(vi.name, v)
            if vi.name in init_set:
                inputs_as_defaults[vi.name] = v
        for t in gp.initializer:
            self._initializer(t.name, t, inputs_as_defaults)
        for sp in gp.sparse_initializer:
            self._initializer(sp.values.name, sp, inputs_as_defaults)
        for node in _toposort(list(gp.node), self.label):
            self.convert(node, imp.opsets, depth=0)
        self._outputs()
        if self.captures:
            g.captures = list(self.captures)  # type: ignore[attr-defined]
        return g

    def _initializer(
        self, name: str, t: onnx.TensorProto | onnx.SparseTensorProto, defaults: dict[str, Value]
    ) -> None:
        if not name:
            raise ModelLoadError(f"{self.label}: an initializer has no name")
        arr, ref, loader = self._tensor(t, "initializer")
        if name in defaults:
            defaults[name].default = arr  # type: ignore[attr-defined]
            return
        self._check_new_name(name, "initializer")
        if name in self.written:  # a variable, with the initializer as its initial value
            v = self.graph.variable(loader() if arr is None else arr, name)
        else:
            v = self._constant(name, arr, t, ref, loader)
        self._define(name, v)

    def _tensor(
        self, t: onnx.TensorProto | onnx.SparseTensorProto, what: str
    ) -> tuple[np.ndarray | None, ExternalRef | None, Callable | None]:
        if isinstance(t, onnx.SparseTensorProto):
            values, _, _ = self.imp.tensor_array(t.values, f"sparse {what}")
            indices, _, _ = self.imp.tensor_array(t.indices, f"sparse {what} indices")
            if values is None or indices is None:
                raise ModelLoadError(
                    f"{self.label}: sparse {what} {t.values.name!r} needs its external data loaded"
                )
            try:
                return _sparse_to_dense(t, values, indices), None, None
            except Exception as exc:
                raise ModelLoadError(
                    f"{self.label}: bad sparse {what} {t.values.name!r}: {_exc_text(exc)}"
                ) from exc
        return self.imp.tensor_array(t, what)

    def _constant(
        self,
        name: str,
        arr: np.ndarray | None,
        t: Any,
        ref: ExternalRef | None,
        loader: Callable | None,
    ) -> Value:
        g = self.graph
        if arr is not None:
            dtype, shape = arr.dtype, tuple(arr.shape)
        else:  # lazily loaded external tensor: shape and dtype from the tensor's header
            dtype = dtypes.to_numpy(t.data_type, f"initializer {name!r}")
            shape = tuple(int(d) for d in t.dims)
        # Graph.constant copies its data; attach ours afterwards (no second copy of the
        # weights, and tensors sharing one external byte range share one array)
        v = g.constant(np.zeros((), dtype=dtype), name=name)
        v.desc = TensorDesc(dtype, shape)
        v.data = arr
        if v.name != name:  # Graph.constant also steers clear of node names; values may not
            g.rename(v, name)
        if ref is not None:
            v.external = (ref.path, ref.offset, ref.length)  # type: ignore[attr-defined]
            v.external_ref = ref  # type: ignore[attr-defined]
            v.external_loader = loader  # type: ignore[attr-defined]
        return v

    def _outputs(self) -> None:
        """Mark the graph outputs, each under its ONNX name.

        In the main graph an output that is a graph input is that input itself (the model
        returns a copy of what it was given, under the input's name), and an output listed
        again (``[y, y]``) is kept once: a geode Graph's outputs have distinct names, and
        a result dict holds each name once; :class:`geode.onnx_backend.GeodeRep` returns
        it at every position the model lists it. A subgraph's outputs are bound by
        position, so there a repeated output or an input gets its own Identity copy.
        """
        g = self.graph
        main = self.parent is None
        for vo in self.gp.output:
            name = vo.name
            v = self.find(name)
            if v is None:
                raise ModelLoadError(
                    f"{self.label}: graph output {name!r} is not produced by any node, input or initializer"
                )
            if main and any(o.name == name for o in g.outputs):
                continue  # listed again: one graph output (see the docstring)
            if v.kind is ValueKind.INTERMEDIATE and v not in g.outputs:
                g.outputs.append(v)
                continue
            if main and v.kind is ValueKind.INPUT and v.name == name:
                g.outputs.append(v)
                continue
            # an input, initializer or repeated output: copy it through an Identity
            if v.kind is ValueKind.CONSTANT and v.name == name:
                g.rename(v, self.fresh_name(f"{name}_init"))
                self.scope[name] = v
                out_name = name
            else:
                out_name = self.fresh_name(f"{name}_output")
            node = g.add_node("Identity", [v], {}, name=f"{name}_identity", output_names=[out_name])
            g.outputs.append(node.outputs[0])

    # -- nodes -----------------------------------------------------------------------------
    def node_name(self, node: onnx.NodeProto) -> str:
        """The node's name, or a generated one when empty."""
        self._node_count += 1
        return node.name or f"{node.op_type}_{self._node_count - 1}"

    def convert(self, node: onnx.NodeProto, opsets: dict[str, int], depth: int) -> None:
        """Import one node (adapting it to opset 21, or expanding it) into the graph."""
        domain = _norm_domain(node.domain)
        op = node.op_type
        name = self.node_name(node)
        where = f"node {name!r} ({op})"
        version = opsets.get(domain)
        if domain == "" and op == "Constant":
            self._constant_node(node, name)
            return
        if (domain, op) in self.imp.functions and not registry.has(op, domain):
            self._expand(node, name, self.imp.functions[(domain, op)], opsets, depth)
            return
        if version is None:
            if domain == "" or registry.has(op, domain):
                raise ModelLoadError(
                    f"{self.label}: {where} uses domain {_domain_name(domain)!r}, which the model does not import"
                )
            raise UnknownOpError(op, _domain_name(domain), None, where=where)
        target = onnx_versions.target_op(op, domain)
        if not registry.has(target, domain):
            fn = (
                self._schema_function(node, domain, version)
                if domain == "" and self.imp.expand_functions
                else None
            )
            if fn is None:
                raise UnknownOpError(op, _domain_name(domain), version, where=where)
            self._expand(node, name, fn, opsets, depth)
            return
        inputs = [None if not x else self.lookup(x, where) for x in node.input]
        attrs = self._attrs(node, where, _body_input_hints(op, domain, node, inputs))
        captured = _captured_names(attrs)
        if captured:
            # values the subgraphs read from enclosing scopes become trailing inputs of
            # the node (so the outer graph sees the dependency and the op receives them);
            # the "captures" attribute names them, and each subgraph's ``captures`` lists
            # which of them its trailing inputs are
            if registry.has(op, domain) and registry.get(op, domain).attr_spec("captures") is None:
                raise ModelLoadError(
                    f"{self.label}: {where}: its subgraphs read outer values {captured}, "
                    f"but geode's {op} takes no captured inputs"
                )
            inputs = list(inputs) + [self.lookup(x, where) for x in captured]
            attrs["captures"] = captured
        spec = NodeSpec(op, domain, version, inputs, attrs, list(node.output), name, source_op=op)
        ctx = AdaptContext(self.graph, name, lambda n: n in self.imp.used, namer=self.fresh_name)
        spec = onnx_versions.adapt(spec, ctx)
        if not registry.has(spec.op_type, spec.domain):
            raise UnknownOpError(
                op, _domain_name(domain), version, where=where + f" (needs {spec.op_type})"
            )
        self._emit(spec)

    def _emit(self, spec: NodeSpec) -> None:
        outputs = list(spec.outputs)
        while outputs and not outputs[-1]:
            outputs.pop()
        names = []
        for i, o in enumerate(outputs):
            if o:
                self._check_new_name(o, f"output {i} of node {spec.name!r}")
                names.append(o)
            else:
                names.append(self.fresh_name(f"{spec.name}/unused{i}"))
        if not names:
            names = [self.fresh_name(f"{spec.name}/out")]
        inputs = list(spec.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        node = self.graph.add_node(
            spec.op_type,
            inputs,
            spec.attrs,
            n_outputs=len(names),
            name=spec.name,
            domain=spec.domain,
            output_names=names,
        )
        for o in node.outputs:
            self._define(o.name, o)

    def _constant_node(self, node: onnx.NodeProto, name: str) -> None:
        where = f"node {name!r} (Constant)"
        if len(node.output) != 1 or not node.output[0]:
            raise ModelLoadError(f"{self.label}: {where} must have one output")
        if len(node.attribute) != 1:
            raise ModelLoadError(
                f"{self.label}: {where} needs exactly one value attribute, got {[a.name for a in node.attribute]}"
            )
        a = node.attribute[0]
        ref = loader = None
        t: Any = None
        if a.name == "value":
            t = a.t
            arr, ref, loader = self._tensor(t, "Constant tensor")
        elif a.name == "sparse_value":
            arr, _, _ = self._tensor(a.sparse_tensor, "Constant tensor")
        elif a.name == "value_float":
            arr = np.array(a.f, dtype=np.float32)
        elif a.name == "value_floats":
            arr = np.array(list(a.floats), dtype=np.float32)
        elif a.name == "value_int":
            arr = np.array(a.i, dtype=np.int64)
        elif a.name == "value_ints":
            arr = np.array(list(a.ints), dtype=np.int64)
        elif a.name == "value_string":
            arr = np.array(decode_text(a.s), dtype=object)
        elif a.name == "value_strings":
            arr = np.array([decode_text(s) for s in a.strings], dtype=object)
        else:
            raise ModelLoadError(f"{self.label}: {where} has unknown attribute {a.name!r}")
        out = node.output[0]
        self._check_new_name(out, f"output of {where}")
        self._define(out, self._constant(out, arr, t, ref, loader))

    # -- attributes ------------------------------------------------------------------------
    def _attrs(
        self,
        node: onnx.NodeProto,
        where: str,
        hints: dict[str, list[TensorDesc | None]] | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for a in node.attribute:
            if a.ref_attr_name:
                raise ModelLoadError(
                    f"{self.label}: {where}: attribute {a.name!r} refers to a function attribute outside a function"
                )
            out[a.name] = self._attr_value(a, where, (hints or {}).get(a.name))
        return out

    def _attr_value(
        self, a: onnx.AttributeProto, where: str, hints: list[TensorDesc | None] | None = None
    ) -> Any:
        t = a.type
        if t == _A.UNDEFINED:  # very old exporters: infer the kind from the field set
            t = _infer_attr_type(a)
        what = f"attribute {a.name!r} of {where}"
        if t == _A.FLOAT:
            return float(a.f)
        if t == _A.INT:
            return int(a.i)
        if t == _A.STRING:
            return decode_text(a.s)
        if t == _A.TENSOR:
            arr, _, _ = self._tensor(a.t, what)
            if arr is None:
                arr = self.imp.tensor_array(a.t, what)[2]()
            return arr
        if t == _A.SPARSE_TENSOR:
            return self._tensor(a.sparse_tensor, what)[0]
        if t == _A.GRAPH:
            return self._subgraph(a.g, hints)
        if t == _A.FLOATS:
            return [float(x) for x in a.floats]
        if t == _A.INTS:
            return [int(x) for x in a.ints]
        if t == _A.STRINGS:
            return [decode_text(s) for s in a.strings]
        if t == _A.TENSORS:
            return [self._tensor(x, what)[0] for x in a.tensors]
        if t == _A.GRAPHS:
            return [self._subgraph(x) for x in a.graphs]
        if t == _A.SPARSE_TENSORS:
            return [self._tensor(x, what)[0] for x in a.sparse_tensors]
        if t == _A.TYPE_PROTO:
            return a.tp
        if t == _A.TYPE_PROTOS:
            return list(a.type_protos)
        raise ModelLoadError(f"{self.label}: {what} has unknown attribute type {t}")

    def _subgraph(
        self, gp: onnx.GraphProto, input_hints: list[TensorDesc | None] | None = None
    ) -> Graph:
        sub = _GraphBuilder(self.imp, gp, parent=self, input_hints=input_hints)
        # one symbol namespace across scopes: the subgraph starts from this graph's
        # symbols (a captured value's dims mean the same in both), and this graph then
        # skips the names the subgraph made up, so no two unrelated dims share a name
        outer = self.graph.symbols
        sub.graph.symbols = SymbolTable(dict(outer.named), outer.counter)
        g = sub.build()
        outer.counter = max(outer.counter, g.symbols.counter)
        for name, symbol in g.symbols.named.items():
            outer.named.setdefault(name, symbol)
        return g

    # -- functions -----------------------------------------------------------------------------
    def _schema_function(
        self, node: onnx.NodeProto, domain: str, version: int
    ) -> onnx.FunctionProto | None:
        """The ONNX function body of an op geode does not register (None if it has none)."""
        try:
            schema = onnx.defs.get_schema(node.op_type, version, domain)
        except Exception:
            return None
        data = b""
        try:
            if schema.has_function:
                versions = [
                    v for v in schema.function_opset_versions if v <= onnx_versions.TARGET_OPSET
                ]
                data = schema.get_function_with_opset_version(
                    max(versions) if versions else version
                )
            elif schema.has_context_dependent_function:
                versions = [
                    v
                    for v in schema.context_dependent_function_opset_versions
                    if v <= onnx_versions.TARGET_OPSET
                ]
                types = []
                for x in node.input:
                    v = self.scope.get(x) if x else None
                    if v is None and x and self.parent is not None:
                        v = self.find(x)
                    shape = (
                        None
                        if v is None or v.shape is None
                        else [d if isinstance(d, int) else None for d in v.shape]
                    )
                    elem = onnx.TensorProto.UNDEFINED if v is None else dtypes.to_onnx(v.dtype)
                    types.append(helper.make_tensor_type_proto(elem, shape).SerializeToString())
                data = schema.get_context_dependent_function_with_opset_version(
                    max(versions) if versions else version, node.SerializeToString(), types
                )
        except Exception:
            return None
        if not data:
            return None
        fn = onnx.FunctionProto()
        fn.ParseFromString(data)
        if not fn.node:
            return None
        # schema defaults, so that expansion binds them like a local function's defaults
        have = {a.name for a in fn.attribute_proto}
        for attr_name, spec in schema.attributes.items():
            default = spec.default_value
            if attr_name not in have and default is not None and default.type != _A.UNDEFINED:
                d = fn.attribute_proto.add()
                d.CopyFrom(default)
                d.name = attr_name
        return fn

    def _expand(
        self,
        node: onnx.NodeProto,
        name: str,
        fn: onnx.FunctionProto,
        opsets: dict[str, int],
        depth: int,
    ) -> None:
        """Inline a function call: the body's nodes, renamed, with attributes bound."""
        where = f"node {name!r} ({node.op_type})"
        domain = _norm_domain(node.domain)
        if depth >= MAX_FUNCTION_DEPTH:
            raise ModelLoadError(
                f"{self.label}: {where}: functions nest deeper than {MAX_FUNCTION_DEPTH}"
            )
        fn_opsets = dict(opsets)
        fn_opsets.update(_opsets(fn.opset_import))
        lo, hi = SUPPORTED_OPSET_RANGE
        if not lo <= fn_opsets.get("", lo) <= hi:
            raise ModelLoadError(
                f"{self.label}: {where}: its function body needs ai.onnx opset {fn_opsets['']}"
            )
        rename: dict[str, str] = {}
        for i, formal in enumerate(fn.input):
            rename[formal] = node.input[i] if i < len(node.input) else ""
        for i, formal in enumerate(fn.output):
            actual = node.output[i] if i < len(node.output) else ""
            rename[formal] = actual or self.fresh_name(f"{name}/{formal}")
        given = {a.name: a for a in node.attribute}
        defaults = {a.name: a for a in fn.attribute_proto}

        def mapped(x: str) -> str:
            """The graph name of a body value (formal -> actual, internal -> fresh)."""
            if not x:
                return ""
            if x not in rename:
                rename[x] = self.fresh_name(f"{name}/{x}")
            return rename[x]

        for k, body_node in enumerate(fn.node):
            inner = onnx.NodeProto()
            inner.CopyFrom(body_node)
            del inner.input[:]
            inner.input.extend(mapped(x) for x in body_node.input)
            del inner.output[:]
            inner.output.extend(mapped(x) for x in body_node.output)
            inner.name = f"{name}/{body_node.name or body_node.op_type + str(k)}"
            del inner.attribute[:]
            for a in body_node.attribute:
                if a.ref_attr_name:
                    src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if src is None:
                        continue  # an optional attribute the caller did not set
                    b = onnx.AttributeProto()
                    b.CopyFrom(src)
                    b.name = a.name
                    inner.attribute.append(b)
                elif a.type in (_A.GRAPH, _A.GRAPHS):
                    # a subgraph of the body reads body values by their body names
                    b = onnx.AttributeProto()
                    b.CopyFrom(a)
                    if a.type == _A.GRAPH:
                        b.g.CopyFrom(_rename_free(a.g, mapped, frozenset()))
                    else:
                        for sg in b.graphs:
                            sg.CopyFrom(_rename_free(sg, mapped, frozenset()))
                    inner.attribute.append(b)
                else:
                    inner.attribute.append(a)
            try:
                self.convert(inner, fn_opsets, depth + 1)
            except UnknownOpError as exc:
                raise UnknownOpError(
                    node.op_type,
                    _domain_name(domain),
                    opsets.get(domain),
                    where=f"{where}; expanding its function body: {exc}",
                ) from exc


def _rename_free(
    gp: onnx.GraphProto, rename: Callable[[str], str], bound: frozenset[str]
) -> onnx.GraphProto:
    """A copy of a subgraph whose reads of enclosing-scope names go through ``rename``
    (names the subgraph or an enclosing subgraph defines are left alone)."""
    g = onnx.GraphProto()
    g.CopyFrom(gp)
    local = set(bound) | {vi.name for vi in g.input} | {t.name for t in g.initializer}
    local |= {sp.values.name for sp in g.sparse_initializer}
    for n in g.node:
        local.update(x for x in n.output if x)
    frozen = frozenset(local)
    for n in g.node:
        renamed = [rename(x) if x and x not in frozen else x for x in n.input]
        del n.input[:]
        n.input.extend(renamed)
        for a in n.attribute:
            if a.type == _A.GRAPH:
                a.g.CopyFrom(_rename_free(a.g, rename, frozen))
            elif a.type == _A.GRAPHS:
                for sg in a.graphs:
                    sg.CopyFrom(_rename_free(sg, rename, frozen))
    for vo in g.output:
        if vo.name not in frozen:
            vo.name = rename(vo.name)
    return g


def _body_input_hints(
    op: str, domain: str, node: onnx.NodeProto, inputs: list[Value | None]
) -> dict[str, list[TensorDesc | None]]:
    """Types of a Loop or Scan body's formal inputs, from the node's inputs (by attribute)."""
    if domain != "":
        return {}
    if op == "Loop":
        carried = [None if v is None else v.desc for v in inputs[2:]]
        scalar_i = TensorDesc(np.dtype(np.int64), ())
        scalar_b = TensorDesc(np.dtype(np.bool_), ())
        return {"body": [scalar_i, scalar_b, *carried]}
    if op == "Scan":
        m = next((int(a.i) for a in node.attribute if a.name == "num_scan_inputs"), 0)
        axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [])
        n = len(inputs) - m
        hints: list[TensorDesc | None] = [None if v is None else v.desc for v in inputs[:n]]
        for j, v in enumerate(inputs[n:]):
            if v is None or v.shape is None:
                hints.append(None if v is None else TensorDesc(v.dtype, None))
                continue
            ax = (axes[j] if j < len(axes) else 0) % max(len(v.shape), 1)
            hints.append(TensorDesc(v.dtype, tuple(d for i, d in enumerate(v.shape) if i != ax)))
        return {"body": hints}
    return {}


def _captured_names(attrs: dict[str, Any]) -> list[str]:
    """Outer names read by the subgraph attributes (in first-read order, no repeats)."""
    names: list[str] = []
    for v in attrs.values():
        graphs = v if isinstance(v, list) else [v]
        for g in graphs:
            if not isinstance(g, Graph):
                continue
            for n in getattr(g, "captures", None) or ():
                if n not in names:
                    names.append(n)
    return names


def _infer_attr_type(a: onnx.AttributeProto) -> int:
    for field_name, kind in (
        ("f", _A.FLOAT),
        ("i", _A.INT),
        ("s", _A.STRING),
        ("t", _A.TENSOR),
        ("g", _A.GRAPH),
        ("sparse_tensor", _A.SPARSE_TENSOR),
        ("tp", _A.TYPE_PROTO),
    ):
        if a.HasField(field_name):
            return kind
    for field_name, kind in (
        ("floats", _A.FLOATS),
        ("ints", _A.INTS),
        ("strings", _A.STRINGS),
        ("tensors", _A.TENSORS),
        ("graphs", _A.GRAPHS),
        ("sparse_tensors", _A.SPARSE_TENSORS),
        ("type_protos", _A.TYPE_PROTOS),
    ):
        if len(getattr(a, field_name)):
            return kind
    raise ModelLoadError(f"attribute {a.name!r} has no type and no value")


__all__ = [
    "DEFAULT_DOMAINS",
    "EAGER_EXTERNAL_BYTES",
    "SUPPORTED_OPSET_RANGE",
    "ExternalRef",
    "external_loader",
    "import_model",
]
