"""A compiled geode Graph as JSON data plus blobs, and back.

The graph a model file keeps is the one the compile ended with (after the graph
passes): its values in order (name, kind, dtype, shape with symbolic dims as
:mod:`~geode.modelfile.exprs` data, layout format, the symbolic contents shape
inference derived, tensor data as a blob), its nodes (op, domain, inputs, outputs,
attributes), its symbol table and constraints. Attributes are tagged pairs
(``["i", 3]``, ``["a", {array}]``, ``["g", {subgraph}]``, ...) so that ints, floats,
bools, strings, tuples, arrays and subgraphs come back as the same Python types.

Constants that came from an external data file can stay references to that file
(path, offset, length, sha256) instead of copies; reading them back checks the
length and the hash before any byte is used.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import Graph, Node, TensorDesc, Value, ValueKind
from geode.compiler.shapes import SymbolTable
from geode.compiler.stored_dims import StoredDim
from geode.errors import GeodeError, ModelFileError
from geode.modelfile.container import Container, Writer
from geode.modelfile.exprs import Decoder, encode, encode_shape

_KINDS = {k.value: k for k in ValueKind}


# -- arrays -------------------------------------------------------------------------------
def encode_array(a: np.ndarray, w: Writer) -> dict[str, Any]:
    """An array as ``{dtype, shape, blob}`` (strings as a JSON list)."""
    a = np.asarray(a)
    if a.dtype.kind in "OU":
        return {"dtype": "str", "shape": list(a.shape), "items": [str(x) for x in a.ravel()]}
    return {"dtype": dtypes.name(a.dtype), "shape": list(a.shape), "blob": w.add(a)}


def decode_array(d: Any, c: Container) -> np.ndarray:
    """The array of :func:`encode_array`'s data."""
    if not isinstance(d, dict) or not isinstance(d.get("shape"), list):
        raise ModelFileError(f"model file {c.path!r}: bad array record")
    shape = tuple(d["shape"])
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ModelFileError(f"model file {c.path!r}: bad array shape {list(shape)}")
    if d.get("dtype") == "str":
        items = d.get("items")
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ModelFileError(f"model file {c.path!r}: bad string array")
        return np.array(items, dtype=object).reshape(shape)
    try:
        dtype = dtypes.to_numpy(d.get("dtype"))
    except GeodeError:
        raise ModelFileError(f"model file {c.path!r}: unknown dtype {d.get('dtype')!r}") from None
    return c.array(d.get("blob"), dtype, shape)


# -- attributes ---------------------------------------------------------------------------
def _encode_attr(v: Any, w: Writer, where: str, constants: bool) -> list:
    if v is None:
        return ["n"]
    if isinstance(v, (bool, np.bool_)):
        return ["b", bool(v)]
    if isinstance(v, (int, np.integer)):
        return ["i", int(v)]
    if isinstance(v, (float, np.floating)):
        return ["f", float(v)]
    if isinstance(v, str):
        return ["s", v]
    if isinstance(v, bytes):
        return ["y", v.hex()]
    if isinstance(v, list):
        return ["l", [_encode_attr(x, w, where, constants) for x in v]]
    if isinstance(v, tuple):
        return ["t", [_encode_attr(x, w, where, constants) for x in v]]
    if isinstance(v, np.ndarray):
        return ["a", encode_array(v, w)]
    if isinstance(v, Graph):
        return ["g", encode_graph(v, w, constants)]
    try:
        return ["e", encode(v)]
    except GeodeError:
        pass
    raise ModelFileError(f"{where}: an attribute of type {type(v).__name__} has no file form")


