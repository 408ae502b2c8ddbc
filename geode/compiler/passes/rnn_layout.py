"""The ``rnn_layout`` pass: a one-direction LSTM fed by ``Transpose(x, [1, 0, 2])``
(PyTorch's export of a ``batch_first`` LSTM) reads ``x`` itself with ``layout=1``.

A batch-first LSTM exported to ONNX swaps the sequence and batch axes of its input
before the LSTM (layout 0 wants ``[T, N, I]``) and swaps them back after it; the LSTM
kernel reads and writes the batch-first layout itself (``layout=1``: X ``[N, T, I]``,
Y ``[N, T, D, H]``, states ``[N, D, H]``), so both copies can go. The pass rewrites

    X = Transpose(x, perm=[1, 0, 2]);  Y, Y_h, Y_c = LSTM(X, ..., initial_h, initial_c)

for one direction (``D = 1``) into ``LSTM(x, ..., layout=1)`` with the old outputs
rebuilt from the new ones by axis moves that are free for ``D = 1``: ``Y =
Unsqueeze(Transpose(Squeeze(Y', 2), [1, 0, 2]), 1)``, ``Y_h = Unsqueeze(Squeeze(Y_h',
1), 0)`` (the initial states the other way round). The ``simplify`` pass that follows
cancels these against the readers' own ``Squeeze``/``Transpose`` (PyTorch's
``Squeeze(Y, 1)`` then ``Transpose(.., [1, 0, 2])`` become ``Squeeze(Y', 2)``, a view).
Bidirectional LSTMs, and LSTMs whose input is not such a transpose, are left as they
are.
"""

from __future__ import annotations

from geode.compiler.ir import Graph, Node, Value
from geode.compiler.passes.rewrite import Rewriter, node_alive, try_rewrite

__all__ = ["absorb_lstm_transposes"]


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _swaps_batch(node: Node | None) -> bool:
    """Whether ``node`` is ``Transpose(x, perm=[1, 0, 2])``."""
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return False
    perm = node.attr("perm")
    return perm is not None and [int(p) for p in perm] == [1, 0, 2]


def _movable(graph: Graph, node: Node) -> bool:
    """Whether the pass applies to ``node`` (see the module docstring)."""
    if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx"):
        return False
    if int(node.attrs.get("layout") or 0) != 0:
        return False
    if _text(node.attrs.get("direction") or "forward") == "bidirectional":
        return False
    x = node.input(0)
    return x is not None and x.rank == 3 and _swaps_batch(x.producer) and node_alive(graph, node)


def _move(rw: Rewriter, v: Value, squeeze: int, unsqueeze: int) -> Value:
    """``Unsqueeze(Squeeze(v, squeeze), unsqueeze)``: move a size-1 axis (a view)."""
    return rw.op("Unsqueeze", rw.op("Squeeze", v, rw.ints([squeeze])), rw.ints([unsqueeze]))


def _rebuild(node: Node, rw: Rewriter) -> list[Value | None]:
    """The new LSTM and the old outputs rebuilt from its outputs."""
    ins: list[Value | None] = list(node.inputs)
    x = ins[0]
    assert x is not None and x.producer is not None
    ins[0] = x.producer.inputs[0]
    for k in (5, 6):  # initial_h, initial_c: [1, N, H] -> [N, 1, H]
        if k < len(ins) and ins[k] is not None:
            ins[k] = _move(rw, ins[k], 0, 1)
    attrs = {**node.attrs, "layout": 1}
    outs = rw.op("LSTM", *ins, n_outputs=len(node.outputs), **attrs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    rebuilt: list[Value | None] = []
    for k, new in enumerate(outs):
        if k == 0:  # Y: [N, T, 1, H] -> [T, 1, N, H]
            seq_first = rw.op("Transpose", rw.op("Squeeze", new, rw.ints([2])), perm=[1, 0, 2])
            rebuilt.append(rw.op("Unsqueeze", seq_first, rw.ints([1])))
        else:  # Y_h, Y_c: [N, 1, H] -> [1, N, H]
            rebuilt.append(_move(rw, new, 1, 0))
    return rebuilt


def absorb_lstm_transposes(graph: Graph) -> bool:
    """Make every one-direction LSTM fed by a batch/sequence transpose read the
    untransposed input with ``layout=1`` (see the module docstring). Returns True when
    the graph changed."""
    changed = False
    for node in graph.toposort():
        if _movable(graph, node):
            changed |= try_rewrite(graph, node, lambda rw, node=node: _rebuild(node, rw))
    return changed
