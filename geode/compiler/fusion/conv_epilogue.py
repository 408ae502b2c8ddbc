"""Legality of conv epilogue fusion: what may join a Conv's native kernel (the ``fuse_conv``
pass, ``compiler/passes/fuse_conv.py``, asks; the cost model,
``compiler/fusion/conv_profit.py``, then says whether it pays).

Two rules, each a :class:`ConvFusion` candidate when legal, else the reason it is not:

- ``conv_epilogue``: ``Relu(Conv + z)``, ``Conv + z`` or ``Relu(Conv)`` as one geode
  ``FusedConv``: the Conv's output (and the Add's, when a Relu follows it) feeds nothing
  else and is not a graph output; ``z`` has exactly the Conv output's shape and dtype (no
  broadcast); the dtype is float32 or float64, the conv 1-D or 2-D with static weights'
  shape (what a native conv takes). Of an Add of two such Convs the later one in graph
  order takes the Add, the first's output becoming its ``z``.
- ``conv_pool``: a MaxPool after a Conv, or after a FusedConv without a residual or a
  pool of its own: the pool 2-D without Indices, ceil_mode, storage order, dilations or
  auto_pad, the conv one the direct kernel computes (2-D, horizontal stride at most 2,
  2-64 taps, not depthwise): its kernel pools a band of conv rows kept in a scratch.

Only nodes that read a conv's output are candidates; the others are no decision at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geode.compiler.ir import GEODE_DOMAIN, Graph, Node, Value
from geode.compiler.shapes import dims_equal

__all__ = ["ConvFusion", "conv_fusion_candidate"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ONNX = ("", "ai.onnx")


@dataclass
class ConvFusion:
    """A legal conv fusion: ``rule`` (``conv_epilogue`` or ``conv_pool``), the conv (a
    Conv, or for ``conv_pool`` also a FusedConv), the node whose output the FusedConv
    replaces (``last``), and what joins: the residual ``z``, the Relu, the MaxPool."""

    rule: str
    conv: Node
    last: Node
    z: Value | None = None
    relu: Node | None = None
    pool: Node | None = None

    def describe(self) -> str:
        """``"Conv 'c' + residual + Relu"``: the conv and what joins it."""
        parts = [f"{self.conv.op_type} {self.conv.name!r}"]
        if self.z is not None:
            parts.append("residual Add")
        if self.relu is not None:
            parts.append("Relu")
        if self.pool is not None:
            parts.append(f"MaxPool {self.pool.name!r}")
        return " + ".join(parts)


def conv_fusion_candidate(graph: Graph, node: Node) -> ConvFusion | str | None:
    """What ``node`` (a Relu, an Add or a MaxPool) may fuse into the conv whose output it
    reads: a :class:`ConvFusion` when legal, the reason (``"illegal: ..."``) when not;
    None when it reads no conv (no decision to make)."""
    if not _onnx(node):
        return None
    if node.op_type == "MaxPool":
        return _pool_candidate(graph, node)
    if node.op_type == "Relu":
        return _relu_candidate(graph, node)
    if node.op_type == "Add":
        if _sole_use(graph, node.outputs[0], "Relu") is not None:
            return None  # the Relu after it decides for both
        return _residual(graph, node, None)
    return None


def _onnx(node: Node | None) -> bool:
    return node is not None and node.domain in _ONNX


def _is_output(graph: Graph, v: Value) -> bool:
    return any(o is v for o in graph.outputs)


def _sole_use(graph: Graph, v: Value | None, op_type: str) -> Node | None:
    """The one node reading ``v`` when it is an ONNX ``op_type`` and ``v`` is no graph
    output; else None."""
    if v is None or len(v.uses) != 1 or _is_output(graph, v):
        return None
    user = v.uses[0][0]
    return user if user.op_type == op_type and _onnx(user) else None


def _conv_of(v: Value | None) -> Node | None:
    """The ONNX Conv producing ``v``, if any."""
    conv = None if v is None else v.producer
    return conv if conv is not None and conv.op_type == "Conv" and _onnx(conv) else None


def _conv_refusal(graph: Graph, v: Value) -> str | None:
    """Why the Conv producing ``v`` may not take an epilogue, or None when it may."""
    conv = v.producer
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    if len(conv.outputs) != 1 or v.dtype not in _DTYPES or v.shape is None:
        return f"{conv.name!r} is not a float32/float64 conv of a known rank"
    if w is None or w.shape is None or not all(isinstance(d, int) for d in w.shape):
        return f"{conv.name!r} has weights of a dynamic shape (no native conv)"
    if len(w.shape) not in (3, 4):
        return f"{conv.name!r} is a {len(w.shape) - 2}-D conv (native: 1-D and 2-D)"
    if any(i is not None and i.dtype != v.dtype for i in conv.inputs):
        return f"{conv.name!r} mixes dtypes"
    if len(v.uses) != 1 or _is_output(graph, v):
        return f"{conv.name!r}'s output is read elsewhere (or is a graph output)"
    return None


def _relu_candidate(graph: Graph, relu: Node) -> ConvFusion | str | None:
    """``Relu(Conv)`` or ``Relu(Conv + z)``."""
    v = relu.inputs[0]
    if _conv_of(v) is not None:
        why = _conv_refusal(graph, v)
        if why:
            return f"illegal: {why}"
        return ConvFusion("conv_epilogue", v.producer, relu, relu=relu)
    add = None if v is None else v.producer
    if add is None or add.op_type != "Add" or not _onnx(add):
        return None
    if _sole_use(graph, add.outputs[0], "Relu") is not relu:
        return None  # the Add is read elsewhere: it decides alone
    return _residual(graph, add, relu)


def _residual(graph: Graph, add: Node, relu: Node | None) -> ConvFusion | str | None:
    """``conv_out + z`` with ``z`` of exactly its shape; of two fusable Convs the later
    one in graph order."""
    if len(add.inputs) != 2 or not any(_conv_of(i) is not None for i in add.inputs):
        return None
    if add.inputs[0] is add.inputs[1]:
        return "illegal: the Add reads the conv's output twice"
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    best, why = None, None
    for i in (0, 1):
        y, z = add.inputs[i], add.inputs[1 - i]
        if _conv_of(y) is None:
            continue
        why = _conv_refusal(graph, y) or _residual_refusal(add, y, z)
        if why is None and (best is None or order[y.producer.name] > order[best[0].name]):
            best = (y.producer, z)
    if best is None:
        return f"illegal: {why}"
    return ConvFusion("conv_epilogue", best[0], relu or add, z=best[1], relu=relu)


def _residual_refusal(add: Node, y: Value, z: Value | None) -> str | None:
    """Why ``z`` may not be the residual of the conv output ``y``, or None."""
    if z is None or z.dtype != y.dtype or add.outputs[0].dtype != z.dtype:
        return "the residual's dtype differs from the conv's"
    if z.shape is None or y.shape is None or len(z.shape) != len(y.shape):
        return "the residual is not of the conv output's shape (a broadcast)"
    if not all(dims_equal(a, b) is True for a, b in zip(z.shape, y.shape)):
        return "the residual is not of the conv output's shape (a broadcast)"
    return None


def _pool_refusal(pool: Node) -> str | None:
    """Why a MaxPool may not join any conv's kernel (its own attributes), or None."""
    a = pool.attrs
    if len(pool.outputs) != 1:
        return "the MaxPool has an Indices output"
    if int(a.get("ceil_mode") or 0) or int(a.get("storage_order") or 0):
        return "the MaxPool has ceil_mode or a storage order"
    kernel = a.get("kernel_shape")
    if kernel is None or len(kernel) != 2:
        return "the MaxPool is not 2-D"
    if (a.get("auto_pad") or "NOTSET") != "NOTSET":
        return "the MaxPool has auto_pad"
    if any(int(d) != 1 for d in a.get("dilations") or []):
        return "the MaxPool is dilated"
    return None


