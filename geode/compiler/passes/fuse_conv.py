"""Conv epilogue fusion, a fusion-planner decision: a Conv's epilogue (``Relu(Conv + z)``,
``Conv + z``, ``Relu(Conv)``) and a MaxPool after it become one geode ``FusedConv`` node
(``compiler/ops/nn.py``) whose native kernel applies the residual add and the activation
to each output tile while it is in registers (``codegen/backends/llvm/conv_direct.py``),
and with a pool, pools a band of conv rows from a scratch: one kernel for a ResNet
block's Conv+BatchNorm+Add+Relu once ``fold_bn`` has folded the normalization.

Each Relu, Add or MaxPool reading a conv's output is a decision, made as the fusion
planner makes its own: legality first (``compiler/fusion/conv_epilogue.py``: rules
``conv_epilogue`` and ``conv_pool``), then profitability by the cost model
(``compiler/fusion/conv_profit.py``, on ``costmodel.device.default_spec``: the same
numbers on every machine). Every decision, taken or refused, with its rule and reason,
goes into ``decisions`` (node name -> line); the spine hands them to the fusion plan,
whose text (``explain()``) lists them under its dense epilogues. Runs after ``fold_bn``
(pass ``fuse_conv`` in ``explain()``).
"""

from __future__ import annotations

from geode.compiler.fusion.conv_epilogue import ConvFusion, conv_fusion_candidate
from geode.compiler.fusion.conv_profit import conv_fusion_profit
from geode.compiler.ir import GEODE_DOMAIN, Graph, Node, Value
from geode.compiler.passes.rewrite import node_alive, try_rewrite
from geode.costmodel.device import DeviceSpec, default_spec

__all__ = ["fuse_conv_epilogues"]


def fuse_conv_epilogues(
    graph: Graph, decisions: dict[str, str] | None = None, spec: DeviceSpec | None = None
) -> bool:
    """Fuse every conv epilogue and pool that is legal and pays on ``spec`` (default: the
    fixed ``default_spec``), recording each decision in ``decisions`` (see the module
    docstring). Returns True when the graph changed."""
    spec = spec or default_spec()
    changed = False
    for node in graph.toposort():
        if not node_alive(graph, node):
            continue
        found = conv_fusion_candidate(graph, node)
        if found is None:
            continue
        if isinstance(found, str):
            _record(decisions, node, f"{node.op_type} {node.name!r}: keep apart: {found}")
            continue
        take, why = conv_fusion_profit(found, spec)
        what = f"{found.describe()} ({found.rule})"
        if not take:
            _record(decisions, node, f"{what}: keep apart: {why}")
            continue
        build = _pooled if found.pool is not None else _fused
        if try_rewrite(graph, found.last, lambda rw, c=found, f=build: [f(rw, c)]):
            changed = True
            _record(decisions, node, f"{what} -> FusedConv: fuse: {why}")
        else:
            _record(decisions, node, f"{what}: keep apart: the rewrite was refused (shapes)")
    return changed


def _record(decisions: dict[str, str] | None, node: Node, line: str) -> None:
    if decisions is not None:
        decisions[node.name] = line


def _pooled(rw, c: ConvFusion) -> Value:
    """The FusedConv computing ``pool(conv(...))``."""
    conv, a = c.conv, c.pool.attrs
    attrs = dict(conv.attrs)
    attrs.setdefault("activation", "")
    attrs["pool_kernel"] = [int(k) for k in a["kernel_shape"]]
    attrs["pool_strides"] = [int(k) for k in a.get("strides") or [1, 1]]
    attrs["pool_pads"] = [int(k) for k in a.get("pads") or [0, 0, 0, 0]]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    node = rw.graph.add_node(
        "FusedConv",
        [conv.inputs[0], conv.inputs[1], bias, None],
        attrs,
        name=f"{conv.name}_pool",
        domain=GEODE_DOMAIN,
    )
    rw.nodes.append(node)
    return node.outputs[0]


def _fused(rw, c: ConvFusion) -> Value:
    """The FusedConv node computing what ``c.conv`` and its epilogue computed."""
    conv, z, relu = c.conv, c.z, c.relu
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    attrs = dict(conv.attrs)
    attrs["activation"] = "Relu" if relu is not None else ""
    node = rw.graph.add_node(
        "FusedConv",
        [conv.inputs[0], conv.inputs[1], bias, z],
        attrs,
        name=f"{conv.name}_fused",
        domain=GEODE_DOMAIN,
    )
    rw.nodes.append(node)  # rolled back with the rest if the rewrite is refused
    return node.outputs[0]