def _decode_attr(d: Any, r: _Reader) -> Any:
    if not isinstance(d, list) or not d or not isinstance(d[0], str):
        raise ModelFileError(f"model file {r.c.path!r}: bad attribute {d!r}"[:200])
    tag, body = d[0], d[1:]
    if tag == "n":
        return None
    if len(body) != 1:
        raise ModelFileError(f"model file {r.c.path!r}: bad attribute {d!r}"[:200])
    x = body[0]
    simple = {"b": bool, "i": int, "f": (int, float), "s": str}
    if tag in simple:
        if not isinstance(x, simple[tag]) or (tag in "if" and isinstance(x, bool)):
            raise ModelFileError(f"model file {r.c.path!r}: bad attribute {d!r}"[:200])
        return float(x) if tag == "f" else x
    if tag == "y" and isinstance(x, str):
        try:
            return bytes.fromhex(x)
        except ValueError:
            raise ModelFileError(f"model file {r.c.path!r}: bad bytes attribute") from None
    if tag in "lt" and isinstance(x, list):
        items = [_decode_attr(i, r) for i in x]
        return items if tag == "l" else tuple(items)
    if tag == "a":
        return decode_array(x, r.c)
    if tag == "g":
        return decode_graph(x, r.c, r.external)
    if tag == "e":
        return r.dims(x)
    raise ModelFileError(f"model file {r.c.path!r}: unknown attribute tag {tag!r}")


# -- graphs -------------------------------------------------------------------------------
def encode_graph(g: Graph, w: Writer, constants: bool = True) -> dict[str, Any]:
    """``g`` as data; tensor data goes to ``w``'s blobs. ``constants=False`` keeps a
    constant read from an external data file as a reference to that file."""
    values = []
    for v in g.values.values():
        if v.producer is None:
            values.append(_encode_value(v, w, constants))
    nodes = []
    for n in g.nodes:
        where = f"node {n.name!r} ({n.op_type})"
        nodes.append(
            {
                "name": n.name,
                "op": n.op_type,
                "domain": n.domain,
                "inputs": [None if v is None else v.name for v in n.inputs],
                "outputs": [_encode_value(o, w, constants) for o in n.outputs],
                "attrs": {k: _encode_attr(a, w, where, constants) for k, a in n.attrs.items()},
            }
        )
    table = g.symbols
    return {
        "name": g.name,
        "opset": g.opset,
        "symbols": sorted(table.named),
        "counter": table.counter,
        "constraints": [[encode(a), encode(b), where] for a, b, where in table.constraints],
        "broadcasts": [[[encode(d) for d in dims], where] for dims, where in table.broadcasts],
        "values": values,
        "nodes": nodes,
        "inputs": [v.name for v in g.inputs],
        "outputs": [v.name for v in g.outputs],
    }


def _encode_value(v: Value, w: Writer, constants: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": v.name,
        "kind": v.kind.value,
        "dtype": dtypes.name(v.dtype),
        "shape": encode_shape(v.shape),
        "format": v.desc.format,
    }
    if v.read_only:
        d["read_only"] = True
    if v.sym_value is not None:
        d["sym_value"] = [encode(x) for x in v.sym_value]
    external = getattr(v, "external", None)
    if v.kind is ValueKind.CONSTANT and external is not None and (v.data is None or not constants):
        d["external"] = _external_record(v, w, constants)
    elif v.data is not None:
        d["data"] = encode_array(v.data, w)
        if external is not None:  # where it came from: saving it again may refer to it
            path, offset, length = external
            d["source"] = [os.path.abspath(os.fsdecode(path)), int(offset or 0), int(length or 0)]
    default = getattr(v, "default", None)
    if default is not None:
        d["default"] = encode_array(default, w)
    return d


def _external_record(v: Value, w: Writer, embed: bool) -> dict[str, Any]:
    """A constant whose data is in an external file: embedded (read now), or a
    reference with the length and sha256 of its bytes."""
    loader = getattr(v, "external_loader", None)
    if v.data is None and loader is None:
        raise ModelFileError(f"constant {v.name!r}: its external data has no loader")
    arr = np.ascontiguousarray(v.data if v.data is not None else loader())
    if embed:
        return {"embedded": encode_array(arr, w)}
    path, offset, _ = v.external
    return {
        "path": os.path.abspath(os.fsdecode(path)),
        "offset": int(offset or 0),
        "length": int(arr.nbytes),
        "sha256": hashlib.sha256(memoryview(arr).cast("B")).hexdigest(),
    }


