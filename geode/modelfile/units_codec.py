"""The units of a compiled model (its steps to be) as JSON data, and back.

A unit on the AICPU or host engine is its node's reference kernel and a view unit is
its node's alias: both are rebuilt from the node, as the compile built them. A native
unit (``aicore``) keeps its kernel's image index (:mod:`geode.codegen.images`) and the
rest of its calling interface: the dims it is passed (as expressions over the graph's
symbols), the views of its arguments, the index bounds it relies on, its thread count.
Output shapes and dtypes come from the unit's output values, as at compile time. A weight
a step reads packed once (:mod:`geode.codegen.packed_weights`) is stored as its weight's
name and re-packed at load.
"""

from __future__ import annotations

from typing import Any

from geode.codegen.images import ImageWriter
from geode.codegen.packed_weights import PackedWeight, packed_value
from geode.codegen.winograd_weights import WinogradWeight, winograd_value
from geode.compiler.fusion.views import alias_view
from geode.compiler.ir import Graph, Value
from geode.compiler.ops import state
from geode.compiler.partition.dynamic_shape import input_symbols
from geode.compiler.shapes import compile_dim_fn, compile_shape_fn
from geode.errors import CodegenError, ModelFileError
from geode.modelfile.container import Container, Writer
from geode.modelfile.exprs import Decoder, encode
from geode.modelfile.graph_codec import decode_array, encode_array
from geode.plan_builder import (
    ALIAS,
    COMMIT,
    Unit,
    alias_unit,
    commit_unit,
    reference_unit,
    var_query_unit,
)
from geode.runtime.engines import IndexBound, NativeKernel
from geode.runtime.model import KernelInfo
from geode.runtime.var_manager import VarManager

_SIMPLE = (str, int, float, bool)


def encode_units(units: list[Unit], w: Writer, images: ImageWriter) -> list[dict[str, Any]]:
    """Every unit as data (native kernels as images through ``images``)."""
    return [_encode_unit(u, w, images) for u in units]


def _encode_unit(u: Unit, w: Writer, images: ImageWriter) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": u.name,
        "engine": u.engine,
        "nodes": [n.name for n in u.nodes],
        "inputs": [_encode_input(v) for v in u.inputs],
        "outputs": [v.name for v in u.outputs],
        "extra": {k: v for k, v in u.extra.items() if isinstance(v, _SIMPLE)},
    }
    if u.engine != "aicore":
        return d
    k: NativeKernel = u.kernel
    if k.set_threads is not None or k.call is None:
        raise ModelFileError(f"kernel {u.name!r}: model files need the LLVM backend's kernels")
    if len(k.dim_exprs) != len(k.dims) or any(b.expr is None for b in k.index_bounds):
        raise ModelFileError(f"kernel {u.name!r}: its dims were not kept as expressions")
    d["native"] = {
        "image": images.image(k.fn),
        "n_inputs": k.n_inputs,
        "dims": [encode(e) for e in k.dim_exprs],
        "views": [None if v is None else list(v) for v in k.views],
        "bounds": [
            {
                "node": b.node,
                "axis": b.axis,
                "dim": encode(b.expr),
                "input": b.input,
                "data": None if b.data is None else encode_array(b.data, w),
            }
            for b in k.index_bounds
        ],
        "threads": k.threads,
        "launch_threads": k.launch_threads,
    }
    info = u.info
    d["info"] = {
        "kind": info.kind,
        "trace": info.trace,
        "cost": {k_: float(v) for k_, v in info.cost.items() if isinstance(v, (int, float))},
        "key": info.key,
        "schedule": info.schedule,
    }
    return d


def _encode_input(v: Value | None) -> str | dict[str, str] | None:
    """A unit's input: its name, or for a weight packed once ``{"packed": <weight>}``,
    with ``"form": <form>`` when not the GEMM's (re-packed when the file is loaded; a conv
    weight's Winograd transform likewise ``{"winograd": <weight>, "tiles": "2+4"}``)."""
    if v is None:
        return None
    if isinstance(v, PackedWeight):
        if v.form == "gemm":
            return {"packed": v.source.name}
        return {"packed": v.source.name, "form": v.form}
    if isinstance(v, WinogradWeight):
        return {"winograd": v.source.name, "tiles": "+".join(map(str, v.tiles))}
    return v.name


def _decode_input(d: Any, g: Graph, c: Container) -> Value | None:
    if d is None:
        return None
    if isinstance(d, dict):
        form = "winograd" if "winograd" in d else "packed"
        source = g.values[str(d[form])]
        try:
            if form == "winograd":
                tiles = tuple(int(t) for t in str(d.get("tiles", "")).split("+") if t)
                return winograd_value(source, tiles)
            return packed_value(source, str(d.get("form", "gemm")))
        except CodegenError as exc:
            raise ModelFileError(f"model file {c.path!r}: {exc}") from None
    return g.values[d]


