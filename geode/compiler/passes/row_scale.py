"""A row scale folded into the GEMMs that read it, a fusion decision: an RMSNorm's
``h = x * c * w`` before MatMuls by constant weights becomes ``c * (x @ (diag(w) B))``
(``compiler/fusion/row_scale.py`` says when that is legal and why it is exact up to
rounding). The norm's kernel then computes only ``c``, a value per row, instead of
writing ``h``; each product's scale by ``c`` joins the product's readers (a gated MLP's
SiLU and multiply: the gate GEMM's fused epilogue, where ``c`` is a ``col`` input and the
up product, scaled the same way, its sibling GEMM's panel).

Each candidate (a ``Mul`` read by a MatMul as its ``A``) is a decision, made as the
fusion planner makes its own: legality first (:func:`row_scale_candidate`), then
profitability by the cost model (:func:`geode.compiler.fusion.profit.row_scale_plan`,
on ``costmodel.device.default_spec``: the same numbers on every machine). Every
decision, taken or refused, with its reason, goes into ``decisions`` (node name ->
line); the spine hands them to the fusion plan, whose text (``explain()``) lists them
with the dense epilogues. The option ``row_scale_gemms`` (``GEODE_ROW_SCALE_GEMMS``)
turns the pass off; so does naming it (``row_scale``) in ``disabled_passes``.
"""

from __future__ import annotations

import numpy as np

from geode.compiler.fusion.profit import row_scale_plan
from geode.compiler.fusion.row_scale import RowScale, row_scale_candidate
from geode.compiler.ir import Graph, Node, Value
from geode.compiler.ops import registry
from geode.compiler.ops.registry import OpKind
from geode.compiler.passes.rewrite import Rewriter, node_alive, replace_value
from geode.costmodel.device import DeviceSpec, default_spec

__all__ = ["fold_row_scales"]

_ELEMENTWISE = (OpKind.ELEMENTWISE, OpKind.BROADCAST)


def fold_row_scales(
    graph: Graph, decisions: dict[str, str] | None = None, spec: DeviceSpec | None = None
) -> bool:
    """Fold every row scale that is legal and pays on ``spec`` (default: the fixed
    ``default_spec``) into the GEMMs reading it, recording each decision in
    ``decisions`` (see the module docstring). Returns True when the graph changed."""
    spec = spec or default_spec()
    changed = False
    for node in graph.toposort():
        if not node_alive(graph, node):
            continue
        found = row_scale_candidate(graph, node)
        if found is None:
            continue
        if isinstance(found, str):
            _record(decisions, node, f"Mul {node.name!r}: keep the row scale apart: {found}")
            continue
        computed = found.x.producer is not None and _elementwise_op(found.x.producer)
        take, why = row_scale_plan(
            found.value, found.gemms, len(found.muls), spec, _elementwise, computed
        )
        if not take:
            _record(decisions, node, f"{found.describe()}: keep apart: {why}")
            continue
        _fold(graph, found)
        changed = True
        _record(decisions, node, f"{found.describe()}: fold: {why}")
    return changed


def _record(decisions: dict[str, str] | None, node: Node, line: str) -> None:
    if decisions is not None:
        decisions[node.name] = line


def _elementwise(mm: Node) -> bool:
    """Whether every reader of ``mm``'s product is an elementwise op (the scale joins
    their kernel) and the product is not a graph output."""
    y = mm.outputs[0]
    if not y.consumers:
        return False
    return all(_elementwise_op(c) for c in y.consumers)


def _elementwise_op(node: Node) -> bool:
    return (
        registry.has(node.op_type, node.domain)
        and registry.get(node.op_type, node.domain).kind in _ELEMENTWISE
    )


def _fold(graph: Graph, rs: RowScale) -> None:
    """Replace each GEMM ``h @ B`` by ``(x @ B') * c`` (``B' = diag(w) B``, rounded once
    from float64); ``h``'s Mul nodes go when nothing else reads them."""
    rw = Rewriter(graph, rs.value.producer)
    scale = rs.column_scale()
    col: Value | None = None
    for c in rs.cols:
        col = c if col is None else rw.op("Mul", col, c)
    for mm in list(rs.gemms):
        b = mm.inputs[1]
        data = np.asarray(b.data)
        folded = (scale[:, None] * data.astype(np.float64)).astype(data.dtype)
        b_new = graph.constant(folded, name=f"{b.name}_rowscaled", dtype=data.dtype)
        prod = graph.add_node("MatMul", [rs.x, b_new], dict(mm.attrs), name=f"{mm.name}_rowscaled")
        out = prod.outputs[0]
        if col is not None:
            out = graph.add_node("Mul", [out, col], {}, name=f"{mm.name}_rowscale").outputs[0]
        replace_value(graph, mm.outputs[0], out)
