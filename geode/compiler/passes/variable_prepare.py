"""VariablePrepare (GE's VariablePrepareOpPass): what writes of variables mean.

A graph writes a variable with geode's ``Assign``, ``AssignAdd`` and ``AssignSub``
(``geode/compiler/ops/state.py``). Their meaning is fixed by the graph's order (the
order nodes were built in, or their order in the ONNX file), and this pass makes it
explicit so that no later pass can change it:

1. **Reads follow the order.** Walking the nodes in graph order, every input that
   reads a written variable ``W`` is rewired to ``W``'s latest value at that point: ``W``
   itself (the value the run starts with) before the first write, the previous write's
   result after it. A read built after a write therefore *depends on it by a data
   edge*; a read built before it reads ``W`` itself. Several writes of one variable
   chain the same way (``AssignAdd`` adds to the previous write's result).
2. **Writes become values.** Each write is replaced by what it computes: ``Assign(W,
   v)`` by ``v``, ``AssignAdd(W, d)`` by ``Add(W', d)``, ``AssignSub`` by ``Sub`` (``W'``:
   the latest value of ``W``). From here on they are ordinary nodes that fold, fuse and
   merge like any other.
3. **One reference node per written variable.** A ``VarRef(W, final)`` node (GE's
   VariableRef) holds the write itself: ``final`` is ``W``'s value after the last write.
   It is an op with a side effect (``rewrite.SIDE_EFFECT_OPS``): never folded, merged or
   removed, and it keeps ``final``'s computation alive. The plan turns it into a
   *commit*: when every step of the run has finished, the session's VarManager takes
   ``final`` (converted to the variable's storage format) in place of ``W``.

Why this order needs no control edges: nothing writes the VarManager while a run's
steps execute, so every step that reads ``W`` itself, wherever the fusion planner
puts it, sees the value the run started with, and every read built after a write
reads that write's result through its data edge. The commits run after the last
step, in VarRef order; they read their values first, so a swap (``Assign(a, b);
Assign(b, a)``) swaps. Other models of the session see the new values from their next
run on. A run that fails before its end commits nothing.

A written variable that is itself a graph output (``g.output(w)`` without a name)
would be ambiguous (old or new value?) and is refused; output it under a name (an
Identity built at that point: after the writes, the new value) or output what
``assign`` returned.
"""

from __future__ import annotations

from geode.compiler.ir import GEODE_DOMAIN, Graph, Node, Value
from geode.compiler.ops import state
from geode.compiler.passes.rewrite import replace_value
from geode.errors import GraphError

#: what each write op lowers to (None: the value itself)
_LOWERED = {"Assign": None, "AssignAdd": "Add", "AssignSub": "Sub"}


def prepare_variables(graph: Graph) -> bool:
    """Rewire reads of written variables in graph order, lower the writes to plain
    values and add one ``VarRef`` per written variable (see the module docstring).

    Must run before anything reorders ``graph.nodes``: it is the first graph pass.
    Returns True when the graph had writes.
    """
    writes = [n for n in graph.nodes if state.is_write(n)]
    if not writes:
        return False
    latest: dict[int, Value] = {}  # id(variable) -> its latest value
    targets: dict[int, Value] = {}
    for node in list(graph.nodes):  # graph order
        target = node.inputs[0] if state.is_write(node) else None
        for i, v in enumerate(node.inputs):
            if v is not None and id(v) in latest:
                node.set_input(i, latest[id(v)])
        if target is not None:
            latest[id(target)] = node.outputs[0]
            targets[id(target)] = target
    for key, var in targets.items():
        if any(o is var for o in graph.outputs):
            raise GraphError(
                f"variable {var.name!r} is written by the graph and is itself a graph output: "
                "old or new value? Output what assign() returned (the new value), or name the "
                "output (g.output(w, names=[...]) reads it after the writes)"
            )
        graph.add_node(
            state.VAR_REF,
            [var, latest[key]],
            name=f"{var.name}_ref",
            domain=GEODE_DOMAIN,
        )
    for node in writes:
        _lower(graph, node)
    return True


def _lower(graph: Graph, node: Node) -> None:
    """Replace a write by the value it computes."""
    current, value = node.inputs[0], node.inputs[1]
    op = _LOWERED[node.op_type]
    if op is None:
        new = value
    else:
        new = graph.add_node(op, [current, value], name=f"{node.name}_{op.lower()}").outputs[0]
    out = node.outputs[0]
    replace_value(graph, out, new)
    if not out.uses:
        graph.remove_node(node)
