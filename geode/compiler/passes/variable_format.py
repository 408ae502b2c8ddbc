"""Variable format acceleration (GE's VariableOpPass): store a variable in the layout
its readers want.

A weight variable read only through ``Transpose(W, perm)`` (PyTorch's Linear exports
``MatMul(x, Transpose(W))``; ``Gemm(transB=1)`` decomposes to it) transposes ``W`` on
every call: a variable cannot be constant-folded. When every node that reads ``W``'s
data transposes it the same way, this pass stores ``W`` as ``W.transpose(perm)``
instead (its format becomes ``TRANSPOSED(perm)``, :mod:`geode.runtime.var_format`), and
those Transposes read the stored tensor directly: the transpose runs once, at compile
time, on the initial value, never per call.

The conversion is the VarManager's business from there on: a write of ``W`` (its
VarRef commits a value in the user's layout) is converted on its way in, and
``session.get_variable`` converts back. Nodes that only name ``W`` without reading its
data (VarRef's target, VarIsInitialized) do not count as readers.

The storage format of a variable is fixed by the first graph that registers it in a
session (GE: at most one format change per variable). When the session already
stores ``W`` in some format, this pass adopts it whatever this graph's readers want:
Transposes that match read the stored tensor, every other reader reads a conversion
back (``Transpose(W, inverse)``, which ``simplify`` may merge with a reader's own
Transpose).
"""

from __future__ import annotations

from geode.compiler.ir import Graph, Node, TensorDesc, Value
from geode.compiler.ops import state
from geode.compiler.passes.rewrite import is_output, replace_value
from geode.compiler.passes.variables import SessionVariables
from geode.errors import GraphError
from geode.runtime import var_format

_NAMES_ONLY = object()  # a use that does not read the variable's data


def _wanted(node: Node, i: int, rank: int) -> object:
    """The permutation use ``(node, i)`` wants the variable's data in (the identity for
    a plain read), or ``_NAMES_ONLY``."""
    if state.is_var_query(node) or (state.is_var_ref(node) and i == 0):
        return _NAMES_ONLY
    if node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and i == 0:
        perm = node.attr("perm")
        return tuple(int(p) for p in perm) if perm is not None else tuple(range(rank))[::-1]
    return tuple(range(rank))


def accelerate_variable_formats(graph: Graph, session: SessionVariables | None = None) -> bool:
    """Store variables in the layout their readers want, or in the format the session
    already stores them in (see the module docstring). Returns True when any variable's
    format changed."""
    session = session or {}
    changed = False
    for v in graph.variables():
        if v.desc.format != var_format.ND or v.shape is None:
            continue  # done already (an earlier round), or nothing to go by
        known = session.get(v.name)
        if known is not None:
            fmt = known.format
        else:
            fmt = _chosen(graph, v)
        if fmt == var_format.ND:
            continue
        if var_format.permutation(fmt) is None:  # a label: the same layout
            v.desc = TensorDesc(v.dtype, v.shape, fmt)
            changed = True
            continue
        _store_as(graph, v, fmt)
        changed = True
    return changed


def _chosen(graph: Graph, v: Value) -> str:
    """The format every data reader of ``v`` wants, or ND."""
    if is_output(graph, v) or len(v.shape) < 2:
        return var_format.ND
    wants = {_wanted(n, i, len(v.shape)) for n, i in v.uses} - {_NAMES_ONLY}
    if len(wants) != 1:
        return var_format.ND
    return var_format.transposed(wants.pop())  # type: ignore[arg-type]


def _store_as(graph: Graph, v: Value, fmt: str) -> None:
    """Make ``v`` the stored tensor of format ``fmt`` and its readers read it so."""
    perm = var_format.permutation(fmt)
    if perm is None or len(perm) != len(v.shape):
        raise GraphError(
            f"variable {v.name!r} of {v.desc} is stored as {fmt} in this session, which "
            "does not fit it"
        )
    if is_output(graph, v):
        raise GraphError(
            f"variable {v.name!r} is a graph output, but the session stores it as {fmt}: "
            "output it under a name (g.output(w, names=[...]))"
        )
    user = tuple(v.shape)
    v.desc = TensorDesc(v.dtype, var_format.storage_shape(user, fmt), fmt)
    if v.data is not None:
        v.data = var_format.to_storage(v.data, fmt)
    back: Value | None = None
    for node, i in list(v.uses):
        want = _wanted(node, i, len(user))
        if want is _NAMES_ONLY:
            continue
        if want == perm:  # this Transpose is the stored tensor
            replace_value(graph, node.outputs[0], v)
            continue
        if back is None:
            inverse = [0] * len(perm)
            for k, p in enumerate(perm):
                inverse[p] = k
            back = graph.add_node(
                "Transpose", [v], {"perm": inverse}, name=f"{v.name}_to_user"
            ).outputs[0]
        node.set_input(i, back)
