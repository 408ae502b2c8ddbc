"""What the fuzzer knows of each op it generates: family, dtypes, and how exact it is.

Two engines that both follow ONNX semantics may still round differently: geode's
kernels may contract a multiply and an add into an FMA, reassociate sums and
divide through a reciprocal (``geode.config.ACCURACY_POLICY``), and its
transcendentals are a few ulp off numpy's. A result that feeds a *discontinuous*
op (a comparison, Floor, a float-to-int Cast, Mod, ...) could then flip between
the engines without either being wrong. So the fuzzer tracks which values are
*exact* (bit-identical in any correct engine) and feeds discontinuous ops only
exact floats; :func:`exactness` is that rule, shared by the generator and the
shrinker (which must not turn a real failure into rounding noise).

A value is *plain* when it is exact and no multiply-add contraction or
reassociation can reach into it: inputs and constants, and values that only
layout ops, Identity, Neg, Abs and Cast separate from them. ``Add``/``Sub``/``Mul``
of two plain floats is exact (one correctly rounded operation) but not plain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geode.compiler import dtypes
from geode.compiler.ops import registry
from geode.fuzz.spec import DTYPES, Case

#: one-input float math whose results are a few ulp apart between engines
TRANSCENDENTAL = (
    "Exp",
    "Log",
    "Sqrt",
    "Tanh",
    "Erf",
    "Sigmoid",
    "Sin",
    "Cos",
    "Tan",
    "Atan",
    "Asin",
    "Acos",
    "Sinh",
    "Cosh",
    "Asinh",
    "Acosh",
    "Atanh",
    "Softplus",
    "Elu",
    "Selu",
    "Celu",
    "Gelu",
    "Mish",
)
#: one-input float arithmetic (inexact, but no transcendental)
FLOAT_ARITH_UNARY = ("Reciprocal", "Softsign", "HardSigmoid", "HardSwish", "LeakyRelu")
#: one-input ops that never round: the result is exact when the input is
EXACT_UNARY = ("Neg", "Abs", "Relu", "Identity", "Not", "BitwiseNot")
#: one-input ops that jump: their float input must be exact
DISCONTINUOUS_UNARY = ("Floor", "Ceil", "Round", "Sign", "IsNaN", "IsInf", "ThresholdedRelu")
UNARY = TRANSCENDENTAL + FLOAT_ARITH_UNARY + EXACT_UNARY + DISCONTINUOUS_UNARY

#: two-input arithmetic (Sum and Mean are variadic)
ARITH_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Sum", "Mean")
#: two-input ops that select or combine bits: exact when their inputs are
EXACT_BINARY = (
    "Max",
    "Min",
    "And",
    "Or",
    "Xor",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "BitShift",
)
#: comparisons (bool out; discontinuous)
COMPARE = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
BINARY = ARITH_BINARY + EXACT_BINARY + COMPARE + ("Mod",)

#: reductions over a random set of axes
REDUCE = (
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSumExp",
)
EXACT_REDUCE = ("ReduceMax", "ReduceMin")
#: reductions along one axis that rescale (float only)
SOFTMAX = ("Softmax", "LogSoftmax")

#: layout ops: move or pick elements, never compute
LAYOUT = (
    "Reshape",
    "Transpose",
    "Slice",
    "Concat",
    "Squeeze",
    "Unsqueeze",
    "Expand",
    "Flatten",
    "Gather",
)
#: ops through which contraction and reassociation may reach (plain stays plain)
TRANSPARENT = LAYOUT + ("Identity", "Neg", "Abs", "Cast")
#: ops whose result is a fresh exact value when their inputs are exact
SELECTING = ("Relu", "Max", "Min", "Where", "Clip") + EXACT_REDUCE + DISCONTINUOUS_UNARY

#: attribute choices of the unary ops that take attributes
UNARY_ATTRS: dict[str, list[dict[str, object]]] = {
    "Elu": [{}, {"alpha": 0.5}],
    "Selu": [{}],
    "Celu": [{}, {"alpha": 2.0}],
    "Gelu": [{}, {"approximate": "tanh"}],
    "LeakyRelu": [{}, {"alpha": 0.2}],
    "HardSigmoid": [{}, {"alpha": 0.3, "beta": 0.4}],
    "ThresholdedRelu": [{}, {"alpha": 0.5}],
    "IsInf": [{}, {"detect_negative": 0}, {"detect_positive": 0}],
}


def allowed_dtypes(op: str, slot: str | None = None) -> tuple[str, ...]:
    """The fuzzer's dtypes that op ``op`` accepts for type variable ``slot`` (default:
    its first input's), read from geode's op registry."""
    od = registry.get(op)
    var = slot if slot is not None else od.inputs[0].type
    allowed = od.types.get(var)
    if allowed is None:
        return DTYPES
    return tuple(d for d in DTYPES if np.dtype(d) in allowed)


def is_float(dtype: str) -> bool:
    """Whether ``dtype`` (a name) is a float dtype."""
    return np.dtype(dtype) in dtypes.FLOATS


@dataclass(frozen=True)
class Exactness:
    """Whether a value is exact (bit-identical in every correct engine) and plain."""

    exact: bool
    plain: bool


def node_exactness(op: str, params: dict, args: list[Exactness], float_args: bool) -> Exactness:
    """The exactness of a node's output from its arguments' (``float_args``: whether
    any argument is a float; integer and bool arithmetic is always exact)."""
    exact = all(a.exact for a in args)
    plain = all(a.plain for a in args)
    if op == "Const":
        return Exactness(True, True)
    if not float_args:
        return Exactness(exact, exact)
    if op in TRANSPARENT:
        return Exactness(exact, plain)
    if op in SELECTING or op in EXACT_BINARY or op in COMPARE or op in EXACT_UNARY:
        return Exactness(exact, exact)
    if op == "Mod":
        ok = exact and int(params.get("attrs", {}).get("fmod", 0)) == 1
        return Exactness(ok, ok)
    if op in ("Add", "Sub", "Mul"):
        return Exactness(plain, False)
    return Exactness(False, False)


def is_discontinuous(op: str, params: dict, out_dtype: str) -> bool:
    """Whether an op jumps in its float inputs (they must then be exact)."""
    if op in DISCONTINUOUS_UNARY or op in COMPARE or op == "Mod":
        return True
    # a float cast to an integer, or an integer base to a float power (truncated)
    return op in ("Cast", "Pow") and not is_float(out_dtype)


def exactness(case: Case, dtype_of: dict[str, str]) -> dict[str, Exactness]:
    """Exactness of every value of ``case`` (``dtype_of``: value name -> dtype name)."""
    known = {i.name: Exactness(True, True) for i in case.inputs}
    for node in case.nodes:
        given = [a for a in node.args if a]
        args = [known[a] for a in given]
        float_args = any(is_float(dtype_of[a]) for a in given)
        known[node.out] = node_exactness(node.op, node.params, args, float_args)
    return known


def inexact_discontinuities(case: Case, dtype_of: dict[str, str]) -> list[str]:
    """The nodes of ``case`` that feed an inexact float into a discontinuous op (a case
    with any is not a fair test: rounding alone may flip its results)."""
    ex = exactness(case, dtype_of)
    bad = []
    for node in case.nodes:
        if not is_discontinuous(node.op, node.params, dtype_of[node.out]):
            continue
        if any(a and is_float(dtype_of[a]) and not ex[a].exact for a in node.args):
            bad.append(node.out)
    return bad


#: op classes for tolerances: which kinds of rounding an output has been through
def rounding_class(case: Case, value: str) -> str:
    """``"exact"``, ``"arith"`` (plain float arithmetic) or ``"trans"`` (transcendentals,
    float reductions, softmax) for the tolerance of output ``value``."""
    cls = "exact"
    for node in case.ancestors(value):
        if node.op in TRANSCENDENTAL or node.op in SOFTMAX or node.op in ("Pow", "Mean", "Sum"):
            return "trans"
        if node.op in REDUCE and node.op not in EXACT_REDUCE:
            return "trans"
        if node.op in ARITH_BINARY or node.op in FLOAT_ARITH_UNARY or node.op == "Mod":
            cls = "arith"
    return cls