def decode_units(
    data: Any, g: Graph, kernels: list[Any], c: Container, threads: int | None, vm: VarManager
) -> list[Unit]:
    """The units of :func:`encode_units`'s data over graph ``g`` (``kernels``: the loaded
    images; ``threads`` overrides the native kernels' thread count when given; ``vm``
    answers the run-time questions about variables)."""
    if not isinstance(data, list):
        raise ModelFileError(f"model file {c.path!r}: bad unit table")
    nodes = {n.name: n for n in g.nodes}
    dims = Decoder(g.symbols.named)
    bound = input_symbols(g)
    units = []
    for i, d in enumerate(data):
        try:
            units.append(_decode_unit(d, g, nodes, kernels, c, dims, bound, threads, vm))
        except ModelFileError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise ModelFileError(
                f"model file {c.path!r}: bad unit {i} ({type(exc).__name__}: {exc})"[:300]
            ) from None
    return units


def _decode_unit(
    d: dict[str, Any],
    g: Graph,
    nodes: dict,
    kernels: list[Any],
    c: Container,
    dims: Decoder,
    bound: set,
    threads: int | None,
    vm: VarManager,
) -> Unit:
    engine = str(d["engine"])
    unit_nodes = [nodes[n] for n in d["nodes"]]
    if engine == COMMIT:
        (node,) = unit_nodes
        if not state.is_var_ref(node):
            raise ModelFileError(f"model file {c.path!r}: {node.name!r} writes no variable")
        return commit_unit(node)
    if engine in ("aicpu", "host"):
        (node,) = unit_nodes
        if state.is_var_query(node):
            return var_query_unit(node, vm)
        return reference_unit(node, engine)
    if engine == ALIAS:
        (node,) = unit_nodes
        spec = alias_view(node, bound)
        if spec is None:
            raise ModelFileError(f"model file {c.path!r}: {node.name!r} is no view here")
        return alias_unit(node, spec)
    if engine != "aicore":
        raise ModelFileError(f"model file {c.path!r}: unknown engine {engine!r}")
    nd = d["native"]
    index = nd["image"]
    if not isinstance(index, int) or not 0 <= index < len(kernels):
        raise ModelFileError(f"model file {c.path!r}: bad kernel reference {index!r}")
    fn = kernels[index]
    inputs = [_decode_input(n, g, c) for n in d["inputs"]]
    outputs = [g.values[n] for n in d["outputs"]]
    exprs = tuple(dims(e) for e in nd["dims"])
    interface = NativeKernel(
        name=str(d["name"]),
        fn=fn,
        n_inputs=int(nd["n_inputs"]),
        out_shapes=[compile_shape_fn(v.shape) for v in outputs],
        out_dtypes=[v.dtype for v in outputs],
        dims=[compile_dim_fn(e) for e in exprs],
        views=[None if v is None else tuple(int(x) for x in v) for v in nd["views"]],
        index_bounds=[_bound(b, dims, c) for b in nd["bounds"]],
        threads=int(nd["threads"]) if threads is None else threads,
        launch_threads=bool(nd["launch_threads"]),
        call=fn.call,
        prepare=getattr(fn, "prepare", None),
        dim_exprs=exprs,
    )
    info_d = d["info"]
    info = KernelInfo(
        name=str(d["name"]),
        ops=unit_nodes,
        engine="aicore",
        source=fn.source,
        kind=str(info_d["kind"]),
        trace=str(info_d["trace"]),
        cost={**{str(k): float(v) for k, v in info_d["cost"].items()}, "from_cache": 1.0},
        key=str(info_d.get("key", "")),
        schedule=str(info_d.get("schedule", "")),
        _llvm=lambda: fn.llvm,
        _asm=lambda: fn.asm,
    )
    extra = {str(k): v for k, v in d["extra"].items() if isinstance(v, _SIMPLE)}
    return Unit(str(d["name"]), "aicore", unit_nodes, inputs, outputs, interface, info, extra)


def _bound(b: dict[str, Any], dims: Decoder, c: Container) -> IndexBound:
    expr = dims(b["dim"])
    data = None if b["data"] is None else decode_array(b["data"], c)
    inp = b["input"]
    if inp is not None and not isinstance(inp, int):
        raise ModelFileError(f"model file {c.path!r}: bad index bound input {inp!r}")
    return IndexBound(str(b["node"]), int(b["axis"]), compile_dim_fn(expr), inp, data, expr)
