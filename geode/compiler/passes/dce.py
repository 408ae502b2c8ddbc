"""Dead code elimination."""

from __future__ import annotations

from geode.compiler.ir import Graph, Node, ValueKind
from geode.compiler.ops import registry
from geode.compiler.passes.rewrite import SIDE_EFFECT_OPS, is_dead


def dce(graph: Graph) -> bool:
    """Remove what no graph output needs.

    * nodes none of whose outputs reach a graph output (ops that write state, the
      Assign family, are kept with everything they read);
    * trailing optional outputs nobody reads (LayerNormalization's Mean/InvStdDev,
      Dropout's mask), so later passes and kernels need not compute them;
    * constants and variables that nothing reads. Graph inputs are never removed:
      they are the model's signature.

    Returns True when anything was removed.
    """
    live: set[int] = set()
    work: list[Node] = [n for n in graph.nodes if n.op_type in SIDE_EFFECT_OPS]
    work += [v.producer for v in graph.outputs if v.producer is not None]
    while work:
        node = work.pop()
        if id(node) in live:
            continue
        live.add(id(node))
        work.extend(v.producer for v in node.inputs if v is not None and v.producer is not None)
    changed = False
    dead = [n for n in graph.nodes if id(n) not in live]
    if dead:
        # in bulk: Graph.remove_node rebuilds the node list once per node
        for node in dead:
            node.drop_inputs()
            for out in node.outputs:
                if graph.values.get(out.name) is out:
                    del graph.values[out.name]
        graph.nodes = [n for n in graph.nodes if id(n) in live]
        changed = True
    for node in graph.nodes:
        changed |= _drop_unused_outputs(graph, node)
    for v in list(graph.values.values()):
        if v.kind in (ValueKind.CONSTANT, ValueKind.VARIABLE) and is_dead(graph, v):
            graph.remove_value(v)
            changed = True
    return changed


def _drop_unused_outputs(graph: Graph, node: Node) -> bool:
    """Pop trailing outputs that are optional in the op's schema and unread."""
    if not registry.has(node.op_type, node.domain) or node.op_type in SIDE_EFFECT_OPS:
        return False
    specs = registry.get(node.op_type, node.domain).outputs
    if specs and specs[-1].variadic:
        return False
    changed = False
    while len(node.outputs) > 1:
        i = len(node.outputs) - 1
        out = node.outputs[i]
        if i >= len(specs) or not specs[i].optional or not is_dead(graph, out):
            break
        node.outputs.pop()
        graph.remove_value(out)
        changed = True
    return changed
