"""Ops on session state (domain :data:`~geode.compiler.ir.GEODE_DOMAIN`, ``"geode"``).

* ``Assign(var, value)``, ``AssignAdd(var, delta)``, ``AssignSub(var, delta)``: write a
  variable; the output is the new value (TensorFlow's Assign). ``var`` (input 0) must be
  a variable of the graph; the value (or delta) must have its exact dtype and a shape
  provably equal to its (static) shape.
* ``VarIsInitialized(var)``: a bool scalar, whether the variable has a value.
* ``VarRef(var, value)``: made by the variable-prepare pass, never by users: the write
  of ``value`` into ``var`` at the end of the run (GE's VariableRef node). Its output
  repeats ``value`` and nothing reads it.

What writes mean, in graph order, is settled by the variable-prepare pass
(``geode/compiler/passes/variable_prepare.py``); the reference interpreter follows the
same order (:func:`written_variable` tells it which variable a node writes).
"""

from __future__ import annotations

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ir import GEODE_DOMAIN, Node, TensorDesc, ValueKind
from geode.compiler.ops.registry import In, InferContext, OpDef, OpKind, Out, register
from geode.compiler.shapes import dims_equal, shape_str
from geode.errors import DTypeError, ShapeError

#: the ops that write a variable (input 0), by type
WRITE_OPS = frozenset({"Assign", "AssignAdd", "AssignSub"})
#: the op the prepare pass leaves per written variable: its write at the end of the run
VAR_REF = "VarRef"
#: the query op
VAR_IS_INITIALIZED = "VarIsInitialized"
#: ops that write state (GE's Assign family, and the VarRef node the variable-prepare
#: pass leaves per written variable); never removed, merged or folded.
SIDE_EFFECT_OPS = frozenset(
    {"Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "ScatterUpdate", "VarRef"}
)

_ANY = dtypes.ALL


def is_write(node: Node) -> bool:
    """Whether ``node`` is one of geode's Assign ops (not yet lowered by the prepare pass)."""
    return node.domain == GEODE_DOMAIN and node.op_type in WRITE_OPS


def is_var_ref(node: Node) -> bool:
    """Whether ``node`` is a VarRef (a variable's write at the end of the run)."""
    return node.domain == GEODE_DOMAIN and node.op_type == VAR_REF


def is_var_query(node: Node) -> bool:
    """Whether ``node`` is a VarIsInitialized query."""
    return node.domain == GEODE_DOMAIN and node.op_type == VAR_IS_INITIALIZED


def written_variable(node: Node) -> str | None:
    """The name of the variable ``node`` writes (an Assign op or a VarRef), else None."""
    if not (is_write(node) or is_var_ref(node)):
        return None
    v = node.input(0)
    return v.name if v is not None and v.kind is ValueKind.VARIABLE else None


def _verify_write(ctx: InferContext) -> None:
    """Input 0 is a variable; the value has its exact dtype and (provably) its shape."""
    var, value = ctx.input(0), ctx.input(1)
    if var.kind is not ValueKind.VARIABLE:
        ctx.fail(
            f"input 0 ({var.name!r}) is a {var.kind.value}, not a variable: only variables "
            "can be written",
            DTypeError,
        )
    what = "value" if ctx.node.op_type == "Assign" else "delta"
    if value.dtype != var.dtype:
        ctx.fail(
            f"variable {var.name!r} is {var.desc}, the {what} {value.name!r} is {value.desc}: "
            "the dtypes must match",
            DTypeError,
        )
    a, b = var.shape, value.shape
    if b is None or len(a) != len(b) or any(dims_equal(x, y) is not True for x, y in zip(a, b)):
        ctx.fail(
            f"variable {var.name!r} is {var.desc}, the {what} {value.name!r} is {value.desc}: "
            f"the shapes must match ({shape_str(a)} vs {shape_str(b)})",
            ShapeError,
        )


def _same_as_variable(ctx: InferContext) -> list[TensorDesc]:
    d = ctx.desc(0)
    return [TensorDesc(d.dtype, d.shape)]


def _verify_var_ref(ctx: InferContext) -> None:
    var = ctx.input(0)
    if var.kind is not ValueKind.VARIABLE:
        ctx.fail(f"input 0 ({var.name!r}) is not a variable", DTypeError)
    if ctx.dtype(1) != var.dtype:
        ctx.fail(f"writes {ctx.desc(1)} into variable {var.name!r} of {var.desc}", DTypeError)


def _kernel(op: str):
    def assign(ins: list, attrs: dict) -> list[np.ndarray]:
        var, value = ins
        if op == "AssignAdd":
            return [np.asarray(var + value, dtype=var.dtype)]
        if op == "AssignSub":
            return [np.asarray(var - value, dtype=var.dtype)]
        return [np.array(value, copy=True)]

    return assign


for _op in sorted(WRITE_OPS):
    register(
        OpDef(
            _op,
            OpKind.OPAQUE,
            # two type variables: _verify_write names the variable when the dtypes differ
            inputs=[In("var", "T"), In("value", "V")],
            outputs=[Out("new_value", "T")],
            types={"T": _ANY if _op == "Assign" else dtypes.NUMERIC, "V": _ANY},
            infer=_same_as_variable,
            verify=_verify_write,
            kernel=_kernel(_op),
            domain=GEODE_DOMAIN,
            doc=f"{_op}: write a variable; the output is its new value",
        )
    )

register(
    OpDef(
        VAR_IS_INITIALIZED,
        OpKind.HOST,
        inputs=[In("var", "T")],
        outputs=[Out("initialized", "B")],
        types={"T": _ANY},
        infer=lambda ctx: [TensorDesc(np.bool_, ())],
        # a value that exists (an earlier write's result, an initial value) is initialized;
        # an uninitialized variable is answered by the session, never by this kernel
        kernel=lambda ins, attrs: [np.array(ins[0] is not None)],
        domain=GEODE_DOMAIN,
        doc="VarIsInitialized: whether a variable has a value",
    )
)

register(
    OpDef(
        VAR_REF,
        OpKind.OPAQUE,
        inputs=[In("var", "T"), In("value", "V")],
        outputs=[Out("written", "V")],
        types={"T": _ANY, "V": _ANY},
        infer=lambda ctx: [TensorDesc(ctx.dtype(1), ctx.shape(1))],
        verify=_verify_var_ref,
        kernel=lambda ins, attrs: [np.asarray(ins[1])],
        domain=GEODE_DOMAIN,
        doc="VarRef: the write of value into var at the end of the run (made by a pass)",
    )
)
