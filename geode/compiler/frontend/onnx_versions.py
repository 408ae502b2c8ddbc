"""Opset adapters: rewrite an ONNX node of an older opset into geode's opset-21 form.

geode registers every op in its ONNX opset-21 form (Reduce* and Squeeze/Unsqueeze
take ``axes`` as an input, Split takes ``split`` as an input, Clip takes ``min`` and
``max`` as inputs, ...). A model exported at an older opset states the same thing
differently; each adapter here takes a :class:`NodeSpec` in the model's form and
returns one in geode's form, adding constant inputs or helper nodes through an
:class:`AdaptContext`. Adapters are keyed by op type and by the first opset that no
longer needs them (``below``): an adapter runs when the model's opset for the node's
domain is lower.

Supported model opsets for the default domain: :data:`SUPPORTED_OPSET_RANGE`.

============================  =========  ==============================================
op                            below      rewrite
============================  =========  ==============================================
Add, Sub, Mul, Div, Pow,      7          legacy ``broadcast``/``axis`` -> numpy broadcast
And, Or, Xor, Equal, Less,                (B unsqueezed after ``axis`` when needed)
Greater
BatchNormalization, Dropout   7          ``is_test`` dropped
PRelu                         7          per-channel 1-D slope -> (C, 1, ..., 1)
ReduceSum                     13         ``axes`` attribute -> int64 input
other Reduce*                 18         ``axes`` attribute -> int64 input
Squeeze, Unsqueeze            13         ``axes`` attribute -> int64 input
Split                         13         ``split`` attribute -> int64 input
Split                         18         no ``split``: ``num_outputs`` = output count
Slice                         10         ``starts/ends/axes`` attributes -> inputs
Pad                           11         ``pads`` -> int64 input, ``value`` -> input
Clip                          11         ``min``/``max`` attributes -> inputs
TopK                          10         ``k`` attribute -> ``K`` input
Dropout                       12         ``ratio`` attribute -> input
Softmax, LogSoftmax, Hardmax  13         2-D coercion: Flatten -> op(axis=-1) -> Reshape
BatchNormalization            9          ``spatial`` dropped (spatial=0 decomposed)
BatchNormalization            14         training-only outputs dropped when unused
Gemm                          any        ``broadcast`` attribute (opset < 7) dropped
Scatter                       any        renamed ScatterElements
Scan                          9          the batched opset-8 form is refused
DFT                           20         ``axis`` attribute -> int64 input
Upsample, Resize              11 / 13    to Resize-21 form (when Resize is registered)
============================  =========  ==============================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from geode.compiler.ir import Graph, Value
from geode.errors import ModelLoadError

#: ONNX default-domain opsets the importer honours (inclusive).
SUPPORTED_OPSET_RANGE: tuple[int, int] = (6, 28)

#: geode's own opset: the form every op is registered in.
TARGET_OPSET = 21

#: ops that newer opsets renamed or replaced: model op type -> geode op type.
RENAMES: dict[str, str] = {"Scatter": "ScatterElements", "Upsample": "Resize"}

_LEGACY_BROADCAST_OPS = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "And",
    "Or",
    "Xor",
    "Equal",
    "Less",
    "Greater",
)

_REDUCE_OPS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
)


@dataclass
class NodeSpec:
    """One ONNX node on its way into the graph: op, the model's opset, inputs, attributes.

    ``outputs`` are the output names as in the model ("" for an omitted optional
    output); ``version`` is the model's opset for ``domain`` until an adapter brings the
    node to geode's form (then it is :data:`TARGET_OPSET`).
    """

    op_type: str
    domain: str
    version: int
    inputs: list[Value | None]
    attrs: dict[str, Any]
    outputs: list[str]
    name: str
    #: op type as written in the model (for error messages after renames)
    source_op: str = ""
    notes: list[str] = field(default_factory=list)

    def input(self, i: int) -> Value | None:
        """Input ``i``, or None when omitted or out of range."""
        return self.inputs[i] if i < len(self.inputs) else None

    def with_inputs(self, *inputs: Value | None) -> list[Value | None]:
        """The inputs list with trailing omitted (None) entries removed."""
        out = list(inputs)
        while out and out[-1] is None:
            out.pop()
        return out


class AdaptContext:
    """What an adapter may do to the graph: add constants and helper nodes."""

    def __init__(
        self,
        graph: Graph,
        node_name: str,
        is_used: Callable[[str], bool] | None = None,
        namer: Callable[[str], str] | None = None,
    ):
        self.graph = graph
        self.node_name = node_name
        self._is_used = is_used
        self._namer = namer or graph.unique_name

    def name(self, hint: str) -> str:
        """A fresh value name for a helper of the node being adapted."""
        return self._namer(f"{self.node_name}/{hint}")

    def const(self, data: object, dtype: object, hint: str) -> Value:
        """A constant input for the node being adapted, named after it."""
        arr = np.asarray(data, dtype=dtype)
        name = self.name(hint)
        v = self.graph.constant(arr, name=name)
        if v.name != name:
            self.graph.rename(v, name)
        return v

    def ints(self, values: object, hint: str) -> Value:
        """A 1-D int64 constant (axes, pads, starts, ...)."""
        return self.const(np.asarray(list(values), dtype=np.int64).reshape(-1), np.int64, hint)

    def op(
        self,
        op_type: str,
        inputs: list[Value | None],
        attrs: dict[str, Any] | None = None,
        hint: str = "",
    ) -> Value:
        """Add a single-output helper node and return its output."""
        hint = hint or op_type.lower()
        node = self.graph.add_node(
            op_type,
            inputs,
            attrs or {},
            name=f"{self.node_name}/{hint}",
            output_names=[self.name(hint)],
        )
        return node.outputs[0]

    def is_used(self, name: str) -> bool:
        """Whether a value name of the model is read by a node or is a graph output."""
        return True if self._is_used is None else self._is_used(name)


AdapterFn = Callable[[NodeSpec, AdaptContext], NodeSpec]

_ADAPTERS: list[tuple[frozenset[str], int, AdapterFn]] = []


def adapter(*op_types: str, below: int) -> Callable[[AdapterFn], AdapterFn]:
    """Register an adapter for ``op_types`` run when the model's opset is lower than ``below``."""

    def deco(fn: AdapterFn) -> AdapterFn:
        """Add ``fn`` to the adapter list."""
        _ADAPTERS.append((frozenset(op_types), below, fn))
        return fn

    return deco


