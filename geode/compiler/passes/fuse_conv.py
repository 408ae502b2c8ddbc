"""Fuse a Conv's epilogue into the conv: ``Relu(Conv(x) + z)``, ``Conv(x) + z`` and
``Relu(Conv(x))`` become one geode ``FusedConv`` node (``compiler/ops/nn.py``), and a
MaxPool after such a node (or after a Conv) joins it, whose
native kernel applies the residual add and the activation to each output tile while it
is in registers (``codegen/backends/llvm/conv_direct.py``) instead of passes over the
output after it: one kernel for a ResNet block's Conv+BatchNorm+Add+Relu once
``fold_bn`` has folded the normalization.

Fused only when nothing else changes: the Conv's output (and the Add's, when a Relu
follows it) feeds nothing else and is not a graph output; ``z`` has exactly the Conv
output's shape and dtype (no broadcast); the dtype is float32 or float64, the conv is
1-D or 2-D and its weights' shape is static (what a native conv takes: other convs
gain nothing from the rewrite). Of an Add of two such Convs the second in graph order
takes the Add, the first's output becoming its ``z``. A MaxPool joins a conv without
a residual when it is 2-D, has no Indices output, ceil_mode, dilations or auto_pad, and
the conv is one the direct kernel computes (2-D, horizontal stride at most 2, at most
64 taps, not depthwise): the kernel keeps a band of conv rows in a scratch and pools them, so the
conv's output never goes to memory. Runs after ``fold_bn`` (pass ``fuse_conv`` in
``explain()``).
"""

from __future__ import annotations

import numpy as np

from geode.compiler.ir import GEODE_DOMAIN, Graph, Node, Value
from geode.compiler.passes.rewrite import is_output, node_alive, shapes_equal, try_rewrite

__all__ = ["fuse_conv_epilogues"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ONNX = ("", "ai.onnx")


def fuse_conv_epilogues(graph: Graph) -> bool:
    """Fuse every Conv epilogue that may be fused (see the module docstring). Returns
    True when the graph changed."""
    changed = False
    for node in graph.toposort():
        if not node_alive(graph, node) or node.domain not in _ONNX:
            continue
        if node.op_type == "MaxPool":
            conv = _poolable(graph, node)
            if conv is not None and try_rewrite(
                graph, node, lambda rw, c=conv, p=node: [_pooled(rw, c, p)]
            ):
                changed = True
            continue
        found = _epilogue(graph, node)
        if found is None:
            continue
        conv, z, relu = found
        last = relu or node
        if try_rewrite(graph, last, lambda rw, c=conv, zz=z, r=relu: [_fused(rw, c, zz, r)]):
            changed = True
    return changed


def _sole_use(graph: Graph, v: Value | None, op_type: str) -> Node | None:
    """The one node reading ``v`` when it is an ONNX ``op_type`` and ``v`` is no graph
    output; else None."""
    if v is None or len(v.uses) != 1 or is_output(graph, v):
        return None
    user = v.uses[0][0]
    return user if user.op_type == op_type and user.domain in _ONNX else None


def _fusable_conv(graph: Graph, v: Value | None) -> Node | None:
    """The Conv producing ``v`` when it may take an epilogue (see the module docstring)."""
    conv = None if v is None else v.producer
    if conv is None or conv.op_type != "Conv" or conv.domain not in _ONNX:
        return None
    if len(conv.outputs) != 1 or v.dtype not in _DTYPES or v.shape is None:
        return None
    w = conv.inputs[1]
    if w is None or w.shape is None or not all(isinstance(d, int) for d in w.shape):
        return None
    if len(w.shape) not in (3, 4) or any(i is not None and i.dtype != v.dtype for i in conv.inputs):
        return None
    if len(v.uses) != 1 or is_output(graph, v):
        return None
    return conv


def _epilogue(graph: Graph, node: Node) -> tuple[Node, Value | None, Node | None] | None:
    """``(conv, z, relu)`` when ``node`` (an Add or a Relu) ends a fusable epilogue of
    ``conv``: ``z`` the residual or None, ``relu`` the Relu or None."""
    if node.op_type == "Relu":
        conv = _fusable_conv(graph, node.inputs[0])
        if conv is not None:
            return conv, None, node
        add = node.inputs[0].producer if node.inputs[0] is not None else None
        if add is None or add.op_type != "Add" or add.domain not in _ONNX:
            return None
        if _sole_use(graph, add.outputs[0], "Relu") is not node:
            return None
        found = _residual(graph, add)
        return None if found is None else (found[0], found[1], node)
    if node.op_type == "Add":
        if _sole_use(graph, node.outputs[0], "Relu") is not None:
            return None  # the Relu after it takes both
        found = _residual(graph, node)
        return None if found is None else (found[0], found[1], None)
    return None


def _residual(graph: Graph, add: Node) -> tuple[Node, Value] | None:
    """``(conv, z)`` of ``add = conv_out + z`` with ``z`` of exactly its shape; of two
    fusable Convs the later one in graph order."""
    if len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
        return None
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    best = None
    for i in (0, 1):
        conv = _fusable_conv(graph, add.inputs[i])
        z = add.inputs[1 - i]
        if conv is None or z is None or z.dtype != add.inputs[i].dtype:
            continue
        if not shapes_equal(z.shape, add.inputs[i].shape) or add.outputs[0].dtype != z.dtype:
            continue
        if best is None or order[conv.name] > order[best[0].name]:
            best = (conv, z)
    return best


def _poolable(graph: Graph, pool: Node) -> Node | None:
    """The Conv or FusedConv (without a residual or pooling of its own) whose output
    ``pool``, a 2-D MaxPool without Indices, ceil_mode, dilations or auto_pad, may take
    into the conv (see the module docstring); else None."""
    a = pool.attrs
    if len(pool.outputs) != 1 or int(a.get("ceil_mode") or 0) or int(a.get("storage_order") or 0):
        return None
    kernel = a.get("kernel_shape")
    if kernel is None or len(kernel) != 2 or (a.get("auto_pad") or "NOTSET") != "NOTSET":
        return None
    if any(int(d) != 1 for d in a.get("dilations") or []):
        return None
    v = pool.inputs[0]
    conv = None if v is None else v.producer
    if conv is None:
        return None
    if conv.op_type == "FusedConv" and conv.domain == GEODE_DOMAIN:
        if conv.attrs.get("pool_kernel") or (len(conv.inputs) > 3 and conv.inputs[3]):
            return None
        if len(v.uses) != 1 or is_output(graph, v):
            return None
    elif _fusable_conv(graph, v) is None:
        return None
    w = conv.inputs[1]
    group = int(conv.attrs.get("group") or 1)
    strides = conv.attrs.get("strides") or [1, 1]
    taps = w.shape[2] * w.shape[3] if len(w.shape) == 4 else 0
    if len(w.shape) != 4 or int(strides[1]) > 2 or not 0 < taps <= 64 or w.shape[1] == 0:
        return None
    if w.shape[1] == 1 and group > 1:
        return None  # the direct kernel's convs only
    return conv


def _pooled(rw, conv: Node, pool: Node) -> Value:
    """The FusedConv computing ``pool(conv(...))``."""
    a = pool.attrs
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


def _fused(rw, conv: Node, z: Value | None, relu: Node | None) -> Value:
    """The FusedConv node computing what ``conv`` and its epilogue computed."""
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