class _Reader:
    """State of one decode: the container, the dims decoder, external-data checks."""

    def __init__(self, c: Container, g: Graph, external: Callable | None):
        self.c = c
        self.g = g
        self.external = external
        self.dims = Decoder(g.symbols.named)


def decode_graph(d: Any, c: Container, external: Callable | None = None) -> Graph:
    """The Graph of :func:`encode_graph`'s data (``external(record, value_name)`` returns
    the loader of a constant kept as a reference to an external file)."""
    if not isinstance(d, dict):
        raise ModelFileError(f"model file {c.path!r}: bad graph record")
    try:
        return _decode_graph(d, c, external)
    except ModelFileError:
        raise
    except GeodeError as exc:
        raise ModelFileError(f"model file {c.path!r}: bad graph: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ModelFileError(
            f"model file {c.path!r}: bad graph record ({type(exc).__name__}: {exc})"[:300]
        ) from None


def _decode_graph(d: dict[str, Any], c: Container, external: Callable | None) -> Graph:
    g = Graph(str(d["name"]))
    g.opset = int(d["opset"])
    names = [str(n) for n in d["symbols"]]
    g.symbols = SymbolTable({n: StoredDim.symbol(n) for n in names}, int(d["counter"]))
    r = _Reader(c, g, external)
    g.symbols.constraints = [(r.dims(a), r.dims(b), str(wh)) for a, b, wh in d["constraints"]]
    g.symbols.broadcasts = [
        (tuple(r.dims(x) for x in dims), str(wh)) for dims, wh in d["broadcasts"]
    ]
    for vd in d["values"]:
        _decode_value(vd, r, None)
    for nd in d["nodes"]:
        inputs = [None if n is None else g.values[n] for n in nd["inputs"]]
        attrs = {str(k): _decode_attr(a, r) for k, a in nd["attrs"].items()}
        node = Node(str(nd["name"]), str(nd["op"]), inputs, attrs, str(nd["domain"]))
        for od in nd["outputs"]:
            node.outputs.append(_decode_value(od, r, node))
        g.nodes.append(node)
        g._node_names.add(node.name)
    g.inputs = [g.values[n] for n in d["inputs"]]
    g.outputs = [g.values[n] for n in d["outputs"]]
    return g


def _decode_value(d: dict[str, Any], r: _Reader, producer: Node | None) -> Value:
    kind = _KINDS[d["kind"]]
    dtype = dtypes.to_numpy(d["dtype"]) if d["dtype"] != "str" else np.dtype(object)
    desc = TensorDesc(dtype, r.dims.shape(d["shape"]), str(d["format"]))
    data = decode_array(d["data"], r.c) if "data" in d else None
    v = r.g._new_value(str(d["name"]), desc, kind, producer=producer, data=data)
    v.read_only = bool(d.get("read_only", False))
    if "sym_value" in d:
        v.sym_value = tuple(r.dims(x) for x in d["sym_value"])
    if "default" in d:
        v.default = decode_array(d["default"], r.c)  # type: ignore[attr-defined]
    source = d.get("source")
    if source is not None and v.data is not None:
        path, offset, length = source
        v.external = (str(path), int(offset), int(length))  # type: ignore[attr-defined]
    ext = d.get("external")
    if ext is not None:
        if "embedded" in ext:
            v.data = decode_array(ext["embedded"], r.c)
        elif r.external is None:
            raise ModelFileError(f"model file {r.c.path!r}: constant {v.name!r} is external")
        else:
            v.external = (ext["path"], ext["offset"], ext["length"])  # type: ignore[attr-defined]
            v.external_loader = r.external(ext, v)  # type: ignore[attr-defined]
    return v