def target_op(op_type: str, domain: str = "") -> str:
    """The op type geode registers for a model op type (after renames)."""
    return RENAMES.get(op_type, op_type) if domain == "" else op_type


def adapt(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    """Bring a node from the model's opset to geode's opset-21 form."""
    if spec.domain != "":
        return spec
    if not spec.source_op:
        spec = replace(spec, source_op=spec.op_type)
    for ops, below, fn in _ADAPTERS:
        if spec.op_type in ops and spec.version < below:
            spec = fn(spec, ctx)
    return spec


def _pop(attrs: dict[str, Any], *names: str) -> list[Any]:
    return [attrs.pop(n, None) for n in names]


def _fail(spec: NodeSpec, msg: str) -> ModelLoadError:
    return ModelLoadError(
        f"node {spec.name!r} ({spec.source_op or spec.op_type}, opset {spec.version}): {msg}"
    )


# -- legacy broadcasting (opset < 7) --------------------------------------------------------
@adapter(*_LEGACY_BROADCAST_OPS, below=7)
def _legacy_broadcast(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    """``broadcast=1`` lets B match a run of A's dims starting at ``axis`` (default: A's tail)."""
    attrs = dict(spec.attrs)
    broadcast, axis = _pop(attrs, "broadcast", "axis")
    spec = replace(spec, attrs=attrs)
    if not broadcast or axis is None:
        return spec  # equal shapes, or B matching A's trailing dims: numpy broadcasting
    a, b = spec.input(0), spec.input(1)
    if a.rank is None or b.rank is None:
        raise _fail(spec, "legacy broadcast with an axis needs inputs of known rank")
    ra, rb = a.rank, b.rank
    start = int(axis) + ra if int(axis) < 0 else int(axis)
    if not 0 <= start <= ra - rb:
        raise _fail(spec, f"broadcast axis {axis} does not fit B of rank {rb} into A of rank {ra}")
    pad = ra - start - rb
    if pad == 0:
        return spec
    b2 = ctx.op("Unsqueeze", [b, ctx.ints(range(rb, rb + pad), "broadcast_axes")], hint="broadcast")
    return replace(spec, inputs=[a, b2])


@adapter("PRelu", below=7)
def _prelu_channels(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    """Before opset 7 a 1-D slope holds one value per channel (axis 1)."""
    x, slope = spec.input(0), spec.input(1)
    if x.rank is None or slope.rank != 1 or x.rank <= 2 or slope.shape[0] == 1:
        return spec
    axes = ctx.ints(range(1, x.rank - 1), "slope_axes")
    return replace(spec, inputs=[x, ctx.op("Unsqueeze", [slope, axes], hint="slope")])


@adapter("BatchNormalization", "Dropout", below=7)
def _drop_is_test(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    return replace(spec, attrs={k: v for k, v in spec.attrs.items() if k != "is_test"})


# -- axes attribute -> input ----------------------------------------------------------------
def _axes_to_input(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    attrs = dict(spec.attrs)
    (axes,) = _pop(attrs, "axes")
    if axes is None:
        return replace(spec, attrs=attrs)
    data = spec.input(0)
    return replace(spec, inputs=[data, ctx.ints(axes, "axes")], attrs=attrs)


adapter("ReduceSum", below=13)(_axes_to_input)
adapter(*_REDUCE_OPS, below=18)(_axes_to_input)
adapter("Squeeze", below=13)(_axes_to_input)


@adapter("Unsqueeze", below=13)
def _unsqueeze(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    if "axes" not in spec.attrs:
        raise _fail(spec, "attribute 'axes' is required before opset 13")
    return _axes_to_input(spec, ctx)


# -- Split ------------------------------------------------------------------------------------
@adapter("Split", below=13)
def _split_attr(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    attrs = dict(spec.attrs)
    (split,) = _pop(attrs, "split")
    inputs = [spec.input(0)]
    if split is not None:
        inputs.append(ctx.ints(split, "split"))
    return replace(spec, inputs=inputs, attrs=attrs)


@adapter("Split", below=18)
def _split_num_outputs(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    if spec.input(1) is not None or "num_outputs" in spec.attrs:
        return spec
    # before opset 18 a Split without sizes cuts into as many equal parts as it has outputs
    return replace(spec, attrs={**spec.attrs, "num_outputs": len(spec.outputs)})


# -- Slice ------------------------------------------------------------------------------------
@adapter("Slice", below=10)
def _slice(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    attrs = dict(spec.attrs)
    starts, ends, axes = _pop(attrs, "starts", "ends", "axes")
    if starts is None or ends is None:
        raise _fail(spec, "attributes 'starts' and 'ends' are required before opset 10")
    if len(starts) != len(ends) or (axes is not None and len(axes) != len(starts)):
        raise _fail(spec, f"starts {starts}, ends {ends} and axes {axes} differ in length")
    inputs = [spec.input(0), ctx.ints(starts, "starts"), ctx.ints(ends, "ends")]
    if axes is not None:
        inputs.append(ctx.ints(axes, "axes"))
    return replace(spec, inputs=inputs, attrs=attrs)


# -- Pad ----------------------------------------------------------------------------------------
@adapter("Pad", below=11)
def _pad(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    attrs = dict(spec.attrs)
    pads, value = _pop(attrs, "pads", "value")
    if pads is None:
        raise _fail(spec, "attribute 'pads' is required before opset 11")
    data = spec.input(0)
    inputs: list[Value | None] = [data, ctx.ints(pads, "pads")]
    if attrs.get("mode", "constant") == "constant" and value is not None and float(value) != 0.0:
        inputs.append(ctx.const(value, data.dtype, "value"))
    return replace(spec, inputs=inputs, attrs=attrs)


# -- Clip ---------------------------------------------------------------------------------------
@adapter("Clip", below=11)
def _clip(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    attrs = dict(spec.attrs)
    lo, hi = _pop(attrs, "min", "max")
    data = spec.input(0)
    lo_v = None if lo is None else ctx.const(lo, data.dtype, "min")
    hi_v = None if hi is None else ctx.const(hi, data.dtype, "max")
    return replace(spec, inputs=spec.with_inputs(data, lo_v, hi_v), attrs=attrs)


# -- TopK ---------------------------------------------------------------------------------------
@adapter("TopK", below=10)
def _topk(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    attrs = dict(spec.attrs)
    (k,) = _pop(attrs, "k")
    if k is None:
        raise _fail(spec, "attribute 'k' is required before opset 10")
    return replace(spec, inputs=[spec.input(0), ctx.ints([k], "k")], attrs=attrs)


# -- Dropout ------------------------------------------------------------------------------------
@adapter("Dropout", below=12)
def _dropout(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    attrs = dict(spec.attrs)
    ratio, _ = _pop(attrs, "ratio", "is_test")
    inputs = [spec.input(0)]
    if ratio is not None:
        data = spec.input(0)
        dt = data.dtype if data.dtype.kind == "f" else np.float32
        inputs.append(ctx.const(ratio, dt, "ratio"))
    return replace(spec, inputs=inputs, attrs=attrs)


# -- Softmax / LogSoftmax / Hardmax ------------------------------------------------------------
@adapter("Softmax", "LogSoftmax", "Hardmax", below=13)
def _softmax_coerced(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    """Before opset 13 these ops coerce the input to 2-D at ``axis`` (default 1)."""
    attrs = dict(spec.attrs)
    axis = int(attrs.pop("axis", 1))
    x = spec.input(0)
    rank = x.rank
    if rank is not None:
        if not -rank <= axis < max(rank, 1):
            raise _fail(spec, f"axis {axis} out of range for rank {rank}")
        axis = axis + rank if axis < 0 else axis
        if axis == rank - 1 and rank >= 1:
            return replace(spec, attrs={**attrs, "axis": -1}, version=TARGET_OPSET)
    # general case: flatten to [prod(d[:axis]), prod(d[axis:])], op on the last axis, reshape
    shape = ctx.op("Shape", [x], hint="shape")
    flat = ctx.op("Flatten", [x], {"axis": axis}, hint="flatten")
    y = ctx.op(spec.op_type, [flat], {**attrs, "axis": -1}, hint=spec.op_type.lower())
    return replace(spec, op_type="Reshape", inputs=[y, shape], attrs={}, version=TARGET_OPSET)


# -- BatchNormalization --------------------------------------------------------------------------
@adapter("BatchNormalization", below=9)
def _bn_spatial(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    attrs = dict(spec.attrs)
    spatial, _, _ = _pop(attrs, "spatial", "is_test", "consumed_inputs")
    spec = replace(spec, attrs=attrs)
    if spatial is None or int(spatial) == 1:
        return spec
    x, scale, bias, mean, var = (spec.input(i) for i in range(5))
    if any(v is None for v in (x, scale, bias, mean, var)):
        raise _fail(spec, "expects 5 inputs")
    if scale.rank == 1:
        return spec  # (C) statistics: per-activation over [N, C] is per-channel
    # spatial=0: statistics of shape (C, D1, ..., Dn) broadcast against x (N, C, D1, ...)
    spec = _bn_drop_training_outputs(spec, ctx)
    eps = float(attrs.get("epsilon", 1e-5))
    denom = ctx.op(
        "Sqrt",
        [ctx.op("Add", [var, ctx.const(eps, var.dtype, "epsilon")], hint="var_eps")],
        hint="std",
    )
    centered = ctx.op("Sub", [x, mean], hint="centered")
    normed = ctx.op("Div", [centered, denom], hint="normed")
    scaled = ctx.op("Mul", [normed, scale], hint="scaled")
    return replace(spec, op_type="Add", inputs=[scaled, bias], attrs={}, version=TARGET_OPSET)


@adapter("BatchNormalization", below=14)
def _bn_drop_training_outputs(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    """Before opset 14 BatchNormalization lists up to 4 training-only statistics outputs."""
    extra = [o for o in spec.outputs[1:] if o]
    used = [o for o in extra if ctx.is_used(o)]
    if used:
        raise _fail(spec, f"training-mode outputs {used} are not supported before opset 14")
    attrs = {
        k: v for k, v in spec.attrs.items() if k not in ("spatial", "is_test", "consumed_inputs")
    }
    return replace(spec, outputs=spec.outputs[:1], attrs=attrs)


# -- Gemm / Scatter ----------------------------------------------------------------------------
@adapter("Gemm", below=TARGET_OPSET + 1)
def _gemm(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    if "broadcast" not in spec.attrs:
        return spec
    return replace(spec, attrs={k: v for k, v in spec.attrs.items() if k != "broadcast"})


@adapter("DFT", below=20)
def _dft17(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    """Opset 17 DFT takes ``axis`` as an attribute (default 1); opset 20 as an input."""
    attrs = dict(spec.attrs)
    axis = attrs.pop("axis", 1)
    inputs = [spec.input(0), spec.input(1), ctx.const(int(axis), np.int64, "axis")]
    return replace(spec, inputs=inputs, attrs=attrs, version=TARGET_OPSET)


@adapter("Scan", below=9)
def _scan8(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    raise _fail(spec, "Scan before opset 9 (batched, with sequence_lens) is not supported")


@adapter("Scatter", below=TARGET_OPSET + 1)
def _scatter(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    return replace(spec, op_type="ScatterElements")


# -- Upsample / Resize ---------------------------------------------------------------------------
def _resize_from_scales(spec: NodeSpec, ctx: AdaptContext, scales: Value | None) -> NodeSpec:
    attrs = {k: v for k, v in spec.attrs.items() if k != "scales"}
    mode = attrs.get("mode", "nearest")
    if mode == "bilinear":  # Upsample-7 spelling
        mode = "linear"
    attrs["mode"] = mode
    # Upsample and Resize-10 map output to input coordinates as x_out / scale
    attrs["coordinate_transformation_mode"] = "asymmetric"
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    return replace(
        spec,
        op_type="Resize",
        inputs=[spec.input(0), None, scales],
        attrs=attrs,
        version=TARGET_OPSET,
    )


@adapter("Upsample", below=TARGET_OPSET + 1)
def _upsample(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    if spec.version < 9:
        scales = spec.attrs.get("scales")
        if scales is None:
            raise _fail(spec, "attribute 'scales' is required before opset 9")
        return _resize_from_scales(spec, ctx, ctx.const(list(scales), np.float32, "scales"))
    return _resize_from_scales(spec, ctx, spec.input(1))


@adapter("Resize", below=11)
def _resize10(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    return _resize_from_scales(spec, ctx, spec.input(1))


@adapter("Resize", below=13)
def _resize11(spec: NodeSpec, ctx: AdaptContext) -> NodeSpec:
    """Opsets 11-12 require ``roi`` and ``scales``; empty constants mean 'not given'."""
    inputs = list(spec.inputs)
    for i in (1, 2):
        v = spec.input(i)
        if v is not None and v.is_constant and v.data is not None and v.data.size == 0:
            if i == 1 and spec.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
                continue
            inputs[i] = None
    return replace(spec, inputs=spec.with_inputs(*inputs))
