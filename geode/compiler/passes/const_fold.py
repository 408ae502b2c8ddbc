"""Constant folding: evaluate at compile time what does not depend on run-time data."""

from __future__ import annotations

import numpy as np

from geode.compiler.ir import Graph, Node, ValueKind
from geode.compiler.ops import registry
from geode.compiler.passes.rewrite import (
    RANDOM_OPS,
    SIDE_EFFECT_OPS,
    has_graph_attr,
    is_dead,
    reinfer_consumers,
    remove_dead_nodes,
    replace_value,
    static_nbytes,
)
from geode.compiler.shapes import is_static, numel

#: a folded result may always be this large, whatever its inputs' sizes
MIN_FOLD_BYTES = 64 * 1024

#: ops never folded even when all their inputs are constants
NEVER_FOLD = RANDOM_OPS | SIDE_EFFECT_OPS


def fold_limit(input_bytes: int, min_bytes: int = MIN_FOLD_BYTES) -> int:
    """Largest result (bytes) a fold may materialise: ``max(min_bytes, input bytes)``."""
    return max(min_bytes, input_bytes)


def fold_constants(graph: Graph, *, min_bytes: int = MIN_FOLD_BYTES) -> bool:
    """Replace nodes computable at compile time by constants.

    * a node whose every input is a constant (not a variable, not a graph input) runs
      through its reference kernel, unless it is random, writes state, has a subgraph
      attribute, or its results would exceed :func:`fold_limit` of its inputs' bytes,
      ``max(min_bytes, input bytes)`` (folding ``Expand(c, [4096, 4096])`` would trade
      a few bytes for 64 MiB);
    * ``Shape(x)`` folds when the queried dims of ``x`` (``start``/``end``) are static,
      and ``Size(x)`` when every dim is; ``x`` itself may be anything;
    * a shape computation whose symbolic value (``Value.sym_value``, recorded by
      InferShape, e.g. ``Gather(Shape(x), 1)``) is all integers folds to that value.

    Consumers of new constants get their shapes re-inferred (a Reshape whose shape
    input just became constant learns its output shape). Graph outputs keep their
    names. Returns True when anything was folded.
    """
    changed = False
    folded_values = []
    for node in graph.toposort():
        if node.op_type in NEVER_FOLD or has_graph_attr(node):
            continue
        if all(is_dead(graph, o) for o in node.outputs):
            continue  # DCE's job; folding dead code is wasted work
        results = _fold_shape_query(node)
        if results is None:
            results = _fold_sym_values(node)
        if results is None:
            results = _fold_node(node, min_bytes)
        if results is None:
            continue
        new_values = []
        for out, arr in zip(node.outputs, results):
            c = graph.constant(arr, name=f"{out.name}_folded", dtype=arr.dtype)
            new_values.append(c)
            replace_value(graph, out, c)
        remove_dead_nodes(graph, [node])
        folded_values.extend(new_values)
        changed = True
    if folded_values:
        reinfer_consumers(graph, [v for v in folded_values if v.uses])
    return changed


def _fold_node(node: Node, min_bytes: int) -> list[np.ndarray] | None:
    ins = [v for v in node.inputs if v is not None]
    if any(v.kind is not ValueKind.CONSTANT or v.data is None for v in ins):
        return None
    if not registry.has(node.op_type, node.domain):
        return None
    od = registry.get(node.op_type, node.domain)
    if od.kernel is None:
        return None
    in_bytes = sum(int(np.asarray(v.data).nbytes) for v in ins)
    limit = fold_limit(in_bytes, min_bytes)
    predicted = [static_nbytes(o.desc) for o in node.outputs]
    if all(p is not None for p in predicted) and sum(predicted) > limit:
        return None
    try:
        with np.errstate(all="ignore"):
            outs = od.run(
                [None if v is None else np.asarray(v.data) for v in node.inputs], node.attrs
            )
    except Exception:  # the node fails at run time too; leave it to say so there
        return None
    if len(outs) < len(node.outputs):
        return None
    outs = [np.asarray(o) for o in outs[: len(node.outputs)]]
    if sum(o.nbytes for o in outs) > limit:
        return None
    for out, arr in zip(node.outputs, outs):
        if arr.dtype != out.dtype or not _shape_fits(out.shape, arr.shape):
            return None  # a kernel that disagrees with InferShape: do not bake it in
    return outs


def _shape_fits(shape: tuple | None, actual: tuple[int, ...]) -> bool:
    if shape is None:
        return True
    if len(shape) != len(actual):
        return False
    return all(not isinstance(d, int) or d == n for d, n in zip(shape, actual))


def _fold_sym_values(node: Node) -> list[np.ndarray] | None:
    """Results known from shapes alone: every output's ``sym_value`` is all ints."""
    outs = []
    for out in node.outputs:
        sv = getattr(out, "sym_value", None)
        if sv is None or out.dtype.kind not in "iu" or not is_static(out.shape):
            return None
        if not all(isinstance(d, (int, np.integer)) for d in sv):
            return None
        n = 1
        for d in out.shape:
            n *= int(d)
        info = np.iinfo(out.dtype)
        if n != len(sv) or not all(info.min <= int(d) <= info.max for d in sv):
            return None  # (a value the dtype cannot hold: the kernel folds it)
        outs.append(np.array([int(d) for d in sv], dtype=out.dtype).reshape(out.shape))
    return outs or None


def _fold_shape_query(node: Node) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Shape", "Size"):
        return None
    x = node.input(0)
    if x is None or x.shape is None or len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    if node.op_type == "Size":
        n = numel(x.shape)
        if not isinstance(n, int):
            return None
        return [np.array(n, dtype=out.dtype)]
    rank = len(x.shape)
    start = int(node.attr("start", 0))
    end = node.attr("end", None)
    end = rank if end is None else int(end)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    dims = x.shape[start:end]
    if not all(isinstance(d, int) for d in dims):
        return None
    return [np.array(dims, dtype=out.dtype).reshape(-1)]