def _pool_candidate(graph: Graph, pool: Node) -> ConvFusion | str | None:
    """A MaxPool after a Conv or a FusedConv (see the module docstring)."""
    v = pool.inputs[0]
    conv = None if v is None else v.producer
    fused = conv is not None and conv.op_type == "FusedConv" and conv.domain == GEODE_DOMAIN
    if conv is None or not (fused or _conv_of(v) is not None):
        return None
    why = _pool_refusal(pool)
    if why is None and fused:
        if conv.attrs.get("pool_kernel") or (len(conv.inputs) > 3 and conv.inputs[3]):
            why = f"{conv.name!r} has a residual (or a pool) already"
        elif len(v.uses) != 1 or _is_output(graph, v):
            why = f"{conv.name!r}'s output is read elsewhere (or is a graph output)"
    elif why is None:
        why = _conv_refusal(graph, v)
    if why is None:
        why = _direct_refusal(conv)
    if why:
        return f"illegal: {why}"
    return ConvFusion("conv_pool", conv, pool, pool=pool)


def _direct_refusal(conv: Node) -> str | None:
    """Why the direct kernel (the one that pools) does not compute ``conv``, or None."""
    w = conv.inputs[1]
    group = int(conv.attrs.get("group") or 1)
    strides = conv.attrs.get("strides") or [1, 1]
    if len(w.shape) != 4 or w.shape[1] == 0:
        return f"{conv.name!r} is not a 2-D conv the direct kernel computes"
    taps = w.shape[2] * w.shape[3]
    if int(strides[1]) > 2 or not 0 < taps <= 64:
        return f"{conv.name!r}: the direct kernel takes 1-64 taps at horizontal stride 1-2"
    if w.shape[1] == 1 and group > 1:
        return f"{conv.name!r} is depthwise (its kernel does not pool)"
    return None
