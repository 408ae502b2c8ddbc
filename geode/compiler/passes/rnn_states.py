"""The ``rnn_zero_states`` pass: an RNN, GRU or LSTM whose initial state is all zeros
reads no initial state (ONNX: a missing ``initial_h``/``initial_c`` is zeros).

PyTorch's export of ``nn.LSTM(x)`` without states computes zero states at every call:
``ConstantOfShape(Concat(1, Gather(Shape(x), batch axis), H))``, four host steps, then
the kernel copies the zeros in. Such an input is dropped when it is provably zeros (a
``ConstantOfShape`` of value 0, or a constant of +0 only, through views: ``Squeeze``,
``Unsqueeze``, ``Reshape``, ``Flatten``, ``Identity``, ``Transpose``, ``Expand``) and
its shape is provably the state's (``[D, N, H]``, batch-first ``[N, D, H]``: so no
run-time shape error is lost); ``dce`` then removes the steps that computed it. Runs
after ``rnn_layout`` (which moves the states' axes through views), before ``dce``.
"""

from __future__ import annotations

import numpy as np

from geode.compiler.ir import Graph, Node, Value
from geode.compiler.passes.rewrite import const_value, node_alive, shapes_equal, try_rewrite

__all__ = ["drop_zero_states"]

#: input positions of the initial states, per op
_STATES = {"RNN": (5,), "GRU": (5,), "LSTM": (5, 6)}

#: ops whose output is zeros when their first input is (views and broadcasts)
_KEEPS_ZEROS = ("Squeeze", "Unsqueeze", "Reshape", "Flatten", "Identity", "Transpose", "Expand")

#: how far back through such ops a zero is looked for
_DEPTH = 8


def _plus_zeros(data: np.ndarray) -> bool:
    """Whether every element is +0 (a -0 state could show in an output's bits)."""
    return data.size > 0 and not data.any() and not np.signbit(data).any()


def is_zeros(v: Value | None) -> bool:
    """Whether ``v`` is provably all +0 (see the module docstring)."""
    for _ in range(_DEPTH):
        if v is None:
            return False
        data = const_value(v)
        if data is not None:
            return _plus_zeros(data)
        p = v.producer
        if p is None or p.domain not in ("", "ai.onnx"):
            return False
        if p.op_type == "ConstantOfShape":
            value = p.attrs.get("value")
            return value is None or _plus_zeros(np.asarray(value))
        if p.op_type not in _KEEPS_ZEROS:
            return False
        v = p.inputs[0] if p.inputs else None
    return False


def _state_shape(node: Node) -> tuple | None:
    """The initial state's shape ``node`` expects, or None when not known."""
    x, r = node.input(0), node.input(2)
    if x is None or r is None or x.shape is None or r.shape is None:
        return None
    if len(x.shape) != 3 or len(r.shape) != 3:
        return None
    batch_first = int(node.attrs.get("layout") or 0) == 1
    batch = x.shape[0] if batch_first else x.shape[1]
    d, h = r.shape[0], r.shape[2]
    return (batch, d, h) if batch_first else (d, batch, h)


def _droppable(graph: Graph, node: Node) -> list[int]:
    """The positions of ``node``'s initial states that can go."""
    if node.op_type not in _STATES or node.domain not in ("", "ai.onnx"):
        return []
    want = _state_shape(node)
    if want is None or not node_alive(graph, node):
        return []
    return [
        k
        for k in _STATES[node.op_type]
        if k < len(node.inputs)
        and node.inputs[k] is not None
        and shapes_equal(node.inputs[k].shape, want)
        and is_zeros(node.inputs[k])
    ]


def drop_zero_states(graph: Graph) -> bool:
    """Make every recurrent op whose initial state is provably zeros read none (see the
    module docstring). Returns True when the graph changed."""
    changed = False
    for node in graph.toposort():
        drop = _droppable(graph, node)
        if not drop:
            continue

        def build(rw, node: Node = node, drop: list[int] = drop):  # noqa: ANN001, ANN202
            ins = [None if k in drop else v for k, v in enumerate(node.inputs)]
            while ins and ins[-1] is None:
                ins.pop()
            outs = rw.op(node.op_type, *ins, n_outputs=len(node.outputs), **node.attrs)
            return list(outs) if isinstance(outs, tuple) else [outs]

        changed |= try_rewrite(graph, node, build)
    return changed
