"""Variable passes (GE style): which variables are read-only, and freezing them.

A variable lives in the session's VarManager and may be written by Assign-like ops
(or updated by the user between runs). One that no op of the graph writes is
*read-only* for this graph: :func:`mark_read_only_variables` records that on each
variable (``Value.read_only``), and :func:`freeze_read_only_variables`, which the
pipeline runs only when asked (the ``freeze_variables`` pass), turns them into
constants so constant folding can go through them. Freezing bakes the variable's
current value into the compiled model: a later update of the variable is not seen.
"""

from __future__ import annotations

from geode.compiler.ir import Graph, Value, ValueKind
from geode.compiler.passes.rewrite import SIDE_EFFECT_OPS

#: for each Assign-like op, the input indices it writes
WRITTEN_INPUTS: dict[str, tuple[int, ...]] = {op: (0,) for op in SIDE_EFFECT_OPS}


def written_variables(graph: Graph) -> set[str]:
    """Names of the variables that some node of ``graph`` writes."""
    out: set[str] = set()
    for node in graph.nodes:
        for i in WRITTEN_INPUTS.get(node.op_type, ()):
            v = node.input(i)
            if v is not None and v.kind is ValueKind.VARIABLE:
                out.add(v.name)
    return out


def read_only_variables(graph: Graph) -> list[Value]:
    """Variables that no node writes, in name order."""
    written = written_variables(graph)
    return sorted((v for v in graph.variables() if v.name not in written), key=lambda v: v.name)


def is_read_only(v: Value) -> bool:
    """The mark left by :func:`mark_read_only_variables` (False when never marked)."""
    return bool(getattr(v, "read_only", False))


def mark_read_only_variables(graph: Graph) -> bool:
    """Set ``read_only`` on every variable: True when no node writes it.

    Returns True when any mark changed.
    """
    written = written_variables(graph)
    changed = False
    for v in graph.variables():
        flag = v.name not in written
        if getattr(v, "read_only", None) is not flag:
            v.read_only = flag  # type: ignore[attr-defined]
            changed = True
    return changed


def freeze_read_only_variables(graph: Graph) -> bool:
    """Turn read-only variables that have data into constants (same name, same data).

    Returns True when any variable was frozen.
    """
    changed = False
    for v in read_only_variables(graph):
        if v.data is None:
            continue
        v.kind = ValueKind.CONSTANT
        v.read_only = True  # type: ignore[attr-defined]
        changed = True
    return changed
