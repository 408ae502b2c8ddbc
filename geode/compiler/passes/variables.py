"""Variable passes (GE style): which variables are read-only, freezing them, and
answering VarIsInitialized.

A variable lives in the session's VarManager and may be written by Assign-like ops
(or updated by the user between runs). One that no op of the graph writes is
*read-only* for this graph: :func:`mark_read_only_variables` records that on each
variable (``Value.read_only``), and :func:`freeze_read_only_variables`, which the
pipeline runs only when asked (the ``freeze_variables`` pass), turns them into
constants so constant folding can go through them. Freezing bakes the variable's
current value into the compiled model: a later update of the variable is not seen.

:func:`fold_var_is_initialized` (GE's VarIsInitializedOpPass) replaces a
``VarIsInitialized`` whose answer cannot change by the constant True. *Initialized*
means *has a value*, and a variable never loses its value: it has one when the graph
gives it an initial value, when a write precedes the query in graph order (after
VariablePrepare the query reads that write's result), or when the session already
holds a value for it (:class:`SessionVariable`). Only a variable declared without a
value, not yet set in the session, is asked at run time (a step reading the
VarManager's flag: False until a run commits a write, ``session.set_variable`` or a
restored checkpoint sets it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from geode.compiler.ir import Graph, Value, ValueKind
from geode.compiler.ops import state
from geode.compiler.passes.rewrite import SIDE_EFFECT_OPS, replace_value

#: for each Assign-like op of another domain, the input indices it writes
WRITTEN_INPUTS: dict[str, tuple[int, ...]] = {op: (0,) for op in SIDE_EFFECT_OPS}


@dataclass(frozen=True)
class SessionVariable:
    """What the compiling session knows of a variable of that name: its storage format
    (fixed once registered) and whether it has a value."""

    format: str
    initialized: bool


#: variable name -> what the session knows (empty: a fresh session)
SessionVariables = Mapping[str, SessionVariable]


def written_variables(graph: Graph) -> set[str]:
    """Names of the variables that some node of ``graph`` writes (geode's Assign ops,
    the VarRef nodes VariablePrepare leaves, or other domains' Assign-like ops)."""
    out: set[str] = set()
    for node in graph.nodes:
        name = state.written_variable(node)
        if name is not None:
            out.add(name)
            continue
        for i in WRITTEN_INPUTS.get(node.op_type, ()):
            v = node.input(i)
            if v is not None and v.kind is ValueKind.VARIABLE:
                out.add(v.name)
    return out


def fold_var_is_initialized(graph: Graph, session: SessionVariables | None = None) -> bool:
    """Replace every ``VarIsInitialized`` whose answer is known by the constant True (see
    the module docstring); the others stay, for the session to answer at run time.
    Returns True when any was replaced."""
    session = session or {}
    changed = False
    for node in list(graph.nodes):
        if not state.is_var_query(node):
            continue
        v = node.inputs[0]
        known = session.get(v.name) if v.kind is ValueKind.VARIABLE else None
        if v.kind is ValueKind.VARIABLE and v.data is None and not (known and known.initialized):
            continue
        out = node.outputs[0]
        replace_value(graph, out, graph.constant(np.array(True), name=f"{out.name}_known"))
        changed = True  # replace_value removed the query, now dead
    return changed


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
